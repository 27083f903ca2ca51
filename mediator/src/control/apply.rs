//! The one way a stored authority comes and goes (design section 17): an admin create or
//! delete, a record loaded at start, a change an etcd watch saw, and a `ttl_s` expiry all
//! end here, so each is applied alike: validated under this mediator's `[global]` deny
//! list, never over a name of the configuration file, at most once per generation.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::SystemTime;

use policy::config::{Authority, FieldError, RegistryBackend};

use super::kept::Kept;
use super::registry::{Change, ErrorKind, Loaded, Op, RegistryError, Rejected, Stored};
use super::{Control, CreateError, TARGET};
use crate::audit::{Action, Actor, AuditRecord, AuditResult, AuthorityChange};
use crate::authorities::{Birth, Live, Origin};

impl Control {
    /// Loads every stored authority (at start, before `ready`): expired ones are dropped,
    /// the others applied; what cannot be read or applied is named and counted. Returns
    /// the view's revision (etcd), to follow from.
    ///
    /// # Errors
    /// [`RegistryError`] when the store cannot be read at all.
    pub(crate) async fn load_registry(&self) -> Result<i64, RegistryError> {
        let loaded = match self.store.load().await {
            Ok(l) => l,
            Err(e) => {
                self.registry_metrics.operation(Op::Load, "error");
                return Err(e);
            }
        };
        let revision = loaded.revision;
        self.registry_metrics.set_revision(revision);
        self.apply_snapshot(loaded, Op::Load);
        Ok(revision)
    }

    /// How many stored authorities are applied.
    pub(crate) fn stored_count(&self) -> usize {
        self.stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Validates a stored record's table as an authority, under the current `[global]`
    /// deny list, exactly as `POST /v1/authorities` does.
    pub(super) fn authority_of(&self, stored: &Stored) -> Result<Authority, Vec<FieldError>> {
        let text = super::create::table_text(&stored.record.authority)?;
        let global = self
            .global_deny
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut authority = policy::config::parse_authority(&text, &global)?;
        crate::credential::load_secrets(&mut authority)
            .map_err(super::create::credential_fields)?;
        Ok(authority)
    }

    /// Applies one stored record to the live set: added, or, when the record of that
    /// name applied before has an older generation (it was changed in place by another
    /// writer), put in its place like a changed `[[authority]]` on reload. Returns the
    /// live entry, or `None` when there is nothing to do (this generation is applied, or
    /// it is older than what was applied or removed since).
    ///
    /// # Errors
    /// [`CreateError::Invalid`] (not an authority under this configuration),
    /// [`CreateError::Duplicate`] (a name of the configuration file),
    /// [`CreateError::Listen`] (its socket cannot be made).
    pub(super) fn apply_put(&self, stored: Stored) -> Result<Option<Arc<Live>>, CreateError> {
        let authority = self.authority_of(&stored).map_err(CreateError::Invalid)?;
        let name = stored.record.name.clone();
        let generation = stored.generation;
        let _op = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        let known = self
            .stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&name)
            .map(|s| s.generation);
        let removed = self
            .tombstones
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&name)
            .copied();
        if known.is_some_and(|g| g >= generation) || removed.is_some_and(|r| r >= generation) {
            return Ok(None);
        }
        let current = self.shared.authorities.get(&name);
        if current.as_ref().is_some_and(|l| l.origin == Origin::Config) {
            return Err(CreateError::Duplicate(name));
        }
        let birth = Birth {
            generation,
            origin: Origin::Api,
            created: Some(stored.record.created_at.clone()),
            expires_at: stored.record.expires_at.clone(),
        };
        let live = if current.is_some() {
            let (_, added) = self.replace_locked(
                &name,
                authority,
                birth,
                "replaced (its stored record was changed by another writer)",
            );
            added?
        } else {
            self.add_locked(authority, birth, None)?
        };
        let expires = stored.record.expires_at.clone();
        self.stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.clone(), Kept::of(&stored));
        if let Some(at) = expires {
            self.expire_at(&name, generation, &at);
        }
        Ok(Some(live))
    }

    /// Applies the removal of the record named `name`: the authority is revoked (an
    /// authority of the configuration file of that name is left alone). `revision`
    /// (etcd): the removal's revision; a record of a later generation is kept, and an
    /// older create seen late is not applied. Returns the revoked entry.
    pub(super) fn apply_delete(&self, name: &str, revision: Option<u64>) -> Option<Arc<Live>> {
        let _op = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stored = self.stored.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = revision {
            let mut tombstones = self
                .tombstones
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let t = tombstones.entry(name.to_owned()).or_insert(r);
            *t = (*t).max(r);
            if stored.get(name).is_some_and(|s| s.generation > r) {
                return None;
            }
        }
        stored.remove(name);
        drop(stored);
        let live = self.shared.authorities.get(name)?;
        if live.origin != Origin::Api {
            return None;
        }
        self.revoke_locked(name, "revoked")
    }

    /// Whether `stored` is placed on another node than this replica's (kept in the
    /// registry, not served here). A record whose placement cannot be read is not: it is
    /// refused as invalid when applied.
    fn placed_elsewhere(&self, stored: &Stored) -> bool {
        stored
            .record
            .placement()
            .is_ok_and(|p| !p.serves(self.store.node()))
    }

    /// Applies a whole view (start, or a re-list after a lost watch): records no longer in
    /// it are revoked, the others applied; problems are counted and named. Records placed
    /// on other nodes (a local registry's, kept there) are named, not served.
    pub(super) fn apply_snapshot(&self, mut loaded: Loaded, op: Op) {
        let (elsewhere, here): (Vec<Stored>, Vec<Stored>) = std::mem::take(&mut loaded.records)
            .into_iter()
            .partition(|s| self.placed_elsewhere(s));
        loaded.records = here;
        if !elsewhere.is_empty() {
            let names: Vec<&str> = elsewhere.iter().map(|s| s.record.name.as_str()).collect();
            tracing::warn!(target: TARGET, "registry: {} stored authorities are placed on other nodes and are not served by this one (node {:?}): {}", names.len(), self.store.node(), names.join(", "));
            crate::say!(
                Warning,
                "mediator: registry: {} stored authorities are placed on other nodes and are not served by this one (node {:?}); they are kept: {}",
                names.len(),
                self.store.node(),
                names.join(", ")
            );
        }
        let present: HashSet<String> = loaded
            .records
            .iter()
            .map(|s| s.record.name.clone())
            .collect();
        let gone: Vec<(String, u64)> = self
            .stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(name, _)| !present.contains(*name))
            .map(|(name, s)| (name.clone(), s.generation))
            .collect();
        let revision = u64::try_from(loaded.revision).unwrap_or(0);
        for (name, generation) in gone {
            if revision == 0 || generation <= revision {
                self.apply_delete(&name, (revision > 0).then_some(revision));
                tracing::info!(target: TARGET, "registry: authority {name:?} is no longer stored; revoked");
            }
        }
        for rejected in loaded.rejected {
            self.report_rejected(&rejected);
        }
        let now = SystemTime::now();
        let count = loaded.records.len();
        self.bulk.store(true, Ordering::Relaxed);
        for stored in loaded.records {
            if stored.record.expired(now) {
                self.drop_expired(stored);
                continue;
            }
            self.apply_or_report(stored, op);
        }
        self.bulk.store(false, Ordering::Relaxed);
        tracing::info!(target: TARGET, "registry: a view of {count} stored authorities applied ({} served here)", self.stored_count());
    }

    /// Applies one change from a watch; what another writer changed is audited.
    pub(crate) fn apply_change(&self, change: Change) {
        match change {
            Change::Put(stored) => {
                if self.placed_elsewhere(&stored) {
                    // Never served here (a key of this node's range that says otherwise).
                    let (name, generation) = (stored.record.name.clone(), stored.generation);
                    self.apply_delete(&name, Some(generation));
                    self.report_rejected(&Rejected {
                        what: format!("the record of {name:?} (generation {generation})"),
                        why: format!(
                            "it is placed on another node than this replica's ({:?})",
                            self.store.node()
                        ),
                        kind: ErrorKind::Invalid,
                    });
                } else if stored.record.expired(SystemTime::now()) {
                    self.drop_expired(stored);
                } else {
                    let name = stored.record.name.clone();
                    // Decided before anything is read: this mediator's own write may
                    // end (and apply the same entry) while the watch applies it.
                    let ours = self.is_writing(&name);
                    let before = self.shared.authorities.get(&name);
                    let failed = self.apply_or_report(stored, Op::Watch);
                    if !ours {
                        self.audit_registry(Action::RegistryPut, &name, before, failed);
                    }
                }
            }
            Change::Delete { name, revision } => {
                let ours = self.is_writing(&name);
                if let Some(live) = self.apply_delete(&name, Some(revision)) {
                    self.registry_metrics.operation(Op::Watch, "ok");
                    tracing::info!(target: TARGET, "registry: authority {name:?} was removed (revision {revision}); revoked");
                    if !ours {
                        self.audit_registry(Action::RegistryDelete, &name, Some(live), None);
                    }
                }
            }
            Change::Rejected(rejected) => self.report_rejected(&rejected),
            Change::Snapshot(loaded) => {
                let revision = loaded.revision;
                let before = self.shared.authorities.list();
                self.apply_snapshot(loaded, Op::Load);
                self.registry_metrics.set_revision(revision);
                self.audit_snapshot(&before);
            }
            Change::Progress(revision) => {
                self.registry_metrics.set_revision(revision);
                self.prune_tombstones(u64::try_from(revision).unwrap_or(0));
            }
        }
    }

    /// Applies a stored record; what cannot be applied is named and counted (a record that
    /// is not a valid authority is set aside), never silently dropped. Returns why it
    /// could not be applied.
    fn apply_or_report(&self, stored: Stored, op: Op) -> Option<String> {
        let name = stored.record.name.clone();
        let generation = stored.generation;
        match self.apply_put(stored) {
            Ok(Some(live)) => {
                self.registry_metrics.operation(op, "ok");
                tracing::debug!(target: TARGET, "registry: authority {:?} generation {} applied", live.name(), live.generation);
                None
            }
            Ok(None) => None,
            Err(e) => {
                self.registry_metrics.operation(op, "error");
                let (kind, why) = match e {
                    CreateError::Invalid(errors) => (
                        ErrorKind::Invalid,
                        errors
                            .iter()
                            .map(|e| format!("{}: {}", e.field, e.message))
                            .collect::<Vec<_>>()
                            .join("; "),
                    ),
                    CreateError::Duplicate(_) | CreateError::OfTheFile(_) => (
                        ErrorKind::Conflict,
                        "the configuration file defines an authority of that name (a name is either config or api); the stored one is not loaded and is left in place".to_owned(),
                    ),
                    CreateError::Listen(e) => (ErrorKind::Socket, crate::error::chain(&e)),
                    CreateError::Unavailable(why) => (ErrorKind::Unavailable, why),
                    CreateError::Store(e) => (ErrorKind::Io, e.to_string()),
                };
                self.registry_metrics.error(kind);
                let failed = why.clone();
                if kind == ErrorKind::Invalid {
                    let store = Arc::clone(&self.store);
                    let what_name = name;
                    tokio::spawn(async move {
                        let what = store.set_aside(&what_name).await;
                        tracing::error!(target: TARGET, "registry: stored authority {what_name:?} (generation {generation}) is not valid here and was set aside as {what}: {why}");
                        crate::say!(
                            Warning,
                            "mediator: registry: stored authority {what_name:?} (generation {generation}) is not valid here and was set aside as {what}: {why}"
                        );
                    });
                } else {
                    tracing::error!(target: TARGET, "registry: stored authority {name:?} (generation {generation}) is not loaded: {why}");
                    crate::say!(
                        Warning,
                        "mediator: registry: stored authority {name:?} (generation {generation}) is not loaded: {why}"
                    );
                }
                Some(failed)
            }
        }
    }

    /// Names and counts a record that could not be read, or is not loaded.
    fn report_rejected(&self, rejected: &Rejected) {
        self.registry_metrics.error(rejected.kind);
        let fate = match rejected.kind {
            ErrorKind::Damaged => "cannot be read and was set aside",
            _ => "is not loaded",
        };
        tracing::error!(target: TARGET, "registry: {} {fate}: {}", rejected.what, rejected.why);
        crate::say!(
            Warning,
            "mediator: registry: {} {fate}: {}",
            rejected.what,
            rejected.why
        );
    }

    /// Drops a record whose `expires_at` has passed: removed from the store (only that
    /// generation), never applied.
    fn drop_expired(&self, stored: Stored) {
        let name = stored.record.name.clone();
        let generation = stored.generation;
        let store = Arc::clone(&self.store);
        let metrics = self.registry_metrics.clone();
        tracing::info!(target: TARGET, "registry: authority {name:?} expired at {}; dropped", stored.record.expires_at.as_deref().unwrap_or("-"));
        tokio::spawn(async move {
            match store.delete(&name, Some(generation)).await {
                Ok(_) => metrics.operation(Op::Expire, "ok"),
                Err(e) => {
                    metrics.operation(Op::Expire, "error");
                    tracing::warn!(target: TARGET, "registry: cannot remove expired authority {name:?}: {e}");
                }
            }
        });
    }

    /// Starts the timer that revokes `name` (this generation only) at `at` (RFC 3339).
    fn expire_at(&self, name: &str, generation: u64, at: &str) {
        let wait = humantime::parse_rfc3339(at)
            .ok()
            .and_then(|t| t.duration_since(SystemTime::now()).ok())
            .unwrap_or_default();
        let me: Weak<Self> = self.me.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if let Some(control) = me.upgrade() {
                control.expire(&name, generation).await;
            }
        });
    }

    /// Revokes `name` at its `expires_at`, exactly as a `DELETE` would, if this generation
    /// is still the one applied. etcd removes the record itself when its lease ends; the
    /// revocation here does not wait for that.
    async fn expire(&self, name: &str, generation: u64) {
        let _writes = self.write_lock(name).await;
        let applied = self
            .stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .is_some_and(|s| s.generation == generation);
        if !applied {
            return;
        }
        let _writing = self.writing(name);
        let before = self
            .shared
            .authorities
            .get(name)
            .filter(|l| l.origin == Origin::Api && l.generation == generation);
        let removed = self.store.delete(name, Some(generation)).await;
        match &removed {
            Ok(_) => self.registry_metrics.operation(Op::Expire, "ok"),
            Err(e) => {
                self.registry_metrics.operation(Op::Expire, "error");
                tracing::warn!(target: TARGET, "registry: cannot remove expired authority {name:?} from the {} registry: {e}; revoked here all the same", self.store.backend());
            }
        }
        let revision = match (self.store.backend(), removed) {
            (RegistryBackend::Etcd, Ok(Some(r))) => Some(r),
            _ => None,
        };
        // The removal of exactly this generation, whatever the store answered.
        self.stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
        let op = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = revision {
            self.tombstones
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name.to_owned(), r);
        }
        let revoked = if self
            .shared
            .authorities
            .get(name)
            .is_some_and(|l| l.origin == Origin::Api && l.generation == generation)
        {
            self.revoke_locked(name, "expired (ttl_s)")
        } else {
            None
        };
        drop(op);
        // Revoked here, or meanwhile by the registry's watch (this write's own removal).
        if let Some(live) = revoked.or(before) {
            let mut record = AuditRecord::new(Action::Expire, Actor::Expiry, AuditResult::Accepted);
            record.authority = Some(name.to_owned());
            record
                .changes
                .extend(AuthorityChange::of(Some(&live), None));
            self.audit.record(&self.shared, record);
        }
    }

    /// Forgets removals at or before `revision`: the watch has passed it, so no older
    /// event can come (etcd).
    fn prune_tombstones(&self, revision: u64) {
        self.tombstones
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, r| *r > revision);
    }

    /// Whether a write of this mediator to `name` is under way (see [`Self::writing`]).
    fn is_writing(&self, name: &str) -> bool {
        self.writing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(name)
    }

    /// Marks `name` as written by this mediator until the guard is dropped: the registry's
    /// watch then leaves the audit of its change to this write.
    pub(super) fn writing(&self, name: &str) -> Writing<'_> {
        self.writing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned());
        Writing {
            control: self,
            name: name.to_owned(),
        }
    }

    /// Audits a change the registry's watch applied (another writer's): `before` is the
    /// entry live before it, `failed` why it could not be applied. Nothing when this
    /// mediator's own write is under way, or when nothing changed.
    fn audit_registry(
        &self,
        action: Action,
        name: &str,
        before: Option<Arc<Live>>,
        failed: Option<String>,
    ) {
        if self.is_writing(name) {
            return;
        }
        let after = self.shared.authorities.get(name);
        let same = match (&before, &after) {
            (Some(b), Some(a)) => Arc::ptr_eq(b, a),
            (None, None) => true,
            _ => false,
        };
        if same && failed.is_none() {
            return;
        }
        let actor = Actor::Registry {
            backend: self.store.backend().as_str().to_owned(),
        };
        let mut record = match failed {
            Some(why) => {
                let mut r = AuditRecord::new(action, actor, AuditResult::Refused);
                r.why = Some(why);
                r
            }
            None => AuditRecord::new(action, actor, AuditResult::Accepted),
        };
        record.authority = Some(name.to_owned());
        if !same {
            let after = if action == Action::RegistryDelete {
                None
            } else {
                after
            };
            record
                .changes
                .extend(AuthorityChange::of(before.as_deref(), after.as_deref()));
        }
        self.audit.record(&self.shared, record);
    }

    /// Audits what a re-listed view (after a lost watch) changed among the authorities
    /// created through the admin API.
    fn audit_snapshot(&self, before: &[Arc<Live>]) {
        let after = self.shared.authorities.list();
        let api = |list: &[Arc<Live>], name: &str| {
            list.iter()
                .find(|l| l.name() == name && l.origin == Origin::Api)
                .cloned()
        };
        let mut names: Vec<&str> = before.iter().chain(&after).map(|l| l.name()).collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let (old, new) = (api(before, name), api(&after, name));
            let action = if new.is_some() {
                Action::RegistryPut
            } else {
                Action::RegistryDelete
            };
            if old.is_some() || new.is_some() {
                self.audit_registry(action, name, old, None);
            }
        }
    }

    /// Says whether the registry's view is current; while it is not, decisions under
    /// stored authorities are refused and writes answered 503.
    pub(crate) fn set_fresh(&self, fresh: bool) {
        let was = self.shared.authorities.registry_stale();
        self.shared.authorities.set_registry_stale(!fresh);
        self.registry_metrics.set_stale(!fresh);
        if was == fresh {
            if fresh {
                tracing::warn!(target: TARGET, "registry: the view is current again; authorities from the registry are served");
            } else {
                self.registry_metrics.error(ErrorKind::Unavailable);
                tracing::error!(target: TARGET, "registry: the view cannot be confirmed current (the {} registry at {} is unreachable or has no quorum); decisions under its authorities are refused: registry_unavailable", self.store.backend(), self.store.location());
            }
        }
    }
}

/// A registry write of this mediator under way for one name (see [`Control::writing`]).
pub(super) struct Writing<'a> {
    control: &'a Control,
    name: String,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.control
            .writing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.name);
    }
}
