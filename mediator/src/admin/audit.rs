//! The admin API's audit records (design section 21): each `POST /v1/authorities`,
//! `DELETE /v1/authorities/<name>` and `POST /v1/asks/<id>` (an answer, design section
//! 20), done or refused (a missing or wrong token, a body
//! that is not an authority), is one record, written before the answer goes out. Who:
//! the client's address and the id of the token it presented, or the admin socket
//! peer's uid, gid and pid.

use http::{Method, Request, StatusCode, header};
use hyper::body::Incoming;

use crate::audit::{Action, Actor, AuditRecord, AuditResult, AuthorityChange};
use crate::authorities::Live;
use crate::control::{Control, CreateError, Created};
use crate::decision_log::Peer;

/// The record a request will get, when it is a create or a delete.
pub(super) fn pending(req: &Request<Incoming>, peer: &Peer) -> Option<AuditRecord> {
    let path = req.uri().path();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (action, authority) = match (req.method(), segments.as_slice()) {
        (&Method::POST, ["v1", "authorities"]) => (Action::Create, None),
        (&Method::DELETE, ["v1", "authorities", name]) => {
            (Action::Delete, Some((*name).to_owned()))
        }
        (&Method::POST, ["v1", "asks", _]) => (Action::AskAnswer, None),
        _ => return None,
    };
    let token = req.headers().get(header::AUTHORIZATION).and_then(|v| {
        let v = v.as_bytes();
        v.get(..7)
            .filter(|s| s.eq_ignore_ascii_case(b"bearer "))
            .and_then(|_| v.get(7..))
    });
    let mut record = AuditRecord::new(action, Actor::admin(peer, token), AuditResult::Refused);
    record.request = Some(format!("{} {path}", req.method()));
    record.authority = authority;
    Some(record)
}

/// Notes why the request is refused (the first reason given stays).
pub(super) fn why(audit: &mut Option<&mut AuditRecord>, why: &str) {
    if let Some(record) = audit.as_deref_mut()
        && record.why.is_none()
    {
        record.why = Some(why.to_owned());
    }
}

/// Notes an authority that came or went.
pub(super) fn changed(
    audit: &mut Option<&mut AuditRecord>,
    old: Option<&Live>,
    new: Option<&Live>,
) {
    if let Some(record) = audit.as_deref_mut() {
        record.changes.extend(AuthorityChange::of(old, new));
    }
}

/// Puts into the record a create stored for another node's replica (not live here).
pub(super) fn placed_elsewhere(audit: &mut Option<&mut AuditRecord>, created: &Created) {
    if let (Some(record), Some(authority)) = (audit.as_deref_mut(), &created.elsewhere) {
        record.changes.push(AuthorityChange::added_elsewhere(
            authority,
            created.stored.generation,
        ));
    }
}

/// Writes the record of a request answered `status`, and waits until it is written.
pub(super) async fn finish(control: &Control, mut record: AuditRecord, status: StatusCode) {
    record.status = Some(status.as_u16());
    if status.is_success() {
        record.result = AuditResult::Accepted;
        record.why = None;
    } else if record.why.is_none() {
        record.why = Some(status.canonical_reason().unwrap_or("refused").to_owned());
    }
    control
        .audit()
        .record_durably(control.shared(), record)
        .await;
}

/// Why a create or delete failed, in one line (the validator's messages, which never
/// hold a secret).
pub(super) fn why_of(e: &CreateError) -> String {
    match e {
        CreateError::Invalid(errors) => errors
            .iter()
            .map(|e| {
                if e.field.is_empty() {
                    e.message.clone()
                } else {
                    format!("{}: {}", e.field, e.message)
                }
            })
            .collect::<Vec<_>>()
            .join("; "),
        CreateError::Duplicate(name) => format!("authority {name:?} exists"),
        CreateError::OfTheFile(name) => {
            format!("authority {name:?} is defined by the configuration file")
        }
        CreateError::Unavailable(why) => format!("registry unavailable: {why}"),
        CreateError::Listen(e) => crate::error::chain(e),
        CreateError::Store(e) => format!("the registry could not store the change: {e}"),
    }
}
