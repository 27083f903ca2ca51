//! WebSocket test support (RFC 6455): an echoing WebSocket origin over TLS on loopback
//! (certificate from a [`crate::tls::TestCa`], ALPN `http/1.1`), which keeps the headers
//! of every opening handshake, and a client that opens a WebSocket inside a CONNECT
//! tunnel through the mediator (TLS to the mediator's leaf), with tokio-tungstenite.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, ensure};
use certs::{Ca, LeafName};
pub use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::WebSocketStream;
/// A WebSocket message (the type the client sends and receives).
pub use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

use crate::tls::tls_through_connect;

/// The headers of one opening handshake, lowercase names, in order.
pub type Handshake = Vec<(String, String)>;

/// An echoing WebSocket origin: every text or binary message comes back as it was sent.
#[derive(Debug)]
pub struct WsOrigin {
    addr: SocketAddr,
    handshakes: Arc<Mutex<Vec<Handshake>>>,
    task: JoinHandle<()>,
}

impl WsOrigin {
    /// Starts on `127.0.0.1:0` with a certificate for exactly `name`, issued by `ca`.
    ///
    /// # Errors
    /// Issue or bind failure.
    pub async fn start(ca: &Ca, name: &str) -> Result<Self> {
        let leaf = ca.issue(&LeafName::parse(name)?)?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(leaf.chain, leaf.key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let handshakes = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&handshakes);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    // The callback's type is tungstenite's (its error is an HTTP response).
                    #[allow(clippy::result_large_err)]
                    let keep = |req: &Request, resp: Response| {
                        let headers = req
                            .headers()
                            .iter()
                            .map(|(k, v)| {
                                (
                                    k.as_str().to_owned(),
                                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                                )
                            })
                            .collect();
                        seen.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(headers);
                        Ok(resp)
                    };
                    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tls, keep).await else {
                        return;
                    };
                    while let Some(Ok(msg)) = ws.next().await {
                        if msg.is_close() {
                            let _ = ws.close(None).await;
                            return;
                        }
                        let echo = msg.is_text() || msg.is_binary();
                        if echo && ws.send(msg).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(Self {
            addr,
            handshakes,
            task,
        })
    }

    /// The origin's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The headers of every opening handshake so far.
    pub fn handshakes(&self) -> Vec<Handshake> {
        self.handshakes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for WsOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens `wss://<host>:<port><path>` through the mediator's TCP listener `proxy` as
/// `(authority, token)`: CONNECT, TLS with SNI `host` trusting only `ca_pem` (ALPN
/// `http/1.1`), then the WebSocket opening handshake with `extra` headers.
///
/// # Errors
/// A failed CONNECT, TLS handshake or WebSocket handshake (its HTTP answer in the
/// message).
pub async fn ws_through_connect(
    proxy: SocketAddr,
    credentials: (&str, &str),
    (host, port): (&str, u16),
    path: &str,
    ca_pem: &Path,
    extra: &[(&str, &str)],
) -> Result<WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>> {
    let tls = tls_through_connect(
        proxy,
        credentials,
        &format!("{host}:{port}"),
        host,
        ca_pem,
        &[b"http/1.1"],
    )
    .await?;
    let mut request =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(format!(
            "wss://{host}:{port}{path}"
        ))?;
    for (k, v) in extra {
        request.headers_mut().insert(
            tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes())?,
            v.parse()?,
        );
    }
    let (ws, resp) = tokio_tungstenite::client_async(request, tls)
        .await
        .context("WebSocket handshake through the mediator")?;
    ensure!(resp.status() == 101, "handshake answer: {resp:?}");
    Ok(ws)
}
