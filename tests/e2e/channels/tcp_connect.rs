//! HTTP CONNECT on the shared TCP listener (design sections 5, 6, 10): an allowed tunnel
//! driven by real curl, the close record's byte counts, credential failures, and the
//! upstream failures (refused -> 502, connect timeout -> 504, NXDOMAIN -> 502).

use crate::support::{is, record};
use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use policy::Verdict;
use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::{
    AGENT_A, CLOSE_FIELDS, Denial, Fixture, LOG_TIMEOUT, ORIGIN_HOST, TOKEN_A, agent_a_spec,
    basic_auth, check_deny, closed_loopback_port, proxy_authorization,
};
use serde_json::{Value, json};

use crate::support::{agent_a, mediator};

async fn curl_proxytunnel_with_credentials_reaches_loopback_origin() -> Result<()> {
    let fx = agent_a().await?;
    let url = format!("http://{}/hello?x=1", fx.origin_target());
    let out = fx
        .mediator
        .curl_via("http", (AGENT_A, TOKEN_A), &["--proxytunnel", &url])
        .await?;
    ensure!(out.exit_code == 0, "curl failed: {out:?}");
    assert_eq!(out.http_connect, 200, "{out:?}");
    assert_eq!(out.http_code, 200, "{out:?}");
    let echo: Value = serde_json::from_str(&out.body)?;
    assert_eq!(echo["method"], "GET");
    assert_eq!(echo["target"], "/hello?x=1");
    assert_eq!(echo["headers"]["host"], json!([fx.origin_target()]));
    assert_eq!(fx.origin.connections(), 1);

    let line = fx.expect_origin_allowed("connect").await?;
    assert!(line["dns_ms"].is_number(), "dns_ms: {line}");
    assert!(line["connect_ms"].is_number(), "connect_ms: {line}");
    assert!(
        line["rule"]
            .as_str()
            .is_some_and(|r| r.contains(ORIGIN_HOST)),
        "rule should name the allow entry: {line}"
    );
    // No secret in the log: neither the token nor its Basic encoding.
    fx.mediator.expect_log_lacks(TOKEN_A)?;
    fx.mediator
        .expect_log_lacks(&basic_auth(AGENT_A, TOKEN_A)["Basic ".len()..])?;

    let close = fx.mediator.wait_for_close(&line["id"]).await?;
    for key in CLOSE_FIELDS {
        assert!(close.get(*key).is_some(), "close line lacks {key}: {close}");
    }
    assert_eq!(close["authority"], AGENT_A, "{close}");
    assert!(close["bytes_up"].as_u64().is_some_and(|b| b > 0), "{close}");
    assert!(
        close["bytes_down"].as_u64().is_some_and(|b| b > 0),
        "{close}"
    );
    Ok(())
}

async fn close_line_counts_exactly_the_tunnelled_bytes() -> Result<()> {
    let fx = agent_a().await?;
    let mut conn = fx.tcp_conn().await?;
    let answer = conn
        .connect(&fx.origin_target(), Some((AGENT_A, TOKEN_A)))
        .await?;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer
            .header("x-mediator-decision")
            .is_none_or(|v| v.starts_with("allow")),
        "{answer:?}"
    );
    let request = format!(
        "POST /count HTTP/1.1\r\nHost: {}\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world",
        fx.origin_target()
    );
    conn.send(request.as_bytes()).await?;
    let response = conn.read_to_end().await?;
    ensure!(
        response.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&response)
    );
    drop(conn);

    let close = fx
        .mediator
        .expect_tunnel_bytes(ORIGIN_HOST, request.len(), response.len())
        .await?;
    assert!(close["duration_ms"].is_number(), "{close}");
    assert!(close["close_reason"].is_string(), "{close}");
    Ok(())
}

async fn connect_without_credential_is_407_bad_credential() -> Result<()> {
    let fx = agent_a().await?;
    let resp = fx.connect(&fx.origin_target(), None).await?;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            407,
            "bad_credential",
            None,
            &[
                ("authority", Value::Null),
                ("channel", json!("tcp")),
                ("pin", Value::Null),
            ],
        )
        .await?;
    assert_eq!(denial.body["authority"], Value::Null, "{}", denial.body);
    assert_eq!(fx.origin.connections(), 0);
    assert_eq!(
        fx.dns.queries(ORIGIN_HOST),
        0,
        "a request without identity must not resolve"
    );
    Ok(())
}

async fn connect_with_wrong_token_is_407_bad_credential() -> Result<()> {
    let fx = agent_a().await?;
    let resp = fx
        .connect(&fx.origin_target(), Some((AGENT_A, "not-the-token")))
        .await?;
    fx.mediator
        .expect_deny(
            &resp,
            407,
            "bad_credential",
            None,
            &[
                ("channel", json!("tcp")),
                // The attempt is attributed to the (real) authority it tried to act as.
                ("authority", json!(AGENT_A)),
            ],
        )
        .await?;
    fx.mediator.expect_log_lacks("not-the-token")?;
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

async fn connect_naming_unknown_authority_is_407_unknown_authority() -> Result<()> {
    let fx = agent_a().await?;
    let resp = fx
        .connect(&fx.origin_target(), Some(("nobody", TOKEN_A)))
        .await?;
    // The client is told only that its credential failed (no authority enumeration);
    // the decision log says which failure, and the name tried.
    let body = check_deny(&resp, 407, "bad_credential")?;
    assert_eq!(body["authority"], Value::Null, "{body}");
    let line = fx
        .mediator
        .expect_decision("unknown_authority", None, &[("authority", Value::Null)])
        .await?;
    assert!(
        line["detail"]
            .as_str()
            .is_some_and(|d| d.contains("\"nobody\"")),
        "{line}"
    );
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

/// A missing credential, an unknown name, a known name without a token and a wrong
/// token get exactly the same answer: a client cannot learn which authorities exist.
async fn every_failed_authentication_gets_the_same_answer() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .authority(agent_a_spec())
            .authority(e2e::AuthoritySpec::new("tokenless").allow(&[ORIGIN_HOST])),
    )
    .await?;
    let target = fx.origin_target();
    let mut answers = Vec::new();
    for auth in [
        None,
        Some(("nobody", TOKEN_A)),
        Some(("tokenless", TOKEN_A)),
        Some((AGENT_A, "wrong-token")),
    ] {
        let resp = fx.connect(&target, auth).await?;
        let body = check_deny(&resp, 407, "bad_credential")?;
        answers.push((resp.header("proxy-authenticate").map(str::to_owned), body));
    }
    for pair in answers.windows(2) {
        assert_eq!(pair[0], pair[1], "answers differ");
    }
    // The log keeps the difference: who was impersonated, and how.
    let lines = fx
        .mediator
        .wait_for_count(is(|r| r.decision == Verdict::Deny), 4, LOG_TIMEOUT)
        .await?;
    let reasons: Vec<(&str, &str)> = lines
        .iter()
        .filter(|v| record(v).decision == Verdict::Deny)
        .map(|v| {
            (
                v["reason"].as_str().unwrap_or(""),
                v["authority"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("bad_credential", "-"),
            ("unknown_authority", "-"),
            ("unknown_authority", "tokenless"),
            ("bad_credential", AGENT_A),
        ]
    );
    Ok(())
}

async fn connect_to_loopback_port_without_listener_is_502_upstream_failure() -> Result<()> {
    let fx = agent_a().await?;
    let port = closed_loopback_port()?;
    let resp = fx.connect_a(&format!("{ORIGIN_HOST}:{port}")).await?;
    let Denial { body, line } = fx
        .mediator
        .expect_deny(
            &resp,
            502,
            "upstream_failure",
            Some(ORIGIN_HOST),
            &[("authority", json!(AGENT_A)), ("port", json!(port))],
        )
        .await?;
    assert_eq!(body["port"], json!(port));
    // The connection was never made: no pin, or the vetted address it tried.
    assert!(
        line["pin"].is_null() || line["pin"] == "127.0.0.1",
        "pin should be null or the vetted loopback address: {line}"
    );
    Ok(())
}

async fn connect_to_unresponsive_loopback_port_is_504_after_connect_timeout() -> Result<()> {
    // A listener with backlog 1 that never accepts: once its accept queue is full the
    // kernel drops further SYNs, so the mediator's connect hangs until its timeout.
    let (listener, held) = e2e::stalled_loopback_listener().await?;
    let addr = listener.local_addr()?;

    let fx = Fixture::start(mediator().authority(agent_a_spec()).connect_timeout_secs(1)).await?;
    let resp = fx
        .connect_a(&format!("{ORIGIN_HOST}:{}", addr.port()))
        .await?;
    fx.mediator
        .expect_deny(&resp, 504, "upstream_failure", Some(ORIGIN_HOST), &[])
        .await?;
    drop(listener);
    drop(held);
    Ok(())
}

async fn connect_to_nxdomain_name_is_502_dns_failure() -> Result<()> {
    let fx = Fixture::start(mediator().authority(agent_a_spec().allow(&["nx.test"]))).await?;
    let resp = fx.connect_a("nx.test:80").await?;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            502,
            "dns_failure",
            Some("nx.test"),
            &[
                ("authority", json!(AGENT_A)),
                ("pin", Value::Null),
                ("port", json!(80)),
            ],
        )
        .await?;
    assert_eq!(denial.body["authority"], AGENT_A);
    assert!(
        fx.dns.queries("nx.test") >= 1,
        "the mediator never asked our DNS server"
    );
    Ok(())
}

/// A client may send its first tunnel bytes in the same write as the CONNECT head (no
/// wait for the 200). Those bytes were read with the head: they must reach the origin
/// first, in order, and count in the close record.
async fn tunnel_bytes_sent_with_the_connect_head_reach_the_origin() -> Result<()> {
    let fx = agent_a().await?;
    let mut conn = fx.tcp_conn().await?;
    let t = fx.origin_target();
    let request = format!(
        "POST /early HTTP/1.1\r\nHost: {t}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nearly"
    );
    let head = format!(
        "CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n{}\r\n",
        proxy_authorization(AGENT_A, TOKEN_A)
    );
    conn.send(format!("{head}{request}").as_bytes()).await?;
    let answer = conn.read_response(true).await?;
    assert_eq!(answer.status, 200, "{answer:?}");
    let response = conn.read_to_end().await?;
    let text = String::from_utf8_lossy(&response);
    ensure!(text.starts_with("HTTP/1.1 200"), "{text}");
    ensure!(text.contains(r#""target":"/early""#), "{text}");
    ensure!(text.contains(r#""body":"early""#), "{text}");
    drop(conn); // the tunnel ends when both sides have closed
    fx.mediator
        .expect_tunnel_bytes(ORIGIN_HOST, request.len(), response.len())
        .await?;
    Ok(())
}

/// A denied CONNECT is answered and the connection stays usable: the next CONNECT on it
/// is decided on its own and can open a tunnel.
async fn a_denied_connect_leaves_the_connection_usable_for_the_next_request() -> Result<()> {
    let fx = agent_a().await?;
    let mut conn = fx.tcp_conn().await?;
    let resp = conn
        .connect("not-granted.example:443", Some((AGENT_A, TOKEN_A)))
        .await?;
    check_deny(&resp, 403, "not_in_allowlist")?;
    let answer = conn
        .connect(&fx.origin_target(), Some((AGENT_A, TOKEN_A)))
        .await?;
    assert_eq!(answer.status, 200, "{answer:?}");
    let inner = conn.get(&fx.origin_target(), "/after-denial", true).await?;
    assert_eq!(inner.status, 200, "{inner:?}");
    assert_eq!(inner.json()?["target"], "/after-denial");
    Ok(())
}

/// Megabytes each way through a tunnel on the TCP channel: the relay moves from copying
/// to splice(2) mid-stream; every byte must arrive, in order, and be counted.
async fn a_bulk_tunnel_keeps_every_byte_and_counts_it() -> Result<()> {
    let fx = agent_a().await?;
    let mut conn = fx.tunnel_a().await?;
    let body: String = (0..4_000_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let request = format!(
        "POST /bulk HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        fx.origin_target(),
        body.len()
    );
    // Write and read at once: the echo comes back while the upload is still going.
    let (mut rd, mut wr) = tokio::io::split(conn.stream());
    let send = async {
        use tokio::io::AsyncWriteExt;
        wr.write_all(request.as_bytes()).await
    };
    let recv = async {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        rd.read_to_end(&mut got).await.map(|_| got)
    };
    let (sent, response) = tokio::join!(send, recv);
    sent?;
    let response = response?;
    drop((rd, wr));
    drop(conn); // the tunnel ends when both sides have closed
    let text = String::from_utf8_lossy(&response);
    let start = text.find("\r\n\r\n").expect("a head") + 4;
    let echo: Value = serde_json::from_str(&text[start..])?;
    ensure!(
        echo["body"].as_str() == Some(body.as_str()),
        "the echoed body differs"
    );
    fx.mediator
        .expect_tunnel_bytes(ORIGIN_HOST, request.len(), response.len())
        .await?;
    Ok(())
}

/// The request-head timeout bounds the whole head, however its bytes are spread: a client
/// that sends its first byte late and the rest slowly is closed when the timeout, counted
/// from the connection, ends (not a fresh timeout after the first byte).
async fn the_request_head_timeout_counts_from_the_connection_not_the_first_byte() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .authority(agent_a_spec())
            .timeout("request_head", 2),
    )
    .await?;
    let mut conn = fx.tcp_conn().await?;
    let opened = std::time::Instant::now();
    // The first byte well inside the timeout; a fresh timeout from it would end at 3.8 s.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    conn.send(b"C").await?;
    // Trickle the rest, one byte per 200 ms, until the mediator closes.
    let rest = format!("ONNECT {} HTTP/1.1\r\nHost: x\r\n", fx.origin_target());
    let mut closed = false;
    for b in rest.bytes() {
        if conn.send(&[b]).await.is_err() || conn.closes_within(Duration::from_millis(200)).await {
            closed = true;
            break;
        }
    }
    let took = opened.elapsed();
    ensure!(closed, "the mediator never closed the trickling connection");
    ensure!(
        took < Duration::from_millis(3000),
        "closed after {took:?}; the head timeout is 2 s from the connection"
    );
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

/// Ends `conn` with a reset (SO_LINGER 0), as many clients end a finished exchange.
fn reset(mut conn: e2e::HttpConn) -> Result<()> {
    if let e2e::http::AnyStream::Tcp(s) = conn.stream().get_ref() {
        socket2::SockRef::from(s).set_linger(Some(Duration::ZERO))?;
    }
    drop(conn);
    Ok(())
}

/// A client that resets its tunnel after it was answered (cargo does, after every fetch)
/// has closed it: the close record says `client_closed`, and names the rule its decision
/// named. A reset while it waits for its answer is still an `error`.
async fn a_clients_reset_after_its_answer_is_client_closed_and_names_the_rule() -> Result<()> {
    let fx = agent_a().await?;
    let mut conn = fx.tunnel_a().await?;
    let answer = conn.get(&fx.origin_target(), "/hello", false).await?;
    ensure!(answer.status == 200, "{answer:?}");
    reset(conn)?;
    let decision = fx.expect_origin_allowed("connect").await?;
    let close = fx.mediator.wait_for_close(&decision["id"]).await?;
    ensure!(close["close_reason"] == "client_closed", "{close}");
    ensure!(
        decision["rule"].is_string() && close["rule"] == decision["rule"],
        "the close names its decision's rule: {decision} {close}"
    );
    // A request whose body never comes: the origin has it (and waits for the body) when
    // the client resets.
    let mut waiting = fx.tunnel_a().await?;
    let head = format!(
        "POST /hello HTTP/1.1\r\nHost: {}\r\nContent-Length: 100\r\n\r\nabc",
        fx.origin_target()
    );
    waiting.send(head.as_bytes()).await?;
    e2e::wait::wait_until(LOG_TIMEOUT, "the origin has the second request", || {
        fx.origin.requests() == 2
    })
    .await?;
    reset(waiting)?;
    let closes = fx
        .mediator
        .wait_for_count(|v| v["event"] == "close", 2, LOG_TIMEOUT)
        .await?;
    let second = closes
        .iter()
        .find(|c| c["id"] != decision["id"])
        .ok_or_else(|| anyhow::anyhow!("{closes:?}"))?;
    ensure!(second["close_reason"] == "error", "{second}");
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(curl_proxytunnel_with_credentials_reaches_loopback_origin).needs(&[Tool::Curl]),
        case!(close_line_counts_exactly_the_tunnelled_bytes),
        case!(connect_without_credential_is_407_bad_credential),
        case!(connect_with_wrong_token_is_407_bad_credential),
        case!(connect_naming_unknown_authority_is_407_unknown_authority),
        case!(every_failed_authentication_gets_the_same_answer),
        case!(connect_to_loopback_port_without_listener_is_502_upstream_failure),
        case!(connect_to_unresponsive_loopback_port_is_504_after_connect_timeout),
        case!(connect_to_nxdomain_name_is_502_dns_failure),
        case!(tunnel_bytes_sent_with_the_connect_head_reach_the_origin),
        case!(a_denied_connect_leaves_the_connection_usable_for_the_next_request),
        case!(a_bulk_tunnel_keeps_every_byte_and_counts_it),
        case!(the_request_head_timeout_counts_from_the_connection_not_the_first_byte),
        case!(a_clients_reset_after_its_answer_is_client_closed_and_names_the_rule),
    ]
}
