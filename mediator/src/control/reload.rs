//! A config reload (SIGHUP, `POST /v1/reload`): the file diffed by authority table
//! against the one the running set was built from; new authorities added, removed ones
//! revoked, changed ones revoked and re-created (live connections judged again).

use std::collections::{BTreeMap, HashMap};
use std::sync::PoisonError;

use policy::config::{Authority, Config};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::create::CreateError;
use super::registry::Stored;
use super::{Control, TARGET};
use crate::authorities::{Birth, Origin};

/// A reload that would give the configuration file a name a stored API authority holds
/// (a name is either config or api, design section 17): nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the file defines {} that the registry holds (created through the admin API): a name is either config or api; DELETE /v1/authorities/<name> first, or rename it in the file. Nothing was changed",
    names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
)]
pub struct ReloadRefused {
    /// The names held by both.
    pub names: Vec<String>,
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

#[derive(Debug, Clone, Default)]
pub(super) struct Baseline {
    authorities: BTreeMap<String, String>,
    sections: BTreeMap<String, String>,
}

impl Control {
    /// Records the configuration text the running set was built from, so that a later
    /// [`Self::reload`] can tell which authorities changed. Called once after start.
    pub(crate) fn set_baseline(&self, text: &str) {
        let baseline = fingerprints(text);
        *self.baseline.lock().unwrap_or_else(PoisonError::into_inner) = Some(baseline);
    }

    /// Whether the configuration file names an authority `name` (served here or placed on
    /// another node): the admin API may not create one of that name, even after a
    /// `DELETE` revoked the file's (a later reload would meet it as a conflict).
    pub(super) fn named_by_the_file(&self, name: &str) -> bool {
        let in_file = self
            .baseline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|b| b.authorities.contains_key(name));
        in_file
            || self
                .placed_elsewhere
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(name)
    }

    /// Applies a new configuration (already parsed and validated from `text`): authorities
    /// of the file that are new are added, those no longer in the file are revoked, those
    /// whose table (or the global deny list) changed are revoked and re-created with a new
    /// generation. Authorities created through the admin API are left alone (re-created
    /// when the `[global]` deny list changed). Changes to other sections need a restart and
    /// are reported, not applied.
    ///
    /// The caller validates first: a file that does not parse or validate never gets here,
    /// so it changes nothing.
    ///
    /// # Errors
    /// [`ReloadRefused`] when the file defines a name a stored API authority holds; nothing
    /// is changed.
    pub(crate) fn reload(&self, config: Config, text: &str) -> Result<ReloadReport, ReloadRefused> {
        let _op = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        let held = self.held_by_registry(&config);
        if !held.is_empty() {
            tracing::error!(target: TARGET, "reload refused: {}", ReloadRefused { names: held.clone() });
            return Err(ReloadRefused { names: held });
        }
        let mut new = fingerprints(text);
        // Placed on other nodes: not this replica's, as if not in the file.
        new.authorities
            .retain(|name, _| !config.placed_elsewhere.contains(name));
        self.set_placed_elsewhere(&config.placed_elsewhere);
        let old = self
            .baseline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_default();
        let mut report = ReloadReport {
            ignored_sections: ignored_sections(&old, &new),
            ..ReloadReport::default()
        };
        if self.swap_global_deny(&config.global_deny) {
            self.recreate_api_authorities(&mut report);
        }
        self.revoke_removed(&old, &new, &mut report);
        self.apply_tables(config.authorities, &old, &new, &mut report);
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
        Ok(report)
    }

    /// The names of the file that a stored API authority holds, sorted.
    fn held_by_registry(&self, config: &Config) -> Vec<String> {
        let stored = self.stored.lock().unwrap_or_else(PoisonError::into_inner);
        let mut held: Vec<String> = config
            .authorities
            .iter()
            .map(|a| a.grant.name().to_owned())
            .filter(|n| stored.contains_key(n))
            .collect();
        held.sort();
        held
    }

    /// Takes `global_deny` as the `[global]` deny list; whether it changed.
    fn swap_global_deny(&self, global_deny: &[policy::DenyEntry]) -> bool {
        let mut global = self
            .global_deny
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let changed = *global != global_deny;
        if changed {
            *global = global_deny.to_vec();
        }
        changed
    }

    /// The global deny list is part of every grant, those created through the API
    /// included: when it changed, they are re-created under the new list (new
    /// generation). One that the new list makes invalid is revoked (fail closed).
    fn recreate_api_authorities(&self, report: &mut ReloadReport) {
        let stored: Vec<Stored> = self
            .stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(super::kept::Kept::stored)
            .collect();
        for record in stored {
            let name = record.record.name.clone();
            let Some(current) = self
                .shared
                .authorities
                .get(&name)
                .filter(|l| l.origin == Origin::Api)
            else {
                continue;
            };
            let authority = match self.authority_of(&record) {
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
            let birth = Birth {
                generation: self.shared.authorities.next_generation(),
                origin: Origin::Api,
                created: Some(current.created.clone()),
                expires_at: current.expires_at.clone(),
            };
            let (old_generation, added) = self.replace_locked(
                &name,
                authority,
                birth,
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

    /// Removed from the file: revoked (only those that came from the file).
    fn revoke_removed(&self, old: &Baseline, new: &Baseline, report: &mut ReloadReport) {
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
    }

    /// The file's tables: a new one added, a changed one (or one whose secret rotated)
    /// re-created with a new generation, the rest left as they are.
    fn apply_tables(
        &self,
        authorities: Vec<Authority>,
        old: &Baseline,
        new: &Baseline,
        report: &mut ReloadReport,
    ) {
        let mut by_name: HashMap<String, Authority> = authorities
            .into_iter()
            .map(|a| (a.grant.name().to_owned(), a))
            .collect();
        for (name, fp) in &new.authorities {
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
                let birth = self.config_birth();
                self.replace_locked(
                    name,
                    authority,
                    birth,
                    "replaced by reload (its table changed)",
                )
            } else {
                (None, self.add_locked(authority, self.config_birth(), None))
            };
            match added {
                Ok(live) => match old_generation {
                    Some(g) => report.changed.push((name.clone(), g, live.generation)),
                    None => report.added.push((name.clone(), live.generation)),
                },
                Err(e) => {
                    let why = match e {
                        CreateError::Listen(e) => e.to_string(),
                        CreateError::Duplicate(n) | CreateError::OfTheFile(n) => {
                            format!("{n} is live")
                        }
                        CreateError::Invalid(v) => format!("{v:?}"),
                        CreateError::Unavailable(why) => why,
                        CreateError::Store(e) => e.to_string(),
                    };
                    tracing::error!(target: TARGET, "reload: cannot add authority {name:?}: {why}; it stays absent");
                    report.failed.push((name.clone(), why));
                }
            }
        }
    }
}

/// The sections other than the authorities whose text changed, was added or removed:
/// their changes need a restart, and are reported, not applied.
fn ignored_sections(old: &Baseline, new: &Baseline) -> Vec<String> {
    let mut ignored: Vec<String> = new
        .sections
        .iter()
        .filter(|(section, fp)| old.sections.get(*section) != Some(fp))
        .map(|(section, _)| section.clone())
        .chain(
            old.sections
                .keys()
                .filter(|section| !new.sections.contains_key(*section))
                .cloned(),
        )
        .collect();
    ignored.sort();
    ignored.dedup();
    ignored
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
mod tests {

    use super::*;

    #[test]
    fn fingerprints_see_table_and_global_changes_only() {
        let a = fingerprints(
            "[listen]\ntcp = \"127.0.0.1:1\"\n[[authority]]\nname = \"a\"\nallow = [\"x.test\"]\n[[authority]]\nname = \"b\"\n",
        );
        let same = fingerprints(
            "[listen]\ntcp = \"127.0.0.1:1\"\n\n[[authority]]\nallow = [ \"x.test\" ]\nname = \"a\"\n[[authority]]\nname = \"b\"\n",
        );
        assert_eq!(a.authorities, same.authorities);
        assert_eq!(a.sections, same.sections);
        let changed = fingerprints(
            "[listen]\ntcp = \"127.0.0.1:2\"\n[[authority]]\nname = \"a\"\nallow = [\"y.test\"]\n[[authority]]\nname = \"b\"\n",
        );
        assert_ne!(a.authorities["a"], changed.authorities["a"]);
        assert_eq!(a.authorities["b"], changed.authorities["b"]);
        assert_ne!(a.sections["listen"], changed.sections["listen"]);
        let global = fingerprints(
            "[listen]\ntcp = \"127.0.0.1:1\"\n[global]\ndeny = [\"*:25\"]\n[[authority]]\nname = \"a\"\nallow = [\"x.test\"]\n[[authority]]\nname = \"b\"\n",
        );
        assert_ne!(a.authorities["b"], global.authorities["b"]);
    }
}
