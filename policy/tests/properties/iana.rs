//! The address blocks that are never globally reachable, written down from the IANA
//! registries themselves, independently of `policy/src/classify.rs` (whose table these
//! tests check): the IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and the
//! RFCs named per row), rows whose "Globally Reachable" column is `False` or `N/A`, plus
//! what the design denies besides (section 4.2): IPv4 multicast (IPv4 Multicast Address
//! Space Registry), IPv6 outside `2000::/3` (IPv6 Address Space Registry: nothing else is
//! global unicast), the deprecated IPv4-compatible `::/96` and site-local `fec0::/10`, and
//! every IPv4 embedding (NAT64 `64:ff9b::/96` is globally reachable per its registry row,
//! but the design denies embeddings as such).
//!
//! Registry rows marked globally reachable (`True`) that lie inside a non-global row are
//! listed in [`V4_GLOBAL_INSIDE`] and [`V6_GLOBAL_INSIDE`]: an address there may pass.

use std::net::{Ipv4Addr, Ipv6Addr};

/// IPv4 blocks whose addresses are never global: (network, prefix length, registry name).
pub(crate) const V4_NOT_GLOBAL: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8, "\"This network\", RFC 791"),
    (
        Ipv4Addr::new(0, 0, 0, 0),
        32,
        "\"This host on this network\", RFC 1122",
    ),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "Private-Use, RFC 1918"),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        "Shared Address Space, RFC 6598",
    ),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "Loopback, RFC 1122"),
    (Ipv4Addr::new(169, 254, 0, 0), 16, "Link Local, RFC 3927"),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "Private-Use, RFC 1918"),
    (
        Ipv4Addr::new(192, 0, 0, 0),
        24,
        "IETF Protocol Assignments, RFC 6890",
    ),
    (
        Ipv4Addr::new(192, 0, 0, 0),
        29,
        "IPv4 Service Continuity Prefix, RFC 7335",
    ),
    (
        Ipv4Addr::new(192, 0, 0, 8),
        32,
        "IPv4 dummy address, RFC 7600",
    ),
    (
        Ipv4Addr::new(192, 0, 0, 170),
        32,
        "NAT64/DNS64 Discovery, RFC 8880",
    ),
    (
        Ipv4Addr::new(192, 0, 0, 171),
        32,
        "NAT64/DNS64 Discovery, RFC 8880",
    ),
    (
        Ipv4Addr::new(192, 0, 2, 0),
        24,
        "Documentation (TEST-NET-1), RFC 5737",
    ),
    (
        Ipv4Addr::new(192, 88, 99, 0),
        24,
        "Deprecated (6to4 Relay Anycast), RFC 7526",
    ),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "Private-Use, RFC 1918"),
    (Ipv4Addr::new(198, 18, 0, 0), 15, "Benchmarking, RFC 2544"),
    (
        Ipv4Addr::new(198, 51, 100, 0),
        24,
        "Documentation (TEST-NET-2), RFC 5737",
    ),
    (
        Ipv4Addr::new(203, 0, 113, 0),
        24,
        "Documentation (TEST-NET-3), RFC 5737",
    ),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "Reserved, RFC 1112"),
    (
        Ipv4Addr::new(255, 255, 255, 255),
        32,
        "Limited Broadcast, RFC 919",
    ),
    // Not in the special-purpose registry: the multicast registry (not unicast at all).
    (Ipv4Addr::new(224, 0, 0, 0), 4, "Multicast, RFC 5771"),
];

/// Globally reachable registry rows inside a block of [`V4_NOT_GLOBAL`].
pub(crate) const V4_GLOBAL_INSIDE: &[(Ipv4Addr, u8, &str)] = &[
    (
        Ipv4Addr::new(192, 0, 0, 9),
        32,
        "Port Control Protocol Anycast, RFC 7723",
    ),
    (Ipv4Addr::new(192, 0, 0, 10), 32, "TURN Anycast, RFC 8155"),
];

const fn v6(s: [u16; 8]) -> Ipv6Addr {
    Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])
}

/// IPv6 blocks whose addresses are never global: (network, prefix length, name).
pub(crate) const V6_NOT_GLOBAL: &[(Ipv6Addr, u8, &str)] = &[
    (
        v6([0, 0, 0, 0, 0, 0, 0, 1]),
        128,
        "Loopback Address, RFC 4291",
    ),
    (
        v6([0, 0, 0, 0, 0, 0, 0, 0]),
        128,
        "Unspecified Address, RFC 4291",
    ),
    (
        v6([0, 0, 0, 0, 0, 0xffff, 0, 0]),
        96,
        "IPv4-mapped Address, RFC 4291",
    ),
    (
        v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0]),
        48,
        "IPv4-IPv6 Translat. (local use), RFC 8215",
    ),
    (
        v6([0x100, 0, 0, 0, 0, 0, 0, 0]),
        64,
        "Discard-Only Address Block, RFC 6666",
    ),
    (
        v6([0x100, 0, 0, 1, 0, 0, 0, 0]),
        64,
        "Dummy IPv6 Prefix, RFC 9780",
    ),
    (
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0]),
        23,
        "IETF Protocol Assignments, RFC 2928",
    ),
    (v6([0x2001, 0, 0, 0, 0, 0, 0, 0]), 32, "TEREDO, RFC 4380"),
    (
        v6([0x2001, 2, 0, 0, 0, 0, 0, 0]),
        48,
        "Benchmarking, RFC 5180",
    ),
    (
        v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0]),
        28,
        "Deprecated (previously ORCHID), RFC 4843",
    ),
    (
        v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0]),
        32,
        "Documentation, RFC 3849",
    ),
    (v6([0x2002, 0, 0, 0, 0, 0, 0, 0]), 16, "6to4, RFC 3056"),
    (
        v6([0x3fff, 0, 0, 0, 0, 0, 0, 0]),
        20,
        "Documentation, RFC 9637",
    ),
    (
        v6([0x5f00, 0, 0, 0, 0, 0, 0, 0]),
        16,
        "Segment Routing (SRv6) SIDs, RFC 9602",
    ),
    (
        v6([0xfc00, 0, 0, 0, 0, 0, 0, 0]),
        7,
        "Unique-Local, RFC 4193",
    ),
    (
        v6([0xfe80, 0, 0, 0, 0, 0, 0, 0]),
        10,
        "Link-Local Unicast, RFC 4291",
    ),
    // Beyond the special-purpose registry (design section 4.2).
    (
        v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0]),
        96,
        "IPv4-IPv6 Translat. (an embedding), RFC 6052",
    ),
    (
        v6([0, 0, 0, 0, 0, 0, 0, 0]),
        96,
        "IPv4-compatible (deprecated), RFC 4291",
    ),
    (
        v6([0xfec0, 0, 0, 0, 0, 0, 0, 0]),
        10,
        "Site-local (deprecated), RFC 3879",
    ),
    (v6([0xff00, 0, 0, 0, 0, 0, 0, 0]), 8, "Multicast, RFC 4291"),
    // IPv6 Address Space Registry: only 2000::/3 is global unicast. The rest of ::/0, as
    // the blocks that cover it beside 2000::/3.
    (
        v6([0, 0, 0, 0, 0, 0, 0, 0]),
        3,
        "outside 2000::/3, RFC 4291",
    ),
    (
        v6([0x4000, 0, 0, 0, 0, 0, 0, 0]),
        2,
        "outside 2000::/3, RFC 4291",
    ),
    (
        v6([0x8000, 0, 0, 0, 0, 0, 0, 0]),
        1,
        "outside 2000::/3, RFC 4291",
    ),
];

/// Globally reachable registry rows inside a block of [`V6_NOT_GLOBAL`].
pub(crate) const V6_GLOBAL_INSIDE: &[(Ipv6Addr, u8, &str)] = &[
    (
        v6([0x2001, 1, 0, 0, 0, 0, 0, 1]),
        128,
        "Port Control Protocol Anycast, RFC 7723",
    ),
    (
        v6([0x2001, 1, 0, 0, 0, 0, 0, 2]),
        128,
        "TURN Anycast, RFC 8155",
    ),
    (
        v6([0x2001, 1, 0, 0, 0, 0, 0, 3]),
        128,
        "DNS-SD Service Registration Protocol Anycast, RFC 9665",
    ),
    (v6([0x2001, 3, 0, 0, 0, 0, 0, 0]), 32, "AMT, RFC 7450"),
    (
        v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0]),
        48,
        "AS112-v6, RFC 7535",
    ),
    (
        v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0]),
        28,
        "ORCHIDv2, RFC 7343",
    ),
    (
        v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0]),
        28,
        "Drone Remote ID Protocol Entity Tags, RFC 9374",
    ),
];

/// Whether `ip` lies in the block `(net, len)`.
pub(crate) fn v4_in(ip: Ipv4Addr, (net, len, _): &(Ipv4Addr, u8, &str)) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
    u32::from(ip) & mask == u32::from(*net) & mask
}

/// Whether `ip` lies in the block `(net, len)`.
pub(crate) fn v6_in(ip: Ipv6Addr, (net, len, _): &(Ipv6Addr, u8, &str)) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(*len)).unwrap_or(0);
    u128::from(ip) & mask == u128::from(*net) & mask
}

/// An address of block `(net, len)`: its network bits, `bits` for the rest.
pub(crate) fn v4_at((net, len, _): &(Ipv4Addr, u8, &str), bits: u32) -> Ipv4Addr {
    let host = u32::MAX.checked_shr(u32::from(*len)).unwrap_or(0);
    Ipv4Addr::from((u32::from(*net) & !host) | (bits & host))
}

/// An address of block `(net, len)`: its network bits, `bits` for the rest.
pub(crate) fn v6_at((net, len, _): &(Ipv6Addr, u8, &str), bits: u128) -> Ipv6Addr {
    let host = u128::MAX.checked_shr(u32::from(*len)).unwrap_or(0);
    Ipv6Addr::from((u128::from(*net) & !host) | (bits & host))
}
