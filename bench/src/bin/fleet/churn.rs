//! The fleet benchmark's churn and chaos: creates and deletes at a fixed rate, each
//! timed to its node's replica, and rounds of them while a replica and an etcd member are
//! killed, with the checks that nothing acknowledged was lost or resurrected and that no
//! replica serves another node's authority.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bench::Percentiles;
use bench::cluster::{Etcd, Replica, request};
use serde_json::{Value, json};

use crate::{Args, Report, START, body};

/// What churn acknowledged (and what it could not tell), for the chaos checks.
#[derive(Debug, Default)]
struct Ledger {
    /// Acknowledged creates: name to node.
    created: HashMap<String, String>,
    /// Acknowledged deletes.
    deleted: HashSet<String>,
    /// Names whose create or delete has no answer (a killed replica, a lost member).
    unknown: HashSet<String>,
    /// Creates and deletes timed to their node's replica from their acknowledgement, in
    /// nanoseconds (about 0 when the replica had it first).
    create_ns: Vec<u64>,
    delete_ns: Vec<u64>,
    /// The same, from the moment the request was sent.
    create_sent_ns: Vec<u64>,
    delete_sent_ns: Vec<u64>,
    /// Changes that never reached their node's replica within 10 s (churn without kills).
    missed: usize,
}

/// The replicas churn runs against: `nodes[i]` is served by `replicas[i]`; the last
/// replicas (the gateway) own no node's authorities but take requests too.
pub(crate) struct Fleet {
    pub(crate) replicas: Vec<Replica>,
    pub(crate) nodes: Vec<String>,
    /// Names that may be deleted (acknowledged creates, oldest first), with the index of
    /// their node.
    pub(crate) deletable: Arc<Mutex<VecDeque<(String, usize)>>>,
    pub(crate) next: usize,
}

/// Waits (up to 10 s, looking every 2 ms) until `path` exists (or, `gone`, no longer);
/// how long after `from` that was.
async fn seen(path: PathBuf, gone: bool, from: Instant) -> Option<Duration> {
    while from.elapsed() < Duration::from_secs(10) {
        if path.exists() != gone {
            return Some(from.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

/// A duration in nanoseconds.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Locks the ledger (a poisoned lock is an error of the bench itself).
fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| anyhow::anyhow!("a bench task panicked"))
}

/// One create sent to `to`, placed on `node` (index `owner`); recorded in `ledger`, and
/// with `timed` timed until its socket is at `path`.
#[expect(
    clippy::too_many_arguments,
    reason = "one create's facts, passed to its task"
)]
async fn create_one(
    to: std::net::SocketAddr,
    name: String,
    node: String,
    owner: usize,
    path: PathBuf,
    timed: bool,
    ledger: Arc<Mutex<Ledger>>,
    deletable: Arc<Mutex<VecDeque<(String, usize)>>>,
) -> Result<()> {
    let sent = Instant::now();
    let answer = request(to, "POST", "/v1/authorities", Some(&body(&name, &node))).await;
    let acked = Instant::now();
    if !matches!(answer, Ok((201, _))) {
        lock(&ledger)?.unknown.insert(name);
        return Ok(());
    }
    lock(&ledger)?.created.insert(name.clone(), node);
    lock(&deletable)?.push_back((name, owner));
    if timed {
        let took = seen(path, false, acked).await;
        let mut l = lock(&ledger)?;
        match took {
            Some(t) => {
                l.create_ns.push(nanos(t));
                l.create_sent_ns.push(nanos(t + (acked - sent)));
            }
            None => l.missed += 1,
        }
    }
    Ok(())
}

/// One delete of `name` sent to `to`; recorded in `ledger`, and with `timed` timed until
/// its socket at `path` is gone.
async fn delete_one(
    to: std::net::SocketAddr,
    name: String,
    path: PathBuf,
    timed: bool,
    ledger: Arc<Mutex<Ledger>>,
) -> Result<()> {
    let sent = Instant::now();
    let answer = request(to, "DELETE", &format!("/v1/authorities/{name}"), None).await;
    let acked = Instant::now();
    if !matches!(answer, Ok((200, _))) {
        lock(&ledger)?.unknown.insert(name);
        return Ok(());
    }
    lock(&ledger)?.deleted.insert(name);
    if timed {
        let took = seen(path, true, acked).await;
        let mut l = lock(&ledger)?;
        match took {
            Some(t) => {
                l.delete_ns.push(nanos(t));
                l.delete_sent_ns.push(nanos(t + (acked - sent)));
            }
            None => l.missed += 1,
        }
    }
    Ok(())
}

/// `secs` of churn: each tick a create (placed on the next running node) and a delete
/// (of the oldest deletable name), each sent to the next replica, answers recorded in
/// `ledger`; with `timed`, each is also timed to its node's replica.
async fn churn(
    fleet: &mut Fleet,
    rate: u32,
    secs: f64,
    timed: bool,
    ledger: &Arc<Mutex<Ledger>>,
) -> Result<()> {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    let started = Instant::now();
    let mut tasks = Vec::new();
    while started.elapsed().as_secs_f64() < secs {
        tick.tick().await;
        let k = fleet.next;
        fleet.next += 1;
        let owner = k % fleet.nodes.len();
        let name = format!("c{k}");
        tasks.push(tokio::spawn(create_one(
            fleet.replicas[k % fleet.replicas.len()].admin,
            name.clone(),
            fleet.nodes[owner].clone(),
            owner,
            fleet.replicas[owner].socket(&name),
            timed,
            Arc::clone(ledger),
            Arc::clone(&fleet.deletable),
        )));
        let victim = lock(&fleet.deletable)?.pop_front();
        if let Some((victim, at)) = victim {
            tasks.push(tokio::spawn(delete_one(
                fleet.replicas[(k + 1) % fleet.replicas.len()].admin,
                victim.clone(),
                fleet.replicas[at].socket(&victim),
                timed,
                Arc::clone(ledger),
            )));
        }
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// A small xorshift generator for the chaos moments (seeded from the clock, printed).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// What happens at a moment of a chaos round.
#[derive(Debug, Clone, Copy)]
enum Event {
    KillReplica(usize),
    StartReplica(usize),
    KillMember(usize),
    StartMember(usize),
}

/// `rounds` of churn, each with a replica and an etcd member killed (`SIGKILL`) at random
/// moments and started again (0.5 to 1.5 s later); then the checks.
pub(crate) async fn chaos(
    fleet: &mut Fleet,
    etcd: &mut Etcd,
    rounds: usize,
    rate: u32,
    report: &mut Report,
) -> Result<()> {
    let seed = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos()
            % u128::from(u64::MAX),
    )? | 1;
    let mut rng = Rng(seed);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    for round in 0..rounds {
        let victim = usize::try_from(rng.below(fleet.replicas.len() as u64))?;
        let member = usize::try_from(rng.below(etcd.len() as u64))?;
        let ms =
            |rng: &mut Rng, from: u64, span: u64| Duration::from_millis(from + rng.below(span));
        let (kill, kill_member) = (ms(&mut rng, 200, 2000), ms(&mut rng, 200, 2000));
        let mut events = vec![
            (kill, Event::KillReplica(victim)),
            (kill + ms(&mut rng, 500, 1000), Event::StartReplica(victim)),
            (kill_member, Event::KillMember(member)),
            (
                kill_member + ms(&mut rng, 500, 1000),
                Event::StartMember(member),
            ),
        ];
        events.sort_by_key(|(at, _)| *at);
        eprintln!("chaos round {round} (seed {seed}): {events:?}");
        let mut now = Duration::ZERO;
        for (at, event) in events {
            churn(fleet, rate, (at - now).as_secs_f64(), false, &ledger).await?;
            now = at;
            match event {
                Event::KillReplica(i) => fleet.replicas[i].kill(),
                Event::StartReplica(i) => fleet.replicas[i].start()?,
                Event::KillMember(i) => etcd.kill(i),
                Event::StartMember(i) => etcd.start_member(i)?,
            }
        }
        churn(fleet, rate, 0.5, false, &ledger).await?;
        etcd.wait_all_healthy().await?;
        for r in &fleet.replicas {
            r.wait_ready(START).await?;
        }
    }
    let bad = check(fleet, &ledger).await?;
    let l = lock(&ledger)?;
    report.add(
        &format!("chaos: {rounds} rounds, a replica and an etcd member killed in each"),
        "nothing lost or resurrected",
        format!(
            "{} creates and {} deletes acknowledged ({} unanswered): {} lost, {} resurrected, {} served off their node",
            l.created.len(), l.deleted.len(), l.unknown.len(), bad[0], bad[1], bad[2]
        ),
        Some(bad == [0, 0, 0]),
        json!({ "created": l.created.len(), "deleted": l.deleted.len(), "unknown": l.unknown.len(), "lost": bad[0], "resurrected": bad[1], "foreign": bad[2], "seed": seed }),
    );
    Ok(())
}

/// What each replica serves: the authorities it lists (name to node) and the sockets in
/// its directory that accept a connection.
async fn served(r: &Replica) -> Result<(HashMap<String, String>, Vec<String>)> {
    let (status, text) = request(r.admin, "GET", "/v1/authorities", None).await?;
    if status != 200 {
        bail!("GET /v1/authorities: {status} {text}");
    }
    let list: Value = serde_json::from_str(&text)?;
    let listed = list["authorities"]
        .as_array()
        .context("no authorities")?
        .iter()
        .filter_map(|a| {
            Some((
                a["name"].as_str()?.to_owned(),
                a["node"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let mut accepting = Vec::new();
    for entry in std::fs::read_dir(r.dir().join("sockets"))? {
        let path = entry?.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".sock"))
        else {
            continue;
        };
        if tokio::net::UnixStream::connect(&path).await.is_ok() {
            accepting.push(name.to_owned());
        }
    }
    Ok((listed, accepting))
}

/// The chaos checks, once every replica is ready and current (retried for up to 15 s, so
/// that a last change still travelling is not counted): `[lost, resurrected, foreign]`.
async fn check(fleet: &Fleet, ledger: &Arc<Mutex<Ledger>>) -> Result<[usize; 3]> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut views = Vec::new();
        for r in &fleet.replicas {
            views.push(served(r).await?);
        }
        let bad = verdict(fleet, &views, &*lock(ledger)?)?;
        if bad == [0, 0, 0] || Instant::now() >= deadline {
            return Ok(bad);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The chaos checks on what the replicas serve: `[lost, resurrected, foreign]`.
fn verdict(
    fleet: &Fleet,
    views: &[(HashMap<String, String>, Vec<String>)],
    l: &Ledger,
) -> Result<[usize; 3]> {
    {
        let mut bad = [0usize; 3];
        for (name, node) in &l.created {
            if l.deleted.contains(name) || l.unknown.contains(name) {
                continue;
            }
            let owner = fleet
                .nodes
                .iter()
                .position(|n| n == node)
                .context("a node without a replica")?;
            if !views[owner].0.contains_key(name) {
                bad[0] += 1;
            }
        }
        for name in &l.deleted {
            bad[1] += views
                .iter()
                .filter(|(listed, accepting)| listed.contains_key(name) || accepting.contains(name))
                .count();
        }
        for (i, (listed, accepting)) in views.iter().enumerate() {
            let mine = fleet.nodes.get(i).map_or("gateway", String::as_str);
            bad[2] += listed.values().filter(|n| *n != mine && *n != "*").count();
            bad[2] += accepting
                .iter()
                .filter(|a| listed.get(*a).is_none_or(|n| n != mine && n != "*"))
                .count();
        }
        Ok(bad)
    }
}

/// `churn`: the running replicas under creates and deletes at the rate, timed.
pub(crate) async fn timed_churn(fleet: &mut Fleet, args: &Args, report: &mut Report) -> Result<()> {
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let started = Instant::now();
    churn(fleet, args.rate, args.churn_secs as f64, true, &ledger).await?;
    let took = started.elapsed().as_secs_f64();
    let mut l = lock(&ledger)?;
    let (creates, deletes) = (l.created.len(), l.deleted.len());
    let c = Percentiles::from_nanos(&mut l.create_ns);
    let d = Percentiles::from_nanos(&mut l.delete_ns);
    let cs = Percentiles::from_nanos(&mut l.create_sent_ns);
    let ds = Percentiles::from_nanos(&mut l.delete_sent_ns);
    let p99 = c.p99_ms.max(d.p99_ms);
    report.add(
        &format!("propagation to the owning replica under {} creates/s + {} deletes/s", args.rate, args.rate),
        "p99 <= 1 s",
        format!(
            "from the acknowledgement: create p50 {:.0} ms, p99 {:.0} ms; revoke p50 {:.0} ms, p99 {:.0} ms (from the request: create p50 {:.0} ms, p99 {:.0} ms; revoke p50 {:.0} ms, p99 {:.0} ms); {creates} creates, {deletes} deletes in {took:.0} s, {} unanswered, {} never seen",
            c.p50_ms, c.p99_ms, d.p50_ms, d.p99_ms, cs.p50_ms, cs.p99_ms, ds.p50_ms, ds.p99_ms, l.unknown.len(), l.missed
        ),
        Some(p99 <= 1000.0 && l.missed == 0 && l.unknown.is_empty()),
        json!({ "create": c, "delete": d, "create_from_request": cs, "delete_from_request": ds, "creates": creates, "deletes": deletes, "seconds": took, "unknown": l.unknown.len(), "missed": l.missed }),
    );
    Ok(())
}
