//! IP address classification (design section 4.2) per the IANA IPv4 and IPv6
//! Special-Purpose Address Registries (RFC 6890 and successors). Allow-only: an address
//! is [`AddrClass::Global`] only when it is positively globally reachable unicast;
//! everything else is private or special.
//!
//! It judges addresses it is given and nothing else: it never resolves a name, never
//! looks at the host's interfaces, and never makes an exception (those belong to the
//! grant's `allow_private`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

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
        embedded: Ipv4Addr,
        /// Whether the embedded address itself is global.
        inner_global: bool,
        /// Whether the embedded address itself is private (vs special) when not global.
        inner_private: bool,
    },
}

/// Classifies one address. IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is reported as
/// [`AddrClass::Embedded`].
///
/// The tables follow the IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890,
/// RFC 8190 and the RFCs named per block), plus IPv4 multicast (`224.0.0.0/4`) and, for
/// IPv6, the allow-only rule that only `2000::/3` (global unicast) can be global. Where the
/// registry marks a block inside a larger non-global one as globally reachable (AS112,
/// AMT, PCP and TURN anycast, ORCHIDv2, Drone Remote ID), the inner block wins.
///
/// For `64:ff9b:1::/48` (RFC 8215) the embedded address is read from the last 32 bits
/// (the RFC 6052 `/96` layout); other layouts are possible inside that block, but the
/// embedding is denied either way, so only the reported inner class could differ.
pub fn classify(ip: IpAddr) -> AddrClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

#[derive(Clone, Copy)]
enum V4Kind {
    Global,
    Private,
    Special,
}

#[derive(Clone, Copy)]
enum V6Kind {
    Global,
    Private,
    Special,
    Embedded(Embedding),
}

/// Where an IPv6 embedding keeps its IPv4 address.
#[derive(Clone, Copy)]
enum Embedding {
    /// The last 32 bits (IPv4-mapped, IPv4-compatible, NAT64 `/96`).
    Low32,
    /// Bits 16..48 (6to4, RFC 3056).
    SixToFour,
    /// The bitwise NOT of the last 32 bits (Teredo client address, RFC 4380).
    Teredo,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

const fn v6(s: [u16; 8], len: u8) -> Ipv6Net {
    Ipv6Net::new_assert(
        Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]),
        len,
    )
}

/// IPv4 blocks, most specific first: the first match wins. Addresses matching none are
/// global unicast.
const V4_TABLE: &[(Ipv4Net, V4Kind, &str)] = &[
    (
        v4(0, 0, 0, 0, 8),
        V4Kind::Special,
        "\"this network\" (0.0.0.0/8, RFC 791)",
    ),
    (
        v4(10, 0, 0, 0, 8),
        V4Kind::Private,
        "private-use (10.0.0.0/8, RFC 1918)",
    ),
    (
        v4(100, 64, 0, 0, 10),
        V4Kind::Private,
        "shared address space (100.64.0.0/10, RFC 6598)",
    ),
    (
        v4(127, 0, 0, 0, 8),
        V4Kind::Private,
        "loopback (127.0.0.0/8, RFC 1122)",
    ),
    (
        v4(169, 254, 0, 0, 16),
        V4Kind::Private,
        "link-local (169.254.0.0/16, RFC 3927)",
    ),
    (
        v4(172, 16, 0, 0, 12),
        V4Kind::Private,
        "private-use (172.16.0.0/12, RFC 1918)",
    ),
    (
        v4(192, 0, 0, 9, 32),
        V4Kind::Global,
        "PCP anycast (192.0.0.9/32, RFC 7723)",
    ),
    (
        v4(192, 0, 0, 10, 32),
        V4Kind::Global,
        "TURN anycast (192.0.0.10/32, RFC 8155)",
    ),
    (
        v4(192, 0, 0, 0, 24),
        V4Kind::Special,
        "IETF protocol assignments (192.0.0.0/24, RFC 6890)",
    ),
    (
        v4(192, 0, 2, 0, 24),
        V4Kind::Special,
        "documentation TEST-NET-1 (192.0.2.0/24, RFC 5737)",
    ),
    (
        v4(192, 31, 196, 0, 24),
        V4Kind::Global,
        "AS112-v4 (192.31.196.0/24, RFC 7535)",
    ),
    (
        v4(192, 52, 193, 0, 24),
        V4Kind::Global,
        "AMT (192.52.193.0/24, RFC 7450)",
    ),
    (
        v4(192, 88, 99, 0, 24),
        V4Kind::Special,
        "deprecated 6to4 relay anycast (192.88.99.0/24, RFC 7526)",
    ),
    (
        v4(192, 168, 0, 0, 16),
        V4Kind::Private,
        "private-use (192.168.0.0/16, RFC 1918)",
    ),
    (
        v4(192, 175, 48, 0, 24),
        V4Kind::Global,
        "AS112 direct delegation (192.175.48.0/24, RFC 7534)",
    ),
    (
        v4(198, 18, 0, 0, 15),
        V4Kind::Special,
        "benchmarking (198.18.0.0/15, RFC 2544)",
    ),
    (
        v4(198, 51, 100, 0, 24),
        V4Kind::Special,
        "documentation TEST-NET-2 (198.51.100.0/24, RFC 5737)",
    ),
    (
        v4(203, 0, 113, 0, 24),
        V4Kind::Special,
        "documentation TEST-NET-3 (203.0.113.0/24, RFC 5737)",
    ),
    (
        v4(224, 0, 0, 0, 4),
        V4Kind::Special,
        "multicast (224.0.0.0/4, RFC 5771)",
    ),
    (
        v4(255, 255, 255, 255, 32),
        V4Kind::Special,
        "limited broadcast (255.255.255.255/32, RFC 919)",
    ),
    (
        v4(240, 0, 0, 0, 4),
        V4Kind::Special,
        "reserved (240.0.0.0/4, RFC 1112)",
    ),
];

/// IPv6 blocks, most specific first: the first match wins. Addresses matching none are
/// special (allow-only: outside `2000::/3` nothing is global unicast).
const V6_TABLE: &[(Ipv6Net, V6Kind, &str)] = &[
    (
        v6([0, 0, 0, 0, 0, 0, 0, 0], 128),
        V6Kind::Special,
        "unspecified (::/128, RFC 4291)",
    ),
    (
        v6([0, 0, 0, 0, 0, 0, 0, 1], 128),
        V6Kind::Private,
        "loopback (::1/128, RFC 4291)",
    ),
    (
        v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),
        V6Kind::Embedded(Embedding::Low32),
        "IPv4-mapped (::ffff:0:0/96, RFC 4291)",
    ),
    (
        v6([0, 0, 0, 0, 0, 0, 0, 0], 96),
        V6Kind::Embedded(Embedding::Low32),
        "IPv4-compatible, deprecated (::/96, RFC 4291)",
    ),
    (
        v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96),
        V6Kind::Embedded(Embedding::Low32),
        "NAT64 (64:ff9b::/96, RFC 6052)",
    ),
    (
        v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
        V6Kind::Embedded(Embedding::Low32),
        "local-use NAT64 (64:ff9b:1::/48, RFC 8215)",
    ),
    (
        v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64),
        V6Kind::Special,
        "discard-only (100::/64, RFC 6666)",
    ),
    (
        v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64),
        V6Kind::Special,
        "dummy prefix (100:0:0:1::/64, RFC 9780)",
    ),
    (
        v6([0x2001, 1, 0, 0, 0, 0, 0, 1], 128),
        V6Kind::Global,
        "PCP anycast (2001:1::1/128, RFC 7723)",
    ),
    (
        v6([0x2001, 1, 0, 0, 0, 0, 0, 2], 128),
        V6Kind::Global,
        "TURN anycast (2001:1::2/128, RFC 8155)",
    ),
    (
        v6([0x2001, 1, 0, 0, 0, 0, 0, 3], 128),
        V6Kind::Global,
        "DNS-SD SRP anycast (2001:1::3/128, RFC 9665)",
    ),
    (
        v6([0x2001, 3, 0, 0, 0, 0, 0, 0], 32),
        V6Kind::Global,
        "AMT (2001:3::/32, RFC 7450)",
    ),
    (
        v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48),
        V6Kind::Global,
        "AS112-v6 (2001:4:112::/48, RFC 7535)",
    ),
    (
        v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28),
        V6Kind::Global,
        "ORCHIDv2 (2001:20::/28, RFC 7343)",
    ),
    (
        v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28),
        V6Kind::Global,
        "Drone Remote ID (2001:30::/28, RFC 9374)",
    ),
    (
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32),
        V6Kind::Embedded(Embedding::Teredo),
        "Teredo (2001::/32, RFC 4380)",
    ),
    (
        v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48),
        V6Kind::Special,
        "benchmarking (2001:2::/48, RFC 5180)",
    ),
    (
        v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0], 28),
        V6Kind::Special,
        "deprecated ORCHID (2001:10::/28, RFC 4843)",
    ),
    (
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),
        V6Kind::Special,
        "IETF protocol assignments (2001::/23, RFC 2928)",
    ),
    (
        v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        V6Kind::Special,
        "documentation (2001:db8::/32, RFC 3849)",
    ),
    (
        v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16),
        V6Kind::Embedded(Embedding::SixToFour),
        "6to4 (2002::/16, RFC 3056)",
    ),
    (
        v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
        V6Kind::Special,
        "documentation (3fff::/20, RFC 9637)",
    ),
    (
        v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16),
        V6Kind::Special,
        "SRv6 SIDs (5f00::/16, RFC 9602)",
    ),
    (
        v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
        V6Kind::Private,
        "unique-local (fc00::/7, RFC 4193)",
    ),
    (
        v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
        V6Kind::Private,
        "link-local (fe80::/10, RFC 4291)",
    ),
    (
        v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
        V6Kind::Special,
        "deprecated site-local (fec0::/10, RFC 3879)",
    ),
    (
        v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
        V6Kind::Special,
        "multicast (ff00::/8, RFC 4291)",
    ),
    (
        v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3),
        V6Kind::Global,
        "global unicast (2000::/3, RFC 4291)",
    ),
];

fn classify_v4(ip: Ipv4Addr) -> AddrClass {
    for (net, kind, name) in V4_TABLE {
        if net.contains(&ip) {
            return match kind {
                V4Kind::Global => AddrClass::Global,
                V4Kind::Private => AddrClass::Private(name),
                V4Kind::Special => AddrClass::Special(name),
            };
        }
    }
    AddrClass::Global
}

fn classify_v6(ip: Ipv6Addr) -> AddrClass {
    for (net, kind, name) in V6_TABLE {
        if net.contains(&ip) {
            return match kind {
                V6Kind::Global => AddrClass::Global,
                V6Kind::Private => AddrClass::Private(name),
                V6Kind::Special => AddrClass::Special(name),
                V6Kind::Embedded(how) => {
                    let embedded = extract(ip, *how);
                    let inner = classify_v4(embedded);
                    AddrClass::Embedded {
                        kind: name,
                        embedded,
                        inner_global: inner == AddrClass::Global,
                        inner_private: matches!(inner, AddrClass::Private(_)),
                    }
                }
            };
        }
    }
    AddrClass::Special("not global unicast (outside 2000::/3: unallocated or reserved, RFC 4291)")
}

fn extract(ip: Ipv6Addr, how: Embedding) -> Ipv4Addr {
    let bits = u128::from(ip);
    // Truncating casts pick the 32 bits wanted.
    match how {
        Embedding::Low32 => Ipv4Addr::from(bits as u32),
        Embedding::SixToFour => Ipv4Addr::from((bits >> 80) as u32),
        Embedding::Teredo => Ipv4Addr::from(!(bits as u32)),
    }
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;
