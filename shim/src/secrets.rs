//! The mediator's own files, as paths the command must never read (design sections 12,
//! 14 and 17): the secrets and keys a mediator config names, and the mediator's default
//! locations. The credential's secret stays with the mediator only if its file does too.
//!
//! - From `--config` ([`from_config`]): each credential's `secret_file` (of every
//!   authority), `[tls] ca_dir` (its `ca.pem`, the certificate children trust, stays
//!   readable), the registry's `state_dir` and etcd client `key_file`, the
//!   `parent_credentials_file`, a PAC file, the Kerberos ccache and keytab, the admin API's
//!   socket, and the config file itself when it holds a parent's password.
//! - In every run ([`defaults`]): the mediator's default state directories and
//!   `/etc/egress-mediator`, when they exist.
//!
//! [`settle`] checks them against the writable roots and the re-opened reads before the
//! sandbox is built, and turns them into masks (as `--deny-read` paths are). Pure
//! bookkeeping and path resolution: it mounts nothing (the backend does).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::report::lossy_path;

/// Where a mediator path comes from, which decides what its absence means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Named by the `--config` file: it must exist (masks work by path: one that appears
    /// during the run would be readable).
    Config,
    /// A default location of the mediator's: masked when it exists.
    Default,
}

/// One path of the mediator's that the command must not read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct MediatorPath {
    /// The path as the config names it (or the default).
    #[serde(serialize_with = "lossy_path")]
    pub(crate) path: PathBuf,
    /// What it is, where the config says so: `m.toml:9:1: authority "a": credential[1]:
    /// secret_file`, `[tls] ca_dir`, `default state directory`.
    pub(crate) what: String,
    /// Where it comes from.
    #[serde(skip)]
    pub(crate) origin: Origin,
    /// A file beneath it that stays readable (the CA certificate in `ca_dir`).
    #[serde(skip)]
    pub(crate) keep_readable: Option<PathBuf>,
    /// Masked (else only kept out of the writable roots: a config file without a
    /// password, which the command may read but must not rewrite).
    #[serde(skip)]
    pub(crate) mask: bool,
}

impl MediatorPath {
    fn named(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            what: what.into(),
            origin: Origin::Config,
            keep_readable: None,
            mask: true,
        }
    }

    fn default_location(path: PathBuf, what: &str) -> Self {
        Self {
            origin: Origin::Default,
            ..Self::named(path, what)
        }
    }
}

/// The paths of `config` (read from `file`) that hold a secret or a key, or the
/// mediator's state (see the module documentation). A local registry without
/// `state_dir` uses a default location, which [`defaults`] covers.
pub(crate) fn from_config(config: &policy::config::Config, file: &Path) -> Vec<MediatorPath> {
    use policy::config::{RegistryBackend, SecretSource};
    let mut out = Vec::new();
    for c in config.authorities.iter().flat_map(|a| &a.credentials) {
        if let SecretSource::File(p) = &c.source {
            out.push(MediatorPath::named(
                p,
                format!("{}: secret_file", c.location),
            ));
        }
    }
    if let Some(dir) = &config.tls.ca_dir {
        out.push(MediatorPath {
            keep_readable: Some(dir.join(certs::CA_CERT_FILE)),
            ..MediatorPath::named(dir, "[tls] ca_dir (the CA's key)")
        });
    }
    let registry = &config.registry;
    match registry.backend {
        RegistryBackend::Local => out.extend(
            registry
                .state_dir
                .iter()
                .map(|d| MediatorPath::named(d, "[registry] state_dir")),
        ),
        RegistryBackend::Etcd => out.extend(
            registry
                .key_file
                .iter()
                .map(|k| MediatorPath::named(k, "[registry] key_file")),
        ),
        RegistryBackend::Memory => {}
    }
    let upstream = &config.upstream;
    if let Some(f) = &upstream.parent_credentials_file {
        out.push(MediatorPath::named(f, "[upstream] parent_credentials_file"));
    }
    if let Some(policy::upstream::PacSource::File(f)) = &upstream.pac {
        out.push(MediatorPath::named(f, "[upstream] pac"));
    }
    let kerberos = [
        (&upstream.kerberos.ccache, "[upstream] kerberos_ccache"),
        (&upstream.kerberos.keytab, "[upstream] kerberos_keytab"),
    ];
    for (value, what) in kerberos {
        if let Some(p) = value.as_deref().and_then(kerberos_path) {
            out.push(MediatorPath::named(p, what));
        }
    }
    if let Some(socket) = &config.listen.admin_socket {
        // Made by the mediator at its start: masked when it exists, like a default.
        out.push(MediatorPath {
            origin: Origin::Default,
            ..MediatorPath::named(socket, "[listen] admin_socket (the admin API)")
        });
    }
    // The mediator reloads it: never in a writable root, and masked when it holds a
    // password.
    out.push(if holds_password(config) {
        MediatorPath::named(file, "the config file (it holds a parent proxy's password)")
    } else {
        MediatorPath {
            mask: false,
            ..MediatorPath::named(file, "the config file")
        }
    });
    out
}

/// The file a Kerberos credential cache or keytab name stands for (`FILE:/p`, `DIR:/p`,
/// `WRFILE:/p` or an absolute path; MIT krb5's residual syntax); `None` for the kinds
/// that are not files (`KEYRING:`, `MEMORY:`, `KCM:`, `API:`).
fn kerberos_path(name: &str) -> Option<&Path> {
    let residual = match name.split_once(':') {
        Some(("FILE" | "DIR" | "WRFILE", rest)) => rest,
        Some(_) => return None,
        None => name,
    };
    Some(Path::new(residual)).filter(|p| p.is_absolute())
}

/// Whether the config holds a credential itself: a parent URL (or `pac_fetch_via`)
/// with a password.
fn holds_password(config: &policy::config::Config) -> bool {
    let upstream = &config.upstream;
    upstream
        .parents
        .iter()
        .chain(&upstream.pac_fetch_via)
        .any(|p| p.credentials.is_some())
}

/// The mediator's default locations on this host (design sections 16 and 17): the
/// state directory a mediator started from this environment would use
/// (`$XDG_STATE_HOME/egress-mediator`, `~/.local/state/egress-mediator`), root's
/// (`/var/lib/egress-mediator`, also the systemd unit's `StateDirectory`, which holds the
/// CA in the shipped setup), and the configuration directory `/etc/egress-mediator`.
/// `$STATE_DIRECTORY` is left out: in the shim's environment it is the state of whatever
/// service runs the shim, not the mediator's.
pub(crate) fn defaults(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Vec<MediatorPath> {
    let absolute = |name: &str| env(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let mut out = Vec::new();
    let state = "the mediator's default state directory";
    if let Some(x) = absolute("XDG_STATE_HOME") {
        out.push(MediatorPath::default_location(
            x.join("egress-mediator"),
            state,
        ));
    }
    if let Some(home) = absolute("HOME") {
        out.push(MediatorPath::default_location(
            home.join(".local/state/egress-mediator"),
            state,
        ));
    }
    out.push(MediatorPath::default_location(
        PathBuf::from("/var/lib/egress-mediator"),
        state,
    ));
    out.push(MediatorPath::default_location(
        PathBuf::from("/etc/egress-mediator"),
        "the mediator's configuration directory",
    ));
    out
}

/// What the sandbox makes of the mediator's paths.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    /// Masked, as `--deny-read` paths are.
    pub(crate) masks: Vec<PathBuf>,
    /// Re-opened beneath a mask (the CA certificate).
    pub(crate) reopen: Vec<PathBuf>,
    /// What was masked, for `--report`.
    pub(crate) masked: Vec<MediatorPath>,
}

/// Checks `paths` against the writable roots and the re-opened reads (as given) and
/// settles what to mask. A default location that does not exist is left out, and so is
/// a path this process cannot resolve for lack of permission (the command, which has no
/// more rights, cannot reach it either).
///
/// # Errors
/// [`Error::MediatorPath`] naming the path when a path the config names does not exist
/// (it could appear during the run, unmasked), when a path lies inside a writable root
/// or holds one (the command could replace it, or write beneath it), or when an
/// `--allow-read` would re-open it.
pub(crate) fn settle(
    paths: Vec<MediatorPath>,
    allow_write: &[PathBuf],
    allow_read: &[PathBuf],
) -> Result<Settled> {
    let roots: Vec<PathBuf> = allow_write
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    let reads: Vec<(&PathBuf, PathBuf)> = allow_read
        .iter()
        .filter_map(|p| Some((p, std::fs::canonicalize(p).ok()?)))
        .collect();
    let mut out = Settled::default();
    for m in paths {
        let refuse = |detail: String| Error::MediatorPath {
            path: m.path.clone(),
            what: m.what.clone(),
            detail,
        };
        let canonical = match std::fs::canonicalize(&m.path) {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if m.origin == Origin::Default {
                    continue;
                }
                return Err(refuse(
                    "does not exist: the command could read it once it appears, so the shim refuses to start; create it (or correct the config) first".into(),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => continue,
            Err(e) => return Err(refuse(format!("cannot be resolved: {e}"))),
        };
        // The path as named, its directory resolved: a link there is the mediator's too.
        let named = m
            .path
            .parent()
            .and_then(|d| std::fs::canonicalize(d).ok())
            .zip(m.path.file_name())
            .map(|(d, name)| d.join(name));
        for root in &roots {
            if canonical.starts_with(root) || named.as_ref().is_some_and(|n| n.starts_with(root)) {
                return Err(refuse(format!(
                    "is inside the writable root {}: the command could replace it; keep the mediator's files out of --allow-write",
                    root.display()
                )));
            }
            if root.starts_with(&canonical) {
                return Err(refuse(format!(
                    "holds the writable root {}: the command could write beneath it; keep the mediator's files out of --allow-write",
                    root.display()
                )));
            }
        }
        if let Some((given, _)) = reads.iter().find(|(_, r)| r.starts_with(&canonical)) {
            return Err(refuse(format!(
                "would be re-opened by --allow-read {}; the shim keeps the mediator's files masked",
                given.display()
            )));
        }
        if !m.mask || out.masks.contains(&canonical) {
            continue;
        }
        if let Some(keep) = &m.keep_readable
            && std::fs::symlink_metadata(keep).is_ok_and(|k| k.is_file())
        {
            out.reopen.push(keep.clone());
        }
        out.masks.push(canonical);
        out.masked.push(m);
    }
    Ok(out)
}

/// Says once on stderr that the command runs as the uid that owns the mediator's socket
/// `socket` (`command_uid` outside the sandbox): the mediator's files that no config
/// names and that are not in a default location are then the command's to read.
pub(crate) fn warn_same_owner(socket: &Path, command_uid: u32) {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata(socket).is_ok_and(|m| m.uid() == command_uid) {
        eprintln!(
            "shim: the command runs as uid {command_uid}, which owns the mediator's socket {}: the mediator's files are the command's to read unless masked (the shim masks those --config names and the mediator's default locations); run the mediator as another user (docs/shim.md, \"The mediator's files\")",
            socket.display()
        );
    }
}

#[cfg(test)]
#[path = "secrets_tests.rs"]
mod tests;
