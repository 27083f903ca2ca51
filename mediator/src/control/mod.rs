//! The control plane: adding and revoking authorities at run time (admin API and config
//! reload). There is no way to edit a grant: an authority is added whole or revoked whole,
//! and a changed one is revoked and added again under a new generation.
//!
//! Revoking removes the authority from the live set (no new decision is taken under its
//! grant, even on connections already open), stops its listener and removes its socket
//! file at once, and closes its live connections after `timeouts.revoke_grace`.
//!
//! Control-plane events are logged with the tracing target `mediator::control` (shown by
//! the binary at level `info`).

mod apply;
pub(crate) mod body;
mod create;
mod kept;
pub(crate) mod registry;
mod reload;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use policy::config::Authority;

use crate::audit::Auditor;
use crate::authorities::{Birth, Live, Origin};
use crate::conn::accept::serve_authority;
use crate::error::Error;
use crate::shared::Shared;
use crate::socket_file;

pub(crate) use create::{CreateError, Created, Deleted};
use registry::{RegistryMetrics, Store};
use reload::Baseline;
pub use reload::{ReloadRefused, ReloadReport};

/// Log target of control-plane events.
pub(crate) const TARGET: &str = "mediator::control";

/// How many locks registry writes are spread over (by the name's hash).
const WRITE_STRIPES: usize = 64;

/// The control plane of one running mediator.
#[derive(Debug)]
pub(crate) struct Control {
    shared: Arc<Shared>,
    socket_dir: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    revoke_grace: Duration,
    global_deny: Mutex<Vec<policy::DenyEntry>>,
    /// Fingerprints of the authorities that came from the configuration file as last
    /// applied, and of its other sections as running (from start: a reload does not apply
    /// them): the baseline a reload diffs against.
    baseline: Mutex<Option<Baseline>>,
    /// Serialises changes of the live set.
    op: Mutex<()>,
    /// Where authorities created through the admin API are kept (design section 17).
    store: Arc<dyn Store>,
    /// The registry's metrics.
    registry_metrics: RegistryMetrics,
    /// Serialises registry writes (create, delete, expire) of one name with the change
    /// they make: one lock per stripe of names (by hash), so that writes of different
    /// names wait for no other.
    writes: Box<[tokio::sync::Mutex<()>]>,
    /// The stored records applied to the live set, by name (a generated token's hash
    /// included), so that a reload that changes the global deny list can re-create them
    /// under it (the global list applies to every authority), and a change seen twice is
    /// applied once.
    stored: Mutex<HashMap<String, kept::Kept>>,
    /// etcd: the revision at which each name was last removed, so that a create older than
    /// the removal, seen late, is not applied.
    tombstones: Mutex<HashMap<String, u64>>,
    /// The names of the configuration file's authorities placed on other nodes: not
    /// served here, but names of the file all the same (the admin API may not take one).
    placed_elsewhere: Mutex<HashSet<String>>,
    /// Set while a whole view of the registry is applied (a start's load, a re-list):
    /// each authority it adds is logged at debug level, the view's count at info.
    bulk: std::sync::atomic::AtomicBool,
    /// Itself, for the timers it starts (`ttl_s`).
    me: Weak<Self>,
    /// Writes the audit records of changes (design section 21).
    audit: Auditor,
    /// Names whose registry write this mediator has under way (create, delete, expiry):
    /// their change, seen again by the registry's watch, is audited by the write, not as
    /// another writer's.
    writing: Mutex<HashSet<String>>,
}

/// What a [`Control`] is built from, besides the shared state.
#[derive(Debug)]
pub(crate) struct Setup {
    /// `[listen] socket_dir`.
    pub(crate) socket_dir: Option<PathBuf>,
    /// The shared TCP listener's address.
    pub(crate) tcp: Option<SocketAddr>,
    /// `[timeouts] revoke_grace`.
    pub(crate) revoke_grace: Duration,
    /// `[global] deny`.
    pub(crate) global_deny: Vec<policy::DenyEntry>,
    /// The registry.
    pub(crate) store: Arc<dyn Store>,
    /// Its metrics.
    pub(crate) registry_metrics: RegistryMetrics,
    /// The audit records' writer.
    pub(crate) audit: Auditor,
}

impl Control {
    /// A control plane for `shared`.
    pub(crate) fn new(shared: Arc<Shared>, setup: Setup) -> Arc<Self> {
        let Setup {
            socket_dir,
            tcp,
            revoke_grace,
            global_deny,
            store,
            registry_metrics,
            audit,
        } = setup;
        Arc::new_cyclic(|me| Self {
            shared,
            socket_dir,
            tcp,
            revoke_grace,
            global_deny: Mutex::new(global_deny),
            baseline: Mutex::new(None),
            op: Mutex::new(()),
            store,
            registry_metrics,
            writes: (0..WRITE_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            stored: Mutex::new(HashMap::new()),
            tombstones: Mutex::new(HashMap::new()),
            placed_elsewhere: Mutex::new(HashSet::new()),
            bulk: std::sync::atomic::AtomicBool::new(false),
            me: me.clone(),
            audit,
            writing: Mutex::new(HashSet::new()),
        })
    }

    /// The audit records' writer.
    pub(crate) fn audit(&self) -> &Auditor {
        &self.audit
    }

    /// `[global] deny` as it applies now (every grant holds it).
    pub(crate) fn global_deny(&self) -> Vec<policy::DenyEntry> {
        self.global_deny
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The registry's backend.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Waits for the lock of registry writes of `name` (see `writes`).
    async fn write_lock(&self, name: &str) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(name);
        // In range: a remainder of the stripes' count, which is not zero.
        let stripe = usize::try_from(hash % WRITE_STRIPES as u64).unwrap_or_default();
        self.writes[stripe].lock().await
    }

    /// Records the names of the configuration file's authorities placed on other nodes
    /// (at start and at each reload): the admin API may not create an authority of one.
    pub(crate) fn set_placed_elsewhere(&self, names: &[String]) {
        *self
            .placed_elsewhere
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = names.iter().cloned().collect();
    }

    /// The shared state.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The shared TCP listener's address, if any.
    pub(crate) fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// The revoke grace.
    pub(crate) fn revoke_grace(&self) -> Duration {
        self.revoke_grace
    }

    /// Adds `authority` from the configuration file: binds its socket (when a
    /// `socket_dir` is configured), makes it live and starts accepting. Must run inside the
    /// tokio runtime.
    ///
    /// # Errors
    /// [`CreateError::Duplicate`] when the name is live, [`CreateError::Listen`] when the
    /// socket cannot be created (nothing is left behind).
    pub(crate) fn add(&self, authority: Authority) -> Result<Arc<Live>, CreateError> {
        let _op = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        self.add_locked(authority, self.config_birth(), None)
    }

    /// The birth of an authority of the configuration file: a fresh generation, now.
    fn config_birth(&self) -> Birth {
        Birth {
            generation: self.shared.authorities.next_generation(),
            origin: Origin::Config,
            created: None,
            expires_at: None,
        }
    }

    /// Makes `authority` live; with `replacing`, in the place of that entry of the same
    /// name (which stays in the live set until the new one takes its place).
    fn add_locked(
        &self,
        authority: Authority,
        birth: Birth,
        replacing: Option<&Arc<Live>>,
    ) -> Result<Arc<Live>, CreateError> {
        let name = authority.grant.name().to_owned();
        let current = self.shared.authorities.get(&name);
        let expected = replacing.map(Arc::as_ptr);
        if current.as_ref().map(Arc::as_ptr) != expected {
            return Err(CreateError::Duplicate(name));
        }
        let (listener, socket) = match &self.socket_dir {
            Some(dir) => {
                let (l, p) =
                    socket_file::bind_authority(dir, &authority).map_err(CreateError::Listen)?;
                // Taken off this runtime: a serving thread registers it with its own.
                match l.into_std() {
                    Ok(l) => (Some(l), Some(p)),
                    Err(e) => {
                        let _ = std::fs::remove_file(&p);
                        return Err(CreateError::Listen(Error::Io(e)));
                    }
                }
            }
            None => (None, None),
        };
        let (generation, origin) = (birth.generation, birth.origin);
        let live = Arc::new(Live::new(
            Arc::new(authority),
            birth,
            socket.clone(),
            &self.shared.signals,
            self.shared.limiter.in_force(),
        ));
        // The successor is known before the swap: a connection of the old entry that asks
        // after the swap finds it at once.
        if let Some(old) = replacing
            && same_channel(&old.authority, &live.authority)
        {
            self.shared.authorities.succeed(&old.authority, &live);
        }
        let installed = match replacing {
            Some(old) => self.shared.authorities.swap(old, Arc::clone(&live)),
            None => self.shared.authorities.insert(Arc::clone(&live)),
        };
        if let Err(live) = installed {
            // Unreachable while `op` is held, but never leave a socket behind.
            remove_socket(live.socket.as_ref());
            return Err(CreateError::Duplicate(name));
        }
        self.shared.metrics.prime(&name);
        self.shared
            .metrics
            .set_authorities(self.shared.authorities.len());
        if let Some(l) = listener {
            // Served on a serving thread: the listener is registered with that thread's
            // runtime there.
            let (for_live, shared) = (Arc::clone(&live), Arc::clone(&self.shared));
            self.shared.serving.spawn_listener(async move {
                match tokio::net::UnixListener::from_std(l) {
                    Ok(l) => serve_authority(l, for_live, shared).await,
                    Err(e) => {
                        tracing::error!("the socket of {} cannot be served: {e}", for_live.name())
                    }
                }
            });
        }
        let added = || {
            format!(
                "authority {name:?} added (generation {generation}, from {}, grant digest {}, socket {})",
                match origin {
                    Origin::Config => "config",
                    Origin::Api => "admin API",
                },
                live.digest,
                socket
                    .as_ref()
                    .map_or_else(|| "-".into(), |p| p.display().to_string())
            )
        };
        if self.bulk.load(std::sync::atomic::Ordering::Relaxed) {
            tracing::debug!(target: TARGET, "{}", added());
        } else {
            tracing::info!(target: TARGET, "{}", added());
        }
        Ok(live)
    }

    /// Revokes the authority named `name`: out of the live set, listener stopped and socket
    /// file removed at once, live connections closed after the revoke grace. Returns the
    /// revoked entry, or `None` when no such authority is live.
    pub(crate) fn revoke(&self, name: &str) -> Option<Arc<Live>> {
        let _op = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        self.revoke_locked(name, "revoked")
    }

    fn revoke_locked(&self, name: &str, why: &str) -> Option<Arc<Live>> {
        let live = self.withdraw_locked(name)?;
        self.close_after_grace(&live, why, false);
        Some(live)
    }

    /// Takes the authority named `name` out of the live set: no new decision under its
    /// grant, listener stopped, socket file removed. Its connections are left to
    /// [`Self::close_after_grace`].
    fn withdraw_locked(&self, name: &str) -> Option<Arc<Live>> {
        let live = self.shared.authorities.remove(name)?;
        live.stop_listener();
        remove_socket(live.socket.as_ref());
        self.shared
            .metrics
            .set_authorities(self.shared.authorities.len());
        Some(live)
    }

    /// Closes the live connections of a withdrawn authority after the revoke grace (those
    /// that moved to a successor meanwhile are no longer its). `rejudged`: a reload
    /// replaced it, and its connections are being judged again under the new grant.
    fn close_after_grace(&self, live: &Arc<Live>, why: &str, rejudged: bool) {
        let grace = self.revoke_grace;
        // Weak: the connections hold their authority; with none left there is nothing to
        // cut, and holding it here would keep its metric series for the whole grace.
        let closing = Arc::downgrade(live);
        let (name, generation) = (live.name().to_owned(), live.generation);
        let (now, then) = if rejudged {
            (
                "live connections are judged again under the new grant; those it no longer allows are cut in",
                "those no longer allowed are cut",
            )
        } else {
            (
                "live connections close in",
                "its remaining connections are cut",
            )
        };
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if let Some(closing) = closing.upgrade() {
                closing.close_connections();
            }
            tracing::info!(
                target: TARGET,
                "authority {name:?} generation {generation}: revoke grace over; {then}"
            );
        });
        tracing::info!(
            target: TARGET,
            "authority {:?} {why} (generation {}); listener closed, {now} {} s",
            live.name(),
            live.generation,
            grace.as_secs()
        );
    }

    /// A reload's change of one authority: the old entry withdrawn, `authority` added in
    /// its place (new generation), and, when the channel is unchanged, registered as the
    /// old one's successor, so that each live connection of the old generation is judged
    /// again under the new grant (design section 5; `crate::conn::standing`): still
    /// allowed, it continues under the new generation; else it is cut after the grace.
    /// Returns the old generation (if one was live) and the outcome of the add.
    fn replace_locked(
        &self,
        name: &str,
        authority: Authority,
        birth: Birth,
        why: &str,
    ) -> (Option<u64>, Result<Arc<Live>, CreateError>) {
        // The old entry stays in the live set until the new one takes its place: a TCP
        // credential looked up meanwhile finds one or the other, never neither.
        let old = self.shared.authorities.get(name);
        if let Some(old) = &old {
            old.stop_listener();
            remove_socket(old.socket.as_ref());
        }
        let added = self.add_locked(authority, birth, old.as_ref());
        if let (Some(old), Err(_)) = (&old, &added) {
            // No successor: withdrawn, as a revoke would.
            if let Some(current) = self.shared.authorities.get(name)
                && Arc::ptr_eq(&current, old)
            {
                self.shared.authorities.remove(name);
            }
            self.shared
                .metrics
                .set_authorities(self.shared.authorities.len());
        }
        if let Some(old) = &old {
            // Before the grace can start: every connection judges itself again first
            // (one with no successor is cut when the grace ends, and says so).
            old.mark_replaced();
            self.close_after_grace(old, why, true);
        }
        (old.map(|l| l.generation), added)
    }
}

/// Whether two authorities of one name are reached the same way: the same socket settings
/// (a peer that could open the old socket could open the new one). The credential of the
/// TCP listener is compared per connection, by `crate::conn::standing`.
fn same_channel(old: &Authority, new: &Authority) -> bool {
    old.socket_mode == new.socket_mode
        && old.socket_uid == new.socket_uid
        && old.socket_gid == new.socket_gid
}

fn remove_socket(path: Option<&PathBuf>) {
    if let Some(path) = path
        && let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("cannot remove {}: {e}", path.display());
    }
}
