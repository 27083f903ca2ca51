//! Audit records (design section 21): every change to who may reach what is itself a
//! record. An admin API create or delete (accepted or refused: a bad token, a bad body
//! included), a reload (SIGHUP or the file watch), a change another replica made to the
//! shared registry, and an expiry (`ttl_s`) each write one `audit` line to the decision
//! log through its one writer, so it has the decisions' stamp, format (in OCSF mode an
//! API Activity event, `export/api_activity.rs`) and export; it is counted in
//! `mediator_audit_total{action,result}`.
//!
//! Who: the admin token's id (the first 12 hex digits of its SHA-256, never the token),
//! the admin socket peer's uid, gid and pid, or what else made the change (the signal,
//! the file watch, the registry, the timer). What: each authority's name, generation,
//! grant digest, and what `policy::review` says the change widened or narrowed.
//!
//! Here: who and what (the [`Actor`] of an admin request, an [`AuthorityChange`] and
//! what `policy::review` says of it), the record of a reload, and the `Auditor` that
//! writes and counts; `record.rs` the record as data.
//!
//! The answers to questions (design section 20) are audited the same way: the code that
//! applies an answer (`crate::control::asks`) writes an [`Action::AskAnswer`] record with
//! who answered and what ([`AskAnswer`]). Nothing here holds a secret: a token is only
//! ever its id.

pub mod record;

use std::sync::Arc;

use policy::config::Authority;
use policy::review::{Outcome, Reach, RiskClass, Sources, compare, compare_global};
use prometheus::{IntCounterVec, Opts};
use sha2::{Digest, Sha256};

use crate::authorities::Live;
use crate::decision_log::Peer;
use crate::metrics::Metrics;
use crate::shared::Shared;

pub use record::{
    Action, Actor, AskAnswer, AuditEvent, AuditRecord, AuditResult, AuthorityChange, ChangeKind,
};

impl Actor {
    /// The admin API's client: its peer (TCP address, or Unix socket credentials) and
    /// the bearer token it presented (`Authorization` value after `Bearer `), if any.
    pub(crate) fn admin(peer: &Peer, token: Option<&[u8]>) -> Self {
        let token_id = token.map(|t| {
            let digest: [u8; 32] = Sha256::digest(t.trim_ascii()).into();
            policy::review::token_id(&digest)
        });
        match peer {
            Peer::Unix { pid, uid, gid } => Self::AdminSocket {
                uid: *uid,
                gid: *gid,
                pid: *pid,
                token_id,
            },
            Peer::Tcp(addr) => Self::AdminTcp {
                token_id,
                addr: addr.to_string(),
            },
            Peer::Embedded => Self::AdminTcp {
                token_id,
                addr: "embedded".to_owned(),
            },
        }
    }
}

impl AuthorityChange {
    /// The change from `old` to `new` (either absent: added or removed); `None` when
    /// both are.
    pub(crate) fn of(old: Option<&Live>, new: Option<&Live>) -> Option<Self> {
        let (change, now) = match (old, new) {
            (Some(_), Some(n)) => (ChangeKind::Replaced, n),
            (None, Some(n)) => (ChangeKind::Added, n),
            (Some(o), None) => (ChangeKind::Removed, o),
            (None, None) => return None,
        };
        let (reach, widened, narrowed) = reach_of(
            old.map(|l| l.authority.as_ref()),
            new.map(|l| l.authority.as_ref()),
        );
        let previous = old.filter(|_| change == ChangeKind::Replaced);
        Some(Self {
            authority: now.name().to_owned(),
            change,
            generation: now.generation,
            previous_generation: previous.map(|l| l.generation),
            grant_digest: now.digest.clone(),
            previous_grant_digest: previous.map(|l| l.digest.clone()),
            reach,
            widened,
            narrowed,
        })
    }

    /// An authority added on another node's replica: a create placed there, stored by
    /// this one, which never makes it live. `Added` under `generation`, with the grant
    /// digest its node holds.
    pub(crate) fn added_elsewhere(authority: &Authority, generation: u64) -> Self {
        let (reach, widened, narrowed) = reach_of(None, Some(authority));
        Self {
            authority: authority.grant.name().to_owned(),
            change: ChangeKind::Added,
            generation,
            previous_generation: None,
            grant_digest: crate::authorities::grant_digest(authority),
            previous_grant_digest: None,
            reach,
            widened,
            narrowed,
        }
    }
}

/// What `policy::review` says of the change from `old` to `new`: the outcome, and the
/// classes widened and narrowed. A comparison that fails (it cannot for authorities
/// this mediator validated) counts as a widening: the reviewer looks.
fn reach_of(
    old: Option<&Authority>,
    new: Option<&Authority>,
) -> (Outcome, Vec<RiskClass>, Vec<RiskClass>) {
    let side = |a: &Authority| {
        (
            Reach::of(a, Sources::Shown),
            policy::review::global_deny_of(a),
        )
    };
    let (o, n) = (old.map(side), new.map(side));
    let Ok(mut changes) = compare(
        o.as_ref().map(|(r, g)| (r, g.as_slice())),
        n.as_ref().map(|(r, g)| (r, g.as_slice())),
    ) else {
        return (Outcome::Widened, Vec::new(), Vec::new());
    };
    if let (Some((_, og)), Some((_, ng))) = (&o, &n) {
        match compare_global(og, ng) {
            Ok(c) => changes.extend(c),
            Err(_) => return (Outcome::Widened, Vec::new(), Vec::new()),
        }
    }
    let classes = |d: policy::review::Direction| {
        let mut v: Vec<RiskClass> = changes
            .iter()
            .filter(|c| c.direction == d)
            .map(|c| c.class)
            .collect();
        v.sort();
        v.dedup();
        v
    };
    (
        Outcome::of(&changes),
        classes(policy::review::Direction::Widened),
        classes(policy::review::Direction::Narrowed),
    )
}

/// What started a reload: the actor of its audit record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadTrigger {
    /// SIGHUP (`systemctl reload`).
    Signal,
    /// `--watch-config`: the file's content changed.
    Watch,
}

impl ReloadTrigger {
    fn actor(self) -> Actor {
        match self {
            Self::Signal => Actor::Sighup,
            Self::Watch => Actor::ConfigWatch,
        }
    }
}

/// What a reload did, as its audit record needs it: `(name, generation)` added and
/// removed, `(name, old, new)` replaced, `(name, why)` not applied.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reloaded<'a> {
    pub(crate) added: &'a [(String, u64)],
    pub(crate) removed: &'a [(String, u64)],
    pub(crate) changed: &'a [(String, u64, u64)],
    pub(crate) failed: &'a [(String, String)],
}

/// The audit record of a reload: `reloaded` is what it did, `before` the live set before
/// it (for the entries it revoked or replaced); `Err`: refused, why.
pub(crate) fn reload_record(
    shared: &Shared,
    trigger: ReloadTrigger,
    before: &[Arc<Live>],
    reloaded: Result<Reloaded<'_>, String>,
) -> AuditRecord {
    let report = match reloaded {
        Ok(r) => r,
        Err(why) => {
            let mut record =
                AuditRecord::new(Action::Reload, trigger.actor(), AuditResult::Refused);
            record.why = Some(why);
            return record;
        }
    };
    let was = |name: &str, generation: u64| {
        before
            .iter()
            .find(|l| l.name() == name && l.generation == generation)
            .cloned()
    };
    let now = |name: &str, generation: u64| {
        shared
            .authorities
            .get(name)
            .filter(|l| l.generation == generation)
    };
    let mut changes = Vec::new();
    for (name, g) in report.added {
        changes.extend(AuthorityChange::of(None, now(name, *g).as_deref()));
    }
    for (name, g) in report.removed {
        changes.extend(AuthorityChange::of(was(name, *g).as_deref(), None));
    }
    for (name, a, b) in report.changed {
        changes.extend(AuthorityChange::of(
            was(name, *a).as_deref(),
            now(name, *b).as_deref(),
        ));
    }
    let (result, why) = if report.failed.is_empty() {
        (AuditResult::Accepted, None)
    } else {
        let failed: Vec<String> = report
            .failed
            .iter()
            .map(|(name, why)| format!("{name}: {why}"))
            .collect();
        (
            AuditResult::Partial,
            Some(format!(
                "not applied (each stays absent): {}",
                failed.join("; ")
            )),
        )
    };
    let mut record = AuditRecord::new(Action::Reload, trigger.actor(), result);
    record.changes = changes;
    record.why = why;
    record
}

/// Writes audit records and counts them.
#[derive(Debug, Clone)]
pub(crate) struct Auditor {
    counter: IntCounterVec,
}

impl Auditor {
    /// An auditor whose counter `mediator_audit_total{action,result}` is registered in
    /// `metrics`, every series at zero.
    ///
    /// # Errors
    /// The counter cannot be registered.
    pub(crate) fn new(metrics: &Metrics) -> Result<Self, prometheus::Error> {
        let counter = metrics.registered(IntCounterVec::new(
            Opts::new(
                "mediator_audit_total",
                "Audit records written: admin API creates and deletes, reloads, registry changes seen from other replicas, expiries; by result (accepted, partial, refused).",
            ),
            &["action", "result"],
        )?)?;
        for a in Action::ALL {
            for r in AuditResult::ALL {
                counter.with_label_values(&[a.as_str(), r.as_str()]);
            }
        }
        Ok(Self { counter })
    }

    /// Writes `record` to the decision log (its id and time set here) and counts it;
    /// returns it as written.
    pub(crate) fn record(&self, shared: &Shared, mut record: AuditRecord) -> AuditRecord {
        record.id = shared.next_id();
        record.ts = crate::decision_log::now_rfc3339();
        shared.log.write_audit(&record);
        self.counter
            .with_label_values(&[record.action.as_str(), record.result.as_str()])
            .inc();
        record
    }

    /// [`Self::record`], then waits until the line has reached the log's sink, so that
    /// what is acknowledged afterwards (an admin API answer) is on record even if the
    /// process is killed the next moment.
    pub(crate) async fn record_durably(&self, shared: &Arc<Shared>, record: AuditRecord) {
        self.record(shared, record);
        let log = shared.log.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || log.flush()).await {
            tracing::error!("waiting for the audit record to be written: {e}");
        }
    }
}
