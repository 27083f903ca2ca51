//! One decision record as an OCSF 1.5.0 Network Activity event (class 4001, profiles
//! `security_control` and `host`; schema: <https://schema.ocsf.io/1.5.0/classes/network_activity>).
//!
//! | OCSF | from |
//! |---|---|
//! | `activity_id` | 1 Open (a decision line), 2 Close (a close line) |
//! | `action_id`, `disposition_id` | allow: 1 Allowed, 1 Allowed; deny: 2 Denied, 2 Blocked |
//! | `status_id`, `status_detail` | 1 Success or 2 Failure; the `reason` |
//! | `severity_id` | 1 Informational (allow), 3 Medium (deny) |
//! | `time` | `ts`, milliseconds since the epoch |
//! | `src_endpoint` | TCP: `ip`, `port`; Unix socket: `name` `unix:pid=P,uid=U` |
//! | `dst_endpoint` | `hostname` (or `ip` for an address literal), `port`, the pinned `ip` |
//! | `actor` | `app_name` the authority; Unix socket: `process.pid`, `user.uid` |
//! | `connection_info` | `direction_id` 2 Outbound, `protocol_name` `tcp`, `uid` the connection id |
//! | `traffic` (close) | `bytes_out` = `bytes_up`, `bytes_in` = `bytes_down`, `bytes` both |
//! | `duration` (close) | `duration_ms` |
//! | `message` | the operator's `message`, else `detail` |
//! | `metadata` | `product` (name, vendor, version), `version` 1.5.0, `uid` the decision id, `correlation_uid` `run:id`, `profiles` |
//! | `unmapped` | the native record, whole, with `instance` and `run` |

use serde_json::{Value, json};

use crate::decision_log::{Line, Peer, Record, Render};
use crate::vocab::Event;

/// Network Activity (OCSF class 4001) of the Network Activity category (4).
const CLASS_UID: u64 = 4001;
const CATEGORY_UID: u64 = 4;

/// The `[log] format = "ocsf"` rendering.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ocsf;

impl Render for Ocsf {
    fn render(
        &self,
        line: Line<'_>,
        native: &[u8],
        run: &str,
        out: &mut Vec<u8>,
    ) -> serde_json::Result<()> {
        match line {
            Line::Decision(record) => render(record, native, run, out),
            Line::Audit(record) => super::api_activity::render(record, native, run, out),
        }
    }
}

/// `record` as one OCSF event, written to `out` (one JSON object); `native` is the record
/// as the native log writes it (a JSON object, `instance` and `run` included), kept whole
/// under `unmapped` as it is (never parsed again).
///
/// # Errors
/// The event cannot be serialised (only a programming error could cause it).
fn render(record: &Record, native: &[u8], run: &str, out: &mut Vec<u8>) -> serde_json::Result<()> {
    let allow = record.decision == policy::Verdict::Allow;
    let activity_id: u64 = match record.event {
        Event::Decision => 1,
        Event::Close => 2,
    };
    let time = u64::try_from(super::since_epoch(&record.ts).as_millis()).unwrap_or(u64::MAX);
    let mut event = json!({
        "class_uid": CLASS_UID,
        "class_name": "Network Activity",
        "category_uid": CATEGORY_UID,
        "category_name": "Network Activity",
        "activity_id": activity_id,
        "activity_name": if activity_id == 1 { "Open" } else { "Close" },
        "type_uid": CLASS_UID * 100 + activity_id,
        "time": time,
        "severity_id": if allow { 1 } else { 3 },
        "action_id": if allow { 1 } else { 2 },
        "action": if allow { "Allowed" } else { "Denied" },
        "disposition_id": if allow { 1 } else { 2 },
        "disposition": if allow { "Allowed" } else { "Blocked" },
        "status_id": if allow { 1 } else { 2 },
        "status": if allow { "Success" } else { "Failure" },
        "status_detail": record.reason.as_str(),
        "connection_info": {
            "direction_id": 2,
            "direction": "Outbound",
            "protocol_name": "tcp",
            "protocol_num": 6,
            "uid": record.conn.to_string(),
        },
        "metadata": super::ocsf_metadata(record.id, run),
    });
    let message = record
        .message
        .as_deref()
        .or((!record.detail.is_empty()).then_some(record.detail.as_str()));
    if let Some(m) = message {
        event["message"] = Value::from(m);
    }
    endpoints(record, &mut event);
    if let (Some(up), Some(down)) = (record.bytes_up, record.bytes_down) {
        event["traffic"] = json!({
            "bytes_out": up,
            "bytes_in": down,
            "bytes": up.saturating_add(down),
        });
    }
    if let Some(ms) = record.duration_ms {
        event["duration"] = Value::from(ms);
    }
    super::write_with_unmapped(&event, native, out)
}

/// `src_endpoint`, `actor` and `dst_endpoint` of `record`, set on `event`.
fn endpoints(record: &Record, event: &mut Value) {
    let mut actor = serde_json::Map::new();
    if let Some(a) = &record.authority {
        actor.insert("app_name".into(), Value::from(a.as_str()));
    }
    match &record.peer {
        Peer::Tcp(addr) => {
            event["src_endpoint"] = json!({ "ip": addr.ip().to_string(), "port": addr.port() });
        }
        Peer::Unix { pid, uid, .. } => {
            let pid_text = pid.map_or_else(|| "-".to_owned(), |p| p.to_string());
            event["src_endpoint"] = json!({ "name": format!("unix:pid={pid_text},uid={uid}") });
            if let Some(pid) = pid {
                actor.insert("process".into(), json!({ "pid": pid }));
            }
            actor.insert("user".into(), json!({ "uid": uid.to_string() }));
        }
        Peer::Embedded => {
            event["src_endpoint"] = json!({ "name": "embedded" });
        }
    }
    if !actor.is_empty() {
        event["actor"] = Value::Object(actor);
    }
    let mut dst = serde_json::Map::new();
    if let Some(host) = &record.host {
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        if literal.parse::<std::net::IpAddr>().is_ok() {
            dst.insert("ip".into(), Value::from(literal));
        } else {
            dst.insert("hostname".into(), Value::from(host.as_str()));
        }
    }
    if let Some(port) = record.port {
        dst.insert("port".into(), Value::from(port));
    }
    if let Some(pin) = &record.pin {
        dst.insert("ip".into(), Value::from(pin.as_str()));
    }
    if !dst.is_empty() {
        event["dst_endpoint"] = Value::Object(dst);
    }
}
