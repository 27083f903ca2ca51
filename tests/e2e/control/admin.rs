//! Observability and the admin API (design sections 5, 10): every metric family after a
//! scripted mix of allowed and denied requests over CONNECT, HTTP forwarding and SOCKS5
//! (exact values), a bounded series count under a flood of distinct hosts, creating and
//! revoking authorities through the API while traffic flows, the per-authority denial
//! ring, revocation closing the listener at once and live tunnels after the grace, and
//! the admin bearer token.

use crate::support::is;
use e2e::case;
use e2e::harness::Case;
use mediator::vocab::Event;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::socks::REP_SUCCEEDED;
use e2e::{
    AGENT_A, Fixture, HttpConn, ORIGIN_HOST, PromText, SocksTarget, TOKEN_A, agent_a_allowing,
    agent_a_spec, check_deny, closed_loopback_port, expect_http_200, get_through,
    proxy_authorization, sha256_hex,
};
use serde_json::{Value, json};

use crate::support::mediator;

/// A bounded wait for a close that must come.
const CLOSE_DEADLINE: Duration = Duration::from_secs(10);

/// One keep-alive request through a tunnel to the origin; returns the status.
async fn get_keepalive(conn: &mut HttpConn, path: &str) -> Result<u16> {
    Ok(conn.get(ORIGIN_HOST, path, false).await?.status)
}

/// A day-long tunnel is on the dashboard while it lasts (design 19): its bytes reach
/// `mediator_bytes_total` while it is open, and its close adds only the rest, so the total
/// equals the close line's counts.
async fn an_open_tunnels_bytes_are_counted_before_it_closes() -> Result<()> {
    let fx = Fixture::start(mediator().admin(true).authority(agent_a_spec())).await?;
    let m = &fx.mediator;
    let mut tunnel = HttpConn::unix(&m.socket_path(AGENT_A)).await?;
    assert_eq!(tunnel.connect(&fx.origin_target(), None).await?.status, 200);
    assert_eq!(get_keepalive(&mut tunnel, "/first").await?, 200);
    let decision = m.wait_for_decision("allowed", Some(ORIGIN_HOST)).await?;
    let bytes = |p: &PromText, d: &str| {
        p.get(
            "mediator_bytes_total",
            &[("authority", AGENT_A), ("direction", d)],
        )
    };
    // The relay reports every 5 s: within a few periods, with the tunnel still open.
    m.bytes_counted_while_open(AGENT_A).await?;
    assert_eq!(get_keepalive(&mut tunnel, "/second").await?, 200);
    drop(tunnel);
    let close = m.wait_for_close(&decision["id"]).await?;
    let p = m.metrics().await?;
    assert_eq!(bytes(&p, "up"), close["bytes_up"].as_f64().unwrap_or(-1.0));
    assert_eq!(
        bytes(&p, "down"),
        close["bytes_down"].as_f64().unwrap_or(-1.0)
    );
    Ok(())
}

/// The same for a kept-alive plain `http://` forwarding connection: its upstream
/// connection's bytes are reported while it is open.
async fn an_open_forwarding_connections_bytes_are_counted_before_it_closes() -> Result<()> {
    let fx = Fixture::start(mediator().admin(true).authority(agent_a_spec())).await?;
    let m = &fx.mediator;
    let mut conn = HttpConn::unix(&m.socket_path(AGENT_A)).await?;
    let url = format!("http://{}/kept", fx.origin_target());
    let req = format!("GET {url} HTTP/1.1\r\nHost: {ORIGIN_HOST}\r\n\r\n");
    assert_eq!(conn.request(req.as_bytes()).await?.status, 200);
    let decision = m.wait_for_decision("allowed", Some(ORIGIN_HOST)).await?;
    m.bytes_counted_while_open(AGENT_A).await?;
    drop(conn);
    let close = m.wait_for_close(&decision["id"]).await?;
    let p = m.metrics().await?;
    for (direction, field) in [("up", "bytes_up"), ("down", "bytes_down")] {
        assert_eq!(
            p.get(
                "mediator_bytes_total",
                &[("authority", AGENT_A), ("direction", direction)]
            ),
            close[field].as_f64().unwrap_or(-1.0),
            "{direction}"
        );
    }
    Ok(())
}

/// An absolute-form `GET url` with `Connection: close`, as `auth` when given.
fn forward_req(url: &str, auth: Option<(&str, &str)>) -> String {
    let host = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let mut r = format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    if let Some((u, t)) = auth {
        r.push_str(&proxy_authorization(u, t));
    }
    r.push_str("\r\n");
    r
}

#[expect(
    clippy::too_many_lines,
    reason = "one scripted mix over every protocol, then every metric family checked exactly"
)]
async fn every_metric_family_is_exact_after_a_scripted_mix_over_all_protocols() -> Result<()> {
    let fx = Fixture::start(mediator().admin(true).authority(agent_a_allowing(&[
        ORIGIN_HOST,
        "private.test",
        "nx.test",
        "127.0.0.1",
    ])))
    .await?;
    fx.dns
        .set("private.test", [IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))]);
    let m = &fx.mediator;
    let auth = Some((AGENT_A, TOKEN_A));
    let origin = fx.origin_target();

    // Before any traffic: the per-authority series exist with zeros.
    let before = m.metrics().await?;
    assert_eq!(before.get("mediator_authorities", &[]), 1.0);
    assert_eq!(
        before.get("mediator_active_connections", &[("authority", AGENT_A)]),
        0.0
    );

    // 1. CONNECT allowed, 2. CONNECT not in the allow list.
    let mut c = fx.tunnel_a().await?;
    expect_http_200(&get_through(c.stream(), ORIGIN_HOST, "/tunnel").await?)?;
    check_deny(
        &fx.connect_a("blocked.test:443").await?,
        403,
        "not_in_allowlist",
    )?;
    // 3. HTTP forward allowed, 4. denied.
    let resp = fx
        .request(&forward_req(&format!("http://{origin}/fwd"), auth))
        .await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let resp = fx.request(&forward_req("http://other.test/", auth)).await?;
    check_deny(&resp, 403, "not_in_allowlist")?;
    // 5. SOCKS5 allowed, 6. denied.
    let (mut s, reply) = fx
        .socks_connect_a(&SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port()))
        .await?;
    assert_eq!(reply.rep, REP_SUCCEEDED);
    expect_http_200(&get_through(s.stream(), ORIGIN_HOST, "/socks").await?)?;
    let (_s, reply) = fx
        .socks_connect_a(&SocksTarget::Domain("blocked.test".into(), 443))
        .await?;
    assert_ne!(reply.rep, REP_SUCCEEDED);
    // 7. A wrong token: no authority established.
    check_deny(
        &fx.connect(&origin, Some((AGENT_A, "wrong"))).await?,
        407,
        "bad_credential",
    )?;
    // 8. Private address, 9. DNS failure, 10. upstream refused.
    check_deny(
        &fx.connect_a("private.test:443").await?,
        403,
        "private_address",
    )?;
    check_deny(&fx.connect_a("nx.test:443").await?, 502, "dns_failure")?;
    let closed_port = closed_loopback_port()?;
    check_deny(
        &fx.connect_a(&format!("127.0.0.1:{closed_port}")).await?,
        502,
        "upstream_failure",
    )?;

    // Every allowed connection closed: wait for their three close lines.
    let closes = m
        .wait_for_count(is(|r| r.event == Event::Close), 3, CLOSE_DEADLINE)
        .await?;
    let up: u64 = closes.iter().map(|c| c["bytes_up"].as_u64().unwrap()).sum();
    let down: u64 = closes
        .iter()
        .map(|c| c["bytes_down"].as_u64().unwrap())
        .sum();

    let p = m.metrics().await?;
    let d = |authority: &str, protocol: &str, decision: &str, reason: &str| {
        p.get(
            "mediator_decisions_total",
            &[
                ("authority", authority),
                ("protocol", protocol),
                ("decision", decision),
                ("reason", reason),
            ],
        )
    };
    let expected = [
        (AGENT_A, "connect", "allow", "allowed"),
        (AGENT_A, "connect", "deny", "not_in_allowlist"),
        (AGENT_A, "http", "allow", "allowed"),
        (AGENT_A, "http", "deny", "not_in_allowlist"),
        (AGENT_A, "socks5", "allow", "allowed"),
        (AGENT_A, "socks5", "deny", "not_in_allowlist"),
        // A wrong token for a real authority is attributed to it (who was impersonated).
        (AGENT_A, "connect", "deny", "bad_credential"),
        (AGENT_A, "connect", "deny", "private_address"),
        (AGENT_A, "connect", "deny", "dns_failure"),
        (AGENT_A, "connect", "deny", "upstream_failure"),
    ];
    for (a, proto, dec, reason) in expected {
        assert_eq!(
            d(a, proto, dec, reason),
            1.0,
            "{a} {proto} {dec} {reason}: {:#?}",
            p.family("mediator_decisions_total")
        );
    }
    let total: f64 = p
        .family("mediator_decisions_total")
        .iter()
        .map(|(_, v)| v)
        .sum();
    assert_eq!(total, 10.0, "{:#?}", p.family("mediator_decisions_total"));
    // The decision log agrees (its writer may still hold the last line for a moment:
    // the counters move when the decision is taken, the file a little later).
    let lines = m
        .wait_for_count(|v| v["event"] == "decision", 10, CLOSE_DEADLINE)
        .await?;
    assert_eq!(lines.len(), 10);

    assert_eq!(
        p.get("mediator_active_connections", &[("authority", AGENT_A)]),
        0.0
    );
    assert_eq!(
        p.get(
            "mediator_bytes_total",
            &[("authority", AGENT_A), ("direction", "up")]
        ),
        up as f64
    );
    assert_eq!(
        p.get(
            "mediator_bytes_total",
            &[("authority", AGENT_A), ("direction", "down")]
        ),
        down as f64
    );
    assert!(up > 0 && down > 0, "up {up} down {down}");
    // Three successful connects and one refused.
    assert_eq!(p.get("mediator_connect_duration_seconds_count", &[]), 4.0);
    // Names resolved: origin.test (3 times), private.test, nx.test; the IP literal is not.
    assert_eq!(p.get("mediator_dns_duration_seconds_count", &[]), 5.0);
    assert_eq!(
        p.get(
            "mediator_upstream_errors_total",
            &[("kind", "dns_no_records")]
        ),
        1.0
    );
    assert_eq!(
        p.get(
            "mediator_upstream_errors_total",
            &[("kind", "connect_refused")]
        ),
        1.0
    );
    assert_eq!(
        p.get(
            "mediator_upstream_errors_total",
            &[("kind", "connect_timeout")]
        ),
        0.0
    );
    assert_eq!(p.get("mediator_authorities", &[]), 1.0);
    for (family, ty) in [
        ("mediator_decisions_total", "counter"),
        ("mediator_active_connections", "gauge"),
        ("mediator_bytes_total", "counter"),
        ("mediator_connect_duration_seconds", "histogram"),
        ("mediator_dns_duration_seconds", "histogram"),
        ("mediator_upstream_errors_total", "counter"),
        ("mediator_authorities", "gauge"),
        ("process_start_time_seconds", "gauge"),
    ] {
        assert_eq!(
            p.types.get(family).map(String::as_str),
            Some(ty),
            "{family}"
        );
    }
    // No label value is a host.
    for series in p.series.keys() {
        for host in [
            "origin.test",
            "blocked.test",
            "private.test",
            "nx.test",
            "127.0.0.1",
            "other.test",
        ] {
            assert!(!series.contains(host), "series {series} names a host");
        }
    }
    Ok(())
}

async fn a_flood_of_distinct_hosts_does_not_grow_the_series_count() -> Result<()> {
    let fx = Fixture::start(mediator().admin(true).authority(agent_a_spec())).await?;
    let auth = Some((AGENT_A, TOKEN_A));
    // Warm up: one denial creates its series.
    check_deny(
        &fx.connect_a("warmup.test:443").await?,
        403,
        "not_in_allowlist",
    )?;
    let before = fx.mediator.metrics().await?;
    // 300 distinct hosts on one keep-alive connection.
    let mut c = fx.tcp_conn().await?;
    for i in 0..300 {
        let resp = c.connect(&format!("flood-{i}.test:443"), auth).await?;
        assert_eq!(resp.status, 403);
    }
    let after = fx.mediator.metrics().await?;
    let metric_series = |p: &PromText| p.count("mediator_");
    assert_eq!(
        metric_series(&after),
        metric_series(&before),
        "series grew:\nbefore {:#?}\nafter {:#?}",
        before.series.keys().collect::<Vec<_>>(),
        after.series.keys().collect::<Vec<_>>()
    );
    assert_eq!(
        after.get(
            "mediator_decisions_total",
            &[
                ("authority", AGENT_A),
                ("protocol", "connect"),
                ("decision", "deny"),
                ("reason", "not_in_allowlist")
            ]
        ),
        301.0
    );
    assert!(after.series.keys().all(|k| !k.contains("flood")));
    Ok(())
}

#[expect(
    clippy::too_many_lines,
    reason = "one scenario: create, list and revoke while traffic flows, each step asserting on the last"
)]
async fn admin_api_creates_lists_and_revokes_authorities_while_traffic_flows() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .timeout("revoke_grace", 30)
            .authority(agent_a_spec()),
    )
    .await?;
    let m = &fx.mediator;
    let origin = fx.origin_target();

    assert_eq!(m.admin("GET", "/healthz", None, None).await?.status, 200);
    assert_eq!(m.admin("GET", "/readyz", None, None).await?.status, 200);
    let list = m.admin_get("/v1/authorities").await?;
    let a = &list["authorities"][0];
    assert_eq!(a["name"], AGENT_A);
    assert_eq!(a["origin"], "config");
    assert_eq!(a["generation"], 1);
    assert_eq!(a["grant_digest"].as_str().unwrap().len(), 64);
    assert_eq!(a["channel"]["socket"], json!(m.socket_path(AGENT_A)));

    // Traffic flows: a live tunnel of agent-a over its Unix socket.
    let mut live = fx.unix_conn(AGENT_A).await?;
    assert_eq!(live.connect(&origin, None).await?.status, 200);
    assert_eq!(get_keepalive(&mut live, "/before").await?, 200);
    let list = m.admin_get("/v1/authorities").await?;
    assert_eq!(list["authorities"][0]["live_connections"], 1);

    // Create agent-c with a generated token.
    let body = json!({
        "name": "agent-c",
        "allow": [ORIGIN_HOST],
        "allow_private": ["127.0.0.0/8"],
        "generate_token": true,
    })
    .to_string();
    let resp = m
        .admin("POST", "/v1/authorities", Some(&body), None)
        .await?;
    assert_eq!(resp.status, 201, "{}", resp.text());
    let created = resp.json()?;
    let token = created["token"].as_str().unwrap().to_owned();
    assert_eq!(created["origin"], "api");
    assert_eq!(created["generation"], 2);
    let sock = m.socket_path("agent-c");
    assert_eq!(created["channel"]["socket"], json!(sock));
    assert!(sock.exists());
    // The token is shown once: the listing never carries it.
    let list = m.admin("GET", "/v1/authorities", None, None).await?.text();
    assert!(!list.contains(&token));
    // It works on both channels, and the live tunnel of agent-a is untouched.
    assert_eq!(
        fx.connect(&origin, Some(("agent-c", &token))).await?.status,
        200
    );
    let mut u = HttpConn::unix(&sock).await?;
    assert_eq!(u.connect(&origin, None).await?.status, 200);
    assert_eq!(get_keepalive(&mut live, "/during").await?, 200);

    // 409 for a duplicate, 400 naming the field.
    let resp = m
        .admin("POST", "/v1/authorities", Some(&body), None)
        .await?;
    assert_eq!(resp.status, 409, "{}", resp.text());
    assert_eq!(resp.json()?["field"], "name");
    for (bad, field) in [
        (json!({"name": "x", "allow": ["ok.test", "*.com"]}), "allow"),
        (json!({"name": "x", "bogus": 1}), "bogus"),
        (json!({"name": "x", "token_sha256": "abc"}), "token_sha256"),
        (json!({"name": "bad name"}), "name"),
        (json!({"name": "x", "sni_check": "yes"}), "sni_check"),
        (json!({"name": "x", "allow": null}), "allow"),
        (
            json!({"name": "x", "generate_token": true, "token_sha256": sha256_hex("t")}),
            "generate_token",
        ),
        (json!({"allow": ["ok.test"]}), ""),
    ] {
        let resp = m
            .admin("POST", "/v1/authorities", Some(&bad.to_string()), None)
            .await?;
        assert_eq!(resp.status, 400, "{bad}: {}", resp.text());
        let v = resp.json()?;
        assert_eq!(v["field"], field, "{bad}: {v}");
        assert!(v["message"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    }
    let resp = m
        .admin("POST", "/v1/authorities", Some("not json"), None)
        .await?;
    assert_eq!(resp.status, 400);
    // A key given twice is refused naming it (at any depth), and nothing is created:
    // the body a reviewer reads is the grant that would apply.
    for (raw, field, key) in [
        (
            r#"{"name":"dup-a","allow":["origin.test"],"allow":["*.example.org"]}"#,
            "allow",
            "allow",
        ),
        (
            r#"{"name":"dup-b","deny":[{"host":"a.test","host":"b.test"}]}"#,
            "deny",
            "host",
        ),
        (r#"{"name":"dup-c","name":"dup-d"}"#, "name", "name"),
    ] {
        let resp = m.admin("POST", "/v1/authorities", Some(raw), None).await?;
        assert_eq!(resp.status, 400, "{raw}: {}", resp.text());
        let v = resp.json()?;
        assert_eq!(v["field"], field, "{raw}: {v}");
        assert!(
            v["message"]
                .as_str()
                .is_some_and(|s| s.contains(&format!("{key:?}"))),
            "{raw}: {v}"
        );
    }
    let list = m.admin_get("/v1/authorities").await?.to_string();
    assert!(!list.contains("dup-"), "{list}");

    // Denials of agent-c land in its ring.
    check_deny(
        &fx.connect("blocked.test:443", Some(("agent-c", &token)))
            .await?,
        403,
        "not_in_allowlist",
    )?;
    let denials = m.admin_get("/v1/authorities/agent-c/denials").await?;
    let list = denials["denials"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{denials}");
    assert_eq!(list[0]["host"], "blocked.test");
    assert_eq!(list[0]["reason"], "not_in_allowlist");
    let id = list[0]["id"].as_u64().unwrap();
    let later = m
        .admin_get(&format!("/v1/authorities/agent-c/denials?since={id}"))
        .await?;
    assert_eq!(later["denials"], json!([]));
    let earlier = m
        .admin_get("/v1/authorities/agent-c/denials?since=2000-01-01T00:00:00Z")
        .await?;
    assert_eq!(earlier["denials"].as_array().unwrap().len(), 1);

    // Revoke agent-c: socket gone at once, token refused, ring gone, 404 the second time.
    let resp = m.revoke("agent-c").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(!sock.exists(), "socket of a revoked authority still there");
    assert!(HttpConn::unix(&sock).await.is_err());
    // The client sees the uniform credential refusal; the log says the name is gone.
    check_deny(
        &fx.connect(&origin, Some(("agent-c", &token))).await?,
        407,
        "bad_credential",
    )?;
    m.wait_for_decision("unknown_authority", Some(ORIGIN_HOST))
        .await?;
    assert_eq!(
        m.admin("GET", "/v1/authorities/agent-c/denials", None, None)
            .await?
            .status,
        404
    );
    assert_eq!(m.revoke("agent-c").await?.status, 404);
    // A new request on a connection opened before the revocation gets no decision under
    // the revoked grant.
    // (u is a live tunnel: the request goes to the origin through it, within the grace.)
    assert_eq!(get_keepalive(&mut u, "/").await?, 200);
    // The agent-a tunnel kept working throughout; the authority count is back to 1.
    assert_eq!(get_keepalive(&mut live, "/after").await?, 200);
    assert_eq!(m.metrics().await?.get("mediator_authorities", &[]), 1.0);
    Ok(())
}

async fn revoked_authority_socket_is_gone_and_live_tunnels_close_after_the_grace() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .timeout("revoke_grace", 1)
            .authority(agent_a_spec()),
    )
    .await?;
    let m = &fx.mediator;
    let sock = m.socket_path(AGENT_A);
    let mut tunnel = HttpConn::unix(&sock).await?;
    assert_eq!(tunnel.connect(&fx.origin_target(), None).await?.status, 200);
    assert_eq!(get_keepalive(&mut tunnel, "/x").await?, 200);
    let decision = m.wait_for_decision("allowed", Some(ORIGIN_HOST)).await?;

    let resp = m.revoke(AGENT_A).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    // Its series stay while its tunnel is open...
    let mine = format!("authority=\"{AGENT_A}\"");
    let p = m.metrics().await?;
    assert_eq!(
        p.get("mediator_active_connections", &[("authority", AGENT_A)]),
        1.0
    );
    assert!(p.count("mediator_decisions_total{") > 0);
    assert!(!sock.exists(), "socket file still there after revocation");
    assert!(
        HttpConn::unix(&sock).await.is_err(),
        "the revoked listener still accepts"
    );
    // The live tunnel is closed by the mediator once the 1 s grace is over.
    ensure!(
        tunnel.closes_within(CLOSE_DEADLINE).await,
        "tunnel still open after the grace"
    );
    let close = m.wait_for_close(&decision["id"]).await?;
    // A cut by revocation says so, distinct from a shutdown's.
    assert_eq!(close["close_reason"], "revoked");
    let list = m.admin_get("/v1/authorities").await?;
    assert_eq!(list["authorities"], json!([]));
    let p = m.metrics().await?;
    assert_eq!(p.get("mediator_authorities", &[]), 0.0);
    assert_eq!(
        p.get("mediator_active_connections", &[("authority", AGENT_A)]),
        0.0
    );
    // ...and leave every family once its last connection is gone (design 19): the
    // connection's task lets go of the authority just after its close line.
    let deadline = std::time::Instant::now() + CLOSE_DEADLINE;
    loop {
        let text = m.metrics().await?.raw_series();
        if !text.iter().any(|k| k.contains(&mine)) {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "series of the revoked authority remain: {:?}",
            text.iter()
                .filter(|k| k.contains(&mine))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A revoked authority with no connection left leaves `/metrics` at once, not after the
/// revoke grace (30 s here): nothing holds it for the grace.
async fn a_revoked_authority_without_connections_leaves_metrics_at_once() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .timeout("revoke_grace", 30)
            .authority(agent_a_spec()),
    )
    .await?;
    let m = &fx.mediator;
    let resp = fx
        .request(&forward_req(
            &format!("http://{}/once", fx.origin_target()),
            Some((AGENT_A, TOKEN_A)),
        ))
        .await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let decision = m.wait_for_decision("allowed", Some(ORIGIN_HOST)).await?;
    m.wait_for_close(&decision["id"]).await?;
    assert_eq!(m.revoke(AGENT_A).await?.status, 200);
    let mine = format!("authority=\"{AGENT_A}\"");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let series = m.metrics().await?.raw_series();
        if !series.iter().any(|k| k.contains(&mine)) {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "series of the revoked authority remain 5 s later: {:?}",
            series
                .iter()
                .filter(|k| k.contains(&mine))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn admin_token_guards_everything_but_health() -> Result<()> {
    let token = "admin-secret-7d1";
    let dir = tempfile::tempdir()?;
    let admin_sock = dir.path().join("admin.sock");
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .listen_line(&format!("admin_token_sha256 = \"{}\"", sha256_hex(token)))
            .listen_line(&format!(
                "admin_socket = {:?}",
                admin_sock.to_string_lossy()
            ))
            .authority(agent_a_spec()),
    )
    .await?;
    let m = &fx.mediator;
    // Health, readiness and metrics stay open; everything else needs the token.
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            m.admin("GET", path, None, None).await?.status,
            200,
            "{path}"
        );
    }
    for (method, path) in [
        ("GET", "/v1/authorities"),
        ("POST", "/v1/authorities"),
        ("DELETE", "/v1/authorities/agent-a"),
    ] {
        let resp = m.admin(method, path, None, None).await?;
        assert_eq!(resp.status, 401, "{method} {path}");
        assert!(resp.header("www-authenticate").is_some());
        assert_eq!(
            m.admin(method, path, None, Some("wrong")).await?.status,
            401
        );
    }
    assert_eq!(
        m.admin("GET", "/metrics", None, Some(token)).await?.status,
        200
    );
    assert_eq!(
        m.admin("GET", "/v1/authorities", None, Some(token))
            .await?
            .status,
        200
    );
    // The admin API on its own Unix socket (mode 0600), not in the channel directory.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&admin_sock)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let mut c = HttpConn::unix(&admin_sock).await?;
    let resp = c
        .request(format!("GET /v1/authorities HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()?["authorities"][0]["name"], AGENT_A);
    // The channel socket of agent-a does not serve the admin API (it is a proxy).
    let mut c = fx.unix_conn(AGENT_A).await?;
    let resp = c.get("x", "/v1/authorities", true).await?;
    check_deny(&resp, 400, "malformed_target")?;
    let _: Value = resp.json()?;
    Ok(())
}

/// By default (no admin token, no opt-out) any local process can reach the TCP admin
/// listener, so it may read but not create or revoke authorities; the admin Unix socket
/// (mode 0600) may.
async fn admin_writes_on_tcp_need_a_token_by_default() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let admin_sock = dir.path().join("admin.sock");
    let fx = Fixture::start(
        mediator()
            .admin_secure()
            .listen_line(&format!(
                "admin_socket = {:?}",
                admin_sock.to_string_lossy()
            ))
            .authority(agent_a_spec()),
    )
    .await?;
    let m = &fx.mediator;
    let body = json!({"name": "agent-z", "allow": [ORIGIN_HOST]}).to_string();
    let created = m
        .admin("POST", "/v1/authorities", Some(&body), None)
        .await?;
    ensure!(created.status == 403, "{created:?} {}", created.text());
    ensure!(
        created.text().contains("admin_token_sha256"),
        "the refusal says what to configure: {}",
        created.text()
    );
    let revoked = m.revoke(AGENT_A).await?;
    ensure!(revoked.status == 403, "{revoked:?}");
    // Nothing changed; reads stay open.
    let list = m.admin_get("/v1/authorities").await?;
    ensure!(
        list["authorities"].as_array().map(Vec::len) == Some(1),
        "{list}"
    );
    ensure!(
        !m.stderr_text()
            .contains("admin_allow_anonymous_writes = true"),
        "no warning without the opt-out"
    );
    // The admin Unix socket is its owner's: it may write.
    let mut c = HttpConn::unix(&admin_sock).await?;
    let resp = c
        .request(
            format!(
                "POST /v1/authorities HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await?;
    ensure!(resp.status == 201, "{resp:?} {}", resp.text());
    Ok(())
}

/// Opting out of the default is loud.
async fn anonymous_admin_writes_are_warned_at_start() -> Result<()> {
    let fx = Fixture::start(mediator().admin(true).authority(agent_a_spec())).await?;
    ensure!(
        fx.mediator
            .stderr_text()
            .contains("WARNING: admin_allow_anonymous_writes = true"),
        "{}",
        fx.mediator.stderr_text()
    );
    Ok(())
}

async fn an_authority_whose_socket_cannot_be_made_is_refused_with_the_cause() -> Result<()> {
    let fx = Fixture::start(mediator().admin(true).authority(agent_a_spec())).await?;
    let m = &fx.mediator;
    // A directory where the new authority's socket file would go.
    std::fs::create_dir(m.socket_path("agent-z"))?;
    let body = json!({ "name": "agent-z", "allow": [ORIGIN_HOST] }).to_string();
    let resp = m
        .admin("POST", "/v1/authorities", Some(&body), None)
        .await?;
    assert_eq!(resp.status, 500, "{}", resp.text());
    let message = resp.json()?["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // The cause, not only "cannot listen on ...".
    assert!(
        message.contains("agent-z.sock") && message.contains("is in the way"),
        "{message}"
    );
    // Nothing half-made: the name is not live.
    let list = m.admin_get("/v1/authorities").await?;
    let names: Vec<&str> = list["authorities"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, [AGENT_A]);
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(every_metric_family_is_exact_after_a_scripted_mix_over_all_protocols),
        case!(a_flood_of_distinct_hosts_does_not_grow_the_series_count),
        case!(admin_api_creates_lists_and_revokes_authorities_while_traffic_flows),
        case!(revoked_authority_socket_is_gone_and_live_tunnels_close_after_the_grace),
        case!(an_open_tunnels_bytes_are_counted_before_it_closes),
        case!(an_open_forwarding_connections_bytes_are_counted_before_it_closes),
        case!(a_revoked_authority_without_connections_leaves_metrics_at_once),
        case!(admin_token_guards_everything_but_health),
        case!(admin_writes_on_tcp_need_a_token_by_default),
        case!(anonymous_admin_writes_are_warned_at_start),
        case!(an_authority_whose_socket_cannot_be_made_is_refused_with_the_cause),
    ]
}
