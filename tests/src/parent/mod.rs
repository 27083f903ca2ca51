//! Parent proxies on loopback for the routing tests (design section 8), each recording
//! exactly what it received:
//! - [`HttpParent`]: HTTP/1.1 `CONNECT` and absolute-form forwarding, optional Basic auth
//!   (a wrong or missing credential gets `407`), Negotiate (Kerberos, RFC 4559: `407`
//!   offering Negotiate, then the token checked by GSSAPI with a service keytab), or a
//!   fixed refusal status; in plain text or inside TLS (an HTTPS parent);
//! - [`Socks5Parent`]: SOCKS5 `CONNECT` (RFC 1928), optional username/password (RFC 1929);
//! - [`ClosingParent`]: accepts and closes at once (a connection-level failure);
//! - [`PacServer`]: serves a PAC script over HTTP, replaceable at run time.
//!
//! Hard rule: these parents connect only to loopback. A CONNECT or SOCKS5 request naming
//! an IP connects there only if it is loopback (else `502` / REP `0x02`); a request naming
//! a host name is sent to `127.0.0.1` (the parents' whole "DNS").

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, copy_bidirectional};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::kerberos::Acceptor;
use crate::wait::wait_for;

mod pac;
mod socks;

pub use pac::PacServer;
pub use socks::{Socks5Parent, SocksRequest};

/// How long helpers wait for a parent to have seen something.
pub const PARENT_WAIT: Duration = Duration::from_secs(10);

/// Where a parent sends a request for `host:port`: loopback only.
fn loopback_target(host: &str, port: u16) -> Option<SocketAddr> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(ip) if ip.is_loopback() => Some(SocketAddr::new(ip, port)),
        Ok(_) => None,
        Err(_) => Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)),
    }
}

/// Shared bookkeeping of a recording parent.
#[derive(Debug, Default)]
struct Log {
    accepted: AtomicUsize,
    requests: Mutex<Vec<String>>,
    notes: Mutex<Vec<String>>,
}

impl Log {
    fn note(&self, n: String) {
        self.notes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(n);
    }

    fn notes(&self) -> Vec<String> {
        self.notes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn push(&self, r: String) {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(r);
    }

    fn all(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn wait_requests(log: &Log, n: usize, what: &str) -> Result<Vec<String>> {
    wait_for(
        PARENT_WAIT,
        || {
            let all = log.all();
            Ok((all.len() >= n).then_some(all))
        },
        || format!("{what} saw fewer than {n} requests: {:?}", log.all()),
    )
    .await
}

/// What an [`HttpParent`] does with requests.
#[derive(Debug, Clone, Default)]
pub enum HttpParentMode {
    /// Serve CONNECT and absolute-form.
    #[default]
    Serve,
    /// Answer every request with this status (e.g. 403), then close.
    Refuse(u16),
    /// Demand Negotiate: a request without a token gets `407` offering Negotiate (the
    /// connection stays open); a token that verifies (noted as `principal NAME`) lets the
    /// request through with the mutual-authentication token on the answer; a token that
    /// does not gets `407` and the connection is closed (noted as `refused: WHY`).
    Negotiate(Acceptor),
    /// As `Negotiate`, but the answer to a token that verifies carries a forged
    /// mutual-authentication token (valid base64, not a Kerberos reply); an absolute-form
    /// request gets `200` with the body `forged` from the parent itself.
    NegotiateForged(Acceptor),
}

/// A recording HTTP parent proxy on `127.0.0.1:0`.
#[derive(Debug)]
pub struct HttpParent {
    addr: SocketAddr,
    log: Arc<Log>,
    task: JoinHandle<()>,
}

impl HttpParent {
    /// Starts a parent that serves everything without authentication.
    ///
    /// # Errors
    /// When the listener cannot be bound.
    pub async fn start() -> Result<Self> {
        Self::start_with(None, HttpParentMode::Serve).await
    }

    /// Starts a parent; `auth` = `Some((user, password))` demands `Proxy-Authorization:
    /// Basic` with exactly those.
    ///
    /// # Errors
    /// When the listener cannot be bound.
    pub async fn start_with(auth: Option<(&str, &str)>, mode: HttpParentMode) -> Result<Self> {
        Self::start_full(auth, mode, None).await
    }

    /// Starts an HTTPS parent: TLS with a certificate for exactly `name` issued by `ca`,
    /// then HTTP as [`Self::start_with`] inside.
    ///
    /// # Errors
    /// Issue or bind failure.
    pub async fn start_tls(ca: &certs::Ca, name: &str, mode: HttpParentMode) -> Result<Self> {
        let leaf = ca.issue(&certs::LeafName::parse(name)?)?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(leaf.chain, leaf.key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        Self::start_full(None, mode, Some(acceptor)).await
    }

    async fn start_full(
        auth: Option<(&str, &str)>,
        mode: HttpParentMode,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the test HTTP parent")?;
        let addr = listener.local_addr()?;
        let log = Arc::new(Log::default());
        let expected = auth.map(|(u, p)| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        });
        let task = {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    log.accepted.fetch_add(1, Ordering::SeqCst);
                    let (log, expected, mode) = (Arc::clone(&log), expected.clone(), mode.clone());
                    let tls = tls.clone();
                    tokio::spawn(async move {
                        match tls {
                            None => {
                                let _ = serve_http(stream, &log, expected.as_deref(), &mode).await;
                            }
                            Some(acceptor) => match acceptor.accept(stream).await {
                                Ok(tls) => {
                                    let _ = serve_http(tls, &log, expected.as_deref(), &mode).await;
                                }
                                Err(e) => log.note(format!("tls handshake failed: {e}")),
                            },
                        }
                    });
                }
            })
        };
        Ok(Self { addr, log, task })
    }

    /// `host:port` of the parent.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// TCP connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.log.accepted.load(Ordering::SeqCst)
    }

    /// Every request head received so far, verbatim (request line and headers, CRLFs
    /// kept), in arrival order.
    pub fn requests(&self) -> Vec<String> {
        self.log.all()
    }

    /// Waits until at least `n` request heads arrived; returns them all.
    ///
    /// # Errors
    /// Fewer within [`PARENT_WAIT`].
    pub async fn wait_requests(&self, n: usize) -> Result<Vec<String>> {
        wait_requests(&self.log, n, "the HTTP parent").await
    }

    /// What the parent noted: `principal NAME` for each accepted Negotiate token,
    /// `refused: WHY` for each refused one, `tls handshake failed: WHY`.
    pub fn notes(&self) -> Vec<String> {
        self.log.notes()
    }

    /// Waits until a note containing `needle` was made; returns every note.
    ///
    /// # Errors
    /// None within [`PARENT_WAIT`].
    pub async fn wait_note(&self, needle: &str) -> Result<Vec<String>> {
        wait_for(
            PARENT_WAIT,
            || {
                let all = self.log.notes();
                Ok(all.iter().any(|n| n.contains(needle)).then_some(all))
            },
            || {
                format!(
                    "the HTTP parent noted no {needle:?}: {:?}",
                    self.log.notes()
                )
            },
        )
        .await
    }
}

impl Drop for HttpParent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request head (up to and including the blank line), byte by byte so that
/// nothing after it is consumed.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await? == 0 {
            bail!("closed before a complete head");
        }
        head.push(byte[0]);
        if head.len() > 64 * 1024 {
            bail!("head too large");
        }
    }
    Ok(head)
}

/// The value of the `Proxy-Authorization` field of a request head.
fn proxy_authorization_of(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("proxy-authorization")
            .then(|| value.trim().to_owned())
    })
}

/// Negotiate (RFC 4559) on one connection: `407` until a request carries a token, then
/// that token checked. Returns the verified request's head and the header to add to its
/// success answer; `None` when the connection is done (refused).
async fn negotiate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    log: &Log,
    acceptor: &Acceptor,
    mut head: Vec<u8>,
) -> Result<Option<(Vec<u8>, String)>> {
    const BODY: &str = "auth required";
    loop {
        let text = String::from_utf8_lossy(&head).into_owned();
        let token = proxy_authorization_of(&text)
            .and_then(|v| v.strip_prefix("Negotiate ").map(str::to_owned));
        let Some(token) = token else {
            let resp = format!(
                "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Negotiate\r\nProxy-Authenticate: Basic realm=\"test\"\r\nContent-Length: {}\r\n\r\n{BODY}",
                BODY.len()
            );
            stream.write_all(resp.as_bytes()).await?;
            head = read_head(stream).await?;
            log.push(String::from_utf8_lossy(&head).into_owned());
            continue;
        };
        return match acceptor.accept(&token).await {
            Ok(accepted) => {
                log.note(format!("principal {}", accepted.principal));
                let extra = accepted
                    .reply
                    .map(|r| format!("Proxy-Authenticate: Negotiate {r}\r\n"))
                    .unwrap_or_default();
                Ok(Some((head, extra)))
            }
            Err(e) => {
                log.note(format!("refused: {e:#}"));
                stream
                    .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Negotiate\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await?;
                Ok(None)
            }
        };
    }
}

async fn serve_http<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    log: &Log,
    expected: Option<&str>,
    mode: &HttpParentMode,
) -> Result<()> {
    let mut head = read_head(&mut stream).await?;
    log.push(String::from_utf8_lossy(&head).into_owned());
    let mut established = String::new();
    if let HttpParentMode::Negotiate(acceptor) | HttpParentMode::NegotiateForged(acceptor) = mode {
        match negotiate(&mut stream, log, acceptor, head).await? {
            Some((h, extra)) => {
                head = h;
                established = extra;
            }
            None => return Ok(()),
        }
    }
    if matches!(mode, HttpParentMode::NegotiateForged(_)) {
        established = "Proxy-Authenticate: Negotiate Zm9yZ2VkIG11dHVhbCB0b2tlbg==\r\n".into();
        if !head.starts_with(b"CONNECT ") {
            let resp = format!("HTTP/1.1 200 OK\r\n{established}Content-Length: 6\r\n\r\nforged");
            stream.write_all(resp.as_bytes()).await?;
            return Ok(());
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    if let HttpParentMode::Refuse(status) = mode {
        let resp = format!(
            "HTTP/1.1 {status} Refused by test parent\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(resp.as_bytes()).await?;
        return Ok(());
    }
    if let Some(expected) = expected {
        let given = proxy_authorization_of(&text);
        if given.as_deref() != Some(expected) {
            stream
                .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"parent\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await?;
            return Ok(());
        }
    }
    let line = text.lines().next().unwrap_or_default().to_owned();
    let mut parts = line.split(' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    if method == "CONNECT" {
        let Some((host, port)) = target.rsplit_once(':') else {
            stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                .await?;
            return Ok(());
        };
        let Some(dest) = port.parse().ok().and_then(|p| loopback_target(host, p)) else {
            stream
                .write_all(b"HTTP/1.1 502 Not loopback\r\n\r\n")
                .await?;
            return Ok(());
        };
        let Ok(mut upstream) = TcpStream::connect(dest).await else {
            stream
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
                .await?;
            return Ok(());
        };
        stream
            .write_all(
                format!("HTTP/1.1 200 Connection established\r\n{established}\r\n").as_bytes(),
            )
            .await?;
        let _ = copy_bidirectional(&mut stream, &mut upstream).await;
        return Ok(());
    }
    // Absolute-form: forward the head unchanged (the test origin accepts absolute-form),
    // then relay.
    let Some(rest) = target.strip_prefix("http://") else {
        stream
            .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            .await?;
        return Ok(());
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            (h.to_owned(), p.parse().unwrap_or(80))
        }
        _ => (authority.to_owned(), 80),
    };
    let Some(dest) = loopback_target(&host, port) else {
        stream
            .write_all(b"HTTP/1.1 502 Not loopback\r\n\r\n")
            .await?;
        return Ok(());
    };
    let mut upstream = TcpStream::connect(dest).await?;
    upstream.write_all(&head).await?;
    let _ = copy_bidirectional(&mut stream, &mut upstream).await;
    Ok(())
}

/// A "parent" that accepts TCP and closes at once: every attempt through it is a
/// connection-level failure. Counts the connections.
#[derive(Debug)]
pub struct ClosingParent {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl ClosingParent {
    /// Binds `127.0.0.1:0`.
    ///
    /// # Errors
    /// When the listener cannot be bound.
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicUsize::new(0));
        let task = {
            let accepted = Arc::clone(&accepted);
            tokio::spawn(async move {
                loop {
                    if let Ok((s, _)) = listener.accept().await {
                        accepted.fetch_add(1, Ordering::SeqCst);
                        drop(s);
                    }
                }
            })
        };
        Ok(Self {
            addr,
            accepted,
            task,
        })
    }

    /// `host:port`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted (and closed) so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for ClosingParent {
    fn drop(&mut self) {
        self.task.abort();
    }
}
