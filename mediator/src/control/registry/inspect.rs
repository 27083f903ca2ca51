//! What `mediator check` and `mediator registry list` read of a registry, without changing
//! it: no lock taken, nothing set aside, nothing created.

use std::path::Path;
use std::time::SystemTime;

use policy::config::{Registry, RegistryBackend};
use serde::Serialize;
use serde_json::Value;

use super::{Loaded, RegistryError, default_state_dir, is_root};

/// A registry as read by `mediator registry list`.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    /// `local`, `etcd` or `memory`.
    pub backend: String,
    /// The state directory, the etcd endpoints and prefix, or "this process's memory".
    pub location: String,
    /// The stored authorities, by name.
    pub authorities: Vec<Listed>,
    /// Records that cannot be read: (file or key, why). A start sets them aside.
    pub rejected: Vec<(String, String)>,
    /// What else a reader should know (a directory a start would create, a memory
    /// registry that keeps nothing).
    pub note: Option<String>,
}

/// One stored authority as listed. Never a token: only whether it has one.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    /// Its name.
    pub name: String,
    /// Its generation.
    pub generation: u64,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// When it expires (RFC 3339), for one created with `ttl_s`.
    pub expires_at: Option<String>,
    /// Whether it has expired (a start drops it).
    pub expired: bool,
    /// Its allow entries.
    pub allow: Vec<String>,
    /// Whether it can be used on the TCP listener (it has a token hash).
    pub token: bool,
    /// Where it is served: `"*"` or a node name.
    pub node: String,
}

impl Listing {
    /// One line without a newline: `registry: <backend> <location>: <n> stored
    /// authority|authorities`.
    pub fn summary(&self) -> String {
        let n = self.authorities.len();
        let noun = if n == 1 { "authority" } else { "authorities" };
        format!(
            "registry: {} {}: {n} stored {noun}",
            self.backend, self.location
        )
    }

    /// The listing as text: a header line, one line per authority, one per rejected
    /// record.
    pub fn render_text(&self) -> String {
        let mut out = format!("{}\n", self.summary());
        if let Some(note) = &self.note {
            out.push_str(&format!("note: {note}\n"));
        }
        for a in &self.authorities {
            out.push_str(&format!(
                "{}\tgeneration {}\tcreated {}\texpires {}{}\ttoken {}\tallow {}\tnode {}\n",
                a.name,
                a.generation,
                a.created_at,
                a.expires_at.as_deref().unwrap_or("never"),
                if a.expired { " (expired)" } else { "" },
                if a.token { "yes" } else { "no" },
                a.allow.join(","),
                a.node
            ));
        }
        for (what, why) in &self.rejected {
            out.push_str(&format!("unreadable: {what}: {why}\n"));
        }
        out
    }
}

/// Reads the registry `config` names, changing nothing.
///
/// # Errors
/// [`RegistryError`] when the state directory cannot be read or would not be usable by a
/// start (not writable, writable by others), or etcd cannot be reached.
pub(crate) async fn inspect(config: &Registry) -> Result<Listing, RegistryError> {
    let (location, loaded, note) = match config.backend {
        RegistryBackend::Memory => (
            "this process's memory".to_owned(),
            Loaded::default(),
            Some("backend = \"memory\" keeps nothing: authorities created through the admin API are lost when the process ends".to_owned()),
        ),
        RegistryBackend::Local => {
            let dir = match &config.state_dir {
                Some(d) => d.clone(),
                None => default_state_dir(|k| std::env::var_os(k), is_root()),
            };
            let (loaded, note) = local_view(&dir)?;
            (dir.display().to_string(), loaded, note)
        }
        #[cfg(feature = "etcd")]
        RegistryBackend::Etcd => {
            let (loaded, legacy) = super::etcd::Etcd::list_once(config).await?;
            (
                format!("{} prefix {}", config.endpoints.join(","), config.prefix),
                loaded,
                (legacy > 0).then(|| format!("{legacy} records are in the layout before placement by node ({}authorities/): the next start of a mediator moves them to {}fleet/", config.prefix, config.prefix)),
            )
        }
        #[cfg(not(feature = "etcd"))]
        RegistryBackend::Etcd => return Err(RegistryError::NotBuilt),
    };
    let now = SystemTime::now();
    let authorities = loaded
        .records
        .into_iter()
        .map(|s| Listed {
            expired: s.record.expired(now),
            allow: s
                .record
                .authority
                .get("allow")
                .and_then(Value::as_array)
                .map(|v| {
                    v.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            token: s.record.authority.contains_key("token_sha256"),
            node: s
                .record
                .placement()
                .map_or_else(|e| format!("? ({e})"), |p| p.as_str().to_owned()),
            name: s.record.name,
            generation: s.generation,
            created_at: s.record.created_at,
            expires_at: s.record.expires_at,
        })
        .collect();
    Ok(Listing {
        backend: config.backend.as_str().to_owned(),
        location,
        authorities,
        rejected: loaded
            .rejected
            .into_iter()
            .map(|r| (r.what, r.why))
            .collect(),
        note,
    })
}

/// Whether this build can use `backend = "etcd"`.
///
/// # Errors
/// [`RegistryError::NotBuilt`] in a build without the cargo feature `etcd`.
pub(crate) fn check_etcd_build() -> Result<(), RegistryError> {
    #[cfg(not(feature = "etcd"))]
    return Err(RegistryError::NotBuilt);
    #[cfg(feature = "etcd")]
    Ok(())
}

/// The local state directory as a start would find it.
fn local_view(dir: &Path) -> Result<(Loaded, Option<String>), RegistryError> {
    if std::fs::symlink_metadata(dir).is_err() {
        let base = crate::writable::nearest_existing(dir);
        crate::writable::may_create_in(base).map_err(|e| RegistryError::io(dir, e))?;
        return Ok((
            Loaded::default(),
            Some(format!(
                "{} does not exist yet: a start creates it (mode 0700)",
                dir.display()
            )),
        ));
    }
    crate::writable::may_create_in(dir).map_err(|e| RegistryError::io(dir, e))?;
    super::local::check_mode(dir)?;
    let records = dir.join("authorities");
    if std::fs::symlink_metadata(&records).is_err() {
        return Ok((Loaded::default(), None));
    }
    Ok((super::local::read(&records, false)?, None))
}
