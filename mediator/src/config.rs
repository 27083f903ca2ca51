//! Loading `mediator.toml` (design section 11). Parsing and validation live in the pure
//! `policy::config`; this module only reads the file and the credentials' secrets.

use std::path::Path;

use policy::config::Config;

use crate::error::Error;

/// Reads and validates the configuration file at `path`, and loads the secret of every
/// credential (design section 14).
///
/// # Errors
/// [`Error::ReadConfig`] if the file cannot be read; [`Error::Config`] listing every
/// problem, each with its location (a secret that cannot be loaded included; no message
/// holds a secret).
pub fn load(path: &Path) -> Result<Config, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Validates `text` (the configuration read from `origin`), keeps the authorities this
/// replica's node serves ([`Config::place`]: `[registry] node`, else `$MEDIATOR_NODE`,
/// else the host name) and loads the secret of each of their credentials, as [`load`]
/// does. The secrets of an authority placed on another node are read on that node.
///
/// # Errors
/// [`Error::Config`] listing every problem, each with its location;
/// [`Error::Registry`] when this replica's node name cannot be found.
pub fn parse(text: &str, origin: &str) -> Result<Config, Error> {
    let mut config = policy::config::parse(text, origin)?;
    let node = crate::control::registry::node_of(
        &config.registry,
        |k| std::env::var_os(k),
        crate::control::registry::host_name,
    )
    .map_err(|why| Error::Registry(crate::control::registry::RegistryError::Node(why)))?;
    config.registry.node = Some(node.clone());
    place_and_load(config, &node)
}

/// [`parse`] for a reload of the replica of `node`: the authorities are placed by the
/// node it runs as, whatever `[registry] node` the file now names (that section, like
/// the rest of `[registry]`, changes at a restart), so that a reload never serves an
/// authority of another node nor drops one of its own for it.
///
/// # Errors
/// [`Error::Config`] listing every problem, each with its location.
pub fn parse_on(text: &str, origin: &str, node: &str) -> Result<Config, Error> {
    place_and_load(policy::config::parse(text, origin)?, node)
}

/// Keeps the authorities `node` serves and loads their secrets.
fn place_and_load(mut config: Config, node: &str) -> Result<Config, Error> {
    config.place(node);
    let mut errors = Vec::new();
    for authority in &mut config.authorities {
        if let Err(e) = crate::credential::load_secrets(authority) {
            errors.extend(e);
        }
    }
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(policy::PolicyError::Config(errors).into())
    }
}
