//! Unit tests of `credential`.

use super::body::check_trailers;
use super::*;
use crate::testing;
use policy::Reason;
use std::os::unix::fs::PermissionsExt as _;

/// `agent-a` with its credential on `api.test`, terminated on it and on `other.test`.
fn config() -> String {
    testing::agent_a_config(
        r#"allow = ["api.test", "other.test"]
tls_terminate = ["api.test", "other.test"]"#,
    )
}

fn authority() -> Authority {
    testing::with_secret(&config()).1
}

fn target(h: &str) -> Target {
    policy::parse_authority_form(&format!("{h}:443")).unwrap()
}

#[test]
fn the_placeholder_is_replaced_in_its_header_only() {
    let a = authority();
    let mut h = HeaderMap::new();
    h.insert(
        "authorization",
        "Bearer mediator:api:agent-a".parse().unwrap(),
    );
    let used = apply(&a, &target("api.test"), &"/x".parse().unwrap(), &mut h).unwrap();
    assert_eq!(h["authorization"], "Bearer s3cret");
    assert_eq!(used[0].header, "authorization");
    // Without the placeholder, nothing is added.
    let mut h = HeaderMap::new();
    let used = apply(&a, &target("api.test"), &"/x".parse().unwrap(), &mut h).unwrap();
    assert!(used.is_empty() && h.is_empty());
}

#[test]
fn a_placeholder_elsewhere_is_misuse() {
    let a = authority();
    for (host, uri, header) in [
        ("other.test", "/x", "Bearer mediator:api:agent-a"),
        ("other.test", "/x?k=mediator%3Aapi%3Aagent-a", "none"),
        ("other.test", "/x?k=mediator%253Aapi%253Aagent-a", "none"),
        ("api.test", "/x?k=mediator:api:agent-a", "none"),
    ] {
        let mut h = HeaderMap::new();
        h.insert("x-other", header.parse().unwrap());
        let e = apply(&a, &target(host), &uri.parse().unwrap(), &mut h).unwrap_err();
        assert_eq!(e.reason, Reason::CredentialMisuse, "{host} {uri}");
        assert!(!e.detail.contains("s3cret") && !e.hint.contains("s3cret"));
        let e = check_plain(&a, &target(host), &uri.parse().unwrap(), &h).unwrap_err();
        assert_eq!(e.reason, Reason::CredentialMisuse);
    }
}

#[test]
fn the_detail_says_where_the_placeholder_was_and_how() {
    let a = authority();
    let detail = |host: &str, uri: &str, name: &str, value: &str| {
        let mut h = HeaderMap::new();
        h.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        apply(&a, &target(host), &uri.parse().unwrap(), &mut h)
            .unwrap_err()
            .detail
    };
    // (host, request target, header name, header value, what the detail says, whether
    // it ends with it rather than only containing it).
    let cases = [
        // Encoded in its own header on its own host: not replaced, and said so.
        (
            "api.test",
            "/x",
            "authorization",
            "Bearer mediator%3Aapi%3Aagent-a",
            "percent-encoded in its own authorization header: only the placeholder exactly as given is replaced by the secret, so this one is refused, not forwarded",
            true,
        ),
        (
            "api.test",
            "/x",
            "x-note",
            "mediator:api:agent-a",
            "in the x-note header, outside its authorization header (the only place it is replaced by the secret)",
            true,
        ),
        (
            "api.test",
            "/x?t=mediator:api:agent-a",
            "x-note",
            "-",
            "in the request target, outside its authorization header",
            false,
        ),
        (
            "other.test",
            "/x?t=mediator%3Aapi%3Aagent-a",
            "x-note",
            "-",
            "percent-encoded in the request target to a host it does not belong to",
            true,
        ),
    ];
    for (host, uri, name, value, says, at_the_end) in cases {
        let d = detail(host, uri, name, value);
        let said = if at_the_end {
            d.ends_with(says)
        } else {
            d.contains(says)
        };
        assert!(said, "{d}");
    }
}

#[test]
fn a_host_holding_a_placeholder_is_misuse_before_it_is_resolved() {
    let text = config().replace("mediator:api:agent-a", "ph-api-agent-a");
    let a = testing::first_authority(&text).1;
    for host in [
        "ph-api-agent-a.other.test",
        "PH-API-AGENT-A.other.test",
        "x.ph-api-agent-a",
        "ph-api-agent-a",
    ] {
        let e = check_target(&a, &target(host)).unwrap_err();
        assert_eq!(e.reason, Reason::CredentialMisuse, "{host}");
        assert!(e.detail.contains("in the host name itself"), "{}", e.detail);
        assert!(
            e.detail
                .contains("credential[1] (authorization for api.test)")
        );
    }
    for host in ["other.test", "api.test", "ph-api.other.test"] {
        check_target(&a, &target(host)).unwrap();
    }
    // Without placeholders nothing is looked at.
    check_target(
        &authority_without_placeholder(),
        &target("ph-api-agent-a.x"),
    )
    .unwrap();
}

fn authority_without_placeholder() -> Authority {
    let text = config().replace("placeholder = \"mediator:api:agent-a\"\n", "");
    testing::first_authority(&text).1
}

#[test]
fn trailers_may_carry_no_placeholder_on_any_host() {
    let a = authority();
    for (host, value) in [
        ("other.test", "mediator:api:agent-a"),
        ("api.test", "Bearer mediator:api:agent-a"),
        ("api.test", "mediator%253Aapi%253Aagent-a"),
    ] {
        let mut t = HeaderMap::new();
        t.insert("x-sig", value.parse().unwrap());
        let e = check_trailers(&a, &target(host), &t).unwrap_err();
        assert_eq!(e.reason, Reason::CredentialMisuse);
        assert!(
            e.detail.contains("in the x-sig trailer field"),
            "{}",
            e.detail
        );
    }
    let mut t = HeaderMap::new();
    t.insert("x-sig", "sha256=abc".parse().unwrap());
    check_trailers(&a, &target("other.test"), &t).unwrap();
}

#[test]
fn a_placeholder_is_found_once_decoded_even_where_twice_would_hide_it() {
    // Decoded once, `%25%61%64...` is `%ad...`, the placeholder after a `%`; decoded
    // twice, `%ad` is one byte and the placeholder is gone.
    for (placeholder, uri) in [
        ("ad:api:agent-a", "/x?k=%25%61%64:api:agent-a"),
        ("api%41agent", "/x?k=api%2541agent"),
    ] {
        let text = config().replace("mediator:api:agent-a", placeholder);
        let a = testing::first_authority(&text).1;
        let e = check_plain(
            &a,
            &target("other.test"),
            &uri.parse().unwrap(),
            &HeaderMap::new(),
        )
        .unwrap_err();
        assert_eq!(e.reason, Reason::CredentialMisuse, "{uri}");
    }
    for text in [&b"%2541"[..], b"%%41%4", b"%zz", b""] {
        assert!(percent_decode(text).iter().all(|d| d.len() <= text.len()));
    }
}

#[test]
fn secret_files_readable_by_others_or_writable_by_group_or_others_are_refused() {
    let dir = std::env::temp_dir().join(format!("cred-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("secret");
    std::fs::write(&path, "s3cret\n").unwrap();
    let text = config().replace(
        "secret_env = \"UNUSED\"",
        &format!("secret_file = \"{}\"", path.display()),
    );
    let load = |mode: u32| {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut c = policy::config::parse(&text, "m.toml").unwrap();
        load_secrets(&mut c.authorities[0])
    };
    let e = load(0o644).unwrap_err();
    assert!(
        e[0].contains("readable or writable by others (mode 0644)"),
        "{e:?}"
    );
    assert!(e[0].starts_with("m.toml:10:1: authority \"agent-a\": credential[1]"));
    for (mode, says) in [
        (0o620, "writable by its group (mode 0620)"),
        (0o660, "writable by its group (mode 0660)"),
        (0o602, "readable or writable by others (mode 0602)"),
    ] {
        let e = load(mode).unwrap_err();
        assert!(e[0].contains(says), "{mode:o}: {e:?}");
        assert!(e[0].starts_with("m.toml:10:1: authority \"agent-a\": credential[1]"));
    }
    load(0o640).unwrap();
    load(0o400).unwrap();
    load(0o600).unwrap();
    std::fs::write(&path, "\n").unwrap();
    let e = load(0o600).unwrap_err();
    assert!(e[0].ends_with("the secret is empty"), "{e:?}");
    // A placeholder that is the secret, holds it, or is part of it: refused, and the
    // error does not quote it.
    for secret in [
        "mediator:api:agent-a",
        "mediator:api",
        "xx-mediator:api:agent-a-yy",
    ] {
        std::fs::write(&path, format!("{secret}\n")).unwrap();
        let e = load(0o600).unwrap_err();
        assert!(
            e.iter()
                .any(|m| m.contains("must share nothing with a secret")),
            "{e:?}"
        );
        assert!(e.iter().all(|m| !m.contains(secret)), "{e:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
