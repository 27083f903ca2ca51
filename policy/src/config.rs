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
use crate::grant::{Grant, GrantSpec};
use crate::host::canonicalize_host;
use crate::pattern::{HostPattern, PatternUse};

/// A validated configuration.
#[derive(Debug)]
pub struct Config {
    /// `[listen]`.
    pub listen: Listen,
    /// `[resolver]`.
    pub resolver: Resolver,
    /// `[upstream]`; only `mode = "direct"` is accepted by this build.
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
}

/// `[resolver]`.
#[derive(Debug, Clone, Default)]
pub struct Resolver {
    /// Explicit nameservers (`ip:port`); empty means the system configuration.
    pub nameservers: Vec<SocketAddr>,
    /// Static answers, consulted before DNS: canonical name -> addresses.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
}

/// `[upstream]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// Only `"direct"` in this build.
    pub mode: String,
    /// Whether CONNECTs to a parent name the pinned IP.
    pub pin_through_parent: bool,
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
/// the others must be at least 1. `[upstream] mode` must be `"direct"` in this build, and
/// `parents`, `pac` and `allowed_parents` must then be empty. `[listen] admin` must be a
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
    parents: Option<Spanned<Vec<String>>>,
    pac: Option<Spanned<String>>,
    allowed_parents: Option<Spanned<Vec<String>>>,
    pin_through_parent: Option<bool>,
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
            None => Some(Upstream {
                mode: "direct".into(),
                pin_through_parent: true,
            }),
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
        Some(Config {
            listen: listen?,
            resolver: resolver?,
            upstream: upstream?,
            timeouts: timeouts?,
            limits: limits?,
            log: log?,
            tls: tls?,
            authorities,
        })
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
        Some(Listen {
            socket_dir,
            tcp,
            admin,
        })
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
            match m.get_ref().as_str() {
                "direct" => {}
                "parent" | "env" | "pac" => self.error(
                    Some(m.span()),
                    what,
                    format!("mode {:?} is not supported by this build yet; use \"direct\"", m.get_ref()),
                ),
                other => self.error(
                    Some(m.span()),
                    what,
                    format!("unknown mode {other:?}; expected one of \"direct\", \"parent\", \"env\", \"pac\""),
                ),
            }
        }
        if mode != "parent" {
            if let Some(p) = raw.parents.as_ref().filter(|p| !p.get_ref().is_empty()) {
                self.error(
                    Some(p.span()),
                    what,
                    format!("parents is only used with mode = \"parent\", not {mode:?}"),
                );
            }
        }
        if mode != "pac" {
            if let Some(p) = raw.pac.as_ref().filter(|p| !p.get_ref().is_empty()) {
                self.error(
                    Some(p.span()),
                    what,
                    format!("pac is only used with mode = \"pac\", not {mode:?}"),
                );
            }
            if let Some(p) = raw
                .allowed_parents
                .as_ref()
                .filter(|p| !p.get_ref().is_empty())
            {
                self.error(
                    Some(p.span()),
                    what,
                    format!("allowed_parents is only used with mode = \"pac\", not {mode:?}"),
                );
            }
        }
        Upstream {
            mode,
            pin_through_parent: raw.pin_through_parent.unwrap_or(true),
        }
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
                    "token_sha256 must be 64 hex digits (the SHA-256 of the token); omit the key if the authority does not use the TCP listener",
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
                    .is_some_and(|r| !r.is_empty());
            if !ok {
                self.error(
                    Some(w.span()),
                    label,
                    format!(
                        "watchdog {:?} must be \"unix:/absolute/path\" or \"http://host:port/...\"",
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

fn covers(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.start < outer.end.max(outer.start + 1)
}

/// Parses 64 hex digits (either case) into 32 bytes.
fn parse_sha256(s: &str) -> Option<[u8; 32]> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 {
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
                mode: "direct".into(),
                pin_through_parent: false
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
        assert_eq!(
            c.upstream,
            Upstream {
                mode: "direct".into(),
                pin_through_parent: true
            }
        );
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
                "m.toml:3:1: [listen]: unknown field `bogus`, expected one of `socket_dir`, `tcp`, `admin`",
                "m.toml:4:7: [listen]: tcp \"localhost:3128\" is not an ip:port address (write \"127.0.0.1:3128\" or \"[::1]:3128\")",
                "m.toml:5:9: [listen]: admin \"0.0.0.0:9901\" is not a loopback address; the admin API must not be reachable from other hosts",
                "m.toml:8:7: [timeouts]: invalid type: string \"five\", expected u64",
                "m.toml:9:11: [timeouts]: connect = 0 is out of range; give whole seconds 1..=86400",
                "m.toml:10:15: [timeouts]: idle_tunnel = 100000 is out of range; give whole seconds 1..=86400",
                "m.toml:13:22: [limits]: request_head_bytes = 10 is out of range 8192..=1048576",
                "m.toml:16:8: [upstream]: mode \"pac\" is not supported by this build yet; use \"direct\"",
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
                "m.toml:29:1: authority \"agent-a\": unknown field `nope`, expected one of `name`, `allow`, `deny`, `allow_private`, `token_sha256`, `sni_check`, `tls_terminate`, `watchdog`, `socket_mode`, `socket_uid`, `socket_gid`",
                "m.toml:30:9: authority \"agent-a\": invalid type: integer `5`, expected a string",
                "m.toml:31:16: authority \"agent-a\": token_sha256 must be 64 hex digits (the SHA-256 of the token); omit the key if the authority does not use the TCP listener",
                "m.toml:32:15: authority \"agent-a\": socket_mode \"0666\": bits for others would let every local user act as this authority; use socket_gid and \"0660\" to share the socket with a group",
                "m.toml:33:12: authority \"agent-a\": watchdog \"ftp://x\" must be \"unix:/absolute/path\" or \"http://host:port/...\"",
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
        for (mode, ok) in [
            ("direct", true),
            ("parent", false),
            ("env", false),
            ("pac", false),
            ("socks", false),
        ] {
            let r = parse(&format!("[upstream]\nmode = \"{mode}\"\n"), "m.toml");
            assert_eq!(r.is_ok(), ok, "{mode}");
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
