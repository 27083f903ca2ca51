//! The address classification table: one row per IANA special-purpose block (and its
//! edges), with the class and block name expected.

use super::*;

/// Expected class; the string is a fragment of the block name.
#[derive(Debug)]
enum Want {
    G,
    P(&'static str),
    S(&'static str),
    /// Embedding kind fragment, embedded address, inner class ('g', 'p' or 's').
    E(&'static str, &'static str, char),
}
use Want::{E, G, P, S};

/// Rows from the IANA IPv4/IPv6 Special-Purpose Address Registries and the RFCs named.
const ROWS: &[(&str, Want)] = &[
    // IPv4, RFC 6890 and updates.
    ("0.0.0.0", S("0.0.0.0/8")),
    ("0.1.2.3", S("0.0.0.0/8")),
    ("0.255.255.255", S("0.0.0.0/8")),
    ("1.0.0.0", G),
    ("1.1.1.1", G),
    ("8.8.8.8", G),
    ("9.255.255.255", G),
    ("10.0.0.0", P("RFC 1918")),
    ("10.255.255.255", P("10.0.0.0/8")),
    ("11.0.0.0", G),
    ("100.63.255.255", G),
    ("100.64.0.0", P("RFC 6598")),
    ("100.127.255.255", P("100.64.0.0/10")),
    ("100.128.0.0", G),
    ("126.255.255.255", G),
    ("127.0.0.1", P("loopback")),
    ("127.255.255.254", P("127.0.0.0/8")),
    ("128.0.0.0", G),
    ("169.253.255.255", G),
    ("169.254.0.1", P("link-local")),
    ("169.254.169.254", P("169.254.0.0/16")),
    ("169.255.0.0", G),
    ("172.15.255.255", G),
    ("172.16.0.0", P("172.16.0.0/12")),
    ("172.31.255.255", P("172.16.0.0/12")),
    ("172.32.0.0", G),
    ("191.255.255.255", G),
    ("192.0.0.0", S("192.0.0.0/24")),
    ("192.0.0.8", S("192.0.0.0/24")),
    ("192.0.0.9", G),
    ("192.0.0.10", G),
    ("192.0.0.11", S("192.0.0.0/24")),
    ("192.0.0.170", S("192.0.0.0/24")),
    ("192.0.0.171", S("192.0.0.0/24")),
    ("192.0.0.255", S("IETF protocol assignments")),
    ("192.0.1.0", G),
    ("192.0.2.0", S("TEST-NET-1")),
    ("192.0.2.255", S("RFC 5737")),
    ("192.0.3.0", G),
    ("192.31.196.1", G),
    ("192.52.193.1", G),
    ("192.88.98.255", G),
    ("192.88.99.1", S("6to4 relay")),
    ("192.88.100.0", G),
    ("192.167.255.255", G),
    ("192.168.0.1", P("192.168.0.0/16")),
    ("192.168.255.255", P("RFC 1918")),
    ("192.169.0.0", G),
    ("192.175.48.1", G),
    ("198.17.255.255", G),
    ("198.18.0.0", S("benchmarking")),
    ("198.19.255.255", S("RFC 2544")),
    ("198.20.0.0", G),
    ("198.51.100.7", S("TEST-NET-2")),
    ("203.0.113.7", S("TEST-NET-3")),
    ("203.0.114.0", G),
    ("223.255.255.255", G),
    ("224.0.0.1", S("multicast")),
    ("239.255.255.255", S("multicast")),
    ("240.0.0.1", S("reserved")),
    ("254.255.255.255", S("240.0.0.0/4")),
    ("255.255.255.254", S("240.0.0.0/4")),
    ("255.255.255.255", S("broadcast")),
    // IPv6, RFC 6890, 4291 and updates.
    ("::", S("unspecified")),
    ("::1", P("loopback")),
    ("::2", E("IPv4-compatible", "0.0.0.2", 's')),
    ("::8.8.8.8", E("IPv4-compatible", "8.8.8.8", 'g')),
    ("::ffff:8.8.8.8", E("IPv4-mapped", "8.8.8.8", 'g')),
    ("::ffff:127.0.0.1", E("IPv4-mapped", "127.0.0.1", 'p')),
    ("::ffff:192.0.2.1", E("IPv4-mapped", "192.0.2.1", 's')),
    ("::ffff:0:0", E("IPv4-mapped", "0.0.0.0", 's')),
    ("::fffe:0:0", S("outside 2000::/3")),
    ("::1:0:0:0", S("outside 2000::/3")),
    ("64:ff9b::8.8.8.8", E("RFC 6052", "8.8.8.8", 'g')),
    ("64:ff9b::10.0.0.1", E("NAT64", "10.0.0.1", 'p')),
    ("64:ff9b::192.0.2.33", E("64:ff9b::/96", "192.0.2.33", 's')),
    ("64:ff9b:0:0:0:1::", S("outside 2000::/3")),
    ("64:ff9b:1::8.8.8.8", E("RFC 8215", "8.8.8.8", 'g')),
    (
        "64:ff9b:1:ffff::127.0.0.1",
        E("64:ff9b:1::/48", "127.0.0.1", 'p'),
    ),
    ("64:ff9b:2::1", S("outside 2000::/3")),
    ("100::", S("discard")),
    ("100::ffff:ffff:ffff:ffff", S("RFC 6666")),
    ("100:0:0:1::1", S("dummy")),
    ("100:0:0:2::1", S("outside 2000::/3")),
    (
        "1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        S("outside 2000::/3"),
    ),
    ("2000::1", G),
    ("2001::", E("Teredo", "255.255.255.255", 's')),
    (
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        E("RFC 4380", "192.0.2.45", 's'),
    ),
    (
        "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
        E("Teredo", "8.8.8.8", 'g'),
    ),
    (
        "2001:0:4136:e378:8000:63bf:80ff:fffe",
        E("Teredo", "127.0.0.1", 'p'),
    ),
    (
        "2001:0:ffff:ffff:ffff:ffff:ffff:ffff",
        E("2001::/32", "0.0.0.0", 's'),
    ),
    ("2001:1::", S("IETF protocol assignments")),
    ("2001:1::1", G),
    ("2001:1::2", G),
    ("2001:1::3", G),
    ("2001:1::4", S("2001::/23")),
    ("2001:2::1", S("benchmarking")),
    ("2001:2:0:ffff::1", S("RFC 5180")),
    ("2001:2:1::1", S("2001::/23")),
    ("2001:3::1", G),
    ("2001:3:ffff::1", G),
    ("2001:4:112::1", G),
    ("2001:4:113::1", S("2001::/23")),
    ("2001:10::1", S("ORCHID")),
    ("2001:1f::1", S("ORCHID")),
    ("2001:20::1", G),
    ("2001:2f:ffff::1", G),
    ("2001:30::1", G),
    ("2001:3f::1", G),
    ("2001:40::1", S("2001::/23")),
    ("2001:1ff:ffff::1", S("IETF protocol assignments")),
    ("2001:200::1", G),
    ("2001:4860:4860::8888", G),
    ("2001:db7:ffff::1", G),
    ("2001:db8::1", S("RFC 3849")),
    ("2001:db8:ffff::1", S("documentation")),
    ("2001:db9::1", G),
    ("2002::", E("6to4", "0.0.0.0", 's')),
    ("2002:0808:0808::1", E("RFC 3056", "8.8.8.8", 'g')),
    ("2002:c000:0221::1", E("2002::/16", "192.0.2.33", 's')),
    ("2002:0a00:0001:ffff::1", E("6to4", "10.0.0.1", 'p')),
    ("2002:a9fe:a9fe::", E("6to4", "169.254.169.254", 'p')),
    ("2003::1", G),
    ("2606:4700:4700::1111", G),
    ("2620:4f:8000::1", G),
    ("3ffe::1", G),
    ("3fff::1", S("RFC 9637")),
    ("3fff:fff::1", S("3fff::/20")),
    ("3fff:1000::1", G),
    ("4000::1", S("outside 2000::/3")),
    ("5f00::1", S("SRv6")),
    ("8000::1", S("outside 2000::/3")),
    ("fbff::1", S("outside 2000::/3")),
    ("fc00::1", P("unique-local")),
    ("fd12:3456:789a::1", P("fc00::/7")),
    ("fe00::1", S("outside 2000::/3")),
    ("fe80::1", P("link-local")),
    ("febf:ffff::1", P("fe80::/10")),
    ("fec0::1", S("site-local")),
    ("ff02::1", S("multicast")),
    ("ff0e::1", S("ff00::/8")),
];

#[test]
fn classification_table() {
    let mut failures = Vec::new();
    for (text, want) in ROWS {
        let ip: IpAddr = text.parse().unwrap();
        let got = classify(ip);
        let ok = match (want, got) {
            (G, AddrClass::Global) => true,
            (P(frag), AddrClass::Private(name)) | (S(frag), AddrClass::Special(name)) => {
                name.contains(frag)
            }
            (
                E(frag, addr, inner),
                AddrClass::Embedded {
                    kind,
                    embedded,
                    inner_global,
                    inner_private,
                },
            ) => {
                let got_inner = match (inner_global, inner_private) {
                    (true, false) => 'g',
                    (false, true) => 'p',
                    (false, false) => 's',
                    (true, true) => '?',
                };
                kind.contains(frag) && embedded.to_string() == *addr && got_inner == *inner
            }
            _ => false,
        };
        if !ok {
            failures.push(format!("{text}: want {want:?}, got {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn tables_are_ordered_most_specific_first() {
    // An entry shadowed by an earlier, wider one would never match: check none is.
    for (i, (net, _, name)) in V4_TABLE.iter().enumerate() {
        for (wider, _, wname) in &V4_TABLE[..i] {
            assert!(!wider.contains(net), "{name} is shadowed by {wname}");
        }
    }
    for (i, (net, _, name)) in V6_TABLE.iter().enumerate() {
        for (wider, _, wname) in &V6_TABLE[..i] {
            assert!(!wider.contains(net), "{name} is shadowed by {wname}");
        }
    }
}
