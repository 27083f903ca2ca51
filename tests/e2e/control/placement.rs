//! Placement by node (design section 17, cargo feature `etcd`) against a real
//! three-member etcd cluster on loopback, with replicas of different nodes: an authority
//! placed on one node, created through another node's replica, has its socket and its
//! credential on its node only (its token elsewhere is an unknown credential, 407); names
//! are unique across nodes; a replica reads no record of another node's; records of the
//! layout before placement are moved once, by replicas starting together, and keep
//! everything; `ttl_s` ends a placed record and its name index key together; and
//! staleness fails closed per replica.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::etcd::EtcdCluster;
use e2e::harness::Case;
use e2e::wait::retry_for;
use e2e::{AuthoritySpec, Fixture, HttpConn, Mediator, ORIGIN_HOST, Tool, case, check_deny};
use mediator::audit::{Action, ChangeKind};
use serde_json::{Value, json};

use crate::support::{audits, mediator};

/// How long a change may take to reach another replica in a test (the benchmark measures
/// it; this only bounds the wait).
const PROPAGATION: Duration = Duration::from_secs(5);

/// A bounded wait for staleness and recovery (max_staleness_s = 2 plus elections).
const SETTLE: Duration = Duration::from_secs(30);

/// `POST /v1/authorities` with `body` on `m`; the status and the answer.
async fn post(m: &Mediator, body: &Value) -> Result<(u16, Value)> {
    let resp = m
        .admin("POST", "/v1/authorities", Some(&body.to_string()), None)
        .await?;
    Ok((resp.status, resp.json().unwrap_or(Value::Null)))
}

/// Waits until `GET /v1/authorities/<name>` on `m` answers `status`.
async fn wait_status(m: &Mediator, name: &str, status: u16) -> Result<()> {
    retry_for(
        PROPAGATION,
        async || {
            let r = m
                .admin("GET", &format!("/v1/authorities/{name}"), None, None)
                .await?;
            Ok((r.status == status).then_some(()))
        },
        || format!("GET /v1/authorities/{name} never answered {status}"),
    )
    .await
}

/// A value of `m`'s `/metrics`.
async fn metric(m: &Mediator, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
    Ok(m.metrics().await?.get(name, labels))
}

/// `mediator_registry_keys_read_total` of `m`: its node's range and the fleet's.
async fn keys_read(m: &Mediator) -> Result<(f64, f64)> {
    let name = "mediator_registry_keys_read_total";
    Ok((
        metric(m, name, &[("range", "node")]).await?,
        metric(m, name, &[("range", "fleet")]).await?,
    ))
}

/// A body for an authority of the fixture's origin, placed on `node`, with a token.
fn task(name: &str, node: &str) -> Value {
    json!({
        "name": name,
        "node": node,
        "allow": [ORIGIN_HOST],
        "allow_private": ["127.0.0.0/8"],
        "generate_token": true,
    })
}

#[expect(
    clippy::too_many_lines,
    reason = "one story across two nodes: placement, credentials, names, the file's authorities"
)]
async fn an_authority_is_served_on_its_node_only_wherever_it_was_created() -> Result<()> {
    let cluster = EtcdCluster::start(3).await?;
    let of_the_file = AuthoritySpec::new("cfg-b")
        .allow(&[ORIGIN_HOST])
        .allow_private(&["127.0.0.0/8"])
        .raw("node = \"node-b\"");
    let fx = Fixture::start(
        mediator()
            .authority(of_the_file.clone())
            .admin(true)
            .extra_toml(&cluster.registry_toml_on("node-a", &[0, 1, 2], 2)),
    )
    .await?;
    let b = mediator()
        .authority(of_the_file)
        .admin(true)
        .extra_toml(&cluster.registry_toml_on("node-b", &[0, 1, 2], 2))
        .nameserver(fx.dns.addr())
        .start()
        .await?;
    let a = &fx.mediator;
    let target = fx.origin_target();

    // The file's authority placed on node-b: served by b, not by a, and not creatable.
    assert!(b.socket_path("cfg-b").exists());
    assert!(!a.socket_path("cfg-b").exists());
    wait_status(a, "cfg-b", 404).await?;
    let (status, body) = post(a, &task("cfg-b", "*")).await?;
    assert_eq!(status, 409, "{body}");

    // Created through a, placed on b: live on b only.
    let (status, created) = post(a, &task("task-b", "node-b")).await?;
    ensure!(status == 201, "{status} {created}");
    assert_eq!(created["node"], "node-b", "{created}");
    assert_eq!(created["served_here"], false, "{created}");
    assert_eq!(created["persisted"], true, "{created}");
    let token = created["token"].as_str().context("no token")?.to_owned();
    wait_status(&b, "task-b", 200).await?;
    let on_b = b.admin_get("/v1/authorities/task-b").await?;
    assert_eq!(on_b["generation"], created["generation"], "{on_b}");
    assert_eq!(on_b["node"], "node-b", "{on_b}");
    // Audited where it was asked (the change as its node holds it, though not live
    // there) and on its node (a change another replica made).
    let asked = audits(a)?;
    let r = asked
        .iter()
        .rev()
        .find(|r| r.action == Action::Create)
        .context("no create on a's record")?;
    let change = r.changes.first().context("no change")?;
    ensure!(
        (
            change.change,
            json!(change.generation),
            json!(change.grant_digest)
        ) == (
            ChangeKind::Added,
            created["generation"].clone(),
            on_b["grant_digest"].clone()
        ),
        "{r:#?}\n{on_b}"
    );
    let seen = audits(&b)?;
    ensure!(
        seen.iter().any(|r| r.action == Action::RegistryPut
            && r.changes
                .iter()
                .any(|c| c.authority == "task-b" && c.grant_digest == change.grant_digest)),
        "{seen:#?}"
    );
    let mut u = HttpConn::unix(&b.socket_path("task-b")).await?;
    assert_eq!(u.connect(&target, None).await?.status, 200);
    let mut c = HttpConn::tcp(b.tcp_addr()).await?;
    assert_eq!(
        c.connect(&target, Some(("task-b", &token))).await?.status,
        200
    );
    // On a: no socket, unknown, and its token is refused like any unknown credential.
    assert!(!a.socket_path("task-b").exists());
    wait_status(a, "task-b", 404).await?;
    let mut c = HttpConn::tcp(a.tcp_addr()).await?;
    check_deny(
        &c.connect(&target, Some(("task-b", &token))).await?,
        407,
        "bad_credential",
    )?;
    assert!(!a.socket_path("task-b").exists(), "never made on a");

    // A fleet-wide one (no node) created through b is live on both.
    let (status, fleet) = post(&b, &task("task-all", "*")).await?;
    ensure!(status == 201, "{status} {fleet}");
    assert_eq!(fleet["served_here"], true, "{fleet}");
    wait_status(a, "task-all", 200).await?;
    assert!(a.socket_path("task-all").exists() && b.socket_path("task-all").exists());

    // Names are unique across nodes, whichever replica and placement is asked.
    for (m, node) in [(a, "node-a"), (a, "*"), (&b, "node-b"), (&b, "node-c")] {
        let (status, body) = post(m, &task("task-b", node)).await?;
        assert_eq!(status, 409, "{node}: {body}");
    }

    // Deleted through a: revoked on b.
    let resp = a.revoke("task-b").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    wait_status(&b, "task-b", 404).await?;
    retry_for(
        PROPAGATION,
        async || Ok((!b.socket_path("task-b").exists()).then_some(())),
        || "task-b's socket is still on b".to_owned(),
    )
    .await?;
    // The name is free again, on any node.
    let (status, body) = post(&b, &task("task-b", "node-a")).await?;
    ensure!(status == 201, "{status} {body}");
    wait_status(a, "task-b", 200).await?;

    // A replica reads its node's records and the fleet's only. Its watch: twenty creates
    // on node-b, then one on node-a; once a serves that one, its watchers have carried
    // every earlier event of their ranges, and none of node-b's was among them (a's
    // count: task-b on node-a and the sentinel; task-all on the fleet's).
    for i in 0..20 {
        let (status, body) = post(&b, &task(&format!("many-{i}"), "node-b")).await?;
        ensure!(status == 201, "{status} {body}");
    }
    let (status, body) = post(&b, &task("sentinel", "node-a")).await?;
    ensure!(status == 201, "{status} {body}");
    wait_status(a, "sentinel", 200).await?;
    assert_eq!(
        keys_read(a).await?,
        (2.0, 1.0),
        "watched: node-a's and the fleet's only"
    );
    // Its list at a start: its two records of node-a and the fleet's one.
    let a = fx.mediator.crash_restart().await?;
    assert_eq!(
        keys_read(&a).await?,
        (2.0, 1.0),
        "listed: node-a's and the fleet's only"
    );
    let listed = a.admin_get("/v1/authorities").await?;
    let names: Vec<&str> = listed["authorities"]
        .as_array()
        .context("no list")?
        .iter()
        .filter_map(|x| x["name"].as_str())
        .collect();
    assert_eq!(names, ["sentinel", "task-all", "task-b"], "{listed}");
    let stored = cluster
        .etcdctl(&["get", "--prefix", "--keys-only", "/e2e/nodes/node-b/"])
        .await?;
    assert_eq!(stored.lines().filter(|l| !l.is_empty()).count(), 20);
    Ok(())
}

/// `ttl_s` holds a placed authority's record and its name index key on one lease: at the
/// end both are gone, whether the owning replica revoked it or no replica serves its
/// node, and the name is free again on every node.
async fn a_placed_authority_s_ttl_ends_its_record_and_its_name() -> Result<()> {
    let cluster = EtcdCluster::start(3).await?;
    let on = |node: &str| {
        mediator()
            .admin(true)
            .extra_toml(&cluster.registry_toml_on(node, &[0, 1, 2], 2))
    };
    let a = on("node-a").start().await?;
    let b = on("node-b").start().await?;
    let keys = |name: &str| {
        let cluster = &cluster;
        let name = name.to_owned();
        async move {
            let mut found = Vec::new();
            for range in ["names/", "fleet/", "nodes/"] {
                let out = cluster
                    .etcdctl(&["get", "--prefix", "--keys-only", &format!("/e2e/{range}")])
                    .await?;
                found.extend(
                    out.split_whitespace()
                        .filter(|k| k.ends_with(&format!("/{name}")))
                        .map(str::to_owned),
                );
            }
            anyhow::Ok(found)
        }
    };
    // One on node-b (served there), one on a node no replica runs as: both sent to a.
    for (name, node) in [("brief-b", "node-b"), ("brief-z", "node-z")] {
        let mut body = task(name, node);
        body["ttl_s"] = json!(2);
        let (status, created) = post(&a, &body).await?;
        ensure!(status == 201, "{status} {created}");
        assert_eq!(
            keys(name).await?,
            [
                format!("/e2e/names/{name}"),
                format!("/e2e/nodes/{node}/{name}")
            ]
        );
    }
    wait_status(&b, "brief-b", 200).await?;
    for name in ["brief-b", "brief-z"] {
        retry_for(
            SETTLE,
            async || Ok(keys(name).await?.is_empty().then_some(())),
            || format!("{name}'s keys outlived its ttl_s"),
        )
        .await?;
        wait_status(&b, name, 404).await?;
        // The name is free again, on any node, through any replica.
        let (status, body) = post(&b, &task(name, "node-a")).await?;
        ensure!(status == 201, "{name}: {status} {body}");
    }
    assert!(!b.socket_path("brief-b").exists(), "revoked at its end");
    wait_status(&a, "brief-z", 200).await?;
    Ok(())
}

/// Twelve records of the layout before placement under `/e2e/authorities/` (the first with
/// a lease), sealed as a mediator seals them (made under `/old/` and copied), and one,
/// `clash`, whose name the current layout holds too; the tokens of the twelve and the
/// lease id (hex).
async fn old_layout(cluster: &EtcdCluster) -> Result<(Vec<String>, String)> {
    // Records sealed as a mediator seals them, made under another prefix, then copied
    // into the old layout of /e2e/.
    let maker = mediator()
        .admin(true)
        .extra_toml(
            &cluster
                .registry_toml_on("maker", &[0, 1, 2], 2)
                .replace("\"/e2e/\"", "\"/old/\""),
        )
        .start()
        .await?;
    let mut tokens = Vec::new();
    for i in 0..12 {
        // As a mediator before placement wrote them: no node in the table.
        let mut table = task(&format!("old-{i}"), "*");
        table.as_object_mut().context("a table")?.remove("node");
        let (status, body) = post(&maker, &table).await?;
        ensure!(status == 201, "{status} {body}");
        tokens.push(body["token"].as_str().context("no token")?.to_owned());
    }
    let lease = cluster.etcdctl(&["lease", "grant", "3600"]).await?;
    let lease = lease
        .split_whitespace()
        .nth(1)
        .context("no lease id")?
        .to_owned();
    for i in 0..12 {
        let value = cluster
            .etcdctl(&["get", "--print-value-only", &format!("/old/fleet/old-{i}")])
            .await?;
        let key = format!("/e2e/authorities/old-{i}");
        let mut args = vec!["put", key.as_str(), value.trim_end()];
        let with_lease = format!("--lease={lease}");
        if i == 0 {
            args.push(&with_lease);
        }
        cluster.etcdctl(&args).await?;
    }
    // A name the current layout already holds: its old record stays where it is.
    let (status, body) = post(&maker, &task("clash", "*")).await?;
    ensure!(status == 201, "{status} {body}");
    let clash = cluster
        .etcdctl(&["get", "--print-value-only", "/old/fleet/clash"])
        .await?;
    for (key, value) in [
        ("/e2e/authorities/clash", clash.trim_end()),
        ("/e2e/fleet/clash", clash.trim_end()),
        ("/e2e/names/clash", "*"),
    ] {
        cluster.etcdctl(&["put", key, value]).await?;
    }
    drop(maker);
    Ok((tokens, lease))
}

/// Records of the layout before placement (`<prefix>authorities/<name>`) are moved into the
/// fleet-wide range by two replicas starting at once, each record once, with its table,
/// token hash, `created_at` and lease; one whose name the current layout holds is left in
/// place and named.
async fn records_of_the_layout_before_placement_are_moved_once_keeping_everything() -> Result<()> {
    let cluster = EtcdCluster::start(3).await?;
    let (tokens, lease) = old_layout(&cluster).await?;
    // Two replicas starting at once both find the old records.
    let on = |node: &str| {
        mediator()
            .admin(true)
            .extra_toml(&cluster.registry_toml_on(node, &[0, 1, 2], 2))
    };
    let (a, b) = (on("node-a"), on("node-b"));
    let (a, b) = tokio::join!(a.start(), b.start());
    let (a, b) = (a?, b?);
    for i in 0..tokens.len() {
        let name = format!("old-{i}");
        wait_status(&a, &name, 200).await?;
        wait_status(&b, &name, 200).await?;
        // Moved byte for byte: table, token hash, created_at, the seal.
        let was = cluster
            .etcdctl(&["get", "--print-value-only", &format!("/old/fleet/{name}")])
            .await?;
        let is = cluster
            .etcdctl(&["get", "--print-value-only", &format!("/e2e/fleet/{name}")])
            .await?;
        assert_eq!(was.trim_end(), is.trim_end(), "{name}");
    }
    let left = cluster
        .etcdctl(&["get", "--prefix", "--keys-only", "/e2e/authorities/"])
        .await?;
    assert_eq!(
        left.split_whitespace().collect::<Vec<_>>(),
        ["/e2e/authorities/clash"],
        "only the record whose name is taken stays"
    );
    let fleet = cluster
        .etcdctl(&["get", "--prefix", "--keys-only", "/e2e/fleet/"])
        .await?;
    assert_eq!(
        fleet.split_whitespace().count(),
        13,
        "12 moved and clash: {fleet}"
    );
    let names = cluster.etcdctl(&["get", "--prefix", "/e2e/names/"]).await?;
    assert_eq!(names.lines().filter(|l| *l == "*").count(), 13, "{names}");
    // The lease moved with its record.
    let moved = cluster
        .etcdctl(&["get", "-w", "json", "/e2e/fleet/old-0"])
        .await?;
    let lease_id = i64::from_str_radix(&lease, 16)?;
    ensure!(moved.contains(&format!("\"lease\":{lease_id}")), "{moved}");
    let stderr = format!("{}{}", a.stderr_text(), b.stderr_text());
    ensure!(
        stderr.contains("authorities/clash") && stderr.contains("taken"),
        "the record left in place is named: {stderr}"
    );
    // Their tokens work on a replica that starts afterwards.
    let fx = Fixture::start(on("node-c")).await?;
    let target = fx.origin_target();
    for (i, token) in tokens.iter().enumerate() {
        let name = format!("old-{i}");
        let mut c = HttpConn::tcp(fx.mediator.tcp_addr()).await?;
        assert_eq!(
            c.connect(&target, Some((&name, token))).await?.status,
            200,
            "{name}"
        );
    }
    Ok(())
}

/// Staleness is per replica: a replica that can reach only a stopped member fails closed
/// (`registry_unavailable`, `/readyz` 503) while another that reaches a quorum serves on.
async fn staleness_fails_closed_per_replica() -> Result<()> {
    let mut cluster = EtcdCluster::start(3).await?;
    let fx = Fixture::start(mediator().admin(true).extra_toml(&cluster.registry_toml_on(
        "node-a",
        &[0, 1],
        2,
    )))
    .await?;
    let b = mediator()
        .admin(true)
        .extra_toml(&cluster.registry_toml_on("node-b", &[2], 2))
        .nameserver(fx.dns.addr())
        .start()
        .await?;
    let a = &fx.mediator;
    let target = fx.origin_target();
    let mut tokens = Vec::new();
    for (m, node) in [(a, "node-a"), (&b, "node-b")] {
        let (status, body) = post(m, &task(&format!("on-{node}"), node)).await?;
        ensure!(status == 201, "{status} {body}");
        tokens.push(body["token"].as_str().context("no token")?.to_owned());
    }
    cluster.stop(2).await?;
    let stale = retry_for(
        SETTLE,
        async || {
            let r = b.admin("GET", "/readyz", None, None).await?;
            Ok((r.status == 503).then(|| r.text()))
        },
        || "b never reported itself stale".to_owned(),
    )
    .await?;
    assert!(stale.contains("registry"), "{stale}");
    assert_eq!(metric(&b, "mediator_registry_stale", &[]).await?, 1.0);
    let mut c = HttpConn::tcp(b.tcp_addr()).await?;
    check_deny(
        &c.connect(&target, Some(("on-node-b", &tokens[1]))).await?,
        503,
        "registry_unavailable",
    )?;
    // a, with a quorum, is current and serves.
    assert_eq!(a.admin("GET", "/readyz", None, None).await?.status, 200);
    assert_eq!(metric(a, "mediator_registry_stale", &[]).await?, 0.0);
    let mut c = HttpConn::tcp(a.tcp_addr()).await?;
    assert_eq!(
        c.connect(&target, Some(("on-node-a", &tokens[0])))
            .await?
            .status,
        200
    );
    // b resumes by itself when its member is back.
    cluster.restart(2).await?;
    retry_for(
        SETTLE,
        async || Ok((b.admin("GET", "/readyz", None, None).await?.status == 200).then_some(())),
        || "b never resumed".to_owned(),
    )
    .await?;
    let mut c = HttpConn::tcp(b.tcp_addr()).await?;
    assert_eq!(
        c.connect(&target, Some(("on-node-b", &tokens[1])))
            .await?
            .status,
        200
    );
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(an_authority_is_served_on_its_node_only_wherever_it_was_created).needs(&[Tool::Etcd]),
        case!(records_of_the_layout_before_placement_are_moved_once_keeping_everything)
            .needs(&[Tool::Etcd]),
        case!(staleness_fails_closed_per_replica).needs(&[Tool::Etcd]),
        case!(a_placed_authority_s_ttl_ends_its_record_and_its_name).needs(&[Tool::Etcd]),
    ]
}
