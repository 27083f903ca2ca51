//! The fleet benchmark (design section 17, placement by node), on loopback: a
//! three-member etcd cluster and mediator replicas, each with its own node name, state and
//! socket directory. `bench/fleet.sh` builds and runs it; it prints one JSON line per
//! measurement, then the table of `docs/performance.md`.
//!
//! - `scale`: N authorities over M nodes created through one replica's admin API (the
//!   admin create throughput); one node's replica started with the whole registry present
//!   (start to ready, RSS, the registry keys it read, the bytes it read) against that
//!   node's replica in a registry of its own authorities only; the memory per
//!   materialised authority (a replica serving K against one serving none), and the time
//!   to materialise K.
//! - `churn`: creates and deletes at a fixed rate each, placed on the running replicas'
//!   nodes and sent to any replica; each timed from its acknowledgement to its socket
//!   appearing (create) or going (delete) on its node's replica, looked at every 2 ms.
//! - `chaos`: rounds of churn while a replica and an etcd member are killed (`SIGKILL`) at
//!   random moments and started again; then every acknowledged create must be served by
//!   its node's replica, every acknowledged delete by none, and no replica may serve (list,
//!   or accept on a socket) an authority of another node.

mod churn;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bench::cluster::{Conn, Etcd, Replica};
use churn::{Fleet, chaos, timed_churn};
use clap::Parser;
use serde_json::{Value, json};

/// Command line.
#[derive(Parser, Debug, Clone)]
struct Args {
    /// The mediator binary (built with `--features etcd`).
    #[arg(long)]
    mediator: PathBuf,
    /// The etcd binary.
    #[arg(long, default_value = "etcd")]
    etcd: PathBuf,
    /// Authorities placed on nodes, spread evenly.
    #[arg(long, default_value_t = 100_000)]
    authorities: usize,
    /// Nodes they are spread over.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Fleet-wide authorities (`node = "*"`) besides.
    #[arg(long, default_value_t = 10)]
    fleet: usize,
    /// Authorities on the one replica whose memory per authority is measured.
    #[arg(long, default_value_t = 10_000)]
    materialise: usize,
    /// Concurrent admin clients while the registry is filled.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Creates per second, and as many deletes per second, during churn.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// Seconds of churn.
    #[arg(long, default_value_t = 20)]
    churn_secs: u64,
    /// Chaos rounds (0: none).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Where the cluster and replicas keep their files (default: a new directory under
    /// the system's temporary directory, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// How long a start may take before the bench gives up.
const START: Duration = Duration::from_secs(120);

/// A node name.
fn node(i: usize) -> String {
    format!("node-{i:03}")
}

/// A create body: an authority of `name` placed on `node`, with a generated token.
fn body(name: &str, node: &str) -> String {
    json!({ "name": name, "node": node, "allow": ["x.test"], "generate_token": true }).to_string()
}

/// One row of the table: what, the goal, the result, whether it is met (`None`: no goal).
#[derive(Debug, Clone)]
struct Row {
    what: String,
    goal: String,
    result: String,
    met: Option<bool>,
}

/// The rows, printed as JSON lines as they come and as a table at the end.
#[derive(Debug, Default)]
struct Report(Vec<Row>);

impl Report {
    fn add(&mut self, what: &str, goal: &str, result: String, met: Option<bool>, data: Value) {
        println!(
            "{}",
            json!({ "bench": "fleet", "what": what, "goal": goal, "result": result, "met": met, "data": data })
        );
        self.0.push(Row {
            what: what.to_owned(),
            goal: goal.to_owned(),
            result,
            met,
        });
    }

    fn table(&self) -> String {
        let mut out = String::from("| measure | goal | result | met |\n|---|---|---|---|\n");
        for r in &self.0 {
            let met = match r.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "-",
            };
            out.push_str(&format!(
                "| {} | {} | {} | {met} |\n",
                r.what, r.goal, r.result
            ));
        }
        out
    }
}

/// Creates every `(name, node)` through the admin API at `admin` from `concurrency`
/// clients; creates per second. A create whose answer was lost is sent again (a 409 then
/// says the first one landed).
async fn populate(
    admin: std::net::SocketAddr,
    items: Vec<(String, String)>,
    concurrency: usize,
) -> Result<f64> {
    let started = Instant::now();
    let n = items.len();
    let queue = Arc::new(Mutex::new(VecDeque::from(items)));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let queue = Arc::clone(&queue);
        workers.push(tokio::spawn(async move {
            let mut conn = Conn::new(admin);
            loop {
                let Some((name, node)) = queue
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .pop_front()
                else {
                    return Ok::<(), anyhow::Error>(());
                };
                let mut tries = 0;
                loop {
                    tries += 1;
                    match conn
                        .call("POST", "/v1/authorities", Some(&body(&name, &node)))
                        .await
                    {
                        Ok((201, _)) => break,
                        Ok((409, _)) if tries > 1 => break,
                        Ok((s, b)) if tries >= 5 => bail!("create {name}: {s} {b}"),
                        Err(e) if tries >= 5 => bail!("create {name}: {e}"),
                        _ => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// A replica measured at start.
struct Started {
    replica: Replica,
    ready: Duration,
    rss_kib: u64,
    /// What etcd sent its clients from the spawn until 1 s after ready (this replica's
    /// reads, and the others' idle confirmations).
    etcd_sent: u64,
    /// `mediator_registry_keys_read_total` by range: node, fleet, index, legacy.
    keys: [f64; 4],
}

/// Starts a replica and measures it once ready (and 1 s later, for RSS).
async fn start_measured(bin: &Path, etcd: &Etcd, dir: &Path, registry: &str) -> Result<Started> {
    let sent = etcd.sent_bytes().await?;
    let replica = Replica::spawn(bin, dir, registry)?;
    let ready = replica.wait_ready(START).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = replica.pid().context("the replica is gone")?;
    let rss_kib = bench::procstat::memory(pid)?.rss_kib;
    let etcd_sent = etcd.sent_bytes().await?.saturating_sub(sent);
    let mut keys = [0.0; 4];
    for (k, range) in keys.iter_mut().zip(["node", "fleet", "index", "legacy"]) {
        *k = replica
            .metric(&format!(
                "mediator_registry_keys_read_total{{range=\"{range}\"}}"
            ))
            .await?;
    }
    Ok(Started {
        replica,
        ready,
        rss_kib,
        etcd_sent,
        keys,
    })
}

/// The registry filled, and the replica of the measured node started on it.
struct Scaled {
    gateway: Replica,
    measured: Replica,
    measured_node: String,
    /// Every authority placed on a node, by name: its node.
    placed: HashMap<String, String>,
}

/// `scale`: fills the registry, measures a replica on it and one on its own share only.
async fn scale(args: &Args, etcd: &Etcd, dir: &Path, report: &mut Report) -> Result<Scaled> {
    let gateway = Replica::spawn(
        &args.mediator,
        &dir.join("gateway"),
        &etcd.registry_toml("/fleet/", "gateway"),
    )?;
    gateway.wait_ready(START).await?;
    let placed: HashMap<String, String> = (0..args.authorities)
        .map(|i| (format!("a{i}"), node(i % args.nodes)))
        .collect();
    let fleet: Vec<(String, String)> = (0..args.fleet)
        .map(|j| (format!("f{j}"), "*".to_owned()))
        .collect();
    let mut items: Vec<(String, String)> = (0..args.authorities)
        .map(|i| (format!("a{i}"), node(i % args.nodes)))
        .collect();
    items.extend(fleet.iter().cloned());
    let rate = populate(gateway.admin, items, args.concurrency).await?;
    report.add(
        "admin create throughput through one replica",
        ">= 400/s",
        format!(
            "{rate:.0}/s ({} creates, {} clients)",
            args.authorities + args.fleet,
            args.concurrency
        ),
        Some(rate >= 400.0),
        json!({ "creates_per_s": rate }),
    );
    let measured_node = node(42 % args.nodes);
    let own: Vec<(String, String)> = placed
        .iter()
        .filter(|(_, n)| **n == measured_node)
        .map(|(a, n)| (a.clone(), n.clone()))
        .chain(fleet.iter().cloned())
        .collect();
    let own_count = own.len();
    let full = start_measured(
        &args.mediator,
        etcd,
        &dir.join("measured"),
        &etcd.registry_toml("/fleet/", &measured_node),
    )
    .await?;
    // The same node's share alone in a registry of its own.
    let solo_gateway = Replica::spawn(
        &args.mediator,
        &dir.join("gateway-solo"),
        &etcd.registry_toml("/solo/", "gateway"),
    )?;
    solo_gateway.wait_ready(START).await?;
    populate(solo_gateway.admin, own, args.concurrency).await?;
    drop(solo_gateway);
    let solo = start_measured(
        &args.mediator,
        etcd,
        &dir.join("solo"),
        &etcd.registry_toml("/solo/", &measured_node),
    )
    .await?;
    report_start(args, own_count, &full, &solo, report);
    drop(solo);
    materialise(args, etcd, dir, report).await?;
    Ok(Scaled {
        gateway,
        measured: full.replica,
        measured_node,
        placed,
    })
}

/// The rows of one node's replica started with the whole registry (`full`) against its
/// share alone (`solo`).
fn report_start(
    args: &Args,
    own_count: usize,
    full: &Started,
    solo: &Started,
    report: &mut Report,
) {
    report.add(
        &format!(
            "start to ready, {own_count} of {} authorities its own",
            args.authorities + args.fleet
        ),
        "<= 2 s",
        format!(
            "{:.2} s (alone: {:.2} s)",
            full.ready.as_secs_f64(),
            solo.ready.as_secs_f64()
        ),
        Some(full.ready <= Duration::from_secs(2)),
        json!({ "ready_s": full.ready.as_secs_f64(), "alone_ready_s": solo.ready.as_secs_f64() }),
    );
    let ratio = full.rss_kib as f64 / solo.rss_kib.max(1) as f64;
    report.add(
        "RSS with the whole registry against its share alone",
        "<= 1.5x",
        format!("{} KiB vs {} KiB ({ratio:.2}x)", full.rss_kib, solo.rss_kib),
        Some(ratio <= 1.5),
        json!({ "rss_kib": full.rss_kib, "alone_rss_kib": solo.rss_kib, "ratio": ratio }),
    );
    // Records plus index keys: what a replica reading everything would read.
    let total = 2 * (args.authorities + args.fleet);
    let read = full.keys[0] + full.keys[1];
    let others = read - own_count as f64;
    report.add(
        "registry keys read at start",
        "none of another node's",
        format!(
            "{read:.0} of {total} ({:.2}%): its node {:.0}, fleet-wide {:.0}, another node's {others:.0}; etcd sent {} KiB while it started (alone: {} KiB)",
            100.0 * read / total as f64,
            full.keys[0],
            full.keys[1],
            full.etcd_sent / 1024,
            solo.etcd_sent / 1024
        ),
        Some(others <= 0.0),
        json!({ "keys": full.keys, "total": total, "etcd_sent_bytes": full.etcd_sent, "alone_etcd_sent_bytes": solo.etcd_sent }),
    );
}

/// The memory per materialised authority and the time to materialise them: a replica
/// serving `materialise` authorities against one of the same registry serving none.
async fn materialise(args: &Args, etcd: &Etcd, dir: &Path, report: &mut Report) -> Result<()> {
    let k = args.materialise;
    let gateway = Replica::spawn(
        &args.mediator,
        &dir.join("gateway-big"),
        &etcd.registry_toml("/big/", "gateway"),
    )?;
    gateway.wait_ready(START).await?;
    let items = (0..k)
        .map(|i| (format!("m{i}"), "big".to_owned()))
        .collect();
    populate(gateway.admin, items, args.concurrency).await?;
    drop(gateway);
    let empty = start_measured(
        &args.mediator,
        etcd,
        &dir.join("big-empty"),
        &etcd.registry_toml("/big/", "elsewhere"),
    )
    .await?;
    drop(empty.replica);
    let big = start_measured(
        &args.mediator,
        etcd,
        &dir.join("big"),
        &etcd.registry_toml("/big/", "big"),
    )
    .await?;
    drop(big.replica);
    let per = (big.rss_kib.saturating_sub(empty.rss_kib)) as f64 * 1024.0 / k as f64;
    report.add(
        &format!("memory per materialised authority, {k} on one replica"),
        "<= 8 KiB",
        format!("{:.1} KiB ({} KiB vs {} KiB serving none)", per / 1024.0, big.rss_kib, empty.rss_kib),
        Some(per <= 8192.0),
        json!({ "bytes_per_authority": per, "rss_kib": big.rss_kib, "empty_rss_kib": empty.rss_kib }),
    );
    report.add(
        &format!("start to ready with {k} to materialise"),
        "-",
        format!(
            "{:.2} s (serving none: {:.2} s)",
            big.ready.as_secs_f64(),
            empty.ready.as_secs_f64()
        ),
        None,
        json!({ "ready_s": big.ready.as_secs_f64(), "empty_ready_s": empty.ready.as_secs_f64() }),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let (dir, keep) = match &args.dir {
        Some(d) => (d.clone(), true),
        None => (
            std::env::temp_dir().join(format!("bench-fleet-{}", std::process::id())),
            false,
        ),
    };
    std::fs::create_dir_all(&dir)?;
    let mut etcd = Etcd::start(&args.etcd, &dir, 3).await?;
    let mut report = Report::default();
    let scaled = scale(&args, &etcd, &dir, &mut report).await?;
    // The running nodes: the measured one and two more, each with its replica; the
    // gateway takes requests too.
    let mut nodes = vec![scaled.measured_node.clone()];
    let mut replicas = vec![scaled.measured];
    for i in [0, 1] {
        let n = node(i);
        if nodes.contains(&n) {
            continue;
        }
        let r = Replica::spawn(
            &args.mediator,
            &dir.join(&n),
            &etcd.registry_toml("/fleet/", &n),
        )?;
        r.wait_ready(START).await?;
        replicas.push(r);
        nodes.push(n);
    }
    replicas.push(scaled.gateway);
    let deletable = scaled
        .placed
        .iter()
        .filter_map(|(name, n)| Some((name.clone(), nodes.iter().position(|x| x == n)?)))
        .collect();
    let mut fleet = Fleet {
        replicas,
        nodes,
        deletable: Arc::new(Mutex::new(deletable)),
        next: 0,
    };
    timed_churn(&mut fleet, &args, &mut report).await?;
    if args.rounds > 0 {
        chaos(&mut fleet, &mut etcd, args.rounds, args.rate, &mut report).await?;
    }
    for r in &fleet.replicas {
        if let Some(pid) = r.pid() {
            eprintln!(
                "replica {}: RSS {} KiB at the end",
                r.dir().display(),
                bench::procstat::memory(pid)?.rss_kib
            );
        }
    }
    println!("\n{}", report.table());
    drop(fleet);
    drop(etcd);
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if report.0.iter().any(|r| r.met == Some(false)) {
        std::process::exit(1);
    }
    Ok(())
}
