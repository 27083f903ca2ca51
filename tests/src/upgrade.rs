//! Upgrade test support (RFC 9110 section 7.8) for tokens other than WebSocket: a TLS
//! origin on loopback (ALPN `http/1.1`) that answers every request with `101` and the
//! `Upgrade` token it was given, then echoes every byte; and a client that sends one
//! upgrade request inside a CONNECT tunnel through the mediator.
//!
//! After echoing [`BYE`] the origin drops its connection without TLS close_notify.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, bail};
use certs::{Ca, LeafName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::tls::tls_through_connect;

/// The bytes after which the origin drops its connection (once echoed).
pub const BYE: &[u8] = b"bye";

/// An origin that switches every request to its token and echoes.
#[derive(Debug)]
pub struct UpgradeOrigin {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl UpgradeOrigin {
    /// Starts on `127.0.0.1:0` with a certificate for exactly `name`, issued by `ca`,
    /// answering `Upgrade: <token>`.
    ///
    /// # Errors
    /// Issue or bind failure.
    pub async fn start(ca: &Ca, name: &str, token: &str) -> Result<Self> {
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
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&heads);
        let answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {token}\r\n\r\n"
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, seen, answer) =
                    (acceptor.clone(), Arc::clone(&seen), answer.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(head) = read_head(&mut tls).await else {
                        return;
                    };
                    seen.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(head);
                    if tls.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                    let mut buf = vec![0u8; 16 * 1024];
                    let mut tail = Vec::new();
                    loop {
                        let n = match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if tls.write_all(&buf[..n]).await.is_err() || tls.flush().await.is_err() {
                            return;
                        }
                        tail.extend_from_slice(&buf[..n]);
                        if tail.ends_with(BYE) {
                            // Dropped without shutdown: the TCP close comes without
                            // close_notify.
                            return;
                        }
                        let keep = tail.len().min(BYE.len());
                        tail.drain(..tail.len() - keep);
                    }
                });
            }
        });
        Ok(Self { addr, heads, task })
    }

    /// The origin's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The request heads received so far, as text.
    pub fn heads(&self) -> Vec<String> {
        self.heads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for UpgradeOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one HTTP head (up to 64 KiB), byte by byte so that nothing after it is consumed.
async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Result<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 64 * 1024 {
            bail!("head over 64 KiB");
        }
        let mut b = [0u8; 1];
        if s.read(&mut b).await? == 0 {
            bail!("closed in the head: {:?}", String::from_utf8_lossy(&head));
        }
        head.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// Sends `GET <path>` with `Connection: Upgrade` and `Upgrade: <token>` to
/// `https://<host>:<port>` through the mediator's TCP listener `proxy` as `(authority,
/// token)` (TLS trusting only `ca_pem`, ALPN `http/1.1`), and returns the answer's head
/// and the stream after it.
///
/// # Errors
/// A failed CONNECT or TLS handshake, or no complete answer head within 20 s.
pub async fn upgrade_through_connect(
    proxy: SocketAddr,
    credentials: (&str, &str),
    (host, port): (&str, u16),
    path: &str,
    ca_pem: &Path,
    token: &str,
) -> Result<(String, tokio_rustls::client::TlsStream<TcpStream>)> {
    let mut tls = tls_through_connect(
        proxy,
        credentials,
        &format!("{host}:{port}"),
        host,
        ca_pem,
        &[b"http/1.1"],
    )
    .await?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: Upgrade\r\nUpgrade: {token}\r\n\r\n"
    );
    tls.write_all(req.as_bytes()).await?;
    let head = tokio::time::timeout(std::time::Duration::from_secs(20), read_head(&mut tls))
        .await
        .context("the answer to the upgrade request timed out")??;
    Ok((head, tls))
}
