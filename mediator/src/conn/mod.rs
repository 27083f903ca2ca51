//! The life of one client connection, in order (design section 3). Read the files top to
//! bottom:
//!
//! 1. [`accept`]: one accept loop for every listener (TCP and Unix, channels and the admin
//!    API); a channel connection is identified by where it arrived (a Unix socket is its
//!    authority, with `SO_PEERCRED`; the TCP listener's authority comes later, from a
//!    credential) and handed to a front-end (`crate::front`: the first byte `0x05` means
//!    SOCKS5, anything else HTTP), which parses the request and canonicalises its target.
//! 2. [`identify`]: a credential on the shared TCP listener names its authority (SHA-256,
//!    compared in constant time).
//! 3. [`establish`]: the grant decides (a grant miss of an authority with `ask` is held
//!    for the host's answer first: [`held`]), the name is resolved once, every address vetted,
//!    the watchdog asked (it can only narrow), the route chosen, the pinned address
//!    connected to, and one decision line written. `mediator explain` runs the same
//!    decision steps.
//! 4. [`tunnel`]: after the front-end's success reply, the SNI gate, then the relay (or TLS
//!    termination). Beside every allowed connection, [`standing`] watches its authority:
//!    a revocation cuts it after the grace, a reload judges it again under the new grant.
//! 5. [`close`]: the connection's close record, written by its owner exactly once, on
//!    every path ([`close::Opened`] writes one when dropped unfinished).
//!
//! [`record`] builds every decision-log line, counts it and keeps denials for the admin
//! API: the one place a [`crate::decision_log::Record`] is made.

pub(crate) mod accept;
pub(crate) mod close;
pub(crate) mod establish;
pub(crate) mod held;
pub(crate) mod identify;
pub(crate) mod record;
pub(crate) mod standing;
pub(crate) mod tunnel;
pub(crate) mod tunnel_line;

use std::sync::Arc;

use policy::Target;
use policy::config::Authority;

use crate::decision_log::{Asked, Peer};
use crate::labels::Labels;
use crate::limits::Admission;

/// Who is on the other end of one client connection.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    /// Connection id (the `conn` log field).
    pub(crate) conn: u64,
    /// Peer credentials or address.
    pub(crate) peer: Peer,
    /// The authority bound by the channel (`Some` on a Unix socket; `None` on the shared
    /// TCP listener until a credential names one).
    pub(crate) authority: Option<Arc<Authority>>,
    /// The request being decided, for plain `http://` requests to a host whose TLS is
    /// terminated (the lines then carry `method` and `path`, as the `tls` lines of its
    /// tunnels do). `None` elsewhere.
    pub(crate) request: Option<RequestLine>,
    /// The connection's place in the limits (design section 13), shared by every clone of
    /// the context: it is given back when the last one is dropped.
    pub(crate) admission: Arc<Admission>,
    /// The shim captured this connection transparently (design section 15): the `capture`
    /// log field. Informational only: no decision depends on it.
    pub(crate) capture: bool,
    /// The host's labels of the connection (design section 20: invocation and tags),
    /// carried on every record of it. Informational only: no decision depends on them.
    pub(crate) labels: Option<Arc<Labels>>,
    /// Set when the request was held for the host's answer and an `allow_via` moved it
    /// here (design section 20): the records' `asked`.
    pub(crate) asked: Option<Arc<Asked>>,
}

impl Ctx {
    /// A connection's context before anything was read from it.
    pub(crate) fn new(
        conn: u64,
        peer: Peer,
        authority: Option<Arc<Authority>>,
        admission: Arc<Admission>,
    ) -> Self {
        Self {
            conn,
            peer,
            authority,
            request: None,
            admission,
            capture: false,
            labels: None,
            asked: None,
        }
    }

    /// The same connection, labelled by the host (no labels: unchanged).
    pub(crate) fn labelled(self, labels: Labels) -> Self {
        if labels.is_empty() {
            return self;
        }
        Self {
            labels: Some(Arc::new(labels)),
            ..self
        }
    }

    /// The same request, held for the host's answer (design section 20): its records say
    /// `asked`.
    pub(crate) fn with_asked(&self, asked: Asked) -> Self {
        Self {
            asked: Some(Arc::new(asked)),
            ..self.clone()
        }
    }

    /// The same connection, marked as captured by the shim (the `capture` log field).
    pub(crate) fn captured(self) -> Self {
        Self {
            capture: true,
            ..self
        }
    }

    /// The same connection, attributed to `authority`.
    pub(crate) fn attributed(&self, authority: &Arc<Authority>) -> Self {
        Self {
            authority: Some(Arc::clone(authority)),
            ..self.clone()
        }
    }

    /// The name of the authority the connection is attributed to, if any.
    pub(crate) fn authority_name(&self) -> Option<&str> {
        self.authority.as_ref().map(|a| a.grant.name())
    }
}

/// The method and logged path (query redacted) of one HTTP request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestLine {
    /// The method (`GET`).
    pub(crate) method: String,
    /// The path, escaped, its query replaced by `?<redacted>`.
    pub(crate) path: String,
}

/// A log line's target: canonical, or raw (escaped) when it could not be canonicalised.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TargetLabel {
    /// Host text.
    pub(crate) host: Option<String>,
    /// Port.
    pub(crate) port: Option<u16>,
}

impl From<&Target> for TargetLabel {
    fn from(t: &Target) -> Self {
        Self {
            host: Some(t.host.as_text()),
            port: Some(t.port),
        }
    }
}
