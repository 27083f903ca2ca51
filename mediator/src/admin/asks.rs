//! The admin API's questions (design section 20): every request held for the host's
//! answer, whatever its authority's `ask` endpoint, for whoever may use the admin API.
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /v1/asks` | `{"asks": [question, ...]}`, oldest first |
//! | `GET /v1/asks` with `Accept: text/event-stream` | an SSE stream: one `data: <question JSON>` event per pending question, then per new one; a `: keep-alive` comment every 15 s; it ends when the mediator shuts down |
//! | `GET /v1/asks/<id>` | that question while it is pending; 404 |
//! | `POST /v1/asks/<id>` | the answer (`crate::ask::reply`): 200; 400 (malformed: the question stays pending), 404 unknown, 409 ended |
//!
//! Each `POST` is an `ask_answer` audit record, written before the answer goes out.

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::json;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::{Admin, Body, error, json_response};
use crate::ask::reply;
use crate::ask::{AnswerError, Question};
use crate::audit::AuditRecord;
use crate::control::asks::Refused;
use crate::shared::Shared;

/// Largest answer body, in bytes.
const MAX_ANSWER: usize = 16 * 1024;

/// How often an idle event stream says it is alive (and learns that its client left).
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// How many sent ids an event stream keeps before it forgets those of ended questions.
const SENT_KEPT: usize = 1024;

/// `/v1/asks` and `/v1/asks/<id>`.
pub(super) async fn route(
    req: Request<Incoming>,
    admin: &Admin,
    id: Option<&str>,
    audit: Option<&mut AuditRecord>,
) -> Response<Body> {
    let shared = admin.control.shared();
    match (req.method().as_str(), id) {
        ("GET", None) if wants_stream(&req) => events(Arc::clone(shared)),
        ("GET", None) => {
            let list = shared.asks.list();
            let asks: Vec<&Question> = list.iter().map(AsRef::as_ref).collect();
            json_response(StatusCode::OK, &json!({ "asks": asks }))
        }
        ("GET", Some(id)) => match shared.asks.get(id) {
            Some(q) => json_response(StatusCode::OK, &json!(*q)),
            None => error(StatusCode::NOT_FOUND, "no pending question has this id"),
        },
        ("POST", Some(id)) => answer(req, admin, id, audit).await,
        _ => error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here"),
    }
}

/// Whether the client asked for the event stream.
fn wants_stream(req: &Request<Incoming>) -> bool {
    req.headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/event-stream"))
}

/// `POST /v1/asks/<id>`.
async fn answer(
    req: Request<Incoming>,
    admin: &Admin,
    id: &str,
    audit: Option<&mut AuditRecord>,
) -> Response<Body> {
    // Every POST here has its record (`super::audit::pending`); without one, nothing is
    // answered.
    let Some(record) = audit else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the answer cannot be audited; nothing was answered",
        );
    };
    let body = match Limited::new(req.into_body(), MAX_ANSWER).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let why = format!("cannot read the body (at most {MAX_ANSWER} bytes): {e}");
            record.why = Some(why.clone());
            return error(StatusCode::BAD_REQUEST, &why);
        }
    };
    let reply = match reply::parse(&body) {
        Ok(r) => r,
        Err(e) => {
            let why = format!("{e}; the question stays pending");
            record.why = Some(why.clone());
            return error(StatusCode::BAD_REQUEST, &why);
        }
    };
    let actor = record.actor.clone();
    match admin.control.answer(id, reply, &actor, record) {
        Ok(q) => json_response(
            StatusCode::OK,
            &json!({
                "answered": q.id,
                "authority": q.authority,
                "host": q.host,
                "port": q.port,
                "answer": record.ask.as_ref().map(|a| a.answer.clone()),
                "via": record.ask.as_ref().and_then(|a| a.via.clone()),
            }),
        ),
        Err(e) => {
            let why = e.to_string();
            record.why = Some(why.clone());
            let status = match e {
                Refused::NotHere(_) => StatusCode::BAD_REQUEST,
                Refused::Answer(AnswerError::Unknown) => StatusCode::NOT_FOUND,
                Refused::Answer(AnswerError::AlreadyAnswered) => StatusCode::CONFLICT,
            };
            error(status, &why)
        }
    }
}

/// What the event stream holds between events.
struct Events {
    shared: Arc<Shared>,
    news: broadcast::Receiver<Arc<Question>>,
    queue: VecDeque<Arc<Question>>,
    sent: HashSet<String>,
}

impl Events {
    /// Queues the pending questions not sent yet (and forgets sent ones that ended).
    fn relist(&mut self) {
        let pending = self.shared.asks.list();
        let ids: HashSet<&str> = pending.iter().map(|q| q.id.as_str()).collect();
        self.sent.retain(|id| ids.contains(id.as_str()));
        for q in pending {
            if !self.sent.contains(&q.id) {
                self.queue.push_back(q);
            }
        }
    }

    /// The next event: a question, a keep-alive comment, or the end.
    async fn next(mut self) -> Option<(Result<Frame<Bytes>, Infallible>, Self)> {
        loop {
            if self.sent.len() > SENT_KEPT {
                self.relist();
            }
            if let Some(q) = self.queue.pop_front() {
                if !self.sent.insert(q.id.clone()) {
                    continue;
                }
                let json = serde_json::to_string(&*q).unwrap_or_default();
                return Some((
                    Ok(Frame::data(Bytes::from(format!("data: {json}\n\n")))),
                    self,
                ));
            }
            let shared = Arc::clone(&self.shared);
            tokio::select! {
                () = shared.signals.draining.cancelled() => return None,
                () = tokio::time::sleep(KEEP_ALIVE) => {
                    return Some((Ok(Frame::data(Bytes::from_static(b": keep-alive\n\n"))), self));
                }
                got = self.news.recv() => match got {
                    Ok(q) => self.queue.push_back(q),
                    Err(RecvError::Lagged(_)) => self.relist(),
                    Err(RecvError::Closed) => return None,
                },
            }
        }
    }
}

/// The event stream: every pending question, then each new one.
fn events(shared: Arc<Shared>) -> Response<Body> {
    // Subscribed before the list is read: a question raised in between is in one or the
    // other (sent once).
    let news = shared.asks.subscribe();
    let mut first = Events {
        shared,
        news,
        queue: VecDeque::new(),
        sent: HashSet::new(),
    };
    first.relist();
    let frames = stream::unfold(first, Events::next);
    let mut resp = Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}
