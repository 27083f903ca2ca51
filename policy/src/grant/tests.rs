//! Grant decisions, address vetting and request rules, table by table.

use super::*;
use std::net::IpAddr;

use crate::host::parse_authority_form;

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn denies(v: &[&str]) -> Vec<DenyEntry> {
    v.iter().map(|s| (*s).into()).collect()
}

fn grant(allow: &[&str], deny: &[&str], allow_private: &[&str], global: &[&str]) -> Grant {
    let spec = GrantSpec {
        name: "agent-a".into(),
        allow: strings(allow),
        deny: denies(deny),
        allow_private: strings(allow_private),
        sni_check: true,
        tls_terminate: Vec::new(),
        request_rules: Vec::new(),
        advice: Advice::Operator,
        default_deny_reason: None,
    };
    Grant::new(&spec, &denies(global)).unwrap()
}

fn target(s: &str) -> Target {
    parse_authority_form(s).unwrap()
}

/// Target, expected reason, expected rule.
const DECIDE: &[(&str, Reason, Option<&str>)] = &[
    (
        "api.github.com:443",
        Reason::Allowed,
        Some("api.github.com"),
    ),
    (
        "API.GitHub.com.:8080",
        Reason::Allowed,
        Some("api.github.com"),
    ),
    ("github.com:443", Reason::NotInAllowlist, None),
    (
        "raw.example.net:443",
        Reason::Allowed,
        Some("*.example.net"),
    ),
    ("a.b.example.net:1", Reason::Allowed, Some("*.example.net")),
    ("example.net:443", Reason::NotInAllowlist, None),
    (
        "registry.npmjs.org:443",
        Reason::Allowed,
        Some("registry.npmjs.org:443"),
    ),
    (
        "registry.npmjs.org:80",
        Reason::PortNotAllowed,
        Some("registry.npmjs.org:443"),
    ),
    (
        "secret.example.net:443",
        Reason::DeniedByRule,
        Some("secret.example.net"),
    ),
    (
        "x.internal.example.net:443",
        Reason::DeniedByRule,
        Some("*.internal.example.net"),
    ),
    (
        "internal.example.net:443",
        Reason::Allowed,
        Some("*.example.net"),
    ),
    ("smtp.example.net:25", Reason::DeniedByRule, Some("*:25")),
    (
        "smtp.example.net:587",
        Reason::Allowed,
        Some("*.example.net"),
    ),
    (
        "evil.example:443",
        Reason::DeniedByRule,
        Some("evil.example"),
    ),
    (
        "multi.example.org:22",
        Reason::PortNotAllowed,
        Some("multi.example.org:443"),
    ),
    (
        "multi.example.org:8443",
        Reason::Allowed,
        Some("multi.example.org:8443"),
    ),
    ("8.8.8.8:53", Reason::Allowed, Some("8.8.8.0/24")),
    ("8.8.4.4:53", Reason::NotInAllowlist, None),
    (
        "[2606:4700:4700::1111]:443",
        Reason::Allowed,
        Some("2606:4700::/32"),
    ),
    ("[::ffff:8.8.8.8]:53", Reason::Allowed, Some("8.8.8.0/24")),
    ("127.0.0.1:8080", Reason::PrivateAddress, None),
    ("10.1.2.3:443", Reason::Allowed, Some("10.0.0.0/8")),
    ("10.2.0.1:443", Reason::PrivateAddress, None),
    ("192.0.2.1:443", Reason::SpecialAddress, None),
    ("[2001:db8::1]:443", Reason::SpecialAddress, None),
    ("[64:ff9b::a01:203]:443", Reason::SpecialAddress, None),
    ("[64:ff9b::808:808]:443", Reason::SpecialAddress, None),
    (
        "198.51.100.7:443",
        Reason::DeniedByRule,
        Some("198.51.100.0/24"),
    ),
    (
        "blocked.example.com:443",
        Reason::DeniedByRule,
        Some("blocked.example.com"),
    ),
];

fn decide_grant() -> Grant {
    grant(
        &[
            "api.github.com",
            "*.example.net",
            "registry.npmjs.org:443",
            "multi.example.org:443",
            "multi.example.org:8443",
            "evil.example",
            "8.8.8.0/24",
            "2606:4700::/32",
            "127.0.0.1",
            "10.0.0.0/8",
            "192.0.2.1",
            "2001:db8::/32",
            "64:ff9b::/96",
            "198.51.100.0/24",
            "blocked.example.com",
        ],
        &[
            "secret.example.net",
            "*.internal.example.net",
            "*:25",
            "evil.example",
            "198.51.100.0/24",
        ],
        &["10.1.0.0/16"],
        &["blocked.example.com"],
    )
}

#[test]
fn decide_table() {
    let g = decide_grant();
    let mut failures = Vec::new();
    for (t, reason, rule) in DECIDE {
        let d = g.decide(&target(t));
        if d.reason != *reason
            || d.rule.as_deref() != *rule
            || d.is_allow() != (*reason == Reason::Allowed)
        {
            failures.push(format!("{t}: want {reason} {rule:?}, got {d:?}"));
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
fn decide_details_and_hints() {
    let g = decide_grant();
    let d = g.decide(&target("github.com:443"));
    assert_eq!(
        d.detail,
        "github.com is not in the allow list of authority \"agent-a\""
    );
    assert_eq!(
        d.hint,
        "add \"github.com:443\" to the allow list of authority \"agent-a\""
    );
    let d = g.decide(&target("[2001:db8::5]:8443"));
    assert_eq!(d.reason, Reason::SpecialAddress);
    assert_eq!(
        d.detail,
        "2001:db8::5 is a special-purpose address: documentation (2001:db8::/32, RFC 3849)"
    );
    let d = g.decide(&target("[2a00::1]:443"));
    assert_eq!(
        d.hint,
        "add \"[2a00::1]:443\" to the allow list of authority \"agent-a\""
    );
    let d = g.decide(&target("multi.example.org:22"));
    assert_eq!(
        d.detail,
        "multi.example.org matches allow entries \"multi.example.org:443\", \"multi.example.org:8443\" of authority \"agent-a\", but not on port 22"
    );
    assert_eq!(
        d.hint,
        "add \"multi.example.org:22\" to the allow list of authority \"agent-a\""
    );
    let d = g.decide(&target("blocked.example.com:443"));
    assert_eq!(
        d.detail,
        "blocked.example.com:443 matches entry \"blocked.example.com\" of the global deny list"
    );
    let d = g.decide(&target("secret.example.net:443"));
    assert_eq!(
        d.detail,
        "secret.example.net:443 matches deny entry \"secret.example.net\" of authority \"agent-a\""
    );
    let d = g.decide(&target("api.github.com:443"));
    assert_eq!(d, Decision::allow("api.github.com"));
}

#[test]
fn first_written_rule_wins() {
    let g = grant(
        &["*.example.com:443", "a.example.com", "*.a.example.com"],
        &[],
        &[],
        &[],
    );
    assert_eq!(
        g.decide(&target("a.example.com:443")).rule.as_deref(),
        Some("*.example.com:443")
    );
    assert_eq!(
        g.decide(&target("a.example.com:80")).rule.as_deref(),
        Some("a.example.com")
    );
    assert_eq!(
        g.decide(&target("b.a.example.com:80")).rule.as_deref(),
        Some("*.a.example.com")
    );
    // A port-specific deny does not deny other ports.
    let g = grant(&["example.com"], &["example.com:22"], &[], &[]);
    assert_eq!(
        g.decide(&target("example.com:22")).reason,
        Reason::DeniedByRule
    );
    assert_eq!(g.decide(&target("example.com:443")).reason, Reason::Allowed);
    // A global deny of everything beats every allow.
    let g = grant(&["example.com"], &[], &[], &["*"]);
    let d = g.decide(&target("example.com:443"));
    assert_eq!(
        (d.reason, d.rule.as_deref()),
        (Reason::DeniedByRule, Some("*"))
    );
}

#[test]
fn decide_with_ten_thousand_rules_uses_the_index() {
    let allow: Vec<String> = (0..5000)
        .flat_map(|i| {
            [
                format!("host{i}.example.com:443"),
                format!("*.zone{i}.example.org"),
            ]
        })
        .collect();
    let deny: Vec<DenyEntry> = (0..100)
        .map(|i| format!("bad{i}.zone7.example.org").into())
        .collect();
    let spec = GrantSpec {
        name: "bulk".into(),
        allow,
        deny,
        ..GrantSpec::default()
    };
    let g = Grant::new(&spec, &[]).unwrap();
    assert_eq!(g.allow_index.scanned.len(), 0);
    assert_eq!(
        g.decide(&target("host4999.example.com:443")).reason,
        Reason::Allowed
    );
    assert_eq!(
        g.decide(&target("host4999.example.com:80")).reason,
        Reason::PortNotAllowed
    );
    assert_eq!(
        g.decide(&target("a.b.zone4321.example.org:9"))
            .rule
            .as_deref(),
        Some("*.zone4321.example.org")
    );
    assert_eq!(
        g.decide(&target("bad5.zone7.example.org:443")).reason,
        Reason::DeniedByRule
    );
    assert_eq!(
        g.decide(&target("zone7.example.org:443")).reason,
        Reason::NotInAllowlist
    );
    assert_eq!(
        g.decide(&target("host5000.example.com:443")).reason,
        Reason::NotInAllowlist
    );
}

#[test]
fn new_reports_every_bad_entry() {
    let spec = GrantSpec {
        name: "bad name".into(),
        allow: strings(&["ok.example.com", "*.com", "*", "a.*.com"]),
        deny: denies(&["*", "user@x.com"]),
        allow_private: strings(&["10.0.0.1/8", "localhost", "0.0.0.0/0", "127.0.0.1"]),
        sni_check: false,
        tls_terminate: strings(&["*.co.uk"]),
        request_rules: Vec::new(),
        advice: Advice::Operator,
        default_deny_reason: None,
    };
    let Err(PolicyError::Config(errors)) = Grant::new(&spec, &denies(&["*.", "*:25"])) else {
        panic!("expected a config error");
    };
    assert_eq!(
        errors,
        vec![
            "authority name \"bad name\" contains ' '; use only ASCII letters, digits, '-' and '_'",
            "invalid allow entry \"*.com\": wildcard over public suffix \"com\"; write \"*.example.com\" for one domain",
            "invalid allow entry \"*\": '*' would allow every host; list the hosts (or \"*.example.com\" for one domain)",
            "invalid allow entry \"a.*.com\": a wildcard must be a whole first label followed by a domain, like \"*.example.com\"",
            "invalid deny entry \"user@x.com\": userinfo ('@') is not allowed; write only the host",
            "invalid global deny entry \"*.\": a wildcard needs a domain after \"*.\", like \"*.example.com\"",
            "invalid tls_terminate entry \"*.co.uk\": wildcard over public suffix \"co.uk\"; write \"*.example.co.uk\" for one domain",
            "invalid allow_private entry \"10.0.0.1/8\": CIDR has host bits set; write \"10.0.0.0/8\"",
            "invalid allow_private entry \"localhost\": not an IP address or CIDR; write e.g. \"127.0.0.1\" or \"10.1.0.0/16\"",
            "invalid allow_private entry \"0.0.0.0/0\": a /0 exception would switch the address check off; list the ranges needed",
        ]
    );
}

#[test]
fn this_host_addresses_can_never_be_excepted() {
    // Connecting to 0.0.0.0 or :: reaches this host's own listeners (admin API
    // included), so neither allow_private nor anything else may open them.
    for entry in [
        "0.0.0.0/8",
        "0.0.0.0",
        "0.1.2.3/32",
        "::/127",
        "::",
        "::ffff:0.0.0.0/104",
    ] {
        let err = parse_allow_private(entry).expect_err(entry);
        assert!(err.to_string().contains("this host"), "{entry}: {err}");
    }
    let spec = GrantSpec {
        name: "a".into(),
        allow: strings(&["zero.test", "0.0.0.0"]),
        allow_private: strings(&["127.0.0.0/8"]),
        ..GrantSpec::default()
    };
    let g = Grant::new(&spec, &[]).unwrap();
    for ip in ["0.0.0.0", "0.0.0.7", "::", "::ffff:0.0.0.0"] {
        let t = parse_authority_form("zero.test:9901").unwrap();
        let d = g
            .vet(&t, &[ip.parse().unwrap()], &OwnAddrs::default())
            .unwrap_err();
        assert_eq!(d.reason, Reason::SpecialAddress, "{ip}: {d:?}");
    }
    let lit = parse_authority_form("0.0.0.0:9901").unwrap();
    assert_eq!(g.decide(&lit).reason, Reason::SpecialAddress);
}

#[test]
fn authority_names() {
    for ok in ["a", "agent-a", "Agent_B-2", &"x".repeat(64)] {
        assert_eq!(check_authority_name(ok), Ok(()), "{ok}");
    }
    for bad in ["", "a b", "a/b", "a.b", "ä", "a\n", &"x".repeat(65)] {
        assert!(check_authority_name(bad).is_err(), "{bad:?}");
    }
}

fn ips(v: &[&str]) -> Vec<IpAddr> {
    v.iter().map(|s| s.parse().unwrap()).collect()
}

/// Resolved addresses, allow_private, expected result (`Ok` or the deny reason).
type VetRow = (
    &'static [&'static str],
    &'static [&'static str],
    Result<(), Reason>,
);

const VET: &[VetRow] = &[
    (&["93.184.216.34"], &[], Ok(())),
    (&["93.184.216.34", "2606:2800:220:1::1"], &[], Ok(())),
    (&[], &[], Err(Reason::DnsFailure)),
    (&["127.0.0.1"], &[], Err(Reason::PrivateAddress)),
    (
        &["93.184.216.34", "127.0.0.1"],
        &[],
        Err(Reason::PrivateAddress),
    ),
    (
        &["127.0.0.1", "93.184.216.34"],
        &[],
        Err(Reason::PrivateAddress),
    ),
    (&["127.0.0.1"], &["127.0.0.0/8"], Ok(())),
    (&["127.0.0.1"], &["127.0.0.1"], Ok(())),
    (&["127.0.0.2"], &["127.0.0.1"], Err(Reason::PrivateAddress)),
    (&["10.0.0.1"], &[], Err(Reason::PrivateAddress)),
    (&["100.64.0.1"], &[], Err(Reason::PrivateAddress)),
    (&["169.254.169.254"], &[], Err(Reason::PrivateAddress)),
    (
        &["169.254.169.254"],
        &["10.0.0.0/8"],
        Err(Reason::PrivateAddress),
    ),
    (&["0.0.0.0"], &[], Err(Reason::SpecialAddress)),
    (&["192.0.2.1"], &[], Err(Reason::SpecialAddress)),
    (&["192.0.2.1"], &["192.0.2.0/24"], Ok(())),
    (&["224.0.0.251"], &[], Err(Reason::SpecialAddress)),
    (&["255.255.255.255"], &[], Err(Reason::SpecialAddress)),
    (&["::1"], &[], Err(Reason::PrivateAddress)),
    (&["::1"], &["::1"], Ok(())),
    (&["::"], &[], Err(Reason::SpecialAddress)),
    (&["fd00::1"], &[], Err(Reason::PrivateAddress)),
    (&["fe80::1"], &[], Err(Reason::PrivateAddress)),
    (&["::ffff:127.0.0.1"], &[], Err(Reason::SpecialAddress)),
    (
        &["::ffff:127.0.0.1"],
        &["127.0.0.0/8"],
        Err(Reason::SpecialAddress),
    ),
    (&["::ffff:127.0.0.1"], &["::ffff:127.0.0.0/104"], Ok(())),
    (&["::ffff:8.8.8.8"], &[], Err(Reason::SpecialAddress)),
    (&["64:ff9b::808:808"], &[], Err(Reason::SpecialAddress)),
    (&["64:ff9b::a00:1"], &[], Err(Reason::SpecialAddress)),
    (&["64:ff9b::808:808"], &["64:ff9b::/96"], Ok(())),
    (&["2002:a00:1::1"], &[], Err(Reason::SpecialAddress)),
    (
        &["2001:0:4136:e378:8000:63bf:f7f7:f7f7"],
        &[],
        Err(Reason::SpecialAddress),
    ),
    (&["2001:db8::1"], &[], Err(Reason::SpecialAddress)),
    (&["4000::1"], &[], Err(Reason::SpecialAddress)),
];

#[test]
fn vet_table() {
    let t = target("origin.example:443");
    let mut failures = Vec::new();
    for (addrs, private, want) in VET {
        let g = grant(&["origin.example"], &[], private, &[]);
        let addrs = ips(addrs);
        let got = g.vet(&t, &addrs, &OwnAddrs::default());
        let ok = match (&got, want) {
            (Ok(pin), Ok(())) => pin.addrs() == addrs.as_slice(),
            (Err(d), Err(reason)) => d.reason == *reason && !d.is_allow(),
            _ => false,
        };
        if !ok {
            failures.push(format!(
                "{addrs:?} with {private:?}: want {want:?}, got {got:?}"
            ));
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
fn vet_details() {
    let g = grant(&["origin.example"], &[], &[], &[]);
    let d = g
        .vet(
            &target("origin.example:443"),
            &ips(&["93.184.216.34", "10.0.0.7"]),
            &OwnAddrs::default(),
        )
        .unwrap_err();
    assert_eq!(
        d.detail,
        "origin.example resolved to 10.0.0.7; 10.0.0.7 is a private address: private-use (10.0.0.0/8, RFC 1918)"
    );
    assert_eq!(
        d.hint,
        "only globally reachable addresses are connected to; if this destination is intended, an operator can add \"10.0.0.7/32\" to allow_private of authority \"agent-a\""
    );
    let d = g
        .vet(
            &target("origin.example:443"),
            &ips(&["64:ff9b::808:808"]),
            &OwnAddrs::default(),
        )
        .unwrap_err();
    assert_eq!(
        d.detail,
        "origin.example resolved to 64:ff9b::808:808; 64:ff9b::808:808 embeds the IPv4 address 8.8.8.8 (global): NAT64 (64:ff9b::/96, RFC 6052)"
    );
}

#[test]
fn own_listeners_are_always_denied() {
    let own = OwnAddrs(vec![
        "127.0.0.1:3128".parse().unwrap(),
        "[::]:9901".parse().unwrap(),
    ]);
    let g = grant(&["origin.example"], &[], &["127.0.0.0/8", "::1"], &[]);
    let t = target("origin.example:3128");
    let d = g.vet(&t, &ips(&["127.0.0.1"]), &own).unwrap_err();
    assert_eq!(d.reason, Reason::SpecialAddress);
    assert_eq!(
        d.detail,
        "127.0.0.1:3128 is one of the mediator's own listeners"
    );
    assert_eq!(
        g.vet(&t, &ips(&["::ffff:127.0.0.1"]), &own)
            .unwrap_err()
            .reason,
        Reason::SpecialAddress
    );
    // Another loopback address on the same port is not that listener.
    assert!(g.vet(&t, &ips(&["127.0.0.2"]), &own).is_ok());
    // Another port is fine (allow_private covers loopback here).
    assert!(
        g.vet(&target("origin.example:8080"), &ips(&["127.0.0.1"]), &own)
            .is_ok()
    );
    // The unspecified listener is reached at every loopback address on its port.
    let t = target("origin.example:9901");
    for a in ["127.0.0.1", "127.9.9.9", "::1", "0.0.0.0", "::"] {
        assert_eq!(
            g.vet(&t, &ips(&[a]), &own).unwrap_err().reason,
            Reason::SpecialAddress,
            "{a}"
        );
    }
}

#[test]
fn own_addrs_contains() {
    let own = OwnAddrs(vec![
        "0.0.0.0:3128".parse().unwrap(),
        "[2001:db8::5]:443".parse().unwrap(),
    ]);
    let yes = [
        "127.0.0.1:3128",
        "127.1.2.3:3128",
        "[::1]:3128",
        "0.0.0.0:3128",
        "[::ffff:127.0.0.1]:3128",
        "[2001:db8::5]:443",
    ];
    let no = [
        "127.0.0.1:3129",
        "8.8.8.8:3128",
        "[2001:db8::6]:443",
        "[2001:db8::5]:444",
    ];
    for a in yes {
        assert!(own.contains(a.parse().unwrap()), "{a}");
    }
    for a in no {
        assert!(!own.contains(a.parse().unwrap()), "{a}");
    }
    assert!(!OwnAddrs::default().contains("127.0.0.1:1".parse().unwrap()));
}

#[test]
fn accessors_and_tls_terminate() {
    let spec = GrantSpec {
        name: "agent-b".into(),
        allow: strings(&["*.example.com", "example.com"]),
        deny: denies(&["bad.example.com"]),
        allow_private: strings(&["127.0.0.1"]),
        sni_check: true,
        tls_terminate: strings(&["*.example.com"]),
        request_rules: Vec::new(),
        advice: Advice::Operator,
        default_deny_reason: None,
    };
    let g = Grant::new(&spec, &denies(&["*:25"])).unwrap();
    assert_eq!(g.name(), "agent-b");
    assert!(g.sni_check());
    assert_eq!(
        g.allow_entries().collect::<Vec<_>>(),
        ["*.example.com", "example.com"]
    );
    assert_eq!(
        g.deny_entries().collect::<Vec<_>>(),
        ["bad.example.com", "*:25"]
    );
    assert_eq!(
        g.allow_private(),
        &["127.0.0.1/32".parse::<IpNet>().unwrap()]
    );
    assert!(g.terminates_tls(&target("a.example.com:443")));
    assert!(!g.terminates_tls(&target("example.com:443")));
}

/// Per-request rules inside terminated tunnels (`[[authority.request_rule]]`).
mod request_rules {
    use crate::grant::*;
    use crate::host::parse_authority_form;
    use crate::request::{RequestFacts, UpgradeToken};

    fn rule(host: &str, methods: &[&str], paths: &[&str]) -> RequestRuleSpec {
        RequestRuleSpec {
            host: host.into(),
            methods: methods.iter().map(|s| (*s).to_owned()).collect(),
            path_prefixes: paths.iter().map(|s| (*s).to_owned()).collect(),
            ..RequestRuleSpec::default()
        }
    }

    struct Headers(Vec<(&'static str, &'static str)>);

    impl crate::HeaderLookup for Headers {
        fn values(&self, name: &str) -> Vec<&[u8]> {
            self.0
                .iter()
                .filter(|(k, _)| *k == name)
                .map(|(_, v)| v.as_bytes())
                .collect()
        }
    }

    /// `upgrade` lists the tokens besides websocket that a rule's requests may switch to:
    /// websocket needs no listing, any other token needs a matching rule that lists it
    /// (case-insensitively), even on a host no rule narrows; h2c is refused at load.
    #[test]
    fn upgrade_tokens_need_a_rule_that_lists_them() {
        let listed = RequestRuleSpec {
            upgrade: vec!["Foo".into(), "tls/1.2".into()],
            ..rule("api.example.com", &["GET"], &["/tunnel"])
        };
        let g = grant(
            &["api.example.com", "free.example.com"],
            vec![listed, rule("api.example.com", &["GET"], &["/"])],
        )
        .unwrap();
        let api = parse_authority_form("api.example.com:443").unwrap();
        let free = parse_authority_form("free.example.com:443").unwrap();
        let token = |t: &str| UpgradeToken::parse(t.as_bytes()).unwrap();
        let rows: &[(&Target, &str, Option<&str>, &str)] = &[
            (&api, "/tunnel", Some("FOO"), "allowed"),
            (&api, "/tunnel", Some("TLS/1.2"), "allowed"),
            (&api, "/tunnel", Some("bar"), "denied_by_rule"),
            // The second rule allows the path but lists no token.
            (&api, "/other", Some("foo"), "denied_by_rule"),
            (&api, "/other", Some("websocket"), "allowed"),
            (&api, "/other", None, "allowed"),
            (&free, "/x", Some("websocket"), "allowed"),
            (&free, "/x", Some("foo"), "denied_by_rule"),
            (&free, "/x", None, "allowed"),
        ];
        for (target, path, upgrade, reason) in rows {
            let t = upgrade.map(token);
            let facts = RequestFacts::new("GET", path).with_upgrade(t.as_ref());
            let d = g.decide_request(target, &facts);
            assert_eq!(
                d.reason.as_str(),
                *reason,
                "{target} {path} {upgrade:?}: {d:?}"
            );
        }
        let facts = RequestFacts::new("GET", "/x").with_upgrade(Some(&UpgradeToken::H2c));
        let d = g.decide_request(&free, &facts);
        assert!(!d.is_allow(), "{d:?}");
        let d = g.decide_request(
            &api,
            &RequestFacts::new("GET", "/tunnel").with_upgrade(Some(&token("bar"))),
        );
        assert!(
            d.hint.contains("GET /tunnel with Upgrade: foo|tls/1.2"),
            "{d:?}"
        );
        for bad in ["h2c", "H2C", "a b", "", "x/1/2"] {
            let spec = RequestRuleSpec {
                upgrade: vec![bad.into()],
                ..rule("api.example.com", &[], &[])
            };
            let err = grant(&["api.example.com"], vec![spec]).unwrap_err();
            assert!(format!("{err:?}").contains("upgrade"), "{bad:?}: {err:?}");
        }
    }

    /// `headers` and `query` narrow like methods and paths: GET under /repos/ without
    /// ?access_token=, and POST only as JSON.
    #[test]
    #[expect(clippy::too_many_lines, reason = "a table of header and query rows")]
    fn header_and_query_rules_narrow_and_judge_the_decoded_names() {
        let get = RequestRuleSpec {
            query: Some(vec!["per_page".into(), "page".into()]),
            ..rule("api.example.com", &["GET"], &["/repos/"])
        };
        let post = RequestRuleSpec {
            headers: vec![("Content-Type".into(), "application/json*".into())],
            ..rule("api.example.com", &["POST"], &["/repos/"])
        };
        let g = grant(&["api.example.com"], vec![get, post]).unwrap();
        let api = parse_authority_form("api.example.com:443").unwrap();
        let json = Headers(vec![("content-type", "application/json; charset=utf-8")]);
        let form = Headers(vec![("content-type", "application/x-www-form-urlencoded")]);
        let two = Headers(vec![
            ("content-type", "application/json"),
            ("content-type", "text/plain"),
        ]);
        let none = Headers(vec![]);
        let rows: &[(&str, Option<&str>, &Headers, &str)] = &[
            ("GET", None, &none, "allowed"),
            ("GET", Some("page=2&per_page=100"), &none, "allowed"),
            ("GET", Some("access_token=x"), &none, "denied_by_rule"),
            (
                "GET",
                Some("page=1&access%5Ftoken=x"),
                &none,
                "denied_by_rule",
            ),
            ("GET", Some("access%255Ftoken=x"), &none, "malformed_target"),
            (
                "GET",
                Some("page=1;access_token=x"),
                &none,
                "malformed_target",
            ),
            ("POST", None, &json, "allowed"),
            // The POST rule has no query list; the GET rule's list is not about POST.
            ("POST", Some("access_token=x"), &json, "allowed"),
            ("POST", None, &form, "denied_by_rule"),
            ("POST", None, &two, "denied_by_rule"),
            ("POST", None, &none, "denied_by_rule"),
        ];
        for (method, query, headers, reason) in rows {
            let facts = RequestFacts::new(method, "/repos/a/b")
                .with_query(*query)
                .with_headers(*headers);
            let d = g.decide_request(&api, &facts);
            assert_eq!(d.reason.as_str(), *reason, "{method} ?{query:?}: {d:?}");
        }
        let d = g.decide_request(
            &api,
            &RequestFacts::new("GET", "/repos/x").with_query(Some("access_token=1")),
        );
        // The GET rule covers the path: the denial names the refused parameter and that
        // rule's list, and says to add it there or drop it.
        assert_eq!(
            d.detail,
            "GET /repos/x on api.example.com: query parameter \"access_token\" not allowed: request_rule[1] api.example.com allows only \"page\", \"per_page\"",
            "{d:?}"
        );
        assert_eq!(
            d.hint,
            "add \"access_token\" to the query list of request_rule[1] api.example.com, or send the request without it",
            "{d:?}"
        );
        assert_eq!(
            d.rule.as_deref(),
            Some("request_rule[1] api.example.com, request_rule[2] api.example.com")
        );
        // Two refused names (one percent-encoded, judged decoded), quoted.
        let d = g.decide_request(
            &api,
            &RequestFacts::new("GET", "/repos/x")
                .with_query(Some("page=1&x%5By%5D=2&access_token=1")),
        );
        assert!(
            d.detail
                .contains("query parameters \"access_token\", \"x[y]\" not allowed")
                && d.hint.contains("send the request without them"),
            "{d:?}"
        );
        // A header the POST rule requires: named (the value sent is never repeated).
        for (headers, how) in [
            (&form, "has a value that does not match"),
            (&none, "is absent"),
        ] {
            let d = g.decide_request(
                &api,
                &RequestFacts::new("POST", "/repos/x").with_headers(headers),
            );
            assert_eq!(
                d.detail,
                format!(
                    "POST /repos/x on api.example.com: header content-type {how}: request_rule[2] api.example.com requires content-type: application/json*"
                ),
                "{d:?}"
            );
            assert!(
                d.hint
                    .starts_with("send content-type with a value matching \"application/json*\"")
                    && !d.detail.contains("x-www-form"),
                "{d:?}"
            );
        }
        // No rule covers the method and path: the rules are listed, as before.
        let d = g.decide_request(&api, &RequestFacts::new("DELETE", "/repos/x"));
        assert!(
            d.hint
                .contains("GET /repos/ with query parameters only among page, per_page")
                && d.hint
                    .contains("POST /repos/ with content-type: application/json*")
                && d.hint.contains("covering DELETE /repos/x"),
            "{d:?}"
        );
        for bad in [
            RequestRuleSpec {
                query: Some(vec!["a b".into()]),
                ..rule("api.example.com", &[], &[])
            },
            RequestRuleSpec {
                headers: vec![("bad name".into(), "x".into())],
                ..rule("api.example.com", &[], &[])
            },
        ] {
            assert!(grant(&["api.example.com"], vec![bad]).is_err());
        }
    }

    fn grant(terminate: &[&str], rules: Vec<RequestRuleSpec>) -> Result<Grant, PolicyError> {
        let spec = GrantSpec {
            name: "agent-a".into(),
            allow: vec!["*.example.com".into(), "api.example.com".into()],
            tls_terminate: terminate.iter().map(|s| (*s).to_owned()).collect(),
            request_rules: rules,
            sni_check: true,
            ..GrantSpec::default()
        };
        Grant::new(&spec, &[])
    }

    #[test]
    fn request_rules_narrow_by_method_and_path_prefix() {
        let g = grant(
            &["api.example.com", "*.example.com"],
            vec![
                rule(
                    "api.example.com",
                    &["GET", "HEAD"],
                    &["/public/", "/v1/repos"],
                ),
                rule("api.example.com:443", &["POST"], &["/v1/repos/x/issues"]),
            ],
        )
        .unwrap();
        let api = parse_authority_form("api.example.com:443").unwrap();
        let other = parse_authority_form("www.example.com:443").unwrap();
        // (target, method, path, reason, rule)
        let rows: &[(&Target, &str, &str, &str, Option<&str>)] = &[
            (
                &api,
                "GET",
                "/public/",
                "allowed",
                Some("request_rule[1] api.example.com"),
            ),
            (
                &api,
                "GET",
                "/public/a/b",
                "allowed",
                Some("request_rule[1] api.example.com"),
            ),
            (
                &api,
                "HEAD",
                "/v1/repos",
                "allowed",
                Some("request_rule[1] api.example.com"),
            ),
            (
                &api,
                "GET",
                "/v1/repos/x",
                "allowed",
                Some("request_rule[1] api.example.com"),
            ),
            (&api, "GET", "/v1/reposx", "denied_by_rule", None),
            (&api, "GET", "/public", "denied_by_rule", None),
            (&api, "POST", "/public/upload", "denied_by_rule", None),
            (&api, "get", "/public/", "denied_by_rule", None),
            (
                &api,
                "POST",
                "/v1/repos/x/issues",
                "allowed",
                Some("request_rule[2] api.example.com:443"),
            ),
            (&api, "GET", "/admin", "denied_by_rule", None),
            (&api, "GET", "/public/../admin", "malformed_target", None),
            (
                &api,
                "GET",
                "/public/%2e%2e/admin",
                "malformed_target",
                None,
            ),
            (&api, "GET", "/public%2Fadmin", "malformed_target", None),
            (&api, "GET", "/public/..\\admin", "malformed_target", None),
            (&api, "OPTIONS", "*", "malformed_target", None),
            // No rule names www.example.com: not narrowed.
            (&other, "POST", "/anything/../x", "allowed", None),
        ];
        for (target, method, path, reason, rule) in rows {
            let d = g.decide_request(target, &RequestFacts::new(method, path));
            assert_eq!(
                d.reason.as_str(),
                *reason,
                "{method} {path} on {target}: {d:?}"
            );
            if let Some(rule) = rule {
                assert_eq!(d.rule.as_deref(), Some(*rule), "{method} {path}");
            }
            if !d.is_allow() {
                assert!(!d.hint.is_empty());
                assert!(
                    d.detail.contains(path) || *reason == "malformed_target",
                    "{d:?}"
                );
            }
        }
        // The port of a rule counts: on :8443 only rule 1 applies.
        let api8443 = parse_authority_form("api.example.com:8443").unwrap();
        assert!(
            !g.decide_request(&api8443, &RequestFacts::new("POST", "/v1/repos/x/issues"))
                .is_allow()
        );
        assert!(
            g.decide_request(&api8443, &RequestFacts::new("GET", "/public/"))
                .is_allow()
        );
    }

    /// Paths that some origin (Tomcat, Jetty, Spring, IIS, double-decoding proxies) serves
    /// outside `/allowed` must be refused where rules apply; plain paths still pass.
    #[test]
    fn path_rule_escapes_are_malformed_and_plain_paths_pass() {
        let g = grant(
            &["api.example.com"],
            vec![rule("api.example.com", &["GET"], &["/allowed"])],
        )
        .unwrap();
        let api = parse_authority_form("api.example.com:443").unwrap();
        // (path, expected reason, a word the detail must contain)
        let rows: &[(&str, &str, &str)] = &[
            ("/allowed/..;/admin", "malformed_target", ";"),
            ("/allowed/..%3b/admin", "malformed_target", "not unreserved"),
            ("/allowed/..%3B/admin", "malformed_target", "not unreserved"),
            ("/allowed/.;/admin", "malformed_target", ";"),
            ("/allowed/..;jsessionid=x/admin", "malformed_target", ";"),
            ("/allowed;x=1", "malformed_target", ";"),
            ("/allowed/%252e%252e/admin", "malformed_target", "double"),
            ("/allowed%252fadmin", "malformed_target", "double"),
            ("/allowed/%25", "malformed_target", "double"),
            (
                "/allowed/%c0%ae%c0%ae/admin",
                "malformed_target",
                "not unreserved",
            ),
            (
                "/allowed/%C0%AE/admin",
                "malformed_target",
                "not unreserved",
            ),
            (
                "/allowed/%u002e%u002e/admin",
                "malformed_target",
                "two hex digits",
            ),
            (
                "/allowed/%U002E/admin",
                "malformed_target",
                "two hex digits",
            ),
            ("/allowed/%", "malformed_target", "two hex digits"),
            ("/allowed/%4", "malformed_target", "two hex digits"),
            ("/allowed/%zz", "malformed_target", "two hex digits"),
            ("/allowed/..%09/admin", "malformed_target", "not unreserved"),
            ("/allowed/..%00/admin", "malformed_target", "not unreserved"),
            ("/allowed/..\\admin", "malformed_target", "backslash"),
            ("/allowed/..\u{9}/admin", "malformed_target", "control"),
            ("/allowed/\u{7f}", "malformed_target", "control"),
            ("/allowed/x y", "malformed_target", "whitespace"),
            ("/allowed/\u{e9}", "malformed_target", "non-ASCII"),
            ("/allowed/%2e%2e/admin", "malformed_target", "dot"),
            ("/allowed/%2E./admin", "malformed_target", "dot"),
            ("/allowed/.%2e/admin", "malformed_target", "dot"),
            ("/allowed%2fadmin", "malformed_target", "slash"),
            ("/allowed%5c..%5cadmin", "malformed_target", "backslash"),
            ("/allowed/%20", "malformed_target", "not unreserved"),
            ("/allowed/%3f", "malformed_target", "not unreserved"),
            ("/allowed/../admin", "malformed_target", "dot segment"),
            ("/allowed/./x", "malformed_target", "dot segment"),
            ("/allowed/..", "malformed_target", "dot segment"),
            ("allowed", "malformed_target", "start with /"),
            ("*", "malformed_target", "start with /"),
            // Plain paths: judged by the prefix.
            ("/allowed", "allowed", ""),
            ("/allowed/", "allowed", ""),
            ("/allowed/a-b_c~d/e.json", "allowed", ""),
            ("/allowed/...", "allowed", ""),
            ("/allowed/.well-known/x", "allowed", ""),
            ("/allowed/a:b@c!$&'()*+,=", "allowed", ""),
            // Escapes of unreserved characters are decoded before matching.
            ("/%61llowed/x", "allowed", ""),
            ("/allowed/%7Euser%2D1", "allowed", ""),
            ("/allowe%64x", "denied_by_rule", ""),
            ("/admin", "denied_by_rule", ""),
            ("/allowedx", "denied_by_rule", ""),
        ];
        for (path, reason, word) in rows {
            let d = g.decide_request(&api, &RequestFacts::new("GET", path));
            assert_eq!(d.reason.as_str(), *reason, "{path:?}: {d:?}");
            assert!(d.detail.contains(word), "{path:?}: {d:?}");
        }
        // A query is not part of the path a rule judges (callers pass the path alone).
        assert!(
            g.decide_request(&api, &RequestFacts::new("GET", "/allowed/e.json"))
                .is_allow()
        );
        // Hosts no rule names are not narrowed, whatever the path.
        let other = parse_authority_form("www.example.com:443").unwrap();
        assert!(
            g.decide_request(&other, &RequestFacts::new("GET", "/allowed/..;/admin"))
                .is_allow()
        );
    }

    #[test]
    fn path_prefixes_that_could_never_match_are_rejected() {
        for (p, want) in [
            ("/a;b", "contains ;"),
            ("/caf\u{e9}", "non-ASCII"),
            ("/a/./b", "dot segment"),
        ] {
            let Err(PolicyError::Config(errors)) = grant(
                &["api.example.com"],
                vec![rule("api.example.com", &[], &[p])],
            ) else {
                panic!("{p:?} must be rejected");
            };
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{p:?}: expected {want:?} in {errors:?}"
            );
        }
    }

    #[test]
    fn empty_methods_or_prefixes_mean_any() {
        let g = grant(
            &["api.example.com"],
            vec![rule("api.example.com", &[], &["/x/"])],
        )
        .unwrap();
        let api = parse_authority_form("api.example.com:443").unwrap();
        assert!(
            g.decide_request(&api, &RequestFacts::new("DELETE", "/x/1"))
                .is_allow()
        );
        assert!(
            !g.decide_request(&api, &RequestFacts::new("GET", "/y"))
                .is_allow()
        );
        let g = grant(
            &["api.example.com"],
            vec![rule("api.example.com", &["GET"], &[])],
        )
        .unwrap();
        assert!(
            g.decide_request(&api, &RequestFacts::new("GET", "/anything"))
                .is_allow()
        );
        assert!(
            !g.decide_request(&api, &RequestFacts::new("PUT", "/anything"))
                .is_allow()
        );
    }

    #[test]
    fn bad_request_rules_are_rejected_naming_the_rule() {
        let rows: &[(&[&str], RequestRuleSpec, &str)] = &[
            (
                &["api.example.com"],
                rule("*.com", &[], &[]),
                "request_rule[1]: invalid request_rule host entry \"*.com\"",
            ),
            (
                &["api.example.com"],
                rule("", &[], &[]),
                "request_rule[1]: invalid request_rule host entry \"\"",
            ),
            (
                &["api.example.com"],
                rule("www.example.com", &[], &[]),
                "request_rule[1]: host \"www.example.com\" is not covered by tls_terminate",
            ),
            (
                &["api.example.com:443"],
                rule("api.example.com", &[], &[]),
                "is not covered by tls_terminate",
            ),
            (
                &["*.a.example.com"],
                rule("*.example.com", &[], &[]),
                "is not covered by tls_terminate",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &["get"], &[]),
                "methods are case-sensitive: write \"GET\"",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &["G T"], &[]),
                "is not an HTTP token",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[""], &[]),
                "must be 1..=32 characters",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[], &["api/"]),
                "must start with /",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[], &["/a?b"]),
                "contains '?'",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[], &["/a/*"]),
                "contains '*'",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[], &["/a%2f"]),
                "contains '%'",
            ),
            (
                &["api.example.com"],
                rule("api.example.com", &[], &["/a/../b"]),
                "has a dot segment",
            ),
        ];
        for (terminate, spec, want) in rows {
            let Err(PolicyError::Config(errors)) = grant(terminate, vec![spec.clone()]) else {
                panic!("{spec:?} must be rejected");
            };
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{spec:?}: expected {want:?} in {errors:?}"
            );
        }
        // Covered by a wider wildcard or an exact match: accepted.
        grant(
            &["*.example.com"],
            vec![rule("*.a.example.com", &["GET"], &["/"])],
        )
        .unwrap();
        grant(
            &["*.example.com"],
            vec![rule("api.example.com:443", &["GET"], &["/"])],
        )
        .unwrap();
    }
}

#[test]
fn hints_name_the_shim_flags_when_the_shim_owns_the_grant() {
    let spec = GrantSpec {
        name: "shim".into(),
        allow: strings(&["origin.test:80"]),
        deny: denies(&["bad.origin.test"]),
        advice: Advice::ShimFlags,
        ..GrantSpec::default()
    };
    let g = Grant::new(&spec, &[]).unwrap();
    let hint = |t: &str| g.decide(&target(t)).hint;
    let detail = |t: &str| g.decide(&target(t)).detail;
    assert_eq!(
        detail("api.example.com:443"),
        "api.example.com is not allowed by the shim's --allow flags"
    );
    assert_eq!(
        detail("origin.test:8080"),
        "origin.test matches the shim's --allow \"origin.test:80\", but not on port 8080"
    );
    assert_eq!(
        detail("bad.origin.test:80"),
        "bad.origin.test:80 matches the shim's --deny bad.origin.test"
    );
    assert_eq!(
        hint("api.example.com:443"),
        "add --allow api.example.com:443 to the shim command"
    );
    assert_eq!(
        hint("origin.test:8080"),
        "add --allow origin.test:8080 to the shim command"
    );
    assert_eq!(
        hint("bad.origin.test:80"),
        "the shim command denies this destination: remove --deny bad.origin.test from it"
    );
    let private = g
        .vet(
            &target("origin.test:80"),
            &["127.0.0.1".parse().unwrap()],
            &OwnAddrs::default(),
        )
        .unwrap_err();
    assert!(
        private
            .hint
            .ends_with("add --allow-private 127.0.0.1/32 to the shim command"),
        "{}",
        private.hint
    );
}
