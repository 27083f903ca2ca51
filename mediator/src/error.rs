//! The mediator crate's one error type.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

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
    /// The resolver could not be configured.
    #[error("cannot configure the resolver: {0}")]
    Resolver(String),
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
    #[error("upstream: {0}")]
    Upstream(String),
    /// Any other I/O error.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The metrics could not be registered.
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// TLS termination cannot be set up: the CA in `[tls] ca_dir` cannot be created or
    /// loaded, or an `[tls] extra_ca_files` entry is unusable (the message names the file).
    #[error("tls: {0}")]
    Tls(String),
    /// A request body was not passed on upstream because the client's body failed.
    #[error("the client's request body failed")]
    ClientBody(#[source] hyper::Error),
    /// A request body was cut before its trailer fields, which carried a placeholder of one
    /// of the authority's credentials (design section 14).
    #[error("a trailer field carries a credential placeholder; the request was cut before it")]
    PlaceholderInTrailer,
    /// A control-plane operation (adding an authority at start) failed.
    #[error("{0}")]
    Control(String),
    /// `mediator diff` or `mediator test` cannot run (design section 21): an unreachable
    /// or refusing admin API, an expectations file that does not read, wrong arguments.
    #[error("{0}")]
    Review(String),
    /// The authority registry (`[registry]`, design section 17) cannot be opened: the
    /// state directory cannot be made, read or locked, or etcd is asked of a build
    /// without it.
    #[error("registry: {0}")]
    Registry(String),
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
