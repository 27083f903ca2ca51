//! `POST /v1/authorities`: an authority created from a JSON body (one `[[authority]]`
//! table as flat JSON), validated by the config's own rules, with a token generated on
//! request. The created authority is added through [`Control::add`] like any other.

use std::sync::{Arc, PoisonError};

use policy::config::FieldError;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::Control;
use crate::authorities::{Live, Origin};
use crate::error::Error;

/// Keys of one `[[authority]]` table that `POST /v1/authorities` accepts, plus
/// `generate_token`.
const GENERATE_TOKEN: &str = "generate_token";

/// Why an authority could not be created.
#[derive(Debug)]
pub(crate) enum CreateError {
    /// The body is not an acceptable authority (HTTP 400); every problem, each naming
    /// its field.
    Invalid(Vec<FieldError>),
    /// An authority of that name is live (HTTP 409).
    Duplicate(String),
    /// Its socket could not be created (HTTP 500).
    Listen(Error),
}

/// A created authority, as `POST /v1/authorities` reports it.
#[derive(Debug)]
pub(crate) struct Created {
    /// The live entry.
    pub live: Arc<Live>,
    /// The freshly generated token, when one was asked for (shown once, never stored).
    pub token: Option<String>,
}

impl Control {
    /// Creates an authority from the flat JSON of one `[[authority]]` table
    /// (`POST /v1/authorities`), validated by the same code as the configuration file, with
    /// the global deny list applied. `"generate_token": true` makes the mediator generate a
    /// token, store only its SHA-256 and return it once.
    ///
    /// # Errors
    /// As [`Self::add`], and [`CreateError::Invalid`] naming each bad field.
    pub(crate) fn create_from_json(&self, body: &Value) -> Result<Created, CreateError> {
        let invalid = |field: &str, message: String| {
            CreateError::Invalid(vec![FieldError {
                field: field.to_owned(),
                message,
            }])
        };
        let Value::Object(map) = body else {
            return Err(invalid(
                "",
                "the body must be a JSON object: the keys of one [[authority]] table".into(),
            ));
        };
        let mut map: Map<String, Value> = map.clone();
        let generate = match map.remove(GENERATE_TOKEN) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(_) => return Err(invalid(GENERATE_TOKEN, "must be true or false".into())),
        };
        if generate && map.contains_key("token_sha256") {
            return Err(invalid(
                GENERATE_TOKEN,
                "give either token_sha256 or generate_token, not both".into(),
            ));
        }
        if let Some((k, _)) = map.iter().find(|(_, v)| v.is_null()) {
            return Err(invalid(
                k,
                "null is not a value; omit the key instead".into(),
            ));
        }
        // A credential names a file or variable of the mediator whose content it sends
        // out: only the configuration file, never an API writer, may name one.
        if map.contains_key("credential") {
            return Err(invalid(
                "credential",
                "credentials ([[authority.credential]]) are configured in the file only: an authority created here cannot make the mediator read a secret".into(),
            ));
        }
        if let Some((k, _)) = map.iter().find(|(_, v)| v.is_object()) {
            return Err(invalid(
                k,
                "nested objects are not part of an [[authority]] table".into(),
            ));
        }
        let token = if generate {
            let token = random_token().map_err(|e| {
                CreateError::Listen(Error::Io(std::io::Error::other(format!(
                    "cannot generate a token: {e}"
                ))))
            })?;
            map.insert(
                "token_sha256".into(),
                Value::String(hex::encode(Sha256::digest(token.as_bytes()))),
            );
            Some(token)
        } else {
            None
        };
        let text = toml::to_string(&Value::Object(map)).map_err(|e| {
            invalid(
                "",
                format!("cannot read the body as an authority table: {e}"),
            )
        })?;
        let global = self
            .global_deny
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut authority =
            policy::config::parse_authority(&text, &global).map_err(CreateError::Invalid)?;
        crate::credential::load_secrets(&mut authority).map_err(credential_errors)?;
        let live = self.add(authority, Origin::Api)?;
        self.api_tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(live.authority.grant.name().to_owned(), text);
        Ok(Created { live, token })
    }
}

/// Secrets of an authority from the admin API that cannot be loaded, as field errors.
fn credential_errors(errors: Vec<String>) -> CreateError {
    CreateError::Invalid(credential_fields(errors))
}

pub(super) fn credential_fields(errors: Vec<String>) -> Vec<FieldError> {
    errors
        .into_iter()
        .map(|message| FieldError {
            field: "credential".into(),
            message,
        })
        .collect()
}

/// 32 random bytes from the kernel, as 64 hex digits.
fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh() {
        let a = random_token().unwrap();
        assert_eq!(a.len(), 64);
        assert_ne!(a, random_token().unwrap());
    }
}
