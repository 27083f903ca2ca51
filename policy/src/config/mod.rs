//! The configuration schema (design section 11): `mediator.toml` parsed with serde
//! (`deny_unknown_fields`) into raw structs, then validated into [`Config`], whose grants
//! are frozen [`Grant`](crate::Grant)s. Validation reports *every* problem, each with its
//! location (`FILE:LINE:COL` where the TOML parser knows it, else a key path such as
//! `authority[1] "agent-b" allow[2]`).
//!
//! This file holds the public types and [`parse`], which walks the document. The work is
//! split by concern, each file building on the ones before it:
//! - `raw`: the serde shapes (`deny_unknown_fields`, every value `Spanned`);
//! - `validate`: the located-error `Validator` and the small sections;
//! - `upstream`: `[upstream]` and its [`Upstream`];
//! - `watchdog`: an authority's `watchdog` key, parsed once into a [`WatchdogEndpoint`];
//! - `ask`: an authority's `ask`, `ask_timeout_s`, `max_pending_asks`, parsed once into
//!   an [`Ask`] (design section 20);
//! - `credential`: `[[authority.credential]]` and its [`Credential`] (design section 14);
//! - `authority`: `[[authority]]`, its [`Authority`] and [`parse_authority`].
//!
//! Like the rest of the crate, none of it reads files (the caller hands over the text),
//! resolves names or checks that paths exist.

mod ask;
mod authority;
mod credential;
pub mod keys;
mod raw;
mod registry;
mod sections;
#[cfg(test)]
mod tests;
mod upstream;
mod validate;
mod watchdog;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use toml::de::DeTable;

use crate::error::PolicyError;
use raw::{
    RawGlobal, RawLimits, RawListen, RawLog, RawResolver, RawTimeouts, RawTls, RawUpstream,
    TOP_LEVEL_KEYS,
};
use validate::{Ctx, Validator};

pub use ask::{
    Ask, AskEndpoint, DEFAULT_ASK_TIMEOUT, DEFAULT_MAX_PENDING_ASKS, MAX_ASK_TIMEOUT_S,
    MAX_PENDING_ASKS,
};
pub(crate) use authority::parse_mode;
pub use authority::{Authority, AuthorityLimits, FieldError, parse_authority};
pub use credential::{
    Credential, SHIM_CA_BUNDLE_VARS, SHIM_CA_CONFIG_VARS, SHIM_CA_EXTRA_VARS, SHIM_PROXY_VARS,
    SHIM_SCRATCH_VARS, Secret, SecretSource,
};
pub use registry::{
    DEFAULT_MAX_STALENESS, DEFAULT_PREFIX, FLEET, Placement, Registry, RegistryBackend,
    check_node_name,
};
pub use upstream::{Kerberos, SystemSources, Upstream, UpstreamMode};
pub use watchdog::WatchdogEndpoint;

/// A validated `mediator.toml`: every value checked and in its typed form, every grant
/// frozen. Built only by [`parse`]; a missing section holds its defaults.
#[derive(Debug)]
pub struct Config {
    /// `[listen]`: where the mediator accepts connections.
    pub listen: Listen,
    /// `[resolver]`: how destination names are resolved.
    pub resolver: Resolver,
    /// `[upstream]`: routing after the decision (design section 8).
    pub upstream: Upstream,
    /// `[timeouts]`: the deadline of each phase of a connection.
    pub timeouts: Timeouts,
    /// `[limits]`: bounds on what a client may send.
    pub limits: Limits,
    /// `[log]`: where decision lines go.
    pub log: Log,
    /// `[log] format`: how each decision record is written (design section 19).
    pub log_format: LogFormat,
    /// `[telemetry] otlp_endpoint`: where decision records also go as OTLP/HTTP log
    /// records (design section 19); `None`: nowhere.
    pub otlp_endpoint: Option<OtlpEndpoint>,
    /// `[log] instance`: the name every decision record carries as `instance` (design
    /// section 19); `None`: the host name. Printable ASCII without spaces, 1..=253 bytes.
    pub log_instance: Option<String>,
    /// `[tls]`: the CA of TLS termination and extra upstream trust anchors.
    pub tls: Tls,
    /// `[registry]`: where authorities created through the admin API are kept.
    pub registry: Registry,
    /// `[[authority]]`, in file order, names unique (after [`Config::place`], those this
    /// node serves).
    pub authorities: Vec<Authority>,
    /// The names of the `[[authority]]` tables placed on other nodes, taken out of
    /// `authorities` by [`Config::place`] (a name of the file all the same: the admin API
    /// may not create it).
    pub placed_elsewhere: Vec<String>,
    /// `[global] deny`, the valid entries (already folded into every grant; kept so that
    /// authorities created later, e.g. by the admin API, get the same list).
    pub global_deny: Vec<crate::grant::DenyEntry>,
    /// Policy that cannot do what it says (`FILE:LINE:COL: ...`, in file order): an allow
    /// entry a deny entry refuses whole, a request rule or credential for a host no allow
    /// entry reaches, a token without a TCP listener, a TCP listener off loopback. The
    /// configuration is valid; `mediator check` and the start print them.
    pub warnings: Vec<String>,
}

/// `[listen]`: the mediator's listeners. Every one is optional; with none, the mediator
/// serves no one.
#[derive(Debug, Clone, Default)]
pub struct Listen {
    /// Directory of the per-authority Unix sockets (`<socket_dir>/<name>.sock`).
    pub socket_dir: Option<PathBuf>,
    /// The shared TCP listener, `ip:port` (clients present credentials).
    pub tcp: Option<SocketAddr>,
    /// The admin listener (`/metrics`, `/healthz`, `/v1/...`), always a loopback address.
    pub admin: Option<SocketAddr>,
    /// Optional Unix socket of the admin API (its own path, never a channel socket; mode
    /// 0600).
    pub admin_socket: Option<PathBuf>,
    /// SHA-256 of the admin API's bearer token. With one, every admin endpoint but
    /// `/healthz`, `/readyz` and `/metrics` needs `Authorization: Bearer <token>`.
    pub admin_token_sha256: Option<[u8; 32]>,
    /// Without a token, let anyone who can reach the TCP admin listener create and revoke
    /// authorities (`admin_allow_anonymous_writes = true`, warned at start). Off: mutating
    /// endpoints on the TCP admin listener need the token (the admin Unix socket, mode
    /// 0600, is guarded by its file permissions).
    pub admin_allow_anonymous_writes: bool,
}

impl Listen {
    /// The Unix socket of authority `name` (`<socket_dir>/<name>.sock`), when a
    /// `socket_dir` is configured: where the mediator makes it and the shim finds it.
    pub fn socket_path(&self, name: &str) -> Option<PathBuf> {
        self.socket_dir
            .as_deref()
            .map(|dir| authority_socket(dir, name))
    }
}

/// `<dir>/<name>.sock`: the one spelling of an authority's socket path (design section 5).
pub fn authority_socket(dir: &std::path::Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.sock"))
}

impl Config {
    /// The `[[authority]]` named `name`, if the file has it.
    pub fn authority(&self, name: &str) -> Option<&Authority> {
        self.authorities.iter().find(|a| a.grant.name() == name)
    }

    /// Keeps in `authorities` those the replica of node `node` serves (`node = "*"` or
    /// `node` itself); the names of the others go to `placed_elsewhere`, in file order.
    pub fn place(&mut self, node: &str) {
        let (here, elsewhere): (Vec<Authority>, Vec<Authority>) =
            std::mem::take(&mut self.authorities)
                .into_iter()
                .partition(|a| a.node.serves(node));
        self.authorities = here;
        self.placed_elsewhere
            .extend(elsewhere.iter().map(|a| a.grant.name().to_owned()));
    }
}

/// `[resolver]`: where names are resolved. The default is the system configuration with
/// no static answers.
#[derive(Debug, Clone, Default)]
pub struct Resolver {
    /// Explicit nameservers (`ip:port`); empty means the system configuration.
    pub nameservers: Vec<SocketAddr>,
    /// Static answers, consulted before DNS: canonical name -> addresses.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
}

/// `[timeouts]`, all given in seconds in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Reading a request head (default 10 s).
    pub request_head: Duration,
    /// One resolution (default 5 s).
    pub dns: Duration,
    /// One upstream connect (default 10 s).
    pub connect: Duration,
    /// A tunnel with no bytes either way is closed after this (default 300 s).
    pub idle_tunnel: Duration,
    /// On SIGTERM/SIGINT, live tunnels get this long to drain (default 10 s).
    pub shutdown_grace: Duration,
    /// On revocation, live tunnels get this long (default 5 s).
    pub revoke_grace: Duration,
    /// Watchdog answer deadline (default 2 s).
    pub watchdog: Duration,
    /// An idle upstream connection of a terminated tunnel, kept for the next tunnel of the
    /// same authority to the same place, is closed after this (default 4 s: below the
    /// keep-alive timeouts of common origins, so that the mediator closes first).
    pub idle_upstream: Duration,
}

/// `[limits]`: bounds on what a client may send and on how much of the mediator all
/// clients together, one authority, and the not-yet-identified TCP clients may hold
/// (design section 13). A count of 0 means "derive it from the open-files limit at start"
/// (the mediator's `limits` module says how).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request head accepted, in bytes (8192..=1048576, default 65536); a larger
    /// head gets 431 (RFC 6585 section 5).
    pub request_head_bytes: usize,
    /// Open client connections in all (0 = derived).
    pub max_connections: u32,
    /// The default cap of open client connections per authority (0 = derived); an
    /// authority's own `max_connections` overrides it.
    pub authority_connections: u32,
    /// TCP client connections whose authority is not known yet (0 = derived).
    pub unidentified_connections: u32,
    /// Idle upstream connections of terminated tunnels kept for reuse, in all (default
    /// 256; 0 turns reuse off).
    pub idle_upstream_connections: u32,
    /// The same, per authority (default 32; 0 turns reuse off).
    pub authority_idle_upstream_connections: u32,
}

/// `[log] decisions`: where decision lines go (default stdout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Log {
    /// Decision log lines go to stdout.
    Stdout,
    /// Decision log lines are appended to this file.
    File(PathBuf),
}

/// `[telemetry] otlp_endpoint`: an OTLP/HTTP receiver (protobuf), `http://host:port[/path]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint {
    /// `host:port` (the port defaults to 4318, OTLP/HTTP's).
    pub authority: String,
    /// The request path (default `/v1/logs`).
    pub path: String,
}

/// `[log] format`: the shape of each decision record (design section 19).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// The mediator's own JSON lines (design section 10).
    #[default]
    Native,
    /// OCSF 1.5.0 Network Activity events (class 4001), one JSON line each.
    Ocsf,
}

impl LogFormat {
    /// Both formats.
    pub const ALL: [Self; 2] = [Self::Native, Self::Ocsf];

    /// The config value: `native` or `ocsf`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Ocsf => "ocsf",
        }
    }
}

/// `[tls]`: trust material for TLS termination (design section 9).
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// Where the CA lives (created on first start if absent).
    pub ca_dir: Option<PathBuf>,
    /// PEM bundles trusted for upstream connections besides the system store.
    pub extra_ca_files: Vec<PathBuf>,
}

/// Parses and validates `text`, the contents of the file `origin` (used in messages).
///
/// Every section is optional; zero authorities is accepted (the mediator then serves no
/// one until authorities are added). Beyond design section 11 the schema has:
/// `[limits] request_head_bytes` (8192..=1048576, default 65536); per authority
/// `socket_mode` (a string of 3 or 4 octal digits, default `"0600"`; bits for "others"
/// are rejected because they would let every local user act as the authority),
/// `socket_uid` and `socket_gid`; and `[global] deny = [...]`, applied to every authority.
/// Timeouts are whole seconds at most 86400; `shutdown_grace` and `revoke_grace` may be 0,
/// the others must be at least 1. `[upstream] mode` is `"direct"`, `"parent"` (needs
/// `parents`, each `http://`, `https://` or `socks5://[user:pass@]host:port`), `"env"`,
/// `"pac"` (needs `pac`, an absolute path or an `http(s)://` URL; `allowed_parents` are
/// `host:port`) or `"system"` (`system_user`, `dconf_databases`, `kioslaverc_files`);
/// `parents` is refused outside `parent` mode, `pac` outside `pac` mode, and
/// `allowed_parents` and `pac_fetch_via` outside `pac` and `system` modes; `parent_auth`
/// maps `host:port` to `"basic"` or `"negotiate"`; the tuning keys are listed on
/// [`Upstream`].
/// `[listen] admin` must be a
/// loopback address. `token_sha256` is 64 hex digits (either case). `watchdog` is empty,
/// `unix:/absolute/path` or an `http://` URL.
///
/// # Errors
/// [`PolicyError::Config`] with every problem found, each prefixed with its location
/// (`FILE:LINE:COL: ...`). TOML syntax errors are reported alone (the document is not
/// validated further); within one table, every unknown key and every value of the wrong
/// type is reported.
pub fn parse(text: &str, origin: &str) -> Result<Config, PolicyError> {
    let ctx = Ctx::new(text, origin);
    let (root, syntax) = DeTable::parse_recoverable(text);
    if !syntax.is_empty() {
        return Err(PolicyError::Config(
            syntax
                .iter()
                .map(|e| format!("{}: {}", ctx.at(e.span()), e.message()))
                .collect(),
        ));
    }
    let mut v = Validator::new(ctx);
    let config = v.document(root.get_ref());
    let warnings = v.take_warnings();
    let errors = v.into_errors();
    match config {
        Some(mut c) if errors.is_empty() => {
            c.warnings = warnings;
            Ok(c)
        }
        _ => Err(PolicyError::Config(
            errors.into_iter().map(|(_, m)| m).collect(),
        )),
    }
}

impl Validator<'_> {
    /// Walks the document: unknown top-level keys, then each section (a missing one takes
    /// its defaults), then the checks that span sections. `None` when a section could not
    /// be read at all; every problem is reported either way.
    fn document(&mut self, root: &DeTable<'_>) -> Option<Config> {
        self.top_level_keys(root);
        let section = |name: &str| root.get(name);

        let listen = match section("listen") {
            Some(v) => self
                .table::<RawListen>("[listen]", v)
                .and_then(|r| self.listen(r)),
            None => Some(Listen::default()),
        };
        let resolver = match section("resolver") {
            Some(v) => self
                .table::<RawResolver>("[resolver]", v)
                .map(|r| self.resolver(r)),
            None => Some(Resolver::default()),
        };
        let upstream = match section("upstream") {
            Some(v) => self
                .table::<RawUpstream>("[upstream]", v)
                .map(|r| self.upstream(r)),
            None => Some(Upstream::default()),
        };
        let tls = match section("tls") {
            Some(v) => self.table::<RawTls>("[tls]", v).map(|r| self.tls(r)),
            None => Some(Tls::default()),
        };
        let timeouts = match section("timeouts") {
            Some(v) => self
                .table::<RawTimeouts>("[timeouts]", v)
                .map(|r| self.timeouts(&r)),
            None => Some(self.timeouts(&RawTimeouts::default())),
        };
        let limits = match section("limits") {
            Some(v) => self
                .table::<RawLimits>("[limits]", v)
                .map(|r| self.limits(&r)),
            None => Some(self.limits(&RawLimits::default())),
        };
        let log = match section("log") {
            Some(v) => self.table::<RawLog>("[log]", v).map(|r| self.log(r)),
            None => Some((Log::Stdout, None, LogFormat::Native)),
        };
        let global_deny = match section("global") {
            Some(v) => self
                .table::<RawGlobal>("[global]", v)
                .map(|r| self.global(r)),
            None => Some(Vec::new()),
        }
        .unwrap_or_default();
        let otlp_endpoint = section("telemetry")
            .and_then(|v| self.table::<raw::RawTelemetry>("[telemetry]", v))
            .and_then(|r| self.telemetry(r));
        let registry = match section("registry") {
            Some(v) => self
                .table::<registry::RawRegistry>("[registry]", v)
                .map(|r| self.registry(r)),
            None => Some(Registry::default()),
        };
        let authorities = match section("authority") {
            Some(v) => self.authorities(v, &global_deny),
            None => Vec::new(),
        };
        if tls.as_ref().is_some_and(|t| t.ca_dir.is_none())
            && let Some(v) = section("authority")
        {
            self.terminate_needs_ca(v);
        }
        if listen.as_ref().is_some_and(|l| l.tcp.is_none())
            && let Some(v) = section("authority")
        {
            self.tokens_need_tcp(v);
        }
        Some(Config {
            listen: listen?,
            resolver: resolver?,
            upstream: upstream?,
            timeouts: timeouts?,
            limits: limits?,
            log: log.as_ref()?.0.clone(),
            log_format: log.as_ref()?.2,
            otlp_endpoint,
            log_instance: log?.1,
            tls: tls?,
            registry: registry?,
            authorities,
            placed_elsewhere: Vec::new(),
            global_deny,
            warnings: Vec::new(),
        })
    }

    /// Every top-level key is a known section.
    fn top_level_keys(&mut self, root: &DeTable<'_>) {
        for (key, _) in root.iter() {
            if !TOP_LEVEL_KEYS.contains(&key.get_ref().as_ref()) {
                self.error(
                    Some(key.span()),
                    "",
                    format!(
                        "unknown top-level key {:?}; expected one of {}",
                        key.get_ref(),
                        TOP_LEVEL_KEYS.join(", ")
                    ),
                );
            }
        }
    }
}
