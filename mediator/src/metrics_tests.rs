//! Unit tests of `metrics`.

use super::*;

#[test]
fn families_and_labels() {
    let m = Metrics::new().unwrap();
    m.prime("agent-a");
    m.decision(
        Some("agent-a"),
        Protocol::Connect,
        Verdict::Allow,
        Reason::Allowed,
    );
    m.decision(None, Protocol::Http, Verdict::Deny, Reason::BadCredential);
    m.opened("agent-a");
    m.closed("agent-a", 10, 20);
    m.observe_connect(Duration::from_millis(3));
    m.observe_dns(Duration::from_millis(1));
    m.upstream_error(UpstreamErrorKind::ConnectRefused);
    m.set_authorities(1);
    m.reused_upstream();
    m.set_idle_upstream(3);
    let text = m.render();
    for line in [
        "mediator_decisions_total{authority=\"agent-a\",decision=\"allow\",protocol=\"connect\",reason=\"allowed\"} 1",
        "mediator_decisions_total{authority=\"-\",decision=\"deny\",protocol=\"http\",reason=\"bad_credential\"} 1",
        "mediator_active_connections{authority=\"agent-a\"} 0",
        "mediator_bytes_total{authority=\"agent-a\",direction=\"up\"} 10",
        "mediator_bytes_total{authority=\"agent-a\",direction=\"down\"} 20",
        "mediator_connect_duration_seconds_count 1",
        "mediator_dns_duration_seconds_count 1",
        "mediator_upstream_errors_total{kind=\"connect_refused\"} 1",
        "mediator_upstream_errors_total{kind=\"dns_timeout\"} 0",
        "mediator_authorities 1",
        "mediator_upstream_reused_total 1",
        "mediator_upstream_idle_connections 3",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
    }
    assert!(text.contains("process_start_time_seconds"), "{text}");
}

#[test]
fn authorities_beyond_the_cap_share_one_label_until_a_place_frees() {
    let mut m = Metrics::new().unwrap();
    m.label_cap = 2;
    for a in ["a", "b", "c", "d"] {
        m.prime(a);
        m.decision(Some(a), Protocol::Connect, Verdict::Allow, Reason::Allowed);
    }
    m.opened("c");
    let get = |m: &Metrics, a: &str| {
        m.decisions
            .with_label_values(&[a, "connect", "allow", "allowed"])
            .get()
    };
    assert_eq!((get(&m, "a"), get(&m, "b"), get(&m, OVERFLOW)), (1, 1, 2));
    assert!(!m.render().contains("authority=\"c\""));
    assert_eq!(m.active_of("c"), 1, "counted under the overflow label");
    // "a" revoked and gone: its place is free for the next new authority.
    m.set_open([("b", 0), ("c", 0), ("d", 0)]);
    assert!(!m.render().contains("authority=\"a\""));
    m.prime("e");
    m.decision(
        Some("e"),
        Protocol::Connect,
        Verdict::Allow,
        Reason::Allowed,
    );
    assert_eq!(get(&m, "e"), 1);
}

/// A series looked up once counts where `decision` would, also after a name's series
/// were removed (its next decisions count under the overflow label, as any name's
/// without a place) or a place among the labelled names freed up (a name given it counts
/// under its own label from then on).
#[test]
fn a_decision_series_counts_where_decision_would() {
    let mut m = Metrics::new().unwrap();
    m.label_cap = 1;
    m.prime("a");
    let get = |m: &Metrics, a: &str| {
        m.decisions
            .with_label_values(&[a, "tls", "allow", "allowed"])
            .get()
    };
    let series = |a| m.decision_series(Some(a), Protocol::Tls, Verdict::Allow, Reason::Allowed);
    let (a, b) = (series("a"), series("b"));
    m.count(&a);
    m.count(&b);
    m.count(&b);
    assert_eq!((get(&m, "a"), get(&m, OVERFLOW)), (1, 2));
    // "a" gone: its series removed, and "b" takes its place.
    m.set_open([("b", 0)]);
    m.prime("b");
    m.count(&a);
    m.count(&b);
    assert!(!m.render().contains("authority=\"a\""));
    assert_eq!((get(&m, "b"), get(&m, OVERFLOW)), (1, 3));
}
