//! Policy review (design section 21): what one authority may reach, as data
//! ([`Reach`]), and what a change of it widens or narrows ([`compare()`], [`compare_global`],
//! [`diff()`]).
//!
//! A [`Reach`] is the authority's grant as written (allow and deny lists, private-range
//! exceptions, terminated hosts, request rules), the hosts its credentials go to, and the
//! settings that bound it (SNI check, watchdog, limits, channel). It is built from a
//! validated [`Authority`] ([`Reach::of`]), served by the admin API, read back for `mediator
//! diff --admin`, and turned into a [`Grant`] again ([`Reach::grant`]) by the same
//! validation as the configuration file.
//!
//! Every containment question ("does the new entry reach anything the old list did
//! not?") is answered by the pattern code of live traffic (`HostPattern::covers`,
//! `HostPattern::overlaps`), so a reordering or an equivalent rewrite (`API.Example.com.`
//! for `api.example.com`, an exact host under an existing wildcard) is no change, and
//! `*.svc.example.net` becoming `*.example.net` is a widening. Judgements are per entry:
//! an entry covered only by several old entries together is reported as a widening (the
//! safe side for a reviewer).
//!
//! Here: the view and its conversions; `change.rs` the words of a change; `compare.rs`
//! (with `rules.rs`) the judgement of two views;
//! `diff.rs` the whole-configuration review. Like the rest of the crate, nothing here
//! reads a file or reaches the network.

mod change;
mod compare;
mod diff;
mod exposure;
mod rules;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{Authority, AuthorityLimits, WatchdogEndpoint};
use crate::error::PolicyError;
use crate::grant::{Advice, DenyEntry, Grant, GrantSpec, RequestRuleSpec};

pub use change::{Change, Direction, RiskClass};
pub use compare::{compare, compare_global};
pub use diff::{AuthorityReview, Outcome, Review, Side, Status, diff};
pub use exposure::Exposure;

/// What one authority may reach and through which channel, as data. Every list holds the
/// entries as written; `deny` holds the authority's own entries only (the `[global]`
/// ones are the same for every authority and travel beside it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reach {
    /// The authority's name.
    pub name: String,
    /// `allow` (host patterns, design section 4.1).
    #[serde(default)]
    pub allow: Vec<String>,
    /// The authority's own `deny` entries, each with its operator reason.
    #[serde(default)]
    pub deny: Vec<DenyView>,
    /// `default_deny_reason`, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_deny_reason: Option<String>,
    /// `allow_private` (CIDRs; a single address as `/32` or `/128`).
    #[serde(default)]
    pub allow_private: Vec<String>,
    /// `sni_check`.
    pub sni_check: bool,
    /// `tls_terminate` (host patterns).
    #[serde(default)]
    pub tls_terminate: Vec<String>,
    /// `[[authority.request_rule]]`, in grant order.
    #[serde(default)]
    pub request_rules: Vec<RuleView>,
    /// `[[authority.credential]]`: where a secret goes, never the secret.
    #[serde(default)]
    pub credentials: Vec<CredentialView>,
    /// `watchdog` (`unix:/path` or `http://127.0.0.1:port/path`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<String>,
    /// The authority's own limits (design section 13).
    #[serde(default)]
    pub limits: LimitsView,
    /// `ask` (design section 20), if set: where a grant miss is asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<AskView>,
    /// How a client proves it is this authority.
    #[serde(default)]
    pub channel: ChannelView,
}

/// One deny entry: a host pattern and the operator's reason, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenyView {
    /// The pattern as written (`*.pastebin.com`, `*:25`).
    pub host: String,
    /// The operator's reason (printable ASCII, at most 400 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One request rule as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleView {
    /// The host pattern it narrows.
    pub host: String,
    /// Allowed methods; empty: every method.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Allowed path prefixes; empty: every path.
    #[serde(default)]
    pub path_prefixes: Vec<String>,
    /// Required headers: lowercase name -> value pattern.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Allowed query parameter names; absent: any query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<Vec<String>>,
    /// Upgrade tokens besides `websocket` it allows, lowercase.
    #[serde(default)]
    pub upgrade: Vec<String>,
}

/// Where one credential's secret goes (design section 14).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialView {
    /// The host pattern it is added for.
    pub host: String,
    /// The request header it goes in, lowercase.
    pub header: String,
    /// Where the secret is read from (`secret_file "/etc/..."`, `secret_env "VAR"`):
    /// present only when read from a configuration file ([`Sources::Shown`]); the admin
    /// API never shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// An authority's own limits (design section 13), as configured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsView {
    /// `max_connections`; absent: the mediator's `[limits] authority_connections`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// `connect_rate`, new connections per second; 0: unlimited.
    #[serde(default)]
    pub connect_rate: u32,
    /// `connect_burst`.
    #[serde(default)]
    pub connect_burst: u32,
}

/// An authority's asking (design section 20), as configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AskView {
    /// `ask`: `unix:/path`, `http://127.0.0.1:port/path` or `admin`.
    pub endpoint: String,
    /// `ask_timeout_s`.
    pub timeout_s: u64,
    /// `max_pending_asks`.
    pub max_pending: u32,
}

/// How a client proves it is the authority: its token (on the TCP listener) and its Unix
/// socket's permissions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelView {
    /// The token's id: the first 12 hex digits of its SHA-256 (of `token_sha256`),
    /// never the token; absent: no token, not reachable on the TCP listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<String>,
    /// `socket_mode`, four octal digits (`"0600"`).
    pub socket_mode: String,
    /// `socket_uid`, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_uid: Option<u32>,
    /// `socket_gid`, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_gid: Option<u32>,
    /// `node`: where the socket and the token exist, `"*"` (every replica, the default,
    /// not shown) or one node's name.
    #[serde(default = "fleet", skip_serializing_if = "is_fleet")]
    pub node: String,
}

/// The `node` of an authority every replica serves.
fn fleet() -> String {
    crate::config::FLEET.to_owned()
}

/// Whether `node` is every replica's.
fn is_fleet(node: &str) -> bool {
    node == crate::config::FLEET
}

impl Default for ChannelView {
    fn default() -> Self {
        Self {
            token_id: None,
            socket_mode: "0600".to_owned(),
            socket_uid: None,
            socket_gid: None,
            node: fleet(),
        }
    }
}

/// Whether a [`Reach`] names where its credentials' secrets are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sources {
    /// Named (`mediator diff` of two files: a changed source is a different secret).
    Shown,
    /// Not named (what the admin API serves).
    Hidden,
}

impl Reach {
    /// The reach of a validated authority. Its own deny entries only: the `[global]`
    /// ones are [`global_deny_of`] it.
    pub fn of(a: &Authority, sources: Sources) -> Self {
        let g = &a.grant;
        Self {
            name: g.name().to_owned(),
            allow: g.allow_entries().map(str::to_owned).collect(),
            deny: g
                .own_deny()
                .map(|(p, reason)| DenyView {
                    host: p.source.clone(),
                    reason: reason.map(str::to_owned),
                })
                .collect(),
            default_deny_reason: g.default_deny_reason().map(str::to_owned),
            allow_private: g.allow_private().iter().map(ToString::to_string).collect(),
            sni_check: g.sni_check(),
            tls_terminate: g.tls_patterns().iter().map(|p| p.source.clone()).collect(),
            request_rules: g
                .request_rules()
                .iter()
                .map(|r| RuleView {
                    host: r.host.source.clone(),
                    methods: r.methods.clone(),
                    path_prefixes: r.path_prefixes.clone(),
                    headers: r
                        .headers
                        .iter()
                        .map(|h| (h.name.clone(), h.pattern.clone()))
                        .collect(),
                    query: r.query.as_ref().map(|q| q.iter().cloned().collect()),
                    upgrade: r.upgrade.iter().map(|t| t.as_str().to_owned()).collect(),
                })
                .collect(),
            credentials: a
                .credentials
                .iter()
                .map(|c| CredentialView {
                    host: c.host().to_owned(),
                    header: c.header().to_owned(),
                    source: (sources == Sources::Shown).then(|| c.source.to_string()),
                })
                .collect(),
            watchdog: a.watchdog.as_ref().map(ToString::to_string),
            limits: LimitsView {
                max_connections: a.limits.max_connections,
                connect_rate: a.limits.connect_rate,
                connect_burst: a.limits.connect_burst,
            },
            ask: a.ask.as_ref().map(|k| AskView {
                endpoint: k.endpoint.to_string(),
                timeout_s: k.timeout.as_secs(),
                max_pending: k.max_pending,
            }),
            channel: ChannelView {
                token_id: a.token_sha256.map(|t| token_id(&t)),
                socket_mode: format!("{:04o}", a.socket_mode),
                socket_uid: a.socket_uid,
                socket_gid: a.socket_gid,
                node: a.node.as_str().to_owned(),
            },
        }
    }

    /// The grant spec this reach writes (entries as written, operator advice).
    pub fn spec(&self) -> GrantSpec {
        GrantSpec {
            name: self.name.clone(),
            allow: self.allow.clone(),
            deny: self
                .deny
                .iter()
                .map(|d| DenyEntry {
                    host: d.host.clone(),
                    reason: d.reason.clone(),
                })
                .collect(),
            default_deny_reason: self.default_deny_reason.clone(),
            allow_private: self.allow_private.clone(),
            sni_check: self.sni_check,
            tls_terminate: self.tls_terminate.clone(),
            request_rules: self
                .request_rules
                .iter()
                .map(|r| RequestRuleSpec {
                    host: r.host.clone(),
                    methods: r.methods.clone(),
                    path_prefixes: r.path_prefixes.clone(),
                    headers: r
                        .headers
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    query: r.query.clone(),
                    upgrade: r.upgrade.clone(),
                })
                .collect(),
            advice: Advice::Operator,
        }
    }

    /// The frozen grant, validated exactly as the configuration's, under `global_deny`.
    ///
    /// # Errors
    /// [`PolicyError::Config`] naming every bad entry.
    pub fn grant(&self, global_deny: &[DenyEntry]) -> Result<Grant, PolicyError> {
        Grant::new(&self.spec(), global_deny)
    }

    /// An authority that decides as this reach does, for judging targets
    /// (`mediator test --admin`): its grant under `global_deny`, its watchdog, limits and
    /// socket settings. It holds no token hash and no credentials (the admin API shows
    /// neither secrets nor placeholders), so a host name holding a placeholder is not
    /// refused as `credential_misuse` by it.
    ///
    /// # Errors
    /// [`PolicyError::Config`] when the grant, the watchdog or the socket mode is invalid.
    pub fn authority(&self, global_deny: &[DenyEntry]) -> Result<Authority, PolicyError> {
        let grant = self.grant(global_deny)?;
        let watchdog = self
            .watchdog
            .as_deref()
            .map(WatchdogEndpoint::parse)
            .transpose()
            .map_err(|e| PolicyError::Config(vec![format!("{}: watchdog: {e}", self.name)]))?;
        let ask = self
            .ask
            .as_ref()
            .map(|k| {
                crate::config::AskEndpoint::parse(&k.endpoint).map(|endpoint| crate::config::Ask {
                    endpoint,
                    timeout: std::time::Duration::from_secs(k.timeout_s),
                    max_pending: k.max_pending,
                })
            })
            .transpose()
            .map_err(|e| PolicyError::Config(vec![format!("{}: ask: {e}", self.name)]))?;
        let socket_mode = crate::config::parse_mode(&self.channel.socket_mode).map_err(|e| {
            PolicyError::Config(vec![format!(
                "{}: socket_mode {:?}: {e}",
                self.name, self.channel.socket_mode
            )])
        })?;
        let node = crate::config::Placement::parse(&self.channel.node).map_err(|e| {
            PolicyError::Config(vec![format!(
                "{}: node {:?}: {e}",
                self.name, self.channel.node
            )])
        })?;
        Ok(Authority {
            grant,
            token_sha256: None,
            socket_mode,
            socket_uid: self.channel.socket_uid,
            socket_gid: self.channel.socket_gid,
            watchdog,
            limits: AuthorityLimits {
                max_connections: self.limits.max_connections,
                connect_rate: self.limits.connect_rate,
                connect_burst: self.limits.connect_burst,
            },
            ask,
            credentials: Vec::new(),
            node,
        })
    }
}

/// The `[global] deny` entries folded into `a`'s grant, as written, with their reasons.
pub fn global_deny_of(a: &Authority) -> Vec<DenyEntry> {
    a.grant
        .global_deny()
        .map(|(p, reason)| DenyEntry {
            host: p.source.clone(),
            reason: reason.map(str::to_owned),
        })
        .collect()
}

/// The id of a token whose SHA-256 is `sha256`: its first 12 hex digits (design section
/// 21), which name the token in records without giving it away.
pub fn token_id(sha256: &[u8; 32]) -> String {
    sha256[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// Deny entries as views (for the admin API's `global_deny`).
pub fn deny_views(entries: &[DenyEntry]) -> Vec<DenyView> {
    entries
        .iter()
        .map(|e| DenyView {
            host: e.host.clone(),
            reason: e.reason.clone(),
        })
        .collect()
}

/// Views back into deny entries.
pub fn deny_entries(views: &[DenyView]) -> Vec<DenyEntry> {
    views
        .iter()
        .map(|v| DenyEntry {
            host: v.host.clone(),
            reason: v.reason.clone(),
        })
        .collect()
}
