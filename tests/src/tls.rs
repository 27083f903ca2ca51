//! TLS test support: a test CA of ours for loopback origins, a TLS origin (HTTP/1.1 and
//! HTTP/2 by ALPN) that echoes what it received, and a client that opens a CONNECT tunnel
//! through the mediator and speaks TLS (and then HTTP/2 with hyper) inside it.
//!
//! The origin's certificate comes from a CA made here with the `certs` crate; the mediator
//! is told to trust it through `[tls] extra_ca_files`, never through the system store.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, anyhow, bail, ensure};
use bytes::Bytes;
use certs::{Ca, CaOptions, LeafName};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::http::basic_auth;
use crate::origin::{echo_json, echo_reply};

/// A CA made for one test, with its certificate written to `<dir>/test-ca.pem` (the file
/// to list in `[tls] extra_ca_files`).
#[derive(Debug)]
pub struct TestCa {
    /// The CA.
    pub ca: Ca,
    /// Its certificate, PEM, on disk.
    pub pem_path: PathBuf,
}

impl TestCa {
    /// Creates a CA and writes its certificate into `dir`.
    ///
    /// # Errors
    /// Generation or write failure.
    pub fn create(dir: &Path) -> Result<Self> {
        let ca = Ca::create(&CaOptions {
            common_name: "e2e test origin CA".into(),
            ..CaOptions::default()
        })?;
        let pem_path = dir.join("test-ca.pem");
        std::fs::write(&pem_path, ca.cert_pem())?;
        Ok(Self { ca, pem_path })
    }
}

/// An echoing HTTPS origin on `127.0.0.1:0` (HTTP/1.1 and HTTP/2 by ALPN). Every response
/// is `200` with a JSON body `{"method","target","version","headers","body"}` and a forged
/// `X-Mediator-Decision` header that the mediator must strip. It counts its TLS handshakes
/// and its open connections, and can close its idle ones (how a reused upstream connection
/// is seen).
#[derive(Debug)]
pub struct TlsOrigin {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    counts: Arc<Counts>,
    /// Bumped to make every connection close once it is idle.
    close_idle: tokio::sync::watch::Sender<u64>,
    /// The echo of every request received (its JSON text), oldest first.
    received: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl TlsOrigin {
    /// Starts an origin presenting a certificate for exactly `name`, issued by `ca`.
    ///
    /// # Errors
    /// Issue or bind failure.
    pub async fn start(ca: &Ca, name: &str) -> Result<Self> {
        Self::start_on(ca, name, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// As [`Self::start`], bound to `addr` (which must be loopback, e.g. `127.66.1.1:443`).
    ///
    /// # Errors
    /// Issue or bind failure, or a non-loopback `addr`.
    pub async fn start_on(ca: &Ca, name: &str, addr: SocketAddr) -> Result<Self> {
        ensure!(addr.ip().is_loopback(), "the origin only binds loopback");
        let leaf = ca.issue(&LeafName::parse(name)?)?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(leaf.chain, leaf.key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the TLS origin on {addr}"))?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&requests);
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&received);
        let counts = Arc::new(Counts::default());
        let counted = Arc::clone(&counts);
        let (close_idle, closing) = tokio::sync::watch::channel(0);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let counter = Arc::clone(&counter);
                let log = Arc::clone(&log);
                let counted = Arc::clone(&counted);
                let mut closing = closing.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _open = counted.opened();
                    let svc = service_fn(move |req| {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let log = Arc::clone(&log);
                        async move {
                            let json = echo_json(req, true).await;
                            log.lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(json.to_string());
                            Ok::<_, Infallible>(echo_reply(&json))
                        }
                    });
                    // Header lists up to 1 MiB (the largest `request_head_bytes`), so
                    // the mediator's own limit is what a large-header test meets.
                    let mut builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    builder.http2().max_header_list_size(1 << 20);
                    let conn = builder.serve_connection(TokioIo::new(tls), svc);
                    tokio::pin!(conn);
                    closing.mark_unchanged();
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        _ = closing.changed() => {
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
            }
        });
        Ok(Self {
            addr,
            requests,
            counts,
            close_idle,
            received,
            task,
        })
    }

    /// How many TLS handshakes the origin completed (one per upstream connection).
    pub fn handshakes(&self) -> usize {
        self.counts.handshakes.load(Ordering::SeqCst)
    }

    /// How many of its connections are open now.
    pub fn open_connections(&self) -> usize {
        self.counts.open.load(Ordering::SeqCst)
    }

    /// Closes every connection as soon as it is idle (at once if it is), as an origin's
    /// keep-alive timeout would.
    pub fn close_idle_connections(&self) {
        self.close_idle.send_modify(|n| *n += 1);
    }

    /// The origin's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// How many requests the origin has answered.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Whether any request the origin received (head, body or trailers, as echoed)
    /// contained `text`.
    pub fn received_text(&self, text: &str) -> bool {
        self.received
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|echo| echo.contains(text))
    }
}

/// A TLS origin's connection counts.
#[derive(Debug, Default)]
struct Counts {
    handshakes: AtomicUsize,
    open: AtomicUsize,
}

impl Counts {
    /// Counts a completed handshake and an open connection, until the guard is dropped.
    fn opened(self: &Arc<Self>) -> OpenGuard {
        self.handshakes.fetch_add(1, Ordering::SeqCst);
        self.open.fetch_add(1, Ordering::SeqCst);
        OpenGuard(Arc::clone(self))
    }
}

/// One open connection of a TLS origin.
struct OpenGuard(Arc<Counts>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for TlsOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens `CONNECT target` on the mediator's TCP listener with `(authority, token)`, then
/// TLS inside the tunnel with SNI `sni`, trusting only the PEM file `ca_pem` and offering
/// ALPN `alpn`.
///
/// # Errors
/// Connect failure, a non-200 CONNECT answer, or a failed TLS handshake.
pub async fn tls_through_connect(
    proxy: SocketAddr,
    (authority, token): (&str, &str),
    target: &str,
    sni: &str,
    ca_pem: &Path,
    alpn: &[&[u8]],
) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
    ensure!(proxy.ip().is_loopback(), "tests only connect to loopback");
    let mut tcp = TcpStream::connect(proxy).await?;
    let req = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {}\r\n\r\n",
        basic_auth(authority, token)
    );
    tcp.write_all(req.as_bytes()).await?;
    // Read the answer byte by byte so no tunnelled byte is consumed.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(std::time::Duration::from_secs(20), tcp.read(&mut b))
            .await
            .context("CONNECT answer timed out")??;
        if n == 0 {
            bail!(
                "proxy closed during the CONNECT answer: {:?}",
                String::from_utf8_lossy(&head)
            );
        }
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    ensure!(head.starts_with("HTTP/1.1 200"), "CONNECT answer: {head}");
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_file_iter(ca_pem)? {
        let cert: CertificateDer<'static> = cert?;
        roots.add(cert)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = ServerName::try_from(sni.to_owned())?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .context("TLS handshake through the tunnel")?;
    Ok(tls)
}

/// The TLS records a rustls client sends first when it connects to `sni`: its
/// ClientHello, grown past `at_least` bytes by offering long ALPN names (RFC 7301: up to
/// 255 bytes each), as real clients' hellos grow with post-quantum key shares.
///
/// # Errors
/// `sni` is not a valid DNS name, or rustls cannot start a handshake.
pub fn client_hello(sni: &str, at_least: usize) -> Result<Vec<u8>> {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let names = at_least.div_ceil(201);
    config.alpn_protocols = (0..names)
        .map(|i| format!("{i:04}").into_bytes().repeat(50))
        .collect();
    let name = ServerName::try_from(sni.to_owned())?;
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name)?;
    let mut hello = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut hello)?;
    }
    ensure!(
        hello.len() >= at_least,
        "the hello has {} bytes, not {at_least}",
        hello.len()
    );
    Ok(hello)
}

/// A hyper HTTP/2 client over `tls` (which must have negotiated `h2`).
///
/// # Errors
/// When ALPN did not select `h2` or the HTTP/2 handshake fails.
pub async fn h2_client(
    tls: tokio_rustls::client::TlsStream<TcpStream>,
) -> Result<hyper::client::conn::http2::SendRequest<Full<Bytes>>> {
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    ensure!(
        alpn.as_deref() == Some(b"h2"),
        "ALPN selected {:?}, not h2",
        alpn.map(|a| String::from_utf8_lossy(&a).into_owned())
    );
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .map_err(|e| anyhow!("HTTP/2 handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}
