//! An IPv4 address and its IPv6 forms agree (design section 4.2): IPv4-mapped
//! (`::ffff:a.b.c.d`, RFC 4291), IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::/96`,
//! RFC 6052, and `64:ff9b:1::/48`, RFC 8215), 6to4 (`2002:AABB:CCDD::/48`, RFC 3056) and
//! Teredo (`2001:0:SERVER:FLAGS:PORT:~CLIENT`, RFC 4380). Each form is classified as an
//! embedding of exactly that address, with that address's own class; the address check
//! never lets a form through where the address alone would be refused (and refuses every
//! form as an embedding); an IPv4-mapped literal is the IPv4 host itself.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use policy::{
    AddrClass, Grant, GrantSpec, OwnAddrs, Reason, canonicalize_host, classify,
    parse_authority_form,
};
use proptest::prelude::*;

/// The IPv6 forms of `a`, with the free bits of each layout taken from `free`.
fn forms(a: Ipv4Addr, free: u128) -> Vec<(&'static str, Ipv6Addr)> {
    let a32 = u128::from(u32::from(a));
    let low = |prefix: u128| Ipv6Addr::from(prefix | a32);
    let mut forms = vec![("IPv4-mapped", low(0xffff << 32))];
    // `::` and `::1` are the unspecified and loopback addresses, not embeddings.
    if a32 > 1 {
        forms.push(("IPv4-compatible", low(0)));
    }
    forms.extend([
        ("NAT64 /96", low(0x0064_ff9b << 96)),
        // 64:ff9b:1::/48 with the address in the last 32 bits; bits 48..96 are free.
        (
            "local-use NAT64",
            low((0x0064_ff9b_0001 << 80) | (free & (((1 << 48) - 1) << 32))),
        ),
        // 2002:AABB:CCDD::/48, then any subnet and interface identifier.
        (
            "6to4",
            Ipv6Addr::from((0x2002 << 112) | (a32 << 80) | (free & ((1 << 80) - 1))),
        ),
        // 2001:0:SERVER:FLAGS:PORT then the client address inverted; server, flags and
        // port are free.
        (
            "Teredo",
            Ipv6Addr::from(
                (0x2001_0000 << 96) | (free & (((1 << 64) - 1) << 32)) | u128::from(!u32::from(a)),
            ),
        ),
    ]);
    forms
}

/// Allows every IPv4 and IPv6 literal, with `allow_private` as given (refused when an
/// exception covers "this host", `0.0.0.0/8` or `::`).
fn grant(allow_private: Vec<String>) -> Result<Grant, policy::PolicyError> {
    Grant::new(
        &GrantSpec {
            name: "props".into(),
            allow: vec!["0.0.0.0/0".into(), "::/0".into()],
            allow_private,
            ..GrantSpec::default()
        },
        &[],
    )
}

fn target(ip: IpAddr) -> policy::Target {
    let host = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    parse_authority_form(&format!("{host}:443")).unwrap()
}

/// Any IPv4 address, drawn from the interesting blocks more often than uniformly.
fn ipv4() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![
        any::<u32>().prop_map(Ipv4Addr::from),
        (
            proptest::sample::select(
                &[
                    [8, 8, 8, 8],
                    [10, 0, 0, 0],
                    [127, 0, 0, 0],
                    [169, 254, 0, 0],
                    [192, 0, 2, 0],
                    [192, 168, 0, 0],
                    [100, 64, 0, 0],
                    [0, 0, 0, 0],
                ][..]
            ),
            any::<u16>()
        )
            .prop_map(|(b, low)| {
                let [x, y] = low.to_be_bytes();
                Ipv4Addr::new(b[0], b[1], x, y)
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Each form is an embedding of `a` carrying `a`'s own class.
    #[test]
    fn every_form_is_classified_as_an_embedding_of_the_address(a in ipv4(), free in any::<u128>()) {
        let own = classify(IpAddr::V4(a));
        for (name, v6) in forms(a, free) {
            match classify(IpAddr::V6(v6)) {
                AddrClass::Embedded { embedded, inner_global, inner_private, .. } => {
                    prop_assert_eq!(embedded, a, "{} {}", name, v6);
                    prop_assert_eq!(inner_global, own == AddrClass::Global, "{} {}", name, v6);
                    prop_assert_eq!(
                        inner_private,
                        matches!(own, AddrClass::Private(_)),
                        "{} {}",
                        name,
                        v6
                    );
                }
                other => prop_assert!(false, "{} {} classified {:?}", name, v6, other),
            }
        }
    }

    /// The address check: a form never passes where the address is refused, and every
    /// form is refused as an embedding (`special_address`), even when an exception covers
    /// the IPv4 address; only an exception for the IPv6 address itself lets it through.
    #[test]
    fn the_address_check_refuses_every_form(a in ipv4(), free in any::<u128>()) {
        let own = OwnAddrs::default();
        let plain = grant(Vec::new()).unwrap();
        // No exception can name 0.0.0.0/8 ("this host"): then only the plain grant.
        let excepted = grant(vec![format!("{a}/32")]).ok();
        let alone = plain.vet(&target(IpAddr::V4(a)), &[IpAddr::V4(a)], &own);
        for (name, v6) in forms(a, free) {
            let ip = IpAddr::V6(v6);
            for g in std::iter::once(&plain).chain(excepted.as_ref()) {
                let got = g.vet(&target(ip), &[ip], &own);
                prop_assert_eq!(
                    got.err().map(|d| d.reason),
                    Some(Reason::SpecialAddress),
                    "{} {}",
                    name,
                    v6
                );
            }
            if alone.is_err() {
                let mixed = plain.vet(&target(IpAddr::V4(a)), &[ip, IpAddr::V4(a)], &own);
                prop_assert!(mixed.is_err());
            }
            // A mapped 0.0.0.0/8 address is "this host" (the IPv4 address it maps to):
            // never excepted, whatever allow_private says.
            let this_host = name == "IPv4-mapped" && a.octets()[0] == 0;
            if let Ok(v6_excepted) = grant(vec![format!("{v6}/128")]) {
                let got = v6_excepted.vet(&target(ip), &[ip], &own);
                prop_assert_eq!(got.is_ok(), !this_host, "{} {}", name, v6);
            }
        }
    }

    /// An IPv4-mapped literal is canonicalised to the IPv4 host, so every grant decides
    /// it exactly as the IPv4 address; the other forms stay IPv6 hosts and are refused as
    /// embeddings by the decision itself.
    #[test]
    fn a_mapped_literal_is_decided_as_the_address(a in ipv4(), free in any::<u128>()) {
        let plain = grant(Vec::new()).unwrap();
        let mapped = format!("::ffff:{a}");
        prop_assert_eq!(canonicalize_host(&mapped).unwrap(), canonicalize_host(&a.to_string()).unwrap());
        let v4 = plain.decide(&target(IpAddr::V4(a)));
        let via = plain.decide(&parse_authority_form(&format!("[{mapped}]:443")).unwrap());
        prop_assert_eq!((v4.verdict, v4.reason, v4.rule), (via.verdict, via.reason, via.rule));
        for (name, v6) in forms(a, free).into_iter().skip(1) {
            let d = plain.decide(&target(IpAddr::V6(v6)));
            prop_assert_eq!(d.reason, Reason::SpecialAddress, "{} {}", name, v6);
        }
    }
}
