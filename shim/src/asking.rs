//! Asking the host in embedded mode (design section 20): with `--control`, a grant miss of
//! the run's authority (and of every authority a rebind or an answer makes) is held
//! while the host is asked. Each question goes as one `{"ask": {...}}` line to every
//! connection the host holds open on the control socket (the pending ones first, to a
//! connection that arrives later); the host answers on any of them with `{"answer":
//! "<id>", "allow_via": ...}` or `{"answer": "<id>", "deny": "..."}` (the control
//! socket's `answer` command, `crate::control`). In socket mode asking belongs to the
//! authority's own `ask` setting: the shim relays nothing.
//!
//! A question is asked only while the host holds a connection open: with none, its grant
//! miss stands at once (`asked.outcome: "no_host"`), and so do the questions still
//! pending when the last connection closes; a shim whose control socket only rebinds
//! denies as it did without asking.
//!
//! The run's questions and how each ended come from the embedded mediator's records
//! (their `asked`), for `--report`.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;

use tokio::sync::broadcast::error::RecvError;

/// How long a question line may take to reach one control connection before that
/// connection is given up (a host that does not read its questions).
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// The most questions a run keeps for its report (later ones are counted).
const MAX_ASKED: usize = 1_000;

/// One question of the run, as the report lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Asked {
    /// The question's id.
    pub(crate) id: String,
    /// The authority that asked.
    pub(crate) from: String,
    /// The host and port asked for.
    pub(crate) host: Option<String>,
    /// The port.
    pub(crate) port: Option<u16>,
    /// How it ended: `allow_via`, `deny`, `timeout`, `overloaded`, `hung_up`.
    pub(crate) outcome: String,
    /// The authority the request ran under in the end (the `allow_via` one).
    pub(crate) authority: Option<String>,
    /// The final decision, `allow` or `deny`, and its reason.
    pub(crate) decision: String,
    /// The reason.
    pub(crate) reason: String,
    /// How long it was held, in milliseconds.
    pub(crate) ms: u64,
}

/// The connections the host holds open on the control socket, and the run's questions.
#[derive(Debug, Default)]
pub(crate) struct Asking {
    clients: Mutex<Vec<Arc<Mutex<UnixStream>>>>,
    asked: Mutex<(Vec<Asked>, u64)>,
    /// The embedded mediator, once it runs.
    running: Mutex<std::sync::Weak<mediator::Running>>,
}

/// What a question's record says when nobody held the control socket open.
const NO_HOST: &str = "shim: no connection open on the control socket to ask on";

impl Asking {
    /// No connection yet.
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    /// A control connection (`out`, its writing half, shared with its answers) gets every
    /// question from now on, after `pending`.
    pub(crate) fn subscribe(
        &self,
        out: &Arc<Mutex<UnixStream>>,
        pending: &[Arc<mediator::ask::Question>],
    ) {
        {
            let s = out.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
        }
        for q in pending {
            if !send(out, &line(q)) {
                return;
            }
        }
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(out));
    }

    /// A control connection that has gone; when it was the last, the pending questions
    /// have nobody to be asked of: their misses stand.
    pub(crate) fn unsubscribe(&self, out: &Arc<Mutex<UnixStream>>) {
        let none_left = {
            let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
            clients.retain(|c| !Arc::ptr_eq(c, out));
            clients.is_empty()
        };
        if none_left {
            let running = self
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .upgrade();
            for q in running.iter().flat_map(|r| r.pending_questions()) {
                if let Some(r) = &running {
                    r.decline(&q.id, NO_HOST);
                }
            }
        }
    }

    /// Sends `questions` to every connection (one that cannot take them is dropped); with
    /// none, nobody is asked: their misses stand.
    fn send_all(&self, questions: &[Arc<mediator::ask::Question>]) {
        let clients: Vec<_> = self
            .clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if clients.is_empty() {
            let running = self
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .upgrade();
            if let Some(r) = running {
                for q in questions {
                    r.decline(&q.id, NO_HOST);
                }
            }
            return;
        }
        let text: String = questions.iter().map(|q| line(q)).collect();
        for c in clients {
            if !send(&c, &text) {
                self.unsubscribe(&c);
            }
        }
    }

    /// Relays `running`'s questions to the connections until it stops: started with the
    /// embedded mediator, on its runtime (the writes on a blocking thread).
    pub(crate) fn relay(self: &Arc<Self>, running: &Arc<mediator::Running>) {
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(running);
        let mut news = running.questions();
        let (me, running) = (Arc::clone(self), Arc::downgrade(running));
        tokio::spawn(async move {
            loop {
                let batch = match news.recv().await {
                    Ok(q) => vec![q],
                    // Fell behind: what is pending now (some may be sent twice).
                    Err(RecvError::Lagged(_)) => match running.upgrade() {
                        Some(r) => r.pending_questions(),
                        None => return,
                    },
                    Err(RecvError::Closed) => return,
                };
                let me = Arc::clone(&me);
                let _ = tokio::task::spawn_blocking(move || me.send_all(&batch)).await;
            }
        });
    }

    /// Notes a question's end from a record of the embedded mediator (its `asked`).
    pub(crate) fn record(&self, rec: &mediator::Record) {
        let Some(asked) = &rec.asked else { return };
        if rec.event != mediator::vocab::Event::Decision {
            return;
        }
        let entry = Asked {
            id: asked.id.clone(),
            from: asked.from.clone(),
            host: rec.host.clone(),
            port: rec.port,
            outcome: asked.outcome.as_str().to_owned(),
            authority: rec.authority.clone(),
            decision: rec.decision.as_str().to_owned(),
            reason: rec.reason.as_str().to_owned(),
            ms: asked.ms,
        };
        let mut list = self.asked.lock().unwrap_or_else(PoisonError::into_inner);
        if list.0.len() < MAX_ASKED {
            list.0.push(entry);
        } else {
            list.1 += 1;
        }
    }

    /// The run's questions, in the order they ended.
    pub(crate) fn asked(&self) -> Vec<Asked> {
        self.asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .clone()
    }
}

/// One `{"ask": question}` line.
fn line(q: &mediator::ask::Question) -> String {
    format!("{}\n", serde_json::json!({ "ask": q }))
}

/// Writes `text` whole (one write: a reader gets whole lines); whether it went.
fn send(out: &Mutex<UnixStream>, text: &str) -> bool {
    out.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .write_all(text.as_bytes())
        .is_ok()
}
