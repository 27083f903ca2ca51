//! The audit record (design section 21) as data: what the decision log's writer takes and
//! renders (`crate::export`), and what a reader parses back. No I/O, and nothing here
//! imports the state the records describe.

use policy::review::{Outcome, RiskClass};
use serde::{Deserialize, Serialize};

/// `event: "audit"`: what sets an audit line apart from decision and close lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditEvent {
    /// The only value.
    Audit,
}

/// What was done (or tried).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// `POST /v1/authorities`.
    Create,
    /// `DELETE /v1/authorities/<name>`.
    Delete,
    /// A reload of the configuration file (SIGHUP, `--watch-config`).
    Reload,
    /// A record another replica stored in the shared registry, applied here.
    RegistryPut,
    /// A record another replica removed from the shared registry, revoked here.
    RegistryDelete,
    /// An authority created with `ttl_s`, revoked at its `expires_at`.
    Expire,
    /// An answer to an ask (design section 20): written by the code that applies
    /// answers, once asking exists.
    AskAnswer,
}

impl Action {
    /// Every action (their metric series exist from the start).
    pub const ALL: [Self; 7] = [
        Self::Create,
        Self::Delete,
        Self::Reload,
        Self::RegistryPut,
        Self::RegistryDelete,
        Self::Expire,
        Self::AskAnswer,
    ];

    /// The contract string (`create`, `registry_put`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Delete => "delete",
            Self::Reload => "reload",
            Self::RegistryPut => "registry_put",
            Self::RegistryDelete => "registry_delete",
            Self::Expire => "expire",
            Self::AskAnswer => "ask_answer",
        }
    }
}

/// How it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditResult {
    /// Done.
    Accepted,
    /// Done in part (a reload that could not add every authority); `why` says what not.
    Partial,
    /// Not done; `why` says why.
    Refused,
}

impl AuditResult {
    /// Every result.
    pub const ALL: [Self; 3] = [Self::Accepted, Self::Partial, Self::Refused];

    /// `accepted`, `partial` or `refused`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Partial => "partial",
            Self::Refused => "refused",
        }
    }
}

/// Who (or what) made the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "via", rename_all = "snake_case")]
pub enum Actor {
    /// The admin API's TCP listener (loopback).
    AdminTcp {
        /// The id of the bearer token presented (first 12 hex digits of its SHA-256),
        /// valid or not; absent when none was.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token_id: Option<String>,
        /// The client's address.
        addr: String,
    },
    /// The admin API's Unix socket: the peer's credentials (`SO_PEERCRED`).
    AdminSocket {
        /// Peer user id.
        uid: u32,
        /// Peer group id.
        gid: u32,
        /// Peer process id, when the kernel reported one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<i32>,
        /// The id of the bearer token presented, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token_id: Option<String>,
    },
    /// SIGHUP.
    Sighup,
    /// `--watch-config`: the file's content changed.
    ConfigWatch,
    /// Another writer of the shared registry (another replica), seen by its watch.
    Registry {
        /// The backend (`etcd`).
        backend: String,
    },
    /// The `ttl_s` timer.
    Expiry,
}

/// How an authority changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// It is live now and was not.
    Added,
    /// It was live and is not.
    Removed,
    /// Revoked and re-created under a new generation.
    Replaced,
}

/// One authority's change within an audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorityChange {
    /// Its name.
    pub authority: String,
    /// Added, removed or replaced.
    pub change: ChangeKind,
    /// Its generation now (the removed one's, for a removal).
    pub generation: u64,
    /// The generation it replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_generation: Option<u64>,
    /// Its grant digest now (the removed one's, for a removal), as `/v1/authorities`
    /// shows it.
    pub grant_digest: String,
    /// The digest of the grant it replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_grant_digest: Option<String>,
    /// What the change did to its reach (`mediator diff`'s outcome for it).
    pub reach: Outcome,
    /// The risk classes it widened.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub widened: Vec<RiskClass>,
    /// The risk classes it narrowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub narrowed: Vec<RiskClass>,
}

/// One audit line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Always `audit`.
    pub event: AuditEvent,
    /// RFC 3339 UTC timestamp with milliseconds.
    pub ts: String,
    /// The record's id, from the decision ids' sequence (never repeated across runs).
    pub id: u64,
    /// What was done.
    pub action: Action,
    /// How it ended.
    pub result: AuditResult,
    /// Who asked.
    pub actor: Actor,
    /// The admin API request (`POST /v1/authorities`), when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// The HTTP status answered, when there was a request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The authority a request or change named, when it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// Each authority that came, went or was replaced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<AuthorityChange>,
    /// Why it was refused, or what of it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl AuditRecord {
    /// A record of `action` by `actor` that ended as `result` (id and time are set when
    /// it is written).
    pub(crate) fn new(action: Action, actor: Actor, result: AuditResult) -> Self {
        Self {
            event: AuditEvent::Audit,
            ts: String::new(),
            id: 0,
            action,
            result,
            actor,
            request: None,
            status: None,
            authority: None,
            changes: Vec::new(),
            why: None,
        }
    }

    /// Whether a reader should look twice: refused, partial, or widening some reach.
    pub(crate) fn notable(&self) -> bool {
        self.result != AuditResult::Accepted
            || self.changes.iter().any(|c| c.reach == Outcome::Widened)
    }
}
