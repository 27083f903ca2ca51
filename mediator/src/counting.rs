//! An I/O wrapper that counts the bytes read and written through it.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::tap::{Tap, Tapped};

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

/// Wraps `S`, counting bytes written (up) and read (down): made with
/// `Tapped::new(inner, Counters::default())`.
pub(crate) type Counting<S> = Tapped<S, Counters>;

impl<S> Counting<S> {
    /// A handle to the counters, readable after the stream is gone.
    pub(crate) fn counters(&self) -> Counters {
        self.tap().clone()
    }
}

impl Tap for Counters {
    fn read(&mut self, read: &[u8], polled: io::Result<()>) -> io::Result<()> {
        self.0.1.fetch_add(read.len() as u64, Ordering::Relaxed);
        polled
    }

    fn write(&mut self, _: &[IoSlice<'_>], polled: io::Result<usize>) -> io::Result<usize> {
        if let Ok(n) = polled {
            self.0.0.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }
}
