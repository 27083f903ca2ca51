//! The settings outside the grants that still change who may reach what, compared one by
//! one (the other sections are compared by fingerprint only): who may act as an authority
//! or create one (the TCP listeners, anonymous admin writes), and where an allowed name
//! goes (`[resolver] hosts`). A reload applies none of them; the next start does.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use super::change::{Change, Direction, RiskClass};
use crate::config::Config;

/// What a configuration exposes besides its grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exposure {
    /// `[listen] tcp`: the proxy listener clients reach with a token.
    pub tcp: Option<SocketAddr>,
    /// `[listen] admin`: the admin API's TCP listener.
    pub admin: Option<SocketAddr>,
    /// `[listen] admin_allow_anonymous_writes`: writes through the admin API's TCP
    /// listener without a token.
    pub anonymous_writes: bool,
    /// `[resolver] hosts`: names answered without DNS, and their addresses.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
}

impl Exposure {
    /// What `c` exposes.
    pub fn of(c: &Config) -> Self {
        Self {
            tcp: c.listen.tcp,
            admin: c.listen.admin,
            anonymous_writes: c.listen.admin_allow_anonymous_writes,
            hosts: c.resolver.hosts.clone(),
        }
    }
}

/// How far a TCP listener is reachable, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    /// No listener.
    None,
    /// A loopback address: this host only.
    Loopback,
    /// One other address: its network.
    Address,
    /// `0.0.0.0` or `::`: every interface.
    Every,
}

impl Scope {
    fn of(addr: Option<SocketAddr>) -> Self {
        match addr {
            None => Self::None,
            Some(a) if a.ip().is_loopback() => Self::Loopback,
            Some(a) if a.ip().is_unspecified() => Self::Every,
            Some(_) => Self::Address,
        }
    }
}

/// The changes from `old` to `new`.
pub(super) fn compare(old: &Exposure, new: &Exposure) -> Vec<Change> {
    let mut out = Vec::new();
    listener(&mut out, "[listen] tcp", "proxy clients", old.tcp, new.tcp);
    listener(
        &mut out,
        "[listen] admin",
        "admin API clients",
        old.admin,
        new.admin,
    );
    if old.anonymous_writes != new.anonymous_writes {
        let (direction, what) = if new.anonymous_writes {
            (
                Direction::Widened,
                "anyone who reaches the admin API's TCP listener may now create and revoke authorities without a token",
            )
        } else {
            (
                Direction::Narrowed,
                "writes through the admin API's TCP listener need a token again",
            )
        };
        out.push(Change::new(
            RiskClass::Channel,
            direction,
            format!(
                "[listen] admin_allow_anonymous_writes = {}",
                new.anonymous_writes
            ),
            what,
        ));
    }
    hosts(&mut out, &old.hosts, &new.hosts);
    out
}

/// A listener moved from `old` to `new`.
fn listener(
    out: &mut Vec<Change>,
    key: &str,
    who: &str,
    old: Option<SocketAddr>,
    new: Option<SocketAddr>,
) {
    if old == new {
        return;
    }
    let shown = |a: Option<SocketAddr>| a.map_or_else(|| "none".to_owned(), |a| a.to_string());
    let (from, to) = (Scope::of(old), Scope::of(new));
    let direction = match to.cmp(&from) {
        std::cmp::Ordering::Greater => Direction::Widened,
        std::cmp::Ordering::Less => Direction::Narrowed,
        // Another address of the same scope: another network may reach it.
        std::cmp::Ordering::Equal if to == Scope::Address => Direction::Widened,
        std::cmp::Ordering::Equal => Direction::Changed,
    };
    let reach = match to {
        Scope::None => "no longer listens".to_owned(),
        Scope::Loopback => "reachable from this host only".to_owned(),
        Scope::Address => format!("reachable by {who} on the network of {}", shown(new)),
        Scope::Every => format!("reachable by {who} on every interface of this host"),
    };
    out.push(Change::new(
        RiskClass::Channel,
        direction,
        format!("{key} = {}", shown(new)),
        format!("{key} moved from {} to {}: {reach}", shown(old), shown(new)),
    ));
}

/// `[resolver] hosts` entries added, removed or pointed elsewhere: where an allowed name
/// goes (a name pinned to an address the address check lets through reaches that address).
fn hosts(
    out: &mut Vec<Change>,
    old: &BTreeMap<String, Vec<IpAddr>>,
    new: &BTreeMap<String, Vec<IpAddr>>,
) {
    let list = |a: &[IpAddr]| {
        a.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut names: Vec<&String> = old.keys().chain(new.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let (before, after) = (old.get(name), new.get(name));
        let added: Vec<IpAddr> = after
            .into_iter()
            .flatten()
            .filter(|a| !before.is_some_and(|b| b.contains(a)))
            .copied()
            .collect();
        let entry = format!("[resolver] hosts {name:?}");
        if !added.is_empty() {
            out.push(Change::new(
                RiskClass::Host,
                Direction::Widened,
                entry,
                format!(
                    "{name} now goes to {} without DNS, wherever a grant allows it",
                    list(&added)
                ),
            ));
        } else if before != after {
            let detail = match after {
                Some(a) => format!("{name} goes to fewer addresses: {}", list(a)),
                None => format!("{name} is resolved by DNS again"),
            };
            let direction = if after.is_some() {
                Direction::Narrowed
            } else {
                Direction::Changed
            };
            out.push(Change::new(RiskClass::Host, direction, entry, detail));
        }
    }
}
