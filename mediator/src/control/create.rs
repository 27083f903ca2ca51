//! `POST /v1/authorities` and `DELETE /v1/authorities/<name>`: an authority created from
//! a JSON body (one `[[authority]]` table as flat JSON), validated by the config's own
//! rules, with a token generated on request, stored in the registry (durably, before the
//! answer), then applied to the live set by the path every stored authority takes
//! (`super::apply`); and its removal, in the same order.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use policy::config::{Authority, FieldError, Placement, RegistryBackend};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::Control;
use super::registry::{Op, Record, RegistryError, Stored};
use crate::authorities::{Live, Origin};
use crate::error::Error;

/// The body key asking the mediator to generate the token.
const GENERATE_TOKEN: &str = "generate_token";

/// The body key asking for a task-scoped authority, revoked after that many seconds.
const TTL: &str = "ttl_s";

/// The longest `ttl_s`: one year.
const MAX_TTL_S: u64 = 365 * 24 * 3600;

/// Why an authority could not be created (or removed).
#[derive(Debug)]
pub(crate) enum CreateError {
    /// The body is not an acceptable authority (HTTP 400); every problem, each naming
    /// its field.
    Invalid(Vec<FieldError>),
    /// An authority of that name is live or stored (HTTP 409).
    Duplicate(String),
    /// The configuration file defines an authority of that name (HTTP 409): a name is
    /// either config or api, also while the file's is revoked.
    OfTheFile(String),
    /// Its socket could not be created (HTTP 500).
    Listen(Error),
    /// The registry cannot be reached, or its view is stale (HTTP 503).
    Unavailable(String),
    /// The registry could not store or remove it (HTTP 500).
    Store(RegistryError),
}

/// What a `DELETE /v1/authorities/<name>` removed.
#[derive(Debug)]
pub(crate) struct Deleted {
    /// The entry revoked, when one was live.
    pub(crate) live: Option<Arc<Live>>,
    /// Whether a stored record was removed.
    pub(crate) stored: bool,
}

/// A created authority, as `POST /v1/authorities` reports it.
#[derive(Debug)]
pub(crate) struct Created {
    /// The live entry, when this replica serves it (placed on its node or on every node).
    pub live: Option<Arc<Live>>,
    /// The record as stored, and its generation.
    pub stored: Stored,
    /// Where it is served.
    pub node: Placement,
    /// The freshly generated token, when one was asked for (shown once, never stored).
    pub token: Option<String>,
    /// The validated authority, when it is served on another node only (`live` is
    /// `None`): what its audit record describes.
    pub elsewhere: Option<Box<Authority>>,
}

impl Control {
    /// Creates an authority from the flat JSON of one `[[authority]]` table
    /// (`POST /v1/authorities`), validated by the same code as the configuration file, with
    /// the global deny list applied. `"generate_token": true` makes the mediator generate a
    /// token, store only its SHA-256 and return it once; `"ttl_s": N` revokes it N seconds
    /// later. The record is durable in the registry before this returns. `"node"` places
    /// it: an authority placed on another node is stored (etcd) and served there only; a
    /// local or memory registry serves its own node only and refuses one.
    ///
    /// # Errors
    /// [`CreateError::Invalid`] naming each bad field, [`CreateError::Duplicate`] when the
    /// name is live or stored, [`CreateError::Unavailable`] when the registry cannot be
    /// vouched for, [`CreateError::Store`] or [`CreateError::Listen`] when it cannot be
    /// stored or served (nothing is left behind).
    pub(crate) async fn create(&self, body: &Value) -> Result<Created, CreateError> {
        let Parsed { map, token, ttl } = parse_body(body)?;
        let name = map
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let now = SystemTime::now();
        let record = Record {
            name: name.clone(),
            created_at: humantime::format_rfc3339_millis(now).to_string(),
            expires_at: ttl.map(|t| humantime::format_rfc3339_millis(now + t).to_string()),
            authority: map,
        };
        // Validated before anything is stored: a table this mediator refuses is never kept.
        let probe = Stored {
            record,
            generation: 0,
        };
        let authority = self.authority_of(&probe).map_err(CreateError::Invalid)?;
        let node = authority.node.clone();
        let here = node.serves(self.store.node());
        if !here && !self.store.holds_other_nodes() {
            return Err(CreateError::Invalid(vec![FieldError {
                field: "node".into(),
                message: format!(
                    "this mediator's {} registry serves its own node ({:?}) only: write \"*\" or {:?}; placing an authority on another node needs the registry every node shares (backend = \"etcd\")",
                    self.store.backend(),
                    self.store.node(),
                    self.store.node()
                ),
            }]));
        }
        let record = probe.record;
        if self.shared.authorities.registry_stale() {
            return Err(self.unavailable());
        }
        let _writes = self.write_lock(&name).await;
        if self.named_by_the_file(&name) {
            return Err(CreateError::OfTheFile(name));
        }
        if self.shared.authorities.get(&name).is_some() {
            return Err(CreateError::Duplicate(name));
        }
        let _writing = self.writing(&name);
        let generation = self.shared.authorities.next_generation();
        let generation = match self.store.create(&record, generation, ttl).await {
            Ok(g) => {
                self.registry_metrics.operation(Op::Create, "ok");
                g
            }
            Err(RegistryError::Exists(name)) => {
                self.registry_metrics.operation(Op::Create, "exists");
                return Err(CreateError::Duplicate(name));
            }
            Err(RegistryError::Unavailable(why)) => {
                self.registry_metrics.operation(Op::Create, "error");
                self.registry_metrics
                    .error(super::registry::ErrorKind::Unavailable);
                return Err(CreateError::Unavailable(why));
            }
            Err(e) => {
                self.registry_metrics.operation(Op::Create, "error");
                self.registry_metrics.error(super::registry::ErrorKind::Io);
                return Err(CreateError::Store(e));
            }
        };
        let stored = Stored { record, generation };
        if !here {
            // Stored for its node's replica, which applies it from its watch.
            return Ok(Created {
                live: None,
                stored,
                node,
                token,
                elsewhere: Some(Box::new(authority)),
            });
        }
        let applied = self.apply_put(stored.clone());
        let live = match applied {
            Ok(Some(live)) => live,
            // Already applied from the watch (etcd): the same generation is live.
            Ok(None) => match self.shared.authorities.get(&name) {
                Some(live) if live.generation == generation => live,
                _ => return Err(self.undo(&name, generation, None).await),
            },
            Err(e) => return Err(self.undo(&name, generation, Some(e)).await),
        };
        Ok(Created {
            live: Some(live),
            stored,
            node,
            token,
            elsewhere: None,
        })
    }

    /// Removes a record stored by [`Self::create`] that could not be served; returns the
    /// error to answer.
    async fn undo(&self, name: &str, generation: u64, e: Option<CreateError>) -> CreateError {
        if let Err(undo) = self.store.delete(name, Some(generation)).await {
            tracing::error!(target: super::TARGET, "registry: authority {name:?} was stored but cannot be served, and cannot be removed again: {undo}; it is retried at the next start");
        }
        e.unwrap_or_else(|| CreateError::Duplicate(name.to_owned()))
    }

    /// The error of a write while the registry's view is stale.
    fn unavailable(&self) -> CreateError {
        CreateError::Unavailable(format!(
            "the {} registry at {} cannot be confirmed current",
            self.store.backend(),
            self.store.location()
        ))
    }

    /// Revokes the authority named `name` (`DELETE /v1/authorities/<name>`): one of the
    /// configuration file at once, as before; a stored one once its removal is durable,
    /// wherever it is placed (etcd: the replica of its node revokes it from its watch).
    ///
    /// # Errors
    /// [`CreateError::Unavailable`] when the registry cannot be vouched for or reached,
    /// [`CreateError::Store`] when the record cannot be removed (it stays live).
    pub(crate) async fn delete(&self, name: &str) -> Result<Deleted, CreateError> {
        if self
            .shared
            .authorities
            .get(name)
            .is_some_and(|l| l.origin == Origin::Config)
        {
            return Ok(Deleted {
                live: self.revoke(name),
                stored: false,
            });
        }
        if self.shared.authorities.registry_stale() {
            return Err(self.unavailable());
        }
        let _writes = self.write_lock(name).await;
        let _writing = self.writing(name);
        let before = self.shared.authorities.get(name);
        let removed = match self.store.delete(name, None).await {
            Ok(r) => {
                self.registry_metrics.operation(Op::Delete, "ok");
                r
            }
            Err(RegistryError::Unavailable(why)) => {
                self.registry_metrics.operation(Op::Delete, "error");
                return Err(CreateError::Unavailable(why));
            }
            Err(e) => {
                self.registry_metrics.operation(Op::Delete, "error");
                self.registry_metrics.error(super::registry::ErrorKind::Io);
                return Err(CreateError::Store(e));
            }
        };
        let revision = match (self.store.backend(), removed) {
            (RegistryBackend::Etcd, Some(r)) => Some(r),
            _ => None,
        };
        let live = self.apply_delete(name, revision);
        // An API authority live without a record (the memory store forgot nothing, so
        // only after a failed undo): revoked all the same.
        let live = match live {
            Some(l) => Some(l),
            None => match self.shared.authorities.get(name) {
                Some(l) if l.origin == Origin::Api => self.revoke(name),
                // Revoked meanwhile by the registry's watch, which saw this removal.
                None => before.filter(|b| b.origin == Origin::Api),
                Some(_) => None,
            },
        };
        Ok(Deleted {
            live,
            stored: removed.is_some(),
        })
    }
}

/// A `POST /v1/authorities` body taken apart.
struct Parsed {
    /// The `[[authority]]` table, a generated token's hash included.
    map: Map<String, Value>,
    /// The generated token, shown once.
    token: Option<String>,
    /// `ttl_s`.
    ttl: Option<Duration>,
}

/// Checks the body's shape and takes out `generate_token` and `ttl_s`.
fn parse_body(body: &Value) -> Result<Parsed, CreateError> {
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
    let ttl = match map.remove(TTL) {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_TTL_S).contains(&n) => Some(Duration::from_secs(n)),
            _ => {
                return Err(invalid(
                    TTL,
                    format!("must be whole seconds 1..={MAX_TTL_S}"),
                ));
            }
        },
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
    Ok(Parsed { map, token, ttl })
}

/// The TOML text of a flat JSON `[[authority]]` table, for the config's parser.
pub(super) fn table_text(map: &Map<String, Value>) -> Result<String, Vec<FieldError>> {
    toml::to_string(&Value::Object(map.clone())).map_err(|e| {
        vec![FieldError {
            field: String::new(),
            message: format!("cannot read the body as an authority table: {e}"),
        }]
    })
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
