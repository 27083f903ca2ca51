//! Host canonicalisation and authority-form tables: one row per spelling, with the
//! canonical form or the reason it is rejected.

use super::*;

/// `Ok(canonical text)` or `Err(fragment of the reason)`.
type Row = (&'static str, Result<&'static str, &'static str>);

const HOSTS: &[Row] = &[
    // Names: lowercase, one trailing dot stripped.
    ("example.com", Ok("example.com")),
    ("EXAMPLE.com.", Ok("example.com")),
    ("Example.COM", Ok("example.com")),
    ("a.b.c.example.com", Ok("a.b.c.example.com")),
    ("localhost", Ok("localhost")),
    ("_dmarc.example.com", Ok("_dmarc.example.com")),
    ("_srv._tcp.example.com", Ok("_srv._tcp.example.com")),
    ("a-b.example.com", Ok("a-b.example.com")),
    ("123.example.com", Ok("123.example.com")),
    ("1.2.3.example", Ok("1.2.3.example")),
    ("a.0xg", Ok("a.0xg")),
    ("x1", Ok("x1")),
    ("example.com..", Err("more than one trailing dot")),
    (".", Err("empty host")),
    ("", Err("empty host")),
    (".example.com", Err("empty label")),
    ("a..b", Err("empty label")),
    // IDNA (UTS-46) to A-labels.
    ("bücher.example", Ok("xn--bcher-kva.example")),
    ("BÜCHER.example", Ok("xn--bcher-kva.example")),
    ("xn--bcher-kva.example", Ok("xn--bcher-kva.example")),
    ("münchen.de.", Ok("xn--mnchen-3ya.de")),
    ("例え.テスト", Ok("xn--r8jz45g.xn--zckzah")),
    ("faß.de", Ok("xn--fa-hia.de")),
    ("example。com", Ok("example.com")),
    ("ｅｘａｍｐｌｅ.com", Ok("example.com")),
    ("xn--zz-zz.example", Err("UTS-46")),
    ("exa\u{a0}mple.com", Err("after IDNA mapping")),
    ("a\u{200b}b.com", Ok("ab.com")),
    ("a\u{80}b.com", Err("UTS-46")),
    ("ex\u{ff0f}ample.com", Err("after IDNA mapping")),
    ("１２７.０.０.１", Err("last label is numeric")),
    ("example.１２３", Err("last label is numeric")),
    // IPv4: canonical dotted quad only.
    ("127.0.0.1", Ok("127.0.0.1")),
    ("0.0.0.0", Ok("0.0.0.0")),
    ("255.255.255.255", Ok("255.255.255.255")),
    ("192.0.2.10", Ok("192.0.2.10")),
    ("127.1", Err("exactly four parts")),
    ("127.0.1", Err("exactly four parts")),
    ("1.2.3", Err("exactly four parts")),
    ("1.2.3.4.5", Err("exactly four parts")),
    ("0x7f.1", Err("exactly four parts")),
    ("0x7f.0.0.1", Err("decimal digits")),
    ("0X7F.0.0.1", Err("decimal digits")),
    ("2130706433", Err("exactly four parts")),
    ("0x7f000001", Err("exactly four parts")),
    ("0177.0.0.1", Err("leading zeros")),
    ("01.2.3.4", Err("leading zeros")),
    ("127.0.0.01", Err("leading zeros")),
    ("127.000.000.001", Err("leading zeros")),
    ("256.0.0.1", Err("at most 255")),
    ("1.2.3.256", Err("at most 255")),
    ("1.2.3.4.", Err("must not end with a dot")),
    ("example.123", Err("names must not end in a numeric label")),
    ("example.0x1f", Err("names must not end in a numeric label")),
    ("example.0x", Err("names must not end in a numeric label")),
    ("a.b.c.1", Err("names must not end in a numeric label")),
    ("1.2.3.0x4", Err("decimal digits")),
    // IPv6: compressed, IPv4-mapped unwrapped, zone IDs rejected.
    ("::1", Ok("::1")),
    ("[::1]", Ok("::1")),
    ("2001:db8::1", Ok("2001:db8::1")),
    ("[2001:DB8:0:0:0:0:0:1]", Ok("2001:db8::1")),
    ("2001:0db8:0000::0001", Ok("2001:db8::1")),
    ("[::ffff:192.0.2.1]", Ok("192.0.2.1")),
    ("::ffff:7f00:1", Ok("127.0.0.1")),
    ("::127.0.0.1", Ok("::7f00:1")),
    ("64:ff9b::192.0.2.1", Ok("64:ff9b::c000:201")),
    ("fe80::1%eth0", Err("zone IDs")),
    ("[fe80::1%25eth0]", Err("zone IDs")),
    ("[fe80::1", Err("without a closing")),
    ("[::1]:443", Err("without a closing")),
    ("2001:db8::g", Err("not a valid IPv6")),
    ("1:2:3:4:5:6:7:8:9", Err("not a valid IPv6")),
    ("[example.com]", Err("only allowed around an IPv6")),
    ("[127.0.0.1]", Err("only allowed around an IPv6")),
    // Things that are not hosts.
    ("example.com:443", Err("port is not allowed")),
    ("user@example.com", Err("userinfo")),
    ("user:pw@example.com", Err("userinfo")),
    ("example.com/path", Err("paths")),
    ("example.com\\evil", Err("paths")),
    ("example.com?q", Err("paths")),
    ("example.com#f", Err("paths")),
    ("exa%6dple.com", Err("percent")),
    ("example.com\0", Err("control")),
    ("example.com\r\nX-Injected: 1", Err("control")),
    ("exa mple.com", Err("control or space")),
    ("example.com\t", Err("control or space")),
    ("exa*mple.com", Err("not allowed in a host")),
    ("*.example.com", Err("not allowed in a host")),
    ("exa\"mple.com", Err("not allowed in a host")),
    ("a]b", Err("brackets")),
    // Lengths.
    (
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.example",
        Ok("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.example"),
    ),
    (
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.example",
        Err("label of 64 bytes"),
    ),
];

#[test]
fn canonicalize_host_table() {
    let mut failures = Vec::new();
    for (input, want) in HOSTS {
        let got = canonicalize_host(input);
        let ok = match (&got, want) {
            (Ok(h), Ok(text)) => h.as_text() == *text,
            (Err(PolicyError::Host { input: i, why }), Err(frag)) => {
                i == input && why.to_string().contains(frag)
            }
            _ => false,
        };
        if !ok {
            failures.push(format!("{input:?}: want {want:?}, got {got:?}"));
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
fn name_lengths() {
    let label63 = "a".repeat(63);
    // 4 * 63 + 3 dots = 255 bytes: too long; trim to exactly 253.
    let long = [label63.as_str(); 4].join(".");
    assert_eq!(long.len(), 255);
    let e = canonicalize_host(&long).unwrap_err().to_string();
    assert!(e.contains("255 bytes long; at most 253"), "{e}");
    let ok = &long[2..];
    assert_eq!(ok.len(), 253);
    assert_eq!(canonicalize_host(ok).unwrap().as_text(), ok);
    // With its one trailing dot, 254 bytes are fine.
    assert_eq!(canonicalize_host(&format!("{ok}.")).unwrap().as_text(), ok);
    let huge = "a.".repeat(600);
    assert!(
        canonicalize_host(&huge)
            .unwrap_err()
            .to_string()
            .contains("longer than 1024")
    );
}

#[test]
fn kinds_and_uri_form() {
    let v6 = canonicalize_host("[2001:db8::1]").unwrap();
    assert_eq!(v6.ip(), Some("2001:db8::1".parse().unwrap()));
    assert_eq!(v6.name(), None);
    assert_eq!(v6.to_uri_host(), "[2001:db8::1]");
    let v4 = canonicalize_host("::ffff:1.2.3.4").unwrap();
    assert_eq!(v4.ip(), Some("1.2.3.4".parse().unwrap()));
    assert_eq!(v4.to_uri_host(), "1.2.3.4");
    let n = canonicalize_host("Example.COM.").unwrap();
    assert_eq!(n.name(), Some("example.com"));
    assert_eq!(n, canonicalize_host("example.com").unwrap());
}

/// `Ok((canonical host, port))` or `Err(fragment of the reason)`.
type AuthRow = (&'static str, Result<(&'static str, u16), &'static str>);

const AUTHORITY_FORMS: &[AuthRow] = &[
    ("example.com:443", Ok(("example.com", 443))),
    ("EXAMPLE.com.:80", Ok(("example.com", 80))),
    ("bücher.example:8443", Ok(("xn--bcher-kva.example", 8443))),
    ("192.0.2.1:1", Ok(("192.0.2.1", 1))),
    ("[2001:db8::1]:443", Ok(("2001:db8::1", 443))),
    ("[::ffff:192.0.2.1]:443", Ok(("192.0.2.1", 443))),
    ("example.com:65535", Ok(("example.com", 65535))),
    ("example.com", Err("port is required")),
    ("example.com:", Err("empty port")),
    ("example.com:0", Err("port 0")),
    ("example.com:65536", Err("out of range")),
    ("example.com:0443", Err("leading zeros")),
    ("example.com:+443", Err("not a decimal")),
    ("example.com:-1", Err("not a decimal")),
    ("example.com:44 3", Err("not a decimal")),
    ("example.com:https", Err("not a decimal")),
    ("2001:db8::1:443", Err("must be bracketed")),
    ("[2001:db8::1]", Err("port is required")),
    ("[2001:db8::1]443", Err("after ']'")),
    ("[example.com]:443", Err("only allowed around an IPv6")),
    ("[fe80::1%25eth0]:443", Err("zone IDs")),
    ("user@example.com:443", Err("userinfo")),
    ("user:pw@example.com:443", Err("userinfo")),
    ("127.1:80", Err("exactly four parts")),
    ("0x7f.0.0.1:80", Err("decimal digits")),
    ("2130706433:80", Err("exactly four parts")),
    ("1.2.3.4.:80", Err("must not end with a dot")),
    ("example.com/x:443", Err("paths")),
    (":443", Err("empty host")),
    ("example.com:443\r\n", Err("not a decimal")),
    // Near misses: the message says what is wrong and, when it is valid, which target was
    // probably meant. A URL is not a target (what a user may pass to `mediator explain`).
    (
        "http://host:8081/",
        Err(
            "it is a URL; a target is host:port (authority-form, RFC 9112 section 3.2.3), e.g. \"host:8081\"",
        ),
    ),
    (
        "HTTPS://Example.COM/path?q",
        Err(
            "it is a URL; a target is host:port (authority-form, RFC 9112 section 3.2.3), e.g. \"example.com:443\"",
        ),
    ),
    (
        "http://[2001:db8::1]/",
        Err(
            "it is a URL; a target is host:port (authority-form, RFC 9112 section 3.2.3), e.g. \"[2001:db8::1]:80\"",
        ),
    ),
    (
        "http://alice:pw@origin.test:8080/x",
        Err(
            "it is a URL; a target is host:port (authority-form, RFC 9112 section 3.2.3), e.g. \"origin.test:8080\"",
        ),
    ),
    (
        "http://host:bad/",
        Err("it is a URL; a target is host:port (authority-form, RFC 9112 section 3.2.3)"),
    ),
    (
        "socks5://proxy.test",
        Err("it is a URL; a target is host:port (authority-form, RFC 9112 section 3.2.3)"),
    ),
    (
        "http://2001:db8::1:80/",
        Err("it is a URL; a target is host:port"),
    ),
    // A path, query or fragment.
    (
        "host:80/x",
        Err(
            "paths, queries and fragments are not part of a target; a target is host:port (authority-form, RFC 9112 section 3.2.3), e.g. \"host:80\"",
        ),
    ),
    (
        "Host.test:80?q=1",
        Err(
            "paths, queries and fragments are not part of a target; a target is host:port (authority-form, RFC 9112 section 3.2.3), e.g. \"host.test:80\"",
        ),
    ),
    ("host.test:80#top", Err("e.g. \"host.test:80\"")),
    ("[::1]:443/", Err("e.g. \"[::1]:443\"")),
    (
        "/x",
        Err(
            "paths, queries and fragments are not part of a target; a target is host:port (authority-form, RFC 9112 section 3.2.3)",
        ),
    ),
    // Userinfo, never repeated.
    (
        "alice:pw@origin.test:443",
        Err(
            "userinfo is not part of a target; a target is host:port (authority-form, RFC 9112 section 3.2.3), e.g. \"origin.test:443\"",
        ),
    ),
    (
        "alice@origin.test",
        Err(
            "userinfo is not part of a target; a target is host:port (authority-form, RFC 9112 section 3.2.3)",
        ),
    ),
    // Colons: the IPv6 wording only for an IPv6 literal followed by a port.
    (
        "2001:db8::1:443",
        Err("an IPv6 literal with a port must be bracketed: \"[2001:db8::1]:443\""),
    ),
    (
        "::ffff:192.0.2.1:443",
        Err("must be bracketed: \"[::ffff:192.0.2.1]:443\""),
    ),
    (
        "2001:db8::1:0",
        Err("must be bracketed: \"[2001:db8::1]:443\""),
    ),
    (
        "2001:db8::1",
        Err(
            "a port is required (host:port), and an IPv6 literal goes in brackets before it, e.g. \"[2001:db8::1]:443\"",
        ),
    ),
    (
        "::1",
        Err(
            "port is required (host:port), and an IPv6 literal goes in brackets before it, e.g. \"[::1]:443\"",
        ),
    ),
    (
        "a:b:c",
        Err(
            "more than one ':' outside brackets; a target is host:port (authority-form, RFC 9112 section 3.2.3), with an IPv6 host in brackets, e.g. \"[2001:db8::1]:443\"",
        ),
    ),
    (
        "example.com:443:443",
        Err("more than one ':' outside brackets"),
    ),
];

#[test]
fn parse_authority_form_table() {
    let mut failures = Vec::new();
    for (input, want) in AUTHORITY_FORMS {
        let got = parse_authority_form(input);
        let ok = match (&got, want) {
            (Ok(t), Ok((host, port))) => t.host.as_text() == *host && t.port == *port,
            (Err(PolicyError::Host { input: i, why }), Err(frag)) => {
                i == input && why.to_string().contains(frag)
            }
            _ => false,
        };
        if !ok {
            failures.push(format!("{input:?}: want {want:?}, got {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The whole message for a URL, as `mediator explain` prints it, and the places where
/// the old IPv6 wording must not appear.
#[test]
fn near_miss_messages_say_what_is_wrong() {
    let message = |input: &str| parse_authority_form(input).unwrap_err().to_string();
    assert_eq!(
        message("http://host:8081/"),
        "invalid host \"http://host:8081/\": it is a URL; a target is host:port \
         (authority-form, RFC 9112 section 3.2.3), e.g. \"host:8081\""
    );
    assert_eq!(
        message("host:80/x"),
        "invalid host \"host:80/x\": paths, queries and fragments are not part of a target; \
         a target is host:port (authority-form, RFC 9112 section 3.2.3), e.g. \"host:80\""
    );
    for input in [
        "http://host:8081/",
        "https://[::1]:8443/",
        "host:80/x",
        "2001:db8::1",
        "a:b:c",
        "http://host",
    ] {
        assert!(
            !message(input).contains("bracketed"),
            "{input}: {}",
            message(input)
        );
    }
    // The reason never repeats userinfo (the input, quoted before it, is redacted by the
    // mediator where it is shown).
    for input in [
        "http://alice:s3cret@origin.test:1/",
        "alice:s3cret@origin.test:1",
    ] {
        let Err(PolicyError::Host { why, .. }) = parse_authority_form(input) else {
            panic!("{input} must be rejected");
        };
        let why = why.to_string();
        assert!(!why.contains("alice") && !why.contains("s3cret"), "{why}");
        assert!(why.ends_with("e.g. \"origin.test:1\""), "{why}");
    }
}

#[test]
fn target_display_brackets_ipv6() {
    assert_eq!(
        parse_authority_form("[2001:db8::1]:443")
            .unwrap()
            .to_string(),
        "[2001:db8::1]:443"
    );
    assert_eq!(
        parse_authority_form("Example.com:80").unwrap().to_string(),
        "example.com:80"
    );
}
