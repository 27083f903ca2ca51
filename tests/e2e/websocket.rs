//! WebSocket through TLS termination (RFC 6455, RFC 9110 section 7.8): the upgrade
//! request is judged like any terminated request (its credential added), the upgraded
//! bytes are relayed both ways, and the upgrade's close record (`protocol: "tls"`,
//! `upgrade: "websocket"`) counts them; any other upgrade token is refused.

use std::os::unix::fs::PermissionsExt as _;

use anyhow::{Result, ensure};
use e2e::mediator::{toml_list, toml_str};
use e2e::tls::TestCa;
use e2e::websocket::{Message, SinkExt as _, StreamExt as _, WsOrigin, ws_through_connect};
use e2e::{AGENT_A, Fixture, TOKEN_A, agent_a_allowing};
use serde_json::json;

use crate::support::mediator;

const WS: &str = "ws.test";
const SECRET: &str = "ws_e2eSecretValue31c7";
const PLACEHOLDER: &str = "mediator:ws:agent-a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_is_relayed_through_termination_and_its_close_counts_the_bytes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let test_ca = TestCa::create(dir.path())?;
    let origin = WsOrigin::start(&test_ca.ca, WS).await?;
    let secret = dir.path().join("ws-token");
    std::fs::write(&secret, SECRET)?;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600))?;
    let ca_dir = dir.path().join("mediator-ca");
    let authority = agent_a_allowing(&[WS])
        .raw(&format!("tls_terminate = {}", toml_list(&[WS])))
        .raw("\n[[authority.credential]]")
        .raw(&format!("host = {}", toml_str(WS)))
        .raw("header = \"Authorization\"")
        .raw(&format!(
            "secret_file = {}",
            toml_str(&secret.display().to_string())
        ))
        .raw("format = \"Bearer {secret}\"")
        .raw(&format!("placeholder = {}", toml_str(PLACEHOLDER)));
    let builder = mediator()
        .extra_toml(&format!(
            "\n[tls]\nca_dir = {}\nextra_ca_files = {}\n",
            toml_str(&ca_dir.display().to_string()),
            toml_list(&[test_ca.pem_path.display().to_string()])
        ))
        .authority(authority);
    let fx = Fixture::start(builder).await?;
    fx.dns.set(WS, [e2e::LOOPBACK]);
    let ca_pem = ca_dir.join("ca.pem");

    let auth = format!("Bearer {PLACEHOLDER}");
    let mut ws = ws_through_connect(
        fx.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        (WS, origin.port()),
        "/chat",
        &ca_pem,
        &[("authorization", auth.as_str())],
    )
    .await?;
    // The opening handshake reached the origin with the secret in place of the placeholder.
    let handshake = origin.handshakes().pop().unwrap_or_default();
    ensure!(
        handshake
            .iter()
            .any(|(k, v)| k == "authorization" && *v == format!("Bearer {SECRET}")),
        "{handshake:?}"
    );
    let text = "x".repeat(1000);
    let binary = vec![7u8; 5000];
    ws.send(Message::text(text.clone())).await?;
    ws.send(Message::binary(binary.clone())).await?;
    let first = ws.next().await.transpose()?;
    let second = ws.next().await.transpose()?;
    ensure!(
        first == Some(Message::text(text)) && second == Some(Message::binary(binary)),
        "echoed: {first:?} {second:?}"
    );
    ws.close(None).await?;
    // The close handshake completes: the origin's Close comes back, then the end.
    while let Some(msg) = ws.next().await {
        if msg.is_err() {
            break;
        }
    }

    let decision = fx
        .mediator
        .expect_log(
            |v| v["event"] == "decision" && v["protocol"] == "tls",
            &[
                ("decision", json!("allow")),
                ("method", json!("GET")),
                ("path", json!("/chat")),
                (
                    "credential",
                    json!([{"header": "authorization", "host": WS}]),
                ),
            ],
        )
        .await?;
    let close = fx
        .mediator
        .expect_log(
            |v| v["event"] == "close" && v["protocol"] == "tls",
            &[
                ("upgrade", json!("websocket")),
                ("id", decision["id"].clone()),
            ],
        )
        .await?;
    // Client frames are masked (4 bytes more each): 1000 + 4 (16-bit length) + 4 mask,
    // 5000 + 4 + 4, and a masked Close; the origin's echoes are unmasked.
    let up = close["bytes_up"].as_u64().unwrap_or_default();
    let down = close["bytes_down"].as_u64().unwrap_or_default();
    ensure!(
        (1008 + 5008..1008 + 5008 + 16).contains(&up),
        "bytes_up {up}: {close}"
    );
    ensure!(
        (1004 + 5004..1004 + 5004 + 16).contains(&down),
        "bytes_down {down}: {close}"
    );
    ensure!(close["close_reason"].is_string(), "{close}");
    // The tunnel's own close record follows.
    fx.mediator
        .expect_log(
            |v| v["event"] == "close" && v["protocol"] == "connect",
            &[("host", json!(WS))],
        )
        .await?;
    fx.mediator.expect_log_lacks(SECRET)?;

    // Any other upgrade token is refused inside the tunnel, with the JSON denial.
    let url = format!("https://{WS}:{}/x", origin.port());
    let ca = ca_pem.display().to_string();
    let out = fx
        .mediator
        .curl_via(
            "http",
            (AGENT_A, TOKEN_A),
            &[
                "--cacert",
                &ca,
                "--http1.1",
                "-H",
                "Connection: Upgrade",
                "-H",
                "Upgrade: h2c",
                &url,
            ],
        )
        .await?;
    ensure!(out.http_code == 403, "{out:?}");
    ensure!(
        out.body.contains("\"reason\":\"denied_by_rule\""),
        "{out:?}"
    );
    ensure!(
        out.body
            .contains("Upgrade: h2c is not relayed through TLS termination"),
        "{out:?}"
    );
    Ok(())
}
