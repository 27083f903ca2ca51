//! The threads that serve connections: one single-threaded tokio runtime per core.
//!
//! A listener's accept loop runs on one serving thread, and a connection it accepts is
//! served on that same thread unless that thread already serves more connections than
//! the least loaded one (then the socket moves there). One agent's requests, one at a
//! time, are therefore accepted, decided, connected and relayed without a single
//! hand-off between threads: no work-stealing scheduler wakes a second thread to look
//! for work it cannot take, and no timer or I/O registration is shared with another
//! thread. Under load, connections spread over every thread. The control plane (admin
//! API, signals, reloads) stays on the caller's runtime.
//!
//! Each runtime also keeps a one-second heartbeat timer. Tokio wakes a runtime's driver
//! (a write to its eventfd and one more turn of its event loop) whenever a timer is armed
//! earlier than every timer already armed; with the heartbeat always armed within a
//! second, the per-connection timeouts (seconds or minutes away) never do.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// How often each serving runtime's heartbeat timer fires (see the module docs).
const HEARTBEAT: Duration = Duration::from_secs(1);

/// A serving thread may hold this many more connections than the least loaded one before
/// the connections it accepts move elsewhere.
const SLACK: usize = 1;

/// The serving threads of one mediator. Dropping it ends them (their runtimes drop the
/// tasks left, whose owners still write their records).
#[derive(Debug)]
pub(crate) struct Serving {
    /// Which pool of the process this is (tests run several mediators in one).
    pool: usize,
    workers: Vec<Arc<Worker>>,
    /// Round-robin position for the next listener.
    next: AtomicUsize,
    stop: CancellationToken,
    /// The threads, until [`Serving::stop`] joins them.
    threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
}

#[derive(Debug)]
struct Worker {
    handle: Handle,
    /// Connections placed on this thread and not yet ended.
    load: AtomicUsize,
}

thread_local! {
    /// The serving thread this is, if it is one: its pool and its index there.
    static HERE: std::cell::Cell<Option<(usize, usize)>> = const { std::cell::Cell::new(None) };
}

/// Tells apart the pools of several mediators in one process (tests).
static POOLS: AtomicUsize = AtomicUsize::new(0);

/// Where a connection is served, and its count on that thread (dropping it ends the
/// count).
#[derive(Debug)]
pub(crate) struct Placed {
    /// `None`: on the thread that accepted it; else the runtime to move it to.
    pub(crate) elsewhere: Option<Handle>,
    /// The connection's share of its thread's load.
    pub(crate) load: Load,
}

/// One connection counted on its serving thread.
#[derive(Debug)]
pub(crate) struct Load(Arc<Worker>);

impl Drop for Load {
    fn drop(&mut self) {
        self.0.load.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Serving {
    /// Starts `threads` serving threads (at least one), each running a single-threaded
    /// runtime with every driver (I/O, time) enabled.
    ///
    /// # Errors
    /// The error of a thread or a runtime that could not be made.
    pub(crate) fn start(threads: usize) -> io::Result<Self> {
        let pool = POOLS.fetch_add(1, Ordering::Relaxed);
        let stop = CancellationToken::new();
        let mut joins = Vec::new();
        let mut started = Vec::new();
        // Every thread is spawned before any is waited for: their runtimes are built side
        // by side (a start costs one thread's start-up, not one per thread).
        for index in 0..threads.max(1) {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let for_thread = stop.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("mediator-serve-{index}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    HERE.with(|h| h.set(Some((pool, index))));
                    let _ = tx.send(Ok(runtime.handle().clone()));
                    runtime.block_on(async {
                        let mut beat = tokio::time::interval(HEARTBEAT);
                        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        tokio::select! {
                            () = for_thread.cancelled() => {}
                            () = async { loop { beat.tick().await; } } => {}
                        }
                    });
                });
            match spawned {
                Ok(thread) => {
                    joins.push(thread);
                    started.push(rx);
                }
                Err(e) => {
                    // The threads started so far must not outlive a failed start.
                    stop.cancel();
                    return Err(e);
                }
            }
        }
        let mut workers = Vec::new();
        for rx in started {
            let handle = match rx.recv() {
                Ok(Ok(handle)) => handle,
                failed => {
                    stop.cancel();
                    return Err(match failed {
                        Ok(Err(e)) => e,
                        _ => io::Error::other("a serving thread ended at start"),
                    });
                }
            };
            workers.push(Arc::new(Worker {
                handle,
                load: AtomicUsize::new(0),
            }));
        }
        Ok(Self {
            pool,
            workers,
            next: AtomicUsize::new(0),
            stop,
            threads: std::sync::Mutex::new(joins),
        })
    }

    /// Runs `task` (an accept loop) on the next serving thread, round robin.
    pub(crate) fn spawn_listener<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.workers.len();
        self.workers[i].handle.spawn(task);
    }

    /// Where a connection accepted on the current thread is served: here, if this is a
    /// serving thread of this pool holding at most [`SLACK`] more connections than the
    /// least loaded one; else on the least loaded thread.
    pub(crate) fn place(&self) -> Placed {
        let least = self
            .workers
            .iter()
            .min_by_key(|w| w.load.load(Ordering::Relaxed))
            .unwrap_or_else(|| unreachable!("start makes at least one worker"));
        let here = HERE
            .with(std::cell::Cell::get)
            .filter(|(pool, _)| *pool == self.pool)
            .and_then(|(_, i)| self.workers.get(i));
        let chosen = match here {
            Some(h)
                if h.load.load(Ordering::Relaxed) <= least.load.load(Ordering::Relaxed) + SLACK =>
            {
                h
            }
            _ => least,
        };
        chosen.load.fetch_add(1, Ordering::Relaxed);
        let moved = here.is_none_or(|h| !Arc::ptr_eq(h, chosen));
        Placed {
            elsewhere: moved.then(|| chosen.handle.clone()),
            load: Load(Arc::clone(chosen)),
        }
    }

    /// Ends every serving thread and waits until each has: their runtimes stop and drop
    /// the tasks left (whose owners write their close records meanwhile). Blocks; a
    /// runtime calls it through `spawn_blocking`.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
        let threads = std::mem::take(
            &mut *self
                .threads
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for t in threads {
            // A serving thread that panicked has nothing left to stop.
            let _ = t.join();
        }
    }

    /// Ends every serving thread without waiting.
    pub(crate) fn cancel(&self) {
        self.stop.cancel();
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
