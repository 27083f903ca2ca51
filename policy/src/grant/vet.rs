//! Vetting a decided target's addresses (design section 4.2): every resolved address must
//! be globally reachable (IANA special-purpose registries) or inside an `allow_private`
//! exception, and never one of the mediator's own listeners; what passes is the [`Pin`].
//! It never resolves a name: it judges the addresses the caller resolved.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use super::{Advice, Grant};
use crate::classify::{AddrClass, classify};
use crate::decision::{Decision, Reason};
use crate::host::Target;

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

/// Whether `ip` (IPv4-mapped unwrapped) is in 0.0.0.0/8 or is `::`: "this host".
pub(super) fn is_this_host(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.octets()[0] == 0,
        IpAddr::V6(v6) => v6.is_unspecified(),
    }
}

impl Grant {
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
}
