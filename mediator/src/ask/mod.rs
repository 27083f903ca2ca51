//! Asking the host (design section 20): the questions held now, one per request whose
//! grant miss its authority asks about, and the one way each ends.
//!
//! A request is held by a `Held` (made by `Asks::raise`), which its connection's task
//! awaits; the host's answer comes through `Asks::answer` (the admin API, the
//! authority's `ask` endpoint, the embedding shim) and reaches that task, which judges
//! the request again or denies it (`crate::conn::held`). Whatever ends a question (an
//! answer, the timeout, the client hanging up, the shutdown) removes it here first,
//! under one lock, so it ends once: a second answer is `AlreadyAnswered`, never a second
//! verdict.
//!
//! Bounded: each authority holds at most its `max_pending_asks` (the one more is refused
//! at once, `ask_overloaded`, and never waits for another authority's), the ids of ended
//! questions are remembered up to `ENDED_KEPT` (for the `409`), and new questions go to
//! listeners through a broadcast channel of `NEWS` entries (a listener that falls
//! behind is told so and re-lists). Nothing here decides, connects or writes a record.
//!
//! Files: `metrics.rs` (the families), `reply.rs` (an answer as the host writes it).

pub(crate) mod metrics;
pub mod reply;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, oneshot};

use crate::decision_log::Peer;
use crate::metrics::Metrics;
use crate::vocab::{AskOutcome, Protocol, deserialize_reason, serialize_reason};

/// How many ended questions' ids are remembered (an answer for one is `409`, for an id
/// never seen `404`).
pub(crate) const ENDED_KEPT: usize = 4096;

/// The broadcast channel's room for new questions not yet read by a slow listener.
pub(crate) const NEWS: usize = 256;

/// One question to the host (design section 20), as `GET /v1/asks`, its event stream,
/// an `ask` endpoint and the shim's control socket see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Question {
    /// Its id: the answer names it (`POST /v1/asks/<id>`).
    pub id: String,
    /// The authority whose grant missed and that asks.
    pub authority: String,
    /// The invocation the request belongs to (design section 20), if the host named one.
    pub invocation: Option<String>,
    /// The host's tags of the request's connection.
    pub tags: BTreeMap<String, String>,
    /// The canonical host asked for.
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// The front-end the request came through.
    pub protocol: Protocol,
    /// Who is on the other end (as in the decision log).
    pub peer: Peer,
    /// What the child would have been told: the operator's words (`default_deny_reason`)
    /// when there are some, else the denial's detail.
    pub message: String,
    /// The grant miss (`not_in_allowlist`, `port_not_allowed`).
    #[serde(
        serialize_with = "serialize_reason",
        deserialize_with = "deserialize_reason"
    )]
    pub reason: policy::Reason,
    /// When it was asked (RFC 3339 UTC).
    pub ts: String,
    /// How long the request is held for the answer, in seconds (`ask_timeout_s`).
    pub timeout_s: u64,
    /// A request inside a terminated tunnel (`protocol: "tls"`): its method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Its path (the query redacted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// What the host decided, once checked against the request's mediator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Judge the request again, in full, under this authority (its name).
    AllowVia(String),
    /// Deny it, `ask_denied`, with the host's words as `message` (none when empty).
    Deny(Option<String>),
    /// Nobody is there to ask (the embedding shim has no control connection open): the
    /// miss stands as it was, at once.
    Decline,
}

/// An answer and who gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answered {
    /// The answer.
    pub(crate) answer: Answer,
    /// Who answered, for the records' `asked.by` (`admin token <id>`, `ask endpoint
    /// <endpoint>`, ...).
    pub(crate) by: String,
}

/// Why an answer was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// No question has that id.
    #[error("no question has this id")]
    Unknown,
    /// The question has ended already (answered, timed out, or its client left).
    #[error("the question has ended already (answered, timed out, or its client left)")]
    AlreadyAnswered,
}

/// One more request than `max_pending_asks`: refused at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overloaded {
    /// The authority's `max_pending_asks`.
    pub(crate) max: u32,
}

/// The questions held now, shared by the connections, the admin API and the embedding
/// shim.
#[derive(Debug)]
pub(crate) struct Asks {
    core: Arc<Core>,
}

#[derive(Debug)]
struct Core {
    state: Mutex<State>,
    news: broadcast::Sender<Arc<Question>>,
    metrics: Metrics,
}

#[derive(Debug, Default)]
struct State {
    pending: HashMap<u64, Pending>,
    /// Held requests by authority name.
    held_by: HashMap<String, u32>,
    /// Ended ids, oldest first, and the same as a set.
    ended: VecDeque<u64>,
    ended_set: HashSet<u64>,
}

#[derive(Debug)]
struct Pending {
    question: Arc<Question>,
    reply: oneshot::Sender<Answered>,
}

impl State {
    /// Takes question `id` out (it ends here): its place of its authority is free.
    fn take(&mut self, id: u64, core: &Core) -> Option<Pending> {
        let p = self.pending.remove(&id)?;
        let name = p.question.authority.as_str();
        if let Some(n) = self.held_by.get_mut(name) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.held_by.remove(name);
            }
        }
        let (families, label) = core.metrics.asks(name);
        families.held(label, -1);
        if self.ended.len() == ENDED_KEPT
            && let Some(old) = self.ended.pop_front()
        {
            self.ended_set.remove(&old);
        }
        self.ended.push_back(id);
        self.ended_set.insert(id);
        Some(p)
    }
}

impl Asks {
    /// No question yet; its metrics go to `metrics`.
    pub(crate) fn new(metrics: Metrics) -> Self {
        let (news, _) = broadcast::channel(NEWS);
        Self {
            core: Arc::new(Core {
                state: Mutex::default(),
                news,
                metrics,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.core
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds the request `question` describes (its id the decision id `id`) until the
    /// host answers, if its authority holds fewer than `max` now; tells every listener.
    ///
    /// # Errors
    /// [`Overloaded`]: the authority holds `max` already (counted as `overloaded`).
    pub(crate) fn raise(&self, id: u64, question: Question, max: u32) -> Result<Held, Overloaded> {
        let question = Arc::new(question);
        let (tx, rx) = oneshot::channel();
        let (families, label) = self.core.metrics.asks(&question.authority);
        {
            let mut state = self.lock();
            let held = state.held_by.entry(question.authority.clone()).or_insert(0);
            if *held >= max {
                families.ended(label, AskOutcome::Overloaded, std::time::Duration::ZERO);
                return Err(Overloaded { max });
            }
            *held += 1;
            state.pending.insert(
                id,
                Pending {
                    question: Arc::clone(&question),
                    reply: tx,
                },
            );
            families.held(label, 1);
        }
        // No listener is no error: the question waits for one (or the timeout).
        let _ = self.core.news.send(Arc::clone(&question));
        Ok(Held {
            core: Arc::clone(&self.core),
            id,
            question,
            reply: Some(rx),
            since: Instant::now(),
            finished: false,
        })
    }

    /// Answers question `id`: its request's task gets `answered` and the question ends.
    /// Returns the question.
    ///
    /// # Errors
    /// [`AnswerError`]: no such question, or it has ended.
    pub(crate) fn answer(
        &self,
        id: &str,
        answered: Answered,
    ) -> Result<Arc<Question>, AnswerError> {
        let Ok(id) = id.parse::<u64>() else {
            return Err(AnswerError::Unknown);
        };
        let mut state = self.lock();
        let Some(p) = state.take(id, &self.core) else {
            return Err(if state.ended_set.contains(&id) {
                AnswerError::AlreadyAnswered
            } else {
                AnswerError::Unknown
            });
        };
        // Sent under the lock: the holder cannot have given up in between (its drop
        // takes the lock first), so a taken answer always reaches it.
        let _ = p.reply.send(answered);
        Ok(p.question)
    }

    /// Question `id`, while it is pending.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Question>> {
        let id = id.parse::<u64>().ok()?;
        self.lock()
            .pending
            .get(&id)
            .map(|p| Arc::clone(&p.question))
    }

    /// Every pending question, oldest first.
    pub(crate) fn list(&self) -> Vec<Arc<Question>> {
        let state = self.lock();
        let mut ids: Vec<&u64> = state.pending.keys().collect();
        ids.sort_unstable();
        ids.into_iter()
            .filter_map(|id| state.pending.get(id).map(|p| Arc::clone(&p.question)))
            .collect()
    }

    /// New questions from now on (a receiver that falls [`NEWS`] behind gets `Lagged`
    /// and should list again).
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<Question>> {
        self.core.news.subscribe()
    }
}

/// A request held for the host's answer. Dropped before [`Held::finish`] (its client
/// left, so its task was dropped), it ends the question as `hung_up`: its place is free
/// at once.
#[derive(Debug)]
pub(crate) struct Held {
    core: Arc<Core>,
    id: u64,
    question: Arc<Question>,
    reply: Option<oneshot::Receiver<Answered>>,
    since: Instant,
    finished: bool,
}

impl Held {
    /// When it was asked.
    pub(crate) fn since(&self) -> Instant {
        self.since
    }

    /// Waits for the host's answer (forever if none comes: the caller bounds the wait).
    pub(crate) async fn answered(&mut self) -> Answered {
        match self.reply.as_mut() {
            Some(rx) => match rx.await {
                Ok(a) => a,
                // The sender lives in the table until an answer takes it.
                Err(_) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    /// Ends the question now (a timeout, the shutdown, the client gone): it is taken out
    /// of the table unless an answer took it first, whose answer is then returned (the
    /// caller acts on it: it was given before).
    pub(crate) fn close(&mut self) -> Option<Answered> {
        let taken = self
            .core
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(self.id, &self.core);
        if taken.is_some() {
            return None;
        }
        self.reply.take().and_then(|mut rx| rx.try_recv().ok())
    }

    /// Ends the question (if [`Self::close`] did not) and counts how it ended; once.
    pub(crate) fn finish(&mut self, outcome: AskOutcome) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let _ = self.close();
        let (families, label) = self.core.metrics.asks(&self.question.authority);
        families.ended(label, outcome, self.since.elapsed());
    }

    /// Whether [`Self::finish`] ran.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.finish(AskOutcome::HungUp);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;

    fn question(authority: &str) -> Question {
        Question {
            id: String::new(),
            authority: authority.to_owned(),
            invocation: None,
            tags: BTreeMap::new(),
            host: "h.test".into(),
            port: 443,
            protocol: Protocol::Connect,
            peer: Peer::Embedded,
            message: "not in the grant".into(),
            reason: policy::Reason::NotInAllowlist,
            ts: String::new(),
            timeout_s: 30,
            method: None,
            path: None,
        }
    }

    fn asks() -> (Asks, Metrics) {
        let metrics = Metrics::new().unwrap();
        for a in ["a", "b"] {
            metrics.prime(a);
            let (families, label) = metrics.asks(a);
            families.prime(label);
        }
        (Asks::new(metrics.clone()), metrics)
    }

    fn deny(by: &str) -> Answered {
        Answered {
            answer: Answer::Deny(None),
            by: by.to_owned(),
        }
    }

    #[tokio::test]
    async fn an_answer_reaches_its_request_once() {
        let (asks, metrics) = asks();
        let mut news = asks.subscribe();
        let mut held = asks.raise(7, question("a"), 2).unwrap();
        assert_eq!(news.recv().await.unwrap().authority, "a");
        assert_eq!(asks.list().len(), 1);
        assert!(asks.get("7").is_some());
        asks.answer("7", deny("test")).unwrap();
        assert_eq!(held.answered().await, deny("test"));
        assert_eq!(
            asks.answer("7", deny("again")),
            Err(AnswerError::AlreadyAnswered)
        );
        assert_eq!(asks.answer("8", deny("x")), Err(AnswerError::Unknown));
        assert_eq!(asks.answer("x", deny("x")), Err(AnswerError::Unknown));
        held.finish(AskOutcome::Deny);
        let text = metrics.render();
        for line in [
            "mediator_asks_total{authority=\"a\",outcome=\"deny\"} 1",
            "mediator_asks_pending{authority=\"a\"} 0",
            "mediator_ask_answer_duration_seconds_count 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
    }

    #[tokio::test]
    async fn each_authority_holds_its_own_maximum() {
        let (asks, metrics) = asks();
        let _one = asks.raise(1, question("a"), 1).unwrap();
        assert_eq!(
            asks.raise(2, question("a"), 1).unwrap_err(),
            Overloaded { max: 1 }
        );
        // Another authority is not affected.
        let _other = asks.raise(3, question("b"), 1).unwrap();
        let text = metrics.render();
        assert!(text.contains("mediator_asks_total{authority=\"a\",outcome=\"overloaded\"} 1"));
        assert!(text.contains("mediator_asks_pending{authority=\"a\"} 1"));
    }

    #[tokio::test]
    async fn a_dropped_request_frees_its_place_and_counts_hung_up() {
        let (asks, metrics) = asks();
        let held = asks.raise(1, question("a"), 1).unwrap();
        drop(held);
        assert!(asks.list().is_empty());
        assert_eq!(
            asks.answer("1", deny("late")),
            Err(AnswerError::AlreadyAnswered)
        );
        let _again = asks.raise(2, question("a"), 1).unwrap();
        assert!(
            metrics
                .render()
                .contains("mediator_asks_total{authority=\"a\",outcome=\"hung_up\"} 1")
        );
    }

    #[tokio::test]
    async fn an_answer_racing_the_end_is_the_answer() {
        let (asks, _) = asks();
        let mut held = asks.raise(1, question("a"), 1).unwrap();
        asks.answer("1", deny("host")).unwrap();
        // The timeout fired at the same moment: close finds the answer given.
        assert_eq!(held.close(), Some(deny("host")));
        let mut unanswered = asks.raise(2, question("a"), 1).unwrap();
        assert_eq!(unanswered.close(), None);
        assert_eq!(
            asks.answer("2", deny("late")),
            Err(AnswerError::AlreadyAnswered)
        );
        let waited = tokio::time::timeout(Duration::from_millis(20), unanswered.answered()).await;
        assert!(
            waited.is_err(),
            "a closed question has no answer to wait for"
        );
    }

    #[test]
    fn ended_ids_are_remembered_within_a_bound() {
        let (asks, _) = asks();
        for id in 0..(ENDED_KEPT as u64 + 10) {
            let mut held = asks.raise(id, question("a"), 1).unwrap();
            held.finish(AskOutcome::Timeout);
        }
        let state = asks.lock();
        assert_eq!(state.ended.len(), ENDED_KEPT);
        assert_eq!(state.ended_set.len(), ENDED_KEPT);
        assert!(!state.ended_set.contains(&0));
    }
}
