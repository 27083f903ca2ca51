//! `--config` and `--authority`: what the shim takes from a mediator config for one
//! authority, read with the mediator's own parser.

use std::path::{Path, PathBuf};

use super::{AdminEndpoint, CaCert, CaOrigin};
use crate::error::{Error, Result};

/// What the shim takes from a mediator config for one authority.
pub(super) struct FromConfig {
    /// `<listen.socket_dir>/<authority>.sock`.
    pub(super) socket: PathBuf,
    /// The mediator's CA certificate, when the authority terminates TLS.
    pub(super) ca: Option<CaCert>,
    /// The admin API (`[listen] admin_socket`, else `admin`), if any.
    pub(super) admin: Option<AdminEndpoint>,
    /// `child_env` and its placeholder, for each credential of the authority that has one.
    pub(super) child_env: Vec<(String, String)>,
    /// Every `secret_env` of the config, of any authority (the child must not inherit
    /// them: a secret stays with the mediator).
    pub(super) hidden_env: Vec<String>,
    /// The mediator's files the config names ([`crate::secrets::from_config`]).
    pub(super) mediator_paths: Vec<crate::secrets::MediatorPath>,
}

/// Reads the mediator config `config` with the mediator's own parser
/// (`policy::config::parse`: a config the mediator would refuse is refused here too) and
/// takes what the shim needs for `authority` (see [`FromConfig`]). The CA certificate is
/// `<[tls] ca_dir>/ca.pem`, read later, never created here; a secret's file is not even
/// opened.
///
/// # Errors
/// [`Error::ProfileRead`] for a config that cannot be read, [`Error::Config`] for one the
/// mediator would refuse, [`Error::Usage`] for an invalid authority name or no
/// `listen.socket_dir`, [`Error::UnknownAuthority`] for an authority the file lacks and
/// that has no socket (one created through the admin API is not in the file, but its
/// socket exists).
pub(super) fn from_config(config: &Path, authority: &str) -> Result<FromConfig> {
    // The mediator's own rule: a name it would refuse names no socket of its.
    if let Err(e) = policy::check_authority_name(authority) {
        return Err(Error::Usage(format!(
            "--authority {authority:?} is not a valid authority name ({e})"
        )));
    }
    let text = std::fs::read_to_string(config).map_err(|source| Error::ProfileRead {
        path: config.to_owned(),
        source,
    })?;
    let parsed = policy::config::parse(&text, &config.display().to_string()).map_err(|source| {
        Error::Config {
            path: config.to_owned(),
            source,
        }
    })?;
    let socket = parsed.listen.socket_path(authority).ok_or_else(|| {
        Error::Usage(format!(
            "{}: no listen.socket_dir, so no per-authority socket",
            config.display()
        ))
    })?;
    let admin = match (&parsed.listen.admin_socket, parsed.listen.admin) {
        (Some(path), _) => Some(AdminEndpoint::Unix(path.clone())),
        (None, Some(addr)) => Some(AdminEndpoint::Tcp(addr)),
        (None, None) => None,
    };
    let found = parsed.authority(authority);
    if found.is_none()
        && std::fs::symlink_metadata(&socket)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
    {
        return Err(Error::UnknownAuthority {
            authority: authority.to_owned(),
            config: config.to_owned(),
            listed: parsed
                .authorities
                .iter()
                .map(|a| a.grant.name().to_owned())
                .collect(),
            socket,
        });
    }
    // The mediator refuses tls_terminate without a ca_dir, so the parse above did too.
    let ca = found
        .filter(|a| a.grant.terminates_any())
        .and(parsed.tls.ca_dir.as_deref())
        .map(|dir| CaCert {
            path: dir.join(certs::CA_CERT_FILE),
            origin: CaOrigin::Config {
                config: config.to_owned(),
                authority: authority.to_owned(),
            },
        });
    let child_env = found
        .into_iter()
        .flat_map(|a| &a.credentials)
        .filter_map(|c| Some((c.child_env()?.to_owned(), c.placeholder()?.to_owned())))
        .collect();
    let hidden_env = parsed
        .authorities
        .iter()
        .flat_map(|a| &a.credentials)
        .filter_map(|c| match &c.source {
            policy::config::SecretSource::Env(var) => Some(var.clone()),
            policy::config::SecretSource::File(_) => None,
        })
        .collect();
    Ok(FromConfig {
        socket,
        ca,
        admin,
        child_env,
        hidden_env,
        mediator_paths: crate::secrets::from_config(&parsed, config),
    })
}
