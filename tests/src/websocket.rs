//! WebSocket test support (RFC 6455, RFC 8441): an echoing WebSocket origin over TLS on
//! loopback (certificate from a [`crate::tls::TestCa`]) speaking HTTP/1.1 (ALPN
//! `http/1.1`) or HTTP/2 (ALPN `h2`, extended CONNECT on or off), which keeps the headers
//! of every opening handshake; and clients that open a WebSocket inside a CONNECT tunnel
//! through the mediator (TLS to the mediator's leaf), over HTTP/1.1 or as an HTTP/2
//! extended CONNECT, with tokio-tungstenite.
//!
//! The origins echo every text and binary message; the text [`DROP`] makes the HTTP/1.1
//! origin drop its connection without a Close frame or TLS close_notify.

pub use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use bytes::Bytes;
use certs::{Ca, LeafName};
pub use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt as _, Empty};
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
pub use tokio_tungstenite::WebSocketStream;
/// A WebSocket message (the type the client sends and receives).
pub use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::tls::tls_through_connect;
use crate::wait::wait_until;

/// The text message that makes the HTTP/1.1 origin drop its connection at once: no
/// Close frame, no TLS close_notify, only the TCP close.
pub const DROP: &str = "drop-the-connection";

/// How an origin speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WsFlavor {
    /// HTTP/1.1 `Upgrade: websocket` (ALPN `http/1.1`).
    H1,
    /// HTTP/2 with SETTINGS_ENABLE_CONNECT_PROTOCOL (ALPN `h2`, RFC 8441).
    H2,
    /// HTTP/2 without extended CONNECT (ALPN `h2`): it cannot carry a WebSocket.
    H2WithoutExtendedConnect,
}

/// A WebSocket over TLS through a CONNECT tunnel (the client side of an HTTP/1.1 upgrade).
pub type TlsWebSocket = WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// A WebSocket over an HTTP/2 stream (the client side of an extended CONNECT).
pub type H2WebSocket = WebSocketStream<TokioIo<Upgraded>>;

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
    /// Starts an HTTP/1.1 origin on `127.0.0.1:0` with a certificate for exactly `name`,
    /// issued by `ca`.
    ///
    /// # Errors
    /// Issue or bind failure.
    pub async fn start(ca: &Ca, name: &str) -> Result<Self> {
        Self::start_as(ca, name, WsFlavor::H1).await
    }

    /// Starts an origin of `flavor` on `127.0.0.1:0` with a certificate for exactly
    /// `name`, issued by `ca`. An HTTP/2 origin keeps `:method`, `:protocol` and `:path`
    /// among each handshake's headers.
    ///
    /// # Errors
    /// Issue or bind failure.
    pub async fn start_as(ca: &Ca, name: &str, flavor: WsFlavor) -> Result<Self> {
        let leaf = ca.issue(&LeafName::parse(name)?)?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(leaf.chain, leaf.key)?;
        config.alpn_protocols = vec![match flavor {
            WsFlavor::H1 => b"http/1.1".to_vec(),
            WsFlavor::H2 | WsFlavor::H2WithoutExtendedConnect => b"h2".to_vec(),
        }];
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
                    if flavor != WsFlavor::H1 {
                        serve_h2(tls, seen, flavor == WsFlavor::H2).await;
                        return;
                    }
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
                    let Ok(ws) = tokio_tungstenite::accept_hdr_async(tls, keep).await else {
                        return;
                    };
                    echo(ws).await;
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

/// Echoes text and binary messages until the peer's Close (answered) or [`DROP`] (the
/// stream dropped as it is).
async fn echo<S: AsyncRead + AsyncWrite + Unpin>(mut ws: WebSocketStream<S>) {
    while let Some(Ok(msg)) = ws.next().await {
        if msg.is_close() {
            let _ = ws.close(None).await;
            return;
        }
        if msg.to_text().is_ok_and(|t| t == DROP) {
            return;
        }
        let echo = msg.is_text() || msg.is_binary();
        if echo && ws.send(msg).await.is_err() {
            return;
        }
    }
}

/// One HTTP/2 connection of the origin: an extended CONNECT with `:protocol websocket`
/// gets `200` and an echoing WebSocket on its stream; anything else `404`.
async fn serve_h2(
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    seen: Arc<Mutex<Vec<Handshake>>>,
    extended_connect: bool,
) {
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        let protocol = req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .map(|p| p.as_str().to_owned());
        let mut headers = vec![
            (":method".to_owned(), req.method().to_string()),
            (":path".to_owned(), req.uri().path().to_owned()),
        ];
        if let Some(p) = &protocol {
            headers.push((":protocol".to_owned(), p.clone()));
        }
        headers.extend(req.headers().iter().map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        }));
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(headers);
        let websocket =
            req.method() == hyper::Method::CONNECT && protocol.as_deref() == Some("websocket");
        let status = if websocket {
            let upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                if let Ok(up) = upgrade.await {
                    echo(
                        WebSocketStream::from_raw_socket(TokioIo::new(up), Role::Server, None)
                            .await,
                    )
                    .await;
                }
            });
            hyper::StatusCode::OK
        } else {
            hyper::StatusCode::NOT_FOUND
        };
        let mut resp = hyper::Response::new(Empty::<Bytes>::new());
        *resp.status_mut() = status;
        async move { Ok::<_, Infallible>(resp) }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    if extended_connect {
        builder.enable_connect_protocol();
    }
    let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
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
) -> Result<TlsWebSocket> {
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

/// What the mediator answered an HTTP/2 extended CONNECT.
pub enum H2Answer {
    /// `200`: the WebSocket, open (boxed: it is large).
    Open(Box<H2WebSocket>),
    /// Any other status, with its body.
    Refused(u16, String),
}

impl std::fmt::Debug for H2Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open(_) => f.write_str("Open"),
            Self::Refused(status, body) => write!(f, "Refused({status}, {body})"),
        }
    }
}

/// Opens `wss://<host>:<port><path>` through the mediator's TCP listener `proxy` as
/// `(authority, token)` over HTTP/2: CONNECT, TLS with SNI `host` trusting only `ca_pem`
/// (ALPN `h2`), then, once the mediator's SETTINGS allow it, an extended CONNECT
/// (`:protocol websocket`, `Sec-WebSocket-Version: 13`, `extra` headers; RFC 8441
/// section 5).
///
/// # Errors
/// A failed CONNECT, TLS or HTTP/2 handshake, no SETTINGS_ENABLE_CONNECT_PROTOCOL from the
/// mediator within 10 s, or a failed request.
pub async fn ws_h2_through_connect(
    proxy: SocketAddr,
    credentials: (&str, &str),
    (host, port): (&str, u16),
    path: &str,
    ca_pem: &Path,
    extra: &[(&str, &str)],
) -> Result<H2Answer> {
    let tls = tls_through_connect(
        proxy,
        credentials,
        &format!("{host}:{port}"),
        host,
        ca_pem,
        &[b"h2"],
    )
    .await?;
    ensure!(
        tls.get_ref().1.alpn_protocol() == Some(b"h2"),
        "the mediator did not choose h2"
    );
    let (mut sender, conn) = hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await
    .map_err(|e| anyhow!("HTTP/2 handshake: {e}"))?;
    // Shared: only the connection knows the mediator's SETTINGS.
    let conn = Arc::new(Mutex::new(Box::pin(conn)));
    let polled = Arc::clone(&conn);
    tokio::spawn(std::future::poll_fn(move |cx| {
        polled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
            .poll(cx)
    }));
    wait_until(
        Duration::from_secs(10),
        "the mediator's SETTINGS_ENABLE_CONNECT_PROTOCOL",
        || {
            conn.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_extended_connect_protocol_enabled()
        },
    )
    .await?;
    let mut req = hyper::Request::builder()
        .method(hyper::Method::CONNECT)
        .uri(format!("https://{host}:{port}{path}"))
        .header("sec-websocket-version", "13");
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let mut req = req.body(Empty::<Bytes>::new())?;
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    sender
        .ready()
        .await
        .map_err(|e| anyhow!("HTTP/2 ready: {e}"))?;
    let mut resp = sender
        .send_request(req)
        .await
        .context("extended CONNECT through the mediator")?;
    if resp.status() != hyper::StatusCode::OK {
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        return Ok(H2Answer::Refused(
            status,
            String::from_utf8_lossy(&body).into_owned(),
        ));
    }
    let upgraded = hyper::upgrade::on(&mut resp)
        .await
        .context("the extended CONNECT's stream")?;
    Ok(H2Answer::Open(Box::new(
        WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await,
    )))
}
