//! Grants (design section 4): what one authority may reach, frozen when built. A grant
//! decides on a canonical [`Target`] ([`Grant::decide`]) and then vets the addresses the
//! caller resolved for it ([`Grant::vet`]), producing the [`Pin`]: the only addresses a
//! connection may be made to.
//!
//! A grant never changes after it is built and never resolves a name itself: the caller
//! resolves once, and the addresses it vets are the ones it must connect to.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::classify::{AddrClass, classify};
use crate::decision::{Decision, Reason};
use crate::error::PolicyError;
use crate::host::{CanonicalHost, Target};
use crate::pattern::{HostPattern, PatternKind, PatternUse};
use crate::request::{HeaderRule, RequestFacts, UpgradeToken, check_query_name, query_names};

/// The unvalidated description of a grant, as written in configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantSpec {
    /// The authority's name: 1..=64 bytes of ASCII letters, digits, `-` and `_`.
    pub name: String,
    /// Allow entries, host patterns (design section 4.1): `example.com` (that name only),
    /// `*.example.com` (every name under it, not the apex), IP literals and CIDRs
    /// (`192.0.2.7`, `2001:db8::/32`; they match IP-literal destinations only), each with an
    /// optional port (`example.com:443`, `[2001:db8::1]:443`, `10.0.0.0/8:22`). Rejected:
    /// `*`, a wildcard over a public suffix or a single label (`*.com`, `*.co.uk`,
    /// `*.internal`), a wildcard anywhere but as the whole first label, userinfo, paths.
    pub allow: Vec<String>,
    /// Deny entries: the same syntax, plus `*` (every host) and `*:port` (every host on
    /// that port). Deny beats allow.
    pub deny: Vec<String>,
    /// Exceptions to the address check (design section 4.2): CIDRs without host bits
    /// (`10.1.0.0/16`) or single addresses (`127.0.0.1`). Never `/0`, and never a range
    /// holding `0.0.0.0/8` or `::` (connecting there reaches this host's listeners).
    pub allow_private: Vec<String>,
    /// Require the TLS ClientHello's SNI to equal the CONNECT host on port 443.
    pub sni_check: bool,
    /// Host patterns (as in `allow`) whose TLS is terminated (design section 9).
    pub tls_terminate: Vec<String>,
    /// Per-request rules inside terminated tunnels (`[[authority.request_rule]]`).
    pub request_rules: Vec<RequestRuleSpec>,
    /// Who can widen this grant: decides what a denial's hint tells an agent to ask for.
    pub advice: Advice,
}

/// Who can widen a grant, so that a denial's `hint` names the change that would make the
/// request work in the terms of whoever makes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Advice {
    /// An operator, in the configuration: hints name the grant's lists (`add "h:443" to the
    /// allow list of authority "a"`).
    #[default]
    Operator,
    /// Whoever runs the shim in embedded mode, whose grant is its flags: hints name the
    /// flags (`add --allow h:443 to the shim command`).
    ShimFlags,
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
    /// Required headers: name (any case) and value pattern (the value exactly, or a
    /// prefix when it ends in `*`); every value of the header must match. Empty: none.
    pub headers: Vec<(String, String)>,
    /// Allowed query parameter names (decoded); `None` allows any query, `Some([])` none.
    pub query: Option<Vec<String>>,
    /// Upgrade tokens (RFC 9110 section 7.8, any case) besides `websocket` that a request
    /// this rule allows may switch to; `h2c` is refused. Empty: none.
    pub upgrade: Vec<String>,
}

/// One validated per-request rule of a [`Grant`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestRule {
    /// Which hosts it narrows.
    pub(crate) host: HostPattern,
    /// Allowed methods; empty: every method.
    pub(crate) methods: Vec<String>,
    /// Allowed path prefixes; empty: every path.
    pub(crate) path_prefixes: Vec<String>,
    /// Required headers.
    pub(crate) headers: Vec<HeaderRule>,
    /// Allowed query parameter names; `None`: any query.
    pub(crate) query: Option<BTreeSet<String>>,
    /// Upgrade tokens other than `websocket` it allows.
    pub(crate) upgrade: BTreeSet<UpgradeToken>,
    /// 1-based position in the grant, for `rule` fields (`request_rule[2] api.example.com`).
    pub(crate) position: usize,
}

impl RequestRule {
    fn label(&self) -> String {
        format!("request_rule[{}] {}", self.position, self.host.source)
    }

    /// `path` is the normalised path; `names` the decoded query parameter names (given
    /// whenever a rule of the host judges queries).
    fn allows(
        &self,
        facts: &RequestFacts<'_>,
        path: &str,
        names: Option<&BTreeSet<String>>,
    ) -> bool {
        (self.methods.is_empty() || self.methods.iter().any(|m| m == facts.method))
            && (self.path_prefixes.is_empty()
                || self.path_prefixes.iter().any(|p| path_has_prefix(path, p)))
            && self.headers.iter().all(|h| h.allows(facts))
            && other_upgrade(facts).is_none_or(|t| self.upgrade.contains(t))
            && match (&self.query, names) {
                (None, _) => true,
                (Some(allowed), Some(names)) => names.is_subset(allowed),
                // Cannot happen: names are parsed when any rule judges queries. Fail closed.
                (Some(_), None) => false,
            }
    }

    /// When this rule covers the request's method, path and Upgrade but refuses it for a
    /// query parameter name (decoded, quoted with escapes) or a required header (named;
    /// its value never repeated, it may be a secret): the denial's detail and hint.
    fn near_miss(
        &self,
        facts: &RequestFacts<'_>,
        path: &str,
        names: Option<&BTreeSet<String>>,
    ) -> Option<(String, String)> {
        let covers = (self.methods.is_empty() || self.methods.iter().any(|m| m == facts.method))
            && (self.path_prefixes.is_empty()
                || self.path_prefixes.iter().any(|p| path_has_prefix(path, p)))
            && other_upgrade(facts).is_none_or(|t| self.upgrade.contains(t));
        if !covers {
            return None;
        }
        let label = self.label();
        if let Some(h) = self.headers.iter().find(|h| !h.allows(facts)) {
            let how = if facts.header_values(&h.name).is_empty() {
                "is absent"
            } else {
                "has a value that does not match"
            };
            return Some((
                format!(
                    "header {} {how}: {label} requires {}: {}",
                    h.name, h.name, h.pattern
                ),
                format!(
                    "send {} with a value matching \"{}\" ({label} requires it), or ask for that rule's headers to change",
                    h.name, h.pattern
                ),
            ));
        }
        if let (Some(allowed), Some(names)) = (&self.query, names) {
            let refused: Vec<String> = names
                .iter()
                .filter(|n| !allowed.contains(*n))
                .map(|n| format!("{n:?}"))
                .collect();
            if !refused.is_empty() {
                let list = if allowed.is_empty() {
                    "no query parameters".to_owned()
                } else {
                    format!(
                        "only {}",
                        allowed
                            .iter()
                            .map(|n| format!("{n:?}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                let (noun, them) = if refused.len() == 1 {
                    ("query parameter", "it")
                } else {
                    ("query parameters", "them")
                };
                let refused = refused.join(", ");
                return Some((
                    format!("{noun} {refused} not allowed: {label} allows {list}"),
                    format!(
                        "add {refused} to the query list of {label}, or send the request without {them}"
                    ),
                ));
            }
        }
        None
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
        let mut out = format!("{methods} {paths}");
        for h in &self.headers {
            out.push_str(&format!(" with {}: {}", h.name, h.pattern));
        }
        match &self.query {
            None => {}
            Some(q) if q.is_empty() => out.push_str(" without a query"),
            Some(q) => out.push_str(&format!(
                " with query parameters only among {}",
                q.iter().cloned().collect::<Vec<_>>().join(", ")
            )),
        }
        if !self.upgrade.is_empty() {
            let tokens: Vec<&str> = self.upgrade.iter().map(UpgradeToken::as_str).collect();
            out.push_str(&format!(" with Upgrade: {}", tokens.join("|")));
        }
        out
    }
}

/// The upgrade a request asks for when only a rule's `upgrade` list can allow it (any
/// token but `websocket`).
fn other_upgrade<'a>(facts: &RequestFacts<'a>) -> Option<&'a UpgradeToken> {
    facts.upgrade.filter(|t| **t != UpgradeToken::WebSocket)
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
        // A wildcard, CIDR or `*` is never covered by a narrower kind, nor by another
        // kind (a name pattern never matches an IP literal, nor a CIDR a name).
        (
            PatternKind::Exact(_) | PatternKind::Suffix(_) | PatternKind::Net(_),
            PatternKind::Suffix(_) | PatternKind::Net(_) | PatternKind::Any,
        ) => false,
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
    advice: Advice,
    allow_index: RuleIndex,
    deny_index: RuleIndex,
}

/// One problem found while building a grant: which field, which entry of it (0 for
/// `name`), and the full message (`invalid allow entry "*.com": ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntryError {
    pub(crate) field: GrantField,
    pub(crate) index: usize,
    pub(crate) message: String,
}

/// The field of a grant an [`EntryError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantField {
    Name,
    Allow,
    Deny,
    /// `[global] deny`, whose entries every grant holds after its own.
    GlobalDeny,
    AllowPrivate,
    TlsTerminate,
    RequestRule,
}

impl GrantField {
    /// The key as written in the configuration (`global deny` for `[global] deny`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Name => "name",
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::GlobalDeny => "global deny",
            Self::AllowPrivate => "allow_private",
            Self::TlsTerminate => "tls_terminate",
            Self::RequestRule => "request_rule",
        }
    }
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

/// Whether `ip` (IPv4-mapped unwrapped) is in 0.0.0.0/8 or is `::`: "this host".
fn is_this_host(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.octets()[0] == 0,
        IpAddr::V6(v6) => v6.is_unspecified(),
    }
}

/// The list of a grant an entry belongs to (for [`check_entry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// An `allow` entry (a host pattern, design section 4.1).
    Allow,
    /// A `deny` entry (a host pattern; `*` and `*:port` too).
    Deny,
    /// An `allow_private` entry (a CIDR without host bits, or one address).
    AllowPrivate,
}

/// Checks one grant entry alone, exactly as [`Grant::new`] would, for callers that take
/// entries one by one (the shim's `--allow`, `--deny`, `--allow-private` flags).
///
/// # Errors
/// What is wrong with the entry and, where possible, what to write instead (the entry
/// itself is not repeated).
pub fn check_entry(kind: EntryKind, entry: &str) -> Result<(), String> {
    let result = match kind {
        EntryKind::Allow => HostPattern::parse("allow", entry, PatternUse::Allow).map(drop),
        EntryKind::Deny => HostPattern::parse("deny", entry, PatternUse::Deny).map(drop),
        EntryKind::AllowPrivate => parse_allow_private(entry).map(drop),
    };
    result.map_err(|e| match e {
        PolicyError::Pattern { why, .. } => why,
        other => other.to_string(),
    })
}

/// Parses one `allow_private` entry: a CIDR without host bits, or a single address.
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
                field: GrantField::Name,
                index: 0,
                message,
            });
        }
        let mut patterns = |field: GrantField, entries: &[String], usage: PatternUse| {
            let mut out = Vec::with_capacity(entries.len());
            for (index, entry) in entries.iter().enumerate() {
                match HostPattern::parse(field.as_str(), entry, usage) {
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
        let allow = patterns(GrantField::Allow, &spec.allow, PatternUse::Allow);
        let mut deny = patterns(GrantField::Deny, &spec.deny, PatternUse::Deny);
        let global_deny_from = deny.len();
        deny.extend(patterns(
            GrantField::GlobalDeny,
            global_deny,
            PatternUse::Deny,
        ));
        let tls_terminate = patterns(
            GrantField::TlsTerminate,
            &spec.tls_terminate,
            PatternUse::Allow,
        );
        let request_rules = build_request_rules(&spec.request_rules, &tls_terminate, &mut errors);
        let mut allow_private = Vec::with_capacity(spec.allow_private.len());
        for (index, entry) in spec.allow_private.iter().enumerate() {
            match parse_allow_private(entry) {
                Ok(net) => allow_private.push(net),
                Err(e) => errors.push(EntryError {
                    field: GrantField::AllowPrivate,
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
            advice: spec.advice,
        })
    }

    /// The authority's name (1..=64 bytes of ASCII letters, digits, `-` and `_`).
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
                    match self.advice {
                        Advice::Operator => format!(
                            "{target} matches deny entry \"{rule}\" of authority \"{name}\""
                        ),
                        Advice::ShimFlags => format!("{target} matches the shim's --deny {rule}"),
                    },
                    match self.advice {
                        Advice::Operator => format!(
                            "the grant of authority \"{name}\" denies this destination; an operator would have to replace the authority without deny entry \"{rule}\""
                        ),
                        Advice::ShimFlags => format!(
                            "the shim command denies this destination: remove --deny {rule} from it"
                        ),
                    },
                )
            };
            return Decision::deny(Reason::DeniedByRule, detail, hint).with_rule(rule.clone());
        }

        let found = self.allow_index.lookup(&self.allow, target);
        let Some(i) = found.full else {
            let entry = format!("{}:{}", target.host.to_uri_host(), target.port);
            let hint = match self.advice {
                Advice::Operator => {
                    format!("add \"{entry}\" to the allow list of authority \"{name}\"")
                }
                Advice::ShimFlags => format!("add --allow {entry} to the shim command"),
            };
            let Some(first) = found.host_only else {
                let detail = match self.advice {
                    Advice::Operator => format!(
                        "{} is not in the allow list of authority \"{name}\"",
                        target.host
                    ),
                    Advice::ShimFlags => {
                        format!("{} is not allowed by the shim's --allow flags", target.host)
                    }
                };
                return Decision::deny(Reason::NotInAllowlist, detail, hint);
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
                match self.advice {
                    Advice::Operator => format!(
                        "{} matches allow entries {} of authority \"{name}\", but not on port {}",
                        target.host,
                        rules.join(", "),
                        target.port
                    ),
                    Advice::ShimFlags => format!(
                        "{} matches the shim's --allow {}, but not on port {}",
                        target.host,
                        rules.join(", "),
                        target.port
                    ),
                },
                hint,
            )
            .with_rule(self.allow[first].source.clone());
        };

        if let Some(ip) = target.host.ip()
            && let Err(denied) = self.vet(target, &[ip], &OwnAddrs::default())
        {
            return denied;
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
            let hint = match self.advice {
                Advice::Operator => format!(
                    "only globally reachable addresses are connected to; if this destination is intended, an operator can add \"{}\" to allow_private of authority {:?}",
                    IpNet::from(ip),
                    self.name
                ),
                Advice::ShimFlags => format!(
                    "only globally reachable addresses are connected to; if this destination is intended, add --allow-private {} to the shim command",
                    IpNet::from(ip)
                ),
            };
            return Err(Decision::deny(reason, detail, hint));
        }
        Ok(Pin(addrs.to_vec()))
    }

    /// For each allow entry that a deny entry (the grant's or `[global] deny`) refuses
    /// whole: its index and that deny entry as written.
    pub(crate) fn shadowed_allows(&self) -> Vec<(usize, &str)> {
        self.allow
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                self.deny
                    .iter()
                    .find(|d| pattern_covers(d, a))
                    .map(|d| (i, d.source.as_str()))
            })
            .collect()
    }

    /// Whether some allow entry can match a target that `pattern` matches (approximately:
    /// one covers the other).
    pub(crate) fn reaches(&self, pattern: &HostPattern) -> bool {
        self.allow
            .iter()
            .any(|a| pattern_covers(a, pattern) || pattern_covers(pattern, a))
    }

    /// The host patterns of the request rules, by 0-based index.
    pub(crate) fn request_rule_hosts(&self) -> impl Iterator<Item = (usize, &HostPattern)> {
        self.request_rules.iter().map(|r| (r.position - 1, &r.host))
    }

    /// Whether every target `pattern` can match is terminated (covered by a
    /// `tls_terminate` pattern).
    pub(crate) fn terminates_pattern(&self, pattern: &HostPattern) -> bool {
        self.tls_terminate
            .iter()
            .any(|t| pattern_covers(t, pattern))
    }

    /// Whether `target` matches a `tls_terminate` pattern.
    pub fn terminates_tls(&self, target: &Target) -> bool {
        self.tls_terminate.iter().any(|p| p.matches(target))
    }

    /// The per-request rules, in grant order (for the config tests; the mediator asks
    /// [`Grant::decide_request`]).
    #[cfg(test)]
    pub(crate) fn request_rules(&self) -> &[RequestRule] {
        &self.request_rules
    }

    /// The decision for one request inside a terminated tunnel to `target` (already
    /// allowed by [`Grant::decide`]): when no request rule names the host, `allowed` with no
    /// rule; else `allowed` by the first rule for the host that allows `method` and `path`
    /// (the path without its query; escapes of unreserved characters decoded), or
    /// `denied_by_rule`. A path that a prefix cannot judge safely (dot segments, `;`, backslashes, `%25`, escapes of anything but letters, digits,
    /// `-`, `_`, `~`, malformed escapes, controls, non-ASCII) is `malformed_target` when
    /// rules apply, and so is a query a rule of the host cannot judge (see
    /// [`RequestFacts`]) when one of them has a `query` list.
    pub fn decide_request(&self, target: &Target, facts: &RequestFacts<'_>) -> Decision {
        let (method, path) = (facts.method, facts.path);
        let name = &self.name;
        let rules: Vec<&RequestRule> = self
            .request_rules
            .iter()
            .filter(|r| r.host.matches(target))
            .collect();
        if rules.is_empty() {
            if let Some(token) = other_upgrade(facts) {
                return Decision::deny(
                    Reason::DeniedByRule,
                    format!(
                        "{method} {path} on {} asks for Upgrade: {token}, which no request rule of authority \"{name}\" allows",
                        target.host
                    ),
                    format!(
                        "add upgrade = [\"{token}\"] to a [[authority.request_rule]] for {}, or send the request without Upgrade",
                        target.host
                    ),
                );
            }
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
        let names = if rules.iter().any(|r| r.query.is_some()) {
            match query_names(facts.query.unwrap_or_default()) {
                Ok(n) => Some(n),
                Err(why) => {
                    return Decision::deny(
                        Reason::MalformedTarget,
                        format!("{method} request to {target}: {why}"),
                        "send query parameter names of letters, digits and - _ . ~ [ ], separated by &",
                    );
                }
            }
        } else {
            None
        };
        if let Some(rule) = rules
            .iter()
            .find(|r| r.allows(facts, &normalized, names.as_ref()))
        {
            return Decision::allow(rule.label());
        }
        let labels = rules
            .iter()
            .map(|r| r.label())
            .collect::<Vec<_>>()
            .join(", ");
        // A rule that covers the method and the path (and any Upgrade) refused only for a
        // query parameter or a header: the denial names what it refused.
        if let Some((detail, hint)) = rules
            .iter()
            .find_map(|r| r.near_miss(facts, &normalized, names.as_ref()))
        {
            return Decision::deny(
                Reason::DeniedByRule,
                format!("{method} {path} on {}: {detail}", target.host),
                hint,
            )
            .with_rule(labels);
        }
        let allowed: Vec<String> = rules.iter().map(|r| r.describe()).collect();
        let asked = other_upgrade(facts)
            .map(|t| format!(" with Upgrade: {t}"))
            .unwrap_or_default();
        Decision::deny(
            Reason::DeniedByRule,
            format!(
                "{method} {path}{asked} on {} is not allowed by the request rules of authority \"{name}\"",
                target.host
            ),
            format!(
                "the request rules for {} allow only: {}; ask for a [[authority.request_rule]] covering {method} {path}",
                target.host,
                allowed.join("; ")
            ),
        )
        .with_rule(labels)
    }

    /// The allow entries exactly as written, in grant order (for diagnostics and the admin
    /// API).
    pub fn allow_entries(&self) -> impl Iterator<Item = &str> {
        self.allow.iter().map(|p| p.source.as_str())
    }

    /// The deny entries exactly as written: the grant's own first, then the global deny
    /// list's.
    pub fn deny_entries(&self) -> impl Iterator<Item = &str> {
        self.deny.iter().map(|p| p.source.as_str())
    }

    /// The `allow_private` exceptions as networks (a single address is a `/32` or `/128`).
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
                field: GrantField::RequestRule,
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
        let mut headers = Vec::with_capacity(spec.headers.len());
        for (name, pattern) in &spec.headers {
            match HeaderRule::parse(name, pattern) {
                Ok(h) => headers.push(h),
                Err(e) => {
                    fail(e);
                    ok = false;
                }
            }
        }
        for name in spec.query.iter().flatten() {
            if let Err(e) = check_query_name(name) {
                fail(e);
                ok = false;
            }
        }
        let mut upgrade = BTreeSet::new();
        for raw in &spec.upgrade {
            match UpgradeToken::parse(raw.as_bytes()) {
                Ok(UpgradeToken::H2c) => {
                    fail(format!(
                        "upgrade {raw:?}: h2c is never relayed (it would carry HTTP/2 requests past the request rules); clients that use TLS get HTTP/2 by ALPN"
                    ));
                    ok = false;
                }
                Ok(token) => {
                    upgrade.insert(token);
                }
                Err(e) => {
                    fail(format!("upgrade: {e}"));
                    ok = false;
                }
            }
        }
        if ok {
            out.push(RequestRule {
                host,
                methods: spec.methods.clone(),
                path_prefixes: spec.path_prefixes.clone(),
                headers,
                query: spec.query.as_ref().map(|q| q.iter().cloned().collect()),
                upgrade,
                position,
            });
        }
    }
    out
}

#[cfg(test)]
#[path = "grant_tests.rs"]
mod tests;
