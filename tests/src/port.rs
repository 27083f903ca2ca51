//! Loopback ports for the servers the tests start as other programs (etcd, a KDC), which
//! take a port number rather than a bound socket.
//!
//! A port the kernel handed out for `bind(:0)` and that was released again can be handed
//! to anyone else's `bind(:0)` or outgoing connect before the server takes it, and a
//! member restarted on its old port meets the same race. The ports here are therefore
//! taken below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), which the
//! kernel never hands out by itself, starting at a place that differs between processes.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Result, bail};

/// The lowest port handed out.
const LOWEST: u16 = 10_000;

/// Ports handed out by this process so far (never twice).
static HANDED: AtomicU32 = AtomicU32::new(0);

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A loopback port below the ephemeral range that nothing listens on now.
///
/// # Errors
/// No such port is found in a few thousand tries, or the ephemeral range starts too low.
pub fn unclaimed_port() -> Result<SocketAddr> {
    let top = ephemeral_start();
    let Some(span) = top.checked_sub(LOWEST).filter(|s| *s > 1_000) else {
        bail!("the ephemeral port range starts at {top}: no room below it for test servers");
    };
    let span = u32::from(span);
    // Different processes (test binaries run side by side) start at different places.
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..4 * 1_024 {
        let n = HANDED.fetch_add(1, Ordering::Relaxed);
        let offset = u16::try_from((start + n) % span)?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, LOWEST + offset));
        if TcpListener::bind(addr).is_ok() {
            return Ok(addr);
        }
    }
    bail!("no unclaimed loopback port below {top}")
}
