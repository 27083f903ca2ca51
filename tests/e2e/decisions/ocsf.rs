//! `[log] format = "ocsf"` (design section 19): every decision and close record as an
//! OCSF 1.5.0 Network Activity event, valid against the published schema
//! (`tests/ocsf/`, checked with Python's `jsonschema`), with the mapping of
//! `docs/control.md` and the native record kept under `unmapped`.

use std::io::Write;

use anyhow::{Result, ensure};
use e2e::case;
use e2e::harness::Case;
use e2e::tool::Tool;
use e2e::{AGENT_A, Fixture, ORIGIN_HOST, agent_a_spec, check_deny};
use serde_json::Value;

use crate::support::mediator;

/// The schema of decision records, as the repository keeps it.
const SCHEMA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/ocsf/network_activity-1.5.0.schema.json"
);

/// The schema of audit records (API Activity, design section 21).
pub(crate) const API_ACTIVITY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/ocsf/api_activity-1.5.0.schema.json"
);

/// Validates each event against the schema file `schema`; returns the first error of
/// each invalid one.
pub(crate) fn validate(schema: &str, events: &[Value]) -> Result<()> {
    let module = Tool::Jsonschema.path("/usr/lib/python3/dist-packages/jsonschema/__init__.py")?;
    ensure!(module.exists());
    let mut child = Tool::Jsonschema
        .std_command("python3")?
        .arg("-c")
        .arg(
            r#"
import json, sys
from jsonschema import Draft202012Validator
v = Draft202012Validator(json.load(open(sys.argv[1])))
bad = 0
for n, line in enumerate(sys.stdin):
    for e in v.iter_errors(json.loads(line)):
        print(f"event {n}: {e.json_path}: {e.message}"); bad += 1
sys.exit(1 if bad else 0)
"#,
        )
        .arg(schema)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    {
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdin"))?;
        for e in events {
            writeln!(stdin, "{e}")?;
        }
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "events not valid against {schema}:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

async fn every_record_is_a_valid_ocsf_network_activity_event() -> Result<()> {
    let fx = Fixture::start(mediator().authority(agent_a_spec()).log_format("ocsf")).await?;
    let m = &fx.mediator;
    // An allow (then its close) over TCP, a denial, and an allow over the Unix socket.
    let ok = fx.connect_a(&fx.origin_target()).await?;
    ensure!(ok.status == 200, "{ok:?}");
    check_deny(
        &fx.connect_a("blocked.test:443").await?,
        403,
        "not_in_allowlist",
    )?;
    drop(ok);
    let mut u = fx.unix_conn(AGENT_A).await?;
    ensure!(u.connect(&fx.origin_target(), None).await?.status == 200);
    drop(u);
    let events = m
        .wait_for_count(|v| v["class_uid"] == 4001, 5, e2e::LOG_TIMEOUT)
        .await?;
    validate(SCHEMA, &events)?;
    let open: Vec<&Value> = events.iter().filter(|e| e["activity_id"] == 1).collect();
    let close: Vec<&Value> = events.iter().filter(|e| e["activity_id"] == 2).collect();
    ensure!(open.len() == 3 && close.len() == 2, "{events:#?}");
    let deny = open
        .iter()
        .find(|e| e["action_id"] == 2)
        .ok_or_else(|| anyhow::anyhow!("no denied event: {events:#?}"))?;
    ensure!(deny["disposition_id"] == 2 && deny["status_detail"] == "not_in_allowlist");
    ensure!(deny["dst_endpoint"]["hostname"] == "blocked.test");
    ensure!(deny["actor"]["app_name"] == AGENT_A, "{deny}");
    ensure!(deny["src_endpoint"]["ip"] == "127.0.0.1", "{deny}");
    ensure!(
        deny["unmapped"]["reason"] == "not_in_allowlist",
        "the native record: {deny}"
    );
    let allow = open
        .iter()
        .find(|e| e["action_id"] == 1 && e["src_endpoint"]["ip"].is_string())
        .ok_or_else(|| anyhow::anyhow!("no allowed TCP event"))?;
    ensure!(allow["dst_endpoint"]["hostname"] == ORIGIN_HOST);
    ensure!(
        allow["dst_endpoint"]["ip"] == "127.0.0.1",
        "the pin: {allow}"
    );
    ensure!(allow["metadata"]["uid"] == allow["unmapped"]["id"].to_string().as_str());
    let unix = open
        .iter()
        .find(|e| e["actor"]["process"]["pid"].is_number())
        .ok_or_else(|| anyhow::anyhow!("no Unix-socket event with the peer's pid"))?;
    ensure!(
        unix["actor"]["process"]["pid"] == std::process::id(),
        "{unix}"
    );
    ensure!(
        close.iter().all(|c| c["traffic"]["bytes"].is_number()),
        "{close:#?}"
    );
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![case!(every_record_is_a_valid_ocsf_network_activity_event).needs(&[Tool::Jsonschema])]
}
