//! The state every connection of one mediator shares, built whole at start (nothing is
//! set later): the live authorities, the requests held for the host's answer, metrics,
//! resolver, router, TLS state, decision log, the mediator's own addresses, timeouts and
//! limits, the shutdown signals, the idle upstream connections kept for reuse
//! (`crate::reuse`), and the count
//! of live client connections that a graceful shutdown waits on, and the threads that
//! serve them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use policy::OwnAddrs;
use policy::config::{Limits, Timeouts};
use tokio::sync::Notify;

use crate::ask::Asks;
use crate::authorities::LiveSet;
use crate::decision_log::DecisionLog;
use crate::limits::Limiter;
use crate::metrics::Metrics;
use crate::resolve::Resolver;
use crate::reuse::{Caps, Conn, Pool};
use crate::route::{self, Router};
use crate::serving::Serving;
use crate::signal::Signals;
use crate::tls::TlsState;

/// Bits of a generation below the run's start number: 2^32 authorities added per run.
pub(crate) const GENERATION_BITS: u32 = 32;

/// Bits of a decision id below the run's start number: 2^40 ids per run (35 years at
/// 1,000 decisions a second). With at most 2^24 starts, ids fit in 64 bits.
pub(crate) const ID_BITS: u32 = 40;

/// What [`Shared::new`] is built from: the parts of one mediator that a start (or a test)
/// makes. A [`Shared`] holds them, readable as its own fields (`shared.metrics`).
#[derive(Debug)]
pub(crate) struct Parts {
    /// The Prometheus metrics.
    pub(crate) metrics: Metrics,
    /// The resolver of destinations.
    pub(crate) resolver: Resolver,
    /// The router (`[upstream]`), after the decision and the vetting.
    pub(crate) router: Arc<Router>,
    /// TLS termination state (CA, leaf cache, upstream trust); `None` without `[tls]
    /// ca_dir` (no grant may then terminate: the config validator enforces that).
    pub(crate) tls: Option<Arc<TlsState>>,
    /// The decision log.
    pub(crate) log: DecisionLog,
    /// The mediator's own listening addresses (never a destination).
    pub(crate) own: OwnAddrs,
    /// Timeouts.
    pub(crate) timeouts: Timeouts,
    /// Limits as configured.
    pub(crate) limits: Limits,
    /// The connection counts and the limits in force (design section 13).
    pub(crate) limiter: Arc<Limiter>,
    /// The threads that serve connections.
    pub(crate) serving: Serving,
    /// This run's start number (the registry's `boot`): the high bits of generations
    /// (`boot << 32`) and decision ids (`boot << 40`), so that no two runs share one.
    pub(crate) boot: u64,
}

/// State shared by every connection of one mediator: its [`Parts`] (through `Deref`),
/// the live authorities, the shutdown signals, the decision ids and the count of live
/// client connections.
#[derive(Debug)]
pub(crate) struct Shared {
    parts: Parts,
    /// The live authorities.
    pub(crate) authorities: LiveSet,
    /// Shutdown signals.
    pub(crate) signals: Signals,
    /// The requests held for the host's answer (design section 20).
    pub(crate) asks: Asks,
    /// The idle upstream connections of terminated tunnels (`[limits]
    /// idle_upstream_connections`).
    pub(crate) reuse: Arc<Pool<Conn>>,
    next_id: AtomicU64,
    active: AtomicUsize,
    idle: Notify,
}

impl std::ops::Deref for Shared {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.parts
    }
}

/// Counts one live client connection (or a tunnel or forwarding connection that outlives
/// its client connection's task); dropping it ends the count.
#[derive(Debug)]
pub(crate) struct ActiveGuard(Arc<Shared>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Shared {
    /// The shared state, with no authority yet.
    pub(crate) fn new(parts: Parts) -> Self {
        let boot = parts.boot;
        let asks = Asks::new(parts.metrics.clone());
        let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        let caps = Caps {
            total: count(parts.limits.idle_upstream_connections),
            per_authority: count(parts.limits.authority_idle_upstream_connections),
            idle: parts.timeouts.idle_upstream,
        };
        Self {
            reuse: Arc::new(Pool::new(caps)),
            parts,
            asks,
            authorities: LiveSet::starting_at(boot << GENERATION_BITS),
            signals: Signals::new(),
            next_id: AtomicU64::new((boot << ID_BITS) + 1),
            active: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }

    /// A fresh id for a connection or a decision.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers a live client connection.
    pub(crate) fn enter(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        ActiveGuard(Arc::clone(self))
    }

    /// Number of live client connections.
    pub(crate) fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Waits until no client connection is live, or `limit` passes; whether it is idle.
    pub(crate) async fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.idle.notified();
            if self.active() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.active() == 0;
            }
        }
    }

    /// The `route` log value of `route`.
    pub(crate) fn route_label(&self, route: route::Route) -> &str {
        self.router.label(route)
    }
}
