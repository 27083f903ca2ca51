//! The etcd registry (design section 17, cargo feature `etcd`) against a real
//! three-member etcd cluster on loopback with two mediator replicas: an authority created
//! on one is used on the other, revoked on the other and refused on the first; `ttl_s` is
//! honoured by both; with two members stopped both fail closed (`registry_unavailable`,
//! 503 for writes and `/readyz`) while config authorities and live tunnels carry on, and
//! they resume by themselves; a record changed in place by another writer replaces the
//! authority; a restarted replica loads the registry again; a change made on one replica
//! is audited there as the admin's and on the other as the registry's.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::etcd::EtcdCluster;
use e2e::harness::Case;
use e2e::socks::{REP_GENERAL_FAILURE, REP_SUCCEEDED};
use e2e::wait::retry_for;
use e2e::{
    AGENT_A, Fixture, HttpConn, Mediator, ORIGIN_HOST, SocksTarget, Tool, agent_a_spec, case,
    check_deny,
};
use mediator::audit::{Action, Actor, ChangeKind};
use policy::review::RiskClass;
use serde_json::{Value, json};

use crate::support::{audits, mediator};

/// How long a change may take to reach the other replica in a test (the contract is 1 s
/// on loopback; the benchmark measures it, this only bounds the wait).
const PROPAGATION: Duration = Duration::from_secs(5);

/// A bounded wait for staleness and recovery (max_staleness_s = 2 plus elections).
const SETTLE: Duration = Duration::from_secs(30);

/// Waits until `GET /v1/authorities/<name>` on `m` answers `status`; returns the body.
async fn wait_status(m: &Mediator, name: &str, status: u16, within: Duration) -> Result<Value> {
    retry_for(
        within,
        async || {
            let r = m
                .admin("GET", &format!("/v1/authorities/{name}"), None, None)
                .await?;
            Ok((r.status == status).then(|| r.json().unwrap_or(Value::Null)))
        },
        || format!("GET /v1/authorities/{name} never answered {status}"),
    )
    .await
}

/// Waits until `/readyz` on `m` answers `status`; returns its text.
async fn wait_ready(m: &Mediator, status: u16) -> Result<String> {
    retry_for(
        SETTLE,
        async || {
            let r = m.admin("GET", "/readyz", None, None).await?;
            Ok((r.status == status).then(|| r.text()))
        },
        || format!("/readyz never answered {status}"),
    )
    .await
}

#[expect(
    clippy::too_many_lines,
    reason = "one story across two replicas and a cluster that loses and regains quorum"
)]
async fn two_replicas_share_one_etcd_cluster_and_fail_closed_without_quorum() -> Result<()> {
    let mut cluster = EtcdCluster::start(3).await?;
    let registry = cluster.registry_toml(2);
    let fx = Fixture::start(
        mediator()
            .authority(agent_a_spec())
            .admin(true)
            .extra_toml(&registry),
    )
    .await?;
    let b = mediator()
        .authority(agent_a_spec())
        .admin(true)
        .extra_toml(&registry)
        .nameserver(fx.dns.addr())
        .start()
        .await?;
    let a = &fx.mediator;
    let target = fx.origin_target();
    let body = json!({
        "name": "task-1",
        "allow": [ORIGIN_HOST],
        "allow_private": ["127.0.0.0/8"],
        "generate_token": true,
    });
    let resp = a
        .admin("POST", "/v1/authorities", Some(&body.to_string()), None)
        .await?;
    ensure!(resp.status == 201, "{} {}", resp.status, resp.text());
    let created = resp.json()?;
    assert_eq!(created["persisted"], true);
    assert_eq!(created["backend"], "etcd");
    let token = created["token"].as_str().context("no token")?.to_owned();
    // Created on one, usable on the other: same generation (the key's revision).
    let on_b = wait_status(&b, "task-1", 200, PROPAGATION).await?;
    assert_eq!(on_b["generation"], created["generation"], "{on_b}");
    let mut c = HttpConn::tcp(b.tcp_addr()).await?;
    assert_eq!(
        c.connect(&target, Some(("task-1", &token))).await?.status,
        200
    );
    let mut u = HttpConn::unix(&b.socket_path("task-1")).await?;
    assert_eq!(u.connect(&target, None).await?.status, 200);
    // A create of the same name on the other replica is a conflict.
    let resp = b
        .admin("POST", "/v1/authorities", Some(&body.to_string()), None)
        .await?;
    assert_eq!(resp.status, 409, "{}", resp.text());

    // Revoked on the other, refused on the first.
    let resp = b.revoke("task-1").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    wait_status(a, "task-1", 404, PROPAGATION).await?;
    let mut c = HttpConn::tcp(a.tcp_addr()).await?;
    check_deny(
        &c.connect(&target, Some(("task-1", &token))).await?,
        407,
        "bad_credential",
    )?;

    // A task-scoped authority is revoked on every replica at its expiry.
    let resp = a
        .admin(
            "POST",
            "/v1/authorities",
            Some(&json!({ "name": "short", "allow": ["x.test"], "ttl_s": 2 }).to_string()),
            None,
        )
        .await?;
    ensure!(resp.status == 201, "{}", resp.text());
    let short = wait_status(&b, "short", 200, PROPAGATION).await?;
    assert_eq!(short["expires_at"], resp.json()?["expires_at"]);
    wait_status(&b, "short", 404, SETTLE).await?;
    wait_status(a, "short", 404, SETTLE).await?;

    // Quorum lost: two of three members stopped.
    let created = a
        .admin("POST", "/v1/authorities", Some(&body.to_string()), None)
        .await?;
    ensure!(created.status == 201, "{}", created.text());
    let token = created.json()?["token"]
        .as_str()
        .context("no token")?
        .to_owned();
    wait_status(&b, "task-1", 200, PROPAGATION).await?;
    // A tunnel opened before: not cut for staleness alone.
    let mut live = HttpConn::unix(&a.socket_path("task-1")).await?;
    assert_eq!(live.connect(&target, None).await?.status, 200);
    cluster.stop(1).await?;
    cluster.stop(2).await?;
    for m in [a, &b] {
        let text = wait_ready(m, 503).await?;
        assert!(text.contains("registry"), "{text}");
        let metrics = m.metrics().await?;
        assert_eq!(metrics.get("mediator_registry_stale", &[]), 1.0);
        // New decisions under registry authorities are refused, plainly.
        let mut c = HttpConn::tcp(m.tcp_addr()).await?;
        let body = check_deny(
            &c.connect(&target, Some(("task-1", &token))).await?,
            503,
            "registry_unavailable",
        )?;
        assert_eq!(body["authority"], "task-1", "{body}");
        let mut s = e2e::Socks5::new(tokio::net::TcpStream::connect(m.tcp_addr()).await?);
        let reply = s
            .connect_with_auth(
                "task-1",
                &token,
                &SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port()),
            )
            .await?;
        assert_eq!(reply.rep, REP_GENERAL_FAILURE);
        // Writes get 503; the config's authority is unaffected.
        let resp = m
            .admin(
                "POST",
                "/v1/authorities",
                Some(&json!({ "name": "nope", "allow": ["x.test"] }).to_string()),
                None,
            )
            .await?;
        assert_eq!(resp.status, 503, "{}", resp.text());
        assert_eq!(resp.json()?["error"], "registry_unavailable");
        assert_eq!(m.revoke("task-1").await?.status, 503);
        let mut c = HttpConn::tcp(m.tcp_addr()).await?;
        assert_eq!(
            c.connect(&target, Some((AGENT_A, e2e::TOKEN_A)))
                .await?
                .status,
            200
        );
    }
    assert_eq!(live.get(ORIGIN_HOST, "/still", false).await?.status, 200);

    // Quorum back: both resume by themselves.
    cluster.restart(1).await?;
    cluster.restart(2).await?;
    for m in [a, &b] {
        wait_ready(m, 200).await?;
        let mut c = HttpConn::tcp(m.tcp_addr()).await?;
        assert_eq!(
            c.connect(&target, Some(("task-1", &token))).await?.status,
            200
        );
        assert_eq!(m.metrics().await?.get("mediator_registry_stale", &[]), 0.0);
    }
    let mut s = e2e::Socks5::new(tokio::net::TcpStream::connect(b.tcp_addr()).await?);
    let reply = s
        .connect_with_auth(
            "task-1",
            &token,
            &SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port()),
        )
        .await?;
    assert_eq!(reply.rep, REP_SUCCEEDED);

    // A replica restarted (killed) loads the registry again before it is ready.
    let generation = a.admin_get("/v1/authorities/task-1").await?["generation"].clone();
    let b = b.crash_restart().await?;
    let again = b.admin_get("/v1/authorities/task-1").await?;
    assert_eq!(again["generation"], generation);
    let mut c = HttpConn::tcp(b.tcp_addr()).await?;
    assert_eq!(
        c.connect(&target, Some(("task-1", &token))).await?.status,
        200
    );
    Ok(())
}

/// A record changed in place by another writer (`etcdctl put` over the key) replaces
/// the authority on every replica, as a changed `[[authority]]` on reload does.
async fn a_record_changed_in_place_replaces_the_authority() -> Result<()> {
    let cluster = EtcdCluster::start(3).await?;
    let registry = cluster.registry_toml(2);
    let a = mediator().admin(true).extra_toml(&registry).start().await?;
    // The other writer's record: the same name made under another prefix, so that it is
    // sealed as the mediator seals records.
    let other = mediator()
        .admin(true)
        .extra_toml(&registry.replace("\"/e2e/\"", "\"/other/\""))
        .start()
        .await?;
    for (m, allow) in [(&a, "first.test"), (&other, "second.test")] {
        let resp = m
            .admin(
                "POST",
                "/v1/authorities",
                Some(&json!({ "name": "shared", "allow": [allow] }).to_string()),
                None,
            )
            .await?;
        ensure!(resp.status == 201, "{}", resp.text());
    }
    let before = a.admin_get("/v1/authorities/shared").await?;
    let endpoints = cluster.endpoints().join(",");
    let got = Tool::Etcd
        .command("etcdctl")?
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &endpoints,
            "get",
            "--print-value-only",
            "/other/fleet/shared",
        ])
        .output()
        .await?;
    ensure!(got.status.success(), "{got:?}");
    let value = String::from_utf8(got.stdout)?;
    let put = Tool::Etcd
        .command("etcdctl")?
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &endpoints,
            "put",
            "/e2e/fleet/shared",
            value.trim_end(),
        ])
        .output()
        .await?;
    ensure!(put.status.success(), "{put:?}");
    let started = Instant::now();
    let after = retry_for(
        PROPAGATION,
        async || {
            let v = a.admin_get("/v1/authorities/shared").await?;
            Ok((v["grant"]["allow"] == json!(["second.test"])).then_some(v))
        },
        || "the changed record was not applied".to_owned(),
    )
    .await?;
    ensure!(
        after["generation"].as_u64() > before["generation"].as_u64(),
        "{before} then {after} after {:?}",
        started.elapsed()
    );
    // Audited as the registry's change (design 21): replaced, its host moved. The log's
    // writer thread writes the line after the watch applied the record: wait for it.
    let put = retry_for(
        PROPAGATION,
        async || {
            Ok(audits(&a)?
                .into_iter()
                .find(|r| r.action == Action::RegistryPut))
        },
        || {
            format!(
                "no registry_put record: {:#?}",
                audits(&a).unwrap_or_default()
            )
        },
    )
    .await?;
    let change = put.changes.first().context("no change")?;
    ensure!(
        put.actor
            == Actor::Registry {
                backend: "etcd".into()
            }
            && change.change == ChangeKind::Replaced
            && json!(change.generation) == after["generation"]
            && change.widened == [RiskClass::Host]
            && change.narrowed == [RiskClass::Host],
        "{put:#?}"
    );
    drop(other);
    Ok(())
}

/// Audit records (design 21) across replicas: a create and a delete on one replica are
/// that replica's admin records, once each, and the other's `registry_put` and
/// `registry_delete`, whose actor is the registry.
async fn another_replicas_changes_are_audited_as_the_registrys() -> Result<()> {
    let cluster = EtcdCluster::start(3).await?;
    let registry = cluster.registry_toml(2);
    let a = mediator().admin(true).extra_toml(&registry).start().await?;
    let b = mediator().admin(true).extra_toml(&registry).start().await?;
    let body = json!({ "name": "task-1", "allow": ["x.test:443"] }).to_string();
    let resp = a
        .admin("POST", "/v1/authorities", Some(&body), None)
        .await?;
    ensure!(resp.status == 201, "{}", resp.text());
    let created = resp.json()?;
    wait_status(&b, "task-1", 200, PROPAGATION).await?;
    let seen = |m: &Mediator, action: Action| {
        let records = audits(m)?;
        Ok::<_, anyhow::Error>(records.into_iter().find(|r| r.action == action))
    };
    let put = retry_for(
        PROPAGATION,
        async || seen(&b, Action::RegistryPut),
        || "no registry_put record on the other replica".to_owned(),
    )
    .await?;
    ensure!(
        put.actor
            == Actor::Registry {
                backend: "etcd".into()
            }
            && put.authority.as_deref() == Some("task-1")
            && put.changes.len() == 1
            && put.changes[0].change == ChangeKind::Added
            && json!(put.changes[0].generation) == created["generation"],
        "{put:#?}"
    );
    ensure!(a.revoke("task-1").await?.status == 200);
    wait_status(&b, "task-1", 404, PROPAGATION).await?;
    let delete = retry_for(
        PROPAGATION,
        async || seen(&b, Action::RegistryDelete),
        || "no registry_delete record on the other replica".to_owned(),
    )
    .await?;
    ensure!(
        delete.changes.len() == 1 && delete.changes[0].change == ChangeKind::Removed,
        "{delete:#?}"
    );
    // Each replica wrote each record once; the writer's own watch wrote none.
    let actions =
        |m: &Mediator| -> Result<Vec<Action>> { Ok(audits(m)?.iter().map(|r| r.action).collect()) };
    ensure!(
        actions(&a)? == [Action::Create, Action::Delete],
        "{:#?}",
        audits(&a)?
    );
    ensure!(
        actions(&b)? == [Action::RegistryPut, Action::RegistryDelete],
        "{:#?}",
        audits(&b)?
    );
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(two_replicas_share_one_etcd_cluster_and_fail_closed_without_quorum)
            .needs(&[Tool::Etcd]),
        case!(a_record_changed_in_place_replaces_the_authority).needs(&[Tool::Etcd]),
        case!(another_replicas_changes_are_audited_as_the_registrys).needs(&[Tool::Etcd]),
    ]
}
