//! TLS to an HTTPS parent (`https://` in `parents`, a PAC's `HTTPS host:port`, an
//! `https://` proxy variable or desktop setting): rustls, verified against the system trust
//! store plus `[tls] extra_ca_files`, SNI = the parent's configured name (an IP-literal
//! parent is verified against its IP). CONNECT and absolute-form then run inside the TLS
//! exactly as with a plain HTTP parent.

use std::path::PathBuf;
use std::sync::Arc;

use policy::upstream::ParentUrl;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::stream::UpstreamStream;
use crate::error::Error;

/// The TLS client of HTTPS parents, built once at start.
#[derive(Debug, Clone)]
pub(crate) struct ParentTls {
    config: Arc<rustls::ClientConfig>,
}

impl ParentTls {
    /// Loads the trust store: the system store plus every certificate of `extra_ca_files`.
    ///
    /// # Errors
    /// [`Error::Upstream`] naming the file when an extra CA file cannot be read or holds
    /// no certificate.
    pub(crate) fn new(extra_ca_files: &[PathBuf]) -> Result<Self, Error> {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::debug!("system trust store: {e}");
        }
        roots.add_parsable_certificates(native.certs);
        crate::tls::add_extra_ca_files(&mut roots, extra_ca_files)
            .map_err(|(at, why)| Error::upstream_by(at, why))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::upstream_by("TLS client configuration", e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // The parent speaks HTTP/1.1 (CONNECT, absolute-form) inside.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// Opens TLS to `parent` over `tcp`, SNI = the parent's name.
    ///
    /// # Errors
    /// The handshake failed or the certificate does not verify, in words (no rustls
    /// variant names) and without the parent, which the caller names: "TLS: the
    /// server's certificate: it is signed by an issuer that is not trusted ...".
    pub(crate) async fn connect(
        &self,
        parent: &ParentUrl,
        tcp: TcpStream,
    ) -> Result<UpstreamStream, ParentTlsError> {
        let name =
            ServerName::try_from(parent.addr.host.as_text()).map_err(ParentTlsError::Name)?;
        tokio_rustls::TlsConnector::from(Arc::clone(&self.config))
            .connect(name, tcp)
            .await
            .map(|tls| UpstreamStream::Tls(Box::new(tls)))
            .map_err(|e| ParentTlsError::Handshake(crate::tls::words::handshake_error(&e)))
    }
}

/// Why TLS to an HTTPS parent failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ParentTlsError {
    /// The parent's name is no TLS server name.
    #[error("not a TLS server name: {0}")]
    Name(rustls::pki_types::InvalidDnsNameError),
    /// The handshake failed or the certificate does not verify, in words.
    #[error("TLS: {0}")]
    Handshake(String),
}
