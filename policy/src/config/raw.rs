//! The raw shape of `mediator.toml` (design section 11): serde structs with
//! `deny_unknown_fields`, every value kept `Spanned` so that a problem found later can be
//! reported at its `FILE:LINE:COL`. Nothing here is validated: these types never leave the
//! config module, and validation (`validate`, `upstream`, `authority`) turns them into the
//! public types. No I/O.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// The sections of `mediator.toml`; any other top-level key is an error.
pub(super) const TOP_LEVEL_KEYS: &[&str] = &[
    "listen",
    "resolver",
    "upstream",
    "tls",
    "timeouts",
    "limits",
    "log",
    "telemetry",
    "global",
    "registry",
    "authority",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListen {
    pub(super) socket_dir: Option<Spanned<String>>,
    pub(super) tcp: Option<Spanned<String>>,
    pub(super) admin: Option<Spanned<String>>,
    pub(super) admin_socket: Option<Spanned<String>>,
    pub(super) admin_token_sha256: Option<Spanned<String>>,
    pub(super) admin_allow_anonymous_writes: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawResolver {
    pub(super) nameservers: Option<Vec<Spanned<String>>>,
    pub(super) hosts: Option<BTreeMap<Spanned<String>, Vec<Spanned<String>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    pub(super) mode: Option<Spanned<String>>,
    pub(super) parents: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) pac: Option<Spanned<String>>,
    pub(super) allowed_parents: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) pin_through_parent: Option<bool>,
    pub(super) parent_retry_secs: Option<Spanned<u64>>,
    pub(super) parent_credentials_file: Option<Spanned<String>>,
    pub(super) pac_cache_secs: Option<Spanned<u64>>,
    pub(super) pac_refresh_secs: Option<Spanned<u64>>,
    pub(super) pac_budget_ms: Option<Spanned<u64>>,
    pub(super) pac_memory_mb: Option<Spanned<u64>>,
    pub(super) pac_on_error: Option<Spanned<String>>,
    pub(super) pac_fetch_via: Option<Spanned<String>>,
    pub(super) parent_auth: Option<BTreeMap<Spanned<String>, Spanned<String>>>,
    pub(super) kerberos_ccache: Option<Spanned<String>>,
    pub(super) kerberos_keytab: Option<Spanned<String>>,
    pub(super) gssapi_library: Option<Spanned<String>>,
    pub(super) system_user: Option<Spanned<String>>,
    pub(super) dconf_databases: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) kioslaverc_files: Option<Spanned<Vec<Spanned<String>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) ca_dir: Option<Spanned<String>>,
    pub(super) extra_ca_files: Option<Vec<Spanned<String>>>,
}

/// `[timeouts]`, in seconds.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTimeouts {
    pub(super) request_head: Option<Spanned<u64>>,
    pub(super) dns: Option<Spanned<u64>>,
    pub(super) connect: Option<Spanned<u64>>,
    pub(super) idle_tunnel: Option<Spanned<u64>>,
    pub(super) shutdown_grace: Option<Spanned<u64>>,
    pub(super) revoke_grace: Option<Spanned<u64>>,
    pub(super) watchdog: Option<Spanned<u64>>,
    pub(super) idle_upstream: Option<Spanned<u64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub(super) request_head_bytes: Option<Spanned<u64>>,
    pub(super) max_connections: Option<Spanned<i64>>,
    pub(super) authority_connections: Option<Spanned<i64>>,
    pub(super) unidentified_connections: Option<Spanned<i64>>,
    pub(super) idle_upstream_connections: Option<Spanned<i64>>,
    pub(super) authority_idle_upstream_connections: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    pub(super) decisions: Option<Spanned<String>>,
    pub(super) instance: Option<Spanned<String>>,
    pub(super) format: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    pub(super) otlp_endpoint: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGlobal {
    pub(super) deny: Option<Vec<Spanned<RawDeny>>>,
}

/// One `deny` entry as written: a plain host pattern, or a table with the operator's
/// reason (`{ host = "*.pastebin.com", reason = "..." }`, design section 18).
pub(super) struct RawDeny(pub(super) crate::grant::DenyEntry);

/// The table form of a `deny` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDenyTable {
    host: String,
    reason: Option<String>,
}

impl<'de> Deserialize<'de> for RawDeny {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawDeny;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a host pattern, or a table { host = \"...\", reason = \"...\" }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawDeny, E> {
                Ok(RawDeny(v.into()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawDeny, A::Error> {
                let t =
                    RawDenyTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(RawDeny(crate::grant::DenyEntry {
                    host: t.host,
                    reason: t.reason,
                }))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// One `[[authority]]` (also the whole document given to `parse_authority`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuthority {
    pub(super) name: Option<Spanned<String>>,
    pub(super) allow: Option<Vec<Spanned<String>>>,
    pub(super) deny: Option<Vec<Spanned<RawDeny>>>,
    pub(super) default_deny_reason: Option<Spanned<String>>,
    pub(super) allow_private: Option<Vec<Spanned<String>>>,
    pub(super) token_sha256: Option<Spanned<String>>,
    pub(super) sni_check: Option<bool>,
    pub(super) tls_terminate: Option<Vec<Spanned<String>>>,
    pub(super) watchdog: Option<Spanned<String>>,
    pub(super) socket_mode: Option<Spanned<String>>,
    pub(super) socket_uid: Option<u32>,
    pub(super) socket_gid: Option<u32>,
    pub(super) request_rule: Option<Vec<Spanned<RawRequestRule>>>,
    pub(super) credential: Option<Vec<Spanned<RawCredential>>>,
    pub(super) max_connections: Option<Spanned<i64>>,
    pub(super) connect_rate: Option<Spanned<i64>>,
    pub(super) connect_burst: Option<Spanned<i64>>,
    pub(super) ask: Option<Spanned<String>>,
    pub(super) ask_timeout_s: Option<Spanned<i64>>,
    pub(super) max_pending_asks: Option<Spanned<i64>>,
    pub(super) node: Option<Spanned<String>>,
}

/// `[[authority.request_rule]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRequestRule {
    pub(super) host: Option<String>,
    pub(super) methods: Option<Vec<String>>,
    pub(super) path_prefixes: Option<Vec<String>>,
    pub(super) headers: Option<BTreeMap<String, String>>,
    pub(super) query: Option<Vec<String>>,
    pub(super) upgrade: Option<Vec<String>>,
}

/// `[[authority.credential]]` (design section 14).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCredential {
    pub(super) host: Option<String>,
    pub(super) header: Option<String>,
    pub(super) secret_file: Option<String>,
    pub(super) secret_env: Option<String>,
    pub(super) format: Option<String>,
    pub(super) placeholder: Option<String>,
    pub(super) child_env: Option<String>,
}
