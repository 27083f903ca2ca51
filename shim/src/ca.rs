//! The mediator's CA inside the sandbox (design section 12: CA variables when TLS
//! termination is on).
//!
//! Two steps, both in the outer shim. [`load`] reads the CA certificate (`--ca-cert FILE`,
//! or `<[tls] ca_dir>/ca.pem` of `--config` when the authority terminates TLS) read-only and
//! checks that it holds certificates and nothing else: never a private key, and the shim
//! never creates a CA. [`TrustFiles::create`] then writes, in a private (0700) directory
//! under the temporary directory, the two files the command's CA variables point at:
//!
//! - `bundle.pem`: the system bundle (the first of [`SYSTEM_BUNDLES`] that exists) followed
//!   by the CA, so that public sites still verify;
//! - `mediator-ca.pem`: the CA alone, for `NODE_EXTRA_CA_CERTS` (which adds to Node's own
//!   store);
//! - `truststore.jks`: the same certificates as the bundle, as a Java KeyStore
//!   ([`crate::jks`]), for the JVM's `javax.net.ssl.trustStore`;
//! - `wgetrc`: `ca_certificate = <bundle>`, for wget (which reads no CA variable).
//!
//! The directory is shown read-only inside the sandbox (whatever `--allow-write` and
//! `--deny-read` say about its parent) and removed at exit, by the shim or, if the shim is
//! killed, by its janitor, as the placeholders are.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cli::{CaCert, CaOrigin};
use crate::env::CaFiles;
use crate::error::{Error, Result};

/// System CA bundles, in the order looked for (Debian and derivatives, Fedora and RHEL,
/// Alpine's and the BSDs' `cert.pem`).
pub(crate) const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The combined bundle's file name in the private directory.
pub(crate) const BUNDLE_FILE: &str = "bundle.pem";
/// The CA-only file's name in the private directory.
pub(crate) const CA_ONLY_FILE: &str = "mediator-ca.pem";
/// The JVM trust store's name in the private directory.
pub(crate) const JAVA_FILE: &str = "truststore.jks";
/// wget's startup file's name in the private directory.
pub(crate) const WGETRC_FILE: &str = "wgetrc";

/// Read the CA certificate `ca` names and return its certificates, PEM (LF line endings).
///
/// # Errors
/// [`Error::Ca`] naming the file: it cannot be read (for the config's CA, with how to
/// create it: `mediator ca-cert --config FILE`), it is not PEM, it holds a private key or
/// another kind of block, a block is not an X.509 certificate, or it holds none.
pub(crate) fn load(ca: &CaCert) -> Result<String> {
    let text = std::fs::read(&ca.path).map_err(|e| Error::Ca {
        path: ca.path.clone(),
        detail: match (&ca.origin, e.kind()) {
            (CaOrigin::Config { config, authority }, std::io::ErrorKind::NotFound) => format!(
                "the mediator's CA certificate does not exist (authority {authority:?} has \
                 tls_terminate in {c}, so the command must trust it); create it with \
                 `mediator ca-cert --config {c}` (the shim never creates a CA)",
                c = config.display()
            ),
            (CaOrigin::Config { config, .. }, _) => format!(
                "cannot read the mediator's CA certificate: {e}; export a readable copy with \
                 `mediator ca-cert --config {} > FILE` and pass --ca-cert FILE",
                config.display()
            ),
            (CaOrigin::Flag, _) => format!("cannot read the --ca-cert file: {e}"),
        },
    })?;
    certificates_pem(&text).map_err(|detail| Error::Ca {
        path: ca.path.clone(),
        detail,
    })
}

/// The certificates of a PEM text, re-encoded; `Err` says what is wrong with it.
// A `String` error: the words the shim prints before exiting; no caller branches on it.
fn certificates_pem(text: &[u8]) -> std::result::Result<String, String> {
    let blocks = pem::parse_many(text).map_err(|e| format!("not a PEM file: {e}"))?;
    if blocks.is_empty() {
        return Err("no PEM certificate in the file".into());
    }
    for b in &blocks {
        if b.tag().contains("PRIVATE KEY") {
            return Err(format!(
                "holds a {} block; pass the CA certificate only (ca.pem, never ca-key.pem), \
                 since the command must not see the key",
                b.tag()
            ));
        }
        if b.tag() != "CERTIFICATE" {
            return Err(format!(
                "holds a {} block; only CERTIFICATE blocks are accepted",
                b.tag()
            ));
        }
        x509_parser::parse_x509_certificate(b.contents())
            .map_err(|e| format!("a CERTIFICATE block is not an X.509 certificate: {e}"))?;
    }
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    Ok(pem::encode_many_config(&blocks, config))
}

/// The DER of every certificate of a PEM text (a block that is not one is skipped: the
/// system bundle is the system's, and the JVM store only leaves it out).
fn certificates_der(pem_text: &[u8]) -> Vec<Vec<u8>> {
    pem::parse_many(pem_text)
        .unwrap_or_default()
        .into_iter()
        .filter(|b| b.tag() == "CERTIFICATE")
        .map(pem::Pem::into_contents)
        .collect()
}

/// The first system bundle that exists, with its contents; `None` if there is none.
///
/// # Errors
/// [`Error::Ca`] when the bundle exists but cannot be read.
fn system_bundle() -> Result<Option<(PathBuf, Vec<u8>)>> {
    for p in SYSTEM_BUNDLES {
        let path = Path::new(p);
        if !path.exists() {
            continue;
        }
        let bytes = std::fs::read(path).map_err(|e| Error::Ca {
            path: path.to_owned(),
            detail: format!("cannot read the system CA bundle: {e}"),
        })?;
        return Ok(Some((path.to_owned(), bytes)));
    }
    Ok(None)
}

/// The private directory holding the files the command's CA variables point at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TrustFiles {
    /// The directory (canonical, mode 0700).
    dir: PathBuf,
    /// Its device, to recognise it at cleanup.
    dev: u64,
    /// Its inode, to recognise it at cleanup.
    ino: u64,
}

impl TrustFiles {
    /// Create the private directory under [`std::env::temp_dir`] and write the combined
    /// bundle and the CA-only file (both mode 0444) into it. `ca_pem` comes from [`load`].
    ///
    /// Without any system bundle, the combined bundle holds only the CA (a warning says
    /// so on stderr): the command could not verify public sites anyway.
    ///
    /// # Errors
    /// [`Error::Io`] when the directory or a file cannot be created (nothing is left
    /// behind), [`Error::Ca`] when the system bundle cannot be read.
    pub(crate) fn create(ca_pem: &str) -> Result<Self> {
        let system = system_bundle()?;
        let me = Self::make_dir()?;
        match me.write(ca_pem, system.as_ref().map(|(_, b)| b.as_slice())) {
            Ok(()) => {
                if system.is_none() {
                    eprintln!(
                        "shim: warning: no system CA bundle ({}); the command trusts only the mediator's CA",
                        SYSTEM_BUNDLES.join(", ")
                    );
                }
                Ok(me)
            }
            Err(e) => {
                me.remove();
                Err(e)
            }
        }
    }

    fn make_dir() -> Result<Self> {
        let base = std::env::temp_dir();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut last = None;
        for attempt in 0..16u32 {
            let dir = base.join(format!(
                "shim-ca-{}-{:08x}",
                std::process::id(),
                nanos.wrapping_add(attempt.wrapping_mul(0x9e37_79b9))
            ));
            // mkdir fails on anything already there, symlinks included.
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    last = Some(e);
                    continue;
                }
                Err(e) => {
                    return Err(Error::io(
                        format!("create the CA directory {}", dir.display()),
                        e,
                    ));
                }
            }
            let meta = std::fs::symlink_metadata(&dir)
                .map_err(|e| Error::io(format!("stat {}", dir.display()), e))?;
            let me = Self {
                dev: meta.dev(),
                ino: meta.ino(),
                dir: dir.clone(),
            };
            // The umask may have taken our own write bit; the mode is exactly 0700.
            let canonical = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .and_then(|()| std::fs::canonicalize(&dir));
            return match canonical {
                Ok(c) => Ok(Self { dir: c, ..me }),
                Err(e) => {
                    me.remove();
                    Err(Error::io(format!("prepare {}", dir.display()), e))
                }
            };
        }
        Err(Error::io(
            format!("create a CA directory under {}", base.display()),
            last.unwrap_or_else(|| std::io::ErrorKind::AlreadyExists.into()),
        ))
    }

    fn write(&self, ca_pem: &str, system: Option<&[u8]>) -> Result<()> {
        let mut bundle = system.map(<[u8]>::to_vec).unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(ca_pem.as_bytes());
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let java = crate::jks::trust_store(&certificates_der(&bundle), millis);
        let wgetrc = format!(
            "# Written by the shim for this run: the system's CAs and the mediator's.\nca_certificate = {}\n",
            self.dir.join(BUNDLE_FILE).display()
        );
        for (name, content) in [
            (BUNDLE_FILE, &bundle[..]),
            (CA_ONLY_FILE, ca_pem.as_bytes()),
            (JAVA_FILE, &java[..]),
            (WGETRC_FILE, wgetrc.as_bytes()),
        ] {
            let path = self.dir.join(name);
            let op = || format!("write {}", path.display());
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| Error::io(op(), e))?;
            f.write_all(content).map_err(|e| Error::io(op(), e))?;
            f.set_permissions(std::fs::Permissions::from_mode(0o444))
                .map_err(|e| Error::io(op(), e))?;
        }
        Ok(())
    }

    /// The private directory (shown read-only inside the sandbox).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The paths the CA variables name.
    pub(crate) fn files(&self) -> CaFiles {
        CaFiles {
            bundle: self.dir.join(BUNDLE_FILE),
            ca_only: self.dir.join(CA_ONLY_FILE),
            java: self.dir.join(JAVA_FILE),
            wgetrc: self.dir.join(WGETRC_FILE),
        }
    }

    /// Remove the files and the directory, if the directory is still the one created
    /// (nothing else in it is touched: a directory that is not empty then stays).
    pub(crate) fn remove(&self) {
        let Ok(meta) = std::fs::symlink_metadata(&self.dir) else {
            return;
        };
        if !meta.is_dir() || meta.dev() != self.dev || meta.ino() != self.ino {
            return;
        }
        for name in [BUNDLE_FILE, CA_ONLY_FILE, JAVA_FILE, WGETRC_FILE] {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> String {
        certs::Ca::create(&certs::CaOptions::default())
            .unwrap()
            .cert_pem()
            .to_owned()
    }

    #[test]
    fn certificates_pass_and_keys_or_garbage_do_not() {
        let pem = ca_pem();
        assert_eq!(certificates_pem(pem.as_bytes()).unwrap(), pem);
        let with_text = format!("# comment\n{pem}\n");
        assert_eq!(certificates_pem(with_text.as_bytes()).unwrap(), pem);
        let key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        let e = certificates_pem(format!("{pem}{key}").as_bytes()).unwrap_err();
        assert!(e.contains("ca-key.pem"), "{e}");
        let e = certificates_pem(b"hello").unwrap_err();
        assert!(e.contains("no PEM certificate"), "{e}");
        let junk = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let e = certificates_pem(junk.as_bytes()).unwrap_err();
        assert!(e.contains("not an X.509"), "{e}");
    }

    #[test]
    fn missing_config_ca_names_the_file_and_the_command() {
        let ca = CaCert {
            path: "/nonexistent-shim-ca/ca.pem".into(),
            origin: CaOrigin::Config {
                config: "/etc/egress/mediator.toml".into(),
                authority: "agent-a".into(),
            },
        };
        let e = load(&ca).unwrap_err().to_string();
        assert!(e.contains("/nonexistent-shim-ca/ca.pem"), "{e}");
        assert!(
            e.contains("mediator ca-cert --config /etc/egress/mediator.toml"),
            "{e}"
        );
        assert!(!Path::new("/nonexistent-shim-ca").exists());
    }

    #[test]
    fn trust_files_are_private_combined_and_removed() {
        let pem = ca_pem();
        let t = TrustFiles::create(&pem).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(t.dir()), 0o700);
        let files = t.files();
        assert_eq!(mode(&files.bundle), 0o444);
        assert_eq!(std::fs::read_to_string(&files.ca_only).unwrap(), pem);
        let bundle = std::fs::read_to_string(&files.bundle).unwrap();
        assert!(bundle.ends_with(&pem));
        // The JVM store holds the bundle's certificates, the CA last.
        let java = std::fs::read(&files.java).unwrap();
        let ca_der = pem::parse(&pem).unwrap().into_contents();
        let count = u32::from_be_bytes(java[8..12].try_into().unwrap()) as usize;
        assert_eq!(count, certificates_der(bundle.as_bytes()).len());
        assert!(java[..java.len() - 20].ends_with(&ca_der));
        assert!(
            std::fs::read_to_string(&files.wgetrc)
                .unwrap()
                .contains(&format!("ca_certificate = {}\n", files.bundle.display()))
        );
        if let Some((_, system)) = system_bundle().unwrap() {
            assert!(bundle.as_bytes().starts_with(&system));
        }
        t.remove();
        assert!(!t.dir().exists());
    }
}
