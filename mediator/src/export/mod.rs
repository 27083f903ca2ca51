//! Decision records off the box (design section 19): renderings of what the decision
//! log's writer hands over, so that no call site knows which format is on. `ocsf` renders
//! a record as an OCSF Network Activity event.

pub(crate) mod ocsf;
pub(crate) mod otlp;

/// The time of a record (its `ts`, RFC 3339 with milliseconds) since the Unix epoch; zero
/// for a `ts` that does not parse (never one the writer made).
pub(crate) fn since_epoch(record: &crate::decision_log::Record) -> std::time::Duration {
    humantime::parse_rfc3339(&record.ts)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default()
}
