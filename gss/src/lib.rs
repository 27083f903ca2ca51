//! GSSAPI (RFC 2743, C bindings RFC 2744) loaded at run time: MIT krb5's
//! `libgssapi_krb5.so.2` is opened with `libloading` the first time Negotiate is needed
//! ([`Gssapi::load`]), so building needs no Kerberos headers, no `pkg-config` and no
//! libclang, and a mediator that never talks to a Negotiate parent never loads it.
//!
//! What it offers is what HTTP Negotiate (RFC 4559) needs: a host-based service name, the
//! host's credentials (the library's defaults or an MIT credential store), an initiator's
//! context with SPNEGO and mutual authentication, and, for tests, an acceptor's context.
//! Every handle is released on drop; every `unsafe` block says why it holds. The
//! library's errors come back in its own words ([`Error::Call`]).
//!
//! It must never unload the library (MIT keeps thread-specific keys whose destructors
//! live in it), nor load a configured file that others could have written.

// The two modules that call into the library: every block says why it holds.
#[allow(unsafe_code)]
mod context;
mod ffi;
#[allow(unsafe_code)]
mod library;

use std::path::PathBuf;

pub use context::{Acceptor, Credential, Initiator, Name, Usage};
pub use library::{DEFAULT_LIBRARY, Gssapi, PACKAGES};

/// What can go wrong loading or calling GSSAPI.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The dynamic loader could not open the library.
    #[error(
        "cannot load the GSSAPI library {library} (needed for Negotiate): {reason}; install it ({PACKAGES}) or set [upstream] gssapi_library"
    )]
    Load {
        /// What was opened: the soname or the configured path.
        library: String,
        /// The loader's words (`dlerror`).
        reason: String,
    },
    /// A configured library file failed the checks made before loading it.
    #[error("gssapi_library {}: refused: {reason}", path.display())]
    Refused {
        /// The configured path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A function every GSSAPI library has is missing: not a GSSAPI library.
    #[error("{library} has no {symbol} ({reason}): is it a GSSAPI library?")]
    Symbol {
        /// The library.
        library: String,
        /// The missing function.
        symbol: &'static str,
        /// The loader's words.
        reason: String,
    },
    /// Another library was loaded earlier in this process.
    #[error(
        "the GSSAPI library is already loaded from {}; {} needs a restart",
        loaded.display(),
        requested.display()
    )]
    AlreadyLoaded {
        /// The file in use.
        loaded: PathBuf,
        /// What was asked for now.
        requested: PathBuf,
    },
    /// A credential store was asked for from a library without `gss_acquire_cred_from`.
    #[error(
        "{} has no gss_acquire_cred_from (MIT krb5 1.11 or later): kerberos_ccache and kerberos_keytab cannot be used with it",
        library.display()
    )]
    NoCredentialStore {
        /// The library.
        library: PathBuf,
    },
    /// A string handed to the library holds a NUL byte.
    #[error("{0} holds a NUL byte")]
    Nul(&'static str),
    /// A call failed; `message` is the library's status text (major, then minor code).
    #[error("{message}")]
    Call {
        /// The function (`gss_init_sec_context`).
        call: &'static str,
        /// The major status (RFC 2744 section 3.9.1).
        major: u32,
        /// The mechanism's minor status.
        minor: u32,
        /// `gss_display_status` of both, joined.
        message: String,
    },
}
