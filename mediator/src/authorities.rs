//! The live set of authorities. Grants are immutable: an authority is only ever added
//! whole or revoked whole (changing one is revoke + add, with a new *generation*). Each
//! live authority carries the signals that end its channel (its listener, at once) and its
//! connections (after the revoke grace), and a bounded ring of its recent denials.
//!
//! A connection keeps the `Arc<Authority>` it was attributed to; [`LiveSet::is_live`]
//! compares that exact grant (by identity, not by name) with the live one, so a connection
//! of a revoked authority can never be served by a later one of the same name, nor keep
//! getting new decisions from the old one. Only a reload that re-creates an authority
//! under a changed table, on an unchanged channel, names a *successor*
//! ([`LiveSet::succeed`]): its connections are then judged again under the successor's
//! grant (`crate::conn::standing`), and continue under it only if still allowed.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};

use policy::Reason;
use policy::config::Authority;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::decision_log::Peer;
use crate::limits::{AuthorityCounts, InForce};
use crate::members::{Joined, Key, Member, Members};
use crate::signal::Signals;
use crate::vocab::{ClientTlsEnd, Event, Protocol, TlsAlert, serialize_reason};

/// Denials kept per authority for `GET /v1/authorities/<name>/denials`.
pub(crate) const DENIAL_RING: usize = 256;

/// Where an authority came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Origin {
    /// The configuration file (at start or by a reload).
    Config,
    /// `POST /v1/authorities`.
    Api,
}

/// How a live authority came to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Birth {
    /// Its generation.
    pub(crate) generation: u64,
    /// Where it came from.
    pub(crate) origin: Origin,
    /// When it was created (RFC 3339), for a stored one; `None`: now.
    pub(crate) created: Option<String>,
    /// When it expires (RFC 3339), for one created with `ttl_s`.
    pub(crate) expires_at: Option<String>,
}

/// One recent denial of an authority, or a terminated tunnel of it whose client refused
/// the mediator's certificate (what the shim's run must hear of, design section 10).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DenialEntry {
    /// `decision`: a denial; `close`: a terminated tunnel whose client ended its handshake
    /// refusing the mediator's certificate (its `reason` is the tunnel's, `allowed`).
    pub(crate) event: Event,
    /// The decision id (as in the decision log); for a `close` entry, an id drawn when the
    /// tunnel closed (so that `since=` finds it after the entries before it), the tunnel's
    /// own being `tunnel_id`.
    pub(crate) id: u64,
    /// `close` entries: the tunnel's decision id (its close record's `id` in the log).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tunnel_id: Option<u64>,
    /// `close` entries: how the client ended the handshake (`rejected_certificate`,
    /// `closed_after_certificate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) client_tls: Option<ClientTlsEnd>,
    /// `close` entries: the alert the client sent, if it sent one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_alert: Option<TlsAlert>,
    /// RFC 3339 timestamp.
    pub(crate) ts: String,
    /// The protocol of the decision.
    pub(crate) protocol: Protocol,
    /// Canonical (or escaped raw) host.
    pub(crate) host: Option<String>,
    /// Port.
    pub(crate) port: Option<u16>,
    /// Reason (design section 4.3).
    #[serde(serialize_with = "serialize_reason")]
    pub(crate) reason: Reason,
    /// The rule that decided, if any.
    pub(crate) rule: Option<String>,
    /// Human detail.
    pub(crate) detail: String,
    /// What would make it work, as the client was told.
    pub(crate) hint: String,
    /// The operator's own words, as the client was told (design section 18).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
    /// The answer the client got: the HTTP status, or the SOCKS5 REP code.
    pub(crate) status: u16,
    /// The connection's peer, as in the decision log (the shim keeps its own run's).
    pub(crate) peer: Peer,
}

/// A bounded ring of denials; the oldest are dropped (and counted) when full.
#[derive(Debug, Default)]
pub(crate) struct DenialRing {
    entries: VecDeque<DenialEntry>,
    dropped: u64,
}

impl DenialRing {
    fn push(&mut self, e: DenialEntry) {
        if self.entries.len() == DENIAL_RING {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.push_back(e);
    }
}

/// Which denials to return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Since {
    /// Every denial kept.
    All,
    /// Denials with a decision id greater than this.
    Id(u64),
    /// Denials at or after this RFC 3339 instant.
    Time(std::time::SystemTime),
}

/// A live authority.
#[derive(Debug)]
pub(crate) struct Live {
    /// The frozen authority (grant, token hash, socket settings, watchdog).
    pub(crate) authority: Arc<Authority>,
    /// Generation number, unique within this process; a re-created authority gets a new one.
    pub(crate) generation: u64,
    /// Where it came from.
    pub(crate) origin: Origin,
    /// SHA-256 (hex) of the grant as held (see [`grant_digest`]).
    pub(crate) digest: String,
    /// When it was created (RFC 3339): added, or, for a stored authority, created through
    /// the admin API (it keeps that time across restarts).
    pub(crate) created: String,
    /// When it is revoked by itself (RFC 3339), for one created with `ttl_s`.
    pub(crate) expires_at: Option<String>,
    /// Its Unix socket, if it has one.
    pub(crate) socket: Option<PathBuf>,
    /// Its open connections and connect-rate bucket (design section 13).
    pub(crate) counts: Arc<AuthorityCounts>,
    /// Cancelled when the authority's listener must stop (revocation), or the mediator
    /// drains.
    stop: CancellationToken,
    /// Cancelled when the authority's live connections must close: revoke grace over, or
    /// shutdown grace over.
    closing: CancellationToken,
    /// Cancelled when a reload has re-created the authority (its successor is registered
    /// first): its connections are then judged again under the new grant.
    replaced: CancellationToken,
    /// Its allowed connections, told of `replaced` and `closing`.
    members: Arc<Members>,
    denials: Mutex<DenialRing>,
}

impl Live {
    /// A live authority whose signals are children of the mediator's `signals`.
    pub(crate) fn new(
        authority: Arc<Authority>,
        birth: Birth,
        socket: Option<PathBuf>,
        signals: &Signals,
        in_force: &InForce,
    ) -> Self {
        let Birth {
            generation,
            origin,
            created,
            expires_at,
        } = birth;
        let digest = grant_digest(&authority);
        let counts = Arc::new(AuthorityCounts::new(&authority.limits, in_force));
        let (replaced, closing) = (CancellationToken::new(), signals.closing.child_token());
        Self {
            authority,
            generation,
            origin,
            digest,
            created: created.unwrap_or_else(crate::decision_log::now_rfc3339),
            expires_at,
            counts,
            socket,
            stop: signals.draining.child_token(),
            members: Arc::new(Members::new(replaced.clone(), closing.clone())),
            closing,
            replaced,
            denials: Mutex::new(DenialRing::default()),
        }
    }

    /// The name.
    pub(crate) fn name(&self) -> &str {
        self.authority.grant.name()
    }

    /// Cancelled when the authority's listener must stop (revocation or draining).
    pub(crate) fn stop_signal(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Adds an allowed connection to the authority's members (`crate::members`): it is
    /// told when a reload replaces the authority and when its connections must close.
    pub(crate) fn join(&self, member: Weak<dyn Member>) -> Joined {
        self.members.join(member)
    }

    /// Removes the member at `key`.
    pub(crate) fn leave(&self, key: Key) {
        self.members.leave(key);
    }

    /// Says that a successor is registered: the connections judge themselves again.
    pub(crate) fn mark_replaced(&self) {
        self.replaced.cancel();
    }

    /// Stops the listener.
    pub(crate) fn stop_listener(&self) {
        self.stop.cancel();
    }

    /// Closes every live connection.
    pub(crate) fn close_connections(&self) {
        self.closing.cancel();
    }

    /// Records a denial.
    pub(crate) fn record_denial(&self, e: DenialEntry) {
        self.denials
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e);
    }

    /// The denials kept that match `since`, oldest first, and how many were dropped from
    /// the ring since the authority was added.
    pub(crate) fn denials(&self, since: &Since) -> (Vec<DenialEntry>, u64) {
        let ring = self.denials.lock().unwrap_or_else(PoisonError::into_inner);
        let keep = |e: &&DenialEntry| match since {
            Since::All => true,
            Since::Id(id) => e.id > *id,
            Since::Time(t) => humantime::parse_rfc3339(&e.ts).is_ok_and(|ts| ts >= *t),
        };
        (
            ring.entries.iter().filter(keep).cloned().collect(),
            ring.dropped,
        )
    }
}

/// A stable digest of what an authority's grant lets it do, as the mediator holds it:
/// allow and deny entries (global ones included), `allow_private`, `sni_check`, the token
/// hash, the watchdog and the socket settings, and the rest of its reach (operator
/// reasons, terminated hosts, request rules, where its credentials' secrets come from and
/// go, its limits: `policy::review::Reach`), so that an audit record's digest changes
/// with any of them. SHA-256, hex.
pub(crate) fn grant_digest(a: &Authority) -> String {
    let description = serde_json::json!({
        "reach": policy::review::Reach::of(a, policy::review::Sources::Shown),
        "name": a.grant.name(),
        "allow": a.grant.allow_entries().collect::<Vec<_>>(),
        "deny": a.grant.deny_entries().collect::<Vec<_>>(),
        "allow_private": a.grant.allow_private().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "sni_check": a.grant.sni_check(),
        "token_sha256": a.token_sha256.map(hex::encode),
        "watchdog": a.watchdog.as_ref().map_or_else(String::new, ToString::to_string),
        "socket_mode": a.socket_mode,
        "socket_uid": a.socket_uid,
        "socket_gid": a.socket_gid,
    });
    hex::encode(Sha256::digest(description.to_string().as_bytes()))
}

/// The live authorities by name.
#[derive(Debug, Default)]
pub(crate) struct LiveSet {
    map: RwLock<HashMap<String, Arc<Live>>>,
    generations: AtomicU64,
    /// Whether the registry's view cannot be vouched for (design section 17): decisions
    /// under the authorities it holds are then refused (`registry_unavailable`).
    registry_stale: AtomicBool,
    /// Reload replacements: (a replaced authority, the entry that replaced it). Weak both
    /// ways, so an entry never keeps a grant alive, and one whose old grant is gone (no
    /// connection holds it) is pruned; a live `Weak` also pins the allocation, so identity
    /// comparisons cannot be fooled by a reused address.
    successors: Mutex<Vec<(Weak<Authority>, Weak<Live>)>>,
    /// Entries taken out of the map (revoked, or replaced by a reload) while something
    /// (a connection, the grace's cut) still holds them: their connections are still
    /// theirs until they close. Pruned when no longer held.
    withdrawn: Mutex<Vec<Weak<Live>>>,
}

impl LiveSet {
    /// An empty set whose generations are `base + 1`, `base + 2`, ... (`base` is the
    /// run's start number in the high bits, so that no two runs share a generation).
    pub(crate) fn starting_at(base: u64) -> Self {
        Self {
            generations: AtomicU64::new(base),
            ..Self::default()
        }
    }

    /// The next generation number.
    pub(crate) fn next_generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Says whether the registry's view is stale.
    pub(crate) fn set_registry_stale(&self, stale: bool) {
        self.registry_stale.store(stale, Ordering::Release);
    }

    /// Whether the registry's view is stale: decisions under its authorities are refused.
    pub(crate) fn registry_stale(&self) -> bool {
        self.registry_stale.load(Ordering::Acquire)
    }

    /// The live authority named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Live>> {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// The live entry of exactly this authority (same grant object), if it is still live.
    pub(crate) fn live_of(&self, authority: &Authority) -> Option<Arc<Live>> {
        self.get(authority.grant.name())
            .filter(|l| std::ptr::eq(Arc::as_ptr(&l.authority), authority))
    }

    /// Whether exactly this authority (not merely one of the same name) is live.
    pub(crate) fn is_live(&self, authority: &Authority) -> bool {
        self.live_of(authority).is_some()
    }

    /// Registers `new` as the successor of the replaced `old` (a reload re-created it on
    /// an unchanged channel). Prunes entries whose old grant no connection holds.
    ///
    /// Entries that named `old` as their successor are pointed at `new`: the list only
    /// holds `Weak` references, so once nothing holds `old`'s entry a chain through it
    /// (older -> old -> new) would break and a connection of the older generation would
    /// find no authority at all. Every entry names the newest successor instead.
    pub(crate) fn succeed(&self, old: &Arc<Authority>, new: &Arc<Live>) {
        let mut list = self
            .successors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        list.retain(|(a, _)| a.strong_count() > 0);
        for (_, next) in list.iter_mut() {
            if next
                .upgrade()
                .is_some_and(|live| Arc::ptr_eq(&live.authority, old))
            {
                *next = Arc::downgrade(new);
            }
        }
        list.push((Arc::downgrade(old), Arc::downgrade(new)));
    }

    /// The live entry `authority` is now served under: its own while it is live, else the
    /// one that (through one reload or several) replaced it. `None` for an authority that
    /// was revoked (not replaced), or whose successor was revoked in turn.
    pub(crate) fn current_of(&self, authority: &Arc<Authority>) -> Option<Arc<Live>> {
        // The common case, on every decision: still live; no successor lock taken.
        if let Some(live) = self.live_of(authority) {
            return Some(live);
        }
        let list = self
            .successors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut current = Arc::clone(authority);
        // Each step follows one replacement; a chain is never longer than the list.
        for _ in 0..=list.len() {
            if let Some(live) = self.live_of(&current) {
                return Some(live);
            }
            let next = list
                .iter()
                .find(|(a, _)| a.as_ptr() == Arc::as_ptr(&current))
                .and_then(|(_, l)| l.upgrade())?;
            current = Arc::clone(&next.authority);
        }
        None
    }

    /// Every live authority, by name.
    pub(crate) fn list(&self) -> Vec<Arc<Live>> {
        let mut all: Vec<Arc<Live>> = self
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        all
    }

    /// The client connections each authority name holds, withdrawn generations that still
    /// hold some included (a revoked authority's connections until its grace cuts them, a
    /// replaced one's not yet judged again), by name.
    pub(crate) fn open_by_name(&self) -> Vec<(String, u32)> {
        let mut withdrawn = self
            .withdrawn
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        withdrawn.retain(|w| w.strong_count() > 0);
        let held = withdrawn.iter().filter_map(Weak::upgrade);
        let mut open: HashMap<String, u32> = HashMap::new();
        for live in self.list().into_iter().chain(held) {
            *open.entry(live.name().to_owned()).or_default() += live.counts.open();
        }
        open.into_iter().collect()
    }

    /// Keeps `live`, just taken out of the map, for [`Self::open_by_name`].
    fn withdrew(&self, live: &Arc<Live>) {
        let mut withdrawn = self
            .withdrawn
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        withdrawn.retain(|w| w.strong_count() > 0);
        withdrawn.push(Arc::downgrade(live));
    }

    /// Number of live authorities.
    pub(crate) fn len(&self) -> usize {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Adds `live`; gives it back when the name is taken.
    ///
    /// # Errors
    /// The entry itself, when an authority of that name is live.
    pub(crate) fn insert(&self, live: Arc<Live>) -> Result<(), Arc<Live>> {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.contains_key(live.name()) {
            return Err(live);
        }
        map.insert(live.name().to_owned(), live);
        Ok(())
    }

    /// Puts `new` in the place of `old` (same name) in one step, so that no lookup in
    /// between finds neither (a reload's replacement is never a moment of
    /// `unknown_authority`). Refused (`Err(new)`) when the name's entry is not `old`.
    pub(crate) fn swap(&self, old: &Arc<Live>, new: Arc<Live>) -> Result<(), Arc<Live>> {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        match map.get(new.name()) {
            Some(current) if Arc::ptr_eq(current, old) => {
                map.insert(new.name().to_owned(), new);
                drop(map);
                self.withdrew(old);
                Ok(())
            }
            _ => Err(new),
        }
    }

    /// Removes and returns the authority named `name`.
    pub(crate) fn remove(&self, name: &str) -> Option<Arc<Live>> {
        let removed = self
            .map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name)?;
        self.withdrew(&removed);
        Some(removed)
    }
}

#[cfg(test)]
#[path = "authorities_tests.rs"]
mod tests;
