//! The mediator crate's one error type.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use crate::control::registry::error::RegistryError;

/// Everything that can stop the mediator from starting or serving.
#[derive(Debug, Error)]
pub enum Error {
    /// The configuration file could not be read.
    #[error("cannot read config {path}")]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The configuration is invalid (every problem is listed).
    #[error(transparent)]
    Config(#[from] policy::PolicyError),
    /// A listener could not be set up.
    #[error("cannot listen on {what}")]
    Listen {
        /// Which listener (`"tcp 127.0.0.1:3128"`, `"unix /run/x/a.sock"`).
        what: String,
        /// The I/O error.
        source: io::Error,
    },
    /// The resolver could not be configured (the system's resolver configuration does not
    /// read, or hickory-resolver refuses the options).
    #[error("cannot configure the resolver")]
    Resolver(#[source] hickory_resolver::net::NetError),
    /// The decision log could not be opened.
    #[error("cannot open decision log {path}")]
    DecisionLog {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Routing cannot be set up (`[upstream]`): no usable PAC at start, an unusable proxy
    /// environment variable, an unreadable parent credentials file.
    #[error("upstream: {what}")]
    Upstream {
        /// What could not be used, naming the setting or file.
        what: String,
        /// The library's or parser's error, when one is behind it.
        #[source]
        cause: Option<Box<ErrorCause>>,
    },
    /// Any other I/O error.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The metrics could not be registered.
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// TLS termination cannot be set up: the CA in `[tls] ca_dir` cannot be created or
    /// loaded, or an `[tls] extra_ca_files` entry is unusable (the message names the file).
    #[error("tls: {what}")]
    Tls {
        /// What could not be used, naming the setting or file.
        what: String,
        /// The library's error, when one is behind it.
        #[source]
        cause: Option<Box<ErrorCause>>,
    },
    /// A request body was not passed on upstream because the client's body failed.
    #[error("the client's request body failed")]
    ClientBody(#[source] hyper::Error),
    /// A request body was cut before its trailer fields, which carried a placeholder of one
    /// of the authority's credentials (design section 14).
    #[error("a trailer field carries a credential placeholder; the request was cut before it")]
    PlaceholderInTrailer,
    /// A control-plane operation (adding an authority at start) failed.
    #[error("{what}")]
    Control {
        /// What failed, naming the authority.
        what: String,
        /// The error behind it (a socket that could not be made), when there is one.
        #[source]
        cause: Option<Box<ErrorCause>>,
    },
    /// `mediator diff` or `mediator test` cannot run (design section 21): an unreachable
    /// or refusing admin API, an expectations file that does not read, wrong arguments.
    #[error("{what}")]
    Review {
        /// What stopped it, naming the file, the argument or the admin URL.
        what: String,
        /// The error behind it, when there is one.
        #[source]
        cause: Option<Box<ErrorCause>>,
    },
    /// The authority registry (`[registry]`, design section 17) cannot be opened: the
    /// state directory cannot be made, read or locked, or etcd is asked of a build
    /// without it.
    #[error("registry")]
    Registry(#[from] RegistryError),
    /// The registry opened but cannot count this run (its boot counter), which numbers
    /// the run's generations and decision ids.
    #[error("registry: cannot number this run's generations and decision ids")]
    RegistryBoot(#[source] RegistryError),
}

/// The error behind an [`enum@Error`] that our own words explain: kept as the source, so
/// that `{:#}` and `chain` print the whole story and callers can look at its type.
#[derive(Debug, Error)]
pub enum ErrorCause {
    /// A file or socket operation failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// rustls refused a certificate or a configuration.
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
    /// A PEM file did not parse.
    #[error(transparent)]
    Pem(#[from] rustls::pki_types::pem::Error),
    /// A system call (a user lookup, an access check) failed.
    #[error(transparent)]
    Errno(#[from] nix::errno::Errno),
    /// The CA could not be created or loaded (the `certs` crate).
    #[error(transparent)]
    Ca(#[from] certs::Error),
    /// A host or target did not parse (the `policy` crate).
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    /// A parent proxy URL or its credentials are unusable (the `policy` crate).
    #[error(transparent)]
    Parent(#[from] policy::UpstreamError),
    /// An INI file (KDE's kioslaverc) did not parse.
    #[error(transparent)]
    Ini(#[from] ini::ParseError),
    /// Another error of this crate (a PAC fetch, the Kerberos setup, the admin API).
    #[error(transparent)]
    Inner(Box<dyn std::error::Error + Send + Sync>),
    /// A mediator error nested under what it stopped (an authority's socket).
    #[error(transparent)]
    Mediator(Box<Error>),
    /// A sentence of our own where there is no error value (a file that holds no
    /// certificate, a desktop setting of the wrong type).
    #[error("{0}")]
    Said(String),
}

impl Error {
    /// [`Error::Upstream`] with no error behind it.
    pub(crate) fn upstream(what: impl Into<String>) -> Self {
        Self::Upstream {
            what: what.into(),
            cause: None,
        }
    }

    /// [`Error::Upstream`] caused by `cause`.
    pub(crate) fn upstream_by(what: impl Into<String>, cause: impl Into<ErrorCause>) -> Self {
        Self::Upstream {
            what: what.into(),
            cause: Some(Box::new(cause.into())),
        }
    }

    /// [`Error::Tls`] with no error behind it.
    pub(crate) fn tls(what: impl Into<String>) -> Self {
        Self::Tls {
            what: what.into(),
            cause: None,
        }
    }

    /// [`Error::Tls`] caused by `cause`.
    pub(crate) fn tls_by(what: impl Into<String>, cause: impl Into<ErrorCause>) -> Self {
        Self::Tls {
            what: what.into(),
            cause: Some(Box::new(cause.into())),
        }
    }

    /// [`Error::Control`] with no error behind it.
    pub(crate) fn control(what: impl Into<String>) -> Self {
        Self::Control {
            what: what.into(),
            cause: None,
        }
    }

    /// [`Error::Control`] caused by `cause`.
    pub(crate) fn control_by(what: impl Into<String>, cause: impl Into<ErrorCause>) -> Self {
        Self::Control {
            what: what.into(),
            cause: Some(Box::new(cause.into())),
        }
    }

    /// [`Error::Review`] with no error behind it.
    pub(crate) fn review(what: impl Into<String>) -> Self {
        Self::Review {
            what: what.into(),
            cause: None,
        }
    }

    /// [`Error::Review`] caused by `cause`.
    pub(crate) fn review_by(what: impl Into<String>, cause: impl Into<ErrorCause>) -> Self {
        Self::Review {
            what: what.into(),
            cause: Some(Box::new(cause.into())),
        }
    }
}

impl From<String> for ErrorCause {
    fn from(said: String) -> Self {
        Self::Said(said)
    }
}

impl From<&str> for ErrorCause {
    fn from(said: &str) -> Self {
        Self::Said(said.to_owned())
    }
}

impl ErrorCause {
    /// Another error of this crate, kept with its own sources.
    pub(crate) fn inner(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Inner(Box::new(e))
    }
}

/// An error and its sources, joined with `: ` (the top line alone, "cannot listen on unix
/// ...", hides the cause: a chown the kernel refused, a full directory).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
