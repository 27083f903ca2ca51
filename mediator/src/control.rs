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

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use policy::config::{Authority, Config, FieldError};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::authorities::{Live, Origin};
use crate::conn::accept::serve_authority;
use crate::error::Error;
use crate::shared::Shared;
use crate::socket_file;

/// Log target of control-plane events.
pub(crate) const TARGET: &str = "mediator::control";

/// Keys of one `[[authority]]` table that `POST /v1/authorities` accepts, plus
/// `generate_token`.
const GENERATE_TOKEN: &str = "generate_token";

/// Why an authority could not be created.
#[derive(Debug)]
pub(crate) enum CreateError {
    /// The body is not an acceptable authority (HTTP 400); every problem, each naming
    /// its field.
    Invalid(Vec<FieldError>),
    /// An authority of that name is live (HTTP 409).
    Duplicate(String),
    /// Its socket could not be created (HTTP 500).
    Listen(Error),
}

/// A created authority, as `POST /v1/authorities` reports it.
#[derive(Debug)]
pub(crate) struct Created {
    /// The live entry.
    pub live: Arc<Live>,
    /// The freshly generated token, when one was asked for (shown once, never stored).
    pub token: Option<String>,
}

/// What a reload did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    /// Added: `(name, generation)`.
    pub added: Vec<(String, u64)>,
    /// Revoked: `(name, generation)`.
    pub removed: Vec<(String, u64)>,
    /// Revoked and re-created: `(name, old generation, new generation)`.
    pub changed: Vec<(String, u64, u64)>,
    /// Left as they were.
    pub unchanged: Vec<String>,
    /// Sections whose changes need a restart (ignored by the reload).
    pub ignored_sections: Vec<String>,
    /// Authorities that could not be (re-)created (each is absent, so fails closed).
    pub failed: Vec<(String, String)>,
}

/// The control plane of one running mediator.
#[derive(Debug)]
pub(crate) struct Control {
    shared: Arc<Shared>,
    socket_dir: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    revoke_grace: Duration,
    global_deny: Mutex<Vec<String>>,
    /// Fingerprints of the authorities that came from the configuration file as last
    /// applied, and of its other sections as running (from start: a reload does not apply
    /// them): the baseline a reload diffs against.
    baseline: Mutex<Option<Baseline>>,
    /// Serialises control operations.
    op: Mutex<()>,
    /// The `[[authority]]` table (TOML text, a generated token's hash included) of each
    /// authority created through the admin API, so that a reload that changes the global
    /// deny list can re-create them under it: the global list applies to every authority.
    api_tables: Mutex<HashMap<String, String>>,
}

#[derive(Debug, Clone, Default)]
struct Baseline {
    authorities: BTreeMap<String, String>,
    sections: BTreeMap<String, String>,
}

impl Control {
    /// A control plane for `shared`.
    pub(crate) fn new(
        shared: Arc<Shared>,
        socket_dir: Option<PathBuf>,
        tcp: Option<SocketAddr>,
        revoke_grace: Duration,
        global_deny: Vec<String>,
    ) -> Self {
        Self {
            shared,
            socket_dir,
            tcp,
            revoke_grace,
            global_deny: Mutex::new(global_deny),
            baseline: Mutex::new(None),
            op: Mutex::new(()),
            api_tables: Mutex::new(HashMap::new()),
        }
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

    /// Adds `authority`: binds its socket (when a `socket_dir` is configured), makes it
    /// live and starts accepting. Must run inside the tokio runtime.
    ///
    /// # Errors
    /// [`CreateError::Duplicate`] when the name is live, [`CreateError::Listen`] when the
    /// socket cannot be created (nothing is left behind).
    pub(crate) fn add(
        &self,
        authority: Authority,
        origin: Origin,
    ) -> Result<Arc<Live>, CreateError> {
        let _op = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        self.add_locked(authority, origin, None)
    }

    /// Makes `authority` live; with `replacing`, in the place of that entry of the same
    /// name (which stays in the live set until the new one takes its place).
    fn add_locked(
        &self,
        authority: Authority,
        origin: Origin,
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
        let generation = self.shared.authorities.next_generation();
        let live = Arc::new(Live::new(
            Arc::new(authority),
            generation,
            origin,
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
        tracing::info!(
            target: TARGET,
            "authority {name:?} added (generation {generation}, from {}, grant digest {}, socket {})",
            match origin { Origin::Config => "config", Origin::Api => "admin API" },
            live.digest,
            socket.as_ref().map_or_else(|| "-".into(), |p| p.display().to_string())
        );
        Ok(live)
    }

    /// Revokes the authority named `name`: out of the live set, listener stopped and socket
    /// file removed at once, live connections closed after the revoke grace. Returns the
    /// revoked entry, or `None` when no such authority is live.
    pub(crate) fn revoke(&self, name: &str) -> Option<Arc<Live>> {
        let _op = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        self.api_tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
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
        let closing = Arc::clone(live);
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
            closing.close_connections();
            tracing::info!(
                target: TARGET,
                "authority {:?} generation {}: revoke grace over; {then}",
                closing.name(),
                closing.generation
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
        origin: Origin,
        why: &str,
    ) -> (Option<u64>, Result<Arc<Live>, CreateError>) {
        // The old entry stays in the live set until the new one takes its place: a TCP
        // credential looked up meanwhile finds one or the other, never neither.
        let old = self.shared.authorities.get(name);
        if let Some(old) = &old {
            old.stop_listener();
            remove_socket(old.socket.as_ref());
        }
        let added = self.add_locked(authority, origin, old.as_ref());
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

    /// Creates an authority from the flat JSON of one `[[authority]]` table
    /// (`POST /v1/authorities`), validated by the same code as the configuration file, with
    /// the global deny list applied. `"generate_token": true` makes the mediator generate a
    /// token, store only its SHA-256 and return it once.
    ///
    /// # Errors
    /// As [`Self::add`], and [`CreateError::Invalid`] naming each bad field.
    pub(crate) fn create_from_json(&self, body: &Value) -> Result<Created, CreateError> {
        let invalid = |field: &str, message: String| {
            CreateError::Invalid(vec![FieldError {
                field: field.to_owned(),
                message,
            }])
        };
        let Value::Object(map) = body else {
            return Err(invalid(
                "",
                "the body must be a JSON object: the keys of one [[authority]] table".into(),
            ));
        };
        let mut map: Map<String, Value> = map.clone();
        let generate = match map.remove(GENERATE_TOKEN) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(_) => return Err(invalid(GENERATE_TOKEN, "must be true or false".into())),
        };
        if generate && map.contains_key("token_sha256") {
            return Err(invalid(
                GENERATE_TOKEN,
                "give either token_sha256 or generate_token, not both".into(),
            ));
        }
        if let Some((k, _)) = map.iter().find(|(_, v)| v.is_null()) {
            return Err(invalid(
                k,
                "null is not a value; omit the key instead".into(),
            ));
        }
        // A credential names a file or variable of the mediator whose content it sends
        // out: only the configuration file, never an API writer, may name one.
        if map.contains_key("credential") {
            return Err(invalid(
                "credential",
                "credentials ([[authority.credential]]) are configured in the file only: an authority created here cannot make the mediator read a secret".into(),
            ));
        }
        if let Some((k, _)) = map.iter().find(|(_, v)| v.is_object()) {
            return Err(invalid(
                k,
                "nested objects are not part of an [[authority]] table".into(),
            ));
        }
        let token = if generate {
            let token = random_token().map_err(|e| {
                CreateError::Listen(Error::Io(std::io::Error::other(format!(
                    "cannot generate a token: {e}"
                ))))
            })?;
            map.insert(
                "token_sha256".into(),
                Value::String(hex::encode(Sha256::digest(token.as_bytes()))),
            );
            Some(token)
        } else {
            None
        };
        let text = toml::to_string(&Value::Object(map)).map_err(|e| {
            invalid(
                "",
                format!("cannot read the body as an authority table: {e}"),
            )
        })?;
        let global = self
            .global_deny
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut authority =
            policy::config::parse_authority(&text, &global).map_err(CreateError::Invalid)?;
        crate::credential::load_secrets(&mut authority).map_err(credential_errors)?;
        let live = self.add(authority, Origin::Api)?;
        self.api_tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(live.authority.grant.name().to_owned(), text);
        Ok(Created { live, token })
    }

    /// Records the configuration text the running set was built from, so that a later
    /// [`Self::reload`] can tell which authorities changed. Called once after start.
    pub(crate) fn set_baseline(&self, text: &str) {
        let baseline = fingerprints(text);
        *self.baseline.lock().unwrap_or_else(PoisonError::into_inner) = Some(baseline);
    }

    /// Applies a new configuration (already parsed and validated from `text`): authorities
    /// of the file that are new are added, those no longer in the file are revoked, those
    /// whose table (or the global deny list) changed are revoked and re-created with a new
    /// generation. Authorities created through the admin API are left alone unless the
    /// file now defines the same name (the file's then replaces it). Changes to other
    /// sections need a restart and are reported, not applied.
    ///
    /// The caller validates first: a file that does not parse or validate never gets here,
    /// so it changes nothing.
    #[expect(
        clippy::too_many_lines,
        reason = "a reload diffs the config by authority table in one pass"
    )]
    pub(crate) fn reload(&self, config: Config, text: &str) -> ReloadReport {
        let _op = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        let new = fingerprints(text);
        let old = self
            .baseline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_default();
        let mut report = ReloadReport::default();
        for (section, fp) in &new.sections {
            if old.sections.get(section) != Some(fp) {
                report.ignored_sections.push(section.clone());
            }
        }
        for section in old.sections.keys() {
            if !new.sections.contains_key(section) {
                report.ignored_sections.push(section.clone());
            }
        }
        report.ignored_sections.sort();
        report.ignored_sections.dedup();
        let global_changed = {
            let mut global = self
                .global_deny
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let changed = *global != config.global_deny;
            global.clone_from(&config.global_deny);
            changed
        };
        // The global deny list is part of every grant, those created through the API
        // included: when it changed, re-create them under the new list (new generation).
        if global_changed {
            let tables: Vec<(String, String)> = self
                .api_tables
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .filter(|(name, _)| !new.authorities.contains_key(*name))
                .map(|(n, t)| (n.clone(), t.clone()))
                .collect();
            for (name, text) in tables {
                let is_api = self
                    .shared
                    .authorities
                    .get(&name)
                    .is_some_and(|l| l.origin == Origin::Api);
                if !is_api {
                    continue;
                }
                let parsed = policy::config::parse_authority(&text, &config.global_deny).and_then(
                    |mut a| {
                        crate::credential::load_secrets(&mut a).map_err(credential_fields)?;
                        Ok(a)
                    },
                );
                let authority = match parsed {
                    Ok(a) => a,
                    Err(e) => {
                        // Cannot happen for a table that was valid with other deny entries,
                        // but fail closed: revoke rather than keep the old, wider grant.
                        self.revoke_locked(
                            &name,
                            "revoked by reload (invalid under the new [global] deny list)",
                        );
                        report.failed.push((name.clone(), format!("{e:?}")));
                        continue;
                    }
                };
                let (old_generation, added) = self.replace_locked(
                    &name,
                    authority,
                    Origin::Api,
                    "replaced by reload ([global] deny changed)",
                );
                match added {
                    Ok(live) => {
                        if let Some(g) = old_generation {
                            report.changed.push((name.clone(), g, live.generation));
                        }
                    }
                    Err(e) => report.failed.push((name.clone(), format!("{e:?}"))),
                }
            }
        }

        // Removed from the file: revoke (only those that came from the file).
        for name in old.authorities.keys() {
            if new.authorities.contains_key(name) {
                continue;
            }
            if let Some(live) = self.shared.authorities.get(name)
                && live.origin == Origin::Config
                && let Some(l) =
                    self.revoke_locked(name, "revoked by reload (removed from the file)")
            {
                report.removed.push((name.clone(), l.generation));
            }
        }
        let mut by_name: HashMap<String, Authority> = config
            .authorities
            .into_iter()
            .map(|a| (a.grant.name().to_owned(), a))
            .collect();
        for (name, fp) in &new.authorities {
            // The file's definition replaces one created through the API.
            self.api_tables
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(name);
            let Some(authority) = by_name.remove(name) else {
                continue;
            };
            let current = self.shared.authorities.get(name);
            // A rotated secret is a change too (a new generation), with the same table.
            let same = current.as_ref().is_some_and(|l| {
                l.origin == Origin::Config && same_secrets(&l.authority, &authority)
            }) && old.authorities.get(name) == Some(fp);
            if same {
                report.unchanged.push(name.clone());
                continue;
            }
            let (old_generation, added) = if current.is_some() {
                self.replace_locked(
                    name,
                    authority,
                    Origin::Config,
                    "replaced by reload (its table changed)",
                )
            } else {
                (None, self.add_locked(authority, Origin::Config, None))
            };
            match added {
                Ok(live) => match old_generation {
                    Some(g) => report.changed.push((name.clone(), g, live.generation)),
                    None => report.added.push((name.clone(), live.generation)),
                },
                Err(e) => {
                    let why = match e {
                        CreateError::Listen(e) => e.to_string(),
                        CreateError::Duplicate(n) => format!("{n} is live"),
                        CreateError::Invalid(v) => format!("{v:?}"),
                    };
                    tracing::error!(target: TARGET, "reload: cannot add authority {name:?}: {why}; it stays absent");
                    report.failed.push((name.clone(), why));
                }
            }
        }
        // The authorities now run as the file says; the other sections still run as they
        // did at start (a reload does not apply them), so the next reload compares with
        // those: a change stays reported until a restart applies it, and a change undone
        // is no longer reported.
        *self.baseline.lock().unwrap_or_else(PoisonError::into_inner) = Some(Baseline {
            authorities: new.authorities,
            sections: old.sections,
        });
        tracing::info!(
            target: TARGET,
            "reload applied: added {:?}, removed {:?}, changed {:?}, unchanged {:?}",
            report.added,
            report.removed,
            report.changed,
            report.unchanged
        );
        if !report.ignored_sections.is_empty() {
            tracing::warn!(
                target: TARGET,
                "reload: changes to {} need a restart and were not applied",
                report.ignored_sections.join(", ")
            );
        }
        report
    }
}

/// Whether two authorities of one table hold the same secrets (a reload re-reads them).
fn same_secrets(old: &Authority, new: &Authority) -> bool {
    old.credentials.len() == new.credentials.len()
        && old
            .credentials
            .iter()
            .zip(&new.credentials)
            .all(|(a, b)| a.same_secret(b))
}

/// Secrets of an authority from the admin API that cannot be loaded, as field errors.
fn credential_errors(errors: Vec<String>) -> CreateError {
    CreateError::Invalid(credential_fields(errors))
}

fn credential_fields(errors: Vec<String>) -> Vec<FieldError> {
    errors
        .into_iter()
        .map(|message| FieldError {
            field: "credential".into(),
            message,
        })
        .collect()
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

/// 32 random bytes from the kernel, as 64 hex digits.
fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(hex::encode(bytes))
}

/// Per-authority and per-section fingerprints of a configuration text. An authority's
/// fingerprint covers its own table and the `[global]` table (whose deny list is part of
/// every grant). Text that does not parse gives empty maps (callers validate first).
fn fingerprints(text: &str) -> Baseline {
    let mut out = Baseline::default();
    let Ok(table) = text.parse::<toml::Table>() else {
        return out;
    };
    let global = table.get("global").map(canonical).unwrap_or_default();
    for (key, value) in &table {
        if key == "authority" {
            for a in value.as_array().into_iter().flatten() {
                if let Some(name) = a.get("name").and_then(toml::Value::as_str) {
                    let fp = hex::encode(Sha256::digest(
                        format!("{}\n{global}", canonical(a)).as_bytes(),
                    ));
                    out.authorities.insert(name.to_owned(), fp);
                }
            }
        } else if key != "global" {
            out.sections.insert(key.clone(), canonical(value));
        }
    }
    out
}

/// A canonical JSON rendering (object keys sorted) of a TOML value.
fn canonical(v: &toml::Value) -> String {
    fn sort(v: Value) -> Value {
        match v {
            Value::Object(m) => {
                let sorted: BTreeMap<String, Value> =
                    m.into_iter().map(|(k, v)| (k, sort(v))).collect();
                Value::Object(sorted.into_iter().collect())
            }
            Value::Array(a) => Value::Array(a.into_iter().map(sort).collect()),
            other => other,
        }
    }
    serde_json::to_value(v)
        .map(sort)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
