//! The addresses of one capture run (design section 15): the sandbox's own address on the
//! TUN device, the stub resolver's, and the synthetic pool the stub hands out, IPv4 from
//! 198.18.0.0/15 (RFC 2544's benchmarking block, never routed on the internet) and IPv6
//! from a ULA /48 (RFC 4193, a random global ID per run).
//!
//! Pure arithmetic: an index `i` in the pool is one name, and the same `i` gives its IPv4
//! and its IPv6 address, so a name has one of each.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// 198.18.0.0/15 as a number.
const V4_BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
/// Addresses at the start of either range kept for the sandbox and the stub.
const RESERVED: u32 = 16;
/// Size of 198.18.0.0/15.
const V4_SIZE: u32 = 1 << 17;

/// Most synthetic addresses (names) one run hands out.
pub(crate) const POOL: u32 = V4_SIZE - RESERVED - 1;

/// The addresses of one run: everything derives from the ULA prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Addresses {
    /// The first 48 bits of the ULA prefix (`fd` then a random 40-bit global ID).
    ula: [u8; 6],
}

impl Addresses {
    /// A fresh ULA prefix (RFC 4193 section 3.2: `fd` and 40 random bits).
    pub(crate) fn generate() -> Self {
        let mut ula = [0u8; 6];
        // Should /dev/urandom be unreadable, the clock still gives a valid (if guessable)
        // prefix: it only names the sandbox's own addresses, so nothing depends on secrecy.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
            ^ u128::from(std::process::id());
        ula[0] = 0xfd;
        let mut random = [0u8; 5];
        if std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut random))
            .is_err()
        {
            random.copy_from_slice(&seed.to_be_bytes()[11..16]);
        }
        ula[1..].copy_from_slice(&random);
        Self { ula }
    }

    /// The prefix as the first 48 bits of an address.
    fn v6(&self, low: u64) -> Ipv6Addr {
        let mut b = [0u8; 16];
        b[..6].copy_from_slice(&self.ula);
        b[8..].copy_from_slice(&low.to_be_bytes());
        Ipv6Addr::from(b)
    }

    /// The sandbox's own IPv4 address on the TUN (198.18.0.1).
    pub(crate) fn tun_v4(&self) -> Ipv4Addr {
        Ipv4Addr::from(V4_BASE + 1)
    }

    /// The sandbox's own IPv6 address on the TUN (`<prefix>::1`).
    pub(crate) fn tun_v6(&self) -> Ipv6Addr {
        self.v6(1)
    }

    /// The stub resolver (198.18.0.2), reached through the TUN.
    pub(crate) fn dns_v4(&self) -> Ipv4Addr {
        Ipv4Addr::from(V4_BASE + 2)
    }

    /// The stub resolver's IPv6 address (`<prefix>::2`).
    pub(crate) fn dns_v6(&self) -> Ipv6Addr {
        self.v6(2)
    }

    /// Whether `ip` is the stub resolver.
    pub(crate) fn is_dns(&self, ip: IpAddr) -> bool {
        ip == IpAddr::V4(self.dns_v4()) || ip == IpAddr::V6(self.dns_v6())
    }

    /// The IPv4 address of pool index `i` (`i < POOL`).
    pub(crate) fn synthetic_v4(&self, i: u32) -> Ipv4Addr {
        Ipv4Addr::from(V4_BASE + RESERVED + i.min(POOL - 1))
    }

    /// The IPv6 address of pool index `i`.
    pub(crate) fn synthetic_v6(&self, i: u32) -> Ipv6Addr {
        self.v6(u64::from(RESERVED + i.min(POOL - 1)))
    }

    /// The pool index `ip` stands for, if it is a synthetic address of this run.
    pub(crate) fn index_of(&self, ip: IpAddr) -> Option<u32> {
        let low = match ip {
            IpAddr::V4(v4) => u32::from(v4).checked_sub(V4_BASE)?,
            IpAddr::V6(v6) => {
                let b = v6.octets();
                if b[..6] != self.ula || b[6..8] != [0, 0] {
                    return None;
                }
                u32::try_from(u64::from_be_bytes(b[8..].try_into().ok()?)).ok()?
            }
        };
        let i = low.checked_sub(RESERVED)?;
        (i < POOL).then_some(i)
    }

    /// Whether `ip` is in one of this run's ranges (198.18.0.0/15, the ULA /48).
    pub(crate) fn is_ours(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => u32::from(v4) & !(V4_SIZE - 1) == V4_BASE,
            IpAddr::V6(v6) => v6.octets()[..6] == self.ula,
        }
    }

    /// The `/etc/resolv.conf` the sandbox sees: the stub only, no search list.
    pub(crate) fn resolv_conf(&self) -> String {
        format!(
            "# Written by the shim: names resolve to synthetic addresses that the shim\n\
             # carries to the mediator (transparent capture).\n\
             nameserver {}\noptions timeout:2 attempts:2\n",
            self.dns_v4()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_map_to_addresses_and_back() {
        let a = Addresses::generate();
        assert_eq!(a.ula[0], 0xfd);
        for i in [0, 1, 4095, POOL - 1] {
            let v4 = IpAddr::V4(a.synthetic_v4(i));
            let v6 = IpAddr::V6(a.synthetic_v6(i));
            assert_eq!(a.index_of(v4), Some(i), "{v4}");
            assert_eq!(a.index_of(v6), Some(i), "{v6}");
            assert!(a.is_ours(v4) && a.is_ours(v6));
        }
        assert_eq!(a.synthetic_v4(0), Ipv4Addr::new(198, 18, 0, 16));
        assert_eq!(a.synthetic_v4(POOL - 1), Ipv4Addr::new(198, 19, 255, 254));
        // The sandbox's and the stub's own addresses are no pool entry.
        for ip in [a.tun_v4().into(), a.dns_v4().into(), IpAddr::V6(a.tun_v6())] {
            assert_eq!(a.index_of(ip), None, "{ip}");
            assert!(a.is_ours(ip));
        }
        assert!(a.is_dns(a.dns_v4().into()) && a.is_dns(a.dns_v6().into()));
        for outside in [
            "198.20.0.1",
            "198.17.255.255",
            "127.0.0.1",
            "fe80::1",
            "::1",
        ] {
            let ip: IpAddr = outside.parse().unwrap();
            assert!(!a.is_ours(ip) && a.index_of(ip).is_none(), "{ip}");
        }
    }

    #[test]
    fn resolv_conf_names_the_stub_only() {
        let a = Addresses::generate();
        let text = a.resolv_conf();
        assert!(text.contains("nameserver 198.18.0.2\n"), "{text}");
        assert!(!text.contains("search"), "{text}");
    }
}
