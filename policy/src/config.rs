//! The configuration schema (design section 11): `mediator.toml` parsed with serde
//! (`deny_unknown_fields`) into raw structs, then validated into [`Config`], whose grants
//! are frozen [`Grant`]s. Validation reports *every* problem, each with its location
//! (`FILE:LINE:COL` where the TOML parser knows it, else a key path such as
//! `authority[1] "agent-b" allow[2]`).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use crate::error::PolicyError;
use crate::grant::{Grant, GrantSpec, RequestRuleSpec};
use crate::host::{Target, canonicalize_host, parse_authority_form};
use crate::pattern::{HostPattern, PatternUse};
use crate::upstream::{
    PacOnError, PacSource, ParentSyntax, ParentUrl, parse_pac_source, parse_parent_url,
};

/// A validated configuration.
#[derive(Debug)]
pub struct Config {
    /// `[listen]`.
    pub listen: Listen,
    /// `[resolver]`.
    pub resolver: Resolver,
    /// `[upstream]`: routing after the decision (design section 8).
    pub upstream: Upstream,
    /// `[timeouts]`.
    pub timeouts: Timeouts,
    /// `[limits]`.
    pub limits: Limits,
    /// `[log]`.
    pub log: Log,
    /// `[tls]` (accepted, used by TLS termination).
    pub tls: Tls,
    /// `[[authority]]`, in file order, names unique.
    pub authorities: Vec<Authority>,
    /// `[global] deny`, the valid entries (already folded into every grant; kept so that
    /// authorities created later, e.g. by the admin API, get the same list).
    pub global_deny: Vec<String>,
}

/// `[listen]`.
#[derive(Debug, Clone)]
pub struct Listen {
    /// Directory of the per-authority Unix sockets (`<socket_dir>/<name>.sock`).
    pub socket_dir: Option<PathBuf>,
    /// Optional shared TCP listener (credentials required).
    pub tcp: Option<SocketAddr>,
    /// Optional admin listener (loopback only).
    pub admin: Option<SocketAddr>,
    /// Optional Unix socket of the admin API (its own path, never a channel socket; mode
    /// 0600).
    pub admin_socket: Option<PathBuf>,
    /// SHA-256 of the admin API's bearer token; `None` means no token is required.
    pub admin_token_sha256: Option<[u8; 32]>,
}

/// `[resolver]`.
#[derive(Debug, Clone, Default)]
pub struct Resolver {
    /// Explicit nameservers (`ip:port`); empty means the system configuration.
    pub nameservers: Vec<SocketAddr>,
    /// Static answers, consulted before DNS: canonical name -> addresses.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
}

/// `[upstream]` (design section 8): how allowed connections are routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `"direct"`, `"parent"`, `"env"` or `"pac"`.
    pub mode: String,
    /// Whether CONNECTs to a parent name the pinned IP (default) or the canonical host.
    pub pin_through_parent: bool,
    /// `mode = "parent"`: the parents, tried left to right on connection-level failure.
    pub parents: Vec<ParentUrl>,
    /// `mode = "pac"`: where the PAC script comes from.
    pub pac: Option<PacSource>,
    /// `mode = "pac"`: the parents (`host:port`, canonical) a PAC may name.
    pub allowed_parents: Vec<Target>,
    /// `parent_retry_secs` (default 30): a parent that failed at the connection level is
    /// skipped for this long.
    pub parent_retry: Duration,
    /// `parent_credentials_file`: lines `host:port user:password` giving credentials for
    /// parents named without userinfo (PAC answers, `allowed_parents`, environment).
    pub parent_credentials_file: Option<PathBuf>,
    /// `pac_cache_secs` (default 300, 0 = no cache): PAC answers are cached per
    /// (scheme, host, port) for this long.
    pub pac_cache: Duration,
    /// `pac_refresh_secs` (default 300, 0 = never): the PAC is fetched again this often;
    /// the last good copy is kept when a fetch fails.
    pub pac_refresh: Duration,
    /// `pac_budget_ms` (default 200): CPU-time budget of one PAC evaluation.
    pub pac_budget: Duration,
    /// `pac_memory_mb` (default 16): memory limit of the PAC engine, in bytes.
    pub pac_memory: usize,
    /// `pac_on_error` (default `"deny"`): what a failed PAC evaluation means.
    pub pac_on_error: PacOnError,
    /// `pac_fetch_via`: a parent through which an `http(s)://` PAC is fetched (never the
    /// PAC's own answer).
    pub pac_fetch_via: Option<ParentUrl>,
}

impl Default for Upstream {
    /// `mode = "direct"` with the documented defaults.
    fn default() -> Self {
        Self {
            mode: "direct".into(),
            pin_through_parent: true,
            parents: Vec::new(),
            pac: None,
            allowed_parents: Vec::new(),
            parent_retry: Duration::from_secs(30),
            parent_credentials_file: None,
            pac_cache: Duration::from_secs(300),
            pac_refresh: Duration::from_secs(300),
            pac_budget: Duration::from_millis(200),
            pac_memory: 16 << 20,
            pac_on_error: PacOnError::Deny,
            pac_fetch_via: None,
        }
    }
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
}

/// `[limits]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request head accepted, in bytes (default 65536); larger gets 431.
    pub request_head_bytes: usize,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Log {
    /// Decision log lines go to stdout.
    Stdout,
    /// Decision log lines are appended to this file.
    File(PathBuf),
}

/// `[tls]`.
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// Where the CA lives (created on first start if absent).
    pub ca_dir: Option<PathBuf>,
    /// Extra PEM bundles trusted upstream.
    pub extra_ca_files: Vec<PathBuf>,
}

/// One `[[authority]]`.
#[derive(Debug)]
pub struct Authority {
    /// The frozen grant (its name is the authority's name).
    pub grant: Grant,
    /// SHA-256 of the token, 32 bytes, when the authority may use the TCP listener.
    pub token_sha256: Option<[u8; 32]>,
    /// Mode of the Unix socket file (default 0o600).
    pub socket_mode: u32,
    /// Owner uid of the socket file (default: the mediator's).
    pub socket_uid: Option<u32>,
    /// Group gid of the socket file (default: the mediator's).
    pub socket_gid: Option<u32>,
    /// Watchdog endpoint, empty when none.
    pub watchdog: String,
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
/// `parents`, each `http://` or `socks5://[user:pass@]host:port`), `"env"` or `"pac"`
/// (needs `pac`, an absolute path or an `http(s)://` URL; `allowed_parents` are
/// `host:port`); `parents` is refused outside `parent` mode and `pac`, `allowed_parents`
/// and `pac_fetch_via` outside `pac` mode; the tuning keys are listed on [`Upstream`].
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
    let mut v = Validator {
        ctx,
        errors: Vec::new(),
    };
    let config = v.document(root.get_ref());
    match config {
        Some(c) if v.errors.is_empty() => Ok(c),
        _ => {
            // File order; problems found at the same place keep the order found.
            v.errors.sort_by_key(|(at, _)| *at);
            Err(PolicyError::Config(
                v.errors.into_iter().map(|(_, m)| m).collect(),
            ))
        }
    }
}

/// Maps byte offsets to `FILE:LINE:COL` (1-based, columns in characters).
struct Ctx<'a> {
    text: &'a str,
    origin: &'a str,
}

impl<'a> Ctx<'a> {
    fn new(text: &'a str, origin: &'a str) -> Self {
        Self { text, origin }
    }

    fn at(&self, span: Option<Range<usize>>) -> String {
        let Some(span) = span else {
            return self.origin.to_owned();
        };
        let mut offset = span.start.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        format!("{}:{line}:{col}", self.origin)
    }
}

struct Validator<'a> {
    ctx: Ctx<'a>,
    /// Byte offset (for sorting) and message.
    errors: Vec<(usize, String)>,
}

const TOP_LEVEL_KEYS: &[&str] = &[
    "listen",
    "resolver",
    "upstream",
    "tls",
    "timeouts",
    "limits",
    "log",
    "global",
    "authority",
];

/// Largest timeout accepted, in seconds (one day): keeps deadlines far from `Instant`
/// overflow and catches unit mistakes (milliseconds written as seconds).
const MAX_TIMEOUT_SECS: u64 = 86_400;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListen {
    socket_dir: Option<Spanned<String>>,
    tcp: Option<Spanned<String>>,
    admin: Option<Spanned<String>>,
    admin_socket: Option<Spanned<String>>,
    admin_token_sha256: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResolver {
    nameservers: Option<Vec<Spanned<String>>>,
    hosts: Option<BTreeMap<Spanned<String>, Vec<Spanned<String>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    mode: Option<Spanned<String>>,
    parents: Option<Spanned<Vec<Spanned<String>>>>,
    pac: Option<Spanned<String>>,
    allowed_parents: Option<Spanned<Vec<Spanned<String>>>>,
    pin_through_parent: Option<bool>,
    parent_retry_secs: Option<Spanned<u64>>,
    parent_credentials_file: Option<Spanned<String>>,
    pac_cache_secs: Option<Spanned<u64>>,
    pac_refresh_secs: Option<Spanned<u64>>,
    pac_budget_ms: Option<Spanned<u64>>,
    pac_memory_mb: Option<Spanned<u64>>,
    pac_on_error: Option<Spanned<String>>,
    pac_fetch_via: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca_dir: Option<Spanned<String>>,
    extra_ca_files: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    request_head: Option<Spanned<u64>>,
    dns: Option<Spanned<u64>>,
    connect: Option<Spanned<u64>>,
    idle_tunnel: Option<Spanned<u64>>,
    shutdown_grace: Option<Spanned<u64>>,
    revoke_grace: Option<Spanned<u64>>,
    watchdog: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    request_head_bytes: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    decisions: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGlobal {
    deny: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuthority {
    name: Option<Spanned<String>>,
    allow: Option<Vec<Spanned<String>>>,
    deny: Option<Vec<Spanned<String>>>,
    allow_private: Option<Vec<Spanned<String>>>,
    token_sha256: Option<Spanned<String>>,
    sni_check: Option<bool>,
    tls_terminate: Option<Vec<Spanned<String>>>,
    watchdog: Option<Spanned<String>>,
    socket_mode: Option<Spanned<String>>,
    socket_uid: Option<u32>,
    socket_gid: Option<u32>,
    request_rule: Option<Vec<Spanned<RawRequestRule>>>,
}

/// `[[authority.request_rule]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequestRule {
    host: Option<String>,
    methods: Option<Vec<String>>,
    path_prefixes: Option<Vec<String>>,
}

fn strings(list: Option<&Vec<Spanned<String>>>) -> Vec<String> {
    list.map(|l| l.iter().map(|s| s.get_ref().clone()).collect())
        .unwrap_or_default()
}

impl Validator<'_> {
    fn error(&mut self, span: Option<Range<usize>>, what: &str, message: impl std::fmt::Display) {
        let offset = span.as_ref().map_or(usize::MAX, |s| s.start);
        let at = self.ctx.at(span);
        let message = if what.is_empty() {
            format!("{at}: {message}")
        } else {
            format!("{at}: {what}: {message}")
        };
        self.errors.push((offset, message));
    }

    /// Deserializes one table into `T`. On an error, the key it concerns is reported and
    /// dropped and the table tried again, so that every unknown key and every mistyped
    /// value is reported, not only the first. Returns `None` only when an error cannot be
    /// tied to a key.
    fn table<'i, T: Deserialize<'i>>(
        &mut self,
        what: &str,
        value: &Spanned<DeValue<'i>>,
    ) -> Option<T> {
        let DeValue::Table(table) = value.get_ref() else {
            self.error(
                Some(value.span()),
                what,
                format!("must be a table, not {}", value.get_ref().type_str()),
            );
            return None;
        };
        let mut table = table.clone();
        loop {
            let attempt = Spanned::new(value.span(), DeValue::Table(table.clone()));
            match T::deserialize(ValueDeserializer::from(attempt)) {
                Ok(t) => return Some(t),
                Err(e) => {
                    let span = e.span();
                    self.error(span.clone().or(Some(value.span())), what, e.message());
                    let culprit = span.and_then(|sp| {
                        table
                            .iter()
                            .find(|(k, v)| covers(&k.span(), &sp) || covers(&v.span(), &sp))
                            .map(|(k, _)| k.get_ref().to_string())
                    });
                    match culprit {
                        Some(key) => {
                            table.remove(key.as_str());
                        }
                        None => return None,
                    }
                }
            }
        }
    }

    fn document(&mut self, root: &DeTable<'_>) -> Option<Config> {
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
        let section = |name: &str| root.get(name);

        let listen = match section("listen") {
            Some(v) => self
                .table::<RawListen>("[listen]", v)
                .and_then(|r| self.listen(r)),
            None => Some(Listen {
                socket_dir: None,
                tcp: None,
                admin: None,
                admin_socket: None,
                admin_token_sha256: None,
            }),
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
            None => Some(self.timeouts(&RawTimeouts {
                request_head: None,
                dns: None,
                connect: None,
                idle_tunnel: None,
                shutdown_grace: None,
                revoke_grace: None,
                watchdog: None,
            })),
        };
        let limits = match section("limits") {
            Some(v) => self
                .table::<RawLimits>("[limits]", v)
                .map(|r| self.limits(&r)),
            None => Some(Limits {
                request_head_bytes: 65536,
            }),
        };
        let log = match section("log") {
            Some(v) => self.table::<RawLog>("[log]", v).map(|r| self.log(r)),
            None => Some(Log::Stdout),
        };
        let global_deny = match section("global") {
            Some(v) => self
                .table::<RawGlobal>("[global]", v)
                .map(|r| self.global(r)),
            None => Some(Vec::new()),
        }
        .unwrap_or_default();
        let authorities = match section("authority") {
            Some(v) => self.authorities(v, &global_deny),
            None => Vec::new(),
        };
        if tls.as_ref().is_some_and(|t| t.ca_dir.is_none()) {
            if let Some(v) = section("authority") {
                self.terminate_needs_ca(v);
            }
        }
        Some(Config {
            listen: listen?,
            resolver: resolver?,
            upstream: upstream?,
            timeouts: timeouts?,
            limits: limits?,
            log: log?,
            tls: tls?,
            authorities,
            global_deny,
        })
    }

    /// TLS termination issues leaves from the CA in `[tls] ca_dir`: without one, every
    /// non-empty `tls_terminate` is an error at its location.
    fn terminate_needs_ca(&mut self, authorities: &Spanned<DeValue<'_>>) {
        let DeValue::Array(items) = authorities.get_ref() else {
            return;
        };
        for item in items {
            let Some(list) = item.get_ref().get("tls_terminate") else {
                continue;
            };
            if matches!(list.get_ref(), DeValue::Array(a) if !a.is_empty()) {
                let what = match item
                    .get_ref()
                    .get("name")
                    .and_then(|n| n.get_ref().as_str())
                {
                    Some(name) => format!("authority {name:?}"),
                    None => "authority".to_owned(),
                };
                self.error(
                    Some(list.span()),
                    &what,
                    "tls_terminate needs the CA that issues the leaf certificates: set [tls] ca_dir (created on first start)",
                );
            }
        }
    }

    fn listen(&mut self, raw: RawListen) -> Option<Listen> {
        let what = "[listen]";
        let socket_dir = raw.socket_dir.and_then(|d| {
            if d.get_ref().is_empty() {
                self.error(
                    Some(d.span()),
                    what,
                    "socket_dir is empty; omit it for no Unix sockets",
                );
                None
            } else {
                Some(PathBuf::from(d.into_inner()))
            }
        });
        let mut addr = |v: Option<Spanned<String>>, key: &str, loopback_only: bool| {
            let v = v?;
            match v.get_ref().parse::<SocketAddr>() {
                Ok(a) if loopback_only && !a.ip().is_loopback() => {
                    self.error(
                        Some(v.span()),
                        what,
                        format!("{key} {:?} is not a loopback address; the admin API must not be reachable from other hosts", v.get_ref()),
                    );
                    None
                }
                Ok(a) => Some(a),
                Err(_) => {
                    self.error(
                        Some(v.span()),
                        what,
                        format!("{key} {:?} is not an ip:port address (write \"127.0.0.1:3128\" or \"[::1]:3128\")", v.get_ref()),
                    );
                    None
                }
            }
        };
        let tcp = addr(raw.tcp, "tcp", false);
        let admin = addr(raw.admin, "admin", true);
        let admin_socket = raw
            .admin_socket
            .and_then(|p| self.admin_socket(p, socket_dir.as_deref()));
        let admin_token_sha256 = raw.admin_token_sha256.and_then(|t| match parse_sha256(t.get_ref()) {
            Some(bytes) => Some(bytes),
            None => {
                self.error(
                    Some(t.span()),
                    what,
                    "admin_token_sha256 must be 64 hex digits (the SHA-256 of a non-empty admin token); omit it for no token",
                );
                None
            }
        });
        Some(Listen {
            socket_dir,
            tcp,
            admin,
            admin_socket,
            admin_token_sha256,
        })
    }

    /// `[listen] admin_socket`: an absolute path that is not inside `socket_dir`, so it
    /// can never be taken for (or replaced by) an authority's channel socket.
    fn admin_socket(
        &mut self,
        p: Spanned<String>,
        socket_dir: Option<&std::path::Path>,
    ) -> Option<PathBuf> {
        let what = "[listen]";
        let path = PathBuf::from(p.get_ref());
        if !path.is_absolute() {
            self.error(
                Some(p.span()),
                what,
                format!("admin_socket {:?} must be an absolute path", p.get_ref()),
            );
            return None;
        }
        if socket_dir.is_some_and(|d| path.starts_with(d)) {
            self.error(
                Some(p.span()),
                what,
                format!("admin_socket {:?} is inside socket_dir; the admin API needs a socket of its own, never a channel's", p.get_ref()),
            );
            return None;
        }
        Some(path)
    }

    fn resolver(&mut self, raw: RawResolver) -> Resolver {
        let what = "[resolver]";
        let mut out = Resolver::default();
        for ns in raw.nameservers.unwrap_or_default() {
            match ns.get_ref().parse::<SocketAddr>() {
                Ok(a) => out.nameservers.push(a),
                Err(_) => self.error(
                    Some(ns.span()),
                    what,
                    format!(
                        "nameserver {:?} is not an ip:port address (write \"127.0.0.1:53\")",
                        ns.get_ref()
                    ),
                ),
            }
        }
        let mut seen: BTreeMap<String, Range<usize>> = BTreeMap::new();
        // File order, so that a duplicate is reported at its second spelling.
        let mut hosts: Vec<_> = raw.hosts.unwrap_or_default().into_iter().collect();
        hosts.sort_by_key(|(key, _)| key.span().start);
        for (key, addrs) in hosts {
            let name = match canonicalize_host(key.get_ref()) {
                Ok(h) => match h.name() {
                    Some(n) => n.to_owned(),
                    None => {
                        self.error(
                            Some(key.span()),
                            what,
                            format!(
                                "hosts key {:?} is an IP address; keys must be names",
                                key.get_ref()
                            ),
                        );
                        continue;
                    }
                },
                Err(e) => {
                    self.error(Some(key.span()), what, format!("hosts key: {e}"));
                    continue;
                }
            };
            if let Some(first) = seen.get(&name) {
                let first = self.ctx.at(Some(first.clone()));
                self.error(
                    Some(key.span()),
                    what,
                    format!(
                        "hosts key {:?} is the same host as the key at {first}",
                        key.get_ref()
                    ),
                );
                continue;
            }
            seen.insert(name.clone(), key.span());
            if addrs.is_empty() {
                self.error(
                    Some(key.span()),
                    what,
                    format!("hosts entry {:?} has no addresses", key.get_ref()),
                );
                continue;
            }
            let mut ips = Vec::with_capacity(addrs.len());
            for a in &addrs {
                match a.get_ref().parse::<IpAddr>() {
                    Ok(ip) => ips.push(ip),
                    Err(_) => self.error(
                        Some(a.span()),
                        what,
                        format!(
                            "hosts entry {:?}: {:?} is not an IP address",
                            key.get_ref(),
                            a.get_ref()
                        ),
                    ),
                }
            }
            out.hosts.insert(name, ips);
        }
        out
    }

    fn upstream(&mut self, raw: RawUpstream) -> Upstream {
        let what = "[upstream]";
        let mode = raw
            .mode
            .as_ref()
            .map_or("direct", |m| m.get_ref().as_str())
            .to_owned();
        if let Some(m) = &raw.mode {
            if !["direct", "parent", "env", "pac"].contains(&m.get_ref().as_str()) {
                self.error(
                    Some(m.span()),
                    what,
                    format!(
                        "unknown mode {:?}; expected one of \"direct\", \"parent\", \"env\", \"pac\"",
                        m.get_ref()
                    ),
                );
            }
        }
        let mut out = Upstream {
            mode: mode.clone(),
            pin_through_parent: raw.pin_through_parent.unwrap_or(true),
            ..Upstream::default()
        };
        let nonempty_list = |l: &Option<Spanned<Vec<Spanned<String>>>>| {
            l.as_ref()
                .filter(|p| !p.get_ref().is_empty())
                .map(Spanned::span)
        };
        let nonempty_str = |v: &Option<Spanned<String>>| {
            v.as_ref()
                .filter(|p| !p.get_ref().is_empty())
                .map(Spanned::span)
        };

        // parents: mode = "parent" only, and then required.
        if mode == "parent" {
            let list = raw.parents.as_ref().map(|p| p.get_ref().as_slice());
            if list.is_none_or(<[_]>::is_empty) {
                self.error(
                    raw.mode.as_ref().map(Spanned::span),
                    what,
                    "mode = \"parent\" needs parents = [\"http://host:port\", ...]",
                );
            }
            for p in list.unwrap_or_default() {
                match parse_parent_url(p.get_ref(), ParentSyntax::Config) {
                    Ok(url) => out.parents.push(url),
                    Err(why) => self.error(
                        Some(p.span()),
                        what,
                        format!("parent {}: {why}", redact(p.get_ref())),
                    ),
                }
            }
        } else if let Some(span) = nonempty_list(&raw.parents) {
            self.error(
                Some(span),
                what,
                format!("parents is only used with mode = \"parent\", not {mode:?}"),
            );
        }

        // pac, allowed_parents, pac_fetch_via: mode = "pac" only.
        if mode == "pac" {
            match raw.pac.as_ref().filter(|p| !p.get_ref().is_empty()) {
                None => self.error(
                    raw.mode.as_ref().map(Spanned::span),
                    what,
                    "mode = \"pac\" needs pac = \"/path/proxy.pac\" or \"https://host/proxy.pac\"",
                ),
                Some(p) => match parse_pac_source(p.get_ref()) {
                    Ok(src) => out.pac = Some(src),
                    Err(why) => self.error(
                        Some(p.span()),
                        what,
                        format!("pac {:?}: {why}", p.get_ref()),
                    ),
                },
            }
            let list = raw.allowed_parents.as_ref().map(|p| p.get_ref().as_slice());
            for p in list.unwrap_or_default() {
                match parse_authority_form(p.get_ref()) {
                    Ok(t) => out.allowed_parents.push(t),
                    Err(e) => self.error(
                        Some(p.span()),
                        what,
                        format!("allowed_parents entry: {e}; write \"host:port\""),
                    ),
                }
            }
            if let Some(v) = &raw.pac_fetch_via {
                match parse_parent_url(v.get_ref(), ParentSyntax::Config) {
                    Ok(url) if matches!(out.pac, Some(PacSource::Url(_))) => {
                        out.pac_fetch_via = Some(url);
                    }
                    Ok(_) => self.error(
                        Some(v.span()),
                        what,
                        "pac_fetch_via is only used when pac is an http(s):// URL",
                    ),
                    Err(why) => self.error(
                        Some(v.span()),
                        what,
                        format!("pac_fetch_via {}: {why}", redact(v.get_ref())),
                    ),
                }
            }
        } else {
            for (key, span) in [
                ("pac", nonempty_str(&raw.pac)),
                ("allowed_parents", nonempty_list(&raw.allowed_parents)),
                ("pac_fetch_via", nonempty_str(&raw.pac_fetch_via)),
            ] {
                if let Some(span) = span {
                    self.error(
                        Some(span),
                        what,
                        format!("{key} is only used with mode = \"pac\", not {mode:?}"),
                    );
                }
            }
        }

        let mut range = |v: &Option<Spanned<u64>>, key: &str, min: u64, max: u64| {
            let v = v.as_ref()?;
            let n = *v.get_ref();
            if n < min || n > max {
                self.error(
                    Some(v.span()),
                    what,
                    format!("{key} = {n} is out of range {min}..={max}"),
                );
                return None;
            }
            Some(n)
        };
        if let Some(n) = range(
            &raw.parent_retry_secs,
            "parent_retry_secs",
            0,
            MAX_TIMEOUT_SECS,
        ) {
            out.parent_retry = Duration::from_secs(n);
        }
        if let Some(n) = range(&raw.pac_cache_secs, "pac_cache_secs", 0, MAX_TIMEOUT_SECS) {
            out.pac_cache = Duration::from_secs(n);
        }
        if let Some(n) = range(
            &raw.pac_refresh_secs,
            "pac_refresh_secs",
            0,
            MAX_TIMEOUT_SECS,
        ) {
            out.pac_refresh = Duration::from_secs(n);
        }
        if let Some(n) = range(&raw.pac_budget_ms, "pac_budget_ms", 1, 10_000) {
            out.pac_budget = Duration::from_millis(n);
        }
        if let Some(n) = range(&raw.pac_memory_mb, "pac_memory_mb", 1, 1024) {
            // At most 1 GiB: fits every usize of 32 bits or more.
            out.pac_memory = usize::try_from(n << 20).unwrap_or(16 << 20);
        }
        if let Some(v) = &raw.pac_on_error {
            match v.get_ref().as_str() {
                "deny" => out.pac_on_error = PacOnError::Deny,
                "direct" => out.pac_on_error = PacOnError::Direct,
                other => self.error(
                    Some(v.span()),
                    what,
                    format!("pac_on_error {other:?}: write \"deny\" or \"direct\""),
                ),
            }
        }
        if let Some(f) = &raw.parent_credentials_file {
            if f.get_ref().starts_with('/') {
                out.parent_credentials_file = Some(PathBuf::from(f.get_ref()));
            } else {
                self.error(
                    Some(f.span()),
                    what,
                    "parent_credentials_file must be an absolute path",
                );
            }
        }
        out
    }

    fn tls(&mut self, raw: RawTls) -> Tls {
        let what = "[tls]";
        let mut path = |s: Spanned<String>, key: &str| {
            if s.get_ref().is_empty() {
                self.error(Some(s.span()), what, format!("{key} is empty"));
                None
            } else {
                Some(PathBuf::from(s.into_inner()))
            }
        };
        let ca_dir = raw.ca_dir.and_then(|d| path(d, "ca_dir"));
        let extra_ca_files = raw
            .extra_ca_files
            .unwrap_or_default()
            .into_iter()
            .filter_map(|f| path(f, "extra_ca_files entry"))
            .collect();
        Tls {
            ca_dir,
            extra_ca_files,
        }
    }

    fn timeouts(&mut self, raw: &RawTimeouts) -> Timeouts {
        let mut secs = |v: &Option<Spanned<u64>>, key: &str, default: u64, min: u64| {
            let Some(v) = v else {
                return Duration::from_secs(default);
            };
            let n = *v.get_ref();
            if n < min || n > MAX_TIMEOUT_SECS {
                self.error(
                    Some(v.span()),
                    "[timeouts]",
                    format!(
                        "{key} = {n} is out of range; give whole seconds {min}..={MAX_TIMEOUT_SECS}"
                    ),
                );
                return Duration::from_secs(default);
            }
            Duration::from_secs(n)
        };
        Timeouts {
            request_head: secs(&raw.request_head, "request_head", 10, 1),
            dns: secs(&raw.dns, "dns", 5, 1),
            connect: secs(&raw.connect, "connect", 10, 1),
            idle_tunnel: secs(&raw.idle_tunnel, "idle_tunnel", 300, 1),
            shutdown_grace: secs(&raw.shutdown_grace, "shutdown_grace", 10, 0),
            revoke_grace: secs(&raw.revoke_grace, "revoke_grace", 5, 0),
            watchdog: secs(&raw.watchdog, "watchdog", 2, 1),
        }
    }

    fn limits(&mut self, raw: &RawLimits) -> Limits {
        // hyper's HTTP/1 server cannot buffer less than 8 KiB.
        const MIN: u64 = 8192;
        const MAX: u64 = 1 << 20;
        let mut request_head_bytes = 65536;
        if let Some(v) = &raw.request_head_bytes {
            let n = *v.get_ref();
            if (MIN..=MAX).contains(&n) {
                // MAX fits every usize of 32 bits or more.
                request_head_bytes = usize::try_from(n).unwrap_or(65536);
            } else {
                self.error(
                    Some(v.span()),
                    "[limits]",
                    format!("request_head_bytes = {n} is out of range {MIN}..={MAX}"),
                );
            }
        }
        Limits { request_head_bytes }
    }

    fn log(&mut self, raw: RawLog) -> Log {
        match raw.decisions {
            None => Log::Stdout,
            Some(d) if d.get_ref() == "stdout" => Log::Stdout,
            Some(d) if d.get_ref().is_empty() => {
                self.error(
                    Some(d.span()),
                    "[log]",
                    "decisions is empty; write \"stdout\" or a file path",
                );
                Log::Stdout
            }
            Some(d) => Log::File(PathBuf::from(d.into_inner())),
        }
    }

    /// Validates the global deny list; returns only the valid entries (the invalid ones
    /// are reported here, once, not again for every authority).
    fn global(&mut self, raw: RawGlobal) -> Vec<String> {
        let mut out = Vec::new();
        for entry in raw.deny.unwrap_or_default() {
            match HostPattern::parse("global deny", entry.get_ref(), PatternUse::Deny) {
                Ok(_) => out.push(entry.into_inner()),
                Err(e) => self.error(Some(entry.span()), "[global]", e),
            }
        }
        out
    }

    fn authorities(
        &mut self,
        value: &Spanned<DeValue<'_>>,
        global_deny: &[String],
    ) -> Vec<Authority> {
        let DeValue::Array(items) = value.get_ref() else {
            self.error(
                Some(value.span()),
                "",
                "authority must be an array of tables: write each one as [[authority]]",
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut seen: BTreeMap<String, Range<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            // Name the authority in messages as early as possible, even before its table
            // deserializes cleanly.
            let what = match item
                .get_ref()
                .get("name")
                .and_then(|n| n.get_ref().as_str())
            {
                Some(name) => format!("authority {name:?}"),
                None => format!("authority[{}]", i + 1),
            };
            let Some(raw) = self.table::<RawAuthority>(&what, item) else {
                continue;
            };
            let Some(name) = &raw.name else {
                self.error(Some(item.span()), &what, "missing key \"name\"");
                continue;
            };
            let label = format!("authority {:?}", name.get_ref());
            if let Some(first) = seen.get(name.get_ref()) {
                let first = self.ctx.at(Some(first.clone()));
                self.error(
                    Some(name.span()),
                    &label,
                    format!("duplicate name; first defined at {first}"),
                );
                continue;
            }
            seen.insert(name.get_ref().clone(), name.span());
            if let Some(a) = self.authority(&raw, &label, item.span(), global_deny) {
                out.push(a);
            }
        }
        out
    }

    fn authority(
        &mut self,
        raw: &RawAuthority,
        label: &str,
        span: Range<usize>,
        global_deny: &[String],
    ) -> Option<Authority> {
        let spec = GrantSpec {
            name: raw
                .name
                .as_ref()
                .map(|n| n.get_ref().clone())
                .unwrap_or_default(),
            allow: strings(raw.allow.as_ref()),
            deny: strings(raw.deny.as_ref()),
            allow_private: strings(raw.allow_private.as_ref()),
            sni_check: raw.sni_check.unwrap_or(true),
            tls_terminate: strings(raw.tls_terminate.as_ref()),
            request_rules: raw
                .request_rule
                .iter()
                .flatten()
                .map(|r| {
                    let r = r.get_ref();
                    RequestRuleSpec {
                        host: r.host.clone().unwrap_or_default(),
                        methods: r.methods.clone().unwrap_or_default(),
                        path_prefixes: r.path_prefixes.clone().unwrap_or_default(),
                    }
                })
                .collect(),
        };
        let grant = match Grant::build(&spec, global_deny) {
            Ok(g) => Some(g),
            Err(errors) => {
                for e in errors {
                    let list = match e.field {
                        "allow" => raw.allow.as_ref(),
                        "deny" => raw.deny.as_ref(),
                        "allow_private" => raw.allow_private.as_ref(),
                        "tls_terminate" => raw.tls_terminate.as_ref(),
                        _ => None,
                    };
                    let at = match (e.field, list) {
                        ("name", _) => raw.name.as_ref().map(Spanned::span),
                        ("request_rule", _) => raw
                            .request_rule
                            .as_ref()
                            .and_then(|rules| rules.get(e.index))
                            .map(Spanned::span),
                        (_, Some(list)) => list.get(e.index).map(Spanned::span),
                        _ => None,
                    };
                    self.error(at.or_else(|| Some(span.clone())), label, e.message);
                }
                None
            }
        };

        let token_sha256 = raw.token_sha256.as_ref().and_then(|t| match parse_sha256(t.get_ref()) {
            Some(bytes) => Some(bytes),
            None => {
                self.error(
                    Some(t.span()),
                    label,
                    "token_sha256 must be 64 hex digits (the SHA-256 of a non-empty token); omit the key if the authority does not use the TCP listener",
                );
                None
            }
        });

        let mut socket_mode = 0o600;
        if let Some(m) = &raw.socket_mode {
            match parse_mode(m.get_ref()) {
                Ok(mode) => socket_mode = mode,
                Err(why) => self.error(
                    Some(m.span()),
                    label,
                    format!("socket_mode {:?}: {why}", m.get_ref()),
                ),
            }
        }

        let watchdog = raw
            .watchdog
            .as_ref()
            .map_or_else(String::new, |w| w.get_ref().clone());
        if let Some(w) = &raw.watchdog {
            let ok = w.get_ref().is_empty()
                || w.get_ref()
                    .strip_prefix("unix:")
                    .is_some_and(|p| p.starts_with('/'))
                || w.get_ref()
                    .strip_prefix("http://")
                    .is_some_and(watchdog_http_is_loopback);
            if !ok {
                self.error(
                    Some(w.span()),
                    label,
                    format!(
                        "watchdog {:?} must be \"unix:/absolute/path\" or \"http://127.0.0.1:port/...\" \
                         (a loopback IP literal or localhost, no userinfo): the watchdog sees every \
                         allowed destination and must run on this host",
                        w.get_ref()
                    ),
                );
            }
        }

        Some(Authority {
            grant: grant?,
            token_sha256,
            socket_mode,
            socket_uid: raw.socket_uid,
            socket_gid: raw.socket_gid,
            watchdog,
        })
    }
}

/// One problem with an authority table given on its own (see [`parse_authority`]): the key
/// it concerns and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The key of the `[[authority]]` table (`"allow"`, `"token_sha256"`, an unknown key as
    /// written, ...), or `""` when the problem concerns the table as a whole.
    pub field: String,
    /// What is wrong, naming the entry where there is one.
    pub message: String,
}

/// Builds one authority from `text`, a TOML document whose top-level keys are the keys of
/// one `[[authority]]` table (the admin API turns its flat JSON body into this). It is
/// validated by the same code as an `[[authority]]` of a configuration file, and
/// `global_deny` (see [`Config::global_deny`]) is folded into its grant.
///
/// # Errors
/// Every problem found, each tied to the key it concerns ([`FieldError::field`]).
pub fn parse_authority(text: &str, global_deny: &[String]) -> Result<Authority, Vec<FieldError>> {
    const ORIGIN: &str = "authority";
    // A leading newline keeps offset 0 (where whole-table problems are reported) outside
    // every key, so they are never pinned on the first key.
    let text = format!("\n{text}");
    let (root, syntax) = DeTable::parse_recoverable(&text);
    if !syntax.is_empty() {
        return Err(syntax
            .iter()
            .map(|e| FieldError {
                field: String::new(),
                message: e.message().to_owned(),
            })
            .collect());
    }
    let table = root.get_ref();
    let label = match table.get("name").and_then(|n| n.get_ref().as_str()) {
        Some(name) => format!("authority {name:?}"),
        None => "authority".to_owned(),
    };
    let mut v = Validator {
        ctx: Ctx::new(&text, ORIGIN),
        errors: Vec::new(),
    };
    let value = Spanned::new(0..text.len(), DeValue::Table(table.clone()));
    let authority = v
        .table::<RawAuthority>(&label, &value)
        .and_then(|raw| match &raw.name {
            Some(_) => v.authority(&raw, &label, 0..1, global_deny),
            None => {
                v.error(Some(0..1), &label, "missing key \"name\"");
                None
            }
        });
    // Table order, as in `parse`.
    v.errors.sort_by_key(|(at, _)| *at);
    match authority {
        Some(a) if v.errors.is_empty() => Ok(a),
        _ => Err(v
            .errors
            .iter()
            .map(|(offset, message)| {
                let field = table
                    .iter()
                    .find(|(k, val)| {
                        let at = *offset..offset.saturating_add(1);
                        covers(&k.span(), &at) || covers(&val.span(), &at)
                    })
                    .map(|(k, _)| k.get_ref().to_string())
                    .unwrap_or_default();
                FieldError {
                    field,
                    message: strip_location(message, ORIGIN, &label),
                }
            })
            .collect()),
    }
}

/// Removes the `ORIGIN[:LINE:COL]: ` and `LABEL: ` prefixes the validator puts on messages.
fn strip_location(message: &str, origin: &str, label: &str) -> String {
    let rest = message.strip_prefix(origin).unwrap_or(message);
    let rest = rest.trim_start_matches(|c: char| c == ':' || c.is_ascii_digit());
    let rest = rest.strip_prefix(' ').unwrap_or(rest);
    rest.strip_prefix(label)
        .and_then(|r| r.strip_prefix(": "))
        .unwrap_or(rest)
        .to_owned()
}

/// A parent URL for an error message: the password (if any) replaced by `***`.
fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").map_or(("", url), |(s, r)| (s, r));
    let shown = match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    };
    format!("{shown:?}")
}

fn covers(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.start < outer.end.max(outer.start + 1)
}

/// Parses 64 hex digits (either case) into 32 bytes.
/// Whether the part after `http://` of a watchdog URL names a loopback IP literal or
/// `localhost` (with an optional port), with no userinfo.
fn watchdog_http_is_loopback(rest: &str) -> bool {
    let hostport = rest.split(['/', '?', '#']).next().unwrap_or("");
    if hostport.is_empty() || hostport.contains('@') {
        return false;
    }
    let host = match hostport.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, tail)) if tail.is_empty() || tail.starts_with(':') => h,
            _ => return false,
        },
        None => hostport.split(':').next().unwrap_or(""),
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod watchdog_url_tests {
    use super::watchdog_http_is_loopback;

    #[test]
    fn watchdog_urls_must_stay_on_this_host() {
        for ok in [
            "127.0.0.1:9/x",
            "127.9.9.9",
            "[::1]:80/",
            "localhost:8080/h",
            "LOCALHOST",
        ] {
            assert!(watchdog_http_is_loopback(ok), "{ok}");
        }
        for bad in [
            "10.0.0.1/x",
            "localhost.evil.com:80/x",
            "user@127.0.0.1/",
            "127.0.0.1@evil.test/",
            "[::1]x/",
            "",
            "evil.test",
            "[2001:db8::1]:80/",
        ] {
            assert!(!watchdog_http_is_loopback(bad), "{bad}");
        }
    }
}

/// SHA-256 of the empty string: a token hash equal to it would let an empty password in.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn parse_sha256(s: &str) -> Option<[u8; 32]> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 || s.eq_ignore_ascii_case(EMPTY_SHA256) {
        return None;
    }
    let mut out = [0u8; 32];
    for (slot, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let hi = char::from(pair[0]).to_digit(16)?;
        let lo = char::from(pair[1]).to_digit(16)?;
        // Two hex digits are at most 255.
        *slot = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(out)
}

/// Parses a socket mode: 3 or 4 octal digits, no setuid/setgid/sticky bits, no bits for
/// "others".
fn parse_mode(s: &str) -> Result<u32, String> {
    if !(3..=4).contains(&s.len()) || !s.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err("write 3 or 4 octal digits, like \"0600\" or \"0660\"".into());
    }
    let mode = u32::from_str_radix(s, 8).map_err(|e| e.to_string())?;
    if mode > 0o777 {
        return Err("setuid, setgid and sticky bits are not allowed".into());
    }
    if mode & 0o007 != 0 {
        return Err("bits for others would let every local user act as this authority; use socket_gid and \"0660\" to share the socket with a group".into());
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        match parse(text, "m.toml") {
            Ok(_) => panic!("expected errors"),
            Err(PolicyError::Config(v)) => v,
            Err(e) => panic!("unexpected error kind {e}"),
        }
    }

    const FULL: &str = r#"
[listen]
socket_dir = "/run/egress-mediator"
tcp = "127.0.0.1:3128"
admin = "[::1]:9901"

[resolver]
nameservers = ["127.0.0.1:5353", "[::1]:53"]
hosts = { "Origin.Test." = ["127.0.0.1", "::1"], "bücher.test" = ["192.0.2.1"] }

[upstream]
mode = "direct"
parents = []
pac = ""
allowed_parents = []
pin_through_parent = false

[tls]
ca_dir = "/var/lib/egress-mediator/ca"
extra_ca_files = ["/etc/ssl/extra.pem"]

[timeouts]
request_head = 11
dns = 6
connect = 12
idle_tunnel = 301
shutdown_grace = 0
revoke_grace = 0
watchdog = 3

[limits]
request_head_bytes = 32768

[log]
decisions = "/var/log/egress/decisions.jsonl"

[global]
deny = ["*:25", "metadata.google.internal"]

[[authority]]
name = "agent-a"
allow = ["api.github.com", "raw.githubusercontent.com", "registry.npmjs.org:443"]
deny = []
allow_private = []
token_sha256 = "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08"
sni_check = true
tls_terminate = []
watchdog = ""

[[authority]]
name = "agent-b"
allow = ["origin.test"]
allow_private = ["127.0.0.1", "::1"]
sni_check = false
tls_terminate = ["origin.test"]
watchdog = "unix:/run/watchdog.sock"
socket_mode = "0660"
socket_uid = 1000
socket_gid = 1001
"#;

    #[test]
    fn full_config_loads() {
        let c = parse(FULL, "m.toml").unwrap();
        assert_eq!(
            c.listen.socket_dir,
            Some(PathBuf::from("/run/egress-mediator"))
        );
        assert_eq!(c.listen.tcp, Some("127.0.0.1:3128".parse().unwrap()));
        assert_eq!(c.listen.admin, Some("[::1]:9901".parse().unwrap()));
        assert_eq!(
            c.resolver.nameservers,
            vec![
                "127.0.0.1:5353".parse::<SocketAddr>().unwrap(),
                "[::1]:53".parse().unwrap()
            ]
        );
        assert_eq!(
            c.resolver.hosts.get("origin.test"),
            Some(&vec![
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ])
        );
        assert!(c.resolver.hosts.contains_key("xn--bcher-kva.test"));
        assert_eq!(
            c.upstream,
            Upstream {
                pin_through_parent: false,
                ..Upstream::default()
            }
        );
        assert_eq!(
            c.tls.ca_dir,
            Some(PathBuf::from("/var/lib/egress-mediator/ca"))
        );
        assert_eq!(
            c.tls.extra_ca_files,
            vec![PathBuf::from("/etc/ssl/extra.pem")]
        );
        assert_eq!(
            c.timeouts,
            Timeouts {
                request_head: Duration::from_secs(11),
                dns: Duration::from_secs(6),
                connect: Duration::from_secs(12),
                idle_tunnel: Duration::from_secs(301),
                shutdown_grace: Duration::ZERO,
                revoke_grace: Duration::ZERO,
                watchdog: Duration::from_secs(3),
            }
        );
        assert_eq!(c.limits.request_head_bytes, 32768);
        assert_eq!(
            c.log,
            Log::File(PathBuf::from("/var/log/egress/decisions.jsonl"))
        );
        assert_eq!(c.authorities.len(), 2);
        let a = &c.authorities[0];
        assert_eq!(a.grant.name(), "agent-a");
        assert!(a.grant.sni_check());
        assert_eq!(a.token_sha256.unwrap()[..4], [0x9f, 0x86, 0xd0, 0x81]);
        assert_eq!(a.token_sha256.unwrap()[31], 0x08);
        assert_eq!(a.socket_mode, 0o600);
        assert_eq!((a.socket_uid, a.socket_gid), (None, None));
        assert_eq!(
            a.grant.deny_entries().collect::<Vec<_>>(),
            ["*:25", "metadata.google.internal"]
        );
        let b = &c.authorities[1];
        assert_eq!(b.grant.name(), "agent-b");
        assert!(!b.grant.sni_check());
        assert_eq!(b.token_sha256, None);
        assert_eq!(b.socket_mode, 0o660);
        assert_eq!((b.socket_uid, b.socket_gid), (Some(1000), Some(1001)));
        assert_eq!(b.watchdog, "unix:/run/watchdog.sock");
        assert_eq!(b.grant.allow_private().len(), 2);
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse("", "m.toml").unwrap();
        assert_eq!(
            (c.listen.socket_dir, c.listen.tcp, c.listen.admin),
            (None, None, None)
        );
        assert!(c.resolver.nameservers.is_empty() && c.resolver.hosts.is_empty());
        assert_eq!(c.upstream, Upstream::default());
        assert_eq!(
            c.timeouts,
            Timeouts {
                request_head: Duration::from_secs(10),
                dns: Duration::from_secs(5),
                connect: Duration::from_secs(10),
                idle_tunnel: Duration::from_secs(300),
                shutdown_grace: Duration::from_secs(10),
                revoke_grace: Duration::from_secs(5),
                watchdog: Duration::from_secs(2),
            }
        );
        assert_eq!(c.limits.request_head_bytes, 65536);
        assert_eq!(c.log, Log::Stdout);
        assert!(c.tls.ca_dir.is_none() && c.tls.extra_ca_files.is_empty());
        assert!(c.authorities.is_empty());
        let c = parse("[[authority]]\nname = \"a\"\n", "m.toml").unwrap();
        assert!(c.authorities[0].grant.sni_check());
        assert_eq!(c.authorities[0].grant.allow_entries().count(), 0);
        assert_eq!(c.authorities[0].watchdog, "");
    }

    #[test]
    fn every_problem_is_listed_with_its_location() {
        let text = r#"[listen]
socket_dir = "/run/x"
bogus = 1
tcp = "localhost:3128"
admin = "0.0.0.0:9901"

[timeouts]
dns = "five"
connect = 0
idle_tunnel = 100000

[limits]
request_head_bytes = 10

[upstream]
mode = "pac"
parents = ["http://proxy:8080"]

[resolver]
nameservers = ["127.0.0.1"]
hosts = { "127.0.0.1" = ["1.2.3.4"], "a b" = ["1.2.3.4"], "ok.test" = ["nope"], "OK.test" = ["1.1.1.1"], "empty.test" = [] }

[global]
deny = ["*.com", "*:25"]

[[authority]]
name = "agent-a"
allow = ["example.com", "*.com", "a.*.com"]
nope = true
deny = [5]
token_sha256 = "abc"
socket_mode = "0666"
watchdog = "ftp://x"

[[authority]]
allow = ["x.example.com"]

[[authority]]
name = "agent-a"

[[authority]]
name = "bad name"
allow_private = ["10.0.0.1/8"]

[log]
decisions = ""

[extra]
x = 1
"#;
        assert_eq!(
            errors(text),
            vec![
                "m.toml:3:1: [listen]: unknown field `bogus`, expected one of `socket_dir`, `tcp`, `admin`, `admin_socket`, `admin_token_sha256`",
                "m.toml:4:7: [listen]: tcp \"localhost:3128\" is not an ip:port address (write \"127.0.0.1:3128\" or \"[::1]:3128\")",
                "m.toml:5:9: [listen]: admin \"0.0.0.0:9901\" is not a loopback address; the admin API must not be reachable from other hosts",
                "m.toml:8:7: [timeouts]: invalid type: string \"five\", expected u64",
                "m.toml:9:11: [timeouts]: connect = 0 is out of range; give whole seconds 1..=86400",
                "m.toml:10:15: [timeouts]: idle_tunnel = 100000 is out of range; give whole seconds 1..=86400",
                "m.toml:13:22: [limits]: request_head_bytes = 10 is out of range 8192..=1048576",
                "m.toml:16:8: [upstream]: mode = \"pac\" needs pac = \"/path/proxy.pac\" or \"https://host/proxy.pac\"",
                "m.toml:17:11: [upstream]: parents is only used with mode = \"parent\", not \"pac\"",
                "m.toml:20:16: [resolver]: nameserver \"127.0.0.1\" is not an ip:port address (write \"127.0.0.1:53\")",
                "m.toml:21:11: [resolver]: hosts key \"127.0.0.1\" is an IP address; keys must be names",
                "m.toml:21:38: [resolver]: hosts key: invalid host \"a b\": contains the control or space character ' '",
                "m.toml:21:72: [resolver]: hosts entry \"ok.test\": \"nope\" is not an IP address",
                "m.toml:21:81: [resolver]: hosts key \"OK.test\" is the same host as the key at m.toml:21:59",
                "m.toml:21:106: [resolver]: hosts entry \"empty.test\" has no addresses",
                "m.toml:24:9: [global]: invalid global deny entry \"*.com\": wildcard over public suffix \"com\"; write \"*.example.com\" for one domain",
                "m.toml:28:25: authority \"agent-a\": invalid allow entry \"*.com\": wildcard over public suffix \"com\"; write \"*.example.com\" for one domain",
                "m.toml:28:34: authority \"agent-a\": invalid allow entry \"a.*.com\": a wildcard must be a whole first label followed by a domain, like \"*.example.com\"",
                "m.toml:29:1: authority \"agent-a\": unknown field `nope`, expected one of `name`, `allow`, `deny`, `allow_private`, `token_sha256`, `sni_check`, `tls_terminate`, `watchdog`, `socket_mode`, `socket_uid`, `socket_gid`, `request_rule`",
                "m.toml:30:9: authority \"agent-a\": invalid type: integer `5`, expected a string",
                "m.toml:31:16: authority \"agent-a\": token_sha256 must be 64 hex digits (the SHA-256 of a non-empty token); omit the key if the authority does not use the TCP listener",
                "m.toml:32:15: authority \"agent-a\": socket_mode \"0666\": bits for others would let every local user act as this authority; use socket_gid and \"0660\" to share the socket with a group",
                "m.toml:33:12: authority \"agent-a\": watchdog \"ftp://x\" must be \"unix:/absolute/path\" or \"http://127.0.0.1:port/...\" (a loopback IP literal or localhost, no userinfo): the watchdog sees every allowed destination and must run on this host",
                "m.toml:35:1: authority[2]: missing key \"name\"",
                "m.toml:39:8: authority \"agent-a\": duplicate name; first defined at m.toml:27:8",
                "m.toml:42:8: authority \"bad name\": authority name \"bad name\" contains ' '; use only ASCII letters, digits, '-' and '_'",
                "m.toml:43:18: authority \"bad name\": invalid allow_private entry \"10.0.0.1/8\": CIDR has host bits set; write \"10.0.0.0/8\"",
                "m.toml:46:13: [log]: decisions is empty; write \"stdout\" or a file path",
                "m.toml:48:2: unknown top-level key \"extra\"; expected one of listen, resolver, upstream, tls, timeouts, limits, log, global, authority",
            ]
        );
    }

    #[test]
    fn syntax_errors_name_the_file_and_position() {
        assert_eq!(
            errors("[listen\nx = 1\n"),
            vec!["m.toml:1:8: unclosed table, expected `]`"]
        );
        let e = errors("[listen]\ntcp = \"a\"\ntcp = \"b\"\n");
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("m.toml:3:1: duplicate key"), "{e:?}");
    }

    #[test]
    fn authority_must_be_an_array_of_tables() {
        assert_eq!(
            errors("[authority]\nname = \"a\"\n"),
            vec![
                "m.toml:1:1: authority must be an array of tables: write each one as [[authority]]"
            ]
        );
        let e = errors("listen = 5\n");
        assert_eq!(
            e,
            vec!["m.toml:1:10: [listen]: must be a table, not integer"]
        );
    }

    #[test]
    fn upstream_modes() {
        for (text, ok) in [
            ("mode = \"direct\"", true),
            ("mode = \"parent\"", false),
            ("mode = \"parent\"\nparents = [\"http://p:3128\"]", true),
            ("mode = \"env\"", true),
            ("mode = \"pac\"", false),
            ("mode = \"pac\"\npac = \"/etc/p.pac\"", true),
            ("mode = \"socks\"", false),
        ] {
            let r = parse(&format!("[upstream]\n{text}\n"), "m.toml");
            assert_eq!(r.is_ok(), ok, "{text}: {r:?}");
        }
        assert_eq!(
            errors("[upstream]\nmode = \"socks\"\n"),
            vec![
                "m.toml:2:8: [upstream]: unknown mode \"socks\"; expected one of \"direct\", \"parent\", \"env\", \"pac\""
            ]
        );
        assert_eq!(
            errors("[upstream]\npac = \"/etc/p.pac\"\nallowed_parents = [\"p:1\"]\n"),
            vec![
                "m.toml:2:7: [upstream]: pac is only used with mode = \"pac\", not \"direct\"",
                "m.toml:3:19: [upstream]: allowed_parents is only used with mode = \"pac\", not \"direct\"",
            ]
        );
    }

    #[test]
    fn upstream_parent_and_pac_keys() {
        let c = parse(
            r#"[upstream]
mode = "pac"
pac = "https://pac.corp.example/proxy.pac"
allowed_parents = ["Proxy.Corp.Example:8080", "[::1]:1080"]
pac_fetch_via = "http://u:pw@127.0.0.1:3128"
pin_through_parent = false
parent_retry_secs = 5
pac_cache_secs = 0
pac_refresh_secs = 60
pac_budget_ms = 50
pac_memory_mb = 4
pac_on_error = "direct"
parent_credentials_file = "/etc/egress/parents.cred"
"#,
            "m.toml",
        )
        .unwrap();
        let u = c.upstream;
        assert_eq!(u.mode, "pac");
        assert_eq!(
            u.pac,
            Some(PacSource::Url("https://pac.corp.example/proxy.pac".into()))
        );
        let allowed: Vec<String> = u.allowed_parents.iter().map(ToString::to_string).collect();
        assert_eq!(allowed, ["proxy.corp.example:8080", "[::1]:1080"]);
        assert_eq!(
            u.pac_fetch_via.as_ref().map(ToString::to_string).as_deref(),
            Some("http://127.0.0.1:3128")
        );
        assert!(!u.pin_through_parent);
        assert_eq!(u.parent_retry, Duration::from_secs(5));
        assert_eq!(u.pac_cache, Duration::ZERO);
        assert_eq!(u.pac_refresh, Duration::from_secs(60));
        assert_eq!(u.pac_budget, Duration::from_millis(50));
        assert_eq!(u.pac_memory, 4 << 20);
        assert_eq!(u.pac_on_error, PacOnError::Direct);

        let c = parse(
            "[upstream]\nmode = \"parent\"\nparents = [\"http://a:b@p.corp:3128\", \"socks5://127.0.0.1:1080\"]\n",
            "m.toml",
        )
        .unwrap();
        let shown: Vec<String> = c.upstream.parents.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["http://p.corp:3128", "socks5://127.0.0.1:1080"]);

        assert_eq!(
            errors(
                r#"[upstream]
mode = "parent"
parents = ["http://user:s3cret@p:80/x", "https://p:443", "p:3128"]
pac_budget_ms = 0
pac_on_error = "maybe"
parent_credentials_file = "rel"
"#
            ),
            vec![
                "m.toml:3:12: [upstream]: parent \"http://user:***@p:80/x\": a parent URL has no path, query or fragment: write scheme://host:port",
                "m.toml:3:41: [upstream]: parent \"https://p:443\": TLS to a parent proxy (https://) is not supported; use http:// or socks5://",
                "m.toml:3:58: [upstream]: parent \"p:3128\": write scheme://host:port, like \"http://proxy.corp.example:8080\" or \"socks5://127.0.0.1:1080\"",
                "m.toml:4:17: [upstream]: pac_budget_ms = 0 is out of range 1..=10000",
                "m.toml:5:16: [upstream]: pac_on_error \"maybe\": write \"deny\" or \"direct\"",
                "m.toml:6:27: [upstream]: parent_credentials_file must be an absolute path",
            ]
        );
        assert_eq!(
            errors(
                "[upstream]\nmode = \"pac\"\npac = \"/p.pac\"\nallowed_parents = [\"p\"]\npac_fetch_via = \"http://p:1\"\n"
            ),
            vec![
                "m.toml:4:20: [upstream]: allowed_parents entry: invalid host \"p\": a port is required (host:port); write \"host:port\"",
                "m.toml:5:17: [upstream]: pac_fetch_via is only used when pac is an http(s):// URL",
            ]
        );
    }

    #[test]
    fn socket_modes_and_tokens() {
        for (mode, want) in [
            ("0600", Ok(0o600)),
            ("600", Ok(0o600)),
            ("0660", Ok(0o660)),
            ("0640", Ok(0o640)),
        ] {
            assert_eq!(parse_mode(mode), want);
        }
        for bad in [
            "0666", "0601", "4600", "06000", "60", "0x600", "0680", "", "+600",
        ] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
        let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let bytes = parse_sha256(hex).unwrap();
        assert_eq!(bytes[0], 0x9f);
        assert_eq!(parse_sha256(&hex.to_uppercase()), Some(bytes));
        assert_eq!(parse_sha256(&hex[1..]), None);
        assert_eq!(parse_sha256(&format!("{}g", &hex[1..])), None);
        assert_eq!(parse_sha256(&format!("{hex}00")), None);
        assert_eq!(
            parse_sha256("+f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
            None
        );
    }

    #[test]
    fn design_example_wildcard_over_private_psl_suffix_is_accepted() {
        // Design section 11 grants "*.githubusercontent.com"; githubusercontent.com is in
        // the private section of the Public Suffix List, which does not count as public.
        let cfg = parse(
            "[[authority]]\nname = \"agent-a\"\nallow = [\"*.githubusercontent.com\"]\n",
            "m.toml",
        );
        assert!(cfg.is_ok(), "{cfg:?}");
    }

    #[test]
    fn one_authority_from_a_flat_table() {
        let global = vec!["*:25".to_owned()];
        let a = parse_authority(
            "name = \"api-made\"\nallow = [\"origin.test\"]\nallow_private = [\"127.0.0.0/8\"]\n",
            &global,
        )
        .unwrap();
        assert_eq!(a.grant.name(), "api-made");
        assert_eq!(a.grant.deny_entries().collect::<Vec<_>>(), ["*:25"]);
        assert_eq!(a.socket_mode, 0o600);

        let e = parse_authority(
            "name = \"x\"\nallow = [\"ok.test\", \"*.com\"]\nnope = 1\ntoken_sha256 = \"abc\"\n",
            &[],
        )
        .unwrap_err();
        let fields: Vec<&str> = e.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["allow", "nope", "token_sha256"], "{e:?}");
        assert!(
            e[0].message.starts_with("invalid allow entry \"*.com\""),
            "{e:?}"
        );
        assert!(e[1].message.contains("unknown field `nope`"), "{e:?}");

        let e = parse_authority("allow = [\"ok.test\"]\n", &[]).unwrap_err();
        assert_eq!(
            e,
            vec![FieldError {
                field: String::new(),
                message: "missing key \"name\"".into()
            }]
        );
        let e = parse_authority("name = \"bad name\"\n", &[]).unwrap_err();
        assert_eq!(e[0].field, "name", "{e:?}");
        let e = parse_authority("name = \"x\"\nsni_check = \"yes\"\n", &[]).unwrap_err();
        assert_eq!(e[0].field, "sni_check", "{e:?}");
    }

    #[test]
    fn admin_listen_keys() {
        let c = parse(
            "[listen]\nsocket_dir = \"/run/m\"\nadmin_socket = \"/run/admin.sock\"\nadmin_token_sha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"\n[global]\ndeny = [\"*:25\"]\n",
            "m.toml",
        )
        .unwrap();
        assert_eq!(
            c.listen.admin_socket,
            Some(PathBuf::from("/run/admin.sock"))
        );
        assert_eq!(c.listen.admin_token_sha256.unwrap()[0], 0x9f);
        assert_eq!(c.global_deny, ["*:25"]);
        assert_eq!(
            errors(
                "[listen]\nsocket_dir = \"/run/m\"\nadmin_socket = \"/run/m/admin.sock\"\nadmin_token_sha256 = \"x\"\n"
            ),
            vec![
                "m.toml:3:16: [listen]: admin_socket \"/run/m/admin.sock\" is inside socket_dir; the admin API needs a socket of its own, never a channel's",
                "m.toml:4:22: [listen]: admin_token_sha256 must be 64 hex digits (the SHA-256 of a non-empty admin token); omit it for no token",
            ]
        );
        assert_eq!(
            errors("[listen]\nadmin_socket = \"rel.sock\"\n"),
            vec!["m.toml:2:16: [listen]: admin_socket \"rel.sock\" must be an absolute path"]
        );
    }

    #[test]
    fn location_columns_count_characters() {
        let e = errors("# ünïcödé\n[log]\ndecisions = \"\" \n");
        assert_eq!(
            e,
            vec!["m.toml:3:13: [log]: decisions is empty; write \"stdout\" or a file path"]
        );
        let c = Ctx::new("ab\ncdé\nx", "f");
        assert_eq!(c.at(Some(0..1)), "f:1:1");
        assert_eq!(c.at(Some(3..4)), "f:2:1");
        assert_eq!(c.at(Some(5..7)), "f:2:3");
        assert_eq!(c.at(Some(6..7)), "f:2:3");
        assert_eq!(c.at(Some(100..101)), "f:3:2");
        assert_eq!(c.at(Some(8..9)), "f:3:1");
        assert_eq!(c.at(None), "f");
    }
}

#[cfg(test)]
mod request_rule_config_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn request_rules_load_and_errors_are_located() {
        let good = r#"
[tls]
ca_dir = "/tmp/ca"

[[authority]]
name = "agent-a"
allow = ["origin.test"]
tls_terminate = ["origin.test"]

[[authority.request_rule]]
host = "origin.test"
methods = ["GET"]
path_prefixes = ["/public/"]
"#;
        let c = parse(good, "m.toml").unwrap();
        let rules = c.authorities[0].grant.request_rules();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].methods, ["GET"]);
        assert_eq!(rules[0].path_prefixes, ["/public/"]);

        let bad = r#"
[tls]
ca_dir = "/tmp/ca"

[[authority]]
name = "agent-a"
allow = ["origin.test"]
tls_terminate = ["origin.test"]

[[authority.request_rule]]
host = "origin.test"
methods = ["GET"]

[[authority.request_rule]]
host = "other.test"
methods = ["post"]
path_prefixes = ["public"]
"#;
        let Err(PolicyError::Config(errors)) = parse(bad, "m.toml") else {
            panic!("expected errors");
        };
        let joined = errors.join("\n");
        assert!(
            joined.contains("m.toml:14:1: authority \"agent-a\": request_rule[2]: host \"other.test\" is not covered by tls_terminate"),
            "{joined}"
        );
        assert!(
            joined.contains("request_rule[2]: method \"post\""),
            "{joined}"
        );
        assert!(
            joined.contains("request_rule[2]: path prefix \"public\" must start with /"),
            "{joined}"
        );

        let no_ca = good.replace("ca_dir = \"/tmp/ca\"", "");
        let Err(PolicyError::Config(errors)) = parse(&no_ca, "m.toml") else {
            panic!("expected errors");
        };
        assert_eq!(
            errors,
            [
                "m.toml:8:17: authority \"agent-a\": tls_terminate needs the CA that issues the leaf certificates: set [tls] ca_dir (created on first start)"
            ]
        );

        let unknown = format!(
            "{}\n[[authority.request_rule]]\nhost = \"origin.test\"\nnope = 1\n",
            &good[..good.find("[[authority.request_rule]]").unwrap()]
        );
        let Err(PolicyError::Config(errors)) = parse(&unknown, "m.toml") else {
            panic!("expected errors");
        };
        assert!(
            errors[0].contains(
                "unknown field `nope`, expected one of `host`, `methods`, `path_prefixes`"
            ),
            "{errors:?}"
        );
    }
}
