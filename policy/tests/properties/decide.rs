//! Grant decisions against an oracle written here from design section 4 (not from
//! `grant.rs`): grants and targets are drawn from a small universe of names, wildcards,
//! addresses, networks and ports, so that entries and targets meet often. The property
//! the design hangs on: an allow implies an allow entry that matches the target (host and
//! port) and no deny entry (the grant's or the global list's) that matches it. The oracle
//! also says which deny, port or allowlist answer every other case gets.

use std::net::IpAddr;

use policy::{
    AddrClass, Grant, GrantSpec, Reason, Target, Verdict, classify, parse_authority_form,
};
use proptest::prelude::*;

/// The host part of an entry, as the oracle understands it.
#[derive(Debug, Clone)]
enum Host {
    /// Exactly this (canonical) name or address.
    Exact(String),
    /// `*.suffix`: names with at least one more label.
    Wildcard(String),
    /// A network, `a.b.c.d/len` or `x::/len`; matches IP literals only.
    Net(ipnet::IpNet),
    /// `*` (deny lists only).
    Any,
}

/// One entry: host part and optional port.
#[derive(Debug, Clone)]
struct Entry {
    host: Host,
    port: Option<u16>,
}

impl Entry {
    /// As written in a grant.
    fn text(&self) -> String {
        let host = match &self.host {
            Host::Exact(h) if h.contains(':') => format!("[{h}]"),
            Host::Exact(h) => h.clone(),
            Host::Wildcard(s) => format!("*.{s}"),
            Host::Net(ipnet::IpNet::V6(n)) if self.port.is_some() => format!("[{n}]"),
            Host::Net(n) => n.to_string(),
            Host::Any => "*".into(),
        };
        match self.port {
            Some(p) => format!("{host}:{p}"),
            None => host,
        }
    }

    /// Whether the host part matches `host` (canonical text, IPv6 without brackets).
    fn matches_host(&self, host: &str) -> bool {
        let ip = host.parse::<IpAddr>().ok();
        match &self.host {
            Host::Exact(h) => h == host,
            Host::Wildcard(s) => ip.is_none() && host.ends_with(&format!(".{s}")),
            Host::Net(n) => ip.is_some_and(|ip| n.contains(&ip)),
            Host::Any => true,
        }
    }

    fn matches(&self, host: &str, port: u16) -> bool {
        self.matches_host(host) && self.port.is_none_or(|p| p == port)
    }
}

/// Suffixes under which names are drawn; none is a public suffix or a single label, so
/// a wildcard over each loads.
const BASES: &[&str] = &["example.com", "example.net", "b.example.com"];
const LABELS: &[&str] = &["a", "b", "www", "x-y", "_srv", "api"];
const ADDRS: &[&str] = &[
    "8.8.8.8",
    "8.8.4.4",
    "10.1.2.3",
    "127.0.0.1",
    "192.0.2.7",
    "2606:4700::1111",
    "2001:db8::1",
    "::1",
];
const NETS: &[&str] = &[
    "8.8.0.0/16",
    "10.0.0.0/8",
    "192.0.2.0/24",
    "2606:4700::/32",
    "2001:db8::/32",
];
const PORTS: &[u16] = &[22, 80, 443, 8443];

/// A canonical host of the universe: a name (0..=2 labels over a base) or an address.
fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (
            proptest::collection::vec(proptest::sample::select(LABELS), 0..=2),
            proptest::sample::select(BASES)
        )
            .prop_map(|(labels, base)| {
                let mut parts: Vec<&str> = labels;
                parts.push(base);
                parts.join(".")
            }),
        1 => proptest::sample::select(ADDRS).prop_map(str::to_owned),
    ]
}

fn port() -> impl Strategy<Value = Option<u16>> {
    proptest::option::weighted(0.5, proptest::sample::select(PORTS))
}

/// An entry of an allow list (`deny` adds `*`).
fn entry(deny: bool) -> impl Strategy<Value = Entry> {
    let listed = prop_oneof![
        4 => host().prop_map(Host::Exact),
        2 => proptest::sample::select(BASES).prop_map(|b| Host::Wildcard(b.to_owned())),
        1 => proptest::sample::select(NETS).prop_map(|n| Host::Net(n.parse().unwrap())),
    ];
    let host = if deny {
        prop_oneof![6 => listed, 1 => Just(Host::Any)].boxed()
    } else {
        listed.boxed()
    };
    (host, port()).prop_map(|(host, port)| Entry { host, port })
}

/// A grant of the universe: allow, deny, global deny lists and exceptions.
#[derive(Debug, Clone)]
struct Drawn {
    allow: Vec<Entry>,
    deny: Vec<Entry>,
    global: Vec<Entry>,
    allow_private: Vec<String>,
}

fn drawn() -> impl Strategy<Value = Drawn> {
    (
        proptest::collection::vec(entry(false), 0..6),
        proptest::collection::vec(entry(true), 0..3),
        proptest::collection::vec(entry(true), 0..2),
        proptest::collection::vec(
            proptest::sample::select(&["10.0.0.0/8", "127.0.0.1", "2001:db8::/32"][..]),
            0..2,
        ),
    )
        .prop_map(|(allow, deny, global, allow_private)| Drawn {
            allow,
            deny,
            global,
            allow_private: allow_private.into_iter().map(str::to_owned).collect(),
        })
}

fn texts(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(Entry::text).collect()
}

/// What the design says the grant decides for `host:port`: (reason, rule).
fn oracle(d: &Drawn, host: &str, port: u16) -> (Reason, Option<String>) {
    if let Some(e) = d
        .deny
        .iter()
        .chain(&d.global)
        .find(|e| e.matches(host, port))
    {
        return (Reason::DeniedByRule, Some(e.text()));
    }
    let Some(allow) = d.allow.iter().find(|e| e.matches(host, port)) else {
        return match d.allow.iter().find(|e| e.matches_host(host)) {
            Some(e) => (Reason::PortNotAllowed, Some(e.text())),
            None => (Reason::NotInAllowlist, None),
        };
    };
    // An allowed IP literal still passes the address check (design section 4.2).
    if let Ok(ip) = host.parse::<IpAddr>() {
        let excepted = d.allow_private.iter().any(|n| {
            n.parse::<ipnet::IpNet>().map_or_else(
                |_| n.parse::<IpAddr>().ok() == Some(ip),
                |n| n.contains(&ip),
            )
        });
        match classify(ip) {
            AddrClass::Global => {}
            _ if excepted => {}
            AddrClass::Private(_) => return (Reason::PrivateAddress, None),
            AddrClass::Special(_) | AddrClass::Embedded { .. } => {
                return (Reason::SpecialAddress, None);
            }
        }
    }
    (Reason::Allowed, Some(allow.text()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// An allow implies a matching allow entry and no matching deny entry; every other
    /// answer is the one the oracle gives, rule included.
    #[test]
    fn decisions_follow_the_rules(d in drawn(), host in host(), port in proptest::sample::select(PORTS)) {
        let grant = Grant::new(
            &GrantSpec {
                name: "props".into(),
                allow: texts(&d.allow),
                deny: texts(&d.deny).into_iter().map(Into::into).collect(),
                allow_private: d.allow_private.clone(),
                ..GrantSpec::default()
            },
            &texts(&d.global).into_iter().map(Into::into).collect::<Vec<_>>(),
        );
        let grant = match grant {
            Ok(g) => g,
            Err(e) => return Err(TestCaseError::fail(format!("{d:?} does not load: {e}"))),
        };
        let uri_host = if host.contains(':') { format!("[{host}]") } else { host.clone() };
        let target: Target = parse_authority_form(&format!("{uri_host}:{port}")).unwrap();
        let got = grant.decide(&target);
        if got.verdict == Verdict::Allow {
            let rule = got.rule.clone().unwrap_or_default();
            prop_assert!(
                d.allow.iter().any(|e| e.text() == rule && e.matches(&host, port)),
                "allowed by {:?}, which does not match {}", rule, target
            );
            prop_assert!(
                !d.deny.iter().chain(&d.global).any(|e| e.matches(&host, port)),
                "allowed although a deny entry matches {}", target
            );
        }
        let (reason, rule) = oracle(&d, &host, port);
        prop_assert_eq!(got.reason, reason, "{}", target);
        if matches!(reason, Reason::Allowed | Reason::DeniedByRule | Reason::PortNotAllowed) {
            prop_assert_eq!(got.rule, rule, "{}", target);
        }
    }
}
