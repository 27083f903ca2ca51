//! A decision series looked up once for many decisions alike: a terminated tunnel's
//! requests count on it without taking the label lock per decision.

use std::sync::atomic::Ordering;

use policy::{Reason, Verdict};
use prometheus::IntCounter;

use super::Metrics;
use crate::vocab::Protocol;

/// One series of `mediator_decisions_total`, looked up once for many decisions alike (a
/// terminated tunnel's allowed requests): [`Metrics::count`] counts on it directly while
/// no authority's label or series changed since, else as [`Metrics::decision`] does.
#[derive(Debug)]
pub(crate) struct DecisionSeries {
    counter: IntCounter,
    epoch: u64,
    of: (Option<String>, Protocol, Verdict, Reason),
}

impl Metrics {
    /// The series [`Self::decision`] counts these decisions on, for [`Self::count`].
    pub(crate) fn decision_series(
        &self,
        authority: Option<&str>,
        protocol: Protocol,
        decision: Verdict,
        reason: Reason,
    ) -> DecisionSeries {
        // Read before the lookup: a change during it makes the series stale, never wrong.
        let epoch = self.epoch.load(Ordering::SeqCst);
        DecisionSeries {
            counter: self.decision_counter(authority, protocol, decision, reason),
            epoch,
            of: (authority.map(str::to_owned), protocol, decision, reason),
        }
    }

    /// Counts one decision of `series`, as [`Self::decision`] would.
    pub(crate) fn count(&self, series: &DecisionSeries) {
        if series.epoch == self.epoch.load(Ordering::SeqCst) {
            series.counter.inc();
        } else {
            let (authority, protocol, decision, reason) = &series.of;
            self.decision(authority.as_deref(), *protocol, *decision, *reason);
        }
    }
}
