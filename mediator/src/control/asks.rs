//! Answers to questions (design section 20), applied one way wherever they come from
//! (the admin API's `POST /v1/asks/<id>`, an authority's `ask` endpoint, the shim's
//! control socket): checked against this mediator, handed to the held request
//! (`crate::ask`), and written as an `ask_answer` audit record (design section 21) before
//! the answer is acknowledged.
//!
//! Also the poster: every question of an authority whose `ask` is an endpoint
//! (`unix:`, loopback `http:`) is POSTed there as JSON, once, bounded by its
//! `ask_timeout_s`; a `200` whose body is an answer answers it, anything else (a `202`,
//! another status, an error, a body that is not an answer) leaves it pending for the admin
//! API or the timeout. One task per question: there are at most `max_pending_asks` per
//! authority.

use std::collections::HashSet;
use std::sync::Arc;

use policy::config::{AskEndpoint, WatchdogEndpoint};
use tokio::sync::broadcast::error::RecvError;

use super::Control;
use crate::ask::reply::{self, Reply};
use crate::ask::{Answer, AnswerError, Answered, Question};
use crate::audit::{Action, Actor, AskAnswer, AuditRecord, AuditResult};

/// Largest answer body read from an endpoint, in bytes.
const MAX_ANSWER: usize = 16 * 1024;

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// `400`: an answer this path cannot take (an `allow_via` grant outside the shim's
    /// embedded mode).
    #[error("{0}")]
    NotHere(&'static str),
    /// `404` or `409`.
    #[error(transparent)]
    Answer(#[from] AnswerError),
}

/// Who answered, in the words of a decision record's `asked.by`.
pub(crate) fn by_of(actor: &Actor) -> String {
    match actor {
        Actor::AdminTcp {
            token_id: Some(id), ..
        }
        | Actor::AdminSocket {
            token_id: Some(id), ..
        } => format!("admin token {id}"),
        Actor::AdminTcp {
            token_id: None,
            addr,
        } => format!("admin API {addr}"),
        Actor::AdminSocket { uid, .. } => format!("admin socket uid {uid}"),
        Actor::AskEndpoint { endpoint } => format!("ask endpoint {endpoint}"),
        Actor::ShimControl { uid, .. } => format!("shim control uid {uid}"),
        Actor::Sighup | Actor::ConfigWatch | Actor::Registry { .. } | Actor::Expiry => {
            "-".to_owned()
        }
    }
}

impl Control {
    /// Applies `reply` to question `id` for `actor`, noting in `audit` (an `ask_answer`
    /// record the caller writes) what was answered and about which authority.
    ///
    /// # Errors
    /// [`Refused`]: the reply is not for this path, or the question is unknown or ended.
    pub(crate) fn answer(
        &self,
        id: &str,
        reply: Reply,
        actor: &Actor,
        audit: &mut AuditRecord,
    ) -> Result<Arc<Question>, Refused> {
        let asked = self.shared.asks.get(id);
        let (answer, kind, via) = match reply {
            Reply::AllowVia(name) => (Answer::AllowVia(name.clone()), "allow_via", Some(name)),
            Reply::Deny(text) => (Answer::Deny(text), "deny", None),
            Reply::AllowGrant(_) => {
                return Err(Refused::NotHere(
                    "allow_via with a grant makes an authority in the shim's embedded mode only; create the authority (POST /v1/authorities) and answer {\"allow_via\": \"<its name>\"}",
                ));
            }
        };
        audit.authority = asked.as_ref().map(|q| q.authority.clone());
        audit.ask = Some(AskAnswer {
            id: id.chars().take(32).collect(),
            host: asked.as_ref().map(|q| q.host.clone()),
            port: asked.as_ref().map(|q| q.port),
            answer: kind.to_owned(),
            via,
        });
        let by = by_of(actor);
        let question = self.shared.asks.answer(id, Answered { answer, by })?;
        Ok(question)
    }

    /// [`Self::answer`], written as its own audit record (accepted or refused) before it
    /// returns: for answers that come with no request of the admin API (an endpoint, the
    /// shim's control socket).
    ///
    /// # Errors
    /// As [`Self::answer`].
    pub(crate) async fn answer_audited(
        &self,
        id: &str,
        reply: Reply,
        actor: Actor,
    ) -> Result<Arc<Question>, Refused> {
        let mut record = AuditRecord::new(Action::AskAnswer, actor.clone(), AuditResult::Refused);
        let result = self.answer(id, reply, &actor, &mut record);
        match &result {
            Ok(_) => record.result = AuditResult::Accepted,
            Err(e) => record.why = Some(e.to_string()),
        }
        self.audit.record_durably(&self.shared, record).await;
        result
    }
}

/// Posts every question of an authority with an `ask` endpoint to it, until the mediator
/// shuts down (started once, by `crate::server::start`).
pub(crate) fn start_poster(control: &Arc<Control>) {
    let control = Arc::clone(control);
    let mut news = control.shared.asks.subscribe();
    tokio::spawn(async move {
        // Questions posted, so that a re-list after falling behind posts each once.
        let mut posted: HashSet<String> = HashSet::new();
        loop {
            let batch = tokio::select! {
                () = control.shared.signals.draining.cancelled() => return,
                got = news.recv() => match got {
                    Ok(q) => vec![q],
                    Err(RecvError::Lagged(_)) => control.shared.asks.list(),
                    Err(RecvError::Closed) => return,
                },
            };
            let pending: HashSet<String> = control
                .shared
                .asks
                .list()
                .iter()
                .map(|q| q.id.clone())
                .collect();
            posted.retain(|id| pending.contains(id));
            for question in batch {
                if posted.insert(question.id.clone()) {
                    post(&control, question);
                }
            }
        }
    });
}

/// Posts `question` to its authority's endpoint, if it has one, on a task of its own.
fn post(control: &Arc<Control>, question: Arc<Question>) {
    let Some(live) = control.shared.authorities.get(&question.authority) else {
        return;
    };
    let Some(ask) = live.authority.ask.clone() else {
        return;
    };
    let endpoint = match &ask.endpoint {
        AskEndpoint::Admin => return,
        AskEndpoint::Unix(path) => WatchdogEndpoint::Unix(path.clone()),
        AskEndpoint::Http { addr, path } => WatchdogEndpoint::Http {
            addr: *addr,
            path: path.clone(),
        },
    };
    let control = Arc::clone(control);
    tokio::spawn(async move {
        let Ok(body) = serde_json::to_vec(&*question) else {
            return;
        };
        let sent = crate::watchdog::post_json(&endpoint, body, MAX_ANSWER);
        let answer = match tokio::time::timeout(ask.timeout, sent).await {
            Ok(Ok((status, body))) if status == http::StatusCode::OK => reply::parse(&body),
            Ok(Ok((status, _))) => {
                tracing::debug!("ask endpoint {}: status {status}: pending", ask.endpoint);
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    "ask endpoint {}: question {}: {e}; it waits for the admin API or its timeout",
                    ask.endpoint,
                    question.id
                );
                return;
            }
            Err(_) => return,
        };
        let actor = Actor::AskEndpoint {
            endpoint: ask.endpoint.to_string(),
        };
        match answer {
            Ok(reply) => {
                if let Err(e) = control.answer_audited(&question.id, reply, actor).await {
                    tracing::debug!("ask endpoint answer to {}: {e}", question.id);
                }
            }
            Err(e) => tracing::warn!(
                "ask endpoint {}: its 200 for question {} is not an answer: {e}",
                ask.endpoint,
                question.id
            ),
        }
    });
}
