//! The registry's error: a leaf, so that the crate's error can carry it as a source.

use std::path::{Path, PathBuf};

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A record of that name exists (create-if-absent refused).
    #[error("authority {0:?} is already stored")]
    Exists(String),
    /// The backend cannot be reached or did not confirm in time.
    #[error("the registry is unavailable: {0}")]
    Unavailable(String),
    /// The state directory or one of its files cannot be used.
    // `error` is in the message, so it is not also given as the source (`{:#}` would say
    // it twice).
    #[error("registry {path}: {error}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The state directory is in use by another mediator.
    #[error(
        "registry {path} is in use by another mediator (its lock is held); give each mediator its own [registry] state_dir"
    )]
    Locked {
        /// The state directory.
        path: PathBuf,
    },
    /// This replica's node name cannot be found (`[registry] node`, `$MEDIATOR_NODE`, the
    /// host name).
    #[error("[registry] node: {0}")]
    Node(String),
    /// A record cannot be encoded (cannot happen for a validated table).
    #[error("cannot encode the record: {0}")]
    Encode(String),
    /// This build has no such backend.
    #[cfg(not(feature = "etcd"))]
    #[error(
        "[registry] backend = \"etcd\" needs a mediator built with the cargo feature \"etcd\" (cargo build --release --features etcd; the release image has it)"
    )]
    NotBuilt,
}

impl RegistryError {
    /// An I/O error on `path`.
    pub(crate) fn io(path: &Path, error: std::io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            error,
        }
    }
}
