//! What capture refused to carry (design section 15): UDP other than DNS, ICMP and every
//! other protocol, TCP to an address of the synthetic range that no name was given, and
//! DNS datagrams the stub resolver could not answer.
//! Nothing of it leaves the namespace; each is counted per destination for `--report`.
//!
//! Bounded: at most [`MAX_DESTINATIONS`] destinations are told apart; the rest are
//! counted together.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;

use serde::Serialize;

/// Most destinations counted one by one.
pub(crate) const MAX_DESTINATIONS: usize = 1024;

/// What kind of traffic was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// A UDP datagram (not DNS).
    Udp,
    /// An ICMP or ICMPv6 message.
    Icmp,
    /// Another IP protocol (its number is in `protocol`).
    Other,
    /// TCP to a synthetic address that the stub resolver never handed out.
    UnmappedTcp,
    /// A UDP datagram to port 53 that got no answer: a wrong checksum, not a DNS query, a
    /// reply that would not fit the MTU, or a reply the TUN device did not take.
    Dns,
}

/// One destination's count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Dropped {
    /// What was dropped.
    pub(crate) kind: Kind,
    /// The IP protocol number (IANA "Assigned Internet Protocol Numbers").
    pub(crate) protocol: u8,
    /// The destination address (`None`: the destinations beyond [`MAX_DESTINATIONS`]).
    pub(crate) destination: Option<IpAddr>,
    /// The destination port (UDP and TCP).
    pub(crate) port: Option<u16>,
    /// The host the address stands for, when it is a synthetic address of this run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) host: Option<String>,
    /// Packets dropped.
    pub(crate) packets: u64,
}

type Key = (Kind, u8, Option<IpAddr>, Option<u16>);

/// The run's drop counts.
#[derive(Debug, Default)]
pub(crate) struct Drops {
    counts: Mutex<BTreeMap<Key, (Option<String>, u64)>>,
}

impl Drops {
    /// Count one dropped packet; `host` names a synthetic destination.
    pub(crate) fn count(
        &self,
        kind: Kind,
        protocol: u8,
        destination: IpAddr,
        port: Option<u16>,
        host: Option<String>,
    ) {
        let mut counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (kind, protocol, Some(destination), port);
        let key = if counts.contains_key(&key) || counts.len() < MAX_DESTINATIONS {
            key
        } else {
            (kind, protocol, None, None)
        };
        let host = if key.2.is_some() { host } else { None };
        counts.entry(key).or_insert((host, 0)).1 += 1;
    }

    /// Every count, by destination.
    pub(crate) fn list(&self) -> Vec<Dropped> {
        let counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        counts
            .iter()
            .map(
                |(&(kind, protocol, destination, port), (host, packets))| Dropped {
                    kind,
                    protocol,
                    destination,
                    port,
                    host: host.clone(),
                    packets: *packets,
                },
            )
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_counted_per_destination_and_bounded() {
        let d = Drops::default();
        let ip: IpAddr = "198.18.0.16".parse().unwrap();
        d.count(Kind::Udp, 17, ip, Some(9), Some("a.test".into()));
        d.count(Kind::Udp, 17, ip, Some(9), Some("a.test".into()));
        let l = d.list();
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].packets, l[0].host.as_deref()), (2, Some("a.test")));
        for i in 0..MAX_DESTINATIONS as u32 + 5 {
            d.count(Kind::Icmp, 1, IpAddr::from(i.to_be_bytes()), None, None);
        }
        let l = d.list();
        assert_eq!(l.len(), MAX_DESTINATIONS + 1);
        let rest = l.iter().find(|x| x.destination.is_none()).unwrap();
        assert_eq!(rest.packets, 6);
    }
}
