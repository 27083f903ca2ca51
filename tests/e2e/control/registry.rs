//! The local registry (design section 17) with the real binary and real kills: what the
//! admin API acknowledged survives `kill -9` at any moment, a damaged record is set aside
//! and named, `ttl_s` revokes by itself, a name is either config or api, and generations
//! and decision ids never repeat across restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, ensure};
use e2e::harness::Case;
use e2e::wait::retry_for;
use e2e::{AGENT_A, Fixture, HttpConn, Mediator, ORIGIN_HOST, agent_a_spec, case, check_deny};
use serde_json::{Value, json};

use crate::support::mediator;

/// A bounded wait for what must happen (an expiry, a revocation).
const DEADLINE: Duration = Duration::from_secs(15);

/// `POST /v1/authorities` with `body`, checked to be 201; the answer.
async fn create(m: &Mediator, body: &Value) -> Result<Value> {
    let resp = m
        .admin("POST", "/v1/authorities", Some(&body.to_string()), None)
        .await?;
    ensure!(
        resp.status == 201,
        "POST {body}: {} {}",
        resp.status,
        resp.text()
    );
    resp.json()
}

/// `POST /v1/authorities` with `body`; the status and the answer.
async fn post(m: &Mediator, body: &Value) -> Result<(u16, Value)> {
    let resp = m
        .admin("POST", "/v1/authorities", Some(&body.to_string()), None)
        .await?;
    Ok((resp.status, resp.json().unwrap_or(Value::Null)))
}

/// The API authorities `GET /v1/authorities` lists: name to generation.
async fn api_authorities(m: &Mediator) -> Result<BTreeMap<String, u64>> {
    let list = m.admin_get("/v1/authorities").await?;
    Ok(list["authorities"]
        .as_array()
        .context("no authorities list")?
        .iter()
        .filter(|a| a["origin"] == "api")
        .map(|a| {
            (
                a["name"].as_str().unwrap_or_default().to_owned(),
                a["generation"].as_u64().unwrap_or_default(),
            )
        })
        .collect())
}

/// The registry's record directory of a mediator started by the support builder.
fn records(m: &Mediator) -> PathBuf {
    m.dir().join("state/authorities")
}

/// File names in `dir`, sorted.
fn files(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    names.sort();
    Ok(names)
}

async fn an_api_authority_survives_kill_9_with_its_socket_token_and_generation() -> Result<()> {
    let Fixture {
        dns,
        origin,
        mediator: m,
    } = Fixture::start(mediator().authority(agent_a_spec()).admin(true)).await?;
    let target = format!("{ORIGIN_HOST}:{}", origin.port());
    let created = create(
        &m,
        &json!({
            "name": "agent-c",
            "allow": [ORIGIN_HOST],
            "allow_private": ["127.0.0.0/8"],
            "generate_token": true,
        }),
    )
    .await?;
    assert_eq!(created["persisted"], true, "{created}");
    assert_eq!(created["backend"], "local", "{created}");
    assert!(created.get("persistence_note").is_none(), "{created}");
    let token = created["token"].as_str().unwrap().to_owned();
    let generation = created["generation"].as_u64().unwrap();
    // Nothing secret is stored: the token's hash, never the token.
    let stored = std::fs::read_to_string(records(&m).join("agent-c.json"))?;
    assert!(!stored.contains(&token), "{stored}");
    assert!(stored.contains(&e2e::sha256_hex(&token)), "{stored}");

    let m = m.crash_restart().await?;
    // The stored authority came back before `ready`: socket, token and generation.
    let again = m.admin_get("/v1/authorities/agent-c").await?;
    assert_eq!(again["generation"].as_u64(), Some(generation), "{again}");
    assert_eq!(again["origin"], "api");
    assert_eq!(again["created"], created["created"]);
    let sock = m.socket_path("agent-c");
    let mut u = HttpConn::unix(&sock).await?;
    assert_eq!(u.connect(&target, None).await?.status, 200);
    let mut c = HttpConn::tcp(m.tcp_addr()).await?;
    assert_eq!(
        c.connect(&target, Some(("agent-c", &token))).await?.status,
        200
    );
    let stderr = m.stderr_text();
    assert!(
        stderr.contains("registry: local") && stderr.contains("1 stored authorities loaded"),
        "{stderr}"
    );
    // A DELETE is durable before it is answered: gone after another crash too.
    let resp = m.revoke("agent-c").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()?["persisted"], true);
    let m = m.crash_restart().await?;
    let resp = m
        .admin("GET", "/v1/authorities/agent-c", None, None)
        .await?;
    assert_eq!(resp.status, 404, "{}", resp.text());
    let mut c = HttpConn::tcp(m.tcp_addr()).await?;
    // A name that is not live answers as any wrong credential does (no enumeration).
    check_deny(
        &c.connect(&target, Some(("agent-c", &token))).await?,
        407,
        "bad_credential",
    )?;
    drop((dns, origin));
    Ok(())
}

/// A small deterministic generator (xorshift64*), seeded per run and printed on failure.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// How many crash rounds: `E2E_CRASH_ROUNDS`, else 300.
fn crash_rounds() -> usize {
    std::env::var("E2E_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// One admin write, as the crash loop makes them.
#[derive(Debug, Clone)]
enum Write {
    Create(String),
    Delete(String),
}

impl Write {
    async fn send(&self, admin: std::net::SocketAddr) -> Result<u16> {
        let mut conn = HttpConn::tcp(admin).await?;
        let raw = match self {
            Self::Create(name) => {
                let body = json!({ "name": name, "allow": ["x.test"] }).to_string();
                format!(
                    "POST /v1/authorities HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
            }
            Self::Delete(name) => format!(
                "DELETE /v1/authorities/{name} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
            ),
        };
        Ok(conn.request(raw.as_bytes()).await?.status)
    }
}

/// Hundreds of rounds: acknowledged writes, then one more write in flight when the
/// mediator is killed with SIGKILL at a random moment; after each restart, every
/// acknowledged create is there with its generation, every acknowledged delete is gone,
/// the write in flight is all there or not at all, no record is damaged, and no
/// generation was ever given twice.
#[expect(
    clippy::too_many_lines,
    reason = "the crash loop and its checks, read top to bottom"
)]
async fn acknowledged_writes_survive_kill_9_at_random_moments() -> Result<()> {
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_nanos() as u64
        | 1;
    let mut rng = Rng(seed);
    let mut m = mediator().admin(true).start().await?;
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    let mut generations: BTreeSet<u64> = BTreeSet::new();
    let mut next_name = 0u64;
    let rounds = crash_rounds();
    let (mut in_flight_kept, mut in_flight_lost) = (0, 0);
    for round in 0..rounds {
        let ctx = || format!("round {round} of {rounds}, seed {seed}");
        let admin = m.admin_addr()?;
        let mut pick = |rng: &mut Rng, acked: &BTreeMap<String, u64>| {
            if acked.is_empty() || rng.below(3) > 0 {
                next_name += 1;
                Write::Create(format!("c{next_name}"))
            } else {
                let i = rng.below(acked.len() as u64) as usize;
                Write::Delete(acked.keys().nth(i).cloned().unwrap_or_default())
            }
        };
        for _ in 0..rng.below(4) {
            let write = pick(&mut rng, &acked);
            let status = write.send(admin).await?;
            match &write {
                Write::Create(name) => {
                    ensure!(status == 201, "{write:?}: {status} ({})", ctx());
                    let g = m.admin_get(&format!("/v1/authorities/{name}")).await?["generation"]
                        .as_u64()
                        .context("no generation")?;
                    ensure!(
                        generations.insert(g),
                        "generation {g} given twice ({})",
                        ctx()
                    );
                    acked.insert(name.clone(), g);
                }
                Write::Delete(name) => {
                    ensure!(status == 200, "{write:?}: {status} ({})", ctx());
                    acked.remove(name);
                }
            }
        }
        // One write in flight, and SIGKILL at a random moment around it.
        let write = pick(&mut rng, &acked);
        let flight = {
            let write = write.clone();
            tokio::spawn(async move { write.send(admin).await })
        };
        // Microseconds (a tokio timer rounds up to a millisecond): the kill lands before,
        // during or after the write's fsyncs.
        let wait = Duration::from_micros(rng.below(1500));
        tokio::task::spawn_blocking(move || std::thread::sleep(wait)).await?;
        m = m.crash_restart().await.with_context(ctx)?;
        let answered = match flight.await? {
            Ok(status @ (200 | 201)) => Some(status),
            _ => None,
        };
        let listed = api_authorities(&m).await?;
        // The write in flight: acknowledged means done; unanswered means either.
        match (&write, answered) {
            (Write::Create(name), Some(_)) => {
                let g = *listed
                    .get(name)
                    .with_context(|| format!("acknowledged create {name} lost ({})", ctx()))?;
                ensure!(
                    generations.insert(g),
                    "generation {g} given twice ({})",
                    ctx()
                );
                acked.insert(name.clone(), g);
                in_flight_kept += 1;
            }
            (Write::Create(name), None) => {
                if let Some(g) = listed.get(name) {
                    ensure!(
                        generations.insert(*g),
                        "generation {g} given twice ({})",
                        ctx()
                    );
                    acked.insert(name.clone(), *g);
                    in_flight_kept += 1;
                } else {
                    in_flight_lost += 1;
                }
            }
            (Write::Delete(name), Some(_)) => {
                ensure!(
                    !listed.contains_key(name),
                    "acknowledged delete {name} undone ({})",
                    ctx()
                );
                acked.remove(name);
                in_flight_kept += 1;
            }
            (Write::Delete(name), None) => {
                if listed.contains_key(name) {
                    in_flight_lost += 1;
                } else {
                    acked.remove(name);
                    in_flight_kept += 1;
                }
            }
        }
        ensure!(
            listed == acked,
            "after the crash: listed {listed:?}, acknowledged {acked:?} ({})",
            ctx()
        );
        // Whole records only: nothing set aside, no write left half-done.
        let left = files(&records(&m))?;
        ensure!(
            left.iter()
                .all(|f| f.ends_with(".json") && !f.starts_with('.')),
            "{left:?} ({})",
            ctx()
        );
        for name in acked.keys() {
            ensure!(
                m.socket_path(name).exists(),
                "no socket for {name} ({})",
                ctx()
            );
        }
        // Keep the set small: the start time grows with it.
        while acked.len() > 20 {
            let name = acked.keys().next().cloned().unwrap_or_default();
            ensure!(m.revoke(&name).await?.status == 200);
            acked.remove(&name);
        }
    }
    eprintln!(
        "crash loop: {rounds} rounds, seed {seed}: the write in flight was kept {in_flight_kept} times and not made {in_flight_lost} times; every acknowledged write survived"
    );
    Ok(())
}

async fn a_damaged_record_is_set_aside_and_named_and_the_others_load() -> Result<()> {
    let m = mediator().admin(true).start().await?;
    for name in ["intact", "damaged"] {
        create(&m, &json!({ "name": name, "allow": ["x.test"] })).await?;
    }
    let dir = records(&m);
    // One byte changed, as a disk or an editor might: still JSON, still a valid grant,
    // but not what was acknowledged.
    let path = dir.join("damaged.json");
    let text = std::fs::read_to_string(&path)?;
    std::fs::write(&path, text.replace("x.test", "y.test"))?;
    let m = m.restart().await?;
    let listed = api_authorities(&m).await?;
    assert_eq!(listed.keys().collect::<Vec<_>>(), ["intact"]);
    let stderr = m.stderr_text();
    assert!(
        stderr.contains("damaged.json.rejected")
            && stderr.contains("SHA-256 does not match its content"),
        "{stderr}"
    );
    assert!(dir.join("damaged.json.rejected").exists());
    let metrics = m.metrics().await?;
    assert_eq!(
        metrics.get("mediator_registry_errors_total", &[("kind", "damaged")]),
        1.0
    );
    // The listing names it too, without changing anything.
    let out = m.cli("registry", &["list"]).await?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("registry: local") && text.contains("intact\tgeneration"),
        "{text}"
    );
    Ok(())
}

async fn ttl_revokes_on_time_and_an_expired_record_is_dropped_at_start() -> Result<()> {
    let Fixture {
        dns,
        origin,
        mediator: m,
    } = Fixture::start(mediator().admin(true)).await?;
    let target = format!("{ORIGIN_HOST}:{}", origin.port());
    let created = create(
        &m,
        &json!({ "name": "task", "allow": [ORIGIN_HOST], "allow_private": ["127.0.0.0/8"], "ttl_s": 2 }),
    )
    .await?;
    let expires = created["expires_at"].as_str().context("no expires_at")?;
    let at = humantime::parse_rfc3339(expires)?;
    let listed = m.admin_get("/v1/authorities/task").await?;
    assert_eq!(listed["expires_at"], created["expires_at"]);
    let sock = m.socket_path("task");
    let mut u = HttpConn::unix(&sock).await?;
    assert_eq!(u.connect(&target, None).await?.status, 200);
    // Revoked at expires_at, as a DELETE would: listing, socket and record gone.
    retry_for(
        DEADLINE,
        async || {
            let resp = m.admin("GET", "/v1/authorities/task", None, None).await?;
            Ok((resp.status == 404).then_some(()))
        },
        || "the ttl_s authority is still listed".to_owned(),
    )
    .await?;
    assert!(SystemTime::now() >= at, "revoked before {expires}");
    assert!(!sock.exists());
    assert!(!records(&m).join("task.json").exists());
    let metrics = m.metrics().await?;
    assert_eq!(
        metrics.get(
            "mediator_registry_operations_total",
            &[("op", "expire"), ("result", "ok")]
        ),
        1.0
    );
    // Killed before its expiry, started after it: dropped at load, never served.
    create(
        &m,
        &json!({ "name": "short", "allow": ["x.test"], "ttl_s": 1 }),
    )
    .await?;
    let record = records(&m).join("short.json");
    let m = {
        let mut m = m;
        m.signal(nix::sys::signal::Signal::SIGKILL)?;
        let _ = m.exited().await;
        retry_for(
            DEADLINE,
            async || {
                let text = std::fs::read_to_string(&record)?;
                let v: Value = serde_json::from_str(&text)?;
                let at = humantime::parse_rfc3339(
                    v["record"]["expires_at"].as_str().unwrap_or_default(),
                )?;
                Ok((SystemTime::now() > at).then_some(()))
            },
            || "the record never expired".to_owned(),
        )
        .await?;
        m.restart_after_exit().await?
    };
    let resp = m.admin("GET", "/v1/authorities/short", None, None).await?;
    assert_eq!(resp.status, 404, "{}", resp.text());
    retry_for(
        DEADLINE,
        async || Ok((!record.exists()).then_some(())),
        || "the expired record is still stored".to_owned(),
    )
    .await?;
    drop((dns, origin));
    Ok(())
}

async fn a_name_is_either_config_or_api() -> Result<()> {
    let m = mediator()
        .authority(agent_a_spec())
        .admin(true)
        .start()
        .await?;
    // The file's name cannot be created through the API.
    let resp = m
        .admin(
            "POST",
            "/v1/authorities",
            Some(&json!({ "name": AGENT_A, "allow": ["x.test"] }).to_string()),
            None,
        )
        .await?;
    assert_eq!(resp.status, 409, "{}", resp.text());
    assert!(
        resp.text().contains("defined by the configuration file"),
        "{}",
        resp.text()
    );
    // Nor once the file's is revoked: the name stays the file's (a later reload would
    // otherwise meet an API authority of the file's name and be refused).
    assert_eq!(m.revoke(AGENT_A).await?.status, 200);
    let (status, body) = post(&m, &json!({ "name": AGENT_A, "allow": ["x.test"] })).await?;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "duplicate_authority", "{body}");
    create(&m, &json!({ "name": "agent-c", "allow": ["x.test"] })).await?;
    // A reload that gives the file the API's name fails, naming it, and changes nothing.
    let config = std::fs::read_to_string(m.config_path())?;
    let added = format!("{config}\n[[authority]]\nname = \"agent-c\"\nallow = [\"y.test\"]\n");
    let out = m.reload_with(&added).await?;
    assert!(
        out.contains("reload failed")
            && out.contains("\"agent-c\"")
            && out.contains("Nothing was changed"),
        "{out}"
    );
    let c = m.admin_get("/v1/authorities/agent-c").await?;
    assert_eq!(c["origin"], "api");
    assert_eq!(c["grant"]["allow"], json!(["x.test"]));
    Ok(())
}

/// The local registry serves its own node (here from `MEDIATOR_NODE`): a create placed on
/// another node is refused, naming the field.
async fn a_local_registry_refuses_another_nodes_authority() -> Result<()> {
    // The node from the environment (the DaemonSet's way); the builder's own state
    // directory stays.
    let m = mediator()
        .admin(true)
        .env("MEDIATOR_NODE", "here")
        .start()
        .await?;
    let (status, body) = post(
        &m,
        &json!({ "name": "t", "allow": ["x.test"], "node": "there" }),
    )
    .await?;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "node", "{body}");
    let (status, body) = post(
        &m,
        &json!({ "name": "t", "allow": ["x.test"], "node": "here" }),
    )
    .await?;
    ensure!(status == 201, "{status} {body}");
    assert_eq!(body["node"], "here");
    let (status, body) = post(
        &m,
        &json!({ "name": "u", "allow": ["x.test"], "node": "Bad_Name" }),
    )
    .await?;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "node", "{body}");
    // The same state directory under another node's name: the record is kept, not served,
    // and named.
    let mut m = m;
    m.terminate().await?;
    let state = m.dir().join("state");
    let other = mediator()
        .admin(true)
        .env("MEDIATOR_NODE", "elsewhere")
        .extra_toml(&format!(
            "[registry]\nstate_dir = {:?}",
            state.display().to_string()
        ))
        .start()
        .await?;
    let resp = other.admin("GET", "/v1/authorities/t", None, None).await?;
    assert_eq!(resp.status, 404, "{}", resp.text());
    assert!(!other.socket_path("t").exists());
    assert!(state.join("authorities/t.json").exists(), "kept");
    let stderr = other.stderr_text();
    assert!(
        stderr.contains("placed on other nodes") && stderr.contains(": t"),
        "{stderr}"
    );
    Ok(())
}

/// A file's authority placed on another node is not served here, and its name is still
/// the file's; a reload that moves it away revokes it here, one that moves it back serves
/// it again.
async fn a_file_authority_is_served_on_its_node_only() -> Result<()> {
    let roaming = |node: &str| {
        e2e::AuthoritySpec::new("roam")
            .allow(&["x.test"])
            .raw(&format!("node = \"{node}\""))
    };
    let m = mediator()
        .admin(true)
        .env("MEDIATOR_NODE", "here")
        .authority(roaming("*"))
        .authority(
            e2e::AuthoritySpec::new("away")
                .allow(&["x.test"])
                .raw("node = \"there\""),
        )
        .start()
        .await?;
    assert!(m.socket_path("roam").exists());
    assert!(!m.socket_path("away").exists());
    assert_eq!(
        m.admin("GET", "/v1/authorities/away", None, None)
            .await?
            .status,
        404
    );
    let (status, body) = post(&m, &json!({ "name": "away", "allow": ["x.test"] })).await?;
    assert_eq!(status, 409, "the file's name, placed elsewhere: {body}");
    let config = std::fs::read_to_string(m.config_path())?;
    let moved = config.replace("node = \"*\"", "node = \"there\"");
    ensure!(moved != config, "{config}");
    let out = m.reload_with(&moved).await?;
    assert!(out.contains("removed=roam@"), "{out}");
    assert!(!m.socket_path("roam").exists(), "moved away: revoked here");
    let (status, body) = post(&m, &json!({ "name": "roam", "allow": ["x.test"] })).await?;
    assert_eq!(status, 409, "{body}");
    // Back on every node: served here again.
    let out = m.reload_with(&config).await?;
    assert!(out.contains("added=roam@"), "{out}");
    assert!(m.socket_path("roam").exists(), "placed back: served again");
    Ok(())
}

/// A reloaded file that names another `[registry] node` changes nothing of what is placed
/// here (the replica's node changes at a restart): its own authority stays, another
/// node's is not served, and the section is reported as needing a restart.
async fn a_reload_places_by_the_node_the_replica_runs_as() -> Result<()> {
    let placed = |name: &str, node: &str| {
        e2e::AuthoritySpec::new(name)
            .allow(&["x.test"])
            .raw(&format!("node = \"{node}\""))
    };
    let m = mediator()
        .admin(true)
        .env("MEDIATOR_NODE", "here")
        .authority(placed("mine", "here"))
        .authority(placed("theirs", "there"))
        .start()
        .await?;
    assert!(m.socket_path("mine").exists());
    assert!(!m.socket_path("theirs").exists());
    let config = std::fs::read_to_string(m.config_path())?;
    let renamed = config.replacen("[registry]\n", "[registry]\nnode = \"there\"\n", 1);
    ensure!(renamed != config, "{config}");
    let out = m.reload_with(&renamed).await?;
    assert!(out.contains("added=- removed=- changed=-"), "{out}");
    assert!(
        out.contains("[registry]"),
        "reported as needing a restart: {out}"
    );
    assert!(
        m.socket_path("mine").exists(),
        "its own node's, still served"
    );
    assert!(
        !m.socket_path("theirs").exists(),
        "another node's, still not served"
    );
    assert_eq!(
        m.admin("GET", "/v1/authorities/theirs", None, None)
            .await?
            .status,
        404
    );
    Ok(())
}

async fn generations_and_decision_ids_never_repeat_across_restarts() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .authority(agent_a_spec())
            .admin(true)
            .log_instance("edge-1"),
    )
    .await?;
    let target = fx.origin_target();
    assert_eq!(fx.connect_a(&target).await?.status, 200);
    let Fixture {
        dns,
        origin,
        mediator: m,
    } = fx;
    let first = m.wait_for_decision("allowed", None).await?;
    let first_id = first["id"].as_u64().context("no id")?;
    let g1 = create(&m, &json!({ "name": "one", "allow": ["x.test"] })).await?["generation"]
        .as_u64()
        .context("no generation")?;
    let a1 = m.admin_get(&format!("/v1/authorities/{AGENT_A}")).await?["generation"]
        .as_u64()
        .context("no generation")?;
    let m = m.crash_restart().await?;
    let a2 = m.admin_get(&format!("/v1/authorities/{AGENT_A}")).await?["generation"]
        .as_u64()
        .context("no generation")?;
    let g2 = create(&m, &json!({ "name": "two", "allow": ["x.test"] })).await?["generation"]
        .as_u64()
        .context("no generation")?;
    ensure!(
        a2 > a1 && a2 > g1 && g2 > g1,
        "generations {a1} {g1} then {a2} {g2}"
    );
    let mut c = HttpConn::tcp(m.tcp_addr()).await?;
    assert_eq!(
        c.connect(
            &format!("{ORIGIN_HOST}:{}", origin.port()),
            Some((AGENT_A, e2e::TOKEN_A))
        )
        .await?
        .status,
        200
    );
    m.wait_for_log(
        |v| v["event"] == "decision" && v["id"].as_u64() != Some(first_id),
        e2e::LOG_TIMEOUT,
    )
    .await?;
    let ids: Vec<u64> = m
        .decisions()?
        .iter()
        .filter_map(|d| d["id"].as_u64())
        .collect();
    ensure!(
        ids.iter().filter(|i| **i == first_id).count() == 1 && ids.iter().max() > Some(&first_id),
        "decision ids {ids:?} repeat {first_id}"
    );
    // Every line names the instance configured and its run; the restart is another run,
    // so (run, id) never repeats even where ids would.
    let lines = m.decisions()?;
    for l in &lines {
        e2e::check_stamp(l)?;
        ensure!(l["instance"] == "edge-1", "{l}");
    }
    let runs: BTreeSet<&str> = lines.iter().filter_map(|l| l["run"].as_str()).collect();
    ensure!(runs.len() == 2, "two starts, two runs: {runs:?}");
    drop((dns, origin));
    Ok(())
}

async fn one_mediator_per_state_directory() -> Result<()> {
    let m = mediator().admin(true).start().await?;
    let config = std::fs::read_to_string(m.config_path())?;
    let other = tempfile::tempdir()?;
    // The same state directory, another socket directory and log.
    let text = config
        .replace(
            &m.dir().join("sockets").display().to_string(),
            &other.path().join("sockets").display().to_string(),
        )
        .replace(
            &m.dir().join("decisions.jsonl").display().to_string(),
            &other.path().join("decisions.jsonl").display().to_string(),
        );
    let path = other.path().join("mediator.toml");
    std::fs::write(&path, text)?;
    let out = e2e::mediator::run(
        m.bin(),
        &[std::ffi::OsStr::new("--config"), path.as_os_str()],
    )
    .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("in use by another mediator"), "{stderr}");
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(an_api_authority_survives_kill_9_with_its_socket_token_and_generation),
        case!(acknowledged_writes_survive_kill_9_at_random_moments),
        case!(a_damaged_record_is_set_aside_and_named_and_the_others_load),
        case!(ttl_revokes_on_time_and_an_expired_record_is_dropped_at_start),
        case!(a_name_is_either_config_or_api),
        case!(generations_and_decision_ids_never_repeat_across_restarts),
        case!(one_mediator_per_state_directory),
        case!(a_local_registry_refuses_another_nodes_authority),
        case!(a_file_authority_is_served_on_its_node_only),
        case!(a_reload_places_by_the_node_the_replica_runs_as),
    ]
}
