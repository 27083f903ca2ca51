//! The registry benchmark (design section 17), on loopback:
//!
//! - `local`: one mediator with the local registry; creates per second through the admin
//!   API (each answered only once its record is fsynced), at a given concurrency.
//! - `etcd`: a three-member etcd cluster (Debian's `etcd-server`) and two mediators on it;
//!   creates per second on one, and for each create the time from its 201 on the first
//!   replica to the authority being live on the other (p50, p99, max).
//!
//! Prints one JSON line per mode. `bench/registry.sh` builds and runs it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bench::cluster::{Etcd, Replica, request};
use clap::Parser;
use serde_json::json;

/// Command line.
#[derive(Parser, Debug)]
struct Args {
    /// The mediator binary (built with `--features etcd` for the etcd mode).
    #[arg(long)]
    mediator: PathBuf,
    /// `local`, `etcd` or `both`.
    #[arg(long, default_value = "both")]
    mode: String,
    /// Creates per mode.
    #[arg(long, default_value_t = 500)]
    creates: usize,
    /// Concurrent admin clients for the creates-per-second figure.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// The etcd binary.
    #[arg(long, default_value = "etcd")]
    etcd: PathBuf,
}

/// Starts a mediator with an admin listener and `registry` (TOML), and waits until it is
/// ready; the replica (killed when dropped) and its admin address.
async fn start_mediator(bin: &Path, dir: &Path, registry: &str) -> Result<(Replica, SocketAddr)> {
    let replica = Replica::spawn(bin, dir, registry)?;
    replica.wait_ready(Duration::from_secs(30)).await?;
    let admin = replica.admin;
    Ok((replica, admin))
}

/// The status of one request.
async fn status(admin: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Result<u16> {
    Ok(request(admin, method, path, body).await?.0)
}

fn body(name: &str) -> String {
    json!({ "name": name, "allow": ["x.test"], "generate_token": true }).to_string()
}

/// `n` creates from `concurrency` clients; creates per second.
async fn creates_per_second(
    admin: SocketAddr,
    prefix: &str,
    n: usize,
    concurrency: usize,
) -> Result<f64> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        let prefix = prefix.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut i = c;
            while i < n {
                let got = status(
                    admin,
                    "POST",
                    "/v1/authorities",
                    Some(&body(&format!("{prefix}{i}"))),
                )
                .await?;
                if got != 201 {
                    bail!("create {i}: {got}");
                }
                i += concurrency;
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

async fn local(args: &Args, dir: &Path) -> Result<()> {
    let (_m, admin) = start_mediator(
        &args.mediator,
        &dir.join("local"),
        &format!(
            "[registry]\nstate_dir = \"{}\"\n",
            dir.join("local/state").display()
        ),
    )
    .await?;
    let rate = creates_per_second(admin, "l", args.creates, args.concurrency).await?;
    let serial = creates_per_second(admin, "s", args.creates / 5, 1).await?;
    println!(
        "{}",
        json!({
            "bench": "registry", "backend": "local", "creates": args.creates,
            "concurrency": args.concurrency, "creates_per_s": rate, "creates_per_s_serial": serial,
        })
    );
    Ok(())
}

async fn etcd(args: &Args, dir: &Path) -> Result<()> {
    let etcd = Etcd::start(&args.etcd, dir, 3).await?;
    let registry = etcd.registry_toml("/bench/", "bench");
    let (_a, a) = start_mediator(&args.mediator, &dir.join("a"), &registry).await?;
    let (_b, b) = start_mediator(&args.mediator, &dir.join("b"), &registry).await?;
    let rate = creates_per_second(a, "r", args.creates, args.concurrency).await?;
    // Propagation: one create at a time on A, then B polled as fast as it answers.
    let mut lat = Vec::new();
    for i in 0..args.creates {
        let name = format!("p{i}");
        let created = status(a, "POST", "/v1/authorities", Some(&body(&name))).await?;
        if created != 201 {
            bail!("create {name}: {created}");
        }
        let acked = Instant::now();
        loop {
            if status(b, "GET", &format!("/v1/authorities/{name}"), None).await? == 200 {
                lat.push(acked.elapsed());
                break;
            }
            if acked.elapsed() > Duration::from_secs(10) {
                bail!("{name} never reached the other replica");
            }
        }
    }
    lat.sort();
    println!(
        "{}",
        json!({
            "bench": "registry", "backend": "etcd", "members": 3, "replicas": 2,
            "creates": args.creates, "concurrency": args.concurrency, "creates_per_s": rate,
            "propagation_ms": {
                "p50": percentile(&lat, 0.50), "p99": percentile(&lat, 0.99),
                "max": percentile(&lat, 1.0),
            },
        })
    );
    drop(etcd);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let dir = tempfile_dir()?;
    if matches!(args.mode.as_str(), "local" | "both") {
        local(&args, &dir).await?;
    }
    if matches!(args.mode.as_str(), "etcd" | "both") {
        etcd(&args, &dir).await?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A fresh private directory under the system's temporary directory.
fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("bench-registry-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}
