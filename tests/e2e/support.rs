//! The one place this test binary names the binary under test: Cargo builds `mediator`
//! before this test target and passes its path at compile time
//! (`CARGO_BIN_EXE_mediator`); the support crate gets it from here, never by building or
//! searching.

use std::path::Path;

use anyhow::Result;
use e2e::{Fixture, MediatorBuilder, agent_a_spec};
use mediator::audit::AuditRecord;
use mediator::decision_log::Record;
use serde_json::Value;

/// The `mediator` binary Cargo built for this test target.
pub(crate) fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_mediator"))
}

/// A configuration builder for [`bin`].
pub(crate) fn mediator() -> MediatorBuilder {
    MediatorBuilder::new(bin())
}

/// The default fixture: `agent-a` (token `TOKEN_A`) may reach `origin.test` on any port,
/// with `allow_private = ["127.0.0.0/8"]` so the loopback origin passes.
pub(crate) async fn agent_a() -> Result<Fixture> {
    Fixture::start(mediator().authority(agent_a_spec())).await
}

/// A predicate on typed decision-log records as the log helpers take it (they read JSON):
/// `expect_log(is(|r| r.protocol == Protocol::Tls), ...)`. Audit lines (design section
/// 21) are not decision records: they never match.
pub(crate) fn is(pred: impl Fn(&Record) -> bool) -> impl Fn(&Value) -> bool {
    move |v| !is_audit(v) && pred(&record(v))
}

/// Whether a log line is an audit record (`event: "audit"`).
pub(crate) fn is_audit(v: &Value) -> bool {
    v["event"] == "audit"
}

/// Every audit record of the decision log so far, typed.
///
/// # Errors
/// The log cannot be read, or an audit line is not an audit record.
pub(crate) fn audits(m: &e2e::Mediator) -> Result<Vec<AuditRecord>> {
    m.decision_lines()?
        .into_iter()
        .filter(is_audit)
        .map(|v| serde_json::from_value(v).map_err(anyhow::Error::from))
        .collect()
}

/// `v` read as the mediator's own record type. A log line that is not a [`Record`]
/// fails the test at once (it would otherwise match no predicate, and a negative check
/// would pass on it).
#[expect(
    clippy::panic,
    reason = "test support: a malformed log line is a failure"
)]
pub(crate) fn record(v: &Value) -> Record {
    serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("a decision-log line that is not a record ({e}): {v}"))
}

/// Every decision and close record of the decision log so far, typed (audit lines
/// left out).
///
/// # Errors
/// The log cannot be read, or a line is not a record.
pub(crate) fn records(m: &e2e::Mediator) -> Result<Vec<Record>> {
    m.decision_lines()?
        .into_iter()
        .filter(|v| !is_audit(v))
        .map(|v| serde_json::from_value(v).map_err(anyhow::Error::from))
        .collect()
}
