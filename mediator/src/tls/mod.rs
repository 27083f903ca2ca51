//! TLS termination (design section 9): for tunnels whose target matches the grant's
//! `tls_terminate`, the mediator accepts the client's TLS itself with a leaf for exactly
//! the tunnel host (issued by its CA, see the `certs` crate), serves the requests inside
//! with hyper (HTTP/1.1 and HTTP/2, ALPN `h2` and `http/1.1`), judges each one, and
//! forwards the allowed ones over a new TLS connection to the pinned upstream, verified
//! against the system trust store plus `[tls] extra_ca_files`.
//!
//! What it must never do: present a certificate for any name but the tunnel host, forward a
//! request whose `Host` / `:authority` names another host (domain fronting through the
//! terminated leg gets `421`), skip upstream certificate verification, or connect anywhere
//! but the tunnel's pinned upstream stream (so the route is the tunnel's route).
//!
//! `TlsState` is built once at start; `terminate` runs one terminated tunnel with it.

pub(crate) mod words;

use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;

use certs::{Ca, CaOptions, LeafCache};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

use crate::error::{Error, ErrorCause};

/// How many leaves the cache keeps (one per terminated host; issuing one takes about a
/// millisecond, so this only bounds memory).
const LEAF_CACHE: usize = 1024;

/// ALPN protocols offered on both legs, preferred first (RFC 7301; RFC 9113 section 3.2).
pub(crate) const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The CA, its leaf cache, and the upstream client configuration.
#[derive(Debug)]
pub(crate) struct TlsState {
    pub(crate) leaves: LeafCache,
    /// Upstream TLS of tunnels whose client chose `h2`: ALPN `h2`, `http/1.1`.
    pub(crate) upstream: Arc<rustls::ClientConfig>,
    /// Upstream TLS of tunnels whose client speaks HTTP/1.1: ALPN `http/1.1` only, so
    /// that an `Upgrade` (RFC 9110 section 7.8) of the client's connection can upgrade the
    /// upstream one with it.
    pub(crate) upstream_h1: Arc<rustls::ClientConfig>,
    pub(crate) provider: Arc<CryptoProvider>,
}

impl TlsState {
    /// Loads (or creates, on first start) the CA in `[tls] ca_dir` and builds the upstream
    /// trust store: the system store plus every certificate of `extra_ca_files`. Returns
    /// `None` when no `ca_dir` is configured (no authority may then terminate; the config
    /// validator enforces that).
    ///
    /// # Errors
    /// [`Error::Tls`] naming the file: the CA cannot be created or loaded (bad key mode,
    /// expired, not a CA, ...), or an extra CA file cannot be read or holds no certificate.
    pub(crate) fn load(cfg: &policy::config::Tls) -> Result<Option<Self>, Error> {
        let Some(dir) = &cfg.ca_dir else {
            // Without a CA the files only serve an https PAC fetch, but a configured file
            // that cannot be used is an error either way, never silently unused.
            check_extra_ca_files(cfg)?;
            return Ok(None);
        };
        let ca = load_ca(dir)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let upstream = client_config(&provider, &cfg.extra_ca_files)?;
        let mut h1 = (*upstream).clone();
        h1.alpn_protocols = vec![b"http/1.1".to_vec()];
        // LEAF_CACHE is a non-zero constant.
        let capacity = NonZeroUsize::new(LEAF_CACHE).unwrap_or(NonZeroUsize::MIN);
        Ok(Some(Self {
            leaves: LeafCache::new(Arc::new(ca), capacity),
            upstream,
            upstream_h1: Arc::new(h1),
            provider,
        }))
    }

    /// The CA certificate (PEM) children must trust.
    pub(crate) fn ca_pem(&self) -> &str {
        self.leaves.ca().cert_pem()
    }

    /// What [`Self::load`] would find, changing nothing (`mediator check`): the CA is
    /// loaded and checked when its files exist; when neither exists, the directory must
    /// be one a start could create it in. The extra CA files are read.
    ///
    /// # Errors
    /// As [`Self::load`], and a `ca_dir` that a start could not create the CA in.
    pub(crate) fn check(cfg: &policy::config::Tls) -> Result<Option<String>, Error> {
        let Some(dir) = &cfg.ca_dir else {
            check_extra_ca_files(cfg)?;
            return Ok(None);
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        client_config(&provider, &cfg.extra_ca_files)?;
        let cert = dir.join(certs::CA_CERT_FILE);
        let key = dir.join(certs::CA_KEY_FILE);
        if cert.exists() || key.exists() {
            load_ca(dir)?;
            return Ok(Some(format!(
                "[tls] ca_dir: the CA in {} is usable",
                dir.display()
            )));
        }
        // The first start creates it: the nearest existing ancestor must be writable.
        let mut probe = dir.as_path();
        while !probe.exists() {
            match probe.parent() {
                Some(p) => probe = p,
                None => break,
            }
        }
        match nix::unistd::access(
            probe,
            nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
        ) {
            Ok(()) => Ok(Some(format!(
                "[tls] ca_dir: no CA in {} yet; the first start creates one there",
                dir.display()
            ))),
            Err(e) => Err(Error::tls(format!(
                "[tls] ca_dir: no CA in {} and {} is not writable ({e}): the first start could not create one",
                dir.display(),
                probe.display()
            ))),
        }
    }
}

/// Loads the CA in `dir`, creating it (ECDSA P-256) if the directory holds none: what
/// `mediator ca-cert` prints and what termination issues from.
///
/// # Errors
/// [`Error::Tls`] with the `certs` crate's message.
pub fn load_ca(dir: &Path) -> Result<Ca, Error> {
    Ca::load_or_create(dir, &CaOptions::default()).map_err(|e| Error::tls_by("[tls] ca_dir", e))
}

/// Reads every `[tls] extra_ca_files` entry (when there are any).
///
/// # Errors
/// As [`client_config`].
fn check_extra_ca_files(cfg: &policy::config::Tls) -> Result<(), Error> {
    if !cfg.extra_ca_files.is_empty() {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        client_config(&provider, &cfg.extra_ca_files)?;
    }
    Ok(())
}

/// Adds the certificates of the PEM file `path` to `roots`; how many it held.
///
/// # Errors
/// [`ErrorCause::Pem`] when the file cannot be read or does not parse, [`ErrorCause::Rustls`] when
/// rustls refuses one of its certificates.
pub(crate) fn add_pem_file(
    roots: &mut rustls::RootCertStore,
    path: &Path,
) -> Result<usize, ErrorCause> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(path).and_then(Iterator::collect)?;
    let n = certs.len();
    for cert in certs {
        roots.add(cert)?;
    }
    Ok(n)
}

/// Adds every certificate of the `[tls] extra_ca_files` `files` to `roots`.
///
/// # Errors
/// The setting and the file (`[tls] extra_ca_files: PATH`) with why it is unusable: as
/// [`add_pem_file`], or it holds no PEM certificate.
pub(crate) fn add_extra_ca_files(
    roots: &mut rustls::RootCertStore,
    files: &[std::path::PathBuf],
) -> Result<(), (String, ErrorCause)> {
    for path in files {
        let at = || format!("[tls] extra_ca_files: {}", path.display());
        match add_pem_file(roots, path) {
            Ok(0) => return Err((at(), ErrorCause::from("no PEM certificate in the file"))),
            Ok(_) => {}
            Err(why) => return Err((at(), why)),
        }
    }
    Ok(())
}

fn client_config(
    provider: &Arc<CryptoProvider>,
    extra: &[std::path::PathBuf],
) -> Result<Arc<rustls::ClientConfig>, Error> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::warn!("system trust store: {e}");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!("system trust store: {added} certificates ({ignored} unusable)");
    add_extra_ca_files(&mut roots, extra).map_err(|(at, why)| Error::tls_by(at, why))?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::clone(provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::tls_by("TLS client configuration", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}
