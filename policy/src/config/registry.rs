//! `[registry]` (design section 17): where the authorities created through the admin API
//! are kept, so that they outlive the process and (with etcd) are the same on every
//! replica. Parsed and checked here; the mediator resolves the default state directory
//! (it reads the environment) and talks to the backends. No I/O.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::validate::Validator;

/// `[registry] backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RegistryBackend {
    /// Records under `state_dir`, one file per authority, written durably (the default).
    #[default]
    Local,
    /// An etcd cluster shared by the replicas.
    Etcd,
    /// The process only: API authorities die with it (warned at start).
    Memory,
}

impl RegistryBackend {
    /// The configuration string: `local`, `etcd` or `memory`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Etcd => "etcd",
            Self::Memory => "memory",
        }
    }
}

impl std::fmt::Display for RegistryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The validated `[registry]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    /// Where API authorities are kept.
    pub backend: RegistryBackend,
    /// `local`: the directory of the records, as configured (absolute); `None`: the
    /// default the mediator resolves (`$STATE_DIRECTORY`, else
    /// `$XDG_STATE_HOME/egress-mediator`, else `/var/lib/egress-mediator` as root, else
    /// `~/.local/state/egress-mediator`).
    pub state_dir: Option<PathBuf>,
    /// `etcd`: the members' client URLs (`http://127.0.0.1:2379`, `https://...`).
    pub endpoints: Vec<String>,
    /// `etcd`: the key prefix; records live under `<prefix>fleet/<name>` (every replica)
    /// and `<prefix>nodes/<node>/<name>` (one node), names under `<prefix>names/<name>`.
    pub prefix: String,
    /// `etcd`: how long a replica may go without a confirmed-current view before it fails
    /// closed (`registry_unavailable`).
    pub max_staleness: Duration,
    /// `etcd` over https: a PEM bundle the members' certificates must chain to.
    pub ca_file: Option<PathBuf>,
    /// `etcd` over https: the client certificate (PEM), with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// `etcd` over https: the client key (PEM), with `cert_file`.
    pub key_file: Option<PathBuf>,
    /// `node`: the name of the node this replica serves (authorities placed on another
    /// node are not served here). `None`: not configured; the mediator then takes
    /// `$MEDIATOR_NODE`, else the host name (it reads the environment; this crate does
    /// not).
    pub node: Option<String>,
}

/// The default `prefix`.
pub const DEFAULT_PREFIX: &str = "/egress-mediator/";

/// The default `max_staleness_s`.
pub const DEFAULT_MAX_STALENESS: Duration = Duration::from_secs(10);

impl Default for Registry {
    fn default() -> Self {
        Self {
            backend: RegistryBackend::default(),
            state_dir: None,
            endpoints: Vec::new(),
            prefix: DEFAULT_PREFIX.to_owned(),
            max_staleness: DEFAULT_MAX_STALENESS,
            ca_file: None,
            cert_file: None,
            key_file: None,
            node: None,
        }
    }
}

/// Where an authority is served (`[[authority]] node`): by every replica, or by the
/// replica of one node only (its socket and credential exist there and nowhere else).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Placement {
    /// `"*"`: every replica (the default).
    #[default]
    Fleet,
    /// One node's replica: the one whose `[registry] node` is this name.
    Node(String),
}

/// The `node` value of a fleet-wide authority.
pub const FLEET: &str = "*";

impl Placement {
    /// Reads a `node` value: `"*"` or a node name ([`check_node_name`]).
    ///
    /// # Errors
    /// What is wrong with the name.
    pub fn parse(value: &str) -> Result<Self, String> {
        if value == FLEET {
            return Ok(Self::Fleet);
        }
        check_node_name(value)?;
        Ok(Self::Node(value.to_owned()))
    }

    /// The `node` value: `"*"` or the node name.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Fleet => FLEET,
            Self::Node(n) => n,
        }
    }

    /// Whether the replica of node `node` serves an authority placed so.
    pub fn serves(&self, node: &str) -> bool {
        match self {
            Self::Fleet => true,
            Self::Node(n) => n == node,
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Checks a node name: a DNS name in lower case as Kubernetes names its nodes (RFC 1123
/// labels: 1..=63 of `a-z`, `0-9` and `-`, starting and ending with a letter or digit,
/// joined by dots; at most 253 bytes), so that `spec.nodeName` and host names fit.
///
/// # Errors
/// What is wrong, in words.
pub fn check_node_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a node name cannot be empty".into());
    }
    if name.len() > 253 {
        return Err(format!("node name {name:?} is longer than 253 bytes"));
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(format!(
            "node name {name:?} has upper case letters: write it in lower case ({:?})",
            name.to_ascii_lowercase()
        ));
    }
    for label in name.split('.') {
        let ok = (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!(
                "node name {name:?} is not a DNS name in lower case (labels of a-z, 0-9 and '-', 1..=63 bytes each, not starting or ending with '-', joined by '.')"
            ));
        }
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegistry {
    backend: Option<Spanned<String>>,
    state_dir: Option<Spanned<String>>,
    endpoints: Option<Spanned<Vec<Spanned<String>>>>,
    prefix: Option<Spanned<String>>,
    max_staleness_s: Option<Spanned<u64>>,
    ca_file: Option<Spanned<String>>,
    cert_file: Option<Spanned<String>>,
    key_file: Option<Spanned<String>>,
    node: Option<Spanned<String>>,
}

impl Validator<'_> {
    /// Checks `[registry]`: a known backend; `etcd` with at least one `http(s)://host:port`
    /// endpoint; a prefix that starts and ends with `/`; `max_staleness_s` in 1..=3600;
    /// absolute paths; the TLS files only with etcd (client certificate and key together);
    /// a node name ([`check_node_name`]).
    pub(super) fn registry(&mut self, raw: RawRegistry) -> Registry {
        let what = "[registry]";
        let mut out = Registry::default();
        if let Some(b) = &raw.backend {
            out.backend = match b.get_ref().as_str() {
                "local" => RegistryBackend::Local,
                "etcd" => RegistryBackend::Etcd,
                "memory" => RegistryBackend::Memory,
                other => {
                    self.error(
                        Some(b.span()),
                        what,
                        format!("backend {other:?}: write \"local\", \"etcd\" or \"memory\""),
                    );
                    RegistryBackend::Local
                }
            };
        }
        let path = |v: &Option<Spanned<String>>, key: &str, this: &mut Self| {
            let v = v.as_ref()?;
            if v.get_ref().starts_with('/') && !v.get_ref().chars().any(char::is_control) {
                Some(PathBuf::from(v.get_ref()))
            } else {
                this.error(
                    Some(v.span()),
                    what,
                    format!("{key}: write an absolute path"),
                );
                None
            }
        };
        out.state_dir = path(&raw.state_dir, "state_dir", self);
        out.ca_file = path(&raw.ca_file, "ca_file", self);
        out.cert_file = path(&raw.cert_file, "cert_file", self);
        out.key_file = path(&raw.key_file, "key_file", self);
        for e in raw.endpoints.iter().flat_map(|l| l.get_ref()) {
            match check_endpoint(e.get_ref()) {
                None => out.endpoints.push(e.get_ref().clone()),
                Some(why) => self.error(
                    Some(e.span()),
                    what,
                    format!("endpoints: {:?}: {why}", e.get_ref()),
                ),
            }
        }
        if let Some(p) = &raw.prefix {
            let s = p.get_ref();
            if s.starts_with('/') && s.ends_with('/') && !s.chars().any(char::is_control) {
                out.prefix = s.clone();
            } else {
                self.error(
                    Some(p.span()),
                    what,
                    "prefix must start and end with '/', like \"/egress-mediator/\"",
                );
            }
        }
        if let Some(s) = &raw.max_staleness_s {
            if (1..=3600).contains(s.get_ref()) {
                out.max_staleness = Duration::from_secs(*s.get_ref());
            } else {
                self.error(
                    Some(s.span()),
                    what,
                    format!("max_staleness_s = {} is out of range 1..=3600", s.get_ref()),
                );
            }
        }
        if let Some(n) = &raw.node {
            match check_node_name(n.get_ref()) {
                Ok(()) => out.node = Some(n.get_ref().clone()),
                Err(why) => self.error(Some(n.span()), what, format!("node: {why}")),
            }
        }
        self.registry_fits_backend(&raw, &out);
        out
    }

    /// The keys of `[registry]` that its backend needs, and none of another's.
    fn registry_fits_backend(&mut self, raw: &RawRegistry, out: &Registry) {
        let what = "[registry]";
        match out.backend {
            RegistryBackend::Etcd => {
                if out.endpoints.is_empty() {
                    self.error(
                        raw.backend.as_ref().map(Spanned::span),
                        what,
                        "backend = \"etcd\" needs endpoints, like [\"http://127.0.0.1:2379\"]",
                    );
                }
                if out.cert_file.is_some() != out.key_file.is_some() {
                    self.error(
                        raw.cert_file
                            .as_ref()
                            .or(raw.key_file.as_ref())
                            .map(Spanned::span),
                        what,
                        "cert_file and key_file go together",
                    );
                }
            }
            RegistryBackend::Local | RegistryBackend::Memory => {
                for (key, v) in [
                    ("endpoints", raw.endpoints.as_ref().map(Spanned::span)),
                    ("prefix", raw.prefix.as_ref().map(Spanned::span)),
                    (
                        "max_staleness_s",
                        raw.max_staleness_s.as_ref().map(Spanned::span),
                    ),
                    ("ca_file", raw.ca_file.as_ref().map(Spanned::span)),
                    ("cert_file", raw.cert_file.as_ref().map(Spanned::span)),
                    ("key_file", raw.key_file.as_ref().map(Spanned::span)),
                ] {
                    if v.is_some() {
                        self.error(
                            v,
                            what,
                            format!(
                                "{key} is for backend = \"etcd\"; this backend is \"{}\"",
                                out.backend
                            ),
                        );
                    }
                }
                if out.backend == RegistryBackend::Memory && out.state_dir.is_some() {
                    self.error(
                        raw.state_dir.as_ref().map(Spanned::span),
                        what,
                        "state_dir is for backend = \"local\"; \"memory\" keeps nothing",
                    );
                }
            }
        }
    }
}

/// What is wrong with an etcd client URL, if anything: it must be `http://` or
/// `https://`, a host and a port, nothing else.
fn check_endpoint(e: &str) -> Option<&'static str> {
    let Some((scheme, rest)) = e.split_once("://") else {
        return Some("write http://host:port or https://host:port");
    };
    if scheme != "http" && scheme != "https" {
        return Some("the scheme is http or https");
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#', '@']) || rest.chars().any(|c| c.is_control() || c == ' ') {
        return Some("only a host and port, no path or userinfo");
    }
    crate::host::parse_authority_form(rest)
        .is_err()
        .then_some("the host or port is not valid (write host:port)")
}
