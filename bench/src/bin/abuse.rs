//! The abusive clients of the fairness benchmark (`bench/fairness.sh`): what one tenant, or
//! an unauthenticated local process, can throw at the mediator while another authority's
//! latency is measured. Every address must be on loopback. Each kind runs for
//! `--duration` seconds (or until killed) and prints one JSON line of what it achieved.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::bail;
use bench::require_loopback;
use bench::via::{Credential, Via};
use clap::{Parser, ValueEnum};
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Abusive clients for the fairness benchmark (loopback only).
#[derive(Debug, Parser)]
struct Cli {
    /// What to do.
    #[arg(long, value_enum)]
    kind: Kind,
    /// `tcp:ADDR` or `unix:PATH` (the mediator).
    #[arg(long)]
    via: Via,
    /// User (authority name) on a TCP proxy; needs --password.
    #[arg(long, requires = "password")]
    user: Option<String>,
    /// Password (authority token).
    #[arg(long)]
    password: Option<String>,
    /// The origin (loopback) the tunnels go to.
    #[arg(long)]
    origin: SocketAddr,
    /// How many connections (tunnels held, silent connections open, slow heads).
    #[arg(long, default_value_t = 2000)]
    count: u64,
    /// Connections opened at once.
    #[arg(long, default_value_t = 64)]
    parallel: u64,
    /// Seconds to keep at it.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
}

/// The abuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Kind {
    /// Open CONNECT tunnels and hold them, idle, as many as the proxy grants (up to
    /// --count); a refused one is retried.
    HoldTunnels,
    /// Keep opening TCP connections that never send a byte (the proxy must shed them).
    SilentFlood,
    /// Open and close CONNECT tunnels as fast as it can.
    ConnectStorm,
    /// Hold --count connections that send one byte of a request head per second.
    SlowHeads,
}

#[derive(Debug, Default, Serialize)]
struct Outcome {
    kind: Option<Kind>,
    /// Connections or tunnels the proxy accepted.
    opened: u64,
    /// Refused (non-2xx answers, failed connects).
    refused: u64,
    /// Connections the proxy closed on us.
    cut: u64,
    /// The most held at once.
    held_peak: u64,
}

#[derive(Default)]
struct Counts {
    opened: AtomicU64,
    refused: AtomicU64,
    cut: AtomicU64,
    held: AtomicU64,
    held_peak: AtomicU64,
    /// Set (to 1) when the run must end now.
    stopped: AtomicU64,
}

impl Counts {
    fn running(&self, end: Instant) -> bool {
        Instant::now() < end && self.stopped.load(Ordering::Relaxed) == 0
    }

    fn hold(&self) {
        let now = self.held.fetch_add(1, Ordering::Relaxed) + 1;
        self.held_peak.fetch_max(now, Ordering::Relaxed);
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    require_loopback(cli.origin)?;
    if !(0.0..=600.0).contains(&cli.duration) {
        bail!("--duration must be at most 600 s");
    }
    let via = cli
        .via
        .clone()
        .with_credential(cli.user.clone().map(|user| Credential {
            user,
            password: cli.password.clone().unwrap_or_default(),
        }));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let counts = Arc::new(Counts::default());
    let end = Instant::now() + Duration::from_secs_f64(cli.duration);
    rt.block_on(async {
        // Interrupted (the benchmark's next scenario): stop, then report.
        let stop = Arc::clone(&counts);
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.stopped.store(1, Ordering::Relaxed);
            }
        });
        let mut workers = Vec::new();
        for w in 0..cli.parallel.max(1) {
            let (via, counts) = (via.clone(), Arc::clone(&counts));
            let share =
                cli.count / cli.parallel.max(1) + u64::from(w < cli.count % cli.parallel.max(1));
            let (kind, origin) = (cli.kind, cli.origin);
            workers.push(tokio::spawn(async move {
                worker(kind, &via, origin, share, end, &counts).await;
            }));
        }
        for w in workers {
            let _ = w.await;
        }
    });
    let outcome = Outcome {
        kind: Some(cli.kind),
        opened: counts.opened.load(Ordering::Relaxed),
        refused: counts.refused.load(Ordering::Relaxed),
        cut: counts.cut.load(Ordering::Relaxed),
        held_peak: counts.held_peak.load(Ordering::Relaxed),
    };
    println!("{}", serde_json::to_string(&outcome)?);
    Ok(())
}

async fn worker(kind: Kind, via: &Via, origin: SocketAddr, share: u64, end: Instant, c: &Counts) {
    let tcp_addr = match via {
        Via::Tcp { addr, .. } => Some(*addr),
        Via::Direct | Via::Unix { .. } => None,
    };
    let mut held = Vec::new();
    while c.running(end) {
        match kind {
            Kind::HoldTunnels if (held.len() as u64) < share => {
                match via.connect_tunnel(origin).await {
                    Ok(s) => {
                        c.opened.fetch_add(1, Ordering::Relaxed);
                        c.hold();
                        held.push(s);
                    }
                    Err(_) => {
                        c.refused.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            Kind::HoldTunnels => tokio::time::sleep(Duration::from_millis(100)).await,
            Kind::ConnectStorm => match via.connect_tunnel(origin).await {
                Ok(s) => {
                    c.opened.fetch_add(1, Ordering::Relaxed);
                    drop(s);
                }
                Err(_) => {
                    c.refused.fetch_add(1, Ordering::Relaxed);
                }
            },
            Kind::SilentFlood | Kind::SlowHeads => {
                let Some(addr) = tcp_addr else { return };
                if (held.len() as u64) >= share {
                    // Send the next byte of each slow head, and notice cuts.
                    let mut kept = Vec::with_capacity(held.len());
                    for mut s in held.drain(..) {
                        let alive = match (kind, &mut s) {
                            (Kind::SlowHeads, tokio_util::either::Either::Left(t)) => {
                                t.write_all(b"G").await.is_ok()
                            }
                            _ => is_open(&s),
                        };
                        if alive {
                            kept.push(s);
                        } else {
                            c.cut.fetch_add(1, Ordering::Relaxed);
                            c.held.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                    held = kept;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                match TcpStream::connect(addr).await {
                    Ok(s) => {
                        c.opened.fetch_add(1, Ordering::Relaxed);
                        c.hold();
                        held.push(tokio_util::either::Either::Left(s));
                    }
                    Err(_) => {
                        c.refused.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    }
}

/// Whether the peer has not closed `s` (a read finding the end says it has).
fn is_open(s: &bench::via::Stream) -> bool {
    match s {
        tokio_util::either::Either::Left(t) => {
            let mut b = [0u8; 1];
            match t.try_read(&mut b) {
                Ok(0) => false,
                Ok(_) => true,
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            }
        }
        tokio_util::either::Either::Right(_) => true,
    }
}
