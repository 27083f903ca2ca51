//! Grants (design section 4): what one authority may reach, frozen when built. A grant
//! decides on a canonical [`Target`] ([`Grant::decide`]) and then vets the addresses the
//! caller resolved for it ([`Grant::vet`]), producing the [`Pin`]: the only addresses a
//! connection may be made to.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::decision::Decision;
use crate::error::PolicyError;
use crate::host::Target;
use crate::pattern::HostPattern;

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
}

/// The mediator's own listening addresses; connecting to any of them is always denied
/// (`special_address`), whatever `allow_private` says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnAddrs(pub Vec<SocketAddr>);

impl OwnAddrs {
    /// Whether a connection to `addr` would reach one of the mediator's own listeners. A
    /// listener bound to an unspecified address (`0.0.0.0`, `::`) is reached on its port at
    /// every loopback address and at the unspecified address itself.
    pub fn contains(&self, addr: SocketAddr) -> bool {
        todo!("{addr}")
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
}

impl Grant {
    /// Validates `spec` and freezes it. `global_deny` entries are applied as if they were
    /// part of the grant's deny list (reported with their own source in `rule`).
    ///
    /// # Errors
    /// [`PolicyError::Config`] listing every bad entry (not just the first), each naming
    /// the field and the entry.
    pub fn new(spec: &GrantSpec, global_deny: &[String]) -> Result<Self, PolicyError> {
        todo!("{spec:?} {global_deny:?}")
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
    pub fn decide(&self, target: &Target) -> Decision {
        todo!("{target}")
    }

    /// Vets the addresses resolved for an allowed `target`. Every address must be
    /// [`crate::AddrClass::Global`] or covered by `allow_private`, and none may be one of
    /// `own` (the mediator's listeners, checked with `target.port`). Fail closed: if *any*
    /// address fails, the whole answer is denied (a mixed answer is a rebinding sign), with
    /// `private_address` or `special_address` and a detail naming the address and its block.
    ///
    /// # Errors
    /// A deny [`Decision`]; `dns_failure` when `addrs` is empty.
    pub fn vet(&self, target: &Target, addrs: &[IpAddr], own: &OwnAddrs) -> Result<Pin, Decision> {
        todo!("{target} {addrs:?} {own:?}")
    }

    /// Whether `target` matches a `tls_terminate` pattern.
    pub fn terminates_tls(&self, target: &Target) -> bool {
        self.tls_terminate.iter().any(|p| p.matches(target))
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
