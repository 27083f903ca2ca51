//! One audit record (design section 21) as an OCSF 1.5.0 API Activity event (class 6003
//! of the Application Activity category, profiles `security_control` and `host`; schema:
//! <https://schema.ocsf.io/1.5.0/classes/api_activity>).
//!
//! | OCSF | from |
//! |---|---|
//! | `activity_id` | 1 Create (`create`, `registry_put`), 3 Update (`reload`), 4 Delete (`delete`, `registry_delete`, `expire`), 99 Other (`ask_answer`) |
//! | `api.operation` | the `action`; `api.request.uid` the record id; `api.response` the HTTP `status` and `why` |
//! | `status_id`, `action_id`, `disposition_id` | accepted or partial: 1 Success, 1 Allowed, 1 Allowed; refused: 2 Failure, 2 Denied, 2 Blocked |
//! | `status_detail` | the `result`, or `why` |
//! | `severity_id` | 3 Medium when refused, partial or widening a reach; else 1 Informational |
//! | `actor` | `user.credential_uid` the token id (`user.name` `admin token <id>`); `user.uid` and `process.pid` of an admin socket peer; `app_name` what else made the change |
//! | `src_endpoint` | the admin client's `ip` and `port`; else `name` (`unix:pid=P,uid=U`, `sighup`, `config_watch`, `registry:etcd`, `expiry`) |
//! | `resources` | one per changed authority: `type` `authority`, `name`, `uid` the generation, `data` the change (digest, reach, classes) |
//! | `message` | a sentence: what, by whom, how it ended |
//! | `metadata` | as for decisions; `uid` the record id, `correlation_uid` `run:id` |
//! | `unmapped` | the native record, whole, with `instance` and `run` |

use serde_json::{Map, Value, json};

use crate::audit::record::{Action, Actor, AuditRecord, AuditResult};

/// API Activity (OCSF class 6003) of the Application Activity category (6).
const CLASS_UID: u64 = 6003;
const CATEGORY_UID: u64 = 6;

/// `record` as one OCSF event, written to `out`; `native` (the record as the native log
/// writes it) is kept whole under `unmapped`.
///
/// # Errors
/// The event cannot be serialised (only a programming error could cause it).
pub(super) fn render(
    record: &AuditRecord,
    native: &[u8],
    run: &str,
    out: &mut Vec<u8>,
) -> serde_json::Result<()> {
    let (activity_id, activity_name): (u64, &str) = match record.action {
        Action::Create | Action::RegistryPut => (1, "Create"),
        Action::Reload => (3, "Update"),
        Action::Delete | Action::RegistryDelete | Action::Expire => (4, "Delete"),
        Action::AskAnswer => (99, "Other"),
    };
    let done = record.result != AuditResult::Refused;
    let time = u64::try_from(super::since_epoch(&record.ts).as_millis()).unwrap_or(u64::MAX);
    let mut response = Map::new();
    if let Some(status) = record.status {
        response.insert("code".into(), json!(status));
    }
    if let Some(why) = &record.why {
        response.insert("message".into(), json!(why));
    }
    let mut api = json!({
        "operation": record.action.as_str(),
        "service": { "name": "egress-mediator control plane" },
        "request": { "uid": record.id.to_string() },
    });
    if !response.is_empty() {
        api["response"] = Value::Object(response);
    }
    let (actor, src_endpoint, who) = actor(&record.actor);
    let resources: Vec<Value> = record
        .changes
        .iter()
        .map(|c| {
            json!({
                "type": "authority",
                "name": c.authority,
                "uid": c.generation.to_string(),
                "data": c,
            })
        })
        .collect();
    let mut event = json!({
        "class_uid": CLASS_UID,
        "class_name": "API Activity",
        "category_uid": CATEGORY_UID,
        "category_name": "Application Activity",
        "activity_id": activity_id,
        "activity_name": activity_name,
        "type_uid": CLASS_UID * 100 + activity_id,
        "type_name": format!("API Activity: {activity_name}"),
        "time": time,
        "severity_id": if record.notable() { 3 } else { 1 },
        "status_id": if done { 1 } else { 2 },
        "status": if done { "Success" } else { "Failure" },
        "status_detail": record.why.as_deref().unwrap_or(record.result.as_str()),
        "action_id": if done { 1 } else { 2 },
        "action": if done { "Allowed" } else { "Denied" },
        "disposition_id": if done { 1 } else { 2 },
        "disposition": if done { "Allowed" } else { "Blocked" },
        "api": api,
        "actor": actor,
        "src_endpoint": src_endpoint,
        "message": message(record, &who),
        "metadata": super::ocsf_metadata(record.id, run),
    });
    if !resources.is_empty() {
        event["resources"] = Value::Array(resources);
    }
    super::write_with_unmapped(&event, native, out)
}

/// The `actor` and `src_endpoint` objects, and the actor in words.
fn actor(actor: &Actor) -> (Value, Value, String) {
    match actor {
        Actor::AdminTcp { token_id, addr } => {
            let (ip, port) = match addr.parse::<std::net::SocketAddr>() {
                Ok(a) => (json!(a.ip().to_string()), json!(a.port())),
                Err(_) => (Value::Null, Value::Null),
            };
            let mut src = json!({ "name": addr });
            if !ip.is_null() {
                src = json!({ "ip": ip, "port": port });
            }
            let (user, who) = match token_id {
                Some(id) => (
                    json!({ "user": {
                        "name": format!("admin token {id}"),
                        "credential_uid": id,
                        "type_id": 99,
                        "type": "admin token",
                    } }),
                    format!("admin token {id} from {addr}"),
                ),
                None => (
                    json!({ "app_name": "admin API (no token)" }),
                    format!("{addr} without a token"),
                ),
            };
            (user, src, who)
        }
        Actor::AdminSocket {
            uid,
            gid: _,
            pid,
            token_id,
        } => {
            let mut user = json!({ "uid": uid.to_string() });
            if let Some(id) = token_id {
                user["credential_uid"] = json!(id);
            }
            let mut a = json!({ "user": user });
            if let Some(pid) = pid {
                a["process"] = json!({ "pid": pid });
            }
            let pid_text = pid.map_or_else(|| "-".to_owned(), |p| p.to_string());
            (
                a,
                json!({ "name": format!("unix:pid={pid_text},uid={uid}") }),
                format!("uid {uid} (pid {pid_text}) on the admin socket"),
            )
        }
        Actor::Sighup => named("sighup", "SIGHUP"),
        Actor::ConfigWatch => named("config_watch", "the config file watch"),
        Actor::Registry { backend } => named(
            &format!("registry:{backend}"),
            &format!("another writer of the {backend} registry"),
        ),
        Actor::Expiry => named("expiry", "the ttl_s timer"),
    }
}

fn named(name: &str, words: &str) -> (Value, Value, String) {
    (
        json!({ "app_name": words }),
        json!({ "name": name }),
        words.to_owned(),
    )
}

/// `create of authority "agent-c" by admin token 3f2a… from 127.0.0.1:40112: accepted`.
fn message(record: &AuditRecord, who: &str) -> String {
    let what = match &record.authority {
        Some(a) => format!(" of authority {a:?}"),
        None => String::new(),
    };
    let how = match &record.why {
        Some(why) => format!("{}: {why}", record.result.as_str()),
        None => record.result.as_str().to_owned(),
    };
    format!("{}{what} by {who}: {how}", record.action.as_str())
}
