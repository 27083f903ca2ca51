//! Audit records (design section 21) with the real binary: an admin API create, a delete,
//! a reload and a refused create each write exactly one `audit` line, naming who (the
//! token's id over TCP, the peer's uid and pid on the admin socket, the signal or the
//! file watch for a reload) and what (name, generation, grant digest, what the change widened); the
//! acknowledged ones are on record at once, a `kill -9` right after the answer included;
//! in OCSF mode they are API Activity events (class 6003) valid against the schema in
//! `tests/ocsf/`; `mediator_audit_total` counts them.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::harness::Case;
use e2e::tool::Tool;
use e2e::{Fixture, HttpConn, HttpResponse, Mediator, agent_a_spec, case, sha256_hex};
use mediator::audit::{Action, Actor, AuditResult, ChangeKind};
use policy::review::{Outcome, RiskClass};
use serde_json::{Value, json};

use crate::decisions::ocsf::{API_ACTIVITY, validate};
use crate::support::{audits, mediator};

/// The admin token of these tests.
const TOKEN: &str = "audit-admin-token-5c1";

/// A mediator with the admin API on TCP (token required) and on its own Unix socket.
async fn start(admin_sock: &Path, format: &str) -> Result<Fixture> {
    Fixture::start(
        mediator()
            .admin(true)
            .listen_line(&format!("admin_token_sha256 = \"{}\"", sha256_hex(TOKEN)))
            .listen_line(&format!(
                "admin_socket = {:?}",
                admin_sock.to_string_lossy()
            ))
            .log_format(format)
            .authority(agent_a_spec()),
    )
    .await
}

/// `method path` on the admin Unix socket, with the token.
async fn on_socket(sock: &Path, method: &str, path: &str) -> Result<HttpResponse> {
    let mut c = HttpConn::unix(sock).await?;
    c.request(
        format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
}

/// The token id of `token`: the first 12 hex digits of its SHA-256.
fn token_id(token: &str) -> String {
    sha256_hex(token)[..12].to_owned()
}

/// The configuration file again, with one more authority (`agent-n`).
fn with_another_authority(m: &Mediator) -> Result<String> {
    let text = std::fs::read_to_string(m.config_path())?;
    Ok(format!(
        "{text}\n[[authority]]\nname = \"agent-n\"\nallow = [\"n.test:443\"]\n"
    ))
}

#[expect(
    clippy::too_many_lines,
    reason = "one story: four changes, each checked for its one record"
)]
async fn each_change_writes_one_audit_record_naming_who_and_what() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("admin.sock");
    let fx = start(&sock, "native").await?;
    let m = &fx.mediator;

    // A create over TCP with the token: on record as soon as it is answered.
    let body = json!({"name": "task-1", "allow": ["*.example.org:443"]}).to_string();
    let resp = m
        .admin("POST", "/v1/authorities", Some(&body), Some(TOKEN))
        .await?;
    ensure!(resp.status == 201, "{} {}", resp.status, resp.text());
    let created = resp.json()?;
    let records = audits(m)?;
    ensure!(records.len() == 1, "{records:#?}");
    let r = &records[0];
    ensure!(
        (r.action, r.result, r.status) == (Action::Create, AuditResult::Accepted, Some(201)),
        "{r:#?}"
    );
    ensure!(
        matches!(&r.actor, Actor::AdminTcp { token_id: Some(id), addr } if *id == token_id(TOKEN) && addr.starts_with("127.0.0.1:")),
        "{r:#?}"
    );
    let change = r.changes.first().context("no change")?;
    ensure!(
        r.changes.len() == 1 && change.change == ChangeKind::Added,
        "{r:#?}"
    );
    ensure!(
        json!(change.generation) == created["generation"]
            && json!(change.grant_digest) == created["grant_digest"],
        "{r:#?}\n{created}"
    );
    ensure!(
        change.reach == Outcome::Widened && change.widened == [RiskClass::Host],
        "{r:#?}"
    );
    let line = m
        .decision_lines()?
        .into_iter()
        .find(|v| v["event"] == "audit")
        .context("no audit line")?;
    ensure!(
        !line.to_string().contains(TOKEN),
        "the token itself is never logged: {line}"
    );

    // A create with a wrong token: refused, audited, nothing created.
    let resp = m
        .admin(
            "POST",
            "/v1/authorities",
            Some(&body),
            Some("not-the-token"),
        )
        .await?;
    ensure!(resp.status == 401, "{}", resp.status);
    let records = audits(m)?;
    ensure!(records.len() == 2, "{records:#?}");
    let r = &records[1];
    ensure!(
        (r.action, r.result, r.status) == (Action::Create, AuditResult::Refused, Some(401))
            && r.changes.is_empty()
            && r.why.as_deref().is_some_and(|w| w.contains("token")),
        "{r:#?}"
    );
    ensure!(
        matches!(&r.actor, Actor::AdminTcp { token_id: Some(id), .. } if *id == token_id("not-the-token")),
        "the id of the token presented: {r:#?}"
    );

    // A delete on the admin socket: the peer's uid and pid.
    let resp = on_socket(&sock, "DELETE", "/v1/authorities/task-1").await?;
    ensure!(resp.status == 200, "{} {}", resp.status, resp.text());
    let records = audits(m)?;
    ensure!(records.len() == 3, "{records:#?}");
    let r = &records[2];
    ensure!(
        (r.action, r.result) == (Action::Delete, AuditResult::Accepted)
            && r.authority.as_deref() == Some("task-1"),
        "{r:#?}"
    );
    ensure!(
        matches!(r.actor, Actor::AdminSocket { uid, pid: Some(pid), .. }
            if uid == nix::unistd::getuid().as_raw() && pid == i32::try_from(std::process::id())?),
        "{r:#?}"
    );
    ensure!(
        r.changes.len() == 1
            && r.changes[0].change == ChangeKind::Removed
            && json!(r.changes[0].generation) == created["generation"]
            && r.changes[0].reach == Outcome::Narrowed,
        "{r:#?}"
    );

    // A reload (SIGHUP) that adds an authority.
    m.reload_with(&with_another_authority(m)?).await?;
    let records = audits(m)?;
    ensure!(records.len() == 4, "{records:#?}");
    let r = &records[3];
    ensure!(
        (r.action, r.result, &r.actor) == (Action::Reload, AuditResult::Accepted, &Actor::Sighup),
        "{r:#?}"
    );
    ensure!(
        r.changes.len() == 1
            && r.changes[0].authority == "agent-n"
            && r.changes[0].change == ChangeKind::Added
            && r.changes[0].widened == [RiskClass::Host],
        "{r:#?}"
    );

    // Counted by action and result.
    let p = m.metrics().await?;
    for (action, result, n) in [
        ("create", "accepted", 1.0),
        ("create", "refused", 1.0),
        ("delete", "accepted", 1.0),
        ("reload", "accepted", 1.0),
        ("registry_put", "accepted", 0.0),
    ] {
        let got = p.get(
            "mediator_audit_total",
            &[("action", action), ("result", result)],
        );
        ensure!(
            got == n,
            "mediator_audit_total{{{action},{result}}} = {got}"
        );
    }
    // Ids come from the decision ids' sequence: distinct, increasing.
    let ids: Vec<u64> = audits(m)?.iter().map(|r| r.id).collect();
    ensure!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    Ok(())
}

/// A reload whose file does not validate is refused and audited too; one that changes
/// an authority names the generations, the grant digests (which change with any part of
/// the grant, an operator's reason too) and what the change widened.
async fn a_refused_reload_and_a_changed_authority_are_audited() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("admin.sock");
    let fx = start(&sock, "native").await?;
    let m = &fx.mediator;
    let good = std::fs::read_to_string(m.config_path())?;
    let _ = m
        .reload_with(&format!(
            "{good}\n[[authority]]\nname = \"bad\"\nallow = [\"*.com\"]\n"
        ))
        .await;
    let records = audits(m)?;
    ensure!(records.len() == 1, "{records:#?}");
    let r = &records[0];
    ensure!(
        (r.action, r.result) == (Action::Reload, AuditResult::Refused)
            && r.why.as_deref().is_some_and(|w| w.contains("*.com")),
        "{r:#?}"
    );
    // agent-a gains an address range: replaced, widened by allow_private.
    let wider = good.replacen(
        "allow_private = [\"127.0.0.0/8\"]",
        "allow_private = [\"127.0.0.0/8\", \"10.0.0.0/8\"]",
        1,
    );
    ensure!(wider != good, "the fixture's allow_private moved: {good}");
    m.reload_with(&wider).await?;
    let records = audits(m)?;
    ensure!(records.len() == 2, "{records:#?}");
    let c = records[1].changes.first().context("no change")?;
    ensure!(
        c.change == ChangeKind::Replaced
            && c.previous_generation.is_some_and(|g| g < c.generation)
            && c.previous_grant_digest
                .as_ref()
                .is_some_and(|d| *d != c.grant_digest)
            && c.reach == Outcome::Widened
            && c.widened == [RiskClass::AllowPrivate],
        "{records:#?}"
    );
    // Only the operator's words change: a new digest all the same, nothing widened.
    let worded = wider.replacen(
        "allow_private = [",
        "default_deny_reason = \"ask the platform team\"\nallow_private = [",
        1,
    );
    m.reload_with(&worded).await?;
    let records = audits(m)?;
    let c = records
        .get(2)
        .and_then(|r| r.changes.first())
        .context("no change")?;
    ensure!(
        c.change == ChangeKind::Replaced
            && c.previous_grant_digest
                .as_ref()
                .is_some_and(|d| *d != c.grant_digest)
            && c.reach == Outcome::Narrowed
            && c.widened.is_empty(),
        "{records:#?}"
    );
    Ok(())
}

/// `--watch-config`: a reload the file watch made names the watch.
async fn a_reload_by_the_file_watch_names_the_watch() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .arg("--watch-config")
            .authority(agent_a_spec()),
    )
    .await?;
    let m = &fx.mediator;
    std::fs::write(m.config_path(), with_another_authority(m)?)?;
    let record = e2e::wait::wait_for(
        Duration::from_secs(15),
        || Ok(audits(m)?.into_iter().find(|r| r.action == Action::Reload)),
        || "no reload record after the file changed".to_owned(),
    )
    .await?;
    ensure!(
        record.actor == Actor::ConfigWatch
            && record.result == AuditResult::Accepted
            && record.changes.iter().any(|c| c.authority == "agent-n"),
        "{record:#?}"
    );
    Ok(())
}

/// An acknowledged change is on record before its answer: a `kill -9` right after the
/// 201 leaves the audit line in the log.
async fn an_acknowledged_change_survives_kill_9() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("admin.sock");
    let fx = start(&sock, "native").await?;
    let m = &fx.mediator;
    for i in 0..5 {
        let body = json!({"name": format!("task-{i}"), "allow": ["x.test"]}).to_string();
        let resp = m
            .admin("POST", "/v1/authorities", Some(&body), Some(TOKEN))
            .await?;
        ensure!(resp.status == 201, "{}", resp.text());
    }
    m.signal(nix::sys::signal::Signal::SIGKILL)?;
    let records = audits(m)?;
    let created: Vec<&str> = records
        .iter()
        .filter_map(|r| r.authority.as_deref())
        .collect();
    ensure!(
        created == ["task-0", "task-1", "task-2", "task-3", "task-4"],
        "{records:#?}"
    );
    Ok(())
}

/// `[log] format = "ocsf"`: each audit record is an OCSF API Activity event (6003) valid
/// against the published schema, with the actor and the authority where a SIEM looks.
async fn audit_records_are_valid_ocsf_api_activity_events() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("admin.sock");
    let fx = start(&sock, "ocsf").await?;
    let m = &fx.mediator;
    let body = json!({"name": "task-1", "allow": ["x.test:443"]}).to_string();
    let created = m
        .admin("POST", "/v1/authorities", Some(&body), Some(TOKEN))
        .await?;
    ensure!(created.status == 201, "{}", created.text());
    let refused = m
        .admin(
            "POST",
            "/v1/authorities",
            Some("{\"name\": 1}"),
            Some(TOKEN),
        )
        .await?;
    ensure!(refused.status == 400, "{}", refused.text());
    ensure!(
        on_socket(&sock, "DELETE", "/v1/authorities/task-1")
            .await?
            .status
            == 200
    );
    m.reload_with(&with_another_authority(m)?).await?;
    let events: Vec<Value> = m
        .decision_lines()?
        .into_iter()
        .filter(|v| v["class_uid"] == 6003)
        .collect();
    ensure!(events.len() == 4, "{events:#?}");
    validate(API_ACTIVITY, &events)?;
    let (create, refused, delete, reload) = (&events[0], &events[1], &events[2], &events[3]);
    ensure!(
        create["activity_id"] == 1
            && create["api"]["operation"] == "create"
            && create["actor"]["user"]["credential_uid"] == token_id(TOKEN)
            && create["src_endpoint"]["ip"] == "127.0.0.1"
            && create["resources"][0]["name"] == "task-1"
            && create["unmapped"]["event"] == "audit",
        "{create:#}"
    );
    ensure!(
        refused["status_id"] == 2 && refused["api"]["response"]["code"] == 400,
        "{refused:#}"
    );
    ensure!(
        delete["activity_id"] == 4
            && delete["actor"]["user"]["uid"].as_str()
                == Some(nix::unistd::getuid().as_raw().to_string().as_str()),
        "{delete:#}"
    );
    ensure!(
        reload["activity_id"] == 3 && reload["src_endpoint"]["name"] == "sighup",
        "{reload:#}"
    );
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(each_change_writes_one_audit_record_naming_who_and_what),
        case!(a_refused_reload_and_a_changed_authority_are_audited),
        case!(a_reload_by_the_file_watch_names_the_watch),
        case!(an_acknowledged_change_survives_kill_9),
        case!(audit_records_are_valid_ocsf_api_activity_events).needs(&[Tool::Jsonschema]),
    ]
}
