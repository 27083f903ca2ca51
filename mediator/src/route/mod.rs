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

pub(crate) mod env;
pub(crate) mod fetch;
pub(crate) mod https;
pub(crate) mod negotiate;
pub(crate) mod pac;
pub(crate) mod parent;
pub(crate) mod stream;
pub mod system;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use policy::config::{Timeouts, Upstream, UpstreamMode};
use policy::upstream::{Credentials, PacOnError, PacSource, ParentAuth, ParentScheme, ParentUrl};
use policy::{Pin, Target, parse_authority_form};
use tokio::net::TcpStream;

use crate::error::Error;
use crate::resolve::Resolver;
use parent::{BodyLength, Dest, HandshakeError};
pub(crate) use stream::UpstreamStream;

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

/// Happy Eyeballs over `addrs` (in order, [`STAGGER`] apart) under one deadline. The
/// attempts run inside this future (no task each): a connection that is established by
/// the time `connect(2)` returns (loopback, the same host) is taken at once, without a
/// turn of the event loop or a timer.
async fn connect_addrs(
    addrs: &[SocketAddr],
    timeout: Duration,
) -> (Result<(TcpStream, SocketAddr), ConnectFailure>, Duration) {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pending = addrs.iter().copied();
    let mut attempts = FuturesUnordered::new();
    let mut last_err: Option<io::Error> = None;
    let attempt = |addr: SocketAddr| async move { (addr, connect_one(addr).await) };
    let result = loop {
        if attempts.is_empty() {
            match pending.next() {
                Some(addr) => attempts.push(attempt(addr)),
                None => break Err(classify(last_err)),
            }
        }
        // Biased: an attempt that completes at once is taken before any timer is armed.
        tokio::select! {
            biased;
            Some((addr, r)) = attempts.next() => match r {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    break Ok((stream, addr));
                }
                Err(e) => last_err = Some(e),
            },
            () = tokio::time::sleep_until(deadline) => break Err(ConnectFailure::Timeout),
            () = tokio::time::sleep(STAGGER), if pending.len() > 0 => {
                if let Some(addr) = pending.next() {
                    attempts.push(attempt(addr));
                }
            }
        }
    };
    (result, start.elapsed())
}

/// One TCP connect to `addr`. A non-blocking `connect(2)` answers `EINPROGRESS` even when
/// the handshake is already over (loopback); a peer address then shows the connection
/// established, and it is returned without waiting. Otherwise the socket waits to become
/// writable and its pending error (`SO_ERROR`) decides, as `TcpStream::connect` does.
async fn connect_one(addr: SocketAddr) -> io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking().cloexec(),
        Some(socket2::Protocol::TCP),
    )?;
    let done = match socket.connect(&addr.into()) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => socket.peer_addr().is_ok(),
        Err(e) => return Err(e),
    };
    let stream = TcpStream::from_std(socket.into())?;
    if !done {
        stream.writable().await?;
        if let Some(e) = stream.take_error()? {
            return Err(e);
        }
    }
    Ok(stream)
}

fn classify(err: Option<io::Error>) -> ConnectFailure {
    match err {
        Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => ConnectFailure::Refused(e),
        Some(e) => ConnectFailure::Other(e),
        None => ConnectFailure::Other(io::Error::other("no vetted address")),
    }
}

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

/// One parent the router may use (configured, from the environment, or allowed for PAC).
#[derive(Debug, Clone)]
struct ParentEntry {
    url: ParentUrl,
    label: String,
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

/// Absolute-form forwarding through an HTTP(S) parent.
#[derive(Debug, Clone)]
pub(crate) struct ForwardProxy {
    /// The parent as logged (`http://proxy.corp:3128`), for messages.
    parent: String,
    auth: ForwardAuth,
}

/// How forwarded requests authenticate to the parent.
#[derive(Debug, Clone)]
enum ForwardAuth {
    /// `Proxy-Authorization: Basic ...` on every request (from configuration only), or
    /// nothing.
    Basic(Option<String>),
    /// Negotiate (RFC 4559): the token on the first request of the connection only (a
    /// Kerberos token is good once; the parent then holds the connection authenticated,
    /// section 6), and the context that checks the parent's mutual-authentication token.
    Negotiate {
        /// The service the ticket is for: `HTTP@host`.
        service: String,
        state: Arc<Mutex<NegotiateState>>,
    },
}

/// A forwarding connection's Negotiate exchange.
#[derive(Debug, Default)]
struct NegotiateState {
    /// The `Proxy-Authorization` value, until the first request takes it.
    value: Option<String>,
    /// The context, until the answer to the first request is checked.
    pending: Option<negotiate::Pending>,
    /// Requests sent on the connection.
    sent: u32,
}

impl std::fmt::Display for ForwardProxy {
    /// `parent http://proxy.corp:3128`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "parent {}", self.parent)
    }
}

impl ForwardProxy {
    /// Forwarding with `Proxy-Authorization: basic` (or none) on every request.
    #[cfg(test)]
    pub(crate) fn basic(basic: Option<String>) -> Self {
        Self {
            parent: String::new(),
            auth: ForwardAuth::Basic(basic),
        }
    }

    /// The `Proxy-Authorization` value for the next request, if any. Never logged.
    pub(crate) fn authorization(&self) -> Option<String> {
        match &self.auth {
            ForwardAuth::Basic(value) => value.clone(),
            ForwardAuth::Negotiate { state, .. } => state.lock().ok().and_then(|mut s| {
                s.sent = s.sent.saturating_add(1);
                s.value.take()
            }),
        }
    }

    /// What a `407` from the parent to a forwarded request means: the detail (naming the
    /// parent and what it offers) and the hint. `challenges` are its `Proxy-Authenticate`
    /// values.
    pub(crate) fn refusal<'a>(
        &self,
        challenges: impl Iterator<Item = &'a str>,
    ) -> (String, String) {
        let challenges: Vec<&str> = challenges.collect();
        let offered = parent::offered_in(challenges.iter().copied());
        let p = &self.parent;
        match &self.auth {
            ForwardAuth::Basic(Some(_)) => (
                format!("parent {p} refused the configured credentials: it answered 407 (it offers {offered})"),
                "check the parent's user:password (userinfo in [upstream] parents, parent_credentials_file, or the desktop's proxy settings), or set parent_auth if it wants Negotiate".into(),
            ),
            ForwardAuth::Basic(None) => (
                format!("parent {p} answered 407 Proxy Authentication Required (it offers {offered}) and no credentials are configured for it"),
                "configure the parent's credentials (userinfo or parent_credentials_file) or parent_auth = \"negotiate\"".into(),
            ),
            ForwardAuth::Negotiate { service, state } => {
                let sent = state.lock().map_or(0, |s| s.sent);
                if parent::negotiate_in(challenges.iter().copied()).is_none() {
                    (
                        format!("parent {p} answered 407 without offering Negotiate (it offers {offered}): parent_auth = \"negotiate\" does not fit this parent"),
                        "set parent_auth for this parent to the scheme it offers (Basic: remove \"negotiate\" and configure user:password)".into(),
                    )
                } else if sent <= 1 {
                    (
                        format!("parent {p} refused the Kerberos (Negotiate) credentials: it answered 407 again after the token"),
                        format!("check that the parent's keytab holds the current key of {service} (after a key change the parent's helper may need a reload) and that the parent accepts this client"),
                    )
                } else {
                    (
                        format!("parent {p} asked for Negotiate credentials again (407) on a connection it had authenticated"),
                        "the parent does not keep the connection authenticated (RFC 4559 section 6); the next request opens a new connection and authenticates again".into(),
                    )
                }
            }
        }
    }

    /// Checks the parent's answer to the first forwarded request: a Negotiate parent's
    /// mutual-authentication token (`Proxy-Authenticate: Negotiate <token>`), when it
    /// sends one, must verify, as on the tunnel path.
    ///
    /// # Errors
    /// The detail: the token is not base64 or does not verify (the parent is not the
    /// service the ticket is for).
    pub(crate) async fn verify<'a>(
        &self,
        challenges: impl Iterator<Item = &'a str>,
    ) -> Result<(), String> {
        let ForwardAuth::Negotiate { service, state } = &self.auth else {
            return Ok(());
        };
        let Some(pending) = state.lock().ok().and_then(|mut s| s.pending.take()) else {
            return Ok(());
        };
        let Some(token) = parent::negotiate_in(challenges).filter(|t| !t.is_empty()) else {
            return Ok(());
        };
        let p = &self.parent;
        let token = negotiate::decode(token)
            .ok_or_else(|| format!("parent {p}: its Negotiate answer is not base64"))?;
        pending.finish(token).await.map_err(|e| {
            format!("parent {p}: Kerberos mutual authentication failed (the parent is not the service {service}): {e}")
        })
    }

    /// The detail of a forwarded request that failed at the HTTP level (the connection
    /// broke, or the answer was not valid HTTP/1.1), naming the parent.
    pub(crate) fn broken(&self, error: &dyn std::fmt::Display) -> String {
        format!("{self}: the forwarded request failed: {error}")
    }
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
    /// `env` (and a desktop's manual setting): routes for tunnels and for forwarding, and
    /// the hosts that bypass them.
    Env {
        tunnel: Option<Route>,
        forward: Option<Route>,
        no_proxy: env::NoProxy,
    },
    /// `pac` (and a desktop's PAC setting).
    Pac(Arc<PacRouting>),
}

/// Cached PAC answers: per (use, target), until when, the script generation they were
/// computed under, and the routes.
type PacCache = HashMap<(Via, Target), (Instant, u64, Arc<[Route]>)>;

struct PacRouting {
    pac: Arc<pac::Pac>,
    /// The routes of `allowed_parents` (each scheme), the only parents this script may
    /// name: the parent table also holds parents of earlier readings, which a PAC must
    /// never reach.
    allowed: Vec<Route>,
    cache: Mutex<PacCache>,
    ttl: Duration,
    on_error: PacOnError,
}

/// Most distinct parents a router registers over its life (configuration names a
/// handful; `mode = "system"` re-reads add the ones that changed).
const MAX_PARENTS: usize = 256;

/// The parents a router may use, append-only, so that a [`Route::Parent`] index (kept by
/// open connections and their close records) always names the same parent.
struct Parents {
    slots: Box<[std::sync::OnceLock<ParentEntry>]>,
    /// Serialises registration; the slots are read without it.
    adding: Mutex<usize>,
}

impl Parents {
    fn new() -> Self {
        Self {
            slots: (0..MAX_PARENTS)
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            adding: Mutex::new(0),
        }
    }

    fn get(&self, i: u16) -> Option<&ParentEntry> {
        self.slots
            .get(usize::from(i))
            .and_then(std::sync::OnceLock::get)
    }

    fn iter(&self) -> impl Iterator<Item = (u16, &ParentEntry)> {
        self.slots
            .iter()
            .map_while(std::sync::OnceLock::get)
            .enumerate()
            .filter_map(|(i, p)| u16::try_from(i).ok().map(|i| (i, p)))
    }

    /// The route of `url`, registering it if new (equal scheme, address, credentials and
    /// auth share one entry).
    fn add(&self, url: ParentUrl) -> Result<Route, Error> {
        let mut len = self
            .adding
            .lock()
            .map_err(|_| Error::Upstream("parent table poisoned".into()))?;
        if let Some((i, _)) = self.iter().find(|(_, p)| p.url == url) {
            return Ok(Route::Parent(i));
        }
        let i = *len;
        let slot = self.slots.get(i).ok_or_else(|| {
            Error::Upstream(format!(
                "more than {MAX_PARENTS} distinct parents since start; restart the mediator"
            ))
        })?;
        let label = format!("parent {url}");
        let _ = slot.set(ParentEntry { url, label });
        *len += 1;
        Ok(Route::Parent(u16::try_from(i).unwrap_or(u16::MAX)))
    }
}

/// A parent credentials file line's auth: `user:password` (Basic) or `negotiate`.
#[derive(Debug, Clone)]
enum FileAuth {
    Basic(Credentials),
    Negotiate,
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
    /// A router that connects directly only (unit tests and the fuzz targets; `start`
    /// builds [`Router::new`]).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn direct(resolver: Arc<Resolver>) -> Self {
        Self {
            strategy: std::sync::RwLock::new(Arc::new(Strategy::Direct)),
            parents: Parents::new(),
            pin_through_parent: true,
            retry: Duration::ZERO,
            failed: Mutex::new(HashMap::new()),
            resolver,
            tls: None,
            negotiator: None,
            settings: None,
            system: Mutex::new(None),
        }
    }

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
                Some(negotiate::Negotiator::new(&upstream.kerberos).map_err(Error::Upstream)?)
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
        let router = Arc::new(router);
        let (strategy, refresh) = router.build().await?;
        router.install(strategy, refresh);
        Ok(router)
    }

    /// Which GSSAPI library a Negotiate parent made this router load (`None`: no parent
    /// uses Negotiate, so none was loaded), in words.
    pub fn gssapi_library(&self) -> Option<String> {
        self.negotiator
            .as_ref()
            .map(negotiate::Negotiator::describe_library)
    }

    /// Builds the strategy `[upstream]` says (reading the sources `env` and `system`
    /// modes name); a PAC's refresher is returned to be started once installed.
    async fn build(&self) -> Result<(Strategy, Option<fetch::Fetcher>), Error> {
        let Some(cfg) = &self.settings else {
            return Ok((Strategy::Direct, None));
        };
        let upstream = &cfg.upstream;
        match upstream.mode {
            UpstreamMode::Direct => Ok((Strategy::Direct, None)),
            UpstreamMode::Parent => {
                let routes = upstream
                    .parents
                    .iter()
                    .map(|p| self.add_parent(p.clone()))
                    .collect::<Result<_, _>>()?;
                Ok((Strategy::Static(routes), None))
            }
            UpstreamMode::Env => {
                let found = env::EnvProxies::read(&cfg.getenv)?;
                let reading = system::from_env(found, "the environment".into());
                let strategy = self.setting(reading.setting).await?.0;
                tracing::info!("upstream env: {}", self.describe_strategy(&strategy));
                Ok((strategy, None))
            }
            UpstreamMode::Pac => {
                let Some(source) = upstream.pac.clone() else {
                    return Err(Error::Upstream(
                        "mode = \"pac\" without a pac source".into(),
                    ));
                };
                self.pac(source).await
            }
            UpstreamMode::System => {
                let paths = system::Paths::of(&upstream.system)?;
                let reading = system::read(&paths, &cfg.getenv)?;
                let said = reading.to_string();
                let files = reading.files.clone();
                let (strategy, fetcher) = self.setting(reading.setting).await?;
                let text = format!("{said} -> {} ({files})", self.describe_strategy(&strategy));
                // The start prints it (`system_reading`), a re-read on its own line.
                if let Ok(mut s) = self.system.lock() {
                    *s = Some(text);
                }
                Ok((strategy, fetcher))
            }
        }
    }

    /// The strategy of a desktop or environment setting.
    async fn setting(
        &self,
        setting: system::Setting,
    ) -> Result<(Strategy, Option<fetch::Fetcher>), Error> {
        match setting {
            system::Setting::Direct => Ok((Strategy::Direct, None)),
            system::Setting::Manual {
                tunnel,
                forward,
                no_proxy,
            } => Ok((
                Strategy::Env {
                    tunnel: tunnel.map(|p| self.add_parent(*p)).transpose()?,
                    forward: forward.map(|p| self.add_parent(*p)).transpose()?,
                    no_proxy,
                },
                None,
            )),
            system::Setting::Pac(source) => Box::pin(self.pac(source)).await,
        }
    }

    /// Fetches and checks a PAC, with `allowed_parents` registered for it.
    async fn pac(&self, source: PacSource) -> Result<(Strategy, Option<fetch::Fetcher>), Error> {
        let Some(cfg) = &self.settings else {
            return Ok((Strategy::Direct, None));
        };
        let upstream = &cfg.upstream;
        let mut allowed = Vec::new();
        for parent in &upstream.allowed_parents {
            for scheme in ParentScheme::ALL {
                allowed.push(self.add_parent(ParentUrl::new(scheme, parent.clone()))?);
            }
        }
        let via = upstream
            .pac_fetch_via
            .clone()
            .map(|via| self.with_auth(via))
            .transpose()?;
        let fetcher = fetch::Fetcher::new(
            source.clone(),
            via,
            &cfg.extra_ca_files,
            Arc::clone(&self.resolver),
            cfg.connect_timeout,
            self.tls.clone(),
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
            dns_timeout: cfg.dns_timeout,
        };
        let env = pac::HelperEnv {
            resolver: Arc::clone(&self.resolver),
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
        let routing = PacRouting {
            pac: Arc::new(engine),
            allowed,
            cache: Mutex::new(HashMap::new()),
            ttl: upstream.pac_cache,
            on_error: upstream.pac_on_error,
        };
        Ok((Strategy::Pac(Arc::new(routing)), Some(fetcher)))
    }

    /// Makes `strategy` the one in force; a PAC's refresher starts with it and ends when
    /// it is replaced.
    fn install(self: &Arc<Self>, strategy: Strategy, fetcher: Option<fetch::Fetcher>) {
        let every = self
            .settings
            .as_ref()
            .map_or(Duration::ZERO, |s| s.upstream.pac_refresh);
        let strategy = Arc::new(strategy);
        if let (Strategy::Pac(routing), Some(fetcher)) = (&*strategy, fetcher)
            && !every.is_zero()
        {
            tokio::spawn(refresh(Arc::downgrade(routing), fetcher, every));
        }
        if let Ok(mut s) = self.strategy.write() {
            *s = strategy;
        }
    }

    /// `mode = "system"`: reads the desktop settings again (SIGHUP) and installs what they
    /// say; a reading that fails keeps the routing in force (and says why). Other modes:
    /// nothing (their settings change with a restart).
    pub fn reread(self: &Arc<Self>) {
        let is_system = self
            .settings
            .as_ref()
            .is_some_and(|s| s.upstream.mode == UpstreamMode::System);
        if !is_system {
            return;
        }
        let router = Arc::clone(self);
        tokio::spawn(async move {
            match router.build().await {
                Ok((strategy, fetcher)) => {
                    router.install(strategy, fetcher);
                    eprintln!(
                        "mediator: upstream system settings re-read: {}",
                        router.system_reading().unwrap_or_default()
                    );
                }
                Err(e) => eprintln!(
                    "mediator: upstream system settings re-read failed; the routing in force is kept: {e}"
                ),
            }
        });
    }

    /// `mode = "system"`: which source was used, what it said and the routing it gave.
    pub fn system_reading(&self) -> Option<String> {
        self.system.lock().ok().and_then(|s| s.clone())
    }

    /// The routing a strategy gives, in words.
    fn describe_strategy(&self, strategy: &Strategy) -> String {
        match strategy {
            Strategy::Direct => "direct".into(),
            Strategy::Static(routes) => routes
                .iter()
                .map(|r| self.label(*r))
                .collect::<Vec<_>>()
                .join(", "),
            Strategy::Env {
                tunnel,
                forward,
                no_proxy,
            } => format!(
                "tunnels via {}, http via {}, no proxy for {no_proxy}",
                self.show(*tunnel),
                self.show(*forward)
            ),
            Strategy::Pac(_) => "the PAC".into(),
        }
    }

    /// `url` with the configured auth (`parent_auth`, then the credentials file) applied
    /// where the URL itself says nothing.
    ///
    /// # Errors
    /// [`Error::Upstream`] when Negotiate (`parent_auth` or the credentials file) meets a
    /// `user:password` (the URL's userinfo, the desktop's, or the credentials file) for
    /// the same HTTP parent: one of them would be ignored, so neither is guessed.
    fn with_auth(&self, mut url: ParentUrl) -> Result<ParentUrl, Error> {
        let Some(cfg) = &self.settings else {
            return Ok(url);
        };
        let named = cfg.upstream.parent_auth.get(&url.addr).copied();
        if let Some(auth) = named {
            url.auth = auth;
        }
        match cfg.creds.get(&url.addr) {
            Some(FileAuth::Negotiate) if named.is_none() => {
                url.auth = ParentAuth::Negotiate;
            }
            Some(FileAuth::Basic(c)) if url.credentials.is_none() => {
                url.credentials = Some(c.clone());
            }
            _ => {}
        }
        if !url.scheme.is_http() {
            // Negotiate is an HTTP scheme; a SOCKS5 parent on the same address uses RFC 1929.
            url.auth = ParentAuth::Basic;
        }
        if url.auth == ParentAuth::Negotiate && url.credentials.is_some() {
            return Err(Error::Upstream(format!(
                "parent {url}: Negotiate (parent_auth or parent_credentials_file) and a user:password are both configured for it; keep one (Negotiate ignores the password)"
            )));
        }
        Ok(url)
    }

    /// Registers a parent (auth and credentials from the configuration where the URL has
    /// none); returns its route.
    fn add_parent(&self, url: ParentUrl) -> Result<Route, Error> {
        self.parents.add(self.with_auth(url)?)
    }

    fn show(&self, route: Option<Route>) -> &str {
        route.map_or(DIRECT, |r| self.label(r))
    }

    /// The `route` log value: `"direct"` or `"parent http://host:port"` (never credentials).
    pub(crate) fn label(&self, route: Route) -> &str {
        match route {
            Route::Direct => DIRECT,
            Route::Parent(i) => self.parents.get(i).map_or("parent ?", |p| p.label.as_str()),
        }
    }

    fn current(&self) -> Arc<Strategy> {
        match self.strategy.read() {
            Ok(s) => Arc::clone(&s),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// The routes to try for `target`, in order.
    ///
    /// # Errors
    /// A detail when the PAC failed and `pac_on_error = "deny"`, or when it named no
    /// usable route.
    pub async fn plan(&self, via: Via, target: &Target) -> Result<Arc<[Route]>, String> {
        let strategy = self.current();
        match &*strategy {
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
        // Read before evaluating: an answer computed while a new script is installed is
        // tagged with the old generation and never served after the change.
        let generation = p.pac.generation();
        if !p.ttl.is_zero()
            && let Ok(cache) = p.cache.lock()
            && let Some((expires, made_under, routes)) = cache.get(&key)
            && *expires > Instant::now()
            && *made_under == generation
        {
            return Ok(Arc::clone(routes));
        }
        let url = pac_url(via, target);
        let host = target.host.as_text();
        let routes: Result<Arc<[Route]>, String> = match p.pac.find(&url, &host).await {
            Ok(answer) => {
                tracing::debug!(url = %url, answer = %answer, "PAC answered");
                let routes = self.routes_from_answer(&p.allowed, &answer, &url);
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
        if !p.ttl.is_zero()
            && let (Ok(routes), Ok(mut cache)) = (&routes, p.cache.lock())
        {
            if cache.len() >= PAC_CACHE_ENTRIES {
                let now = Instant::now();
                cache.retain(|_, (expires, made_under, _)| {
                    *expires > now && *made_under == generation
                });
                if cache.len() >= PAC_CACHE_ENTRIES {
                    cache.clear();
                }
            }
            cache.insert(
                key,
                (Instant::now() + p.ttl, generation, Arc::clone(routes)),
            );
        }
        routes
    }

    /// Maps a PAC answer to routes: unknown and unsupported entries are skipped (logged),
    /// and so are parents not among `allowed` (the `allowed_parents` routes).
    fn routes_from_answer(&self, allowed: &[Route], answer: &str, url: &str) -> Vec<Route> {
        let mut out = Vec::new();
        for entry in parse_pac_answer(answer) {
            let route = match entry {
                PacEntry::Direct => Some(Route::Direct),
                PacEntry::Proxy(scheme, target) => {
                    let found = allowed.iter().copied().find(|r| match r {
                        Route::Parent(i) => self
                            .parents
                            .get(*i)
                            .is_some_and(|p| p.url.scheme == scheme && p.url.addr == target),
                        Route::Direct => false,
                    });
                    match found {
                        Some(route) => Some(route),
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
            if let Some(r) = route
                && !out.contains(&r)
            {
                out.push(r);
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
        let deadline = tokio::time::Instant::now() + timeout;
        if via == Via::Forward && url.scheme.is_http() {
            let stream = self.connect_parent(url, timeout).await?;
            let auth = match url.auth {
                ParentAuth::Basic => ForwardAuth::Basic(creds.map(parent::basic)),
                ParentAuth::Negotiate => {
                    let (value, pending) = self.negotiate_start(url).await?;
                    ForwardAuth::Negotiate {
                        service: format!("HTTP@{}", url.addr.host.as_text()),
                        state: Arc::new(Mutex::new(NegotiateState {
                            value: Some(value),
                            pending: Some(pending),
                            sent: 0,
                        })),
                    }
                }
            };
            let forward = ForwardProxy {
                parent: shown,
                auth,
            };
            return Ok(Established {
                stream,
                pin: first_pin,
                route,
                forward: Some(forward),
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
        let mut refusal = String::new();
        for (dest, addr) in dests {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let mut stream = self.connect_parent(url, remaining).await?;
            let shake = async {
                match (url.scheme, url.auth) {
                    (ParentScheme::Socks5, _) => {
                        parent::socks5_connect(&mut stream, dest, target.port, creds, &shown).await
                    }
                    (_, ParentAuth::Basic) => {
                        parent::http_connect(&mut stream, dest, target.port, creds, &shown).await
                    }
                    (_, ParentAuth::Negotiate) => {
                        self.negotiate_connect(&mut stream, url, dest, target.port, deadline)
                            .await
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

    /// The first Negotiate token for `url`'s host.
    async fn negotiate_start(
        &self,
        url: &ParentUrl,
    ) -> Result<(String, negotiate::Pending), Attempt> {
        let Some(n) = &self.negotiator else {
            return Err(Attempt::Answered(format!(
                "parent {url}: parent_auth = \"negotiate\" but no Kerberos client is set up"
            )));
        };
        n.start(&url.addr.host).await.map_err(|e| {
            Attempt::Answered(format!("parent {url} demands Negotiate (Kerberos): {e}"))
        })
    }

    /// CONNECT through a parent that takes Negotiate (RFC 4559): the request without
    /// credentials; on `407` offering Negotiate, the token (on the same connection when
    /// the refusal's body can be skipped, else on a new one); then the parent's answer,
    /// whose mutual-authentication token, if any, must verify.
    async fn negotiate_connect(
        &self,
        stream: &mut UpstreamStream,
        url: &ParentUrl,
        dest: Dest<'_>,
        port: u16,
        deadline: tokio::time::Instant,
    ) -> Result<(), HandshakeError> {
        let shown = url.to_string();
        let authority = dest.authority(port);
        let answer = parent::send_connect(stream, dest, port, None, &shown).await?;
        if (200..300).contains(&answer.status) {
            return Ok(());
        }
        if answer.status != 407 {
            return Err(answer.refusal(&authority, false, &shown));
        }
        if answer.negotiate().is_none() {
            return Err(HandshakeError::Refused {
                detail: format!(
                    "parent {shown} answered 407 without offering Negotiate (it offers {}): parent_auth = \"negotiate\" does not fit this parent",
                    answer.offered()
                ),
                next_addr: false,
            });
        }
        match answer.body() {
            BodyLength::Known(n) => parent::discard(stream, n)
                .await
                .map_err(|e| HandshakeError::Broken(format!("{shown}: {e}")))?,
            BodyLength::Unusable => {
                let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                *stream = self
                    .connect_parent(url, remaining)
                    .await
                    .map_err(|a| HandshakeError::Broken(a.to_string()))?;
            }
        }
        let (value, pending) =
            self.negotiate_start(url)
                .await
                .map_err(|a| HandshakeError::Refused {
                    detail: a.to_string(),
                    next_addr: false,
                })?;
        let answer = parent::send_connect(stream, dest, port, Some(&value), &shown).await?;
        drop(value);
        if answer.status == 407 {
            return Err(HandshakeError::Refused {
                detail: format!(
                    "parent {shown} refused the Kerberos (Negotiate) credentials: it answered 407 again after the token; check that the ticket is for HTTP@{} and that the parent accepts this client",
                    url.addr.host.as_text()
                ),
                next_addr: false,
            });
        }
        if !(200..300).contains(&answer.status) {
            return Err(answer.refusal(&authority, false, &shown));
        }
        if let Some(token) = answer.negotiate().filter(|t| !t.is_empty()) {
            let token = negotiate::decode(token).ok_or_else(|| HandshakeError::Refused {
                detail: format!("parent {shown}: its Negotiate answer is not base64"),
                next_addr: false,
            })?;
            pending.finish(token).await.map_err(|e| HandshakeError::Refused {
                detail: format!(
                    "parent {shown}: Kerberos mutual authentication failed (the parent is not the service HTTP@{}): {e}",
                    url.addr.host.as_text()
                ),
                next_addr: false,
            })?;
        }
        Ok(())
    }

    /// Opens a stream to a parent: its name through the mediator's resolver (parents are
    /// operator configuration, not vetted like destinations), then Happy Eyeballs, then
    /// TLS for an HTTPS parent. A TLS failure (a certificate that does not verify) is a
    /// connection-level failure of that parent: the next route is tried.
    async fn connect_parent(
        &self,
        url: &ParentUrl,
        timeout: Duration,
    ) -> Result<UpstreamStream, Attempt> {
        let deadline = tokio::time::Instant::now() + timeout;
        let (resolved, _) = self.resolver.resolve(&url.addr.host).await;
        let addrs: Vec<SocketAddr> = resolved
            .map_err(|e| {
                Attempt::Connection(ConnectFailure::Other(io::Error::other(format!(
                    "cannot resolve its name: {e}"
                ))))
            })?
            .into_iter()
            .map(|ip| SocketAddr::new(ip, url.addr.port))
            .collect();
        let (r, _) = connect_addrs(&addrs, timeout).await;
        let (tcp, _) = r.map_err(Attempt::Connection)?;
        if url.scheme != ParentScheme::Https {
            return Ok(UpstreamStream::Plain(tcp));
        }
        let Some(tls) = &self.tls else {
            return Err(Attempt::Answered(format!("parent {url}: no TLS client")));
        };
        match tokio::time::timeout_at(deadline, tls.connect(url, tcp)).await {
            Err(_) => Err(Attempt::Connection(ConnectFailure::Timeout)),
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(why)) => Err(Attempt::Connection(ConnectFailure::Other(
                io::Error::other(why),
            ))),
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

impl std::fmt::Display for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connection(c) => c.fmt(f),
            Self::Answered(d) => f.write_str(d),
        }
    }
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
    /// `PROXY`/`HTTP` (HTTP parent), `HTTPS` (TLS to the parent) or `SOCKS`/`SOCKS5`
    /// (SOCKS5 parent) with `host:port`.
    Proxy(ParentScheme, Target),
    /// An entry this build does not use (SOCKS4, garbage), with why.
    Skipped(String),
}

/// Parses a PAC answer (`"PROXY a:1; SOCKS5 b:2; DIRECT"`): entries separated by `;`,
/// keywords case-insensitive. `SOCKS` means SOCKS5 (as in Firefox; SOCKS4 is not
/// supported, its entries are skipped); `HTTPS` is an HTTP parent spoken to over TLS.
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
                "HTTPS" => ParentScheme::Https,
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

/// Warns about `parent_auth` keys that name no parent where the parents are known from
/// the configuration (`parent` mode: `parents`; `pac` mode: `allowed_parents` and
/// `pac_fetch_via`): most likely a typo of the host or port. In `env` and `system` modes
/// the parents come from outside and may change, so every key may apply.
fn warn_unmatched_auth(upstream: &Upstream) {
    let known: Vec<&Target> = match upstream.mode {
        UpstreamMode::Parent => upstream.parents.iter().map(|p| &p.addr).collect(),
        UpstreamMode::Pac => upstream
            .allowed_parents
            .iter()
            .chain(upstream.pac_fetch_via.iter().map(|p| &p.addr))
            .collect(),
        UpstreamMode::Direct | UpstreamMode::Env | UpstreamMode::System => return,
    };
    for addr in upstream.parent_auth.keys() {
        if !known.contains(&addr) {
            tracing::warn!(
                "[upstream] parent_auth names {addr}, which is no parent of mode = \"{}\" (check the host and port)",
                upstream.mode
            );
        }
    }
}

/// Reads `parent_credentials_file`: lines `host:port user:password` or `host:port
/// negotiate` (`#` comments and blank lines ignored).
fn read_credentials(path: &Path) -> Result<HashMap<Target, FileAuth>, Error> {
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
        if userpass.trim() == "negotiate" {
            out.insert(target, FileAuth::Negotiate);
            continue;
        }
        let (user, pass) = userpass.trim().split_once(':').ok_or_else(|| {
            Error::Upstream(format!(
                "{at}: write \"host:port user:password\" or \"host:port negotiate\""
            ))
        })?;
        let creds = Credentials::new(user.to_owned(), pass.to_owned())
            .map_err(|e| Error::Upstream(format!("{at}: {e}")))?;
        out.insert(target, FileAuth::Basic(creds));
    }
    Ok(out)
}

/// Re-fetches the PAC every `every`; a good new script replaces the old one (answers
/// cached under the old one are no longer served), a failed fetch or a bad script keeps
/// the last good copy. Ends when the PAC is no longer in use (the router dropped, or a
/// re-read installed another routing).
async fn refresh(routing: std::sync::Weak<PacRouting>, fetcher: fetch::Fetcher, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(p) = routing.upgrade() else {
            return;
        };
        match fetcher.fetch().await {
            Ok(script) => match p.pac.install(script).await {
                Ok(true) => {
                    // Cached answers of the old script are ignored from now on (they
                    // carry its generation) and dropped when the cache fills.
                    tracing::info!("PAC refreshed from {}", fetcher.source());
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
                PacEntry::Proxy(ParentScheme::Https, t("s:443")),
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
    fn parents_are_append_only_and_bounded() {
        let parents = Parents::new();
        let url = |s: &str| {
            policy::upstream::parse_parent_url(s, policy::upstream::ParentSyntax::Config).unwrap()
        };
        let a = parents.add(url("http://a.corp:1")).unwrap();
        let b = parents.add(url("https://a.corp:1")).unwrap();
        assert_ne!(a, b, "another scheme is another parent");
        assert_eq!(parents.add(url("http://a.corp:1")).unwrap(), a);
        let Route::Parent(i) = b else { panic!() };
        assert_eq!(parents.get(i).unwrap().label, "parent https://a.corp:1");
        for n in 2..MAX_PARENTS {
            parents.add(url(&format!("http://p{n}.corp:1"))).unwrap();
        }
        let e = parents.add(url("http://one-too-many.corp:1")).unwrap_err();
        assert!(e.to_string().contains("restart the mediator"), "{e}");
        assert_eq!(parents.get(i).unwrap().label, "parent https://a.corp:1");
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
