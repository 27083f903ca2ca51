//! The upstream leg of a terminated tunnel: TLS over the tunnel's own pinned (and routed)
//! stream, verified for the host name, and the HTTP connection on it in the protocol the
//! origin chose by ALPN; or an idle one of the same authority to the same place, reused
//! (`crate::reuse`), given back when the tunnel ends cleanly. Never connects anywhere but
//! the tunnel's vetted addresses over its route.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{Request, Response, Version};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use policy::Target;
use rustls::pki_types::ServerName;
use tokio::sync::Mutex;
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;

use super::upgrade;
use crate::credential::CheckedBody;
use crate::reuse::{Conn, Http, Lease, Leg, Offer, Reusable, Ticket};
use crate::route::{Route, UpstreamStream, Via};
use crate::shared::Shared;
use crate::tls::TlsState;

/// Why a tunnel has no upstream HTTP connection (the detail of each of its `502`s).
#[derive(Debug, thiserror::Error)]
pub(super) enum UpstreamError {
    #[error("{} is not a TLS server name: {error}", target.host)]
    Name {
        target: Target,
        error: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("TLS to {0} failed: {1}")]
    Tls(Target, String),
    #[error("TLS to {0} timed out")]
    Timeout(Target),
    #[error("{0} handshake with the upstream failed: {1}")]
    Handshake(&'static str, hyper::Error),
    #[error("{0}")]
    Route(String),
}

/// How long an extended CONNECT waits for an HTTP/2 origin's SETTINGS to say whether it
/// accepts extended CONNECT (they come right after its TLS handshake; this is the bound
/// for a slow one).
const SETTINGS_WAIT: std::time::Duration = std::time::Duration::from_millis(500);
/// How often the setting is read again meanwhile.
const SETTINGS_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// The upstream HTTP connection of one tunnel. HTTP/1.1 carries one request at a time, so
/// its sender is behind a lock held only until the request is handed over.
pub(super) enum Upstream {
    H1(Mutex<hyper::client::conn::http1::SendRequest<CheckedBody>>),
    /// The sender, and whether the origin's SETTINGS accept extended CONNECT so far.
    H2(
        hyper::client::conn::http2::SendRequest<CheckedBody>,
        Arc<dyn Fn() -> bool + Send + Sync>,
    ),
}

impl Upstream {
    pub(super) fn version(&self) -> Version {
        match self {
            Self::H1(_) => Version::HTTP_11,
            Self::H2(..) => Version::HTTP_2,
        }
    }

    /// What the connection can carry of a protocol switch. An HTTP/2 origin's SETTINGS
    /// (with SETTINGS_ENABLE_CONNECT_PROTOCOL) may still be on their way when the first
    /// request comes, and nothing signals their arrival: the setting is read again every
    /// [`SETTINGS_POLL`] for at most [`SETTINGS_WAIT`], while the connection is open.
    pub(super) async fn carrier(&self) -> upgrade::Carrier {
        match self {
            Self::H1(_) => upgrade::Carrier::H1,
            Self::H2(sender, extended_connect) => {
                let deadline = tokio::time::Instant::now() + SETTINGS_WAIT;
                loop {
                    let on = extended_connect();
                    if on || sender.is_closed() || tokio::time::Instant::now() >= deadline {
                        return upgrade::Carrier::H2 {
                            extended_connect: on,
                        };
                    }
                    tokio::time::sleep(SETTINGS_POLL).await;
                }
            }
        }
    }

    pub(super) async fn send(
        &self,
        req: Request<CheckedBody>,
    ) -> hyper::Result<Response<Incoming>> {
        match self {
            Self::H1(sender) => {
                let response = {
                    let mut sender = sender.lock().await;
                    sender.ready().await?;
                    sender.send_request(req)
                };
                response.await
            }
            Self::H2(sender, _) => {
                let mut sender = sender.clone();
                sender.ready().await?;
                sender.send_request(req).await
            }
        }
    }
}

/// The tunnel's upstream HTTP connection, or why it has none, with what goes back to the
/// pool with it.
pub(super) struct Opened {
    /// The connection, or why there is none (the detail of every `502`).
    pub(super) http: Result<Upstream, UpstreamError>,
    /// The rest of the pooled connection (`None` without one).
    pub(super) rest: Option<Rest>,
    /// The ticket it goes back to the pool with (`None`: it does not).
    pub(super) ticket: Option<Ticket>,
    /// Cancelled when the connection ends, unless it ended in a protocol switch.
    pub(super) gone: CancellationToken,
    /// Set while a switch is under way on the connection (HTTP/1.1), or took it over.
    pub(super) upgrading: Arc<AtomicBool>,
    /// The vetted address and the route of the connection.
    pub(super) pin: SocketAddr,
    pub(super) route: Route,
}

/// A pooled connection without its sender (which the tunnel holds as [`Upstream`]).
#[derive(Clone)]
pub(super) struct Rest {
    offer: Offer,
    local: Option<SocketAddr>,
}

impl Opened {
    /// The connection as the pool keeps it, when there is one.
    pub(super) fn into_conn(self) -> Option<(Conn, Ticket)> {
        let (Ok(http), Some(rest), Some(ticket)) = (self.http, self.rest, self.ticket) else {
            return None;
        };
        let http = match http {
            Upstream::H1(sender) => Http::H1(sender.into_inner()),
            Upstream::H2(sender, extended) => Http::H2(sender, extended),
        };
        let conn = Conn {
            http,
            offer: rest.offer,
            addr: self.pin,
            route: self.route,
            local: rest.local,
            ended: self.gone,
            upgrading: self.upgrading,
        };
        Some((conn, ticket))
    }

    fn from_conn(conn: Conn, ticket: Option<Ticket>) -> Self {
        let http = match conn.http {
            Http::H1(sender) => Upstream::H1(Mutex::new(sender)),
            Http::H2(sender, extended) => Upstream::H2(sender, extended),
        };
        Self {
            http: Ok(http),
            rest: Some(Rest {
                offer: conn.offer,
                local: conn.local,
            }),
            ticket,
            gone: conn.ended,
            upgrading: conn.upgrading,
            pin: conn.addr,
            route: conn.route,
        }
    }

    fn failed(error: UpstreamError, pin: SocketAddr, route: Route) -> Self {
        Self {
            http: Err(error),
            rest: None,
            ticket: None,
            gone: CancellationToken::new(),
            upgrading: Arc::new(AtomicBool::new(false)),
            pin,
            route,
        }
    }
}

/// The tunnel's upstream HTTP connection over `leg`, for a client that negotiated `h2`
/// (`client_h2`) or not. A reused connection must have offered the client's ALPN and
/// still be alive; otherwise it goes back to the pool (if alive) and the tunnel gets a new
/// connection to its vetted addresses over the route (`pin` and `route`: where `leg`
/// goes).
pub(super) async fn open(
    leg: Leg,
    (pin, route): (SocketAddr, Route),
    target: &Target,
    shared: &Shared,
    tls: &TlsState,
    client_h2: bool,
) -> Opened {
    let (stream, ticket, pin, route) = match leg {
        Leg::Fresh(stream, ticket) => (stream, ticket.map(|t| *t), pin, route),
        Leg::Reused(lease) => {
            let Lease { ticket, conn } = *lease;
            if conn.fits(client_h2) && conn.alive() {
                return Opened::from_conn(conn, Some(ticket));
            }
            shared.reuse.give(&ticket, conn);
            let (connected, took) = shared
                .router
                .connect(Via::Tunnel, target, ticket.pin(), shared.timeouts.connect)
                .await;
            shared.metrics.observe_connect(took);
            match connected {
                Ok(e) => (e.stream, Some(ticket.routed(e.route)), e.pin, e.route),
                Err(failure) => {
                    return Opened::failed(UpstreamError::Route(failure.detail), pin, route);
                }
            }
        }
    };
    let local = stream.local_addr().ok();
    let offer = Offer::for_client(client_h2);
    let started = match connect(tls, stream, target, shared, client_h2).await {
        Ok(stream) => start_http(stream).await,
        Err(detail) => Err(detail),
    };
    match started {
        Ok((http, gone, upgrading)) => Opened {
            http: Ok(http),
            rest: Some(Rest { offer, local }),
            ticket,
            gone,
            upgrading,
            pin,
            route,
        },
        Err(detail) => {
            tracing::info!("terminated tunnel to {target}: {detail}");
            Opened::failed(detail, pin, route)
        }
    }
}

/// TLS to the origin over `tcp` (the tunnel's stream), SNI and verification for the host;
/// HTTP/1.1 only in ALPN when the client speaks HTTP/1.1.
///
/// # Errors
/// The detail: the host is no TLS server name, the handshake failed (in words), or timed
/// out.
async fn connect(
    tls: &TlsState,
    tcp: UpstreamStream,
    target: &Target,
    shared: &Shared,
    client_h2: bool,
) -> Result<tokio_rustls::client::TlsStream<UpstreamStream>, UpstreamError> {
    let name =
        ServerName::try_from(target.host.as_text()).map_err(|error| UpstreamError::Name {
            target: target.clone(),
            error,
        })?;
    let config = if client_h2 {
        &tls.upstream
    } else {
        &tls.upstream_h1
    };
    let connector = TlsConnector::from(Arc::clone(config));
    match tokio::time::timeout(shared.timeouts.connect, connector.connect(name, tcp)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(UpstreamError::Tls(
            target.clone(),
            crate::tls::words::handshake_error(&e),
        )),
        Err(_) => Err(UpstreamError::Timeout(target.clone())),
    }
}

/// Starts the upstream HTTP connection in the protocol the upstream chose by ALPN; with
/// the token cancelled when it ends (unless it ended in an upgrade: the flag, set while
/// one is under way).
async fn start_http(
    stream: tokio_rustls::client::TlsStream<UpstreamStream>,
) -> Result<(Upstream, CancellationToken, Arc<AtomicBool>), UpstreamError> {
    let gone = CancellationToken::new();
    let upgrading = Arc::new(AtomicBool::new(false));
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(stream);
    if h2 {
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| UpstreamError::Handshake("HTTP/2", e))?;
        // The connection is shared with the question whether the origin's SETTINGS accept
        // extended CONNECT (RFC 8441 section 3), which only it can answer.
        let conn = Arc::new(std::sync::Mutex::new(Box::pin(conn)));
        let polled = Arc::clone(&conn);
        let ended = gone.clone();
        tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| {
                polled
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .as_mut()
                    .poll(cx)
            })
            .await;
            ended.cancel();
        });
        let extended_connect = move || {
            conn.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_extended_connect_protocol_enabled()
        };
        Ok((
            Upstream::H2(sender, Arc::new(extended_connect)),
            gone,
            upgrading,
        ))
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| UpstreamError::Handshake("HTTP/1.1", e))?;
        let (ended, switched) = (gone.clone(), Arc::clone(&upgrading));
        tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
            if !switched.load(Ordering::SeqCst) {
                ended.cancel();
            }
        });
        Ok((Upstream::H1(Mutex::new(sender)), gone, upgrading))
    }
}
