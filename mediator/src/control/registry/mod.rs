//! The authority registry (design section 17): where the authorities created through the
//! admin API are kept, so that they outlive the process and, with a shared backend, are
//! the same on every replica. Config authorities are not stored: the file is their record.
//!
//! One small trait, [`Store`], with three backends: [`memory`] (the process only),
//! [`local`] (files under a state directory, the default) and `etcd` (cargo feature
//! `etcd`). The control plane asks the store to create or remove, then changes the live
//! set; an etcd watch event takes the same path (`super::apply`).
//!
//! What is stored is a [`Record`]: the validated `[[authority]]` table as flat JSON (the
//! token's SHA-256, never a token; API authorities cannot name credentials), `created_at`
//! and `expires_at`, plus its generation, sealed with a SHA-256 so that a damaged record is
//! refused, never half-read.

pub(crate) mod error;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod inspect;
pub(crate) mod local;
pub(crate) mod memory;
pub(crate) mod metrics;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use policy::config::{Placement, Registry, RegistryBackend};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub(crate) use error::RegistryError;
use sha2::{Digest, Sha256};

#[cfg(feature = "etcd")]
pub(crate) use metrics::KeyRange;
pub(crate) use metrics::{ErrorKind, Op, RegistryMetrics};

/// The version of the stored record format.
const FORMAT: u32 = 1;

/// One stored authority: what a create writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// The authority's name (also the table's `name`).
    pub(crate) name: String,
    /// When it was created (RFC 3339, UTC).
    pub(crate) created_at: String,
    /// When it is revoked by itself (RFC 3339, UTC), for a create that asked `ttl_s`.
    pub(crate) expires_at: Option<String>,
    /// The `[[authority]]` table as flat JSON, as validated at create (a generated token's
    /// SHA-256 included).
    pub(crate) authority: Map<String, Value>,
}

impl Record {
    /// Where it is served: its table's `node` (`"*"` when absent).
    ///
    /// # Errors
    /// A `node` that is not a string, `"*"` or a node name.
    pub(crate) fn placement(&self) -> Result<Placement, String> {
        match self.authority.get("node") {
            None => Ok(Placement::Fleet),
            Some(Value::String(s)) => Placement::parse(s),
            Some(_) => Err("node must be a string".into()),
        }
    }

    /// Whether it has expired at `now`. A record whose `expires_at` cannot be read counts
    /// as expired: it cannot be vouched for.
    pub(crate) fn expired(&self, now: std::time::SystemTime) -> bool {
        self.expires_at
            .as_deref()
            .is_some_and(|t| humantime::parse_rfc3339(t).map_or(true, |t| t <= now))
    }
}

/// A record as loaded or watched, with its generation (local: assigned at create; etcd:
/// the key's revision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    /// The record.
    pub(crate) record: Record,
    /// Its generation.
    pub(crate) generation: u64,
}

/// A stored record that could not be read, set aside (named, never silently dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejected {
    /// Which record: a file, or an etcd key.
    pub(crate) what: String,
    /// Why.
    pub(crate) why: String,
    /// The metric label.
    pub(crate) kind: ErrorKind,
}

/// Everything a store holds at one moment.
#[derive(Debug, Clone, Default)]
pub(crate) struct Loaded {
    /// The readable records (expired ones included: the caller drops them).
    pub(crate) records: Vec<Stored>,
    /// The records that could not be read.
    pub(crate) rejected: Vec<Rejected>,
    /// etcd: the revision this view is at; 0 elsewhere.
    pub(crate) revision: i64,
}

/// A change a watch saw, applied in order (etcd only).
#[derive(Debug, Clone)]
#[cfg_attr(
    not(feature = "etcd"),
    expect(dead_code, reason = "made by the etcd backend's watch")
)]
pub(crate) enum Change {
    /// A record was created, or changed in place by another writer.
    Put(Stored),
    /// A record was removed (deleted, or its lease expired), at `revision`.
    Delete {
        /// The authority.
        name: String,
        /// The revision of the removal.
        revision: u64,
    },
    /// A record under the prefix that cannot be read.
    Rejected(Rejected),
    /// The whole view, re-listed after a lost watch that cannot resume (compacted).
    Snapshot(Loaded),
    /// Every change up to this revision has been sent.
    Progress(i64),
}

/// The registry's one interface: load all, create if absent, delete, and (etcd) watch.
pub(crate) trait Store: Send + Sync + std::fmt::Debug {
    /// Which backend this is.
    fn backend(&self) -> RegistryBackend;

    /// The node this replica serves (`[registry] node`, resolved): it serves the records
    /// placed on it or on every node (`"*"`).
    fn node(&self) -> &str;

    /// Whether it can hold a record placed on another node than [`Self::node`] (etcd:
    /// every replica's store is one; local and memory serve this node only).
    fn holds_other_nodes(&self) -> bool {
        false
    }

    /// Where it keeps records, for messages (`/var/lib/egress-mediator`, the endpoints).
    fn location(&self) -> String;

    /// A number no earlier start with this store was given (local: a counter file; etcd: a
    /// counter key; memory: 0): the high bits of this run's generations and decision ids.
    fn boot(&self) -> BoxFuture<'_, Result<u64, RegistryError>>;

    /// Every stored record this replica may serve (etcd: those of its node and the
    /// fleet-wide ones, after moving records of the layout before placement; local and
    /// memory: all, placed anywhere); unreadable ones are set aside and listed.
    fn load(&self) -> BoxFuture<'_, Result<Loaded, RegistryError>>;

    /// Stores `record` if no record of its name exists, durably before it returns;
    /// `generation` is the one this process assigned (etcd uses the key's revision
    /// instead, and `ttl` becomes a lease). Returns the record's generation.
    fn create<'a>(
        &'a self,
        record: &'a Record,
        generation: u64,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<u64, RegistryError>>;

    /// Removes the record named `name`, wherever it is placed (only if its generation is
    /// `generation`, when given), durably before it returns. Returns the revision of the
    /// removal (etcd) or 0, or `None` when there was no such record.
    fn delete<'a>(
        &'a self,
        name: &'a str,
        generation: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<u64>, RegistryError>>;

    /// Sets aside a record that was read but is not a valid authority (local: renamed
    /// `*.rejected`; etcd: left in place). Returns what it was named, for messages.
    fn set_aside<'a>(&'a self, name: &'a str) -> BoxFuture<'a, String>;

    /// Starts following changes made by other writers (etcd: the watch, and the periodic
    /// confirmation that the view is current): each goes to `changes`, in revision order;
    /// `fresh` says whether the view is confirmed current. Local and memory stores have no
    /// other writer and start nothing.
    fn follow(
        self: Arc<Self>,
        changes: tokio::sync::mpsc::Sender<Change>,
        fresh: Arc<dyn Fn(bool) + Send + Sync>,
        since: i64,
    ) {
        let _ = (changes, fresh, since);
    }
}

/// Opens the store `[registry]` names.
///
/// # Errors
/// [`RegistryError`] when the state directory cannot be made or locked, or etcd is asked
/// for in a build without it.
pub(crate) async fn open(
    config: &Registry,
    metrics: RegistryMetrics,
) -> Result<Arc<dyn Store>, RegistryError> {
    let node = node_of(config, |k| std::env::var_os(k), host_name).map_err(RegistryError::Node)?;
    match config.backend {
        RegistryBackend::Memory => Ok(Arc::new(memory::Memory::new(node))),
        RegistryBackend::Local => {
            let dir = match &config.state_dir {
                Some(d) => d.clone(),
                None => default_state_dir(|k| std::env::var_os(k), is_root()),
            };
            Ok(Arc::new(local::Local::open(&dir, node, metrics)?))
        }
        #[cfg(feature = "etcd")]
        RegistryBackend::Etcd => Ok(Arc::new(etcd::Etcd::connect(config, node, metrics).await?)),
        #[cfg(not(feature = "etcd"))]
        RegistryBackend::Etcd => {
            let _ = metrics;
            Err(RegistryError::NotBuilt)
        }
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The environment variable that names this replica's node when `[registry] node` does
/// not (the DaemonSet sets it from the downward API's `spec.nodeName`).
pub(crate) const NODE_ENV: &str = "MEDIATOR_NODE";

/// The kernel's host name (`/proc/sys/kernel/hostname`), if it can be read.
pub(crate) fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// The node this replica serves: `[registry] node`, else `$MEDIATOR_NODE`, else the host
/// name in lower case; each checked as a node name ([`policy::config::check_node_name`]).
///
/// # Errors
/// Which source gave a value that is not a node name, and how to set one.
pub(crate) fn node_of(
    config: &Registry,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
    host: impl FnOnce() -> Option<String>,
) -> Result<String, String> {
    if let Some(n) = &config.node {
        return Ok(n.clone());
    }
    if let Some(v) = env(NODE_ENV) {
        let v = v.to_string_lossy().into_owned();
        return policy::config::check_node_name(&v)
            .map(|()| v)
            .map_err(|why| format!("{NODE_ENV}: {why}"));
    }
    let Some(h) = host() else {
        return Err(format!(
            "the host name cannot be read: set [registry] node or {NODE_ENV}"
        ));
    };
    let lower = h.to_ascii_lowercase();
    policy::config::check_node_name(&lower)
        .map(|()| lower)
        .map_err(|why| {
            format!("the host name is not a node name ({why}): set [registry] node or {NODE_ENV}")
        })
}

/// The default state directory (design section 17): `$STATE_DIRECTORY` (systemd's
/// `StateDirectory=`; the first of a colon-separated list), else
/// `$XDG_STATE_HOME/egress-mediator`, else `/var/lib/egress-mediator` as root, else
/// `~/.local/state/egress-mediator`. Relative values are ignored, as the XDG base
/// directory specification says.
pub(crate) fn default_state_dir(
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
    root: bool,
) -> PathBuf {
    let absolute = |v: Option<std::ffi::OsString>| {
        v.map(PathBuf::from)
            .filter(|p| p.is_absolute() && !p.as_os_str().is_empty())
    };
    if let Some(dir) = env("STATE_DIRECTORY").and_then(|v| {
        let first = v.to_string_lossy().split(':').next().map(PathBuf::from)?;
        first.is_absolute().then_some(first)
    }) {
        return dir;
    }
    if let Some(dir) = absolute(env("XDG_STATE_HOME")) {
        return dir.join("egress-mediator");
    }
    if !root && let Some(home) = absolute(env("HOME")) {
        return home.join(".local/state/egress-mediator");
    }
    PathBuf::from("/var/lib/egress-mediator")
}

/// The sealed form of a record, as stored.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sealed {
    format: u32,
    generation: u64,
    record: Record,
    sha256: String,
}

/// The bytes the seal covers: the format, the generation and the record, as JSON.
fn sealed_digest(generation: u64, record: &Record) -> Result<String, RegistryError> {
    let body = serde_json::to_vec(&(FORMAT, generation, record))
        .map_err(|e| RegistryError::Encode(e.to_string()))?;
    Ok(hex::encode(Sha256::digest(&body)))
}

/// Encodes `record` with its generation and seal.
pub(crate) fn encode(record: &Record, generation: u64) -> Result<Vec<u8>, RegistryError> {
    let sealed = Sealed {
        format: FORMAT,
        generation,
        sha256: sealed_digest(generation, record)?,
        record: record.clone(),
    };
    let mut out =
        serde_json::to_vec_pretty(&sealed).map_err(|e| RegistryError::Encode(e.to_string()))?;
    out.push(b'\n');
    Ok(out)
}

/// Decodes a stored record; `name` is the name its place says (file or key). Returns the
/// record and its stored generation.
///
/// # Errors
/// Why it cannot be trusted: not JSON of the format, another format version, a seal
/// that does not match, or a name that is not its place's.
pub(crate) fn decode(bytes: &[u8], name: &str) -> Result<(Record, u64), String> {
    let sealed: Sealed =
        serde_json::from_slice(bytes).map_err(|e| format!("not a stored authority: {e}"))?;
    if sealed.format != FORMAT {
        return Err(format!(
            "format {} (this mediator reads {FORMAT})",
            sealed.format
        ));
    }
    let want = sealed_digest(sealed.generation, &sealed.record).map_err(|e| e.to_string())?;
    if want != sealed.sha256 {
        return Err("its SHA-256 does not match its content (damaged or edited)".into());
    }
    if sealed.record.name != name {
        return Err(format!(
            "it names authority {:?}, but is stored as {name:?}",
            sealed.record.name
        ));
    }
    if sealed.record.authority.get("name").and_then(Value::as_str) != Some(name) {
        return Err("its table's name is not its own".into());
    }
    Ok((sealed.record, sealed.generation))
}

#[cfg(test)]
mod tests {
    // The record's sealed encoding and the default state directory.

    use std::ffi::OsString;
    use std::path::Path;

    use policy::config::Placement;
    use serde_json::json;

    use super::*;

    fn record() -> Record {
        Record {
            name: "a".into(),
            created_at: "2026-12-04T10:00:00.000Z".into(),
            expires_at: Some("2026-12-04T11:00:00.000Z".into()),
            authority: json!({ "name": "a", "allow": ["x.test"], "token_sha256": "00" })
                .as_object()
                .unwrap()
                .clone(),
        }
    }

    #[test]
    fn a_record_round_trips_and_any_change_breaks_its_seal() {
        let bytes = encode(&record(), 42).unwrap();
        assert_eq!(decode(&bytes, "a").unwrap(), (record(), 42));
        let text = String::from_utf8(bytes).unwrap();
        for (from, to) in [
            ("x.test", "y.test"),
            ("\"generation\": 42", "\"generation\": 43"),
            ("11:00:00", "12:00:00"),
        ] {
            assert!(text.contains(from), "{from}");
            let e = decode(text.replace(from, to).as_bytes(), "a").unwrap_err();
            assert!(e.contains("SHA-256 does not match"), "{from}: {e}");
        }
        let e = decode(
            text.replace("\"format\": 1", "\"format\": 2").as_bytes(),
            "a",
        )
        .unwrap_err();
        assert!(e.contains("format 2"), "{e}");
        assert!(decode(&encode(&record(), 1).unwrap(), "b").is_err());
        assert!(decode(b"", "a").is_err());
    }

    #[test]
    fn expiry_reads_the_record() {
        let mut r = record();
        let at = |s: &str| humantime::parse_rfc3339(s).unwrap();
        assert!(!r.expired(at("2026-12-04T10:59:59Z")));
        assert!(r.expired(at("2026-12-04T11:00:00Z")));
        r.expires_at = Some("soon".into());
        assert!(
            r.expired(at("2026-12-04T10:00:00Z")),
            "unreadable counts as expired"
        );
        r.expires_at = None;
        assert!(!r.expired(at("2099-01-01T00:00:00Z")));
    }

    #[test]
    fn the_default_state_directory() {
        let d = |pairs: &'static [(&'static str, &'static str)], root| {
            default_state_dir(crate::testing::env(pairs), root)
        };
        assert_eq!(
            d(
                &[("STATE_DIRECTORY", "/var/lib/m:/other"), ("HOME", "/h")],
                false
            ),
            Path::new("/var/lib/m")
        );
        assert_eq!(
            d(&[("STATE_DIRECTORY", "/var/lib/m")], true),
            Path::new("/var/lib/m")
        );
        assert_eq!(
            d(&[("XDG_STATE_HOME", "/x"), ("HOME", "/h")], false),
            Path::new("/x/egress-mediator")
        );
        assert_eq!(
            d(&[("XDG_STATE_HOME", "rel"), ("HOME", "/h")], false),
            Path::new("/h/.local/state/egress-mediator")
        );
        assert_eq!(
            d(&[("XDG_STATE_HOME", "/x"), ("HOME", "/root")], true),
            Path::new("/x/egress-mediator")
        );
        assert_eq!(
            d(&[("HOME", "/root")], true),
            Path::new("/var/lib/egress-mediator")
        );
        assert_eq!(d(&[], false), Path::new("/var/lib/egress-mediator"));
        assert_eq!(
            d(&[("STATE_DIRECTORY", "relative")], true),
            Path::new("/var/lib/egress-mediator")
        );
    }

    #[test]
    fn the_node_is_the_config_s_else_the_environment_s_else_the_host_name() {
        let with = |node: Option<&str>| Registry {
            node: node.map(str::to_owned),
            ..Registry::default()
        };
        let env = |v: Option<&'static str>| {
            move |k: &str| (k == NODE_ENV).then_some(v).flatten().map(OsString::from)
        };
        let host = |h: Option<&'static str>| move || h.map(str::to_owned);
        assert_eq!(
            node_of(&with(Some("a")), env(Some("b")), host(Some("c"))),
            Ok("a".into())
        );
        assert_eq!(
            node_of(&with(None), env(Some("b")), host(Some("c"))),
            Ok("b".into())
        );
        assert_eq!(
            node_of(&with(None), env(None), host(Some("Web-1.Example"))),
            Ok("web-1.example".into())
        );
        let e = node_of(&with(None), env(Some("B_1")), host(Some("c"))).unwrap_err();
        assert!(e.contains(NODE_ENV) && e.contains("B_1"), "{e}");
        let e = node_of(&with(None), env(None), host(Some("under_score"))).unwrap_err();
        assert!(
            e.contains("host name") && e.contains("[registry] node"),
            "{e}"
        );
        let e = node_of(&with(None), env(None), host(None)).unwrap_err();
        assert!(e.contains("cannot be read"), "{e}");
    }

    #[test]
    fn a_record_s_placement_is_its_table_s_node() {
        let mut r = record();
        assert_eq!(r.placement(), Ok(Placement::Fleet));
        r.authority.insert("node".into(), json!("*"));
        assert_eq!(r.placement(), Ok(Placement::Fleet));
        r.authority.insert("node".into(), json!("n-1"));
        assert_eq!(r.placement(), Ok(Placement::Node("n-1".into())));
        r.authority.insert("node".into(), json!("N 1"));
        assert!(r.placement().is_err());
        r.authority.insert("node".into(), json!(1));
        assert!(r.placement().is_err());
    }
}
