//! Host patterns of a grant (design section 4.1): exact names, `*.suffix` wildcards (not
//! the apex), IP literals and CIDRs, each with an optional port; deny-only `*` and `*:port`.
//! Broad or inert patterns are rejected at load with an error naming the entry; the Public
//! Suffix List decides what is too broad (`*.com`, `*.co.uk`).
//!
//! A pattern matches canonical hosts only (see [`crate::host`]); it never canonicalises or
//! resolves what it is matched against.

use std::fmt;

use ipnet::IpNet;

use crate::error::{PatternError, PolicyError};
use crate::host::{CanonicalHost, Target, canonicalize_inner, parse_port, split_host_port};

/// Where a pattern is used; `*` and `*:port` are accepted only in deny lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatternUse {
    /// An `allow` entry (or `tls_terminate`).
    Allow,
    /// A `deny` entry (grant or global).
    Deny,
}

/// One parsed host pattern with an optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPattern {
    /// What hosts it matches.
    pub(crate) kind: PatternKind,
    /// `None` matches every port.
    pub(crate) port: Option<u16>,
    /// The entry exactly as written in the grant, for logs and `rule` fields.
    pub(crate) source: String,
}

/// The host part of a [`HostPattern`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PatternKind {
    /// Exactly this canonical name or IP.
    Exact(CanonicalHost),
    /// `*.suffix`: any name with at least one more label than `suffix` (canonical A-labels,
    /// stored without the `*.`).
    Suffix(String),
    /// An IP network; matches IP-literal destinations only.
    Net(IpNet),
    /// `*` (deny lists only): every host.
    Any,
}

impl HostPattern {
    /// Parses one entry. Accepts `name`, `name:port`, `*.name`, `*.name:port`, `1.2.3.4`,
    /// `1.2.3.4:443`, `2001:db8::1`, `[2001:db8::1]:443`, CIDRs (`10.0.0.0/8`,
    /// `2001:db8::/32`), and with [`PatternUse::Deny`] also `*` and `*:port`.
    ///
    /// # Errors
    /// [`PolicyError::Pattern`] naming `field` and the entry for: `*` in an allow list, `*.`,
    /// `*x`, `a.*.com`, `**`, a wildcard whose remainder is a public suffix (`*.com`,
    /// `*.co.uk`), empty labels, labels over 63 bytes, names over 253 bytes, characters
    /// other than letters, digits, hyphen and underscore after IDNA mapping, userinfo,
    /// paths, bracketed names, port 0 or a non-decimal port, a CIDR with host bits set.
    ///
    /// Decisions beyond design section 4.1:
    /// - "public suffix" means a suffix named by an explicit Public Suffix List rule,
    ///   ICANN section only (`*.com`, `*.co.uk`): the private section names company-run
    ///   namespaces (`githubusercontent.com`, `github.io`) where a wildcard is a deliberate
    ///   operator choice, and design section 11's own example grants
    ///   `*.githubusercontent.com`; and also any single label
    ///   (`*.internal`, `*.test`): a wildcard directly under a top-level label is too broad
    ///   whether or not the PSL knows the label;
    /// - an IPv6 literal or CIDR with a port is bracketed (`[2001:db8::1]:443`,
    ///   `[2001:db8::/32]:443`); an IPv4 CIDR takes the port after it (`10.0.0.0/8:22`);
    /// - a bare public suffix as an exact entry (`com`) is accepted: it matches only itself.
    pub(crate) fn parse(
        field: &'static str,
        entry: &str,
        usage: PatternUse,
    ) -> Result<Self, PolicyError> {
        let (kind, port) = parse_entry(entry, usage).map_err(|why| PolicyError::Pattern {
            field,
            entry: entry.to_owned(),
            why,
        })?;
        Ok(Self {
            kind,
            port,
            source: entry.to_owned(),
        })
    }

    /// Whether the pattern's host part matches `host` (ignores the port).
    pub(crate) fn matches_host(&self, host: &CanonicalHost) -> bool {
        match &self.kind {
            PatternKind::Exact(h) => h == host,
            PatternKind::Suffix(suffix) => {
                host.name().is_some_and(|n| is_proper_subdomain(n, suffix))
            }
            PatternKind::Net(net) => host.ip().is_some_and(|ip| net.contains(&ip)),
            PatternKind::Any => true,
        }
    }

    /// Whether the pattern matches `target` (host and port).
    pub(crate) fn matches(&self, target: &Target) -> bool {
        self.matches_host(&target.host) && self.port.is_none_or(|p| p == target.port)
    }
}

impl HostPattern {
    /// Whether `self` matches every target `inner` can match (host and port): the one
    /// containment test of patterns, used where the grant checks a `tls_terminate` or deny
    /// entry against another entry, and by `crate::review` to tell a widening from a
    /// rewrite. Decided with the matching code of live traffic: an exact entry is covered
    /// when `self` matches its host; a wildcard by an equal or wider wildcard
    /// (`*.example.net` covers `*.svc.example.net`, not the reverse); a CIDR by a network
    /// holding it; a single-address CIDR (`192.0.2.7/32`) also by the exact address.
    pub(crate) fn covers(&self, inner: &Self) -> bool {
        let port_ok = match (self.port, inner.port) {
            (None, _) => true,
            (Some(o), Some(i)) => o == i,
            (Some(_), None) => false,
        };
        let host_ok = match (&self.kind, &inner.kind) {
            (_, PatternKind::Exact(h)) => self.matches_host(h),
            (PatternKind::Suffix(o), PatternKind::Suffix(i)) => i == o || is_proper_subdomain(i, o),
            (PatternKind::Net(o), PatternKind::Net(i)) => o.contains(i),
            (PatternKind::Exact(h), PatternKind::Net(i)) => {
                i.prefix_len() == i.max_prefix_len() && h.ip() == Some(i.addr())
            }
            (PatternKind::Any, _) => true,
            // A wildcard or `*` is never covered by a narrower kind, nor by another kind
            // (a name pattern never matches an IP literal, nor a CIDR a name).
            (
                PatternKind::Exact(_) | PatternKind::Suffix(_) | PatternKind::Net(_),
                PatternKind::Suffix(_) | PatternKind::Any,
            )
            | (PatternKind::Suffix(_), PatternKind::Net(_)) => false,
        };
        port_ok && host_ok
    }

    /// Whether some target matches both `self` and `other` (host and port).
    pub(crate) fn overlaps(&self, other: &Self) -> bool {
        let ports = match (self.port, other.port) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let hosts = match (&self.kind, &other.kind) {
            (PatternKind::Any, _) | (_, PatternKind::Any) => true,
            (PatternKind::Exact(h), _) => other.matches_host(h),
            (_, PatternKind::Exact(h)) => self.matches_host(h),
            (PatternKind::Suffix(a), PatternKind::Suffix(b)) => {
                a == b || is_proper_subdomain(a, b) || is_proper_subdomain(b, a)
            }
            (PatternKind::Net(a), PatternKind::Net(b)) => {
                a.contains(&b.network()) || b.contains(&a.network())
            }
            (PatternKind::Suffix(_), PatternKind::Net(_))
            | (PatternKind::Net(_), PatternKind::Suffix(_)) => false,
        };
        ports && hosts
    }

    /// The same pattern on every port (for questions about hosts alone).
    pub(crate) fn any_port(&self) -> Self {
        Self {
            port: None,
            ..self.clone()
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Whether `name` is `suffix` with at least one more label in front.
fn is_proper_subdomain(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() + 1
        && name.ends_with(suffix)
        && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

pub(crate) fn parse_entry(
    entry: &str,
    usage: PatternUse,
) -> Result<(PatternKind, Option<u16>), PatternError> {
    if entry.is_empty() {
        return Err(PatternError::Empty);
    }
    if entry.contains('@') {
        return Err(PatternError::Userinfo);
    }
    if entry.contains("://") {
        return Err(PatternError::Url);
    }
    if entry == "*" || entry.starts_with("*:") {
        if usage == PatternUse::Allow {
            return Err(PatternError::AllowAll);
        }
        let port = match entry.strip_prefix("*:") {
            Some(p) => Some(parse_port(p)?),
            None => None,
        };
        return Ok((PatternKind::Any, port));
    }

    // A bare IPv6 literal or CIDR (two or more ':' outside brackets) carries no port.
    let (host, port) = if !entry.starts_with('[') && entry.matches(':').count() > 1 {
        (entry, None)
    } else {
        let (h, p) = split_host_port(entry)?;
        (h, p.map(parse_port).transpose()?)
    };

    if host.contains('/') {
        return parse_cidr(host).map(|net| (net, port));
    }
    if host.contains('*') {
        return parse_wildcard(host).map(|k| (k, port));
    }
    let canonical = canonicalize_inner(host)?;
    Ok((PatternKind::Exact(canonical), port))
}

fn parse_cidr(host: &str) -> Result<PatternKind, PatternError> {
    let inner = match host.strip_prefix('[') {
        Some(rest) => rest
            .strip_suffix(']')
            .ok_or(crate::error::HostError::UnclosedBracket)?,
        None => host,
    };
    let net: IpNet = inner
        .parse()
        .map_err(|_| PatternError::NotCidr(inner.to_owned()))?;
    if net.trunc() != net {
        return Err(PatternError::HostBits(net.trunc()));
    }
    if host.starts_with('[') && matches!(net, IpNet::V4(_)) {
        return Err(crate::error::HostError::BracketsNotIpv6.into());
    }
    Ok(PatternKind::Net(net))
}

fn parse_wildcard(host: &str) -> Result<PatternKind, PatternError> {
    let Some(rest) = host.strip_prefix("*.") else {
        return Err(PatternError::WildcardShape);
    };
    if rest.is_empty() {
        return Err(PatternError::WildcardNoDomain);
    }
    if rest.contains('*') {
        return Err(PatternError::TwoWildcards);
    }
    let canonical = canonicalize_inner(rest)?;
    let Some(name) = canonical.name() else {
        return Err(PatternError::WildcardIp);
    };
    if is_public_suffix(name) {
        return Err(PatternError::PublicSuffix(name.to_owned()));
    }
    Ok(PatternKind::Suffix(name.to_owned()))
}

/// Whether `name` (canonical A-labels) is a public suffix: a single label, or a name that
/// an explicit Public Suffix List rule (ICANN or private section) makes a suffix.
pub(crate) fn is_public_suffix(name: &str) -> bool {
    if !name.contains('.') {
        return true;
    }
    match psl::suffix(name.as_bytes()) {
        Some(suffix) => {
            suffix.is_known()
                && suffix.typ() == Some(psl::Type::Icann)
                && suffix.as_bytes() == name.as_bytes()
        }
        None => false,
    }
}

#[cfg(test)]
#[path = "pattern_tests.rs"]
mod tests;
