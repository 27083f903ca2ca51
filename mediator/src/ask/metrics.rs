//! The metric families of asking the host (design section 20), kept by
//! [`crate::metrics::Metrics`] beside the others (it owns the `authority` label and its
//! cap):
//!
//! | family | type | labels |
//! |---|---|---|
//! | `mediator_asks_total` | counter | `authority` (the asker), `outcome` ([`AskOutcome`]) |
//! | `mediator_asks_pending` | gauge | `authority`: its requests held now |
//! | `mediator_ask_answer_duration_seconds` | histogram | from the question to the host's answer (`allow_via`, `deny`) |

use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::vocab::AskOutcome;

/// Buckets of the time to answer, in seconds: a policy engine answers in milliseconds,
/// a person in seconds to minutes (the longest `ask_timeout_s` is an hour).
const ANSWER_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0,
];

/// The families; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct AskMetrics {
    asked: IntCounterVec,
    pending: IntGaugeVec,
    answer: Histogram,
}

impl AskMetrics {
    /// Creates the families and registers them in `registry`.
    ///
    /// # Errors
    /// A name is taken (a programming error: the names are fixed).
    pub(crate) fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let asked = IntCounterVec::new(
            Opts::new(
                "mediator_asks_total",
                "Requests held for the host's answer (design section 20), by the asking authority and outcome: allow_via (judged again under another authority), deny, timeout, overloaded (max_pending_asks), hung_up (the client left), no_host (nobody to ask: the embedding shim had no control connection).",
            ),
            &["authority", "outcome"],
        )?;
        let pending = IntGaugeVec::new(
            Opts::new(
                "mediator_asks_pending",
                "Requests of each asking authority held for the host's answer now.",
            ),
            &["authority"],
        )?;
        let answer = Histogram::with_opts(
            HistogramOpts::new(
                "mediator_ask_answer_duration_seconds",
                "Time from a question to the host's answer (allow_via or deny), in seconds.",
            )
            .buckets(ANSWER_BUCKETS.to_vec()),
        )?;
        registry.register(Box::new(asked.clone()))?;
        registry.register(Box::new(pending.clone()))?;
        registry.register(Box::new(answer.clone()))?;
        Ok(Self {
            asked,
            pending,
            answer,
        })
    }

    /// Creates the series of an asking authority (`label`) at zero.
    pub(crate) fn prime(&self, label: &str) {
        self.pending.with_label_values(&[label]);
        for outcome in AskOutcome::ALL {
            self.asked.with_label_values(&[label, outcome.as_str()]);
        }
    }

    /// One more request of `label` held (`+1`) or one fewer (`-1`).
    pub(crate) fn held(&self, label: &str, delta: i64) {
        self.pending.with_label_values(&[label]).add(delta);
    }

    /// A question of `label` ended with `outcome` after `took`.
    pub(crate) fn ended(&self, label: &str, outcome: AskOutcome, took: Duration) {
        self.asked
            .with_label_values(&[label, outcome.as_str()])
            .inc();
        if matches!(outcome, AskOutcome::AllowVia | AskOutcome::Deny) {
            self.answer.observe(took.as_secs_f64());
        }
    }

    /// Removes every series of the authority `name` (revoked, its connections gone).
    pub(crate) fn forget(&self, name: &str) {
        let _ = self.pending.remove_label_values(&[name]);
        for outcome in AskOutcome::ALL {
            let _ = self.asked.remove_label_values(&[name, outcome.as_str()]);
        }
    }
}
