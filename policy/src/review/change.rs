//! The words of a review: what kind of reach a change touches ([`RiskClass`]), which way
//! it moves it ([`Direction`]), and one difference ([`Change`]).

use serde::{Deserialize, Serialize};

/// What kind of reach a change touches (design section 21): the words a reviewer and a
/// SIEM rule filter on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RiskClass {
    /// A host, wildcard or address range in `allow` (a new host, a wider wildcard).
    Host,
    /// The ports of an allowed host.
    Port,
    /// An `allow_private` range: addresses the address check refuses otherwise.
    AllowPrivate,
    /// A `tls_terminate` pattern: requests the mediator reads (and may change).
    TlsTerminate,
    /// A credential: a secret the mediator adds, and the hosts it goes to.
    Credential,
    /// A request rule's methods, paths, headers, query names or upgrades.
    RequestRule,
    /// A `deny` entry of the authority.
    Deny,
    /// An operator's reason (a deny entry's, `default_deny_reason`): words, not reach.
    OperatorReason,
    /// `sni_check`.
    SniCheck,
    /// The watchdog that may narrow allowed decisions.
    Watchdog,
    /// The authority's own limits (`max_connections`, `connect_rate`, `connect_burst`).
    Limits,
    /// Who may act as the authority: its token, its socket's mode and owner.
    Channel,
    /// `[global] deny`: every authority's grant.
    Global,
    /// A section of the configuration that is not a grant (`[upstream]`, `[resolver]`,
    /// ...), applied at the next start.
    Section,
}

impl RiskClass {
    /// The name, as in `--json` output, audit records and metric labels (`host`,
    /// `allow_private`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Port => "port",
            Self::AllowPrivate => "allow_private",
            Self::TlsTerminate => "tls_terminate",
            Self::Credential => "credential",
            Self::RequestRule => "request_rule",
            Self::Deny => "deny",
            Self::OperatorReason => "operator_reason",
            Self::SniCheck => "sni_check",
            Self::Watchdog => "watchdog",
            Self::Limits => "limits",
            Self::Channel => "channel",
            Self::Global => "global",
            Self::Section => "section",
        }
    }
}

/// Which way a change moves what an authority may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// More is reachable, or may be (a different watchdog, a different secret).
    Widened,
    /// Less is reachable.
    Narrowed,
    /// Something else changed: an operator's words, a replaced token, a limit moved to
    /// or from the mediator's default, a section that is not a grant.
    Changed,
}

impl Direction {
    /// `widened`, `narrowed` or `changed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Widened => "widened",
            Self::Narrowed => "narrowed",
            Self::Changed => "changed",
        }
    }
}

/// One difference between two versions of an authority (or of `[global]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// What kind of reach it touches.
    pub class: RiskClass,
    /// Which way.
    pub direction: Direction,
    /// The entry as written (the new one for an addition, the old one for a removal), or
    /// the key (`sni_check`, `max_connections`).
    pub entry: String,
    /// What it means, in one sentence.
    pub detail: String,
}

impl Change {
    pub(crate) fn new(
        class: RiskClass,
        direction: Direction,
        entry: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            class,
            direction,
            entry: entry.into(),
            detail: detail.into(),
        }
    }
}
