//! Host patterns of a grant (design section 4.1): exact names, `*.suffix` wildcards (not
//! the apex), IP literals and CIDRs, each with an optional port; deny-only `*` and `*:port`.
//! Broad or inert patterns are rejected at load with an error naming the entry; the Public
//! Suffix List decides what is too broad (`*.com`, `*.co.uk`).

use std::fmt;

use ipnet::IpNet;

use crate::error::PolicyError;
use crate::host::{CanonicalHost, Target};

/// Where a pattern is used; `*` and `*:port` are accepted only in deny lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternUse {
    /// An `allow` entry (or `tls_terminate`).
    Allow,
    /// A `deny` entry (grant or global).
    Deny,
}

/// One parsed host pattern with an optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    /// What hosts it matches.
    pub kind: PatternKind,
    /// `None` matches every port.
    pub port: Option<u16>,
    /// The entry exactly as written in the grant, for logs and `rule` fields.
    pub source: String,
}

/// The host part of a [`HostPattern`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatternKind {
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
    pub fn parse(field: &'static str, entry: &str, usage: PatternUse) -> Result<Self, PolicyError> {
        todo!("{field} {entry} {usage:?}")
    }

    /// Whether the pattern's host part matches `host` (ignores the port).
    pub fn matches_host(&self, host: &CanonicalHost) -> bool {
        todo!("{host}")
    }

    /// Whether the pattern matches `target` (host and port).
    pub fn matches(&self, target: &Target) -> bool {
        self.matches_host(&target.host) && self.port.is_none_or(|p| p == target.port)
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}
