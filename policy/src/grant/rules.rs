//! Request rules (design section 9): per-request method, path, header, query and upgrade
//! rules that narrow a grant on terminated TLS, checked at load and judged per request
//! ([`Grant::decide_request`]). Paths are normalised once, strictly; a rule never widens
//! what the grant allows.

use crate::error::RuleError;
use std::collections::BTreeSet;

use super::{EntryError, Grant, GrantField};
use crate::decision::{Decision, Reason};
use crate::host::Target;
use crate::pattern::{HostPattern, PatternUse};
use crate::request::{HeaderRule, RequestFacts, UpgradeToken, check_query_name, query_names};

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
    pub(crate) fn label(&self) -> String {
        format!("request_rule[{}] {}", self.position, self.host.source)
    }

    /// `path` is the normalised path; `names` the decoded query parameter names (given
    /// whenever a rule of the host judges queries).
    pub(super) fn allows(
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
    pub(super) fn near_miss(
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

    pub(crate) fn describe(&self) -> String {
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
pub(super) fn other_upgrade<'a>(facts: &RequestFacts<'a>) -> Option<&'a UpgradeToken> {
    facts.upgrade.filter(|t| **t != UpgradeToken::WebSocket)
}

/// Whether `path` is under `prefix`: equal, or continuing it at a `/`.
pub(crate) fn path_has_prefix(path: &str, prefix: &str) -> bool {
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
pub(super) fn normalize_path(path: &str) -> Result<String, &'static str> {
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
pub(super) fn check_method(m: &str) -> Result<(), RuleError> {
    const TCHAR: &[u8] = b"!#$%&'*+-.^_`|~";
    if m.is_empty() || m.len() > 32 {
        return Err(RuleError::MethodLength(m.to_owned()));
    }
    if m.bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(RuleError::MethodCase {
            method: m.to_owned(),
        });
    }
    if !m
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || TCHAR.contains(&b))
    {
        return Err(RuleError::MethodToken(m.to_owned()));
    }
    Ok(())
}

/// Validates one path prefix: starts with `/`, no query, fragment, whitespace or control
/// characters, no `%` (write the decoded path), no `*` (prefixes are literal), no dot
/// segments.
pub(super) fn check_path_prefix(p: &str) -> Result<(), RuleError> {
    if !p.starts_with('/') {
        return Err(RuleError::PathStart(p.to_owned()));
    }
    if let Some(c) = p
        .chars()
        .find(|c| matches!(c, '?' | '#' | '%' | '*' | '\\') || c.is_whitespace() || c.is_control())
    {
        return Err(RuleError::PathChar(p.to_owned(), c));
    }
    if let Err(why) = normalize_path(p) {
        return Err(RuleError::PathNever(p.to_owned(), why));
    }
    Ok(())
}

impl Grant {
    /// The per-request rules, in grant order (for the config tests and `crate::review`;
    /// the mediator asks [`Grant::decide_request`]).
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
                message: None,
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
}

pub(super) fn build_request_rules(
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
        if !tls_terminate.iter().any(|t| t.covers(&host)) {
            fail(format!(
                "host {:?} is not covered by tls_terminate, so the rule could not be enforced inside its TLS tunnels; add {:?} to tls_terminate",
                spec.host, spec.host
            ));
            ok = false;
        }
        for m in &spec.methods {
            if let Err(e) = check_method(m) {
                fail(e.to_string());
                ok = false;
            }
        }
        for p in &spec.path_prefixes {
            if let Err(e) = check_path_prefix(p) {
                fail(e.to_string());
                ok = false;
            }
        }
        let mut headers = Vec::with_capacity(spec.headers.len());
        for (name, pattern) in &spec.headers {
            match HeaderRule::parse(name, pattern) {
                Ok(h) => headers.push(h),
                Err(e) => {
                    fail(e.to_string());
                    ok = false;
                }
            }
        }
        for name in spec.query.iter().flatten() {
            if let Err(e) = check_query_name(name) {
                fail(e.to_string());
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
