//! Grant immutability under reload (SIGHUP), the watchdog hook (narrows only), and
//! `mediator explain` agreeing with live traffic (design sections 1, 5, 11).

use e2e::case;
use e2e::harness::Case;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::{
    AGENT_A, AGENT_B, AuthoritySpec, Fixture, HttpConn, LOOPBACK, Mediator, MediatorBuilder,
    ORIGIN_HOST, TOKEN_A, Watchdog, WatchdogMode, agent_a_spec, check_deny,
};
use serde_json::Value;

use crate::support::mediator;

/// `(name, generation)` of each entry of a `GET /v1/authorities` listing.
fn generations(list: &Value) -> Result<Vec<(String, u64)>> {
    let entries = list["authorities"]
        .as_array()
        .with_context(|| format!("no authorities array: {list}"))?;
    entries
        .iter()
        .map(|a| match (a["name"].as_str(), a["generation"].as_u64()) {
            (Some(name), Some(generation)) => Ok((name.to_owned(), generation)),
            _ => anyhow::bail!("entry without name and generation: {a}"),
        })
        .collect()
}

/// The admin API on, and a revoke grace long enough that no test sees it end.
fn reloadable() -> MediatorBuilder {
    mediator().admin(true).timeout("revoke_grace", 60)
}

async fn reload_keeps_live_tunnels_on_their_grant_and_gives_new_connections_the_new_one()
-> Result<()> {
    let v1 = reloadable()
        .authority(agent_a_spec())
        .authority(AuthoritySpec::new(AGENT_B).allow(&["b.test"]))
        .authority(AuthoritySpec::new("agent-d").allow(&["d.test"]));
    let fx = Fixture::start(v1).await?;
    let m = &fx.mediator;
    let origin = fx.origin_target();
    let before = generations(&m.admin_get("/v1/authorities").await?)?;

    // A live tunnel under agent-a's first grant (origin.test allowed).
    let mut tunnel = fx.unix_conn(AGENT_A).await?;
    assert_eq!(tunnel.connect(&origin, None).await?.status, 200);
    assert_eq!(tunnel.get(ORIGIN_HOST, "/v1", false).await?.status, 200);

    // v2: agent-a no longer allows origin.test, only the loopback literal; agent-b
    // unchanged; agent-c new; agent-d gone.
    let v2 = reloadable()
        .nameserver(fx.dns.addr())
        .authority(
            AuthoritySpec::new(AGENT_A)
                .allow(&["127.0.0.1"])
                .allow_private(&["127.0.0.0/8"])
                .token(TOKEN_A),
        )
        .authority(AuthoritySpec::new(AGENT_B).allow(&["b.test"]))
        .authority(AuthoritySpec::new("agent-c").allow(&["c.test"]))
        .render(m.dir());
    let line = m.reload_with(&v2).await?;
    ensure!(line.starts_with("mediator: reload applied"), "{line}");
    let gen_a = before.iter().find(|(n, _)| n == AGENT_A).unwrap().1;
    ensure!(
        line.contains(&format!("changed={AGENT_A}@{gen_a}->")),
        "{line}"
    );
    ensure!(line.contains("unchanged=agent-b"), "{line}");
    ensure!(line.contains("added=agent-c@"), "{line}");
    ensure!(line.contains("removed=agent-d@"), "{line}");
    // The control log names the generations too.
    m.wait_for_stderr(
        |l| l.contains("authority \"agent-a\" added (generation"),
        Duration::from_secs(5),
    )
    .await?;

    let after = generations(&m.admin_get("/v1/authorities").await?)?;
    let names: Vec<&str> = after.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [AGENT_A, AGENT_B, "agent-c"]);
    let generation = |v: &[(String, u64)], n: &str| v.iter().find(|(x, _)| x == n).map(|(_, g)| *g);
    assert!(
        generation(&after, AGENT_A) > generation(&before, AGENT_A),
        "{before:?} -> {after:?}"
    );
    assert_eq!(generation(&after, AGENT_B), generation(&before, AGENT_B));
    assert!(!m.socket_path("agent-d").exists());
    assert!(m.socket_path("agent-c").exists());

    // The live tunnel is judged again under the new grant: no longer allowed, it is cut
    // when the (long) grace ends, and until then still relays to origin.test.
    let judged = m
        .wait_for_log(
            |l| {
                l["decision"] == "deny"
                    && l["detail"]
                        .as_str()
                        .is_some_and(|d| d.starts_with("judged again after a reload"))
            },
            Duration::from_secs(10),
        )
        .await?;
    ensure!(judged["reason"] == "not_in_allowlist", "{judged}");
    assert_eq!(
        tunnel.get(ORIGIN_HOST, "/still-v1", false).await?.status,
        200
    );
    // New connections get the new grant: origin.test denied, the literal allowed.
    let mut c = fx.unix_conn(AGENT_A).await?;
    check_deny(&c.connect(&origin, None).await?, 403, "not_in_allowlist")?;
    check_deny(&fx.connect_a(&origin).await?, 403, "not_in_allowlist")?;
    let mut c = fx.unix_conn(AGENT_A).await?;
    let literal = format!("127.0.0.1:{}", fx.origin.port());
    assert_eq!(c.connect(&literal, None).await?.status, 200);
    Ok(())
}

async fn a_bad_reload_leaves_the_running_set_untouched_and_says_why() -> Result<()> {
    let fx = Fixture::start(mediator().admin(true).authority(agent_a_spec())).await?;
    let m = &fx.mediator;
    let before = m.admin_get("/v1/authorities").await?;
    let bad = reloadable()
        .nameserver(fx.dns.addr())
        .authority(AuthoritySpec::new(AGENT_A).allow(&["*.com"]))
        .authority(AuthoritySpec::new("agent-new").allow(&["ok.test"]))
        .render(m.dir());
    let out = m.reload_with(&bad).await?;
    ensure!(
        out.contains("reload failed; the running authorities are unchanged"),
        "{out}"
    );
    ensure!(
        out.contains("*.com") && out.contains("mediator.toml:"),
        "{out}"
    );
    let after = m.admin_get("/v1/authorities").await?;
    assert_eq!(before, after);
    let digest = |v: &Value| v["authorities"][0]["grant_digest"].clone();
    assert!(!m.socket_path("agent-new").exists());
    // Traffic under the old grant goes on.
    let mut c = fx.unix_conn(AGENT_A).await?;
    assert_eq!(c.connect(&fx.origin_target(), None).await?.status, 200);
    // An unreadable file is a bad reload too.
    std::fs::write(m.config_path(), "[listen\n")?;
    let out = m.reload_with("[listen\n").await?;
    ensure!(out.contains("reload failed"), "{out}");
    let now = m.admin_get("/v1/authorities").await?;
    assert_eq!(generations(&now)?, generations(&before)?);
    assert_eq!(digest(&now), digest(&before));
    // Both are counted, and the last good reload is still the start.
    let metrics = m.metrics().await?;
    let reloads = |r: &str| metrics.get("mediator_reloads_total", &[("result", r)]);
    assert_eq!((reloads("failed"), reloads("ok")), (2.0, 0.0));
    let started = metrics.get("mediator_last_reload_success_timestamp_seconds", &[]);
    // A good one is counted and moves the time.
    let good = reloadable()
        .nameserver(fx.dns.addr())
        .authority(agent_a_spec())
        .render(m.dir());
    std::fs::write(m.config_path(), &good)?;
    let out = m.reload_with(&good).await?;
    ensure!(out.contains("reload applied"), "{out}");
    let metrics = m.metrics().await?;
    assert_eq!(
        metrics.get("mediator_reloads_total", &[("result", "ok")]),
        1.0
    );
    assert!(metrics.get("mediator_last_reload_success_timestamp_seconds", &[]) >= started);
    assert_eq!(
        metrics.get(
            "mediator_build_info",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("revision", mediator::version::GIT_REVISION)
            ]
        ),
        1.0
    );
    Ok(())
}

/// The "needs a restart" note compares the reloaded file with what runs: a change to
/// another section stays reported on every reload until a restart applies it, and is no
/// longer reported once undone.
async fn the_restart_note_compares_with_what_runs() -> Result<()> {
    let fx = Fixture::start(mediator().admin(true).authority(agent_a_spec())).await?;
    let m = &fx.mediator;
    let running = std::fs::read_to_string(m.config_path())?;
    let changed = running.replace("request_head = 10", "request_head = 11");
    ensure!(
        changed != running,
        "the fixture sets request_head = 10:\n{running}"
    );
    let note = "changes to [timeouts] need a restart";
    let line = m.reload_with(&changed).await?;
    ensure!(line.contains(note), "{line}");
    let line = m.reload_with(&changed).await?;
    ensure!(line.contains(note), "still not applied: {line}");
    let line = m.reload_with(&running).await?;
    ensure!(!line.contains("need a restart"), "undone: {line}");
    Ok(())
}

async fn a_tighter_global_deny_reaches_authorities_created_through_the_api() -> Result<()> {
    let fx = Fixture::start(mediator().admin(true).authority(agent_a_spec())).await?;
    let m = &fx.mediator;
    let body = r#"{"name":"api-x","allow":["origin.test"],"allow_private":["127.0.0.0/8"]}"#;
    let created = m.admin("POST", "/v1/authorities", Some(body), None).await?;
    assert_eq!(created.status, 201, "{}", created.text());
    let sock = m.socket_path("api-x");
    let mut c = HttpConn::unix(&sock).await?;
    assert_eq!(c.connect(&fx.origin_target(), None).await?.status, 200);
    drop(c);
    // The file now denies origin.test for everyone: the API-created grant must follow.
    let v2 = reloadable()
        .nameserver(fx.dns.addr())
        .authority(agent_a_spec())
        .global_deny(&["origin.test"])
        .render(m.dir());
    let line = m.reload_with(&v2).await?;
    ensure!(line.starts_with("mediator: reload applied"), "{line}");
    ensure!(line.contains("api-x@"), "api-x re-created: {line}");
    let mut c = HttpConn::unix(&sock).await?;
    check_deny(
        &c.connect(&fx.origin_target(), None).await?,
        403,
        "denied_by_rule",
    )?;
    Ok(())
}

async fn watchdog_narrows_only_and_silence_or_errors_deny() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let allow_all = Watchdog::start(dir.path(), "allow", WatchdogMode::AllowAll)?;
    let deny_all = Watchdog::start(
        dir.path(),
        "deny",
        WatchdogMode::DenyAll("no egress during the freeze".into()),
    )?;
    let slow = Watchdog::start(
        dir.path(),
        "slow",
        WatchdogMode::SlowAllow(Duration::from_secs(30)),
    )?;
    let gone = dir.path().join("nobody-listens.sock");
    let spec = |name: &str, watchdog: &str| {
        AuthoritySpec::new(name)
            .allow(&[ORIGIN_HOST])
            .deny(&["denied.test"])
            .allow_private(&["127.0.0.0/8"])
            .raw(&format!("watchdog = {:?}", watchdog))
    };
    let fx = Fixture::start(
        mediator()
            .timeout("watchdog", 1)
            .authority(spec("w-allow", &allow_all.endpoint()))
            .authority(spec("w-deny", &deny_all.endpoint()))
            .authority(spec("w-slow", &slow.endpoint()))
            .authority(spec("w-gone", &format!("unix:{}", gone.display()))),
    )
    .await?;
    let m = &fx.mediator;
    let origin = fx.origin_target();
    let connect = |name: &'static str, target: String| {
        let path = m.socket_path(name);
        async move {
            let mut c = HttpConn::unix(&path).await?;
            c.connect(&target, None).await
        }
    };

    // A watchdog that allows everything opens nothing the grant denies, and is not asked.
    for target in ["blocked.test:443", "denied.test:443"] {
        let resp = connect("w-allow", target.into()).await?;
        assert_eq!(resp.status, 403, "{target}");
    }
    assert!(
        allow_all.questions().is_empty(),
        "{:?}",
        allow_all.questions()
    );
    // It is asked about what the grant allows, with the contract's fields.
    assert_eq!(connect("w-allow", origin.clone()).await?.status, 200);
    let q = allow_all.questions();
    assert_eq!(q.len(), 1);
    assert_eq!(
        q[0],
        serde_json::json!({"authority": "w-allow", "host": ORIGIN_HOST, "port": fx.origin.port(), "protocol": "connect"})
    );

    // Deny: the grant's allow becomes watchdog_denied with the watchdog's reason.
    let body = check_deny(
        &connect("w-deny", origin.clone()).await?,
        403,
        "watchdog_denied",
    )?;
    assert!(
        body["detail"].as_str().unwrap().contains("freeze"),
        "{body}"
    );
    // Silence past timeouts.watchdog (1 s) denies, in bounded time.
    let started = Instant::now();
    check_deny(
        &connect("w-slow", origin.clone()).await?,
        403,
        "watchdog_denied",
    )?;
    assert!(started.elapsed() < Duration::from_secs(10));
    // No watchdog listening denies.
    check_deny(
        &connect("w-gone", origin.clone()).await?,
        403,
        "watchdog_denied",
    )?;
    let line = m
        .wait_for_decision("watchdog_denied", Some(ORIGIN_HOST))
        .await?;
    assert_eq!(line["rule"], ORIGIN_HOST);
    // The origin was reached only once (the allowed tunnel): denied ones never connect.
    Ok(())
}

/// Runs `mediator explain --config <m's config> --authority A TARGET --resolve --json`.
async fn explain(m: &Mediator, authority: &str, target: &str) -> Result<(i32, Value)> {
    let out = m
        .cli(
            "explain",
            &["--authority", authority, target, "--resolve", "--json"],
        )
        .await?;
    let v: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "explain {target}: not JSON: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok((out.status.code().unwrap_or(-1), v))
}

#[expect(
    clippy::too_many_lines,
    reason = "a table of conformance rows, each judged by explain and by live traffic"
)]
async fn explain_agrees_with_live_traffic_on_the_conformance_rows() -> Result<()> {
    let fx = Fixture::start(
        mediator().global_deny(&["*:25"]).authority(
            AuthoritySpec::new(AGENT_A)
                .allow(&[
                    ORIGIN_HOST,
                    "*.example.test",
                    "pinned.test:8443",
                    "127.0.0.1",
                    "private.test",
                    "special.test",
                    "nx.test",
                    "mixed.test",
                ])
                .deny(&["bad.example.test"])
                .allow_private(&["127.0.0.0/8"])
                .token(TOKEN_A),
        ),
    )
    .await?;
    fx.dns.set("a.example.test", [LOOPBACK]);
    fx.dns
        .set("private.test", [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))]);
    fx.dns
        .set("special.test", [IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))]);
    fx.dns.set(
        "mixed.test",
        [LOOPBACK, IpAddr::V4(Ipv4Addr::new(192, 168, 1, 1))],
    );
    let p = fx.origin.port();
    let rows: Vec<(String, &str)> = vec![
        (format!("{ORIGIN_HOST}:{p}"), "allowed"),
        (format!("ORIGIN.Test.:{p}"), "allowed"),
        (format!("a.example.test:{p}"), "allowed"),
        (format!("127.0.0.1:{p}"), "allowed"),
        ("example.test:443".into(), "not_in_allowlist"),
        ("bad.example.test:443".into(), "denied_by_rule"),
        ("pinned.test:80".into(), "port_not_allowed"),
        (format!("{ORIGIN_HOST}:25"), "denied_by_rule"),
        ("private.test:443".into(), "private_address"),
        ("special.test:443".into(), "special_address"),
        ("mixed.test:443".into(), "private_address"),
        ("nx.test:443".into(), "dns_failure"),
        ("10.0.0.1:443".into(), "not_in_allowlist"),
        ("[::1]:443".into(), "not_in_allowlist"),
        ("127.1:80".into(), "malformed_target"),
    ];
    for (target, want) in &rows {
        let (code, ex) = explain(&fx.mediator, AGENT_A, target).await?;
        let live = fx.connect_a(target).await?;
        let live_reason = if live.status == 200 {
            "allowed".to_owned()
        } else {
            live.json()?["reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(ex["reason"], *want, "explain {target}: {ex}");
        assert_eq!(
            live_reason,
            *want,
            "live {target}: {} {}",
            live.status,
            live.text()
        );
        assert_eq!(code, if *want == "allowed" { 0 } else { 1 }, "{target}");
        if *want == "allowed" {
            assert_eq!(ex["pin"], serde_json::json!(["127.0.0.1"]), "{ex}");
        }
        // The live decision names the rule explain named (an allow always has one).
        if *want == "allowed" || ex["rule"].is_string() {
            fx.mediator
                .expect_log(
                    |v| v["event"] == "decision" && v["reason"] == *want && v["rule"] == ex["rule"],
                    &[],
                )
                .await?;
        }
    }
    // The address classes explain shows.
    let (_, ex) = explain(&fx.mediator, AGENT_A, "mixed.test:443").await?;
    let classes: Vec<&str> = ex["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["class"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["private", "private"]);
    assert_eq!(ex["addresses"][0]["excepted"], true);
    assert_eq!(ex["addresses"][1]["excepted"], false);
    // Text output, and an unknown authority is an error (exit 2).
    let out = fx
        .mediator
        .cli("explain", &["--authority", AGENT_A, "example.test"])
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text.contains("decision:  deny")
            && text.contains("reason:    not_in_allowlist")
            && text.contains("port 443"),
        "{text}"
    );
    let out = fx
        .mediator
        .cli("explain", &["--authority", "nobody", "example.test"])
        .await?;
    assert_eq!(out.status.code(), Some(2));
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(reload_keeps_live_tunnels_on_their_grant_and_gives_new_connections_the_new_one),
        case!(a_bad_reload_leaves_the_running_set_untouched_and_says_why),
        case!(the_restart_note_compares_with_what_runs),
        case!(a_tighter_global_deny_reaches_authorities_created_through_the_api),
        case!(watchdog_narrows_only_and_silence_or_errors_deny),
        case!(explain_agrees_with_live_traffic_on_the_conformance_rows),
    ]
}
