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
