//! Upstream connection reuse for terminated tunnels (design section 9): the idle upstream
//! TLS connections that terminated tunnels leave behind, kept for the next tunnel of the
//! same authority to the same place, so that it needs no new TCP connection and no new
//! TLS handshake with the origin.
//!
//! A connection is kept under a [`Key`]: the authority's generation (never shared across
//! authorities, nor across a reload that re-creates one: credentials and request rules
//! differ), the target (host and port), the pin (the vetted addresses, as the decision
//! found them) and the route. The ALPN the connection offered is checked when the tunnel
//! knows its client's ([`conn::Offer`]). A connection is taken only when it is alive
//! ([`Reusable::alive`]: open, idle, never switched); it is dropped (and so closed) when
//! it has been idle for `[timeouts] idle_upstream`, when the origin closes it, when its
//! authority is revoked or re-created by a reload (or the mediator drains), or when a cap needs its place:
//! `[limits] authority_idle_upstream_connections` per authority (its own oldest goes),
//! `[limits] idle_upstream_connections` in all (the oldest of the authority holding the
//! most goes, so that one authority's churn cannot take another's fair share). A cap of 0
//! turns reuse off.
//!
//! The pool never decides anything: a tunnel is decided, resolved and vetted as every
//! tunnel is (`crate::conn::establish`) before the pool is asked, and the key holds what
//! that decision found. By job: this file is the pool; `conn.rs` the pooled connection
//! (its HTTP sender, what it offered, where it goes).

pub(crate) mod conn;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use policy::{Pin, Target};
use tokio_util::sync::CancellationToken;

use crate::authorities::Live;
use crate::route::{Route, Router, UpstreamStream, Via};
use crate::vocab::Protocol;
pub(crate) use conn::{Conn, Http, Offer};

/// The caps of a pool (`[limits]`, `[timeouts]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Idle connections kept in all (`[limits] idle_upstream_connections`).
    pub(crate) total: usize,
    /// Idle connections kept per authority (`[limits] authority_idle_upstream_connections`).
    pub(crate) per_authority: usize,
    /// How long a connection stays idle before it is closed (`[timeouts] idle_upstream`).
    pub(crate) idle: Duration,
}

impl Caps {
    /// Whether connections are kept at all.
    pub(crate) fn on(&self) -> bool {
        self.total > 0 && self.per_authority > 0
    }
}

/// What a pooled connection must say about itself.
pub(crate) trait Reusable: Send + 'static {
    /// Whether it can carry a new tunnel's requests now: open, no request in flight, never
    /// switched to another protocol.
    fn alive(&self) -> bool;
    /// Cancelled when the connection ends (the origin closed it, or an error).
    fn ended(&self) -> CancellationToken;
}

/// Where a pooled connection may be used again: only for this authority generation, this
/// target, these vetted addresses and this route.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    generation: u64,
    target: Target,
    pin: Vec<IpAddr>,
    route: Route,
}

/// A terminated tunnel's claim on the pool: the key its connection is kept under when the
/// tunnel ends, and its authority's stop signal (cancelled when it is revoked, when a
/// reload re-creates it, and when the mediator drains), which ends the connection's stay.
#[derive(Debug, Clone)]
pub(crate) struct Ticket {
    key: Key,
    pin: Pin,
    stop: CancellationToken,
}

impl Ticket {
    /// The ticket of a tunnel of `live` to `target`, vetted as `pin`, taking `route`.
    pub(crate) fn new(live: &Live, target: &Target, pin: &Pin, route: Route) -> Self {
        Self {
            key: Key {
                generation: live.generation,
                target: target.clone(),
                pin: pin.addrs().to_vec(),
                route,
            },
            pin: pin.clone(),
            stop: live.stop_signal(),
        }
    }

    /// The vetted addresses (a new connection for the tunnel goes to one of them).
    pub(crate) fn pin(&self) -> &Pin {
        &self.pin
    }

    /// The same ticket for a connection that took `route`.
    #[must_use]
    pub(crate) fn routed(mut self, route: Route) -> Self {
        self.key.route = route;
        self
    }

    /// Whether its authority was revoked or re-created since (or the mediator drains).
    fn void(&self) -> bool {
        self.stop.is_cancelled()
    }
}

/// One idle connection.
#[derive(Debug)]
struct Idle<C> {
    id: u64,
    conn: C,
    since: Instant,
    /// Cancelled when it is taken or dropped from the pool: its watch ends.
    gone: CancellationToken,
}

#[derive(Debug)]
struct Inner<C> {
    /// The idle connections by key, oldest first (taken from the back).
    idle: HashMap<Key, Vec<Idle<C>>>,
    /// Idle connections per authority generation.
    held: HashMap<u64, usize>,
    total: usize,
    next: u64,
}

/// The idle upstream connections of terminated tunnels (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Pool<C> {
    caps: Caps,
    inner: Mutex<Inner<C>>,
}

impl<C: Reusable> Pool<C> {
    /// An empty pool with these caps.
    pub(crate) fn new(caps: Caps) -> Self {
        Self {
            caps,
            inner: Mutex::new(Inner {
                idle: HashMap::new(),
                held: HashMap::new(),
                total: 0,
                next: 0,
            }),
        }
    }

    /// Its caps.
    pub(crate) fn caps(&self) -> Caps {
        self.caps
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<C>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Idle connections held now, in all.
    pub(crate) fn total(&self) -> usize {
        self.lock().total
    }

    /// Idle connections held now, in all and for the authority generation of `ticket`.
    #[cfg(test)]
    pub(crate) fn held(&self, ticket: &Ticket) -> (usize, usize) {
        let inner = self.lock();
        let mine = inner.held.get(&ticket.key.generation).copied();
        (inner.total, mine.unwrap_or(0))
    }

    /// The most recently kept connection under `ticket`'s key that is alive; the dead
    /// ones met on the way are dropped (closed).
    pub(crate) fn take(&self, ticket: &Ticket) -> Option<C> {
        if ticket.void() {
            return None;
        }
        let mut dead = Vec::new();
        let found = {
            let mut inner = self.lock();
            let mut found = None;
            while let Some(idle) = inner.pop(&ticket.key) {
                idle.gone.cancel();
                if idle.conn.alive() {
                    found = Some(idle.conn);
                    break;
                }
                dead.push(idle.conn);
            }
            found
        };
        drop(dead);
        found
    }

    /// Keeps `conn` for later tunnels under `ticket`'s key when it is alive and its
    /// authority is live, making room under the caps; otherwise drops (closes) it.
    /// Returns whether it was kept.
    pub(crate) fn give(self: &Arc<Self>, ticket: &Ticket, conn: C) -> bool {
        if !self.caps.on() || ticket.void() || !conn.alive() {
            return false;
        }
        let generation = ticket.key.generation;
        let gone = CancellationToken::new();
        let ended = conn.ended();
        let (id, evicted) = {
            let mut inner = self.lock();
            let mut evicted = Vec::new();
            if inner.held.get(&generation).copied().unwrap_or(0) >= self.caps.per_authority {
                evicted.extend(inner.evict_oldest(generation));
            }
            if inner.total >= self.caps.total
                && let Some(largest) = inner.largest(generation)
            {
                evicted.extend(inner.evict_oldest(largest));
            }
            let id = inner.next;
            inner.next += 1;
            inner.push(
                ticket.key.clone(),
                Idle {
                    id,
                    conn,
                    since: Instant::now(),
                    gone: gone.clone(),
                },
            );
            (id, evicted)
        };
        drop(evicted);
        let pool = Arc::downgrade(self);
        let (key, idle) = (ticket.key.clone(), self.caps.idle);
        let stop = ticket.stop.clone();
        // The connection's stay: it ends when it is taken, or closed here when it has been
        // idle too long, the origin closed it, or its authority is gone.
        tokio::spawn(async move {
            tokio::select! {
                () = gone.cancelled() => return,
                () = tokio::time::sleep(idle) => {}
                () = ended.cancelled() => {}
                () = stop.cancelled() => {}
            }
            if let Some(pool) = pool.upgrade() {
                let dropped = pool.lock().remove(&key, id);
                drop(dropped);
            }
        });
        true
    }
}

impl<C> Inner<C> {
    fn push(&mut self, key: Key, idle: Idle<C>) {
        *self.held.entry(key.generation).or_insert(0) += 1;
        self.total += 1;
        self.idle.entry(key).or_default().push(idle);
    }

    fn counted_out(&mut self, generation: u64) {
        self.total -= 1;
        if let Some(n) = self.held.get_mut(&generation) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&generation);
            }
        }
    }

    /// The newest idle connection under `key`.
    fn pop(&mut self, key: &Key) -> Option<Idle<C>> {
        let list = self.idle.get_mut(key)?;
        let idle = list.pop();
        if list.is_empty() {
            self.idle.remove(key);
        }
        if idle.is_some() {
            self.counted_out(key.generation);
        }
        idle
    }

    /// The idle connection `id` under `key`, if it is still there.
    fn remove(&mut self, key: &Key, id: u64) -> Option<C> {
        let list = self.idle.get_mut(key)?;
        let at = list.iter().position(|i| i.id == id)?;
        let idle = list.remove(at);
        if list.is_empty() {
            self.idle.remove(key);
        }
        self.counted_out(key.generation);
        Some(idle.conn)
    }

    /// Drops the oldest idle connection of `generation` (its watch ends).
    fn evict_oldest(&mut self, generation: u64) -> Option<C> {
        let (key, id) = self
            .idle
            .iter()
            .filter(|(k, _)| k.generation == generation)
            .filter_map(|(k, list)| list.first().map(|i| (k, i)))
            .min_by_key(|(_, i)| i.since)
            .map(|(k, i)| (k.clone(), i.id))?;
        let list = self.idle.get_mut(&key)?;
        let at = list.iter().position(|i| i.id == id)?;
        let idle = list.remove(at);
        idle.gone.cancel();
        if list.is_empty() {
            self.idle.remove(&key);
        }
        self.counted_out(generation);
        Some(idle.conn)
    }

    /// The generation holding the most idle connections (`mine` on a tie).
    fn largest(&self, mine: u64) -> Option<u64> {
        let own = self.held.get(&mine).copied().unwrap_or(0);
        self.held
            .iter()
            .map(|(g, n)| (*g, *n))
            .filter(|(g, n)| *n > own || (*g == mine && *n > 0))
            .max_by_key(|(g, n)| (*n, *g == mine))
            .map(|(g, _)| g)
    }
}

/// The upstream leg an allowed connection got: a new stream, or (a terminated tunnel)
/// an idle connection of the pool.
#[derive(Debug)]
pub(crate) enum Leg {
    /// A new connection; with the ticket it goes back to the pool under when it is a
    /// terminated tunnel's (and reuse is on). Boxed: every connection's task holds its
    /// leg, and most are not terminated.
    Fresh(UpstreamStream, Option<Box<Ticket>>),
    /// An idle connection of the pool, with the ticket it was taken with.
    Reused(Box<Lease>),
}

/// A pooled connection taken for one tunnel.
#[derive(Debug)]
pub(crate) struct Lease {
    /// Its key and the authority's signals.
    pub(crate) ticket: Ticket,
    /// The connection.
    pub(crate) conn: Conn,
}

impl Leg {
    /// The local address of the connection (SOCKS5 BND.ADDR).
    ///
    /// # Errors
    /// The socket's error; a reused connection whose address was not known.
    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Self::Fresh(stream, _) => stream.local_addr(),
            Self::Reused(lease) => lease.conn.local.ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotConnected, "no local address")
            }),
        }
    }

    /// The new stream, if that is what it is.
    pub(crate) fn stream(&self) -> Option<&UpstreamStream> {
        match self {
            Self::Fresh(stream, _) => Some(stream),
            Self::Reused(_) => None,
        }
    }

    /// The new stream, if that is what it is (a relay needs one).
    pub(crate) fn into_stream(self) -> Option<UpstreamStream> {
        match self {
            Self::Fresh(stream, _) => Some(stream),
            Self::Reused(_) => None,
        }
    }
}

/// What the pool has for a tunnel about to connect.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// Nothing: not a terminated tunnel, or reuse is off.
    Off,
    /// No idle connection: connect, and keep the ticket for the end of the tunnel.
    Miss(Ticket),
    /// An idle connection, taken.
    Hit(Box<Lease>),
}

/// Looks in `pool` for an allowed `protocol` connection of `live` to `target`, vetted as
/// `pin`: only a tunnel whose TLS the grant terminates is served from it, and only under
/// the route `router` would take now.
pub(crate) async fn lookup(
    pool: &Pool<Conn>,
    router: &Router,
    live: &Live,
    protocol: Protocol,
    target: &Target,
    pin: &Pin,
) -> Lookup {
    if !pool.caps().on() || protocol.is_forwarding() || !live.authority.grant.terminates_tls(target)
    {
        return Lookup::Off;
    }
    let Some(route) = router.first_route(Via::Tunnel, target).await else {
        return Lookup::Off;
    };
    let ticket = Ticket::new(live, target, pin, route);
    match pool.take(&ticket) {
        Some(conn) => Lookup::Hit(Box::new(Lease { ticket, conn })),
        None => Lookup::Miss(ticket),
    }
}

#[cfg(test)]
mod tests;
