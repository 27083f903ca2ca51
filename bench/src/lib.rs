//! Support code for the benchmark harness: how the load generator reaches its
//! target (directly, or through a proxy over TCP or a Unix socket), process statistics read
//! from `/proc`, latency summaries, and the etcd cluster and mediator replicas of the
//! registry benchmarks ([`cluster`]). The binaries are `origin` (a loopback HTTP origin)
//! and `loadgen` (the load generator); `bench/run.sh` drives both.
//!
//! Every address this crate connects to or listens on must be a loopback address: see
//! [`require_loopback`].

pub mod cluster;
#[allow(unsafe_code)] // sysconf(3) for the clock tick
pub mod procstat;
pub mod via;

use std::net::SocketAddr;

/// Refuses any address outside the loopback range (`127.0.0.0/8`, `::1`): the harness
/// never sends traffic off the machine.
///
/// # Errors
/// A message naming the address when it is not a loopback address.
pub fn require_loopback(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    if addr.ip().is_loopback() {
        Ok(addr)
    } else {
        anyhow::bail!("{addr} is not a loopback address; the harness stays on loopback")
    }
}

/// Latency summary of one run, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
}

impl Percentiles {
    /// Summarises `samples` (nanoseconds; sorted in place). Nearest-rank percentiles; all
    /// zero when there are no samples.
    pub fn from_nanos(samples: &mut [u64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let rank = |p: f64| {
            // Nearest rank: ceil(p * n), 1-based.
            let n = samples.len();
            let r = (p * n as f64).ceil() as usize;
            samples[r.clamp(1, n) - 1]
        };
        let ms = |ns: u64| ns as f64 / 1e6;
        Self {
            p50_ms: ms(rank(0.50)),
            p99_ms: ms(rank(0.99)),
            max_ms: ms(samples[samples.len() - 1]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).rev().map(|x| x * 1_000_000).collect();
        let p = Percentiles::from_nanos(&mut v);
        assert_eq!(p.p50_ms, 50.0);
        assert_eq!(p.p99_ms, 99.0);
        assert_eq!(p.max_ms, 100.0);
        assert_eq!(Percentiles::from_nanos(&mut []), Percentiles::default());
    }

    #[test]
    fn loopback_only() {
        assert!(require_loopback("127.0.0.2:1".parse().unwrap()).is_ok());
        assert!(require_loopback("[::1]:1".parse().unwrap()).is_ok());
        assert!(require_loopback("10.0.0.1:1".parse().unwrap()).is_err());
    }
}
