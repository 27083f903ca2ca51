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
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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

/// A child killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// One HTTP/1.1 request with `Connection: close`; the status.
async fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Result<u16> {
    let mut s = TcpStream::connect(addr).await?;
    let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n");
    match body {
        Some(b) => raw.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )),
        None => raw.push_str("\r\n"),
    }
    s.write_all(raw.as_bytes()).await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    let text = String::from_utf8_lossy(&out);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status in {text:?}"))
}

/// Starts a mediator with an admin listener and `registry` (TOML); its admin address.
fn start_mediator(bin: &Path, dir: &Path, registry: &str) -> Result<(Killed, SocketAddr)> {
    let admin = free_port()?;
    std::fs::create_dir_all(dir)?;
    let config = dir.join("mediator.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\nsocket_dir = \"{}\"\nadmin = \"{admin}\"\nadmin_allow_anonymous_writes = true\n[log]\ndecisions = \"{}\"\n{registry}",
            dir.join("sockets").display(),
            dir.join("decisions.jsonl").display()
        ),
    )?;
    let child = Command::new(bin)
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr"))?)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok((Killed(child), admin))
}

async fn wait_ready(admin: SocketAddr) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if request(admin, "GET", "/readyz", None).await.ok() == Some(200) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the mediator on {admin} was not ready within 30 s")
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
                let status = request(
                    admin,
                    "POST",
                    "/v1/authorities",
                    Some(&body(&format!("{prefix}{i}"))),
                )
                .await?;
                if status != 201 {
                    bail!("create {i}: {status}");
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
    )?;
    wait_ready(admin).await?;
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
    // Three members on loopback, fast elections.
    let members: Vec<(String, SocketAddr, SocketAddr)> = (0..3)
        .map(|i| Ok((format!("m{i}"), free_port()?, free_port()?)))
        .collect::<Result<_>>()?;
    let initial = members
        .iter()
        .map(|(n, _, p)| format!("{n}=http://{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut etcd = Vec::new();
    for (name, client, peer) in &members {
        let data = dir.join(name);
        etcd.push(Killed(
            Command::new(&args.etcd)
                .args(["--name", name, "--data-dir"])
                .arg(&data)
                .args(["--listen-client-urls", &format!("http://{client}")])
                .args(["--advertise-client-urls", &format!("http://{client}")])
                .args(["--listen-peer-urls", &format!("http://{peer}")])
                .args(["--initial-advertise-peer-urls", &format!("http://{peer}")])
                .args([
                    "--initial-cluster",
                    &initial,
                    "--initial-cluster-state",
                    "new",
                ])
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(data.with_extension("log"))?)
                .spawn()
                .context("starting etcd (apt-get install etcd-server)")?,
        ));
    }
    let endpoints = members
        .iter()
        .map(|(_, c, _)| format!("\"http://{c}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let registry = format!(
        "[registry]\nbackend = \"etcd\"\nendpoints = [{endpoints}]\nprefix = \"/bench/\"\n"
    );
    let (_a, a) = start_mediator(&args.mediator, &dir.join("a"), &registry)?;
    let (_b, b) = start_mediator(&args.mediator, &dir.join("b"), &registry)?;
    wait_ready(a).await?;
    wait_ready(b).await?;
    let rate = creates_per_second(a, "r", args.creates, args.concurrency).await?;
    // Propagation: one create at a time on A, then B polled as fast as it answers.
    let mut lat = Vec::new();
    for i in 0..args.creates {
        let name = format!("p{i}");
        let status = request(a, "POST", "/v1/authorities", Some(&body(&name))).await?;
        if status != 201 {
            bail!("create {name}: {status}");
        }
        let acked = Instant::now();
        loop {
            if request(b, "GET", &format!("/v1/authorities/{name}"), None).await? == 200 {
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
