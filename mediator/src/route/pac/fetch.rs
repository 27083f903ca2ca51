//! Fetching the PAC script (design section 8): from a file, or from an `http://` /
//! `https://` URL, directly or through `pac_fetch_via` — never through a route the PAC
//! itself chose, and never by WPAD. https is verified against the system trust store plus
//! `[tls] extra_ca_files`. The script is at most [`MAX_PAC`] bytes; anything but a `200`
//! is a failed fetch (the caller keeps the last good copy).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use policy::upstream::{PacSource, ParentScheme, ParentUrl};
use policy::{Target, canonicalize_host};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::{Error, ErrorCause};
use crate::resolve::Resolver;
use crate::route::handshake::{self, Dest};
use crate::route::https::ParentTls;
use crate::route::stream::UpstreamStream;

/// Largest PAC script accepted, in bytes.
pub(crate) const MAX_PAC: usize = 1 << 20;

/// Everything one fetch of the PAC needs.
pub(crate) struct Fetcher {
    source: PacSource,
    via: Option<ParentUrl>,
    tls: Arc<rustls::ClientConfig>,
    resolver: Arc<Resolver>,
    timeout: Duration,
    parent_tls: Option<ParentTls>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    /// Prepares fetching from `source` (through `via` when given). The TLS trust (system
    /// store plus `extra_ca_files`) is loaded here, once.
    ///
    /// # Errors
    /// [`Error::Upstream`] when an extra CA file cannot be read, or no trust anchor at all
    /// is available for an https source.
    pub(crate) fn new(
        source: PacSource,
        via: Option<ParentUrl>,
        extra_ca_files: &[PathBuf],
        resolver: Arc<Resolver>,
        connect_timeout: Duration,
        parent_tls: Option<ParentTls>,
    ) -> Result<Self, Error> {
        let mut roots = rustls::RootCertStore::empty();
        let https =
            matches!(&source, PacSource::Url(u) if u.to_ascii_lowercase().starts_with("https://"));
        if https {
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
                let _ = roots.add(cert);
            }
            for path in extra_ca_files {
                crate::tls::add_pem_file(&mut roots, path).map_err(|why| {
                    let what = match why {
                        ErrorCause::Rustls(_) => "bad CA certificate in",
                        _ => "cannot read CA file",
                    };
                    Error::upstream_by(format!("{what} {}", path.display()), why)
                })?;
            }
            if roots.is_empty() {
                return Err(Error::upstream(
                    "no trust anchors to verify the https PAC URL (system store empty, no [tls] extra_ca_files)",
                ));
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::upstream_by("TLS setup", e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            source,
            via,
            tls: Arc::new(tls),
            resolver,
            timeout: connect_timeout,
            parent_tls,
        })
    }

    /// Where the PAC comes from, for messages.
    pub(crate) fn source(&self) -> String {
        match &self.source {
            PacSource::File(p) => p.display().to_string(),
            PacSource::Url(u) => u.clone(),
        }
    }

    /// Fetches the script once.
    ///
    /// # Errors
    /// A message saying what failed (read, connect, TLS, status, size).
    pub(crate) async fn fetch(&self) -> Result<String, FetchError> {
        let bytes = match &self.source {
            PacSource::File(path) => {
                let bytes = tokio::fs::read(path)
                    .await
                    .map_err(|error| FetchError::Read {
                        path: path.clone(),
                        error,
                    })?;
                if bytes.len() > MAX_PAC {
                    return Err(FetchError::TooLarge { path: path.clone() });
                }
                bytes
            }
            PacSource::Url(url) => {
                // Connect, TLS and the whole transfer under one bound.
                let limit = self.timeout + Duration::from_secs(20);
                tokio::time::timeout(limit, self.fetch_url(url))
                    .await
                    .map_err(|_| FetchError::Timeout(url.clone(), limit))??
            }
        };
        String::from_utf8(bytes).map_err(|_| FetchError::NotUtf8)
    }

    async fn fetch_url(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        let uri: Uri = url
            .parse()
            .map_err(|e| FetchError::Url(url.to_owned(), e))?;
        let https = uri.scheme_str() == Some("https");
        let authority = uri.authority().ok_or(FetchError::NoHost)?;
        let host = canonicalize_host(authority.host())?;
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let target = Target { host, port };
        let path = uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_owned();

        let (stream, forward_auth) = match &self.via {
            None => {
                let (resolved, _) = self.resolver.resolve(&target.host).await;
                let addrs: Vec<SocketAddr> = resolved
                    .map_err(|e| FetchError::Resolve(target.host.to_string(), e.to_string()))?
                    .into_iter()
                    .map(|ip| SocketAddr::new(ip, port))
                    .collect();
                let (r, _) = crate::route::connect::connect_addrs(&addrs, self.timeout).await;
                let tcp = r.map_err(|e| FetchError::Connect(target.to_string(), e))?.0;
                (UpstreamStream::Plain(tcp), None)
            }
            Some(via) => self.through(via, &target, https).await?,
        };
        let host_header = if (https && port == 443) || (!https && port == 80) {
            target.host.to_uri_host()
        } else {
            target.to_string()
        };
        // Absolute-form only when an HTTP parent forwards plain http.
        let request_target = match &forward_auth {
            Some(_) => format!("http://{target}{path}"),
            None => path,
        };
        let mut req = Request::get(request_target)
            .header(header::HOST, host_header)
            .header(header::USER_AGENT, "egress-mediator")
            .header(header::ACCEPT, "application/x-ns-proxy-autoconfig, */*");
        if let Some(Some(auth)) = &forward_auth {
            req = req.header(header::PROXY_AUTHORIZATION, auth);
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(FetchError::Request)?;
        if https {
            let name =
                ServerName::try_from(target.host.as_text()).map_err(FetchError::ServerName)?;
            let tls = tokio_rustls::TlsConnector::from(Arc::clone(&self.tls))
                .connect(name, stream)
                .await
                .map_err(|e| FetchError::Tls(target.to_string(), e))?;
            get(tls, req, url).await
        } else {
            get(stream, req, url).await
        }
    }

    /// Opens a stream to `target` through the `pac_fetch_via` parent. For plain http
    /// through an HTTP parent the stream goes to the parent itself and the second value
    /// is `Some(Proxy-Authorization)`; otherwise it is a tunnel to `target`.
    async fn through(
        &self,
        via: &ParentUrl,
        target: &Target,
        https: bool,
    ) -> Result<(UpstreamStream, Option<Option<String>>), FetchError> {
        let (resolved, _) = self.resolver.resolve(&via.addr.host).await;
        let addrs: Vec<SocketAddr> = resolved
            .map_err(|e| FetchError::Via(via.to_string(), format!("cannot resolve it: {e}")))?
            .into_iter()
            .map(|ip| SocketAddr::new(ip, via.addr.port))
            .collect();
        let (r, _) = crate::route::connect::connect_addrs(&addrs, self.timeout).await;
        let (tcp, _) = r.map_err(|e| FetchError::Via(via.to_string(), e.to_string()))?;
        let mut stream = match (&self.parent_tls, via.scheme) {
            (Some(tls), ParentScheme::Https) => tls
                .connect(via, tcp)
                .await
                .map_err(|e| FetchError::Via(via.to_string(), e.to_string()))?,
            (None, ParentScheme::Https) => {
                return Err(FetchError::Via(via.to_string(), "no TLS client".into()));
            }
            _ => UpstreamStream::Plain(tcp),
        };
        let shown = via.to_string();
        let creds = via.credentials.as_ref();
        let dest = Dest::Host(&target.host);
        match via.scheme {
            ParentScheme::Http | ParentScheme::Https if !https => {
                Ok((stream, Some(creds.map(handshake::basic))))
            }
            ParentScheme::Http | ParentScheme::Https => {
                handshake::http_connect(&mut stream, dest, target.port, creds, &shown)
                    .await
                    .map_err(|e| FetchError::Via(shown.clone(), handshake_text(e)))?;
                Ok((stream, None))
            }
            ParentScheme::Socks5 => {
                handshake::socks5_connect(&mut stream, dest, target.port, creds, &shown)
                    .await
                    .map_err(|e| FetchError::Via(shown.clone(), handshake_text(e)))?;
                Ok((stream, None))
            }
        }
    }
}

fn handshake_text(e: handshake::HandshakeError) -> String {
    match e {
        handshake::HandshakeError::Broken(d)
        | handshake::HandshakeError::Refused { detail: d, .. } => d,
    }
}

/// Why a PAC could not be fetched (the mediator does not start, or keeps the script it
/// has).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("cannot read {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{} is larger than {MAX_PAC} bytes", path.display())]
    TooLarge { path: PathBuf },
    #[error("fetching {0} took longer than {1:?}")]
    Timeout(String, Duration),
    #[error("the PAC script is not UTF-8")]
    NotUtf8,
    #[error("bad PAC URL {0}: {1}")]
    Url(String, http::uri::InvalidUri),
    #[error("PAC URL without a host")]
    NoHost,
    #[error(transparent)]
    Host(#[from] policy::PolicyError),
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, String),
    #[error("{0}: {1}")]
    Connect(String, crate::route::ConnectFailure),
    #[error("building the request: {0}")]
    Request(http::Error),
    #[error("bad TLS server name: {0}")]
    ServerName(rustls::pki_types::InvalidDnsNameError),
    #[error("TLS with {0}: {1}")]
    Tls(String, std::io::Error),
    #[error("pac_fetch_via {0}: {1}")]
    Via(String, String),
    #[error("GET {0}: {1}")]
    Http(String, hyper::Error),
    #[error("GET {0}: status {1}")]
    Status(String, StatusCode),
    #[error("GET {0}: body: {1}")]
    Body(String, String),
}

/// One HTTP/1.1 GET over `io`; the body of a `200`, at most [`MAX_PAC`] bytes.
async fn get<S>(io: S, req: Request<Empty<Bytes>>, url: &str) -> Result<Vec<u8>, FetchError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| FetchError::Http(url.to_owned(), e))?;
    let driver = tokio::spawn(conn);
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| FetchError::Http(url.to_owned(), e))?;
    if resp.status() != StatusCode::OK {
        driver.abort();
        return Err(FetchError::Status(url.to_owned(), resp.status()));
    }
    let body = Limited::new(resp.into_body(), MAX_PAC)
        .collect()
        .await
        .map_err(|e| FetchError::Body(url.to_owned(), e.to_string()))?
        .to_bytes();
    driver.abort();
    Ok(body.to_vec())
}
