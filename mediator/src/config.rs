//! Loading `mediator.toml` (design section 11). Parsing and validation live in the pure
//! `policy::config`; this module only reads the file.

use std::path::Path;

use policy::config::Config;

use crate::error::Error;

/// Reads and validates the configuration file at `path`.
///
/// # Errors
/// [`Error::ReadConfig`] if the file cannot be read; [`Error::Config`] listing every
/// problem, each with its location.
pub fn load(path: &Path) -> Result<Config, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(policy::config::parse(&text, &path.display().to_string())?)
}
