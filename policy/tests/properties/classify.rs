//! Classification never passes an address inside a block that is not globally reachable
//! (the IANA special-purpose registries, as written in [`crate::iana`]), and the address
//! check of a grant without exceptions denies it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use policy::{AddrClass, Grant, GrantSpec, OwnAddrs, Reason, classify, parse_authority_form};
use proptest::prelude::*;

use crate::iana::{
    V4_GLOBAL_INSIDE, V4_NOT_GLOBAL, V6_GLOBAL_INSIDE, V6_NOT_GLOBAL, v4_at, v4_in, v6_at, v6_in,
};

/// A grant with no `allow_private` exception (the address check alone decides).
fn strict() -> Grant {
    Grant::new(
        &GrantSpec {
            name: "props".into(),
            allow: vec!["*.example.com".into()],
            ..GrantSpec::default()
        },
        &[],
    )
    .unwrap()
}

/// `ip` is not global: classified so, and denied by the address check as private or
/// special.
fn never_passes(ip: IpAddr, block: &str) -> Result<(), TestCaseError> {
    prop_assert_ne!(classify(ip), AddrClass::Global, "{} in {}", ip, block);
    let target = parse_authority_form("a.example.com:443").unwrap();
    let denied = strict().vet(&target, &[ip], &OwnAddrs::default());
    let reason = denied.err().map(|d| d.reason);
    prop_assert!(
        matches!(
            reason,
            Some(Reason::PrivateAddress | Reason::SpecialAddress)
        ),
        "{} in {}: {:?}",
        ip,
        block,
        reason
    );
    // Mixed with a global address, the whole answer is still refused.
    let global: IpAddr = "8.8.8.8".parse().unwrap();
    prop_assert!(
        strict()
            .vet(&target, &[global, ip], &OwnAddrs::default())
            .is_err()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Every address of every non-global IPv4 block (but the global rows inside them).
    #[test]
    fn no_address_of_a_non_global_ipv4_block_passes(
        block in proptest::sample::select(V4_NOT_GLOBAL),
        bits in any::<u32>(),
    ) {
        let ip = v4_at(&block, bits);
        prop_assume!(!V4_GLOBAL_INSIDE.iter().any(|g| v4_in(ip, g)));
        never_passes(IpAddr::V4(ip), block.2)?;
    }

    /// Every address of every non-global IPv6 block (but the global rows inside them).
    #[test]
    fn no_address_of_a_non_global_ipv6_block_passes(
        block in proptest::sample::select(V6_NOT_GLOBAL),
        bits in any::<u128>(),
    ) {
        let ip = v6_at(&block, bits);
        prop_assume!(!V6_GLOBAL_INSIDE.iter().any(|g| v6_in(ip, g)));
        never_passes(IpAddr::V6(ip), block.2)?;
    }

    /// Any address the classifier calls global lies in no non-global block (or in one of
    /// the globally reachable rows inside one): the same property from the other side,
    /// over all addresses.
    #[test]
    fn a_global_ipv4_address_is_in_no_non_global_block(ip in any::<u32>()) {
        let ip = Ipv4Addr::from(ip);
        if classify(IpAddr::V4(ip)) == AddrClass::Global {
            let hit = V4_NOT_GLOBAL.iter().find(|b| v4_in(ip, b));
            let excepted = V4_GLOBAL_INSIDE.iter().any(|g| v4_in(ip, g));
            prop_assert!(hit.is_none() || excepted, "{} in {:?}", ip, hit.map(|b| b.2));
        }
    }

    /// As above, for IPv6; addresses drawn near the blocks' edges too.
    #[test]
    fn a_global_ipv6_address_is_in_no_non_global_block(
        ip in prop_oneof![
            any::<u128>(),
            (proptest::sample::select(V6_NOT_GLOBAL), any::<u128>())
                .prop_map(|(b, bits)| u128::from(v6_at(&b, bits)) ^ 1u128.rotate_left(bits as u32 % 128)),
        ]
    ) {
        let ip = Ipv6Addr::from(ip);
        if classify(IpAddr::V6(ip)) == AddrClass::Global {
            let hit = V6_NOT_GLOBAL.iter().find(|b| v6_in(ip, b));
            let excepted = V6_GLOBAL_INSIDE.iter().any(|g| v6_in(ip, g));
            prop_assert!(hit.is_none() || excepted, "{} in {:?}", ip, hit.map(|b| b.2));
        }
    }
}

/// Each registry row has an address that the classifier refuses (a row the table of
/// `classify.rs` lost would show here even if the random draws missed it), its first and
/// its last.
#[test]
fn the_first_and_last_address_of_every_block_is_refused() {
    for block in V4_NOT_GLOBAL {
        for bits in [0, u32::MAX] {
            let ip = v4_at(block, bits);
            if !V4_GLOBAL_INSIDE.iter().any(|g| v4_in(ip, g)) {
                never_passes(IpAddr::V4(ip), block.2).unwrap();
            }
        }
    }
    for block in V6_NOT_GLOBAL {
        for bits in [0, u128::MAX] {
            let ip = v6_at(block, bits);
            if !V6_GLOBAL_INSIDE.iter().any(|g| v6_in(ip, g)) {
                never_passes(IpAddr::V6(ip), block.2).unwrap();
            }
        }
    }
}
