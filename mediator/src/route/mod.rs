//! Routing and upstream connection (design section 8), run *after* the grant decision and
//! the address vetting, never before: by the time a [`Router`] sees a target, the target
//! is allowed and its vetted addresses (the [`Pin`]) are known.
//!
//! Modes (`[upstream] mode`): `direct` connects to the pinned addresses; `parent` tries
//! the configured parents left to right; `env` uses the mediator's proxy environment read
//! at start (`env`); `pac` evaluates a PAC script per destination (`pac`) and honours
//! its `;`-separated list; `system` reads the desktop's settings ([`system`]) at start and
//! on SIGHUP and then routes as `env` or `pac` would. Parents speak HTTP (in plain text or
//! inside TLS: `https`) or SOCKS5 (`parent`), and authenticate with Basic or Negotiate
//! (Kerberos: `negotiate`). The strategy in force can be replaced (a re-read); the parents
//! are append-only, so a [`Route`] kept by an open connection always names the same one. A list falls back to its next entry only on a connection-level
//! failure (connect refused or timed out, the connection broken before the parent
//! answered); a parent that answers (407, 403, SOCKS5 REP) ends the attempt. A parent that
//! failed at the connection level is skipped for `parent_retry_secs` (tried last rather
//! than never, so that a list of only failed parents still gets a chance).
//!
//! Through a parent, a tunnel's CONNECT names the vetted IP when `pin_through_parent` is
//! on (each vetted address in turn while the parent says it cannot reach it), else the
//! canonical host. Plain HTTP through an HTTP parent is sent in absolute-form to the
//! parent (the caller does that; see `Established::forward`), which necessarily names
//! the host. The only names this module ever resolves are parents' (operator
//! configuration), through the mediator's resolver; it never hands a name to a socket API.
//!
//! By job: this file is the [`Router`] facade (built once, `connect` tries the planned
//! routes in order); `strategy.rs` the strategy in force and the one `select` of a route;
//! `connect.rs` the pinned direct connect (RFC 8305 staggering); `parents.rs` the parent
//! table and the credentials file; `via_parent.rs` one connection through a parent
//! (CONNECT, SOCKS5, Negotiate); `forward_proxy.rs` absolute-form forwarding through an
//! HTTP parent; `pac/` the PAC engine, its answers, cache and fetcher; `system/` the
//! desktop's settings; `env.rs` the proxy environment; `handshake/` (the CONNECT and
//! SOCKS5 handshakes with a parent), `https.rs`, `negotiate.rs`, `stream.rs` the wire
//! formats and streams those use.

mod connect;
pub(crate) mod env;
mod forward_proxy;
pub(crate) mod handshake;
pub(crate) mod https;
pub(crate) mod negotiate;
pub(crate) mod pac;
mod parents;
mod strategy;
pub(crate) mod stream;
pub mod system;
mod via_parent;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use policy::config::{Timeouts, Upstream, UpstreamMode};
use policy::upstream::ParentAuth;
use policy::{Pin, Target};

use crate::error::{Error, ErrorCause};
use crate::resolve::Resolver;
pub(crate) use connect::{ConnectFailure, connect_pinned};
pub(crate) use forward_proxy::ForwardProxy;
use parents::{FileAuth, Parents, read_credentials, warn_unmatched_auth};
use strategy::Strategy;
pub(crate) use stream::UpstreamStream;
use via_parent::Attempt;

/// The `route` log value of a direct connection.
pub(crate) const DIRECT: &str = "direct";

/// The route a connection took: DIRECT or one of the router's parents. `Copy`, so that a
/// connection's close record can repeat it; the router's `label` gives its log text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Route {
    /// Straight to the pinned address.
    #[default]
    Direct,
    /// Through the router's parent with this index.
    Parent(u16),
}

impl Route {
    /// The metric label value: `"direct"` or `"parent"`.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Direct => DIRECT,
            Self::Parent(_) => "parent",
        }
    }
}

/// How the connection will be used, which decides the parent variable (env mode), the
/// URL handed to a PAC, and whether an HTTP parent gets CONNECT or absolute-form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Via {
    /// A byte tunnel (HTTP CONNECT, SOCKS5, TLS termination).
    Tunnel,
    /// Absolute-form `http://` forwarding.
    Forward,
}

/// A connection made for an allowed target.
#[derive(Debug)]
pub(crate) struct Established {
    /// The stream: to the destination (directly or tunnelled through a parent, inside TLS
    /// for an HTTPS parent), or to an HTTP(S) parent that expects absolute-form requests
    /// (see `forward`).
    pub stream: UpstreamStream,
    /// The vetted address: the one connected to, or named to the parent. With
    /// `pin_through_parent = false` (and absolute-form through an HTTP parent) the parent
    /// resolves the name itself; this is then the first vetted address.
    pub pin: SocketAddr,
    /// The route taken.
    pub route: Route,
    /// `Some` when `stream` goes to an HTTP parent and requests must be sent to it in
    /// absolute-form with this `Proxy-Authorization` value (if any).
    pub forward: Option<ForwardProxy>,
}

/// Why no route could be established.
#[derive(Debug)]
pub(crate) struct RouteFailure {
    /// Human detail naming the routes tried (never credentials).
    pub detail: String,
    /// The last connection-level failure, when that is what ended the attempt.
    pub connect: Option<ConnectFailure>,
}

/// What `[upstream]` says beyond the mode, to (re)build a strategy.
struct Settings {
    upstream: Upstream,
    creds: HashMap<Target, FileAuth>,
    extra_ca_files: Vec<std::path::PathBuf>,
    connect_timeout: Duration,
    dns_timeout: Duration,
    getenv: Box<GetEnv>,
}

/// Reads one environment variable (the process environment in production).
type GetEnv = dyn Fn(&str) -> Option<String> + Send + Sync;

/// Chooses and establishes routes (design section 8). Built once at start from
/// `[upstream]`; shared by every connection. With `mode = "system"` its strategy is
/// re-read on SIGHUP ([`Router::reread`]).
pub struct Router {
    strategy: std::sync::RwLock<Arc<Strategy>>,
    parents: Parents,
    pin_through_parent: bool,
    retry: Duration,
    failed: Mutex<HashMap<u16, Instant>>,
    resolver: Arc<Resolver>,
    tls: Option<https::ParentTls>,
    negotiator: Option<negotiate::Negotiator>,
    settings: Option<Settings>,
    /// `mode = "system"`: what the last good reading said.
    system: Mutex<Option<String>>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self.parents.iter().map(|(_, p)| p.label.as_str()).collect();
        f.debug_struct("Router")
            .field("parents", &labels)
            .field("pin_through_parent", &self.pin_through_parent)
            .finish_non_exhaustive()
    }
}

impl Router {
    /// Builds the router for `upstream`: reads the parent credentials file, the proxy
    /// environment (`env` mode, through `getenv`), the desktop settings (`system` mode),
    /// and fetches and checks the PAC (`pac` mode or a desktop's PAC, then keeps
    /// refreshing it every `pac_refresh` while it is in use). `extra_ca_files` are trusted
    /// (besides the system store) for https PACs and HTTPS parents.
    ///
    /// # Errors
    /// [`Error::Upstream`]: an unreadable or malformed credentials file, an unusable proxy
    /// variable or desktop setting, or no usable PAC at start (fail closed: the mediator
    /// does not start).
    pub async fn new(
        upstream: &Upstream,
        extra_ca_files: &[std::path::PathBuf],
        resolver: Arc<Resolver>,
        timeouts: &Timeouts,
        getenv: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Result<Arc<Self>, Error> {
        let router = Arc::new(Self::assemble(
            upstream,
            extra_ca_files,
            resolver,
            timeouts,
            getenv,
        )?);
        let (strategy, refresh) = router.build().await?;
        router.install(strategy, refresh);
        Ok(router)
    }

    /// The router of `upstream` before its strategy is built: parents, credentials, TLS
    /// and Negotiate set up, connecting directly until [`Router::new`] installs what
    /// `[upstream]` says (with the default `[upstream]`, that is all it does).
    ///
    /// # Errors
    /// As [`Router::new`], for the credentials file, the parent TLS and the GSSAPI library.
    pub(crate) fn assemble(
        upstream: &Upstream,
        extra_ca_files: &[std::path::PathBuf],
        resolver: Arc<Resolver>,
        timeouts: &Timeouts,
        getenv: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Result<Self, Error> {
        let creds = match &upstream.parent_credentials_file {
            Some(path) => read_credentials(path)?,
            None => HashMap::new(),
        };
        let routed = upstream.mode != UpstreamMode::Direct;
        let negotiates = creds.values().any(|a| matches!(a, FileAuth::Negotiate))
            || upstream
                .parent_auth
                .values()
                .any(|a| *a == ParentAuth::Negotiate);
        let router = Self {
            strategy: std::sync::RwLock::new(Arc::new(Strategy::Direct)),
            parents: Parents::new(),
            pin_through_parent: upstream.pin_through_parent,
            retry: upstream.parent_retry,
            failed: Mutex::new(HashMap::new()),
            resolver,
            tls: if routed {
                Some(https::ParentTls::new(extra_ca_files)?)
            } else {
                None
            },
            negotiator: if negotiates {
                Some(
                    negotiate::Negotiator::new(&upstream.kerberos)
                        .map_err(|e| Error::upstream_by("Negotiate", ErrorCause::inner(e)))?,
                )
            } else {
                None
            },
            settings: Some(Settings {
                upstream: upstream.clone(),
                creds,
                extra_ca_files: extra_ca_files.to_vec(),
                connect_timeout: timeouts.connect,
                dns_timeout: timeouts.dns,
                getenv: Box::new(getenv),
            }),
            system: Mutex::new(None),
        };
        warn_unmatched_auth(upstream);
        Ok(router)
    }

    /// Which GSSAPI library a Negotiate parent made this router load (`None`: no parent
    /// uses Negotiate, so none was loaded), in words.
    pub fn gssapi_library(&self) -> Option<String> {
        self.negotiator
            .as_ref()
            .map(negotiate::Negotiator::describe_library)
    }

    /// `plan` in the order its routes are tried: parents that failed recently go last
    /// (never dropped: a list of only failed parents still gets tried).
    fn ordered(&self, plan: &[Route]) -> Vec<Route> {
        let now = Instant::now();
        let penalised = |r: &Route| match r {
            Route::Parent(i) => self
                .failed
                .lock()
                .ok()
                .and_then(|f| f.get(i).copied())
                .is_some_and(|until| until > now),
            Route::Direct => false,
        };
        let mut order: Vec<Route> = plan.iter().copied().filter(|r| !penalised(r)).collect();
        order.extend(plan.iter().copied().filter(|r| penalised(r)));
        order
    }

    /// The route a new connection for `target` would try first now (`None`: no route is
    /// planned, or planning failed), as [`Router::connect`] orders them.
    pub(crate) async fn first_route(&self, via: Via, target: &Target) -> Option<Route> {
        let plan = self.plan(via, target).await.ok()?;
        self.ordered(&plan).first().copied()
    }

    /// Establishes a connection for `target` (already allowed and vetted: `pin`), trying
    /// the planned routes in order. Returns the connection or why none could be made, and
    /// the time spent connecting.
    pub(crate) async fn connect(
        &self,
        via: Via,
        target: &Target,
        pin: &Pin,
        timeout: Duration,
    ) -> (Result<Established, RouteFailure>, Duration) {
        let started = Instant::now();
        let plan = match self.plan(via, target).await {
            Ok(p) => p,
            Err(detail) => {
                return (
                    Err(RouteFailure {
                        detail,
                        connect: None,
                    }),
                    started.elapsed(),
                );
            }
        };
        let order = self.ordered(&plan);
        let mut tried = Vec::new();
        let mut last: Option<ConnectFailure> = None;
        let count = order.len();
        for (n, route) in order.into_iter().enumerate() {
            let attempt = match route {
                Route::Direct => {
                    let (r, _) = connect_pinned(pin, target.port, timeout).await;
                    r.map(|(stream, addr)| Established {
                        stream: UpstreamStream::Plain(stream),
                        pin: addr,
                        route,
                        forward: None,
                    })
                    .map_err(Attempt::Connection)
                }
                Route::Parent(i) => {
                    let Some(entry) = self.parents.get(i) else {
                        continue;
                    };
                    self.via_parent(entry, route, via, target, pin, timeout)
                        .await
                }
            };
            match attempt {
                Ok(established) => {
                    if let Route::Parent(i) = route
                        && let Ok(mut f) = self.failed.lock()
                    {
                        f.remove(&i);
                    }
                    return (Ok(established), started.elapsed());
                }
                Err(Attempt::Connection(failure)) => {
                    // A warning, like any parent that cannot be reached: the operator sees
                    // a parent down (or a fallback) at the default log level.
                    let next = if n + 1 < count {
                        "; trying the next route"
                    } else {
                        "; no route left"
                    };
                    tracing::warn!(
                        "route {} to {target} failed: {failure}{next}",
                        self.label(route)
                    );
                    tried.push(format!("{}: {failure}", self.label(route)));
                    if let Route::Parent(i) = route
                        && !self.retry.is_zero()
                        && let Ok(mut f) = self.failed.lock()
                    {
                        f.insert(i, Instant::now() + self.retry);
                    }
                    last = Some(failure);
                }
                Err(Attempt::Answered(detail)) => {
                    return (
                        Err(RouteFailure {
                            detail,
                            connect: None,
                        }),
                        started.elapsed(),
                    );
                }
            }
        }
        let detail = if tried.is_empty() {
            format!("{target}: no route to try")
        } else {
            format!("{target}: {}", tried.join("; "))
        };
        (
            Err(RouteFailure {
                detail,
                connect: last,
            }),
            started.elapsed(),
        )
    }
}
