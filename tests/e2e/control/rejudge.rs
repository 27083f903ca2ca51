//! Reloads without collateral damage (design section 5): the live connections of an
//! authority a reload changes are judged again under the new grant; those still allowed
//! continue under the new generation (one decision line each), the others are cut when
//! the grace ends, and a cut reaches the client as a reset, never as the origin's end of
//! a complete transfer.

use crate::support::is;
use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use mediator::vocab::{Event, Protocol};
use policy::Reason;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::{AGENT_A, Fixture, ORIGIN_HOST, TOKEN_A, agent_a_allowing, agent_a_spec};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::support::mediator;

/// A grace short enough for a test to wait it out, watched through the control log.
const GRACE_SECS: u64 = 1;

/// How long a test waits for a log line.
const LOG_TIMEOUT: Duration = Duration::from_secs(10);

/// A loopback origin that answers its first request with a close-delimited body (no
/// length: only the connection's end ends it), sends 1000 bytes of it, says so through
/// the receiver, and then holds the connection open. A client that sees a clean end of
/// this connection cannot tell it from a complete transfer.
async fn holding_origin() -> Result<(SocketAddr, oneshot::Receiver<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (sent, rx) = oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut conn, _)) = listener.accept().await else {
            return;
        };
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let mut answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_vec();
        answer.extend_from_slice(&[b'x'; 1000]);
        if conn.write_all(&answer).await.is_ok() {
            let _ = sent.send(());
        }
        // Held until the mediator ends the connection (a read then returns).
        let _ = conn.read(&mut buf).await;
    });
    Ok((addr, rx))
}

/// The `open_connections` of `name` in `GET /v1/authorities`, and its generation.
async fn open_of(fx: &Fixture, name: &str) -> Result<(u64, u64)> {
    let list = fx.mediator.admin_get("/v1/authorities").await?;
    let entry = list["authorities"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["name"] == name))
        .with_context(|| format!("{name} not listed: {list}"))?;
    Ok((
        entry["limits"]["open_connections"]
            .as_u64()
            .with_context(|| format!("no open_connections: {entry}"))?,
        entry["generation"]
            .as_u64()
            .with_context(|| format!("no generation: {entry}"))?,
    ))
}

fn rejudged(line: &Value, decision: &str) -> bool {
    line["event"] == "decision"
        && line["decision"] == decision
        && line["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("judged again after a reload"))
}

async fn a_reload_that_widens_a_grant_keeps_its_live_connections_under_the_new_generation()
-> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .timeout("revoke_grace", GRACE_SECS)
            .authority(agent_a_spec()),
    )
    .await?;
    let m = &fx.mediator;
    let origin = fx.origin_target();
    // A tunnel on the Unix channel, one on the TCP listener, and a keep-alive forwarding
    // connection on the Unix channel.
    let mut unix = fx.unix_conn(AGENT_A).await?;
    assert_eq!(unix.connect(&origin, None).await?.status, 200);
    let mut tcp = fx.tcp_conn().await?;
    assert_eq!(
        tcp.connect(&origin, Some((AGENT_A, TOKEN_A))).await?.status,
        200
    );
    let mut forward = fx.unix_conn(AGENT_A).await?;
    let url = format!("http://{origin}/before");
    let request = |url: &str| format!("GET {url} HTTP/1.1\r\nHost: {ORIGIN_HOST}\r\n\r\n");
    assert_eq!(forward.request(request(&url).as_bytes()).await?.status, 200);
    let (open_before, generation_before) = open_of(&fx, AGENT_A).await?;
    ensure!(open_before >= 3, "three connections counted: {open_before}");

    // The reload only adds a host.
    let v2 = mediator()
        .admin(true)
        .timeout("revoke_grace", GRACE_SECS)
        .nameserver(fx.dns.addr())
        .authority(agent_a_allowing(&[ORIGIN_HOST, "extra.test"]))
        .render(m.dir());
    let line = m.reload_with(&v2).await?;
    ensure!(line.contains(&format!("changed={AGENT_A}@")), "{line}");
    // Each open connection to the origin is judged again: still allowed.
    let still = m
        .wait_for_count(|l| rejudged(l, "allow"), 3, LOG_TIMEOUT)
        .await
        .context("three connections judged again")?;
    for l in &still {
        ensure!(l["authority"] == AGENT_A && l["host"] == ORIGIN_HOST, "{l}");
        ensure!(l["reason"] == "allowed" && l["pin"].is_string(), "{l}");
    }
    ensure!(
        !m.decisions()?.iter().any(|l| rejudged(l, "deny")),
        "nothing judged no longer allowed"
    );
    // What the operator is told: the connections are judged again, not all ending.
    ensure!(
        m.stderr_text()
            .contains("live connections are judged again under the new grant"),
        "{}",
        m.stderr_text()
    );
    // The old generation's grace ends ...
    m.wait_for_stderr(
        |l| {
            l.contains("revoke grace over; those no longer allowed are cut")
                && l.contains(&format!("generation {generation_before}"))
        },
        Duration::from_secs(10),
    )
    .await?;
    // ... and every connection still carries requests, now counted under the new one.
    assert_eq!(unix.get(ORIGIN_HOST, "/after", false).await?.status, 200);
    assert_eq!(tcp.get(ORIGIN_HOST, "/after", false).await?.status, 200);
    let url = format!("http://{origin}/after");
    assert_eq!(forward.request(request(&url).as_bytes()).await?.status, 200);
    let (open_after, generation_after) = open_of(&fx, AGENT_A).await?;
    ensure!(generation_after > generation_before);
    assert_eq!(
        open_after, open_before,
        "the slots moved to the new generation"
    );
    ensure!(
        !m.decisions()?.iter().any(is(
            |r| r.event == Event::Close && r.authority.as_deref() == Some(AGENT_A)
        )),
        "no connection closed"
    );
    Ok(())
}

async fn a_reload_that_narrows_a_grant_cuts_its_tunnels_after_the_grace_and_curl_sees_a_reset()
-> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .timeout("revoke_grace", GRACE_SECS)
            .authority(agent_a_spec()),
    )
    .await?;
    let m = &fx.mediator;
    let (origin, sent) = holding_origin().await?;
    let url = format!("http://{ORIGIN_HOST}:{}/download", origin.port());
    // curl through a CONNECT tunnel (-p) on the TCP listener: a download whose body only
    // the connection's end ends.
    let args = ["-p", "-o", "/dev/null", &url];
    let download = m.curl_via("http", (AGENT_A, TOKEN_A), &args);
    let narrow = async {
        sent.await.context("the origin sent the first part")?;
        let v2 = mediator()
            .admin(true)
            .timeout("revoke_grace", GRACE_SECS)
            .nameserver(fx.dns.addr())
            .authority(agent_a_allowing(&["other.test"]))
            .render(m.dir());
        let line = m.reload_with(&v2).await?;
        ensure!(line.contains(&format!("changed={AGENT_A}@")), "{line}");
        anyhow::Ok(())
    };
    let (out, narrowed) = tokio::join!(download, narrow);
    narrowed?;
    let out = out?;
    // The tunnel was judged again, found no longer allowed, and cut after the grace: a
    // reset, so curl fails (56: receive failure) rather than exiting 0 with 1000 bytes.
    let line = m.wait_for_log(|l| rejudged(l, "deny"), LOG_TIMEOUT).await?;
    ensure!(line["reason"] == "not_in_allowlist", "{line}");
    ensure!(
        line["detail"]
            .as_str()
            .is_some_and(|d| d.contains("cut when generation")),
        "{line}"
    );
    ensure!(out.http_connect == 200, "{out:?}");
    ensure!(
        out.exit_code == 56,
        "curl must see the cut as an error (56), not a complete transfer: {out:?}"
    );
    ensure!(
        out.stderr.to_lowercase().contains("reset"),
        "a reset: {}",
        out.stderr
    );
    let close = m
        .wait_for_log(
            is(|r| r.event == Event::Close && r.protocol == Protocol::Connect),
            LOG_TIMEOUT,
        )
        .await?;
    ensure!(close["close_reason"] == "revoked", "{close}");
    Ok(())
}

/// A reload that re-creates an authority never leaves a moment in which its credential
/// names no authority: TCP requests sent while reloads run are all allowed (the old entry
/// stays live until the new one takes its place in one step).
async fn requests_during_reloads_never_meet_a_missing_authority() -> Result<()> {
    let fx = std::sync::Arc::new(
        Fixture::start(
            mediator()
                .admin(true)
                .timeout("revoke_grace", GRACE_SECS)
                .authority(agent_a_spec()),
        )
        .await?,
    );
    let m = &fx.mediator;
    let origin = fx.origin_target();
    let narrow = std::fs::read_to_string(m.config_path())?;
    let wide = mediator()
        .admin(true)
        .timeout("revoke_grace", GRACE_SECS)
        .nameserver(fx.dns.addr())
        .authority(agent_a_allowing(&[ORIGIN_HOST, "extra.test"]))
        .render(m.dir());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..3 {
        let (fx, origin, stop) = (fx.clone(), origin.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                answers.push(fx.connect_a(&origin).await.map(|r| r.status));
            }
            answers
        }));
    }
    // Widening and back, again and again: nothing should ever be refused.
    for i in 0..20 {
        let text = if i % 2 == 0 { &wide } else { &narrow };
        m.reload_with(text).await?;
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let mut sent = 0;
    for c in clients {
        for answer in c.await? {
            sent += 1;
            let status = answer.context("a request during the reloads failed")?;
            ensure!(status == 200, "a request during the reloads got {status}");
        }
    }
    ensure!(
        sent >= 20,
        "only {sent} requests were sent during the reloads"
    );
    let missing: Vec<Value> = m
        .decisions()?
        .into_iter()
        .filter(is(|r| r.reason == Reason::UnknownAuthority))
        .collect();
    ensure!(missing.is_empty(), "{missing:?}");
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(a_reload_that_widens_a_grant_keeps_its_live_connections_under_the_new_generation),
        case!(a_reload_that_narrows_a_grant_cuts_its_tunnels_after_the_grace_and_curl_sees_a_reset)
            .needs(&[Tool::Curl]),
        case!(requests_during_reloads_never_meet_a_missing_authority).threads(4),
    ]
}
