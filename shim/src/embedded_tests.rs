use super::*;

#[test]
fn flags_build_a_valid_one_authority_grant() {
    let c = config(
        &["example.com".into(), "*.example.org:443".into()],
        &[],
        &["127.0.0.1/32".into()],
        &["Origin.Test=127.0.0.1".into()],
        false,
    )
    .unwrap()
    .0;
    assert_eq!(c.authorities.len(), 1);
    assert_eq!(
        c.resolver.hosts.get("origin.test"),
        Some(&vec!["127.0.0.1".parse().unwrap()])
    );
}

#[test]
fn bad_patterns_are_rejected_with_the_entry() {
    let e = config(&["*.com".into()], &[], &[], &[], false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("*.com"), "{e}");
}

#[test]
fn each_bad_value_is_named_with_its_flag_not_a_toml_position() {
    let e = config(
        &["ok.example".into(), "*.com".into()],
        &["a..b".into()],
        &["10.0.0.1/8".into()],
        &["1.2.3.4=5.6.7.8".into()],
        false,
    )
    .unwrap_err()
    .to_string();
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 4, "{e}");
    assert!(
        lines[0].starts_with("--allow '*.com': ") && lines[0].contains("public suffix"),
        "{e}"
    );
    assert!(lines[1].starts_with("--deny 'a..b': "), "{e}");
    assert!(
        lines[2].starts_with("--allow-private '10.0.0.1/8': CIDR has host bits set"),
        "{e}"
    );
    assert!(
        lines[3].starts_with("--resolve '1.2.3.4=5.6.7.8': NAME must be a host name"),
        "{e}"
    );
    // Nothing of the TOML document the grant is built as, nor the entry said twice.
    for noise in ["embedded grant", "invalid ", ":2:", "authority \"shim\""] {
        assert!(!e.contains(noise), "{noise:?} in {e}");
    }
}

#[test]
fn a_value_with_a_quote_is_quoted_the_shell_way() {
    let e = config(&["it's".into()], &[], &[], &[], false)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with(r"--allow 'it'\''s': "), "{e}");
}

fn record(
    protocol: mediator::Protocol,
    reason: policy::Reason,
    cause: mediator::Cause,
) -> mediator::Record {
    mediator::Record {
        event: mediator::vocab::Event::Decision,
        ts: "2026-12-01T00:00:00.000Z".into(),
        id: 1,
        conn: 1,
        authority: Some(AUTHORITY.into()),
        channel: mediator::vocab::Channel::Embedded,
        peer: mediator::decision_log::Peer::Embedded,
        protocol,
        host: Some("evil.example".into()),
        port: Some(443),
        decision: policy::Verdict::Deny,
        reason,
        rule: None,
        detail: "d".into(),
        hint: "add --allow evil.example:443 to the shim command".into(),
        message: None,
        cause,
        pin: None,
        route: None,
        dns_ms: None,
        connect_ms: None,
        bytes_up: None,
        bytes_down: None,
        duration_ms: None,
        close_reason: None,
        client_tls: None,
        tls_alert: None,
        method: None,
        path: None,
        capture: false,
        credential: Vec::new(),
        upgrade: None,
        invocation: None,
        tags: std::collections::BTreeMap::new(),
        asked: None,
    }
}

#[test]
fn denials_carry_the_answer_the_client_got() {
    use mediator::{Cause, Protocol};
    use policy::Reason;
    let d = denial_of(&record(
        Protocol::Connect,
        Reason::NotInAllowlist,
        Cause::Policy,
    ))
    .unwrap();
    assert_eq!((d.protocol, d.status), ("connect", 403));
    assert_eq!(d.reason.as_deref(), Some("not_in_allowlist"));
    assert_eq!(
        (d.host.as_deref(), d.port),
        (Some("evil.example"), Some(443))
    );
    assert_eq!(
        d.hint.as_deref(),
        Some("add --allow evil.example:443 to the shim command")
    );
    // A timeout is a 504 (HTTP) or REP 0x04 (SOCKS5), not the reason's default.
    let t = denial_of(&record(
        Protocol::Http,
        Reason::UpstreamFailure,
        Cause::ConnectTimeout,
    ));
    assert_eq!(t.unwrap().status, 504);
    let t = denial_of(&record(
        Protocol::Socks5,
        Reason::UpstreamFailure,
        Cause::ConnectRefused,
    ));
    assert_eq!(t.unwrap().status, 5);
    let mut allow = record(Protocol::Connect, Reason::Allowed, Cause::Policy);
    allow.decision = policy::Verdict::Allow;
    assert!(denial_of(&allow).is_none());
}

#[test]
fn the_embedded_grant_advises_shim_flags() {
    let c = config(&["origin.test:80".into()], &[], &[], &[], false)
        .unwrap()
        .0;
    let target = policy::parse_authority_form("api.example.com:443").unwrap();
    let d = c.authorities[0].grant.decide(&target);
    assert_eq!(
        d.hint,
        "add --allow api.example.com:443 to the shim command"
    );
}
