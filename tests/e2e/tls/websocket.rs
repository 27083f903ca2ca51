//! WebSocket and other upgrades through TLS termination (RFC 6455, RFC 8441, RFC 9110
//! section 7.8): the switching request (an HTTP/1.1 upgrade, or an HTTP/2 extended
//! CONNECT judged as the GET it stands for) is judged like any terminated request (its
//! credential added), the switched bytes are relayed both ways, and the switch's close
//! record (`protocol: "tls"`, `upgrade: "<token>"`) counts them; an HTTP/2 WebSocket
//! reaches an HTTP/2 origin by extended CONNECT and an HTTP/1.1 origin translated; an
//! upgrade token other than websocket needs a request rule listing it.

use crate::support::is;
use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use mediator::vocab::{Event, Protocol};
use policy::UpgradeToken;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;

use anyhow::{Result, bail, ensure};
use e2e::mediator::{toml_list, toml_str};
use e2e::tls::TestCa;
use e2e::upgrade::{BYE, UpgradeOrigin, upgrade_through_connect};
use e2e::websocket::{
    DROP, H2Answer, Message, SinkExt as _, StreamExt as _, WebSocketStream, WsFlavor, WsOrigin,
    ws_h2_through_connect, ws_through_connect,
};
use e2e::{AGENT_A, Fixture, TOKEN_A, agent_a_allowing};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::mediator;

const WS: &str = "ws.test";
const SECRET: &str = "ws_e2eSecretValue31c7";
const PLACEHOLDER: &str = "mediator:ws:agent-a";

async fn a_websocket_is_relayed_through_termination_and_its_close_counts_the_bytes() -> Result<()> {
    let s = setup("").await?;
    let origin = WsOrigin::start(&s.test_ca.ca, WS).await?;
    let (fx, ca_pem) = (&s.fx, &s.ca_pem);

    let auth = format!("Bearer {PLACEHOLDER}");
    let ws = ws_through_connect(
        fx.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        (WS, origin.port()),
        "/chat",
        ca_pem,
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
    // Frames both ways; the close handshake completes (the origin's Close comes back,
    // then the end) and the client closes its side.
    exchange_and_close(ws).await?;

    let decision = fx
        .mediator
        .expect_log(
            is(|r| r.event == Event::Decision && r.protocol == Protocol::Tls),
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
            is(|r| r.event == Event::Close && r.protocol == Protocol::Tls),
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
            is(|r| r.event == Event::Close && r.protocol == Protocol::Connect),
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

/// A mediator whose agent-a terminates [`WS`] with the credential of the tests above and
/// `rules` (`[[authority.request_rule]]` tables, as TOML); its CA's PEM path.
struct Setup {
    _dir: tempfile::TempDir,
    test_ca: TestCa,
    fx: Fixture,
    ca_pem: PathBuf,
}

async fn setup(rules: &str) -> Result<Setup> {
    let dir = tempfile::tempdir()?;
    let test_ca = TestCa::create(dir.path())?;
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
        .raw(&format!("placeholder = {}", toml_str(PLACEHOLDER)))
        .raw(rules);
    let builder = mediator()
        .extra_toml(&format!(
            "\n[tls]\nca_dir = {}\nextra_ca_files = {}\n",
            toml_str(&ca_dir.display().to_string()),
            toml_list(&[test_ca.pem_path.display().to_string()])
        ))
        .authority(authority);
    let fx = Fixture::start(builder).await?;
    fx.dns.set(WS, [e2e::LOOPBACK]);
    Ok(Setup {
        ca_pem: ca_dir.join("ca.pem"),
        _dir: dir,
        test_ca,
        fx,
    })
}

/// A WebSocket to `origin`'s `/chat` through the terminating mediator of `s`, one text
/// message sent and its echo read.
async fn chat_echoed_once(s: &Setup, origin: &WsOrigin) -> Result<e2e::websocket::TlsWebSocket> {
    let mut ws = ws_through_connect(
        s.fx.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        (WS, origin.port()),
        "/chat",
        &s.ca_pem,
        &[],
    )
    .await?;
    ws.send(Message::text("hello")).await?;
    ensure!(
        ws.next().await.transpose()? == Some(Message::text("hello")),
        "no echo"
    );
    Ok(ws)
}

/// Sends a 1000-byte text and a 5000-byte binary message, checks both echoes, completes
/// the close handshake and closes.
async fn exchange_and_close<S>(mut ws: WebSocketStream<S>) -> Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
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
    while let Some(msg) = ws.next().await {
        if msg.is_err() {
            break;
        }
    }
    Ok(())
}

/// The switch's close record for the decision `decision`: `upgrade` is `token` and the
/// bytes are those of [`exchange_and_close`] (as in the HTTP/1.1 test above).
async fn expect_exchange_close(fx: &Fixture, decision: &Value, token: &str) -> Result<Value> {
    let close = fx
        .mediator
        .expect_log(
            is(|r| {
                r.event == Event::Close
                    && r.protocol == Protocol::Tls
                    && Some(r.id) == decision["id"].as_u64()
            }),
            &[("upgrade", json!(token))],
        )
        .await?;
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
    Ok(close)
}

fn header<'a>(handshake: &'a [(String, String)], name: &str) -> Option<&'a str> {
    handshake
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// An HTTP/2 client's WebSocket (extended CONNECT, RFC 8441) reaches an HTTP/2 origin
/// that accepts extended CONNECT as one: judged as `GET /chat`, the secret in place of
/// the placeholder, the frames echoed, the close record counting the WebSocket's bytes.
async fn an_h2_websocket_reaches_an_h2_origin_by_extended_connect() -> Result<()> {
    let s = setup("").await?;
    let origin = WsOrigin::start_as(&s.test_ca.ca, WS, WsFlavor::H2).await?;
    let auth = format!("Bearer {PLACEHOLDER}");
    let answer = ws_h2_through_connect(
        s.fx.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        (WS, origin.port()),
        "/chat",
        &s.ca_pem,
        &[("authorization", auth.as_str())],
    )
    .await?;
    let H2Answer::Open(ws) = answer else {
        bail!("{answer:?}");
    };
    let handshake = origin.handshakes().pop().unwrap_or_default();
    ensure!(
        header(&handshake, ":method") == Some("CONNECT")
            && header(&handshake, ":protocol") == Some("websocket")
            && header(&handshake, ":path") == Some("/chat")
            && header(&handshake, "authorization") == Some(&format!("Bearer {SECRET}")),
        "{handshake:?}"
    );
    exchange_and_close(*ws).await?;
    let decision =
        s.fx.mediator
            .expect_log(
                is(|r| r.event == Event::Decision && r.protocol == Protocol::Tls),
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
    expect_exchange_close(&s.fx, &decision, "websocket").await?;
    s.fx.mediator.expect_log_lacks(SECRET)?;
    Ok(())
}

/// An HTTP/2 client's WebSocket to an HTTP/1.1 origin is translated (RFC 8441 section
/// 5): the origin gets `GET` with `Upgrade: websocket` and a fresh `Sec-WebSocket-Key`
/// (whose `Sec-WebSocket-Accept` the mediator checks), the client a `200`.
async fn an_h2_websocket_is_translated_to_an_http1_upgrade_for_an_http1_origin() -> Result<()> {
    let s = setup("").await?;
    let origin = WsOrigin::start(&s.test_ca.ca, WS).await?;
    let auth = format!("Bearer {PLACEHOLDER}");
    let answer = ws_h2_through_connect(
        s.fx.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        (WS, origin.port()),
        "/chat",
        &s.ca_pem,
        &[
            ("authorization", auth.as_str()),
            ("sec-websocket-protocol", "chat"),
        ],
    )
    .await?;
    let H2Answer::Open(ws) = answer else {
        bail!("{answer:?}");
    };
    let handshake = origin.handshakes().pop().unwrap_or_default();
    ensure!(
        header(&handshake, "upgrade") == Some("websocket")
            && header(&handshake, "sec-websocket-version") == Some("13")
            && header(&handshake, "sec-websocket-protocol") == Some("chat")
            && header(&handshake, "sec-websocket-key").is_some_and(|k| k.len() == 24)
            && header(&handshake, "authorization") == Some(&format!("Bearer {SECRET}")),
        "{handshake:?}"
    );
    exchange_and_close(*ws).await?;
    let decision =
        s.fx.mediator
            .expect_log(
                is(|r| r.event == Event::Decision && r.protocol == Protocol::Tls),
                &[("decision", json!("allow")), ("method", json!("GET"))],
            )
            .await?;
    expect_exchange_close(&s.fx, &decision, "websocket").await?;
    Ok(())
}

/// An HTTP/2 origin that does not accept extended CONNECT cannot carry the WebSocket:
/// `502 upstream_failure`, saying why, in the JSON deny shape.
async fn an_h2_origin_without_extended_connect_gets_a_502() -> Result<()> {
    let s = setup("").await?;
    let origin = WsOrigin::start_as(&s.test_ca.ca, WS, WsFlavor::H2WithoutExtendedConnect).await?;
    let answer = ws_h2_through_connect(
        s.fx.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        (WS, origin.port()),
        "/chat",
        &s.ca_pem,
        &[],
    )
    .await?;
    let H2Answer::Refused(status, body) = answer else {
        bail!("{answer:?}");
    };
    ensure!(status == 502, "{status} {body}");
    let body: Value = serde_json::from_str(&body)?;
    ensure!(
        body["error"] == "egress_denied"
            && body["reason"] == "upstream_failure"
            && body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("SETTINGS_ENABLE_CONNECT_PROTOCOL")),
        "{body}"
    );
    s.fx.mediator
        .expect_log(
            is(|r| r.event == Event::Decision && r.protocol == Protocol::Tls),
            &[
                ("decision", json!("deny")),
                ("reason", json!("upstream_failure")),
            ],
        )
        .await?;
    ensure!(origin.handshakes().is_empty(), "{:?}", origin.handshakes());
    Ok(())
}

/// A request rule written for the HTTP/1.1 handshake (`GET /allowed`) means the same for
/// an extended CONNECT: `/allowed` opens, `/chat` gets the same 403 as over HTTP/1.1.
async fn a_request_rule_judges_an_h2_websocket_as_the_h1_one() -> Result<()> {
    let rules = format!(
        "\n[[authority.request_rule]]\nhost = {}\nmethods = [\"GET\"]\npath_prefixes = [\"/allowed\"]",
        toml_str(WS)
    );
    let s = setup(&rules).await?;
    let origin = WsOrigin::start_as(&s.test_ca.ca, WS, WsFlavor::H2).await?;
    let open = |path: &'static str| {
        ws_h2_through_connect(
            s.fx.mediator.tcp_addr(),
            (AGENT_A, TOKEN_A),
            (WS, origin.port()),
            path,
            &s.ca_pem,
            &[],
        )
    };
    let H2Answer::Open(ws) = open("/allowed").await? else {
        bail!("/allowed was refused");
    };
    exchange_and_close(*ws).await?;
    let h2 = open("/chat").await?;
    let H2Answer::Refused(status, h2_body) = h2 else {
        bail!("{h2:?}");
    };
    let url = format!("https://{WS}:{}/chat", origin.port());
    let ca = s.ca_pem.display().to_string();
    let h1 =
        s.fx.mediator
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
                    "Upgrade: websocket",
                    "-H",
                    "Sec-WebSocket-Version: 13",
                    "-H",
                    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                    &url,
                ],
            )
            .await?;
    let h2_body: Value = serde_json::from_str(&h2_body)?;
    let h1_body: Value = serde_json::from_str(&h1.body)?;
    ensure!(status == 403 && h1.http_code == 403, "{status} {h1:?}");
    ensure!(
        h2_body["reason"] == "denied_by_rule" && h2_body == h1_body,
        "h2 {h2_body}\nh1 {h1_body}"
    );
    ensure!(
        h2_body["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("GET /chat on ws.test")),
        "{h2_body}"
    );
    Ok(())
}

/// A WebSocket whose origin drops its TCP connection (no Close frame, no TLS
/// close_notify) ends as a tunnel whose origin closed: `close_reason: "upstream_closed"`.
async fn a_websocket_whose_origin_drops_the_connection_is_upstream_closed() -> Result<()> {
    let s = setup("").await?;
    let origin = WsOrigin::start(&s.test_ca.ca, WS).await?;
    let mut ws = chat_echoed_once(&s, &origin).await?;
    ws.send(Message::text(DROP)).await?;
    // The origin's end is passed on: the stream ends (without a Close frame).
    while let Some(Ok(msg)) = ws.next().await {
        ensure!(!msg.is_text(), "unexpected {msg:?}");
    }
    drop(ws);
    s.fx.mediator
        .expect_log(
            is(|r| r.event == Event::Close && r.protocol == Protocol::Tls),
            &[
                ("upgrade", json!("websocket")),
                ("close_reason", json!("upstream_closed")),
            ],
        )
        .await?;
    Ok(())
}

/// A WebSocket whose client drops its TCP connection (no Close frame, no TLS
/// close_notify) ends as a tunnel whose client closed: `close_reason: "client_closed"`,
/// as the origin's drop is `upstream_closed`.
async fn a_websocket_whose_client_drops_the_connection_is_client_closed() -> Result<()> {
    let s = setup("").await?;
    let origin = WsOrigin::start(&s.test_ca.ca, WS).await?;
    let mut ws = chat_echoed_once(&s, &origin).await?;
    // A message whose echo the client never reads: it meets a closed connection (the
    // client's kernel answers it with a reset).
    ws.send(Message::binary(vec![1u8; 64 * 1024])).await?;
    // Dropped as it is: tungstenite sends no Close frame and tokio-rustls no close_notify
    // when dropped, so the mediator's client leg sees its TCP connection end.
    drop(ws);
    s.fx.mediator
        .expect_log(
            is(|r| {
                r.event == Event::Close
                    && r.protocol == Protocol::Tls
                    && r.upgrade.as_ref().map(UpgradeToken::as_str) == Some("websocket")
            }),
            &[("close_reason", json!("client_closed"))],
        )
        .await?;
    Ok(())
}

/// An upgrade token a request rule lists (`upgrade = ["foo"]`, any case) is relayed like
/// a WebSocket, its close record saying `upgrade: "foo"` and counting the bytes; a token
/// no rule lists is refused with `403 denied_by_rule` and a decision line.
async fn an_upgrade_token_a_rule_lists_is_relayed_and_an_unlisted_one_is_refused() -> Result<()> {
    let rules = format!(
        "\n[[authority.request_rule]]\nhost = {}\nupgrade = [\"foo\"]",
        toml_str(WS)
    );
    let s = setup(&rules).await?;
    let origin = UpgradeOrigin::start(&s.test_ca.ca, WS, "foo").await?;
    let (head, mut tls) = upgrade_through_connect(
        s.fx.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        (WS, origin.port()),
        "/raw",
        &s.ca_pem,
        "Foo",
    )
    .await?;
    ensure!(head.starts_with("HTTP/1.1 101"), "{head}");
    ensure!(head.to_ascii_lowercase().contains("upgrade: foo"), "{head}");
    let sent: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    tls.write_all(&sent).await?;
    let mut back = vec![0u8; sent.len()];
    tls.read_exact(&mut back).await?;
    ensure!(back == sent, "echo differs");
    tls.write_all(BYE).await?;
    // The echo of BYE, then the end the origin's drop became.
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    ensure!(rest == BYE, "{rest:?}");
    drop(tls);
    let upstream_head = origin
        .heads()
        .pop()
        .unwrap_or_default()
        .to_ascii_lowercase();
    ensure!(
        upstream_head.contains("upgrade: foo") && upstream_head.contains("connection: upgrade"),
        "{upstream_head}"
    );
    let decision =
        s.fx.mediator
            .expect_log(
                is(|r| r.event == Event::Decision && r.protocol == Protocol::Tls),
                &[
                    ("decision", json!("allow")),
                    ("rule", json!(format!("request_rule[1] {WS}"))),
                ],
            )
            .await?;
    s.fx.mediator
        .expect_log(
            is(|r| {
                r.event == Event::Close
                    && r.protocol == Protocol::Tls
                    && Some(r.id) == decision["id"].as_u64()
            }),
            &[
                ("upgrade", json!("foo")),
                ("bytes_up", json!(1003)),
                ("bytes_down", json!(1003)),
                ("close_reason", json!("upstream_closed")),
            ],
        )
        .await?;

    let (head, _tls) = upgrade_through_connect(
        s.fx.mediator.tcp_addr(),
        (AGENT_A, TOKEN_A),
        (WS, origin.port()),
        "/raw",
        &s.ca_pem,
        "bar",
    )
    .await?;
    ensure!(head.starts_with("HTTP/1.1 403"), "{head}");
    ensure!(
        head.contains("X-Mediator-Decision: deny; reason=denied_by_rule")
            || head.contains("x-mediator-decision: deny; reason=denied_by_rule"),
        "{head}"
    );
    s.fx.mediator
        .expect_log(
            |v| {
                v["event"] == "decision"
                    && v["decision"] == "deny"
                    && v["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains("with Upgrade: bar"))
            },
            &[("reason", json!("denied_by_rule")), ("path", json!("/raw"))],
        )
        .await?;
    ensure!(origin.heads().len() == 1, "{:?}", origin.heads());
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(a_websocket_is_relayed_through_termination_and_its_close_counts_the_bytes)
            .needs(&[Tool::Curl]),
        case!(an_h2_websocket_reaches_an_h2_origin_by_extended_connect),
        case!(an_h2_websocket_is_translated_to_an_http1_upgrade_for_an_http1_origin),
        case!(an_h2_origin_without_extended_connect_gets_a_502),
        case!(a_request_rule_judges_an_h2_websocket_as_the_h1_one).needs(&[Tool::Curl]),
        case!(a_websocket_whose_origin_drops_the_connection_is_upstream_closed),
        case!(a_websocket_whose_client_drops_the_connection_is_client_closed),
        case!(an_upgrade_token_a_rule_lists_is_relayed_and_an_unlisted_one_is_refused),
    ]
}
