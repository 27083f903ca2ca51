//! Grants (design section 4): what one authority may reach, frozen when built. A grant
//! decides on a canonical [`Target`] ([`Grant::decide`]) and then vets the addresses the
//! caller resolved for it ([`Grant::vet`]), producing the [`Pin`]: the only addresses a
//! connection may be made to.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::classify::{AddrClass, classify};
use crate::decision::{Decision, Reason};
use crate::error::PolicyError;
use crate::host::{CanonicalHost, Target};
use crate::pattern::{HostPattern, PatternKind, PatternUse};

/// The unvalidated description of a grant, as written in configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantSpec {
    /// The authority's name: 1..=64 bytes of ASCII letters, digits, `-` and `_`.
    pub name: String,
    /// Allow entries (host patterns, see [`HostPattern::parse`]).
    pub allow: Vec<String>,
    /// Deny entries; deny beats allow. `*` and `*:port` are accepted here.
    pub deny: Vec<String>,
    /// CIDRs exempted from the private/special address check (design section 4.2).
    pub allow_private: Vec<String>,
    /// Require the TLS ClientHello's SNI to equal the CONNECT host on port 443.
    pub sni_check: bool,
    /// Host patterns whose TLS is terminated (design section 9).
    pub tls_terminate: Vec<String>,
    /// Per-request rules inside terminated tunnels (`[[authority.request_rule]]`).
    pub request_rules: Vec<RequestRuleSpec>,
}

/// One per-request rule as written (`[[authority.request_rule]]`): requests to hosts
/// matching `host` are allowed only if some rule for that host allows their method and
/// path. Hosts no rule names are not narrowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestRuleSpec {
    /// A host pattern (as in `allow`; ports allowed) that `tls_terminate` must cover.
    pub host: String,
    /// Allowed methods, exactly as sent (`"GET"`); empty allows every method.
    pub methods: Vec<String>,
    /// Allowed path prefixes (`"/api/"`, `"/v1/repos"`); empty allows every path. A
    /// prefix not ending in `/` matches only at a segment boundary: `/api` matches `/api`
    /// and `/api/x`, not `/apix`.
    pub path_prefixes: Vec<String>,
}

/// One validated per-request rule of a [`Grant`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRule {
    /// Which hosts it narrows.
    pub host: HostPattern,
    /// Allowed methods; empty: every method.
    pub methods: Vec<String>,
    /// Allowed path prefixes; empty: every path.
    pub path_prefixes: Vec<String>,
    /// 1-based position in the grant, for `rule` fields (`request_rule[2] api.example.com`).
    pub position: usize,
}

impl RequestRule {
    fn label(&self) -> String {
        format!("request_rule[{}] {}", self.position, self.host.source)
    }

    fn allows(&self, method: &str, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.iter().any(|m| m == method))
            && (self.path_prefixes.is_empty()
                || self.path_prefixes.iter().any(|p| path_has_prefix(path, p)))
    }

    fn describe(&self) -> String {
        let methods = if self.methods.is_empty() {
            "any method".to_owned()
        } else {
            self.methods.join("|")
        };
        let paths = if self.path_prefixes.is_empty() {
            "any path".to_owned()
        } else {
            self.path_prefixes.join(" ")
        };
        format!("{methods} {paths}")
    }
}

/// Whether `path` is under `prefix`: equal, or continuing it at a `/`.
fn path_has_prefix(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'))
}

/// The path a prefix can judge: `path` with percent-escapes of unreserved characters
/// (RFC 3986 section 2.3: ALPHA / DIGIT / `-` / `_` / `~`) decoded, or why it cannot be
/// judged safely. Origins and frameworks disagree on everything else: `..;/` is `../` to
/// Tomcat, Jetty and Spring; `%252e` is `.` to an origin that decodes twice; `%c0%ae` and
/// `%u002e` are `.` to lenient decoders; `/public/../admin` or `/public%2F..%2Fadmin` are
/// `/admin` to most. So where request rules apply the path must be plain: starting with `/`;
/// no `;`, backslash, whitespace, control or non-ASCII character; every `%` followed by two
/// hex digits that encode an unreserved character other than `.` (so no `%25`, no `%u`,
/// no encoded `.`, `/` or `\`); and, decoded, no `.` or `..` segment.
fn normalize_path(path: &str) -> Result<String, &'static str> {
    if !path.starts_with('/') {
        return Err("the path does not start with /");
    }
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'\\' => return Err("the path contains a backslash"),
            b';' => {
                return Err(
                    "the path contains ; (a path parameter, which some servers read as part of a dot segment)",
                );
            }
            0x80..=0xff => return Err("the path contains a non-ASCII byte"),
            b' ' => return Err("the path contains whitespace"),
            _ if b.is_ascii_control() => return Err("the path contains a control character"),
            b'%' => {
                let hex = |k: usize| bytes.get(i + k).and_then(|&h| (h as char).to_digit(16));
                let (Some(hi), Some(lo)) = (hex(1), hex(2)) else {
                    return Err(
                        "the path has a % that is not followed by two hex digits (such as %u)",
                    );
                };
                let decoded = u8::try_from(hi * 16 + lo).unwrap_or(0xff);
                match decoded {
                    b'%' => {
                        return Err("the path percent-encodes a percent sign (double encoding)");
                    }
                    b'.' | b'/' | b'\\' => {
                        return Err("the path percent-encodes a dot, slash or backslash");
                    }
                    _ if decoded.is_ascii_alphanumeric()
                        || matches!(decoded, b'-' | b'_' | b'~') =>
                    {
                        out.push(char::from(decoded));
                    }
                    _ => {
                        return Err(
                            "the path percent-encodes a character that is not unreserved (only letters, digits, - _ ~ may be encoded)",
                        );
                    }
                }
                i += 3;
                continue;
            }
            _ => out.push(char::from(b)),
        }
        i += 1;
    }
    if out.split('/').any(|seg| seg == "." || seg == "..") {
        return Err("the path has a dot segment (. or ..)");
    }
    Ok(out)
}

/// Validates one method: an RFC 9110 token, with no lowercase letters (methods are
/// case-sensitive; `get` is not `GET`).
fn check_method(m: &str) -> Result<(), String> {
    const TCHAR: &[u8] = b"!#$%&'*+-.^_`|~";
    if m.is_empty() || m.len() > 32 {
        return Err(format!("method {m:?} must be 1..=32 characters"));
    }
    if m.bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(format!(
            "method {m:?} has lowercase letters; methods are case-sensitive: write {:?}",
            m.to_ascii_uppercase()
        ));
    }
    if !m
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || TCHAR.contains(&b))
    {
        return Err(format!("method {m:?} is not an HTTP token"));
    }
    Ok(())
}

/// Validates one path prefix: starts with `/`, no query, fragment, whitespace or control
/// characters, no `%` (write the decoded path), no `*` (prefixes are literal), no dot
/// segments.
fn check_path_prefix(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("path prefix {p:?} must start with /"));
    }
    if let Some(c) = p
        .chars()
        .find(|c| matches!(c, '?' | '#' | '%' | '*' | '\\') || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "path prefix {p:?} contains {c:?}; write a literal path (no query, fragment, percent-encoding or wildcard)"
        ));
    }
    if let Err(why) = normalize_path(p) {
        return Err(format!(
            "path prefix {p:?} can never match a request: {why}"
        ));
    }
    Ok(())
}

/// Whether `outer` (a `tls_terminate` pattern) matches every target `inner` can match.
fn pattern_covers(outer: &HostPattern, inner: &HostPattern) -> bool {
    let port_ok = match (outer.port, inner.port) {
        (None, _) => true,
        (Some(o), Some(i)) => o == i,
        (Some(_), None) => false,
    };
    let host_ok = match (&outer.kind, &inner.kind) {
        (_, PatternKind::Exact(h)) => outer.matches_host(h),
        (PatternKind::Suffix(o), PatternKind::Suffix(i)) => {
            i == o
                || (i.len() > o.len() + 1
                    && i.ends_with(o.as_str())
                    && i.as_bytes()[i.len() - o.len() - 1] == b'.')
        }
        (PatternKind::Net(o), PatternKind::Net(i)) => o.contains(i),
        (PatternKind::Any, _) => true,
        _ => false,
    };
    port_ok && host_ok
}

/// The mediator's own listening addresses; connecting to any of them is always denied
/// (`special_address`), whatever `allow_private` says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnAddrs(pub Vec<SocketAddr>);

impl OwnAddrs {
    /// Whether a connection to `addr` would reach one of the mediator's own listeners. A
    /// listener bound to an unspecified address (`0.0.0.0`, `::`) is reached on its port at
    /// every loopback address and at the unspecified address itself (of either family, as a
    /// dual-stack `::` listener accepts IPv4 too). IPv4-mapped IPv6 addresses are compared
    /// as the IPv4 address they map.
    ///
    /// A listener on an unspecified address is also reachable at each of the host's
    /// interface addresses, which this pure crate cannot know: a caller binding to `0.0.0.0`
    /// or `::` should list those addresses here too.
    pub fn contains(&self, addr: SocketAddr) -> bool {
        let ip = addr.ip().to_canonical();
        self.0.iter().any(|own| {
            if own.port() != addr.port() {
                return false;
            }
            let own_ip = own.ip().to_canonical();
            own_ip == ip || (own_ip.is_unspecified() && (ip.is_loopback() || ip.is_unspecified()))
        })
    }
}

/// The vetted addresses of one connection, in the order the resolver gave them; never
/// empty. Built only by [`Grant::vet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin(Vec<IpAddr>);

impl Pin {
    /// The vetted addresses (at least one).
    pub fn addrs(&self) -> &[IpAddr] {
        &self.0
    }
}

/// One authority's immutable grant. Built only by [`Grant::new`] from a validated spec.
#[derive(Debug)]
pub struct Grant {
    name: String,
    allow: Vec<HostPattern>,
    deny: Vec<HostPattern>,
    allow_private: Vec<IpNet>,
    sni_check: bool,
    tls_terminate: Vec<HostPattern>,
    request_rules: Vec<RequestRule>,
    /// Index into `deny` of the first global deny entry.
    global_deny_from: usize,
    allow_index: RuleIndex,
    deny_index: RuleIndex,
}

/// One problem found while building a grant: which field, which entry of it (0 for
/// `name`), and the full message (`invalid allow entry "*.com": ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntryError {
    pub(crate) field: &'static str,
    pub(crate) index: usize,
    pub(crate) message: String,
}

/// A fast, unkeyed hasher (the FxHash mix) for the rule index. Hash flooding is not a
/// concern: the tables are filled only from configuration, and a lookup with a hostile key
/// costs at most one probe sequence over those fixed entries.
#[derive(Default, Clone, Copy)]
struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;

/// Lookup structure over a list of patterns, so that a decision does not scan every rule:
/// exact hosts and wildcard suffixes are hashed; only CIDRs and `*` are scanned.
#[derive(Debug, Default)]
struct RuleIndex {
    exact: FastMap<CanonicalHost, Vec<usize>>,
    suffix: FastMap<String, Vec<usize>>,
    scanned: Vec<usize>,
}

/// The result of looking a target up in a [`RuleIndex`].
#[derive(Debug, Default, Clone, Copy)]
struct Lookup {
    /// The first pattern (in written order) matching host and port.
    full: Option<usize>,
    /// The first pattern matching the host, whatever its port.
    host_only: Option<usize>,
}

impl RuleIndex {
    fn build(patterns: &[HostPattern]) -> Self {
        let mut index = Self::default();
        for (i, p) in patterns.iter().enumerate() {
            match &p.kind {
                PatternKind::Exact(h) => index.exact.entry(h.clone()).or_default().push(i),
                PatternKind::Suffix(s) => index.suffix.entry(s.clone()).or_default().push(i),
                PatternKind::Net(_) | PatternKind::Any => index.scanned.push(i),
            }
        }
        index
    }

    /// Calls `f` with the index of every pattern whose host part matches `host`, in no
    /// particular order.
    fn for_each_match(
        &self,
        patterns: &[HostPattern],
        host: &CanonicalHost,
        mut f: impl FnMut(usize),
    ) {
        if let Some(list) = self.exact.get(host) {
            list.iter().for_each(|&i| f(i));
        }
        if let Some(name) = host.name() {
            // Every proper suffix after a dot: "a.b.c" -> "b.c", "c".
            for (dot, _) in name.match_indices('.') {
                if let Some(list) = self.suffix.get(&name[dot + 1..]) {
                    list.iter().for_each(|&i| f(i));
                }
            }
        }
        for &i in &self.scanned {
            if patterns[i].matches_host(host) {
                f(i);
            }
        }
    }

    /// The lowest-index patterns matching `target`, on its port and on any port.
    fn lookup(&self, patterns: &[HostPattern], target: &Target) -> Lookup {
        let mut found = Lookup::default();
        self.for_each_match(patterns, &target.host, |i| {
            if found.host_only.is_none_or(|b| i < b) {
                found.host_only = Some(i);
            }
            if patterns[i].port.is_none_or(|p| p == target.port) && found.full.is_none_or(|b| i < b)
            {
                found.full = Some(i);
            }
        });
        found
    }
}

/// Checks an authority name: 1..=64 bytes of ASCII letters, digits, `-` and `_`.
pub(crate) fn check_authority_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("authority name is empty".into());
    }
    if name.len() > 64 {
        return Err(format!("authority name {name:?} is longer than 64 bytes"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(format!(
            "authority name {name:?} contains {c:?}; use only ASCII letters, digits, '-' and '_'"
        ));
    }
    Ok(())
}

/// Parses one `allow_private` entry: a CIDR without host bits, or a single address.
/// Whether `ip` (IPv4-mapped unwrapped) is in 0.0.0.0/8 or is `::`: "this host".
fn is_this_host(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.octets()[0] == 0,
        IpAddr::V6(v6) => v6.is_unspecified(),
    }
}

pub(crate) fn parse_allow_private(entry: &str) -> Result<IpNet, PolicyError> {
    let err = |why: String| PolicyError::Pattern {
        field: "allow_private",
        entry: entry.to_owned(),
        why,
    };
    let net = if entry.contains('/') {
        let net: IpNet = entry
            .parse()
            .map_err(|_| err("not a CIDR; write e.g. \"10.1.0.0/16\" or \"fd00::/8\"".into()))?;
        if net.trunc() != net {
            return Err(err(format!(
                "CIDR has host bits set; write \"{}\"",
                net.trunc()
            )));
        }
        net
    } else {
        let ip: IpAddr = entry.parse().map_err(|_| {
            err("not an IP address or CIDR; write e.g. \"127.0.0.1\" or \"10.1.0.0/16\"".into())
        })?;
        IpNet::from(ip)
    };
    if net.prefix_len() == 0 {
        return Err(err(
            "a /0 exception would switch the address check off; list the ranges needed".into(),
        ));
    }
    // Connecting to an unspecified address reaches this host's own listeners (Linux treats
    // 0.0.0.0 and :: as "this host"), so no exception may cover them.
    let this_host = match net {
        IpNet::V4(n) => n.network().octets()[0] == 0,
        IpNet::V6(n) => {
            n.contains(&std::net::Ipv6Addr::UNSPECIFIED)
                || n.contains(&std::net::Ipv4Addr::UNSPECIFIED.to_ipv6_mapped())
        }
    };
    if this_host {
        return Err(err(
            "0.0.0.0/8 and :: mean \"this host\" (connecting there reaches local listeners); \
             they can never be an exception"
                .into(),
        ));
    }
    Ok(net)
}

impl Grant {
    /// Validates `spec` and freezes it. `global_deny` entries are applied as if they were
    /// part of the grant's deny list (reported with their own source in `rule`).
    ///
    /// # Errors
    /// [`PolicyError::Config`] listing every bad entry (not just the first), each naming
    /// the field and the entry.
    pub fn new(spec: &GrantSpec, global_deny: &[String]) -> Result<Self, PolicyError> {
        Self::build(spec, global_deny)
            .map_err(|errors| PolicyError::Config(errors.into_iter().map(|e| e.message).collect()))
    }

    /// [`Grant::new`] with each problem tied to its field and entry index, so that the
    /// config loader can give file locations. Global deny entries are reported with the
    /// field `"global deny"` and their index in `global_deny`.
    pub(crate) fn build(spec: &GrantSpec, global_deny: &[String]) -> Result<Self, Vec<EntryError>> {
        let mut errors = Vec::new();
        if let Err(message) = check_authority_name(&spec.name) {
            errors.push(EntryError {
                field: "name",
                index: 0,
                message,
            });
        }
        let mut patterns = |field: &'static str, entries: &[String], usage: PatternUse| {
            let mut out = Vec::with_capacity(entries.len());
            for (index, entry) in entries.iter().enumerate() {
                match HostPattern::parse(field, entry, usage) {
                    Ok(p) => out.push(p),
                    Err(e) => errors.push(EntryError {
                        field,
                        index,
                        message: e.to_string(),
                    }),
                }
            }
            out
        };
        let allow = patterns("allow", &spec.allow, PatternUse::Allow);
        let mut deny = patterns("deny", &spec.deny, PatternUse::Deny);
        let global_deny_from = deny.len();
        deny.extend(patterns("global deny", global_deny, PatternUse::Deny));
        let tls_terminate = patterns("tls_terminate", &spec.tls_terminate, PatternUse::Allow);
        let request_rules = build_request_rules(&spec.request_rules, &tls_terminate, &mut errors);
        let mut allow_private = Vec::with_capacity(spec.allow_private.len());
        for (index, entry) in spec.allow_private.iter().enumerate() {
            match parse_allow_private(entry) {
                Ok(net) => allow_private.push(net),
                Err(e) => errors.push(EntryError {
                    field: "allow_private",
                    index,
                    message: e.to_string(),
                }),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Self {
            name: spec.name.clone(),
            allow_index: RuleIndex::build(&allow),
            deny_index: RuleIndex::build(&deny),
            allow,
            deny,
            allow_private,
            sni_check: spec.sni_check,
            tls_terminate,
            request_rules,
            global_deny_from,
        })
    }

    /// The authority's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether SNI must match the CONNECT host (design section 6).
    pub fn sni_check(&self) -> bool {
        self.sni_check
    }

    /// The name-level decision for `target`: deny rules first (`denied_by_rule`), then allow
    /// rules (`allowed`, or `port_not_allowed` when a host matches only on another port, or
    /// `not_in_allowlist`). For an IP-literal target the literal is also classified as by
    /// [`Grant::vet`]. The returned decision names the rule and carries a `hint`.
    ///
    /// When several entries match, the first one written wins (grant deny entries before
    /// global ones). Lookups are hashed, so the cost does not grow with the number of exact
    /// and wildcard entries.
    pub fn decide(&self, target: &Target) -> Decision {
        let name = &self.name;
        // Quoting with plain `"` rather than `{:?}` is safe here: canonical hosts, validated
        // authority names and parsed rule sources hold no quotes or control characters.
        if let Some(i) = self.deny_index.lookup(&self.deny, target).full {
            let rule = &self.deny[i].source;
            let (detail, hint) = if i >= self.global_deny_from {
                (
                    format!("{target} matches entry \"{rule}\" of the global deny list"),
                    "the global deny list applies to every authority; no grant can allow this destination"
                        .to_owned(),
                )
            } else {
                (
                    format!("{target} matches deny entry \"{rule}\" of authority \"{name}\""),
                    format!(
                        "the grant of authority \"{name}\" denies this destination; an operator would have to replace the authority without deny entry \"{rule}\""
                    ),
                )
            };
            return Decision::deny(Reason::DeniedByRule, detail, hint).with_rule(rule.clone());
        }

        let found = self.allow_index.lookup(&self.allow, target);
        let Some(i) = found.full else {
            let hint = format!(
                "add \"{}:{}\" to the allow list of authority \"{name}\"",
                target.host.to_uri_host(),
                target.port
            );
            let Some(first) = found.host_only else {
                return Decision::deny(
                    Reason::NotInAllowlist,
                    format!(
                        "{} is not in the allow list of authority \"{name}\"",
                        target.host
                    ),
                    hint,
                );
            };
            let mut on_other_ports: Vec<usize> = Vec::new();
            self.allow_index
                .for_each_match(&self.allow, &target.host, |i| on_other_ports.push(i));
            on_other_ports.sort_unstable();
            let rules: Vec<String> = on_other_ports
                .iter()
                .map(|&i| format!("\"{}\"", self.allow[i].source))
                .collect();
            return Decision::deny(
                Reason::PortNotAllowed,
                format!(
                    "{} matches allow entries {} of authority \"{name}\", but not on port {}",
                    target.host,
                    rules.join(", "),
                    target.port
                ),
                hint,
            )
            .with_rule(self.allow[first].source.clone());
        };

        if let Some(ip) = target.host.ip() {
            if let Err(denied) = self.vet(target, &[ip], &OwnAddrs::default()) {
                return denied;
            }
        }
        Decision::allow(self.allow[i].source.clone())
    }

    /// Vets the addresses resolved for an allowed `target`. Every address must be
    /// [`crate::AddrClass::Global`] or covered by `allow_private`, and none may be one of
    /// `own` (the mediator's listeners, checked with `target.port`). Fail closed: if *any*
    /// address fails, the whole answer is denied (a mixed answer is a rebinding sign), with
    /// `private_address` or `special_address` and a detail naming the address and its block.
    ///
    /// # Errors
    /// A deny [`Decision`]; `dns_failure` when `addrs` is empty.
    ///
    /// An embedding (IPv4-mapped, NAT64, 6to4, Teredo, ...) is denied unless `allow_private`
    /// covers the IPv6 address itself, always as `special_address` (design section 4.3);
    /// the detail names the embedded IPv4 address and its own class.
    pub fn vet(&self, target: &Target, addrs: &[IpAddr], own: &OwnAddrs) -> Result<Pin, Decision> {
        if addrs.is_empty() {
            return Err(Decision::deny(
                Reason::DnsFailure,
                format!("{} resolved to no addresses", target.host),
                "check that the name exists and has A or AAAA records",
            ));
        }
        for &ip in addrs {
            if own.contains(SocketAddr::new(ip, target.port)) {
                return Err(Decision::deny(
                    Reason::SpecialAddress,
                    format!(
                        "{} is one of the mediator's own listeners",
                        SocketAddr::new(ip, target.port)
                    ),
                    "the mediator does not connect to itself; address the destination directly",
                ));
            }
            // Unspecified addresses reach local listeners: never excepted (defence in
            // depth; `allow_private` cannot name them either).
            if is_this_host(ip) {
                return Err(Decision::deny(
                    Reason::SpecialAddress,
                    format!("{ip} is an unspecified (\"this host\") address, 0.0.0.0/8 or ::"),
                    "the mediator never connects to this host's own addresses",
                ));
            }
            if self.allow_private.iter().any(|net| net.contains(&ip)) {
                continue;
            }
            let (reason, detail) = match classify(ip) {
                AddrClass::Global => continue,
                AddrClass::Private(block) => (
                    Reason::PrivateAddress,
                    format!("{ip} is a private address: {block}"),
                ),
                AddrClass::Special(block) => (
                    Reason::SpecialAddress,
                    format!("{ip} is a special-purpose address: {block}"),
                ),
                // Design sections 4.2/4.3: an embedding is denied as such
                // (special_address), whatever the embedded address; the detail says
                // what is inside and how that address alone would be judged.
                AddrClass::Embedded {
                    kind,
                    embedded,
                    inner_global,
                    inner_private,
                } => (
                    Reason::SpecialAddress,
                    format!(
                        "{ip} embeds the IPv4 address {embedded} ({}): {kind}",
                        match (inner_global, inner_private) {
                            (true, _) => "global",
                            (false, true) => "private",
                            (false, false) => "special",
                        }
                    ),
                ),
            };
            let detail = match target.host.ip() {
                Some(_) => detail,
                None => format!("{} resolved to {ip}; {detail}", target.host),
            };
            let hint = format!(
                "only globally reachable addresses are connected to; if this destination is intended, an operator can add \"{}\" to allow_private of authority {:?}",
                IpNet::from(ip),
                self.name
            );
            return Err(Decision::deny(reason, detail, hint));
        }
        Ok(Pin(addrs.to_vec()))
    }

    /// Whether `target` matches a `tls_terminate` pattern.
    pub fn terminates_tls(&self, target: &Target) -> bool {
        self.tls_terminate.iter().any(|p| p.matches(target))
    }

    /// The per-request rules, in grant order.
    pub fn request_rules(&self) -> &[RequestRule] {
        &self.request_rules
    }

    /// The decision for one request inside a terminated tunnel to `target` (already
    /// allowed by [`Grant::decide`]): when no request rule names the host, `allowed` with no
    /// rule; else `allowed` by the first rule for the host that allows `method` and `path`
    /// (the path without its query; escapes of unreserved characters decoded), or
    /// `denied_by_rule`. A path that a prefix cannot judge safely (see [`normalize_path`]:
    /// dot segments, `;`, backslashes, `%25`, escapes of anything but letters, digits,
    /// `-`, `_`, `~`, malformed escapes, controls, non-ASCII) is `malformed_target` when
    /// rules apply.
    pub fn decide_request(&self, target: &Target, method: &str, path: &str) -> Decision {
        let name = &self.name;
        let rules: Vec<&RequestRule> = self
            .request_rules
            .iter()
            .filter(|r| r.host.matches(target))
            .collect();
        if rules.is_empty() {
            return Decision {
                verdict: crate::decision::Verdict::Allow,
                reason: Reason::Allowed,
                rule: None,
                detail: String::new(),
                hint: String::new(),
            };
        }
        let normalized = match normalize_path(path) {
            Ok(p) => p,
            Err(why) => {
                return Decision::deny(
                    Reason::MalformedTarget,
                    format!("{method} request to {target}: {why}"),
                    "send a normalised path: no dot segments, no ; or backslash, only ASCII without controls or spaces, and percent-escapes only of letters, digits, - _ ~",
                );
            }
        };
        if let Some(rule) = rules.iter().find(|r| r.allows(method, &normalized)) {
            return Decision::allow(rule.label());
        }
        let allowed: Vec<String> = rules.iter().map(|r| r.describe()).collect();
        Decision::deny(
            Reason::DeniedByRule,
            format!(
                "{method} {path} on {} is not allowed by the request rules of authority \"{name}\"",
                target.host
            ),
            format!(
                "the request rules for {} allow only: {}; ask for a [[authority.request_rule]] covering {method} {path}",
                target.host,
                allowed.join("; ")
            ),
        )
        .with_rule(rules.iter().map(|r| r.label()).collect::<Vec<_>>().join(", "))
    }

    /// Field accessors for diagnostics and the admin API.
    pub fn allow_entries(&self) -> impl Iterator<Item = &str> {
        self.allow.iter().map(|p| p.source.as_str())
    }

    /// The deny entries, grant entries first, then global ones.
    pub fn deny_entries(&self) -> impl Iterator<Item = &str> {
        self.deny.iter().map(|p| p.source.as_str())
    }

    /// The `allow_private` CIDRs.
    pub fn allow_private(&self) -> &[IpNet] {
        &self.allow_private
    }
}

fn build_request_rules(
    specs: &[RequestRuleSpec],
    tls_terminate: &[HostPattern],
    errors: &mut Vec<EntryError>,
) -> Vec<RequestRule> {
    let mut out = Vec::with_capacity(specs.len());
    for (index, spec) in specs.iter().enumerate() {
        let position = index + 1;
        let mut fail = |message: String| {
            errors.push(EntryError {
                field: "request_rule",
                index,
                message: format!("request_rule[{position}]: {message}"),
            });
        };
        let host = match HostPattern::parse("request_rule host", &spec.host, PatternUse::Allow) {
            Ok(h) => h,
            Err(e) => {
                fail(e.to_string());
                continue;
            }
        };
        let mut ok = true;
        if !tls_terminate.iter().any(|t| pattern_covers(t, &host)) {
            fail(format!(
                "host {:?} is not covered by tls_terminate, so the rule could not be enforced inside its TLS tunnels; add {:?} to tls_terminate",
                spec.host, spec.host
            ));
            ok = false;
        }
        for m in &spec.methods {
            if let Err(e) = check_method(m) {
                fail(e);
                ok = false;
            }
        }
        for p in &spec.path_prefixes {
            if let Err(e) = check_path_prefix(p) {
                fail(e);
                ok = false;
            }
        }
        if ok {
            out.push(RequestRule {
                host,
                methods: spec.methods.clone(),
                path_prefixes: spec.path_prefixes.clone(),
                position,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::parse_authority_form;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn grant(allow: &[&str], deny: &[&str], allow_private: &[&str], global: &[&str]) -> Grant {
        let spec = GrantSpec {
            name: "agent-a".into(),
            allow: strings(allow),
            deny: strings(deny),
            allow_private: strings(allow_private),
            sni_check: true,
            tls_terminate: Vec::new(),
            request_rules: Vec::new(),
        };
        Grant::new(&spec, &strings(global)).unwrap()
    }

    fn target(s: &str) -> Target {
        parse_authority_form(s).unwrap()
    }

    /// Target, expected reason, expected rule.
    const DECIDE: &[(&str, Reason, Option<&str>)] = &[
        (
            "api.github.com:443",
            Reason::Allowed,
            Some("api.github.com"),
        ),
        (
            "API.GitHub.com.:8080",
            Reason::Allowed,
            Some("api.github.com"),
        ),
        ("github.com:443", Reason::NotInAllowlist, None),
        (
            "raw.example.net:443",
            Reason::Allowed,
            Some("*.example.net"),
        ),
        ("a.b.example.net:1", Reason::Allowed, Some("*.example.net")),
        ("example.net:443", Reason::NotInAllowlist, None),
        (
            "registry.npmjs.org:443",
            Reason::Allowed,
            Some("registry.npmjs.org:443"),
        ),
        (
            "registry.npmjs.org:80",
            Reason::PortNotAllowed,
            Some("registry.npmjs.org:443"),
        ),
        (
            "secret.example.net:443",
            Reason::DeniedByRule,
            Some("secret.example.net"),
        ),
        (
            "x.internal.example.net:443",
            Reason::DeniedByRule,
            Some("*.internal.example.net"),
        ),
        (
            "internal.example.net:443",
            Reason::Allowed,
            Some("*.example.net"),
        ),
        ("smtp.example.net:25", Reason::DeniedByRule, Some("*:25")),
        (
            "smtp.example.net:587",
            Reason::Allowed,
            Some("*.example.net"),
        ),
        (
            "evil.example:443",
            Reason::DeniedByRule,
            Some("evil.example"),
        ),
        (
            "multi.example.org:22",
            Reason::PortNotAllowed,
            Some("multi.example.org:443"),
        ),
        (
            "multi.example.org:8443",
            Reason::Allowed,
            Some("multi.example.org:8443"),
        ),
        ("8.8.8.8:53", Reason::Allowed, Some("8.8.8.0/24")),
        ("8.8.4.4:53", Reason::NotInAllowlist, None),
        (
            "[2606:4700:4700::1111]:443",
            Reason::Allowed,
            Some("2606:4700::/32"),
        ),
        ("[::ffff:8.8.8.8]:53", Reason::Allowed, Some("8.8.8.0/24")),
        ("127.0.0.1:8080", Reason::PrivateAddress, None),
        ("10.1.2.3:443", Reason::Allowed, Some("10.0.0.0/8")),
        ("10.2.0.1:443", Reason::PrivateAddress, None),
        ("192.0.2.1:443", Reason::SpecialAddress, None),
        ("[2001:db8::1]:443", Reason::SpecialAddress, None),
        ("[64:ff9b::a01:203]:443", Reason::SpecialAddress, None),
        ("[64:ff9b::808:808]:443", Reason::SpecialAddress, None),
        (
            "198.51.100.7:443",
            Reason::DeniedByRule,
            Some("198.51.100.0/24"),
        ),
        (
            "blocked.example.com:443",
            Reason::DeniedByRule,
            Some("blocked.example.com"),
        ),
    ];

    fn decide_grant() -> Grant {
        grant(
            &[
                "api.github.com",
                "*.example.net",
                "registry.npmjs.org:443",
                "multi.example.org:443",
                "multi.example.org:8443",
                "evil.example",
                "8.8.8.0/24",
                "2606:4700::/32",
                "127.0.0.1",
                "10.0.0.0/8",
                "192.0.2.1",
                "2001:db8::/32",
                "64:ff9b::/96",
                "198.51.100.0/24",
                "blocked.example.com",
            ],
            &[
                "secret.example.net",
                "*.internal.example.net",
                "*:25",
                "evil.example",
                "198.51.100.0/24",
            ],
            &["10.1.0.0/16"],
            &["blocked.example.com"],
        )
    }

    #[test]
    fn decide_table() {
        let g = decide_grant();
        let mut failures = Vec::new();
        for (t, reason, rule) in DECIDE {
            let d = g.decide(&target(t));
            if d.reason != *reason
                || d.rule.as_deref() != *rule
                || d.is_allow() != (*reason == Reason::Allowed)
            {
                failures.push(format!("{t}: want {reason} {rule:?}, got {d:?}"));
            }
        }
        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn decide_details_and_hints() {
        let g = decide_grant();
        let d = g.decide(&target("github.com:443"));
        assert_eq!(
            d.detail,
            "github.com is not in the allow list of authority \"agent-a\""
        );
        assert_eq!(
            d.hint,
            "add \"github.com:443\" to the allow list of authority \"agent-a\""
        );
        let d = g.decide(&target("[2001:db8::5]:8443"));
        assert_eq!(d.reason, Reason::SpecialAddress);
        assert_eq!(
            d.detail,
            "2001:db8::5 is a special-purpose address: documentation (2001:db8::/32, RFC 3849)"
        );
        let d = g.decide(&target("[2a00::1]:443"));
        assert_eq!(
            d.hint,
            "add \"[2a00::1]:443\" to the allow list of authority \"agent-a\""
        );
        let d = g.decide(&target("multi.example.org:22"));
        assert_eq!(
            d.detail,
            "multi.example.org matches allow entries \"multi.example.org:443\", \"multi.example.org:8443\" of authority \"agent-a\", but not on port 22"
        );
        assert_eq!(
            d.hint,
            "add \"multi.example.org:22\" to the allow list of authority \"agent-a\""
        );
        let d = g.decide(&target("blocked.example.com:443"));
        assert_eq!(
            d.detail,
            "blocked.example.com:443 matches entry \"blocked.example.com\" of the global deny list"
        );
        let d = g.decide(&target("secret.example.net:443"));
        assert_eq!(
            d.detail,
            "secret.example.net:443 matches deny entry \"secret.example.net\" of authority \"agent-a\""
        );
        let d = g.decide(&target("api.github.com:443"));
        assert_eq!(d, Decision::allow("api.github.com"));
    }

    #[test]
    fn first_written_rule_wins() {
        let g = grant(
            &["*.example.com:443", "a.example.com", "*.a.example.com"],
            &[],
            &[],
            &[],
        );
        assert_eq!(
            g.decide(&target("a.example.com:443")).rule.as_deref(),
            Some("*.example.com:443")
        );
        assert_eq!(
            g.decide(&target("a.example.com:80")).rule.as_deref(),
            Some("a.example.com")
        );
        assert_eq!(
            g.decide(&target("b.a.example.com:80")).rule.as_deref(),
            Some("*.a.example.com")
        );
        // A port-specific deny does not deny other ports.
        let g = grant(&["example.com"], &["example.com:22"], &[], &[]);
        assert_eq!(
            g.decide(&target("example.com:22")).reason,
            Reason::DeniedByRule
        );
        assert_eq!(g.decide(&target("example.com:443")).reason, Reason::Allowed);
        // A global deny of everything beats every allow.
        let g = grant(&["example.com"], &[], &[], &["*"]);
        let d = g.decide(&target("example.com:443"));
        assert_eq!(
            (d.reason, d.rule.as_deref()),
            (Reason::DeniedByRule, Some("*"))
        );
    }

    #[test]
    fn decide_with_ten_thousand_rules_uses_the_index() {
        let allow: Vec<String> = (0..5000)
            .flat_map(|i| {
                [
                    format!("host{i}.example.com:443"),
                    format!("*.zone{i}.example.org"),
                ]
            })
            .collect();
        let deny: Vec<String> = (0..100)
            .map(|i| format!("bad{i}.zone7.example.org"))
            .collect();
        let spec = GrantSpec {
            name: "bulk".into(),
            allow,
            deny,
            ..GrantSpec::default()
        };
        let g = Grant::new(&spec, &[]).unwrap();
        assert_eq!(g.allow_index.scanned.len(), 0);
        assert_eq!(
            g.decide(&target("host4999.example.com:443")).reason,
            Reason::Allowed
        );
        assert_eq!(
            g.decide(&target("host4999.example.com:80")).reason,
            Reason::PortNotAllowed
        );
        assert_eq!(
            g.decide(&target("a.b.zone4321.example.org:9"))
                .rule
                .as_deref(),
            Some("*.zone4321.example.org")
        );
        assert_eq!(
            g.decide(&target("bad5.zone7.example.org:443")).reason,
            Reason::DeniedByRule
        );
        assert_eq!(
            g.decide(&target("zone7.example.org:443")).reason,
            Reason::NotInAllowlist
        );
        assert_eq!(
            g.decide(&target("host5000.example.com:443")).reason,
            Reason::NotInAllowlist
        );
    }

    #[test]
    fn new_reports_every_bad_entry() {
        let spec = GrantSpec {
            name: "bad name".into(),
            allow: strings(&["ok.example.com", "*.com", "*", "a.*.com"]),
            deny: strings(&["*", "user@x.com"]),
            allow_private: strings(&["10.0.0.1/8", "localhost", "0.0.0.0/0", "127.0.0.1"]),
            sni_check: false,
            tls_terminate: strings(&["*.co.uk"]),
            request_rules: Vec::new(),
        };
        let Err(PolicyError::Config(errors)) = Grant::new(&spec, &strings(&["*.", "*:25"])) else {
            panic!("expected a config error");
        };
        assert_eq!(
            errors,
            vec![
                "authority name \"bad name\" contains ' '; use only ASCII letters, digits, '-' and '_'",
                "invalid allow entry \"*.com\": wildcard over public suffix \"com\"; write \"*.example.com\" for one domain",
                "invalid allow entry \"*\": '*' would allow every host; list the hosts (or \"*.example.com\" for one domain)",
                "invalid allow entry \"a.*.com\": a wildcard must be a whole first label followed by a domain, like \"*.example.com\"",
                "invalid deny entry \"user@x.com\": userinfo ('@') is not allowed; write only the host",
                "invalid global deny entry \"*.\": a wildcard needs a domain after \"*.\", like \"*.example.com\"",
                "invalid tls_terminate entry \"*.co.uk\": wildcard over public suffix \"co.uk\"; write \"*.example.co.uk\" for one domain",
                "invalid allow_private entry \"10.0.0.1/8\": CIDR has host bits set; write \"10.0.0.0/8\"",
                "invalid allow_private entry \"localhost\": not an IP address or CIDR; write e.g. \"127.0.0.1\" or \"10.1.0.0/16\"",
                "invalid allow_private entry \"0.0.0.0/0\": a /0 exception would switch the address check off; list the ranges needed",
            ]
        );
    }

    #[test]
    fn this_host_addresses_can_never_be_excepted() {
        // Connecting to 0.0.0.0 or :: reaches this host's own listeners (admin API
        // included), so neither allow_private nor anything else may open them.
        for entry in [
            "0.0.0.0/8",
            "0.0.0.0",
            "0.1.2.3/32",
            "::/127",
            "::",
            "::ffff:0.0.0.0/104",
        ] {
            let err = parse_allow_private(entry).expect_err(entry);
            assert!(err.to_string().contains("this host"), "{entry}: {err}");
        }
        let spec = GrantSpec {
            name: "a".into(),
            allow: strings(&["zero.test", "0.0.0.0"]),
            allow_private: strings(&["127.0.0.0/8"]),
            ..GrantSpec::default()
        };
        let g = Grant::new(&spec, &[]).unwrap();
        for ip in ["0.0.0.0", "0.0.0.7", "::", "::ffff:0.0.0.0"] {
            let t = parse_authority_form("zero.test:9901").unwrap();
            let d = g
                .vet(&t, &[ip.parse().unwrap()], &OwnAddrs::default())
                .unwrap_err();
            assert_eq!(d.reason, Reason::SpecialAddress, "{ip}: {d:?}");
        }
        let lit = parse_authority_form("0.0.0.0:9901").unwrap();
        assert_eq!(g.decide(&lit).reason, Reason::SpecialAddress);
    }

    #[test]
    fn authority_names() {
        for ok in ["a", "agent-a", "Agent_B-2", &"x".repeat(64)] {
            assert_eq!(check_authority_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a b", "a/b", "a.b", "ä", "a\n", &"x".repeat(65)] {
            assert!(check_authority_name(bad).is_err(), "{bad:?}");
        }
    }

    fn ips(v: &[&str]) -> Vec<IpAddr> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    /// Resolved addresses, allow_private, expected result (`Ok` or the deny reason).
    type VetRow = (
        &'static [&'static str],
        &'static [&'static str],
        Result<(), Reason>,
    );

    const VET: &[VetRow] = &[
        (&["93.184.216.34"], &[], Ok(())),
        (&["93.184.216.34", "2606:2800:220:1::1"], &[], Ok(())),
        (&[], &[], Err(Reason::DnsFailure)),
        (&["127.0.0.1"], &[], Err(Reason::PrivateAddress)),
        (
            &["93.184.216.34", "127.0.0.1"],
            &[],
            Err(Reason::PrivateAddress),
        ),
        (
            &["127.0.0.1", "93.184.216.34"],
            &[],
            Err(Reason::PrivateAddress),
        ),
        (&["127.0.0.1"], &["127.0.0.0/8"], Ok(())),
        (&["127.0.0.1"], &["127.0.0.1"], Ok(())),
        (&["127.0.0.2"], &["127.0.0.1"], Err(Reason::PrivateAddress)),
        (&["10.0.0.1"], &[], Err(Reason::PrivateAddress)),
        (&["100.64.0.1"], &[], Err(Reason::PrivateAddress)),
        (&["169.254.169.254"], &[], Err(Reason::PrivateAddress)),
        (
            &["169.254.169.254"],
            &["10.0.0.0/8"],
            Err(Reason::PrivateAddress),
        ),
        (&["0.0.0.0"], &[], Err(Reason::SpecialAddress)),
        (&["192.0.2.1"], &[], Err(Reason::SpecialAddress)),
        (&["192.0.2.1"], &["192.0.2.0/24"], Ok(())),
        (&["224.0.0.251"], &[], Err(Reason::SpecialAddress)),
        (&["255.255.255.255"], &[], Err(Reason::SpecialAddress)),
        (&["::1"], &[], Err(Reason::PrivateAddress)),
        (&["::1"], &["::1"], Ok(())),
        (&["::"], &[], Err(Reason::SpecialAddress)),
        (&["fd00::1"], &[], Err(Reason::PrivateAddress)),
        (&["fe80::1"], &[], Err(Reason::PrivateAddress)),
        (&["::ffff:127.0.0.1"], &[], Err(Reason::SpecialAddress)),
        (
            &["::ffff:127.0.0.1"],
            &["127.0.0.0/8"],
            Err(Reason::SpecialAddress),
        ),
        (&["::ffff:127.0.0.1"], &["::ffff:127.0.0.0/104"], Ok(())),
        (&["::ffff:8.8.8.8"], &[], Err(Reason::SpecialAddress)),
        (&["64:ff9b::808:808"], &[], Err(Reason::SpecialAddress)),
        (&["64:ff9b::a00:1"], &[], Err(Reason::SpecialAddress)),
        (&["64:ff9b::808:808"], &["64:ff9b::/96"], Ok(())),
        (&["2002:a00:1::1"], &[], Err(Reason::SpecialAddress)),
        (
            &["2001:0:4136:e378:8000:63bf:f7f7:f7f7"],
            &[],
            Err(Reason::SpecialAddress),
        ),
        (&["2001:db8::1"], &[], Err(Reason::SpecialAddress)),
        (&["4000::1"], &[], Err(Reason::SpecialAddress)),
    ];

    #[test]
    fn vet_table() {
        let t = target("origin.example:443");
        let mut failures = Vec::new();
        for (addrs, private, want) in VET {
            let g = grant(&["origin.example"], &[], private, &[]);
            let addrs = ips(addrs);
            let got = g.vet(&t, &addrs, &OwnAddrs::default());
            let ok = match (&got, want) {
                (Ok(pin), Ok(())) => pin.addrs() == addrs.as_slice(),
                (Err(d), Err(reason)) => d.reason == *reason && !d.is_allow(),
                _ => false,
            };
            if !ok {
                failures.push(format!(
                    "{addrs:?} with {private:?}: want {want:?}, got {got:?}"
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn vet_details() {
        let g = grant(&["origin.example"], &[], &[], &[]);
        let d = g
            .vet(
                &target("origin.example:443"),
                &ips(&["93.184.216.34", "10.0.0.7"]),
                &OwnAddrs::default(),
            )
            .unwrap_err();
        assert_eq!(
            d.detail,
            "origin.example resolved to 10.0.0.7; 10.0.0.7 is a private address: private-use (10.0.0.0/8, RFC 1918)"
        );
        assert_eq!(
            d.hint,
            "only globally reachable addresses are connected to; if this destination is intended, an operator can add \"10.0.0.7/32\" to allow_private of authority \"agent-a\""
        );
        let d = g
            .vet(
                &target("origin.example:443"),
                &ips(&["64:ff9b::808:808"]),
                &OwnAddrs::default(),
            )
            .unwrap_err();
        assert_eq!(
            d.detail,
            "origin.example resolved to 64:ff9b::808:808; 64:ff9b::808:808 embeds the IPv4 address 8.8.8.8 (global): NAT64 (64:ff9b::/96, RFC 6052)"
        );
    }

    #[test]
    fn own_listeners_are_always_denied() {
        let own = OwnAddrs(vec![
            "127.0.0.1:3128".parse().unwrap(),
            "[::]:9901".parse().unwrap(),
        ]);
        let g = grant(&["origin.example"], &[], &["127.0.0.0/8", "::1"], &[]);
        let t = target("origin.example:3128");
        let d = g.vet(&t, &ips(&["127.0.0.1"]), &own).unwrap_err();
        assert_eq!(d.reason, Reason::SpecialAddress);
        assert_eq!(
            d.detail,
            "127.0.0.1:3128 is one of the mediator's own listeners"
        );
        assert_eq!(
            g.vet(&t, &ips(&["::ffff:127.0.0.1"]), &own)
                .unwrap_err()
                .reason,
            Reason::SpecialAddress
        );
        // Another loopback address on the same port is not that listener.
        assert!(g.vet(&t, &ips(&["127.0.0.2"]), &own).is_ok());
        // Another port is fine (allow_private covers loopback here).
        assert!(
            g.vet(&target("origin.example:8080"), &ips(&["127.0.0.1"]), &own)
                .is_ok()
        );
        // The unspecified listener is reached at every loopback address on its port.
        let t = target("origin.example:9901");
        for a in ["127.0.0.1", "127.9.9.9", "::1", "0.0.0.0", "::"] {
            assert_eq!(
                g.vet(&t, &ips(&[a]), &own).unwrap_err().reason,
                Reason::SpecialAddress,
                "{a}"
            );
        }
    }

    #[test]
    fn own_addrs_contains() {
        let own = OwnAddrs(vec![
            "0.0.0.0:3128".parse().unwrap(),
            "[2001:db8::5]:443".parse().unwrap(),
        ]);
        let yes = [
            "127.0.0.1:3128",
            "127.1.2.3:3128",
            "[::1]:3128",
            "0.0.0.0:3128",
            "[::ffff:127.0.0.1]:3128",
            "[2001:db8::5]:443",
        ];
        let no = [
            "127.0.0.1:3129",
            "8.8.8.8:3128",
            "[2001:db8::6]:443",
            "[2001:db8::5]:444",
        ];
        for a in yes {
            assert!(own.contains(a.parse().unwrap()), "{a}");
        }
        for a in no {
            assert!(!own.contains(a.parse().unwrap()), "{a}");
        }
        assert!(!OwnAddrs::default().contains("127.0.0.1:1".parse().unwrap()));
    }

    #[test]
    fn accessors_and_tls_terminate() {
        let spec = GrantSpec {
            name: "agent-b".into(),
            allow: strings(&["*.example.com", "example.com"]),
            deny: strings(&["bad.example.com"]),
            allow_private: strings(&["127.0.0.1"]),
            sni_check: true,
            tls_terminate: strings(&["*.example.com"]),
            request_rules: Vec::new(),
        };
        let g = Grant::new(&spec, &strings(&["*:25"])).unwrap();
        assert_eq!(g.name(), "agent-b");
        assert!(g.sni_check());
        assert_eq!(
            g.allow_entries().collect::<Vec<_>>(),
            ["*.example.com", "example.com"]
        );
        assert_eq!(
            g.deny_entries().collect::<Vec<_>>(),
            ["bad.example.com", "*:25"]
        );
        assert_eq!(
            g.allow_private(),
            &["127.0.0.1/32".parse::<IpNet>().unwrap()]
        );
        assert!(g.terminates_tls(&target("a.example.com:443")));
        assert!(!g.terminates_tls(&target("example.com:443")));
    }
}

#[cfg(test)]
mod request_rule_tests {
    use super::*;
    use crate::host::parse_authority_form;

    fn rule(host: &str, methods: &[&str], paths: &[&str]) -> RequestRuleSpec {
        RequestRuleSpec {
            host: host.into(),
            methods: methods.iter().map(|s| (*s).to_owned()).collect(),
            path_prefixes: paths.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn grant(terminate: &[&str], rules: Vec<RequestRuleSpec>) -> Result<Grant, PolicyError> {
        let spec = GrantSpec {
            name: "agent-a".into(),
            allow: vec!["*.example.com".into(), "api.example.com".into()],
            tls_terminate: terminate.iter().map(|s| (*s).to_owned()).collect(),
            request_rules: rules,
            sni_check: true,
            ..GrantSpec::default()
        };
        Grant::new(&spec, &[])
    }

    #[test]
    fn request_rules_narrow_by_method_and_path_prefix() {
        let g = grant(
            &["api.example.com", "*.example.com"],
            vec![
                rule(
                    "api.example.com",
                    &["GET", "HEAD"],
                    &["/public/", "/v1/repos"],
                ),
                rule("api.example.com:443", &["POST"], &["/v1/repos/x/issues"]),
            ],
        )
        .unwrap();
        let api = parse_authority_form("api.example.com:443").unwrap();
        let other = parse_authority_form("www.example.com:443").unwrap();
        // (target, method, path, reason, rule)
        let rows: &[(&Target, &str, &str, &str, Option<&str>)] = &[
            (
                &api,
                "GET",
                "/public/",
                "allowed",
                Some("request_rule[1] api.example.com"),
            ),
            (
                &api,
                "GET",
                "/public/a/b",
                "allowed",
                Some("request_rule[1] api.example.com"),
            ),
            (
                &api,
                "HEAD",
                "/v1/repos",
                "allowed",
                Some("request_rule[1] api.example.com"),
            ),
            (
                &api,
                "GET",
                "/v1/repos/x",
                "allowed",
                Some("request_rule[1] api.example.com"),
            ),
            (&api, "GET", "/v1/reposx", "denied_by_rule", None),
            (&api, "GET", "/public", "denied_by_rule", None),
            (&api, "POST", "/public/upload", "denied_by_rule", None),
            (&api, "get", "/public/", "denied_by_rule", None),
            (
                &api,
                "POST",
                "/v1/repos/x/issues",
                "allowed",
                Some("request_rule[2] api.example.com:443"),
            ),
            (&api, "GET", "/admin", "denied_by_rule", None),
            (&api, "GET", "/public/../admin", "malformed_target", None),
            (
                &api,
                "GET",
                "/public/%2e%2e/admin",
                "malformed_target",
                None,
            ),
            (&api, "GET", "/public%2Fadmin", "malformed_target", None),
            (&api, "GET", "/public/..\\admin", "malformed_target", None),
            (&api, "OPTIONS", "*", "malformed_target", None),
            // No rule names www.example.com: not narrowed.
            (&other, "POST", "/anything/../x", "allowed", None),
        ];
        for (target, method, path, reason, rule) in rows {
            let d = g.decide_request(target, method, path);
            assert_eq!(
                d.reason.as_str(),
                *reason,
                "{method} {path} on {target}: {d:?}"
            );
            if let Some(rule) = rule {
                assert_eq!(d.rule.as_deref(), Some(*rule), "{method} {path}");
            }
            if !d.is_allow() {
                assert!(!d.hint.is_empty());
                assert!(
                    d.detail.contains(path) || *reason == "malformed_target",
                    "{d:?}"
                );
            }
        }
        // The port of a rule counts: on :8443 only rule 1 applies.
        let api8443 = parse_authority_form("api.example.com:8443").unwrap();
        assert!(
            !g.decide_request(&api8443, "POST", "/v1/repos/x/issues")
                .is_allow()
        );
        assert!(g.decide_request(&api8443, "GET", "/public/").is_allow());
    }

    /// Paths that some origin (Tomcat, Jetty, Spring, IIS, double-decoding proxies) serves
    /// outside `/allowed` must be refused where rules apply; plain paths still pass.
    #[test]
    fn path_rule_escapes_are_malformed_and_plain_paths_pass() {
        let g = grant(
            &["api.example.com"],
            vec![rule("api.example.com", &["GET"], &["/allowed"])],
        )
        .unwrap();
        let api = parse_authority_form("api.example.com:443").unwrap();
        // (path, expected reason, a word the detail must contain)
        let rows: &[(&str, &str, &str)] = &[
            ("/allowed/..;/admin", "malformed_target", ";"),
            ("/allowed/..%3b/admin", "malformed_target", "not unreserved"),
            ("/allowed/..%3B/admin", "malformed_target", "not unreserved"),
            ("/allowed/.;/admin", "malformed_target", ";"),
            ("/allowed/..;jsessionid=x/admin", "malformed_target", ";"),
            ("/allowed;x=1", "malformed_target", ";"),
            ("/allowed/%252e%252e/admin", "malformed_target", "double"),
            ("/allowed%252fadmin", "malformed_target", "double"),
            ("/allowed/%25", "malformed_target", "double"),
            (
                "/allowed/%c0%ae%c0%ae/admin",
                "malformed_target",
                "not unreserved",
            ),
            (
                "/allowed/%C0%AE/admin",
                "malformed_target",
                "not unreserved",
            ),
            (
                "/allowed/%u002e%u002e/admin",
                "malformed_target",
                "two hex digits",
            ),
            (
                "/allowed/%U002E/admin",
                "malformed_target",
                "two hex digits",
            ),
            ("/allowed/%", "malformed_target", "two hex digits"),
            ("/allowed/%4", "malformed_target", "two hex digits"),
            ("/allowed/%zz", "malformed_target", "two hex digits"),
            ("/allowed/..%09/admin", "malformed_target", "not unreserved"),
            ("/allowed/..%00/admin", "malformed_target", "not unreserved"),
            ("/allowed/..\\admin", "malformed_target", "backslash"),
            ("/allowed/..\u{9}/admin", "malformed_target", "control"),
            ("/allowed/\u{7f}", "malformed_target", "control"),
            ("/allowed/x y", "malformed_target", "whitespace"),
            ("/allowed/\u{e9}", "malformed_target", "non-ASCII"),
            ("/allowed/%2e%2e/admin", "malformed_target", "dot"),
            ("/allowed/%2E./admin", "malformed_target", "dot"),
            ("/allowed/.%2e/admin", "malformed_target", "dot"),
            ("/allowed%2fadmin", "malformed_target", "slash"),
            ("/allowed%5c..%5cadmin", "malformed_target", "backslash"),
            ("/allowed/%20", "malformed_target", "not unreserved"),
            ("/allowed/%3f", "malformed_target", "not unreserved"),
            ("/allowed/../admin", "malformed_target", "dot segment"),
            ("/allowed/./x", "malformed_target", "dot segment"),
            ("/allowed/..", "malformed_target", "dot segment"),
            ("allowed", "malformed_target", "start with /"),
            ("*", "malformed_target", "start with /"),
            // Plain paths: judged by the prefix.
            ("/allowed", "allowed", ""),
            ("/allowed/", "allowed", ""),
            ("/allowed/a-b_c~d/e.json", "allowed", ""),
            ("/allowed/...", "allowed", ""),
            ("/allowed/.well-known/x", "allowed", ""),
            ("/allowed/a:b@c!$&'()*+,=", "allowed", ""),
            // Escapes of unreserved characters are decoded before matching.
            ("/%61llowed/x", "allowed", ""),
            ("/allowed/%7Euser%2D1", "allowed", ""),
            ("/allowe%64x", "denied_by_rule", ""),
            ("/admin", "denied_by_rule", ""),
            ("/allowedx", "denied_by_rule", ""),
        ];
        for (path, reason, word) in rows {
            let d = g.decide_request(&api, "GET", path);
            assert_eq!(d.reason.as_str(), *reason, "{path:?}: {d:?}");
            assert!(d.detail.contains(word), "{path:?}: {d:?}");
        }
        // A query is not part of the path a rule judges (callers pass the path alone).
        assert!(g.decide_request(&api, "GET", "/allowed/e.json").is_allow());
        // Hosts no rule names are not narrowed, whatever the path.
        let other = parse_authority_form("www.example.com:443").unwrap();
        assert!(
            g.decide_request(&other, "GET", "/allowed/..;/admin")
                .is_allow()
        );
    }

    #[test]
    fn path_prefixes_that_could_never_match_are_rejected() {
        for (p, want) in [
            ("/a;b", "contains ;"),
            ("/caf\u{e9}", "non-ASCII"),
            ("/a/./b", "dot segment"),
        ] {
            let Err(PolicyError::Config(errors)) = grant(
                &["api.example.com"],
                vec![rule("api.example.com", &[], &[p])],
            ) else {
                panic!("{p:?} must be rejected");
            };
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{p:?}: expected {want:?} in {errors:?}"
            );
        }
    }

    #[test]
    fn empty_methods_or_prefixes_mean_any() {
        let g = grant(
            &["api.example.com"],
            vec![rule("api.example.com", &[], &["/x/"])],
        )
        .unwrap();
        let api = parse_authority_form("api.example.com:443").unwrap();
        assert!(g.decide_request(&api, "DELETE", "/x/1").is_allow());
        assert!(!g.decide_request(&api, "GET", "/y").is_allow());
        let g = grant(
            &["api.example.com"],
            vec![rule("api.example.com", &["GET"], &[])],
        )
        .unwrap();
        assert!(g.decide_request(&api, "GET", "/anything").is_allow());
        assert!(!g.decide_request(&api, "PUT", "/anything").is_allow());
    }

    #[test]
    fn bad_request_rules_are_rejected_naming_the_rule() {
        let rows: &[(&[&str], RequestRuleSpec, &str)] = &[
            (
                &["api.example.com"],
                rule("*.com", &[], &[]),
                "request_rule[1]: invalid request_rule host entry \"*.com\"",
            ),
            (
                &["api.example.com"],
                rule("", &[], &[]),
                "request_rule[1]: invalid request_rule host entry \"\"",
            ),
            (
                &["api.example.com"],
                rule("www.example.com", &[], &[]),
                "request_rule[1]: host \"www.example.com\" is not covered by tls_terminate",
            ),
            (
                &["api.example.com:443"],
                rule("api.example.com", &[], &[]),
                "is not covered by tls_terminate",
            ),
            (
                &["*.a.example.com"],
                rule("*.example.com", &[], &[]),
                "is not covered by tls_terminate",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &["get"], &[]),
                "methods are case-sensitive: write \"GET\"",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &["G T"], &[]),
                "is not an HTTP token",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[""], &[]),
                "must be 1..=32 characters",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[], &["api/"]),
                "must start with /",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[], &["/a?b"]),
                "contains '?'",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[], &["/a/*"]),
                "contains '*'",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[], &["/a%2f"]),
                "contains '%'",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[], &["/a/../b"]),
                "has a dot segment",
            ),
        ];
        for (terminate, spec, want) in rows {
            let Err(PolicyError::Config(errors)) = grant(terminate, vec![spec.clone()]) else {
                panic!("{spec:?} must be rejected");
            };
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{spec:?}: expected {want:?} in {errors:?}"
            );
        }
        // Covered by a wider wildcard or an exact match: accepted.
        grant(
            &["*.example.com"],
            vec![rule("*.a.example.com", &["GET"], &["/"])],
        )
        .unwrap();
        grant(
            &["*.example.com"],
            vec![rule("api.example.com:443", &["GET"], &["/"])],
        )
        .unwrap();
    }
}
