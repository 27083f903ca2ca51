//! Decision records off the box (design section 19): renderings of what the decision
//! log's writer hands over, so that no call site knows which format is on. `ocsf` renders
//! a record as an OCSF Network Activity event, `api_activity` an audit record (design
//! section 21) as an OCSF API Activity event; `otlp` ships both.

mod api_activity;
pub(crate) mod ocsf;
pub(crate) mod otlp;

/// The time of a record (its `ts`, RFC 3339 with milliseconds) since the Unix epoch; zero
/// for a `ts` that does not parse (never one the writer made).
pub(crate) fn since_epoch(ts: &str) -> std::time::Duration {
    humantime::parse_rfc3339(ts)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default()
}

/// The OCSF schema version the events follow.
pub(crate) const OCSF_VERSION: &str = "1.5.0";

/// The `metadata` of an OCSF event of record `id` of this `run` (decisions and audit
/// records alike): the product, the schema version, the record's id and `run:id`, the
/// profiles.
pub(crate) fn ocsf_metadata(id: u64, run: &str) -> serde_json::Value {
    serde_json::json!({
        "version": OCSF_VERSION,
        "product": {
            "name": "egress-mediator",
            "vendor_name": "egress-mediator",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "uid": id.to_string(),
        "correlation_uid": format!("{run}:{id}"),
        "profiles": ["security_control", "host"],
    })
}

/// Writes `event` (an OCSF event, a JSON object) to `out` with the native record whole
/// under `unmapped`: `native` is written as it is, never parsed again.
///
/// # Errors
/// The event cannot be serialised (only a programming error could cause it).
pub(crate) fn write_with_unmapped(
    event: &serde_json::Value,
    native: &[u8],
    out: &mut Vec<u8>,
) -> serde_json::Result<()> {
    serde_json::to_writer(&mut *out, event)?;
    // `{...}` then `,"unmapped":{native}}`.
    out.pop();
    out.extend_from_slice(b",\"unmapped\":");
    out.extend_from_slice(native);
    out.push(b'}');
    Ok(())
}
