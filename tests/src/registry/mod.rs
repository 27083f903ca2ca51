//! Stand-ins for the public package registries, served on loopback, so that the real
//! clients (pip, npm, cargo, apt-get, curl) can be run against them: a [`StaticOrigin`]
//! (HTTP/1.1 and HTTP/2 over TLS, or plain HTTP) answering `GET` and `HEAD` from a table
//! of paths, and the files of each registry, built here ([`pypi`]: a simple index
//! (PEP 503) and wheels; [`npm`]: packuments and tarballs; [`cargo`]: a sparse index and
//! its `.crate` files; [`debian`]: a repository with a `Release`, `Packages` and `.deb`
//! files, for `[trusted=yes]` sources).
//!
//! Each origin serves one name (its certificate is for exactly that name, from a test CA
//! of the caller's); a registry that the real one splits over two hosts (an index and
//! its files) gets two origins, so that a test can grant one and leave the other out.
//! The origin runs on a thread of its own (its own tokio runtime), so that synchronous
//! tests can use it; dropping it stops it.

pub mod cargo;
pub mod debian;
pub mod npm;
pub mod pypi;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result};
use bytes::Bytes;
use certs::{Ca, LeafName};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// One file an origin serves.
#[derive(Debug, Clone)]
struct Route {
    content_type: &'static str,
    body: Bytes,
}

/// The paths an origin serves, and the paths it was asked for.
#[derive(Debug, Default)]
struct Table {
    routes: BTreeMap<String, Route>,
    asked: Vec<String>,
}

/// A static HTTP(S) origin on `127.0.0.1:0` (see the module documentation).
#[derive(Debug)]
pub struct StaticOrigin {
    name: String,
    addr: SocketAddr,
    tls: bool,
    table: Arc<Mutex<Table>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl StaticOrigin {
    /// Starts an origin for `name`: HTTPS with a certificate for exactly `name` issued by
    /// `ca`, or plain HTTP when `ca` is `None`.
    ///
    /// # Errors
    /// The certificate cannot be issued, or the listener cannot be bound.
    pub fn start(name: &str, ca: Option<&Ca>) -> Result<Self> {
        let acceptor = ca.map(|ca| acceptor(ca, name)).transpose()?;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")
            .context("binding a registry stand-in on 127.0.0.1")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let table = Arc::new(Mutex::new(Table::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = Arc::clone(&table);
        std::thread::Builder::new()
            .name(format!("origin-{name}"))
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(std_listener) else {
                        return;
                    };
                    tokio::select! {
                        () = accept_loop(listener, acceptor, served) => {}
                        _ = stopped => {}
                    }
                });
            })?;
        Ok(Self {
            name: name.to_owned(),
            addr,
            tls: ca.is_some(),
            table,
            stop: Some(stop),
        })
    }

    /// The name it serves.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `name:port`, as a grant or a `CONNECT` names it.
    pub fn host_port(&self) -> String {
        format!("{}:{}", self.name, self.port())
    }

    /// Its base URL, `https://name:port` (or `http://`), without a trailing slash.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.host_port())
    }

    /// Serves `body` at `path` (which starts with `/`) with `content_type`.
    pub fn serve(&self, path: &str, content_type: &'static str, body: impl Into<Bytes>) {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .routes
            .insert(
                path.to_owned(),
                Route {
                    content_type,
                    body: body.into(),
                },
            );
    }

    /// The paths asked for so far, in order (a query is left out).
    pub fn asked(&self) -> Vec<String> {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .asked
            .clone()
    }
}

impl Drop for StaticOrigin {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A TLS acceptor presenting a certificate for exactly `name`, issued by `ca`, offering
/// HTTP/2 and HTTP/1.1 by ALPN.
fn acceptor(ca: &Ca, name: &str) -> Result<TlsAcceptor> {
    let leaf = ca.issue(&LeafName::parse(name)?)?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(leaf.chain, leaf.key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    table: Arc<Mutex<Table>>,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let table = Arc::clone(&table);
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let reply = answer(&table, &req);
                async move { Ok::<_, Infallible>(reply) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            match acceptor {
                Some(a) => {
                    if let Ok(tls) = a.accept(tcp).await {
                        let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
                    }
                }
                None => {
                    let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
                }
            }
        });
    }
}

/// The answer to one request: the file at its path (`GET`, `HEAD`), else `404`.
fn answer<B>(table: &Mutex<Table>, req: &Request<B>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let mut table = table.lock().unwrap_or_else(PoisonError::into_inner);
    table.asked.push(path.clone());
    let found = table.routes.get(&path).cloned();
    drop(table);
    let mut reply = Response::builder();
    let body = match (req.method(), found) {
        (&hyper::Method::GET | &hyper::Method::HEAD, Some(route)) => {
            reply = reply
                .status(StatusCode::OK)
                .header("content-type", route.content_type)
                .header("content-length", route.body.len());
            if req.method() == hyper::Method::HEAD {
                Bytes::new()
            } else {
                route.body
            }
        }
        _ => {
            reply = reply.status(StatusCode::NOT_FOUND);
            Bytes::from_static(b"not found\n")
        }
    };
    reply
        .body(Full::new(body))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// A gzip-compressed tar archive of `files` (`(path, contents)`, mode 0644, a fixed
/// modification time), as npm and cargo package them.
///
/// # Errors
/// The archive cannot be written (it is written to memory).
pub fn tar_gz(files: &[(&str, &[u8])]) -> Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    for (path, contents) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(contents.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(1_700_000_000);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, path, *contents)?;
    }
    Ok(tar.into_inner()?.finish()?)
}

/// `bytes`' SHA-256, lowercase hex.
pub fn sha256_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
