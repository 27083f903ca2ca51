//! Limits and fairness (design section 13): how much of the mediator all clients
//! together, one authority, and the TCP clients not identified yet may hold, so that no
//! authority and no unauthenticated flood can take it out of service for another.
//!
//! - Every accepted client connection holds an [`Admission`] for its whole life. The
//!   accept loops wait for room ([`Limiter::room`]) instead of accepting past
//!   `max_connections`: the TCP listener stops at 7/8 of it, so the rest stays for the
//!   authorities' Unix sockets, which stop at the full count.
//! - A TCP connection starts *unidentified*, in a pool of `unidentified_connections`: when
//!   the pool is full, its oldest member (a connection that has not identified itself) is
//!   shed to admit the new one, and while the pool is more than half full new members get
//!   a short head timeout. A client that sends its head at once is identified within
//!   milliseconds and leaves the pool long before its turn to be shed.
//! - Attributed to an authority (at accept on its Unix socket, at its credential on TCP),
//!   a connection counts against the authority's `max_connections` and takes a token from
//!   its `connect_rate` bucket; over either it is answered `rate_limited` (HTTP 429 with
//!   `Retry-After`, SOCKS5 REP 0x02), then closed.
//! - Descriptors: at start the soft open-files limit is raised to the hard limit, and
//!   what is configured as 0 is derived from it ([`InForce::derive`]): a tunnel costs two
//!   descriptors and up to two pipes for splice; spliced pipes take from their own budget
//!   ([`crate::relay`]), so a bulk transfer can never take the descriptor an upstream
//!   connect needs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use policy::Reason;
use policy::config::AuthorityLimits;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

mod in_force;

pub(crate) use in_force::{InForce, nofile_hard, raise_nofile};

use crate::denial::{Cause, Denial};
use crate::vocab::LimitKind;

/// Concurrent admin API connections (outside `max_connections`, inside the reserve).
pub(crate) const ADMIN_CONNECTIONS: usize = 64;
/// Refusals in flight per authority: over-limit connections being answered. Past this,
/// the authority's own socket stops accepting until they are answered (its clients wait;
/// no other authority's socket does).
pub(crate) const REFUSALS_IN_FLIGHT: u32 = 16;
/// The head timeout of a connection admitted under pressure (the unidentified pool more
/// than half full) or only to be refused.
const PRESSURE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Which listener a connection came from (their accept loops stop at different marks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Door {
    /// The shared TCP listener.
    Tcp,
    /// An authority's Unix socket (or an in-process connection).
    Channel,
}

/// The mediator-wide counts.
#[derive(Debug)]
pub(crate) struct Limiter {
    in_force: InForce,
    open: AtomicUsize,
    /// Woken when `open` falls below a listener's mark.
    room: Notify,
    /// At (or near) `max_connections`: listeners wait, `/readyz` answers 503.
    pressured: AtomicBool,
    /// Unidentified TCP connections by id (ids grow, so the first is the oldest), each
    /// with the token that sheds it.
    unidentified: Mutex<BTreeMap<u64, CancellationToken>>,
}

impl Limiter {
    /// The counts for `in_force`.
    pub(crate) fn new(in_force: InForce) -> Self {
        Self {
            in_force,
            open: AtomicUsize::new(0),
            room: Notify::new(),
            pressured: AtomicBool::new(false),
            unidentified: Mutex::new(BTreeMap::new()),
        }
    }

    /// The limits in force.
    pub(crate) fn in_force(&self) -> &InForce {
        &self.in_force
    }

    /// Open client connections now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Whether the mediator is at its connection limit (its listeners wait).
    pub(crate) fn is_pressured(&self) -> bool {
        self.pressured.load(Ordering::Acquire)
    }

    fn mark(&self, door: Door) -> usize {
        match door {
            Door::Tcp => self.in_force.tcp_mark(),
            Door::Channel => self.in_force.max_connections as usize,
        }
    }

    /// Whether a connection from `door` would find room now ([`Self::room`] would not
    /// wait).
    pub(crate) fn has_room(&self, door: Door) -> bool {
        self.open() < self.mark(door)
    }

    /// Waits until a connection from `door` may be accepted. The first wait of an episode
    /// says so on stderr and counts `limit="global"`; `on_pressure` is called then.
    pub(crate) async fn room(&self, door: Door, on_pressure: impl FnOnce()) {
        let mark = self.mark(door);
        let mut on_pressure = Some(on_pressure);
        loop {
            let notified = self.room.notified();
            if self.open() < mark {
                return;
            }
            if !self.pressured.swap(true, Ordering::AcqRel) {
                crate::say!(
                    Warning,
                    "mediator: {} open client connections reached the limit (max_connections = {}); \
                     not accepting new ones until some close; /readyz answers 503 meanwhile",
                    self.open(),
                    self.in_force.max_connections
                );
                if let Some(f) = on_pressure.take() {
                    f();
                }
            }
            notified.await;
        }
    }

    /// Counts a new client connection from `door` and returns its admission (for a TCP
    /// connection: unidentified, in the pool, sheddable through `shed`).
    pub(crate) fn admit(
        self: &Arc<Self>,
        conn: u64,
        door: Door,
        shed: &CancellationToken,
        on_shed: impl FnOnce(),
    ) -> Arc<Admission> {
        self.open.fetch_add(1, Ordering::AcqRel);
        let mut head_timeout = None;
        let state = match door {
            Door::Channel => State::Channel,
            Door::Tcp => {
                let mut pool = self
                    .unidentified
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let cap = self.in_force.unidentified_connections as usize;
                if pool.len() >= cap
                    && let Some((_, oldest)) = pool.pop_first()
                {
                    oldest.cancel();
                    on_shed();
                }
                if pool.len() >= cap / 2 {
                    head_timeout = Some(PRESSURE_HEAD_TIMEOUT);
                }
                pool.insert(conn, shed.clone());
                State::Unidentified
            }
        };
        Arc::new(Admission {
            limiter: Arc::clone(self),
            conn,
            shed: shed.clone(),
            head_timeout,
            state: Mutex::new(state),
        })
    }

    fn leave_pool(&self, conn: u64) {
        self.unidentified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&conn);
    }

    fn release(&self) {
        let before = self.open.fetch_sub(1, Ordering::AcqRel);
        // Wake waiting listeners only around the marks, not on every close.
        if before >= self.in_force.tcp_mark() {
            self.room.notify_waiters();
            if before <= self.in_force.tcp_mark() && self.pressured.swap(false, Ordering::AcqRel) {
                crate::say!(
                    Info,
                    "mediator: below the connection limit again ({} open); accepting",
                    before - 1
                );
            }
        }
    }
}

/// One authority's counts and token bucket, kept by its live entry.
#[derive(Debug)]
pub(crate) struct AuthorityCounts {
    cap: u32,
    /// `true` when `cap` is the mediator's default (for the denial's detail).
    default_cap: bool,
    rate: u32,
    burst: u32,
    open: AtomicU32,
    refusing: AtomicU32,
    /// Woken when a refusal is answered.
    refused: Notify,
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl AuthorityCounts {
    /// The counts of an authority with `limits`, under the mediator's `in_force`.
    pub(crate) fn new(limits: &AuthorityLimits, in_force: &InForce) -> Self {
        Self {
            cap: limits
                .max_connections
                .unwrap_or(in_force.authority_connections),
            default_cap: limits.max_connections.is_none(),
            rate: limits.connect_rate,
            burst: limits.connect_burst.max(1),
            open: AtomicU32::new(0),
            refusing: AtomicU32::new(0),
            refused: Notify::new(),
            bucket: Mutex::new(Bucket {
                tokens: f64::from(limits.connect_burst.max(1)),
                at: Instant::now(),
            }),
        }
    }

    /// Open connections attributed to the authority.
    pub(crate) fn open(&self) -> u32 {
        self.open.load(Ordering::Acquire)
    }

    /// Its cap on open connections.
    pub(crate) fn cap(&self) -> u32 {
        self.cap
    }

    /// Its connect rate (new connections per second, 0 = unlimited) and burst.
    pub(crate) fn rate(&self) -> (u32, u32) {
        (self.rate, self.burst)
    }

    /// Whether [`Self::refusals_room`] would not wait now.
    pub(crate) fn refusals_ok(&self) -> bool {
        self.refusing.load(Ordering::Acquire) < REFUSALS_IN_FLIGHT
    }

    /// Waits until fewer than [`REFUSALS_IN_FLIGHT`] of its connections are being
    /// refused (its socket's accept loop calls this).
    pub(crate) async fn refusals_room(&self) {
        loop {
            let notified = self.refused.notified();
            if self.refusing.load(Ordering::Acquire) < REFUSALS_IN_FLIGHT {
                return;
            }
            notified.await;
        }
    }

    /// Takes a slot and a token for a new connection of authority `name`.
    fn take(&self, name: &str) -> Result<(), Box<(LimitKind, Denial)>> {
        let open = self.open.fetch_add(1, Ordering::AcqRel);
        if open >= self.cap {
            self.open.fetch_sub(1, Ordering::AcqRel);
            let key = if self.default_cap {
                format!("[limits] authority_connections = {}", self.cap)
            } else {
                format!("max_connections = {}", self.cap)
            };
            return Err(Box::new((
                LimitKind::Connections,
                Denial::new(
                    Reason::RateLimited,
                    format!("authority \"{name}\" has {open} open connections, its limit ({key})"),
                    "close connections it no longer needs (idle keep-alive or tunnels), or ask an operator to raise max_connections",
                )
                .with_cause(Cause::Limited { retry_after: 1 }),
            )));
        }
        if self.rate > 0 {
            let mut b = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            let refill = now.duration_since(b.at).as_secs_f64() * f64::from(self.rate);
            b.tokens = (b.tokens + refill).min(f64::from(self.burst));
            b.at = now;
            if b.tokens < 1.0 {
                let wait = (1.0 - b.tokens) / f64::from(self.rate);
                drop(b);
                self.open.fetch_sub(1, Ordering::AcqRel);
                // Whole seconds, rounded up (RFC 9110 section 10.2.3).
                let retry_after = u32::try_from(wait.ceil() as u64).unwrap_or(u32::MAX).max(1);
                return Err(Box::new((
                    LimitKind::Rate,
                    Denial::new(
                        Reason::RateLimited,
                        format!(
                            "authority \"{name}\" opens new connections faster than its connect_rate = {} per second (connect_burst = {})",
                            self.rate, self.burst
                        ),
                        format!("retry after {retry_after} s, or ask an operator to raise connect_rate"),
                    )
                    .with_cause(Cause::Limited { retry_after }),
                )));
            }
            b.tokens -= 1.0;
        }
        Ok(())
    }

    fn give_back(&self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }

    fn refusal_done(&self) {
        self.refusing.fetch_sub(1, Ordering::AcqRel);
        self.refused.notify_waiters();
    }
}

/// Where one connection stands.
#[derive(Debug)]
enum State {
    /// A Unix socket or in-process connection, not yet counted against its authority.
    Channel,
    /// A TCP connection in the unidentified pool.
    Unidentified,
    /// Counted against this authority.
    Admitted(Arc<AuthorityCounts>),
    /// Over a limit: to be answered with this denial, then closed.
    Refused(Arc<AuthorityCounts>, LimitKind, Denial),
}

/// One client connection's place in the limits, held (through its context) until the
/// connection ends; dropping the last handle gives everything back.
#[derive(Debug)]
pub(crate) struct Admission {
    limiter: Arc<Limiter>,
    conn: u64,
    shed: CancellationToken,
    head_timeout: Option<Duration>,
    state: Mutex<State>,
}

/// What an attribution found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Attributed {
    /// Counted (now or before) against the authority.
    Admitted,
    /// Over a limit: answer this (`rate_limited`), then close. `fresh` when this call
    /// found it (to be counted), not an earlier one.
    Refused {
        /// The limit.
        kind: LimitKind,
        /// The answer.
        denial: Denial,
        /// Found by this call.
        fresh: bool,
    },
}

impl Admission {
    /// Cancelled when the connection is shed from the unidentified pool.
    pub(crate) fn shed_signal(&self) -> &CancellationToken {
        &self.shed
    }

    /// The request-head timeout of this connection: `default`, or shorter when it was
    /// admitted under pressure or is only to be refused.
    pub(crate) fn head_timeout(&self, default: Duration) -> Duration {
        let refused = matches!(*self.lock(), State::Refused(..));
        match self.head_timeout {
            Some(short) => default.min(short),
            None if refused => default.min(PRESSURE_HEAD_TIMEOUT),
            None => default,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts the connection against `counts` (the authority named `name`), taking a
    /// token from its rate: at accept on its socket, or at the first credential on TCP.
    /// Attributing again to the same authority changes nothing; a refused connection
    /// stays refused.
    pub(crate) fn attribute(&self, counts: &Arc<AuthorityCounts>, name: &str) -> Attributed {
        let mut state = self.lock();
        match &*state {
            State::Admitted(c) if Arc::ptr_eq(c, counts) => return Attributed::Admitted,
            State::Refused(_, kind, denial) => {
                // Already refused (at accept, say): the same denial, not counted again.
                return Attributed::Refused {
                    kind: *kind,
                    denial: denial.clone(),
                    fresh: false,
                };
            }
            State::Channel | State::Unidentified | State::Admitted(_) => {}
        }
        match counts.take(name) {
            Ok(()) => {
                let before = std::mem::replace(&mut *state, State::Admitted(Arc::clone(counts)));
                drop(state);
                self.leave(before);
                Attributed::Admitted
            }
            Err(refused) => {
                let (kind, denial) = *refused;
                counts.refusing.fetch_add(1, Ordering::AcqRel);
                let before = std::mem::replace(
                    &mut *state,
                    State::Refused(Arc::clone(counts), kind, denial.clone()),
                );
                drop(state);
                self.leave(before);
                Attributed::Refused {
                    kind,
                    denial,
                    fresh: true,
                }
            }
        }
    }

    /// Moves the connection's slot to `to`, its authority's successor after a reload
    /// (`crate::conn::standing`): counted there at once, without a rate token and even
    /// above the cap (it is not a new connection), and given back to the old generation.
    /// Nothing changes for a connection that holds no slot (refused) or already holds one
    /// in `to`.
    pub(crate) fn transfer(&self, to: &Arc<AuthorityCounts>) {
        let mut state = self.lock();
        let State::Admitted(from) = &*state else {
            return;
        };
        if Arc::ptr_eq(from, to) {
            return;
        }
        to.open.fetch_add(1, Ordering::AcqRel);
        let before = std::mem::replace(&mut *state, State::Admitted(Arc::clone(to)));
        drop(state);
        self.leave(before);
    }

    /// Gives back what `state` held (the pool place, or a previous authority's slot).
    fn leave(&self, state: State) {
        match state {
            State::Unidentified => self.limiter.leave_pool(self.conn),
            State::Admitted(c) => c.give_back(),
            State::Refused(c, ..) => c.refusal_done(),
            State::Channel => {}
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let held = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let state = std::mem::replace(held, State::Channel);
        self.leave(state);
        self.limiter.release();
    }
}

#[cfg(test)]
mod tests;
