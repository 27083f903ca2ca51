//! IP address classification (design section 4.2) per the IANA IPv4 and IPv6
//! Special-Purpose Address Registries (RFC 6890 and successors). Allow-only: an address
//! is [`AddrClass::Global`] only when it is positively globally reachable unicast;
//! everything else is private or special.

use std::net::IpAddr;

/// The class of one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrClass {
    /// Globally reachable unicast: may be connected to.
    Global,
    /// Belongs to some host or organisation: loopback, private-use (RFC 1918), shared
    /// (RFC 6598), link-local, unique-local (RFC 4193). The `&str` names the block
    /// (`"loopback (127.0.0.0/8, RFC 1122)"`).
    Private(&'static str),
    /// Any other non-global address (unspecified, documentation, benchmarking, reserved,
    /// multicast, broadcast, ...). The `&str` names the block.
    Special(&'static str),
    /// An IPv6 address embedding an IPv4 one (IPv4-mapped, IPv4-compatible, NAT64
    /// `64:ff9b::/96` RFC 6052 and `64:ff9b:1::/48` RFC 8215, 6to4 RFC 3056, Teredo
    /// RFC 4380). `embedded` is the IPv4 address inside and `inner` its own class; the
    /// embedding itself is denied unless a grant's `allow_private` covers the IPv6 address.
    Embedded {
        /// Which embedding (`"NAT64 (64:ff9b::/96, RFC 6052)"`).
        kind: &'static str,
        /// The embedded IPv4 address.
        embedded: std::net::Ipv4Addr,
        /// Whether the embedded address itself is global.
        inner_global: bool,
        /// Whether the embedded address itself is private (vs special) when not global.
        inner_private: bool,
    },
}

/// Classifies one address. IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is reported as
/// [`AddrClass::Embedded`].
pub fn classify(ip: IpAddr) -> AddrClass {
    todo!("{ip}")
}
