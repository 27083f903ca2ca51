//! Unit tests of `conn::tunnel_line`: a tunnel's allow lines, serialised from the
//! template, are byte for byte those of the full serialisation.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::*;
use crate::decision_log::{Asked, Peer};
use crate::labels::Labels;
use crate::testing;

const CONFIG: &str = r#"
[[authority]]
name = "agent-a"
allow = ["api.test"]
"#;

fn authority() -> Arc<policy::config::Authority> {
    let mut config = policy::config::parse(CONFIG, "m.toml").unwrap();
    Arc::new(config.authorities.remove(0))
}

fn ctx(shared: &Shared, peer: Peer, authority: Option<Arc<policy::config::Authority>>) -> Ctx {
    let admission = shared.limiter.admit(
        0,
        crate::limits::Door::Channel,
        &tokio_util::sync::CancellationToken::new(),
        || {},
    );
    Ctx::new(41, peer, authority, admission)
}

/// Every kind of tunnel context: each peer, captured or not, with labels (keys and values
/// that need escaping, a key named as a record field) and a held CONNECT's `asked`.
fn contexts(shared: &Shared) -> Vec<Ctx> {
    let peers = [
        Peer::Unix {
            pid: Some(42),
            uid: 1000,
            gid: 1000,
        },
        Peer::Unix {
            pid: None,
            uid: 0,
            gid: 0,
        },
        Peer::Tcp("127.0.0.1:4242".parse().unwrap()),
        Peer::Tcp("[::1]:4243".parse().unwrap()),
        Peer::Embedded,
    ];
    let labels = Arc::new(Labels {
        invocation: Some("inv \"1\"\n".into()),
        tags: BTreeMap::from([
            ("decision".to_owned(), "deny".to_owned()),
            ("tool".to_owned(), "é\\\u{1}".to_owned()),
        ]),
    });
    let asked = Arc::new(Asked {
        id: "9".into(),
        from: "agent-b".into(),
        ms: 120,
        outcome: crate::vocab::AskOutcome::AllowVia,
        by: Some("admin token 0123456789ab".into()),
    });
    let mut all = Vec::new();
    for peer in peers {
        all.push(ctx(shared, peer, None));
        let mut c = ctx(shared, peer, Some(authority()));
        all.push(c.clone());
        c.capture = true;
        all.push(c.clone());
        c.labels = Some(Arc::clone(&labels));
        all.push(c.clone());
        c.asked = Some(Arc::clone(&asked));
        all.push(c);
    }
    all
}

fn requests() -> Vec<(Option<&'static str>, RequestLine)> {
    let line = |method: &str, path: &str| RequestLine {
        method: method.to_owned(),
        path: path.to_owned(),
    };
    vec![
        (None, line("GET", "/small")),
        (Some("GET /v1/"), line("GET", "/v1/x?<redacted>")),
        (Some("a \"rule\"\\"), line("POST", "/\"quoted\"\\\u{7f}é")),
        (None, line("M", "P")),
        (Some(""), line("", "")),
        (None, line("OPTIONS", "*")),
    ]
}

/// The template's line of each request of each tunnel is the full record's
/// serialisation and stamp, byte for byte (the decision-log format is a contract).
#[test]
fn a_template_line_is_the_full_serialisation() {
    let shared = testing::shared(Arc::default());
    let labels = [
        TargetLabel {
            host: Some("api.test".into()),
            port: Some(443),
        },
        TargetLabel {
            host: Some("[2001:db8::1]".into()),
            port: Some(8443),
        },
    ];
    let pins: [SocketAddr; 2] = [
        "192.0.2.1:443".parse().unwrap(),
        "[2001:db8::1]:8443".parse().unwrap(),
    ];
    let start = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_630_400_123);
    let mut compared = 0;
    for ctx in contexts(&shared) {
        for (label, pin) in labels.iter().zip(pins) {
            let template = Template::of(&shared, &ctx, label, pin, "direct").expect("a template");
            for (n, (rule, request)) in requests().into_iter().enumerate() {
                let id = [0, 7, u64::MAX][n % 3];
                let ts = start + Duration::from_millis(n as u64 * 999);
                let allow = Allowed {
                    rule,
                    pin,
                    route: "direct",
                };
                assert!(template.fits(&ctx, label, allow));
                let mut fast = Vec::new();
                template.write(&mut fast, ts, id, rule, &request);
                let mut rec = record::tls_record(&ctx, id, label, &request, Ok(allow), Vec::new());
                rec.ts = humantime::format_rfc3339_millis(ts).to_string();
                let mut full = serde_json::to_vec(&rec).unwrap();
                shared.log.stamp(&mut full, &ctx.peer);
                assert_eq!(String::from_utf8(fast), String::from_utf8(full));
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 25 * 2 * 6);
}

/// A template is only for its own tunnel's context, pin and route: another grant (a
/// reload), a held request moved to another authority, another pin or route does not fit.
#[test]
fn a_template_fits_only_its_own_tunnel() {
    let shared = testing::shared(Arc::default());
    let ctx = ctx(&shared, Peer::Embedded, Some(authority()));
    let label = TargetLabel {
        host: Some("api.test".into()),
        port: Some(443),
    };
    let pin: SocketAddr = "192.0.2.1:443".parse().unwrap();
    let allow = Allowed {
        rule: None,
        pin,
        route: "direct",
    };
    let template = Template::of(&shared, &ctx, &label, pin, "direct").unwrap();
    assert!(template.fits(&ctx, &label, allow));
    let reloaded = ctx.attributed(&authority());
    assert!(!template.fits(&reloaded, &label, allow));
    let mut held = ctx.clone();
    held.asked = contexts(&shared).pop().unwrap().asked;
    assert!(!template.fits(&held, &label, allow));
    let other_pin = Allowed {
        pin: "192.0.2.2:443".parse().unwrap(),
        ..allow
    };
    assert!(!template.fits(&ctx, &label, other_pin));
    let other_route = Allowed {
        route: "parent",
        ..allow
    };
    assert!(!template.fits(&ctx, &label, other_route));
}

/// Through the decision log: a tunnel's requests logged by [`TunnelLines::allowed`] (the
/// template, and the full path for a request with credentials or after a reload) are the
/// lines [`record::tls_request`] writes, stamp included, but for `ts` and `id`.
#[test]
fn logged_lines_match_the_full_path() {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let shared = testing::shared(Arc::clone(&lines));
    let tunnel = TunnelLines::default();
    let label = TargetLabel {
        host: Some("api.test".into()),
        port: Some(443),
    };
    let pin: SocketAddr = "192.0.2.1:443".parse().unwrap();
    let tcp = ctx(
        &shared,
        Peer::Tcp("127.0.0.1:4242".parse().unwrap()),
        Some(authority()),
    );
    let reloaded = tcp.attributed(&authority());
    let credential = || {
        vec![CredentialUse {
            header: "authorization".into(),
            host: "api.test".into(),
        }]
    };
    let mut ids = Vec::new();
    for (ctx, credential) in [
        (&tcp, Vec::new()),
        (&tcp, credential()),
        (&reloaded, Vec::new()),
        (&tcp, Vec::new()),
    ] {
        for (rule, request) in requests() {
            let allow = Allowed {
                rule,
                pin,
                route: "direct",
            };
            let fast = tunnel.allowed(&shared, ctx, &label, &request, allow, credential.clone());
            let full = record::tls_request(
                &shared,
                ctx,
                &label,
                &request,
                Ok(allow),
                credential.clone(),
            );
            ids.push((fast, full));
        }
    }
    shared.log.flush();
    let lines = lines.lock().unwrap();
    assert_eq!(lines.len(), ids.len() * 2);
    for (pair, (fast_id, full_id)) in lines.chunks(2).zip(ids) {
        let (fast, full) = (&pair[0], &pair[1]);
        // `ts` and `id` come first; everything after them must be the same bytes.
        let (fast_head, fast_rest) = fast.split_once(",\"conn\":").unwrap();
        let (full_head, full_rest) = full.split_once(",\"conn\":").unwrap();
        assert_eq!(fast_rest, full_rest);
        assert!(
            fast_rest.contains(",\"peer_ip\":\"127.0.0.1\",\"peer_port\":4242}"),
            "{fast}"
        );
        for (head, id) in [(fast_head, fast_id), (full_head, full_id)] {
            let ts = head
                .strip_prefix("{\"event\":\"decision\",\"ts\":\"")
                .and_then(|h| h.strip_suffix(&format!("\",\"id\":{id}")))
                .unwrap_or_else(|| panic!("{head}"));
            humantime::parse_rfc3339(ts).unwrap();
        }
    }
}
