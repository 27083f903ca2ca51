//! Host pattern tables: which entries load (and what they match), and why the others
//! are rejected.

use super::*;
use crate::host::parse_authority_form;

use PatternUse::{Allow, Deny};

/// Entry, use, and `Ok(kind description, port)` or `Err(fragment of the reason)`.
/// Kind descriptions: `=host`, `*.suffix`, `net:CIDR`, `any`.
type Row = (
    &'static str,
    PatternUse,
    Result<(&'static str, Option<u16>), &'static str>,
);

const PARSE: &[Row] = &[
    ("example.com", Allow, Ok(("=example.com", None))),
    ("EXAMPLE.com.", Allow, Ok(("=example.com", None))),
    ("example.com:443", Allow, Ok(("=example.com", Some(443)))),
    (
        "_dmarc.example.com",
        Allow,
        Ok(("=_dmarc.example.com", None)),
    ),
    (
        "bücher.example:443",
        Allow,
        Ok(("=xn--bcher-kva.example", Some(443))),
    ),
    ("*.example.com", Allow, Ok(("*.example.com", None))),
    (
        "*.Example.COM:8443",
        Deny,
        Ok(("*.example.com", Some(8443))),
    ),
    (
        "*.bücher.example",
        Allow,
        Ok(("*.xn--bcher-kva.example", None)),
    ),
    (
        "*.githubusercontent.com",
        Allow,
        Ok(("*.githubusercontent.com", None)),
    ),
    (
        "raw.githubusercontent.com:443",
        Allow,
        Ok(("=raw.githubusercontent.com", Some(443))),
    ),
    ("*.example.co.uk", Allow, Ok(("*.example.co.uk", None))),
    ("*.user.github.io", Allow, Ok(("*.user.github.io", None))),
    ("com", Allow, Ok(("=com", None))),
    ("203.0.113.7", Allow, Ok(("=203.0.113.7", None))),
    ("203.0.113.7:443", Allow, Ok(("=203.0.113.7", Some(443)))),
    ("2001:db8::1", Allow, Ok(("=2001:db8::1", None))),
    ("[2001:db8::1]", Allow, Ok(("=2001:db8::1", None))),
    ("[2001:db8::1]:443", Allow, Ok(("=2001:db8::1", Some(443)))),
    ("::ffff:192.0.2.1", Allow, Ok(("=192.0.2.1", None))),
    ("10.0.0.0/8", Deny, Ok(("net:10.0.0.0/8", None))),
    ("10.0.0.0/8:22", Deny, Ok(("net:10.0.0.0/8", Some(22)))),
    ("2001:db8::/32", Allow, Ok(("net:2001:db8::/32", None))),
    (
        "[2001:db8::/32]:443",
        Allow,
        Ok(("net:2001:db8::/32", Some(443))),
    ),
    ("192.0.2.1/32", Allow, Ok(("net:192.0.2.1/32", None))),
    ("*", Deny, Ok(("any", None))),
    ("*:25", Deny, Ok(("any", Some(25)))),
    // Rejections (design 4.1).
    ("*", Allow, Err("every host")),
    ("*:443", Allow, Err("every host")),
    ("*:0", Deny, Err("port 0")),
    ("*.", Allow, Err("needs a domain")),
    ("*.", Deny, Err("needs a domain")),
    ("*x", Allow, Err("whole first label")),
    ("*x.com", Allow, Err("whole first label")),
    ("a.*.com", Deny, Err("whole first label")),
    ("**", Deny, Err("whole first label")),
    ("**.example.com", Allow, Err("whole first label")),
    ("*.*.example.com", Allow, Err("only one wildcard")),
    ("example.*", Allow, Err("whole first label")),
    (
        "*.com",
        Allow,
        Err("wildcard over public suffix \"com\"; write \"*.example.com\" for one domain"),
    ),
    ("*.com", Deny, Err("public suffix \"com\"")),
    ("*.co.uk", Allow, Err("public suffix \"co.uk\"")),
    ("*.CO.UK.", Allow, Err("public suffix \"co.uk\"")),
    // Private-section PSL entries are company namespaces: a wildcard is accepted.
    ("*.github.io", Allow, Ok(("*.github.io", None))),
    (
        "*.s3.amazonaws.com",
        Allow,
        Ok(("*.s3.amazonaws.com", None)),
    ),
    ("*.gov.uk", Allow, Err("public suffix \"gov.uk\"")),
    ("*.xn--p1ai", Allow, Err("public suffix \"xn--p1ai\"")),
    ("*.рф", Allow, Err("public suffix \"xn--p1ai\"")),
    ("*.internal", Allow, Err("public suffix \"internal\"")),
    ("*.test", Allow, Err("public suffix \"test\"")),
    ("*.1.2.3.4", Allow, Err("cannot cover an IP address")),
    ("*.1.2.3", Allow, Err("exactly four parts")),
    ("*.example.1", Allow, Err("numeric label")),
    ("", Allow, Err("empty entry")),
    (".example.com", Allow, Err("empty label")),
    ("a..example.com", Allow, Err("empty label")),
    ("*..example.com", Allow, Err("empty label")),
    ("example.com..", Allow, Err("more than one trailing dot")),
    (
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.example.com",
        Allow,
        Err("label of 64 bytes"),
    ),
    ("exa mple.com", Allow, Err("space")),
    (" example.com", Allow, Err("space")),
    ("exa$mple.com", Allow, Err("not allowed in a host")),
    ("ex\u{ff04}mple.com", Allow, Err("after IDNA mapping")),
    ("user@example.com", Allow, Err("userinfo")),
    ("user:pw@example.com:443", Allow, Err("userinfo")),
    ("example.com/path", Allow, Err("paths are not allowed")),
    ("https://example.com", Allow, Err("not a URL")),
    ("example.com/", Allow, Err("paths are not allowed")),
    ("example.com:443/x", Allow, Err("not a decimal")),
    ("[example.com]", Allow, Err("only allowed around an IPv6")),
    (
        "[example.com]:443",
        Allow,
        Err("only allowed around an IPv6"),
    ),
    ("[10.0.0.0/8]", Deny, Err("only allowed around an IPv6")),
    ("example.com:0", Allow, Err("port 0")),
    ("example.com:http", Allow, Err("not a decimal")),
    ("example.com:65536", Allow, Err("out of range")),
    ("example.com:0443", Allow, Err("leading zeros")),
    ("example.com:", Allow, Err("empty port")),
    (
        "10.0.0.1/8",
        Deny,
        Err("host bits set; write \"10.0.0.0/8\""),
    ),
    (
        "2001:db8::1/32",
        Allow,
        Err("host bits set; write \"2001:db8::/32\""),
    ),
    ("10.0.0.0/33", Deny, Err("is not a CIDR")),
    ("127.1", Allow, Err("exactly four parts")),
    ("0x7f.0.0.1", Allow, Err("decimal digits")),
    ("2130706433", Allow, Err("exactly four parts")),
    ("0177.0.0.1:80", Allow, Err("leading zeros")),
    ("fe80::1%eth0", Allow, Err("zone IDs")),
    ("example.123", Allow, Err("numeric label")),
];

fn describe(p: &HostPattern) -> String {
    match &p.kind {
        PatternKind::Exact(h) => format!("={h}"),
        PatternKind::Suffix(s) => format!("*.{s}"),
        PatternKind::Net(n) => format!("net:{n}"),
        PatternKind::Any => "any".into(),
    }
}

#[test]
fn parse_table() {
    let mut failures = Vec::new();
    for (entry, usage, want) in PARSE {
        let got = HostPattern::parse("allow", entry, *usage);
        let ok = match (&got, want) {
            (Ok(p), Ok((kind, port))) => {
                describe(p) == *kind && p.port == *port && p.source == *entry
            }
            (
                Err(PolicyError::Pattern {
                    field,
                    entry: e,
                    why,
                }),
                Err(frag),
            ) => *field == "allow" && e == entry && why.to_string().contains(frag),
            _ => false,
        };
        if !ok {
            failures.push(format!("{entry:?} ({usage:?}): want {want:?}, got {got:?}"));
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
fn error_message_names_field_and_entry() {
    let e = HostPattern::parse("deny", "*.co.uk", Deny).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid deny entry \"*.co.uk\": wildcard over public suffix \"co.uk\"; write \"*.example.co.uk\" for one domain"
    );
}

/// Pattern, target (authority-form), whether it matches.
const MATCHES: &[(&str, &str, bool)] = &[
    ("example.com", "example.com:443", true),
    ("example.com", "EXAMPLE.COM.:80", true),
    ("example.com", "a.example.com:443", false),
    ("example.com", "example.com.evil.test:443", false),
    ("example.com", "notexample.com:443", false),
    ("example.com:443", "example.com:443", true),
    ("example.com:443", "example.com:80", false),
    ("*.example.com", "a.example.com:443", true),
    ("*.example.com", "a.b.example.com:1", true),
    ("*.example.com", "example.com:443", false),
    ("*.example.com", "aexample.com:443", false),
    ("*.example.com", "a.example.com.evil.test:443", false),
    ("*.example.com", "_dmarc.example.com:53", true),
    ("*.example.com:443", "a.example.com:8443", false),
    ("*.bücher.example", "a.xn--bcher-kva.example:443", true),
    ("bücher.example", "BÜCHER.example:443", true),
    ("203.0.113.7", "203.0.113.7:443", true),
    ("203.0.113.7", "203.0.113.8:443", false),
    ("203.0.113.7:443", "203.0.113.7:80", false),
    ("[2001:db8::1]:443", "[2001:db8:0::1]:443", true),
    ("2001:db8::1", "[2001:db8::2]:443", false),
    ("::ffff:203.0.113.7", "203.0.113.7:443", true),
    ("203.0.113.7", "[::ffff:203.0.113.7]:443", true),
    ("203.0.113.0/24", "203.0.113.99:443", true),
    ("203.0.113.0/24", "203.0.114.1:443", false),
    ("2001:db8::/32", "[2001:db8:1::5]:443", true),
    ("2001:db8::/32", "[2001:db9::5]:443", false),
    ("10.0.0.0/8", "10.example.com:443", false),
    ("0.0.0.0/1", "example.com:443", false),
    ("*", "anything.example:1", true),
    ("*", "[::1]:22", true),
    ("*:25", "mail.example.com:25", true),
    ("*:25", "mail.example.com:587", false),
    ("com", "com:443", true),
    ("com", "example.com:443", false),
];

#[test]
fn matches_table() {
    let mut failures = Vec::new();
    for (pattern, target, want) in MATCHES {
        let p = HostPattern::parse("deny", pattern, Deny).unwrap();
        let t = parse_authority_form(target).unwrap();
        if p.matches(&t) != *want {
            failures.push(format!("{pattern:?} vs {target:?}: want {want}"));
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
fn public_suffix_checks() {
    assert!(is_public_suffix("com"));
    assert!(is_public_suffix("co.uk"));
    assert!(!is_public_suffix("github.io"));
    assert!(is_public_suffix("anything-single"));
    assert!(!is_public_suffix("example.com"));
    assert!(!is_public_suffix("example.unknown-tld-xyz"));
}
