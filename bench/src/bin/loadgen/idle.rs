//! `loadgen idle-tunnels`: many idle CONNECT tunnels held open, and the proxy's RSS
//! growth per tunnel.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bench::procstat;
use bench::via::{Stream, Via};
use serde::Serialize;
use tokio::time::Instant;

use super::IdleArgs;

/// Output of `loadgen idle-tunnels`.
#[derive(Debug, Serialize)]
pub(super) struct IdleResult {
    label: String,
    via: String,
    tunnels: u64,
    errors: u64,
    first_error: Option<String>,
    /// Proxy RSS before opening the tunnels (after a warm-up of 200 tunnels).
    rss_before_kib: u64,
    /// Proxy RSS with every tunnel open and idle.
    rss_open_kib: u64,
    /// Proxy RSS after the tunnels closed.
    rss_after_close_kib: u64,
    /// (rss_open - rss_before) / tunnels.
    bytes_per_tunnel: f64,
    /// Seconds it took to open them all.
    open_s: f64,
}

async fn open_tunnels(
    via: &Via,
    origin: SocketAddr,
    count: u32,
    parallel: usize,
) -> (Vec<Stream>, u64, Option<String>) {
    let sem = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..count {
        let Ok(permit) = Arc::clone(&sem).acquire_owned().await else {
            break;
        };
        let via = via.clone();
        set.spawn(async move {
            let r = tokio::time::timeout(Duration::from_secs(10), via.connect_tunnel(origin)).await;
            drop(permit);
            match r {
                Ok(r) => r,
                Err(_) => Err(anyhow::anyhow!("CONNECT timed out")),
            }
        });
    }
    let mut streams = Vec::with_capacity(count as usize);
    let (mut errors, mut first_error) = (0, None);
    while let Some(r) = set.join_next().await {
        match r.map_err(anyhow::Error::from).and_then(|x| x) {
            Ok(s) => streams.push(s),
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    (streams, errors, first_error)
}

pub(super) async fn idle_tunnels(args: IdleArgs) -> anyhow::Result<IdleResult> {
    let via = args.target.via();
    let origin = args.target.origin;
    let pid = args.proxy_pid;
    let rss = move || async move {
        tokio::task::spawn_blocking(move || procstat::memory(pid))
            .await?
            .map(|m| m.rss_kib)
    };
    // Warm-up: first-use allocations (buffers, runtime structures) are not per tunnel.
    let (warm, _, _) = open_tunnels(&via, origin, 200, args.parallel).await;
    drop(warm);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before_kib = rss().await?;
    let t0 = Instant::now();
    let (streams, errors, first_error) =
        open_tunnels(&via, origin, args.count, args.parallel).await;
    let open_s = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs_f64(args.settle.clamp(0.0, 60.0))).await;
    let rss_open_kib = rss().await?;
    let tunnels = streams.len() as u64;
    drop(streams);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after_close_kib = rss().await?;
    Ok(IdleResult {
        label: args.label,
        via: via.to_string(),
        tunnels,
        errors,
        first_error,
        rss_before_kib,
        rss_open_kib,
        rss_after_close_kib,
        bytes_per_tunnel: if tunnels > 0 {
            (rss_open_kib as f64 - rss_before_kib as f64) * 1024.0 / tunnels as f64
        } else {
            0.0
        },
        open_s,
    })
}
