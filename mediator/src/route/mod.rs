//! Routing and upstream connection (design section 8), run *after* the grant decision and
//! the address vetting, never before: by the time a [`Router`] sees a target, the target
//! is allowed and its vetted addresses (the [`Pin`]) are known.
//!
//! Modes (`[upstream] mode`): `direct` connects to the pinned addresses; `parent` tries
//! the configured parents left to right; `env` uses the mediator's proxy environment read
//! at start ([`mod@env`]); `pac` evaluates a PAC script per destination ([`pac`]) and honours
//! its `;`-separated list. A list falls back to its next entry only on a connection-level
//! failure (connect refused or timed out, the connection broken before the parent
//! answered); a parent that answers (407, 403, SOCKS5 REP) ends the attempt. A parent that
//! failed at the connection level is skipped for `parent_retry_secs` (tried last rather
//! than never, so that a list of only failed parents still gets a chance).
//!
//! Through a parent, a tunnel's CONNECT names the vetted IP when `pin_through_parent` is
//! on (each vetted address in turn while the parent says it cannot reach it), else the
//! canonical host. Plain HTTP through an HTTP parent is sent in absolute-form to the
//! parent (the caller does that; see [`Established::forward`]), which necessarily names
//! the host. The only names this module ever resolves are parents' (operator
//! configuration), through the mediator's resolver; it never hands a name to a socket API.

pub(crate) mod env;
pub(crate) mod fetch;
pub(crate) mod pac;
pub(crate) mod parent;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use policy::config::{Timeouts, Upstream, UpstreamMode};
use policy::upstream::{Credentials, PacOnError, PacSource, ParentScheme, ParentUrl};
use policy::{Pin, Target, parse_authority_form};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::error::Error;
use crate::resolve::Resolver;
use parent::{Dest, HandshakeError};

/// Delay before racing the next vetted address (RFC 8305 section 5 recommends 250 ms).
const STAGGER: Duration = Duration::from_millis(250);

/// The `route` log value of a direct connection.
pub(crate) const DIRECT: &str = "direct";

/// Most PAC answers kept in the cache; a full cache drops expired entries, then all.
const PAC_CACHE_ENTRIES: usize = 4096;

/// PAC evaluation threads.
const PAC_WORKERS: usize = 2;

/// Why an upstream connect failed.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    /// Every vetted address refused the connection (RST).
    Refused(io::Error),
    /// The deadline passed before any address answered.
    Timeout,
    /// Unreachable network or host, or another I/O error.
    Other(io::Error),
}

impl std::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(e) => write!(f, "connection refused: {e}"),
            Self::Timeout => f.write_str("connect timeout"),
            Self::Other(e) => write!(f, "connect failed: {e}"),
        }
    }
}

/// Connects to `port` at one of the pinned addresses. Returns the stream, the address it
/// reached (the pin to record) and the time it took.
///
/// # Errors
/// [`ConnectFailure`] for the last failure seen, or a timeout.
pub(crate) async fn connect_pinned(
    pin: &Pin,
    port: u16,
    timeout: Duration,
) -> (Result<(TcpStream, SocketAddr), ConnectFailure>, Duration) {
    let addrs: Vec<SocketAddr> = pin
        .addrs()
        .iter()
        .map(|ip| SocketAddr::new(*ip, port))
        .collect();
    connect_addrs(&addrs, timeout).await
}

/// Happy Eyeballs over `addrs` (in order, [`STAGGER`] apart) under one deadline.
async fn connect_addrs(
    addrs: &[SocketAddr],
    timeout: Duration,
) -> (Result<(TcpStream, SocketAddr), ConnectFailure>, Duration) {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pending = addrs.iter().copied();
    let mut set = JoinSet::new();
    let mut last_err: Option<io::Error> = None;
    let spawn = |set: &mut JoinSet<_>, addr: SocketAddr| {
        set.spawn(async move { (addr, TcpStream::connect(addr).await) });
    };
    if let Some(first) = pending.next() {
        spawn(&mut set, first);
    }
    let result = loop {
        if set.is_empty() {
            match pending.next() {
                Some(addr) => spawn(&mut set, addr),
                None => break Err(classify(last_err)),
            }
        }
        tokio::select! {
            joined = set.join_next() => match joined {
                Some(Ok((addr, Ok(stream)))) => {
                    let _ = stream.set_nodelay(true);
                    break Ok((stream, addr));
                }
                Some(Ok((_, Err(e)))) => last_err = Some(e),
                Some(Err(join)) => last_err = Some(io::Error::other(join.to_string())),
                None => {}
            },
            () = tokio::time::sleep(STAGGER), if pending.len() > 0 => {
                if let Some(addr) = pending.next() {
                    spawn(&mut set, addr);
                }
            }
            () = tokio::time::sleep_until(deadline) => break Err(ConnectFailure::Timeout),
        }
    };
    set.abort_all();
    (result, start.elapsed())
}

fn classify(err: Option<io::Error>) -> ConnectFailure {
    match err {
        Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => ConnectFailure::Refused(e),
        Some(e) => ConnectFailure::Other(e),
        None => ConnectFailure::Other(io::Error::other("no vetted address")),
    }
}

/// The route a connection took: DIRECT or one of the router's parents. `Copy`, so that a
/// connection's close record can repeat it; [`Router::label`] gives its log text.
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

/// One parent the router may use (configured, from the environment, or allowed for PAC).
#[derive(Debug, Clone)]
struct ParentEntry {
    url: ParentUrl,
    label: String,
}

/// A connection made for an allowed target.
#[derive(Debug)]
pub(crate) struct Established {
    /// The stream: to the destination (directly or tunnelled through a parent), or to an
    /// HTTP parent that expects absolute-form requests (see `forward`).
    pub stream: TcpStream,
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

/// Absolute-form forwarding through an HTTP parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ForwardProxy {
    /// `Proxy-Authorization` value for the parent (`Basic ...`), from configuration only.
    pub authorization: Option<String>,
}

/// Why no route could be established.
#[derive(Debug)]
pub(crate) struct RouteFailure {
    /// Human detail naming the routes tried (never credentials).
    pub detail: String,
    /// The last connection-level failure, when that is what ended the attempt.
    pub connect: Option<ConnectFailure>,
}

enum Strategy {
    /// `direct`.
    Direct,
    /// `parent`: these routes in order.
    Static(Vec<Route>),
    /// `env`: routes for tunnels and for forwarding, and the `NO_PROXY` list.
    Env {
        tunnel: Option<Route>,
        forward: Option<Route>,
        no_proxy: env::NoProxy,
    },
    /// `pac`.
    Pac(Box<PacRouting>),
}

/// Cached PAC answers: per (use, target), until when, and the routes.
type PacCache = HashMap<(Via, Target), (Instant, Arc<[Route]>)>;

struct PacRouting {
    pac: Arc<pac::Pac>,
    cache: Mutex<PacCache>,
    ttl: Duration,
    on_error: PacOnError,
}

/// Chooses and establishes routes (design section 8). Built once at start from
/// `[upstream]`; shared by every connection.
pub struct Router {
    strategy: Strategy,
    parents: Vec<ParentEntry>,
    pin_through_parent: bool,
    retry: Duration,
    failed: Mutex<HashMap<u16, Instant>>,
    resolver: Arc<Resolver>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self.parents.iter().map(|p| p.label.as_str()).collect();
        f.debug_struct("Router")
            .field("parents", &labels)
            .field("pin_through_parent", &self.pin_through_parent)
            .finish_non_exhaustive()
    }
}

impl Router {
    /// A router that connects directly only (unit tests and the fuzz targets; `start`
    /// builds [`Router::new`]).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn direct(resolver: Arc<Resolver>) -> Self {
        Self {
            strategy: Strategy::Direct,
            parents: Vec::new(),
            pin_through_parent: true,
            retry: Duration::ZERO,
            failed: Mutex::new(HashMap::new()),
            resolver,
        }
    }

    /// Builds the router for `upstream`: reads the parent credentials file, the proxy
    /// environment (`env` mode, through `getenv`), and fetches and checks the PAC (`pac`
    /// mode, then keeps refreshing it every `pac_refresh` while the router lives).
    /// `extra_ca_files` are trusted (besides the system store) when fetching an https PAC.
    ///
    /// # Errors
    /// [`Error::Upstream`]: an unreadable or malformed credentials file, an unusable proxy
    /// variable, or no usable PAC at start (fail closed: the mediator does not start).
    pub async fn new(
        upstream: &Upstream,
        extra_ca_files: &[std::path::PathBuf],
        resolver: Arc<Resolver>,
        timeouts: &Timeouts,
        getenv: impl Fn(&str) -> Option<String>,
    ) -> Result<Arc<Self>, Error> {
        let (connect_timeout, dns_timeout) = (timeouts.connect, timeouts.dns);
        let creds = match &upstream.parent_credentials_file {
            Some(path) => read_credentials(path)?,
            None => HashMap::new(),
        };
        let mut router = Self {
            strategy: Strategy::Direct,
            parents: Vec::new(),
            pin_through_parent: upstream.pin_through_parent,
            retry: upstream.parent_retry,
            failed: Mutex::new(HashMap::new()),
            resolver: Arc::clone(&resolver),
        };
        match upstream.mode {
            UpstreamMode::Parent => {
                let routes = upstream
                    .parents
                    .iter()
                    .map(|p| router.add_parent(p.clone(), &creds))
                    .collect();
                router.strategy = Strategy::Static(routes);
            }
            UpstreamMode::Env => {
                let found = env::EnvProxies::read(getenv)?;
                let tunnel = found
                    .https
                    .clone()
                    .or_else(|| found.all.clone())
                    .map(|p| router.add_parent(p, &creds));
                let forward = found
                    .http
                    .clone()
                    .or_else(|| found.all.clone())
                    .map(|p| router.add_parent(p, &creds));
                tracing::info!(
                    "upstream env: tunnels via {}, http via {}",
                    router.show(tunnel),
                    router.show(forward)
                );
                router.strategy = Strategy::Env {
                    tunnel,
                    forward,
                    no_proxy: found.no_proxy,
                };
            }
            UpstreamMode::Pac => {
                for allowed in &upstream.allowed_parents {
                    for scheme in [ParentScheme::Http, ParentScheme::Socks5] {
                        let url = ParentUrl {
                            scheme,
                            addr: allowed.clone(),
                            credentials: None,
                        };
                        router.add_parent(url, &creds);
                    }
                }
                let Some(source) = upstream.pac.clone() else {
                    return Err(Error::Upstream(
                        "mode = \"pac\" without a pac source".into(),
                    ));
                };
                let fetcher = fetch::Fetcher::new(
                    source.clone(),
                    upstream.pac_fetch_via.clone().map(|mut via| {
                        if via.credentials.is_none() {
                            via.credentials = creds.get(&via.addr).cloned();
                        }
                        via
                    }),
                    extra_ca_files,
                    Arc::clone(&resolver),
                    connect_timeout,
                )?;
                let script = fetcher.fetch().await.map_err(|e| {
                    Error::Upstream(format!(
                        "no usable PAC at start: {} : {e}",
                        show_source(&source)
                    ))
                })?;
                let limits = pac::Limits {
                    cpu: upstream.pac_budget,
                    memory: upstream.pac_memory,
                    dns_timeout,
                };
                let env = pac::HelperEnv {
                    resolver: Arc::clone(&resolver),
                    handle: tokio::runtime::Handle::current(),
                };
                let engine = pac::Pac::start(script, limits, env, PAC_WORKERS)
                    .await
                    .map_err(|e| {
                        Error::Upstream(format!(
                            "no usable PAC at start: {}: {e}",
                            show_source(&source)
                        ))
                    })?;
                router.strategy = Strategy::Pac(Box::new(PacRouting {
                    pac: Arc::new(engine),
                    cache: Mutex::new(HashMap::new()),
                    ttl: upstream.pac_cache,
                    on_error: upstream.pac_on_error,
                }));
                let router = Arc::new(router);
                if !upstream.pac_refresh.is_zero() {
                    tokio::spawn(refresh(
                        Arc::downgrade(&router),
                        fetcher,
                        upstream.pac_refresh,
                    ));
                }
                return Ok(router);
            }
            UpstreamMode::Direct => {}
        }
        Ok(Arc::new(router))
    }

    /// Registers a parent (credentials from the file when the URL has none); returns its
    /// route. Parents equal in scheme and address share one entry.
    fn add_parent(&mut self, mut url: ParentUrl, creds: &HashMap<Target, Credentials>) -> Route {
        if url.credentials.is_none() {
            url.credentials = creds.get(&url.addr).cloned();
        }
        if let Some(i) = self
            .parents
            .iter()
            .position(|p| p.url.scheme == url.scheme && p.url.addr == url.addr)
        {
            return Route::Parent(u16::try_from(i).unwrap_or(u16::MAX));
        }
        let label = format!("parent {url}");
        self.parents.push(ParentEntry { url, label });
        // Parents come from configuration (a handful), never from requests.
        Route::Parent(u16::try_from(self.parents.len() - 1).unwrap_or(u16::MAX))
    }

    fn show(&self, route: Option<Route>) -> &str {
        route.map_or(DIRECT, |r| self.label(r))
    }

    /// The `route` log value: `"direct"` or `"parent http://host:port"` (never credentials).
    pub(crate) fn label(&self, route: Route) -> &str {
        match route {
            Route::Direct => DIRECT,
            Route::Parent(i) => self
                .parents
                .get(usize::from(i))
                .map_or("parent ?", |p| p.label.as_str()),
        }
    }

    /// The routes to try for `target`, in order.
    ///
    /// # Errors
    /// A detail when the PAC failed and `pac_on_error = "deny"`, or when it named no
    /// usable route.
    pub async fn plan(&self, via: Via, target: &Target) -> Result<Arc<[Route]>, String> {
        match &self.strategy {
            Strategy::Direct => Ok(Arc::from([Route::Direct])),
            Strategy::Static(routes) => Ok(Arc::from(routes.as_slice())),
            Strategy::Env {
                tunnel,
                forward,
                no_proxy,
            } => {
                let chosen = if no_proxy.matches(target) {
                    None
                } else if via == Via::Tunnel {
                    *tunnel
                } else {
                    *forward
                };
                Ok(Arc::from([chosen.unwrap_or(Route::Direct)]))
            }
            Strategy::Pac(p) => self.plan_pac(p, via, target).await,
        }
    }

    async fn plan_pac(
        &self,
        p: &PacRouting,
        via: Via,
        target: &Target,
    ) -> Result<Arc<[Route]>, String> {
        let key = (via, target.clone());
        if !p.ttl.is_zero() {
            if let Ok(cache) = p.cache.lock() {
                if let Some((expires, routes)) = cache.get(&key) {
                    if *expires > Instant::now() {
                        return Ok(Arc::clone(routes));
                    }
                }
            }
        }
        let url = pac_url(via, target);
        let host = target.host.as_text();
        let routes: Result<Arc<[Route]>, String> = match p.pac.find(&url, &host).await {
            Ok(answer) => {
                tracing::debug!(url = %url, answer = %answer, "PAC answered");
                let routes = self.routes_from_answer(&answer, &url);
                if routes.is_empty() {
                    Err(format!(
                        "the PAC answered {:?} for {url}: no usable route (parents must be in allowed_parents)",
                        answer.chars().take(200).collect::<String>()
                    ))
                } else {
                    Ok(Arc::from(routes))
                }
            }
            Err(e) => {
                tracing::warn!(url = %url, "PAC evaluation failed: {e}");
                match p.on_error {
                    PacOnError::Direct => Ok(Arc::from([Route::Direct])),
                    PacOnError::Deny => Err(format!("{e} (pac_on_error = \"deny\")")),
                }
            }
        };
        if !p.ttl.is_zero() {
            if let (Ok(routes), Ok(mut cache)) = (&routes, p.cache.lock()) {
                if cache.len() >= PAC_CACHE_ENTRIES {
                    let now = Instant::now();
                    cache.retain(|_, (expires, _)| *expires > now);
                    if cache.len() >= PAC_CACHE_ENTRIES {
                        cache.clear();
                    }
                }
                cache.insert(key, (Instant::now() + p.ttl, Arc::clone(routes)));
            }
        }
        routes
    }

    /// Maps a PAC answer to routes: unknown and unsupported entries are skipped (logged),
    /// and so are parents not in `allowed_parents`.
    fn routes_from_answer(&self, answer: &str, url: &str) -> Vec<Route> {
        let mut out = Vec::new();
        for entry in parse_pac_answer(answer) {
            let route = match entry {
                PacEntry::Direct => Some(Route::Direct),
                PacEntry::Proxy(scheme, target) => {
                    let found = self
                        .parents
                        .iter()
                        .position(|p| p.url.scheme == scheme && p.url.addr == target);
                    match found {
                        Some(i) => u16::try_from(i).ok().map(Route::Parent),
                        None => {
                            tracing::warn!(
                                url = %url,
                                "PAC named parent {}://{target}, which is not in allowed_parents; skipped",
                                scheme.as_str()
                            );
                            None
                        }
                    }
                }
                PacEntry::Skipped(why) => {
                    tracing::warn!(url = %url, "PAC entry skipped: {why}");
                    None
                }
            };
            if let Some(r) = route {
                if !out.contains(&r) {
                    out.push(r);
                }
            }
        }
        out
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
        // Parents that failed recently go last (never dropped: a list of only failed
        // parents still gets tried).
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

        let mut tried = Vec::new();
        let mut last: Option<ConnectFailure> = None;
        for route in order {
            let attempt = match route {
                Route::Direct => {
                    let (r, _) = connect_pinned(pin, target.port, timeout).await;
                    r.map(|(stream, addr)| Established {
                        stream,
                        pin: addr,
                        route,
                        forward: None,
                    })
                    .map_err(Attempt::Connection)
                }
                Route::Parent(i) => {
                    let Some(entry) = self.parents.get(usize::from(i)) else {
                        continue;
                    };
                    self.via_parent(entry, route, via, target, pin, timeout)
                        .await
                }
            };
            match attempt {
                Ok(established) => {
                    if let Route::Parent(i) = route {
                        if let Ok(mut f) = self.failed.lock() {
                            f.remove(&i);
                        }
                    }
                    return (Ok(established), started.elapsed());
                }
                Err(Attempt::Connection(failure)) => {
                    tracing::info!(
                        "route {} failed: {failure}; trying the next",
                        self.label(route)
                    );
                    tried.push(format!("{}: {failure}", self.label(route)));
                    if let Route::Parent(i) = route {
                        if !self.retry.is_zero() {
                            if let Ok(mut f) = self.failed.lock() {
                                f.insert(i, Instant::now() + self.retry);
                            }
                        }
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

    async fn via_parent(
        &self,
        entry: &ParentEntry,
        route: Route,
        via: Via,
        target: &Target,
        pin: &Pin,
        timeout: Duration,
    ) -> Result<Established, Attempt> {
        let first_pin = pin
            .addrs()
            .first()
            .map(|ip| SocketAddr::new(*ip, target.port))
            .ok_or_else(|| Attempt::Answered("no vetted address".into()))?;
        let url = &entry.url;
        let shown = url.to_string();
        let creds = url.credentials.as_ref();
        if via == Via::Forward && url.scheme == ParentScheme::Http {
            let (stream, _) = self.connect_parent(url, timeout).await?;
            return Ok(Established {
                stream,
                pin: first_pin,
                route,
                forward: Some(ForwardProxy {
                    authorization: creds.map(parent::basic),
                }),
            });
        }
        // The destinations to name: every vetted address in turn (pinning), or the host.
        let dests: Vec<(Dest<'_>, SocketAddr)> = if self.pin_through_parent {
            pin.addrs()
                .iter()
                .map(|ip| (Dest::Ip(*ip), SocketAddr::new(*ip, target.port)))
                .collect()
        } else {
            vec![(Dest::Host(&target.host), first_pin)]
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut refusal = String::new();
        for (dest, addr) in dests {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let (mut stream, _) = self.connect_parent(url, remaining).await?;
            let shake = async {
                match url.scheme {
                    ParentScheme::Http => {
                        parent::http_connect(&mut stream, dest, target.port, creds, &shown).await
                    }
                    ParentScheme::Socks5 => {
                        parent::socks5_connect(&mut stream, dest, target.port, creds, &shown).await
                    }
                }
            };
            match tokio::time::timeout_at(deadline, shake).await {
                Err(_) => return Err(Attempt::Connection(ConnectFailure::Timeout)),
                Ok(Ok(())) => {
                    return Ok(Established {
                        stream,
                        pin: addr,
                        route,
                        forward: None,
                    });
                }
                Ok(Err(HandshakeError::Broken(detail))) => {
                    return Err(Attempt::Connection(ConnectFailure::Other(
                        io::Error::other(detail),
                    )));
                }
                Ok(Err(HandshakeError::Refused {
                    detail, next_addr, ..
                })) => {
                    refusal = detail;
                    if !next_addr {
                        break;
                    }
                }
            }
        }
        Err(Attempt::Answered(refusal))
    }

    /// Opens TCP to a parent: its name through the mediator's resolver (parents are
    /// operator configuration, not vetted like destinations), then Happy Eyeballs.
    async fn connect_parent(
        &self,
        url: &ParentUrl,
        timeout: Duration,
    ) -> Result<(TcpStream, SocketAddr), Attempt> {
        let (resolved, _) = self.resolver.resolve(&url.addr.host).await;
        let addrs: Vec<SocketAddr> = resolved
            .map_err(|e| {
                Attempt::Connection(ConnectFailure::Other(io::Error::other(format!(
                    "cannot resolve parent {url}: {e}"
                ))))
            })?
            .into_iter()
            .map(|ip| SocketAddr::new(ip, url.addr.port))
            .collect();
        let (r, _) = connect_addrs(&addrs, timeout).await;
        r.map_err(Attempt::Connection)
    }

    /// Drops every cached PAC answer (after a new script was installed).
    fn clear_pac_cache(&self) {
        if let Strategy::Pac(p) = &self.strategy {
            if let Ok(mut c) = p.cache.lock() {
                c.clear();
            }
        }
    }
}

/// One route attempt's failure.
enum Attempt {
    /// Connection-level: the next route may be tried.
    Connection(ConnectFailure),
    /// The parent answered (refused, demanded credentials): stop here.
    Answered(String),
}

/// The URL handed to the PAC: `https://host[:port]/` for tunnels (never a path or
/// query), `http://host[:port]/` for forwarding (the path is not handed either, so that
/// the per-host cache is exact and client-controlled text never reaches the script).
pub(crate) fn pac_url(via: Via, target: &Target) -> String {
    let (scheme, default) = match via {
        Via::Tunnel => ("https", 443),
        Via::Forward => ("http", 80),
    };
    if target.port == default {
        format!("{scheme}://{}/", target.host.to_uri_host())
    } else {
        format!("{scheme}://{}:{}/", target.host.to_uri_host(), target.port)
    }
}

/// One entry of a PAC answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PacEntry {
    /// `DIRECT`.
    Direct,
    /// `PROXY`/`HTTP` (HTTP parent) or `SOCKS`/`SOCKS5` (SOCKS5 parent) with `host:port`.
    Proxy(ParentScheme, Target),
    /// An entry this build does not use (SOCKS4, HTTPS parents, garbage), with why.
    Skipped(String),
}

/// Parses a PAC answer (`"PROXY a:1; SOCKS5 b:2; DIRECT"`): entries separated by `;`,
/// keywords case-insensitive. `SOCKS` means SOCKS5 (as in Firefox; SOCKS4 is not
/// supported); `HTTPS` (TLS to the parent) and `SOCKS4` entries are skipped.
pub(crate) fn parse_pac_answer(answer: &str) -> Vec<PacEntry> {
    answer
        .split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let mut words = entry.split_whitespace();
            let keyword = words.next().unwrap_or_default().to_ascii_uppercase();
            let arg = words.next();
            let extra = words.next().is_some();
            let scheme = match keyword.as_str() {
                "DIRECT" if arg.is_none() => return PacEntry::Direct,
                "PROXY" | "HTTP" => ParentScheme::Http,
                "SOCKS" | "SOCKS5" => ParentScheme::Socks5,
                "SOCKS4" => {
                    return PacEntry::Skipped(format!("{entry:?}: SOCKS4 is not supported"));
                }
                "HTTPS" => {
                    return PacEntry::Skipped(format!(
                        "{entry:?}: TLS to a parent (HTTPS) is not supported"
                    ));
                }
                _ => return PacEntry::Skipped(format!("{entry:?}: unknown entry")),
            };
            match (arg, extra) {
                (Some(a), false) => match parse_authority_form(a) {
                    Ok(t) => PacEntry::Proxy(scheme, t),
                    Err(e) => PacEntry::Skipped(format!("{entry:?}: {e}")),
                },
                _ => PacEntry::Skipped(format!("{entry:?}: expected one host:port")),
            }
        })
        .collect()
}

fn show_source(src: &PacSource) -> String {
    match src {
        PacSource::File(p) => p.display().to_string(),
        PacSource::Url(u) => u.clone(),
    }
}

/// Reads `parent_credentials_file`: lines `host:port user:password` (`#` comments and
/// blank lines ignored).
fn read_credentials(path: &Path) -> Result<HashMap<Target, Credentials>, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::Upstream(format!(
            "cannot read parent_credentials_file {}: {e}",
            path.display()
        ))
    })?;
    let mut out = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = format!("{}:{}", path.display(), i + 1);
        let (addr, userpass) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| Error::Upstream(format!("{at}: write \"host:port user:password\"")))?;
        let target =
            parse_authority_form(addr).map_err(|e| Error::Upstream(format!("{at}: {e}")))?;
        let (user, pass) = userpass
            .trim()
            .split_once(':')
            .ok_or_else(|| Error::Upstream(format!("{at}: write \"host:port user:password\"")))?;
        let creds = Credentials::new(user.to_owned(), pass.to_owned())
            .map_err(|e| Error::Upstream(format!("{at}: {e}")))?;
        out.insert(target, creds);
    }
    Ok(out)
}

/// Re-fetches the PAC every `every`; a good new script replaces the old one (and clears
/// the cache), a failed fetch or a bad script keeps the last good copy. Ends when the
/// router is dropped.
async fn refresh(router: std::sync::Weak<Router>, fetcher: fetch::Fetcher, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(router) = router.upgrade() else {
            return;
        };
        let Strategy::Pac(p) = &router.strategy else {
            return;
        };
        match fetcher.fetch().await {
            Ok(script) => match p.pac.install(script).await {
                Ok(true) => {
                    tracing::info!("PAC refreshed from {}", fetcher.source());
                    router.clear_pac_cache();
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    "PAC refresh from {}: new script refused ({e}); keeping the last good copy",
                    fetcher.source()
                ),
            },
            Err(e) => tracing::warn!(
                "PAC refresh from {} failed ({e}); keeping the last good copy",
                fetcher.source()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Target {
        parse_authority_form(s).unwrap()
    }

    #[test]
    fn pac_answers() {
        assert_eq!(
            parse_pac_answer(
                " PROXY Proxy.Corp:8080 ;socks 127.0.0.1:1080; DIRECT;; HTTPS s:443; SOCKS4 x:1; HTTP h:80; bogus; PROXY nope; PROXY a b"
            ),
            vec![
                PacEntry::Proxy(ParentScheme::Http, t("proxy.corp:8080")),
                PacEntry::Proxy(ParentScheme::Socks5, t("127.0.0.1:1080")),
                PacEntry::Direct,
                PacEntry::Skipped(
                    "\"HTTPS s:443\": TLS to a parent (HTTPS) is not supported".into()
                ),
                PacEntry::Skipped("\"SOCKS4 x:1\": SOCKS4 is not supported".into()),
                PacEntry::Proxy(ParentScheme::Http, t("h:80")),
                PacEntry::Skipped("\"bogus\": unknown entry".into()),
                PacEntry::Skipped(
                    "\"PROXY nope\": invalid host \"nope\": a port is required (host:port)".into()
                ),
                PacEntry::Skipped("\"PROXY a b\": expected one host:port".into()),
            ]
        );
        assert_eq!(parse_pac_answer(""), vec![]);
    }

    #[test]
    fn pac_urls_have_no_path() {
        assert_eq!(
            pac_url(Via::Tunnel, &t("example.com:443")),
            "https://example.com/"
        );
        assert_eq!(
            pac_url(Via::Tunnel, &t("[2001:db8::1]:8443")),
            "https://[2001:db8::1]:8443/"
        );
        assert_eq!(
            pac_url(Via::Forward, &t("example.com:80")),
            "http://example.com/"
        );
        assert_eq!(
            pac_url(Via::Forward, &t("example.com:8080")),
            "http://example.com:8080/"
        );
    }
}
