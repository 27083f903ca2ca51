//! What `mediator check` and `mediator registry list` ask of a configuration without
//! starting it: the resources a start would load, the stored authorities, the limits.

use policy::config::Config;

use crate::control::registry::{self, inspect::Listing};
use crate::error::Error;
use crate::limits::InForce;
use crate::tls::TlsState;

/// Loads what a start would load, changing nothing and binding nothing (`mediator
/// check`): that the decision-log file can be opened and the socket directories made
/// by this user, the CA (or that a start could create it) and the extra CA files, the router
/// (the parent credentials file, the proxy environment, the PAC fetched and evaluated).
/// Returns notes for the operator.
///
/// # Errors
/// The first problem a start would stop at.
pub async fn check_resources(config: &Config) -> Result<Vec<String>, Error> {
    let mut notes = Vec::new();
    // The files and directories a start writes, as the user running the check.
    if let policy::config::Log::File(path) = &config.log {
        crate::decision_log::check_can_open(path)?;
    }
    if let Some(dir) = &config.listen.socket_dir {
        crate::socket_file::check_can_make(dir)?;
    }
    if let Some(dir) = config
        .listen
        .admin_socket
        .as_deref()
        .and_then(std::path::Path::parent)
    {
        crate::socket_file::check_can_make(dir)?;
    }
    notes.extend(TlsState::check(&config.tls)?);
    let router = super::new_router(config).await?;
    notes.extend(router.gssapi_library());
    notes.push(format!(
        "[upstream] mode = \"{}\": usable",
        config.upstream.mode
    ));
    if config.registry.backend == policy::config::RegistryBackend::Etcd {
        // Checked, not contacted: `mediator registry list` reads the cluster.
        registry::inspect::check_etcd_build()?;
        notes.push(format!(
            "registry: etcd {} prefix {} (not contacted; mediator registry list reads it)",
            config.registry.endpoints.join(","),
            config.registry.prefix
        ));
        return Ok(notes);
    }
    let listing = registry_listing(config).await?;
    notes.push(format!(
        "{}{}",
        listing.summary(),
        if listing.rejected.is_empty() {
            String::new()
        } else {
            format!(
                ", {} unreadable (a start sets them aside: mediator registry list names them)",
                listing.rejected.len()
            )
        }
    ));
    if let Some(note) = listing.note {
        notes.push(format!("registry: {note}"));
    }
    Ok(notes)
}

/// The authorities `[registry]` holds, read without changing anything (no lock taken,
/// nothing set aside): `mediator registry list` and `mediator check`.
///
/// # Errors
/// [`Error::Registry`] when the state directory cannot be read or would not be usable by
/// a start, or etcd cannot be reached.
pub async fn registry_listing(config: &Config) -> Result<Listing, Error> {
    Ok(registry::inspect::inspect(&config.registry).await?)
}

/// The limits `config` would run with here (the soft open-files limit raised to the hard
/// one, as a start does), the derived ones marked: what `mediator check` prints.
pub fn limits_of(config: &Config) -> String {
    InForce::derive(
        &config.limits,
        crate::limits::nofile_hard(),
        listeners(config),
    )
    .to_string()
}

/// The listening sockets `config` makes: the TCP and admin listeners, the admin socket,
/// and one Unix socket per authority.
pub(super) fn listeners(config: &Config) -> usize {
    let sockets = if config.listen.socket_dir.is_some() {
        config.authorities.len()
    } else {
        0
    };
    usize::from(config.listen.tcp.is_some())
        + usize::from(config.listen.admin.is_some())
        + usize::from(config.listen.admin_socket.is_some())
        + sockets
}
