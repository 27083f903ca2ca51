//! One upstream HTTP connection of a terminated tunnel, as the pool keeps it: the sender
//! of its HTTP/1.1 or HTTP/2 connection (whose task drives the socket), what ALPN it
//! offered, where it goes, and the signals of its end and of a protocol switch on it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hyper::client::conn::{http1, http2};
use tokio_util::sync::CancellationToken;

use super::Reusable;
use crate::credential::CheckedBody;
use crate::route::Route;

/// What ALPN (RFC 7301) the connection offered the origin: a client that speaks HTTP/1.1
/// gets an HTTP/1.1-only upstream, so that an upgrade of its connection upgrades the
/// upstream one with it; an HTTP/2 client's offers `h2` and `http/1.1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Offer {
    /// `http/1.1` only.
    Http1,
    /// `h2`, then `http/1.1`.
    H2,
}

impl Offer {
    /// The offer for a client that negotiated `h2` (`true`) or not.
    pub(crate) fn for_client(client_h2: bool) -> Self {
        if client_h2 { Self::H2 } else { Self::Http1 }
    }
}

/// The HTTP side of the connection.
pub(crate) enum Http {
    /// HTTP/1.1: one request at a time.
    H1(http1::SendRequest<CheckedBody>),
    /// HTTP/2, and whether the origin's SETTINGS accept extended CONNECT so far.
    H2(
        http2::SendRequest<CheckedBody>,
        Arc<dyn Fn() -> bool + Send + Sync>,
    ),
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::H1(_) => "H1",
            Self::H2(..) => "H2",
        })
    }
}

/// An upstream HTTP connection over TLS, with what the pool needs to know of it.
#[derive(Debug)]
pub(crate) struct Conn {
    /// The sender.
    pub(crate) http: Http,
    /// What it offered in ALPN.
    pub(crate) offer: Offer,
    /// The vetted address it goes to (or that was named to the parent).
    pub(crate) addr: SocketAddr,
    /// The route it took.
    pub(crate) route: Route,
    /// The local address of its TCP connection.
    pub(crate) local: Option<SocketAddr>,
    /// Cancelled when the connection ends, unless it ended in a protocol switch.
    pub(crate) ended: CancellationToken,
    /// Set while a switch is under way on it (HTTP/1.1), or after one took it over.
    pub(crate) upgrading: Arc<AtomicBool>,
}

impl Conn {
    /// Whether a tunnel whose client negotiated `h2` (`true`) or not can use it: an
    /// HTTP/1.1 client needs the HTTP/1.1-only offer (its upgrades go through as asked).
    pub(crate) fn fits(&self, client_h2: bool) -> bool {
        self.offer == Offer::for_client(client_h2)
    }
}

impl Reusable for Conn {
    fn alive(&self) -> bool {
        if self.ended.is_cancelled() || self.upgrading.load(Ordering::SeqCst) {
            return false;
        }
        match &self.http {
            Http::H1(sender) => !sender.is_closed() && sender.is_ready(),
            Http::H2(sender, _) => !sender.is_closed() && sender.is_ready(),
        }
    }

    fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }
}
