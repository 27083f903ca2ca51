//! An I/O wrapper that counts the bytes read and written through it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Shared byte counters: (written = up, read = down).
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters(Arc<(AtomicU64, AtomicU64)>);

impl Counters {
    /// `(bytes written, bytes read)` so far.
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.0.0.load(Ordering::Relaxed),
            self.0.1.load(Ordering::Relaxed),
        )
    }
}

/// Runs `work` to its end; every `every` while it runs, tells `progress` the bytes moved
/// since it was last told, `(up, down)` as `moved` reads them off the counters: so an
/// open connection's bytes reach `mediator_bytes_total` before it closes (design section
/// 19). What moved after the last tick is the close record's to count.
pub(crate) async fn reporting<F: Future>(
    work: F,
    every: std::time::Duration,
    moved: impl Fn() -> (u64, u64),
    progress: impl Fn(u64, u64),
) -> F::Output {
    tokio::pin!(work);
    let mut told = (0, 0);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = tick.tick() => {
                let now = moved();
                progress(now.0.saturating_sub(told.0), now.1.saturating_sub(told.1));
                told = now;
            }
        }
    }
}

/// Wraps `S`, counting bytes written (up) and read (down).
#[derive(Debug)]
pub(crate) struct Counting<S> {
    inner: S,
    counters: Counters,
}

impl<S> Counting<S> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            counters: Counters::default(),
        }
    }

    /// A handle to the counters, readable after the stream is gone.
    pub(crate) fn counters(&self) -> Counters {
        self.counters.clone()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counting<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.counters.0.1.fetch_add(n as u64, Ordering::Relaxed);
        res
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counting<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = res {
            self.counters.0.0.fetch_add(n as u64, Ordering::Relaxed);
        }
        res
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
