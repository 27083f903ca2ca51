//! `[telemetry] otlp_endpoint` (design section 19): decision records also go out as
//! OTLP/HTTP log records (protobuf), checked by a receiver in the test that decodes what
//! it gets; with the receiver down, decisions go on as before and what could not be sent
//! is counted (`mediator_export_dropped_total`); audit records go out the same way.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::case;
use e2e::harness::Case;
use e2e::{Fixture, agent_a_spec, check_deny, closed_loopback_port};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::mediator;

/// One log record as received: its body and string attributes.
#[derive(Debug, Clone)]
struct Received {
    body: String,
    attributes: BTreeMap<String, String>,
    severity: i32,
}

/// An OTLP/HTTP receiver on loopback: answers 200 to each `POST`, keeps what it decoded.
async fn receiver() -> Result<(std::net::SocketAddr, Arc<Mutex<Vec<Received>>>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&got);
    tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let keep = Arc::clone(&keep);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let head_end = loop {
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                    let mut chunk = [0u8; 4096];
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < head_end + len {
                    let mut chunk = [0u8; 65536];
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let ok = head.starts_with("post /v1/logs ")
                    && head.contains("content-type: application/x-protobuf");
                if let (true, Ok(req)) = (
                    ok,
                    ExportLogsServiceRequest::decode(&buf[head_end..head_end + len]),
                ) {
                    let mut keep = keep.lock().unwrap();
                    for rl in req.resource_logs {
                        for sl in rl.scope_logs {
                            for r in sl.log_records {
                                let text = |v: Option<any_value::Value>| match v {
                                    Some(any_value::Value::StringValue(s)) => s,
                                    _ => String::new(),
                                };
                                keep.push(Received {
                                    body: text(r.body.and_then(|b| b.value)),
                                    attributes: r
                                        .attributes
                                        .into_iter()
                                        .map(|kv| (kv.key, text(kv.value.and_then(|v| v.value))))
                                        .collect(),
                                    severity: r.severity_number,
                                });
                            }
                        }
                    }
                }
                let status = if ok { "200 OK" } else { "400 Bad Request" };
                let _ = c
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    Ok((addr, got))
}

fn telemetry(endpoint: &str) -> String {
    format!("\n[telemetry]\notlp_endpoint = \"{endpoint}\"\n")
}

async fn decision_records_reach_an_otlp_receiver() -> Result<()> {
    let (addr, got) = receiver().await?;
    let fx = Fixture::start(
        mediator()
            .authority(agent_a_spec())
            .admin(true)
            .extra_toml(&telemetry(&format!("http://{addr}"))),
    )
    .await?;
    let ok = fx.connect_a(&fx.origin_target()).await?;
    ensure!(ok.status == 200);
    drop(ok);
    check_deny(
        &fx.connect_a("blocked.test:443").await?,
        403,
        "not_in_allowlist",
    )?;
    // Batches leave at most a second after their first record.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let records = loop {
        let r = got.lock().unwrap().clone();
        if r.len() >= 3 {
            break r;
        }
        ensure!(std::time::Instant::now() < deadline, "received only {r:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let deny = records
        .iter()
        .find(|r| r.attributes.get("reason").map(String::as_str) == Some("not_in_allowlist"))
        .ok_or_else(|| anyhow::anyhow!("no denial in {records:#?}"))?;
    ensure!(deny.attributes["decision"] == "deny" && deny.attributes["host"] == "blocked.test");
    ensure!(deny.severity == 13, "WARN for a denial: {deny:?}");
    let native: Value = serde_json::from_str(&deny.body)?;
    ensure!(
        native["reason"] == "not_in_allowlist" && native["run"].is_string(),
        "{native}"
    );
    ensure!(
        records.iter().any(|r| r.attributes["event"] == "close"),
        "{records:#?}"
    );
    let m = fx.mediator.metrics().await?;
    ensure!(m.get("mediator_export_sent_total", &[]) >= 3.0);
    ensure!(m.get("mediator_export_dropped_total", &[]) == 0.0);
    Ok(())
}

/// Audit records (design section 21) go out as decisions do: event `audit`, WARN when
/// they widen a reach.
async fn audit_records_reach_an_otlp_receiver() -> Result<()> {
    let (addr, got) = receiver().await?;
    let fx = Fixture::start(
        mediator()
            .authority(agent_a_spec())
            .admin(true)
            .extra_toml(&telemetry(&format!("http://{addr}"))),
    )
    .await?;
    let body = serde_json::json!({"name": "task-1", "allow": ["x.test"]}).to_string();
    let resp = fx
        .mediator
        .admin("POST", "/v1/authorities", Some(&body), None)
        .await?;
    ensure!(resp.status == 201, "{}", resp.text());
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let audit = loop {
        let r = got.lock().unwrap().clone();
        if let Some(a) = r.into_iter().find(|r| r.attributes["event"] == "audit") {
            break a;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no audit record received"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(
        audit.attributes["action"] == "create"
            && audit.attributes["result"] == "accepted"
            && audit.attributes["authority"] == "task-1"
            && audit.severity == 13,
        "WARN for a widening: {audit:?}"
    );
    let native: Value = serde_json::from_str(&audit.body)?;
    ensure!(native["changes"][0]["reach"] == "widened", "{native}");
    Ok(())
}

async fn a_receiver_that_is_down_delays_nothing_and_drops_are_counted() -> Result<()> {
    let port = closed_loopback_port()?;
    let fx = Fixture::start(
        mediator()
            .authority(agent_a_spec())
            .admin(true)
            .extra_toml(&telemetry(&format!("http://127.0.0.1:{port}"))),
    )
    .await?;
    for _ in 0..3 {
        check_deny(
            &fx.connect_a("blocked.test:443").await?,
            403,
            "not_in_allowlist",
        )?;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let m = fx.mediator.metrics().await?;
        if m.get("mediator_export_dropped_total", &[]) >= 3.0 {
            ensure!(m.get("mediator_export_sent_total", &[]) == 0.0);
            break;
        }
        ensure!(std::time::Instant::now() < deadline, "no drop counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The decision log has every line all the same.
    let lines = fx
        .mediator
        .wait_for_count(|v| v["reason"] == "not_in_allowlist", 3, e2e::LOG_TIMEOUT)
        .await?;
    ensure!(lines.len() == 3);
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(decision_records_reach_an_otlp_receiver),
        case!(audit_records_reach_an_otlp_receiver),
        case!(a_receiver_that_is_down_delays_nothing_and_drops_are_counted),
    ]
}
