//! The writes of `/v1/authorities`: a create (`POST`) and a delete (`DELETE
//! /v1/authorities/<name>`), each audited, and the answers of a create that failed.

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use policy::config::RegistryBackend;
use serde_json::{Value, json};

use crate::audit::AuditRecord;
use crate::authorities::Origin;
use crate::control::{CreateError, Deleted};

use super::{
    Admin, Body, MAX_BODY, PER_PROCESS, audit, describe, error, json_response, not_found,
    placed_elsewhere,
};

/// `DELETE /v1/authorities/<name>`.
pub(super) async fn delete(
    admin: &Admin,
    name: &str,
    mut audit: Option<&mut AuditRecord>,
) -> Response<Body> {
    let shared = admin.control.shared();
    match admin.control.delete(name).await {
        Ok(Deleted {
            live: Some(live), ..
        }) => {
            audit::changed(&mut audit, Some(&live), None);
            json_response(
                StatusCode::OK,
                &json!({
                    "revoked": live.name(),
                    "generation": live.generation,
                    "socket_removed": live.socket,
                    "live_connections": shared.metrics.active_of(live.name()),
                    "connections_close_in_seconds": admin.control.revoke_grace().as_secs(),
                    "persisted": live.origin == Origin::Api && admin.control.store().backend() != RegistryBackend::Memory,
                }),
            )
        }
        // A stored record that was not live (not loaded: its name is the file's, or its
        // socket could not be made): removed all the same.
        Ok(Deleted {
            live: None,
            stored: true,
        }) => json_response(
            StatusCode::OK,
            &json!({
                "revoked": name,
                "generation": null,
                "socket_removed": null,
                "live_connections": 0,
                "connections_close_in_seconds": 0,
                "persisted": true,
            }),
        ),
        Ok(Deleted {
            live: None,
            stored: false,
        }) => {
            audit::why(&mut audit, &format!("no authority named {name:?}"));
            not_found(name)
        }
        Err(e) => {
            audit::why(&mut audit, &audit::why_of(&e));
            create_error(e)
        }
    }
}

pub(super) async fn create(
    req: Request<Incoming>,
    admin: &Admin,
    mut audit: Option<&mut AuditRecord>,
) -> Response<Body> {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let message = format!("cannot read the body (at most {MAX_BODY} bytes): {e}");
            audit::why(&mut audit, &message);
            return error(StatusCode::BAD_REQUEST, &message);
        }
    };
    let value: Value = match crate::control::body::parse(&body) {
        Ok(v) => v,
        Err(e) => {
            let message = e.to_string();
            audit::why(&mut audit, &message);
            let crate::control::body::BodyError::DuplicateKey { field, .. } = e else {
                return error(StatusCode::BAD_REQUEST, &message);
            };
            return json_response(
                StatusCode::BAD_REQUEST,
                &json!({
                    "error": "invalid_authority",
                    "field": field,
                    "message": message,
                    "errors": [{ "field": field, "message": message }],
                }),
            );
        }
    };
    if let (Some(record), Some(name)) = (audit.as_deref_mut(), value.get("name")) {
        record.authority = name.as_str().map(str::to_owned);
    }
    match admin.control.create(&value).await {
        Ok(created) => {
            match &created.live {
                Some(live) => audit::changed(&mut audit, None, Some(live)),
                None => audit::placed_elsewhere(&mut audit, &created),
            }
            let mut out = match &created.live {
                Some(live) => describe(admin, live),
                None => placed_elsewhere(&created),
            };
            if let Value::Object(map) = &mut out {
                map.insert("served_here".into(), Value::Bool(created.live.is_some()));
                if let Some(token) = created.token {
                    map.insert("token".into(), Value::String(token));
                    map.insert(
                        "token_note".into(),
                        Value::String("shown once: the mediator keeps only its SHA-256".into()),
                    );
                }
                let store = admin.control.store();
                let backend = store.backend();
                map.insert(
                    "persisted".into(),
                    Value::Bool(backend != RegistryBackend::Memory),
                );
                map.insert("backend".into(), Value::String(backend.as_str().into()));
                if backend == RegistryBackend::Memory {
                    map.insert("persistence_note".into(), Value::String(PER_PROCESS.into()));
                }
            }
            json_response(StatusCode::CREATED, &out)
        }
        Err(e) => {
            audit::why(&mut audit, &audit::why_of(&e));
            create_error(e)
        }
    }
}

/// The answer to a create or delete that failed.
fn create_error(e: CreateError) -> Response<Body> {
    match e {
        CreateError::Invalid(errors) => {
            let first = errors.first().map(|e| e.field.clone()).unwrap_or_default();
            let list: Vec<Value> = errors
                .iter()
                .map(|e| json!({ "field": e.field, "message": e.message }))
                .collect();
            json_response(
                StatusCode::BAD_REQUEST,
                &json!({
                    "error": "invalid_authority",
                    "field": first,
                    "message": errors.first().map(|e| e.message.clone()).unwrap_or_default(),
                    "errors": list,
                }),
            )
        }
        CreateError::Duplicate(name) => name_taken(&format!(
            "authority {name:?} exists; grants are immutable: DELETE it first to replace it"
        )),
        CreateError::OfTheFile(name) => name_taken(&format!(
            "authority {name:?} is defined by the configuration file (a name is either config or api, also while the file's is revoked): choose another name, or change the file and reload"
        )),
        CreateError::Unavailable(why) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({
                "error": "registry_unavailable",
                "message": format!("{why}; nothing was changed: retry once the registry is reachable"),
            }),
        ),
        CreateError::Listen(e) => {
            let message = crate::error::chain(&e);
            tracing::warn!("POST /v1/authorities: {message}");
            error(StatusCode::INTERNAL_SERVER_ERROR, &message)
        }
        CreateError::Store(e) => {
            let message = format!("the registry could not store the change: {e}");
            tracing::error!("/v1/authorities: {message}");
            json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({ "error": "registry_error", "message": message }),
            )
        }
    }
}

/// The `409 duplicate_authority` answer to a create whose name is taken, saying why.
fn name_taken(message: &str) -> Response<Body> {
    json_response(
        StatusCode::CONFLICT,
        &json!({ "error": "duplicate_authority", "field": "name", "message": message }),
    )
}
