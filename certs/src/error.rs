//! The certs crate's one error type.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong creating, loading or using the CA.
#[derive(Debug, Error)]
pub enum Error {
    /// A file or directory of the CA could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The CA directory holds only one of the certificate and the key.
    #[error(
        "{dir}: {present} exists but {missing} does not; restore the missing file, or remove \
         {present} to have a new CA created (children must then trust the new CA)"
    )]
    Incomplete {
        /// The CA directory.
        dir: PathBuf,
        /// The file that exists.
        present: &'static str,
        /// The file that is missing.
        missing: &'static str,
    },
    /// The private key file is readable or writable by group or others.
    #[error(
        "{path}: the CA private key has mode {mode:04o}; it must not be accessible to group or \
         others (chmod 600 {path})"
    )]
    KeyPermissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A certificate or key could not be parsed.
    #[error("{what}: {why}")]
    Parse {
        /// Which file or object.
        what: String,
        /// What is wrong with it.
        why: String,
    },
    /// The certificate is not a CA certificate, or the key is not its key.
    #[error("{path}: {why}")]
    NotUsable {
        /// The certificate file.
        path: PathBuf,
        /// Why it cannot be used.
        why: String,
    },
    /// The CA certificate has expired (or is not valid yet).
    #[error(
        "{what}: the CA certificate is valid from {not_before} until {not_after} (UTC), not now; \
         replace it, or remove ca.pem and ca-key.pem to have a new CA created"
    )]
    Expired {
        /// Which CA (its file, or "the CA").
        what: String,
        /// Start of validity, RFC 3339.
        not_before: String,
        /// End of validity, RFC 3339.
        not_after: String,
    },
    /// A leaf name is not exactly one DNS name or IP address.
    #[error("cannot issue a certificate for {name:?}: {why}")]
    BadName {
        /// The name given.
        name: String,
        /// Why it is refused.
        why: &'static str,
    },
    /// Key generation or signing failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the issued key.
    #[error("rustls cannot use the issued key: {0}")]
    Rustls(#[from] rustls::Error),
}
