//! Byte relay between a client and an upstream connection.
//!
//! Both directions run concurrently in one task with one buffer each (no per-chunk
//! allocation; a buffer starts small and grows only while reads fill it); each direction ends on its own (EOF is passed on as a write shutdown, so
//! half-closed connections work); a tunnel with no bytes in either direction for the idle
//! timeout is closed; a shutdown signal closes it at once. Byte counts survive errors, so
//! the close record is always accurate.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

/// First buffer size per direction: an idle or chatty tunnel never needs more.
const BUF_START: usize = 2 * 1024;
/// Largest buffer per direction: a read that fills the buffer grows it (x4) up to this,
/// so bulk transfers make few, large system calls.
const BUF_MAX: usize = 64 * 1024;

/// How a relay ended, and what crossed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayOutcome {
    /// Bytes client -> upstream.
    pub up: u64,
    /// Bytes upstream -> client.
    pub down: u64,
    /// `client_closed`, `upstream_closed`, `idle_timeout`, `error` or `shutdown`.
    pub close_reason: &'static str,
}

impl RelayOutcome {
    /// A connection that ended before any byte was relayed, for `reason`.
    pub fn ended(close_reason: &'static str) -> Self {
        Self {
            up: 0,
            down: 0,
            close_reason,
        }
    }
}

/// Relays until both directions have ended, the idle timeout passes, or `closing` turns
/// true.
pub async fn relay<C, U>(
    client: C,
    upstream: U,
    idle: Duration,
    mut closing: watch::Receiver<bool>,
) -> RelayOutcome
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    // Atomics only because the future must be `Send`; both directions run in this task.
    let origin = Instant::now();
    let last = AtomicU64::new(0); // milliseconds since `origin` of the last byte moved
    let up = AtomicU64::new(0);
    let down = AtomicU64::new(0);
    let first_end: OnceLock<&'static str> = OnceLock::new();

    let up_dir = pump(
        &mut cr,
        &mut uw,
        &up,
        (origin, &last),
        &first_end,
        "client_closed",
    );
    let down_dir = pump(
        &mut ur,
        &mut cw,
        &down,
        (origin, &last),
        &first_end,
        "upstream_closed",
    );
    let both = async { tokio::join!(up_dir, down_dir) };
    let idle_watch = async {
        loop {
            let deadline = origin + Duration::from_millis(last.load(Ordering::Relaxed)) + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    };
    let shutdown = async {
        if *closing.borrow() {
            return;
        }
        while closing.changed().await.is_ok() {
            if *closing.borrow() {
                return;
            }
        }
        // Sender dropped: never resolve.
        std::future::pending::<()>().await;
    };
    let reason = tokio::select! {
        (a, b) = both => match (a, b) {
            (Ok(()), Ok(())) => first_end.get().copied().unwrap_or("client_closed"),
            _ => "error",
        },
        () = idle_watch => "idle_timeout",
        () = shutdown => "shutdown",
    };
    RelayOutcome {
        up: up.load(Ordering::Relaxed),
        down: down.load(Ordering::Relaxed),
        close_reason: reason,
    }
}

async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    count: &AtomicU64,
    (origin, last): (Instant, &AtomicU64),
    first_end: &OnceLock<&'static str>,
    end_name: &'static str,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUF_START];
    loop {
        let n = r.read(&mut buf).await?;
        if n == buf.len() && buf.len() < BUF_MAX {
            // Data arrives faster than we read it: grow once the bytes are sent.
            w.write_all(&buf[..n]).await?;
            count.fetch_add(n as u64, Ordering::Relaxed);
            buf = vec![0u8; (buf.len() * 4).min(BUF_MAX)];
            let since = u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX);
            last.store(since, Ordering::Relaxed);
            continue;
        }
        if n == 0 {
            let _ = first_end.set(end_name);
            // Pass the half-close on; the other direction keeps going.
            let _ = w.shutdown().await;
            return Ok(());
        }
        w.write_all(&buf[..n]).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        let since = u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        last.store(since, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    #[tokio::test]
    async fn half_close_each_direction_ends_on_its_own() {
        let (client, mut client_peer) = duplex(64);
        let (upstream, mut upstream_peer) = duplex(64);
        let (_tx, rx) = watch::channel(false);
        let task = tokio::spawn(relay(client, upstream, Duration::from_secs(60), rx));

        client_peer.write_all(b"request").await.unwrap();
        client_peer.shutdown().await.unwrap(); // client half-closes
        let mut got = Vec::new();
        upstream_peer.read_to_end(&mut got).await.unwrap(); // EOF passed on
        assert_eq!(got, b"request");
        // The other direction still works after the client's half-close.
        upstream_peer.write_all(b"response!").await.unwrap();
        upstream_peer.shutdown().await.unwrap();
        let mut back = Vec::new();
        client_peer.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"response!");

        let out = task.await.unwrap();
        assert_eq!(
            (out.up, out.down, out.close_reason),
            (7, 9, "client_closed")
        );
    }

    #[tokio::test]
    async fn bulk_transfer_grows_the_buffer_and_keeps_every_byte_in_order() {
        let (client, mut client_peer) = duplex(256 * 1024);
        let (upstream, mut upstream_peer) = duplex(256 * 1024);
        let (_tx, rx) = watch::channel(false);
        let task = tokio::spawn(relay(client, upstream, Duration::from_secs(60), rx));
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            client_peer.write_all(&sent).await.unwrap();
            client_peer.shutdown().await.unwrap();
            client_peer
        });
        let mut got = Vec::new();
        upstream_peer.read_to_end(&mut got).await.unwrap();
        assert!(got == data, "bytes differ");
        drop(upstream_peer);
        let _client_peer = writer.await.unwrap();
        let out = task.await.unwrap();
        assert_eq!(out.up, 3_000_000);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_tunnel_is_closed_after_the_idle_timeout() {
        let (client, mut client_peer) = duplex(64);
        let (upstream, _upstream_peer) = duplex(64);
        let (_tx, rx) = watch::channel(false);
        let task = tokio::spawn(relay(client, upstream, Duration::from_secs(30), rx));
        client_peer.write_all(b"x").await.unwrap();
        let out = task.await.unwrap();
        assert_eq!((out.up, out.close_reason), (1, "idle_timeout"));
    }

    #[tokio::test]
    async fn shutdown_signal_closes_a_live_tunnel() {
        let (client, _c) = duplex(64);
        let (upstream, _u) = duplex(64);
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(relay(client, upstream, Duration::from_secs(300), rx));
        tx.send(true).unwrap();
        assert_eq!(task.await.unwrap().close_reason, "shutdown");
    }
}
