//! Loading each secret: from its file (which must not be readable by others nor
//! writable by its group or others) or from the mediator's environment. Errors name the
//! credential's source and location, never the secret.

use std::os::unix::fs::PermissionsExt as _;

use policy::config::{Authority, Credential, SecretSource};

/// Loads the secret of every credential of `authority`. Each error starts with the
/// credential's location and never holds the secret.
///
/// # Errors
/// Every credential whose secret cannot be read, is in a file readable by others or
/// writable by its group or others, or is empty or not a header value.
pub(crate) fn load_secrets(authority: &mut Authority) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    for credential in &mut authority.credentials {
        if let Err(e) = load_one(credential) {
            errors.push(format!("{}: {e}", credential.location));
        }
    }
    // A placeholder is handed to the child: none may hold a secret or part of one.
    for credential in &authority.credentials {
        for other in &authority.credentials {
            if let Some(p) = other.placeholder()
                && credential.has_secret()
                && credential.secret_overlaps(p)
            {
                errors.push(format!(
                    "{}: a placeholder of this authority ({}) contains this secret or is part of it; a placeholder is what the child is given, so it must share nothing with a secret",
                    credential.location, other.location
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

pub(super) fn load_one(credential: &mut Credential) -> Result<(), LoadError> {
    let bytes = match &credential.source {
        SecretSource::File(path) => {
            let shown = path.display().to_string();
            let unreadable = |e| LoadError::Read(shown.clone(), e);
            let meta = std::fs::metadata(path).map_err(unreadable)?;
            if !meta.is_file() {
                return Err(LoadError::NotFile(shown));
            }
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o007 != 0 {
                return Err(LoadError::Others(shown, mode));
            }
            // Whoever may write the file may choose the secret the mediator sends.
            if mode & 0o020 != 0 {
                return Err(LoadError::Group(shown, mode));
            }
            std::fs::read(path).map_err(unreadable)?
        }
        SecretSource::Env(name) => match std::env::var_os(name) {
            Some(v) => v.into_encoded_bytes(),
            None => {
                return Err(LoadError::Unset(name.clone()));
            }
        },
    };
    Ok(credential.set_secret(bytes)?)
}

/// Why a credential's secret could not be loaded (never quoting it).
#[derive(Debug, thiserror::Error)]
pub(super) enum LoadError {
    #[error("secret_file {0:?}: cannot read it: {1}")]
    Read(String, std::io::Error),
    #[error("secret_file {0:?} is not a regular file")]
    NotFile(String),
    #[error(
        "secret_file {0:?} is readable or writable by others (mode {1:04o}); make it 0600 or 0640 (chmod o= {0:?})"
    )]
    Others(String, u32),
    #[error(
        "secret_file {0:?} is writable by its group (mode {1:04o}); make it 0600 or 0640 (chmod g-w {0:?})"
    )]
    Group(String, u32),
    #[error("secret_env {0:?} is not set in the mediator's environment")]
    Unset(String),
    #[error(transparent)]
    Secret(#[from] policy::ValueError),
}
