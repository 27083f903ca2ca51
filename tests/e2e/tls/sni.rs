//! The SNI check on tunnels to port 443 (design section 6): the TLS ClientHello's SNI must
//! equal the CONNECT host. Domain fronting (CONNECT to an allowed host with the SNI of
//! another) is refused with `sni_mismatch` before a single byte reaches the origin;
//! a matching SNI passes; non-TLS bytes on 443 are refused as an unreadable ClientHello.
//!
//! The "origin" is a plain TCP listener on 127.66.0.N:443 (the whole of 127.0.0.0/8 is
//! loopback) that records what each connection sent; it does not speak TLS, so curl's
//! handshake fails after the mediator's verdict, which is all these tests need.

use crate::support::is;
use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use mediator::vocab::{CloseReason, Event};
use policy::Reason;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::tls::client_hello;
use e2e::{
    AGENT_A, CurlOutput, Fixture, HttpConn, MediatorBuilder, TOKEN_A, agent_a_allowing, wait_for,
};
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::support::mediator;

const FRONT: &str = "front.test";

/// What a recording origin saw: the bytes of each connection, in the order they ended.
type Recorded = Arc<Mutex<Vec<Vec<u8>>>>;

/// Each test has an origin address of its own, so tests running in parallel never
/// compete for port 443.
fn origin_ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 66, 0, n))
}

/// Listens on `ip`:`port` (0: any free port) and records the bytes of each connection
/// (until EOF or 3 s); returns the record and the bound port.
async fn recording_origin(ip: IpAddr, port: u16) -> Result<(Recorded, u16)> {
    let listener = tokio::net::TcpListener::bind((ip, port))
        .await
        .with_context(|| format!("binding {ip}:{port} (port 443 needs root)"))?;
    let port = listener.local_addr()?.port();
    let seen = Recorded::default();
    let rec = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let rec = Arc::clone(&rec);
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
                while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                    if got.len() > 16 * 1024 {
                        break;
                    }
                }
                rec.lock().unwrap_or_else(PoisonError::into_inner).push(got);
            });
        }
    });
    Ok((seen, port))
}

/// The bytes of the first connection the recording origin saw end (waits up to 8 s; the
/// origin itself records after EOF or 3 s).
async fn first_recorded(seen: &Mutex<Vec<Vec<u8>>>) -> Result<Vec<u8>> {
    wait_for(
        Duration::from_secs(8),
        || {
            let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
            Ok(seen.first().cloned())
        },
        || "origin never saw the connection end".to_owned(),
    )
    .await
}

/// `agent-a` may reach only `front.test:<port>`, which resolves to `ip`.
async fn fixture(ip: IpAddr, port: u16) -> Result<Fixture> {
    fixture_with(ip, port, mediator()).await
}

/// [`fixture`] on the configuration `builder` (timeouts, admin) starts from.
async fn fixture_with(ip: IpAddr, port: u16, builder: MediatorBuilder) -> Result<Fixture> {
    let grant = agent_a_allowing(&[format!("{FRONT}:{port}")]);
    let fx = Fixture::start(builder.authority(grant)).await?;
    fx.dns.set(FRONT, [ip]);
    Ok(fx)
}

/// A CONNECT tunnel to `front.test:<port>` on the TCP listener as `agent-a`, answered 200.
async fn tunnel(fx: &Fixture, port: u16) -> Result<HttpConn> {
    let mut conn = fx.tcp_conn().await?;
    let answer = conn
        .connect(&format!("{FRONT}:{port}"), Some((AGENT_A, TOKEN_A)))
        .await?;
    ensure!(answer.status == 200, "{answer:?}");
    Ok(conn)
}

/// The tunnel `conn` was refused as `sni_mismatch` with a detail containing `detail`,
/// reset (the client has seen its 200 and must not take the end for the origin's), and
/// the origin that recorded `seen` received not one byte.
async fn refused(fx: &Fixture, mut conn: HttpConn, seen: &Recorded, detail: &str) -> Result<()> {
    let line = fx
        .mediator
        .wait_for_decision("sni_mismatch", Some(FRONT))
        .await?;
    let said = line["detail"].as_str().unwrap_or_default();
    ensure!(said.contains(detail), "{said}");
    ensure!(
        conn.resets_within(Duration::from_secs(5)).await,
        "the tunnel is not reset"
    );
    let first = first_recorded(seen).await?;
    ensure!(first.is_empty(), "origin received {} bytes", first.len());
    Ok(())
}

/// curl through the mediator as `agent-a`, not verifying the (non-TLS) origin and giving
/// up after 5 s, with `args` (the URL last).
async fn curl_tls(fx: &Fixture, args: &[&str]) -> Result<CurlOutput> {
    let mut all = vec!["--insecure", "--max-time", "5"];
    all.extend_from_slice(args);
    fx.mediator.curl_via("http", (AGENT_A, TOKEN_A), &all).await
}

async fn domain_fronting_with_another_sni_is_refused_before_the_origin_sees_a_byte() -> Result<()> {
    let ip = origin_ip(1);
    let (seen, _) = recording_origin(ip, 443).await?;
    let fx = fixture(ip, 443).await?;
    // CONNECT front.test:443 (allowed), then a ClientHello naming evil.test.
    let out = curl_tls(
        &fx,
        &[
            "--connect-to",
            "evil.test:443:front.test:443",
            "https://evil.test/",
        ],
    )
    .await?;
    out.expect_cut_after_connect()?;
    let line = fx
        .mediator
        .expect_decision(
            "sni_mismatch",
            Some(FRONT),
            &[
                ("decision", json!("deny")),
                ("authority", json!(AGENT_A)),
                ("protocol", json!("connect")),
                ("port", json!(443)),
            ],
        )
        .await?;
    let detail = line["detail"].as_str().unwrap_or_default();
    ensure!(
        detail.contains("evil.test"),
        "detail names the SNI: {detail}"
    );
    let close = fx
        .mediator
        .wait_for_log(
            is(|r| r.event == Event::Close && r.close_reason == Some(CloseReason::SniMismatch)),
            Duration::from_secs(5),
        )
        .await?;
    assert_eq!(close["bytes_up"], 0);
    assert_eq!(close["decision"], "deny", "{close}");
    assert_eq!(close["reason"], "sni_mismatch", "{close}");
    // The origin got a connection (the mediator connects before answering 200) but
    // not one byte of the fronted ClientHello.
    let first = first_recorded(&seen).await?;
    assert!(first.is_empty(), "origin received {} bytes", first.len());
    Ok(())
}

async fn matching_sni_passes_and_the_hello_reaches_the_origin_unchanged() -> Result<()> {
    let ip = origin_ip(2);
    let (seen, _) = recording_origin(ip, 443).await?;
    let fx = fixture(ip, 443).await?;
    let out = curl_tls(&fx, &["https://front.test/"]).await?;
    ensure!(out.http_connect == 200, "{out:?}");
    let hello = first_recorded(&seen).await?;
    ensure!(
        hello.first() == Some(&0x16),
        "a TLS handshake record arrived: {hello:02x?}"
    );
    ensure!(
        hello.windows(FRONT.len()).any(|w| w == FRONT.as_bytes()),
        "the ClientHello names front.test"
    );
    let decisions = fx.mediator.decisions()?;
    ensure!(
        !decisions.iter().any(|d| d["reason"] == "sni_mismatch"),
        "no sni_mismatch: {decisions:?}"
    );
    Ok(())
}

async fn non_tls_bytes_in_a_443_tunnel_are_refused_as_an_unreadable_hello() -> Result<()> {
    let ip = origin_ip(3);
    let (seen, _) = recording_origin(ip, 443).await?;
    let fx = fixture(ip, 443).await?;
    let mut conn = tunnel(&fx, 443).await?;
    // Plaintext HTTP with a fronted Host, to the allowed host's address on 443.
    conn.send(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
        .await?;
    refused(&fx, conn, &seen, "TLS ClientHello").await
}

async fn domain_fronting_on_another_port_is_refused_too() -> Result<()> {
    // The SNI rule holds for every tunnel that starts with a TLS handshake, not just 443.
    let ip = origin_ip(4);
    let (seen, port) = recording_origin(ip, 0).await?;
    let fx = fixture(ip, port).await?;
    let connect_to = format!("evil.test:443:front.test:{port}");
    let out = curl_tls(&fx, &["--connect-to", &connect_to, "https://evil.test/"]).await?;
    out.expect_cut_after_connect()?;
    let line = fx
        .mediator
        .wait_for_decision("sni_mismatch", Some(FRONT))
        .await?;
    assert_eq!(line["port"], port);
    let first = first_recorded(&seen).await?;
    assert!(first.is_empty(), "origin received {} bytes", first.len());
    Ok(())
}

async fn a_server_that_speaks_first_is_not_held_up_on_other_ports() -> Result<()> {
    // SSH-like: the server sends a banner and waits; the mediator must not wait for the
    // client's first bytes before relaying.
    let ip = origin_ip(5);
    let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = tokio::io::AsyncWriteExt::write_all(&mut s, b"SSH-2.0-test\r\n").await;
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf).await;
        }
    });
    let fx = fixture(ip, port).await?;
    let mut conn = tunnel(&fx, port).await?;
    let mut banner = [0u8; 14];
    tokio::time::timeout(
        Duration::from_secs(3),
        conn.stream().read_exact(&mut banner),
    )
    .await
    .context("the banner did not arrive before the request-head timeout")??;
    assert_eq!(&banner, b"SSH-2.0-test\r\n");
    Ok(())
}

/// Off 443, a client-first stream whose first byte is 0x16 but that is not a TLS record
/// (no 0x03 version after it) is an opaque tunnel, not an unreadable ClientHello.
async fn a_binary_stream_starting_with_0x16_passes_off_443() -> Result<()> {
    let ip = origin_ip(5);
    let (seen, port) = recording_origin(ip, 0).await?;
    let fx = fixture(ip, port).await?;
    let mut conn = tunnel(&fx, port).await?;
    let payload = b"\x16\x42binary protocol, not TLS";
    conn.send(payload).await?;
    conn.shutdown_write().await?;
    let first = first_recorded(&seen).await?;
    assert_eq!(first.as_slice(), payload.as_slice());
    let decisions = fx.mediator.decisions()?;
    assert!(
        !decisions
            .iter()
            .any(is(|r| r.reason == Reason::SniMismatch)),
        "{decisions:?}"
    );
    Ok(())
}

/// A ClientHello longer than the tunnel's first read (off 443, where the gate only holds
/// a stream that starts like TLS) is read whole: the SNI is checked on all of it.
const LONG_HELLO: usize = 2048;

async fn a_long_hello_naming_another_host_off_443_is_refused() -> Result<()> {
    let ip = origin_ip(6);
    let (seen, port) = recording_origin(ip, 0).await?;
    let fx = fixture(ip, port).await?;
    let mut conn = tunnel(&fx, port).await?;
    conn.send(&client_hello("evil.test", LONG_HELLO)?).await?;
    refused(&fx, conn, &seen, "evil.test").await
}

async fn a_long_matching_hello_off_443_reaches_the_origin_byte_for_byte() -> Result<()> {
    let ip = origin_ip(7);
    let (seen, port) = recording_origin(ip, 0).await?;
    let fx = fixture(ip, port).await?;
    let mut conn = tunnel(&fx, port).await?;
    let hello = client_hello(FRONT, LONG_HELLO)?;
    conn.send(&hello).await?;
    conn.shutdown_write().await?;
    let first = first_recorded(&seen).await?;
    assert_eq!(first.len(), hello.len());
    assert!(first == hello, "the origin received other bytes");
    let decisions = fx.mediator.decisions()?;
    assert!(
        !decisions
            .iter()
            .any(is(|r| r.reason == Reason::SniMismatch)),
        "{decisions:?}"
    );
    Ok(())
}

/// A client that stays silent past the request-head timeout and then sends a ClientHello
/// naming another host (off 443, to an origin that does not speak first) is still held to
/// the SNI rule: silence does not turn the tunnel into an unchecked one.
async fn a_hello_sent_after_the_request_head_timeout_is_still_checked() -> Result<()> {
    const REQUEST_HEAD_SECS: u64 = 1;
    let ip = origin_ip(8);
    let (seen, port) = recording_origin(ip, 0).await?;
    let builder = mediator().timeout("request_head", REQUEST_HEAD_SECS);
    let fx = fixture_with(ip, port, builder).await?;
    let mut conn = tunnel(&fx, port).await?;
    // Silent for longer than the request-head timeout: what is waited out is the point.
    tokio::time::sleep(Duration::from_millis(REQUEST_HEAD_SECS * 1000 + 800)).await;
    conn.send(&client_hello("evil.test", 512)?).await?;
    refused(&fx, conn, &seen, "evil.test").await
}

/// Off 443, a tunnel in which nobody speaks is closed after `idle_tunnel` as the relay's
/// idle timeout is: `idle_timeout` in its close record, a reset for the client.
async fn a_tunnel_where_nobody_speaks_is_cut_at_the_idle_timeout() -> Result<()> {
    let ip = origin_ip(9);
    let (_seen, port) = recording_origin(ip, 0).await?;
    let fx = fixture_with(ip, port, mediator().timeout("idle_tunnel", 1)).await?;
    let mut conn = tunnel(&fx, port).await?;
    ensure!(
        conn.resets_within(Duration::from_secs(8)).await,
        "the idle tunnel was not reset"
    );
    let close = fx
        .mediator
        .wait_for_log(
            is(|r| r.event == Event::Close && r.host.as_deref() == Some(FRONT)),
            Duration::from_secs(5),
        )
        .await?;
    assert_eq!(close["close_reason"], "idle_timeout", "{close}");
    Ok(())
}

/// Off 443, a tunnel still waiting for the client's first bytes when its authority is
/// revoked is cut when the grace ends, as a relayed one is: a reset, close reason
/// `shutdown`.
async fn a_tunnel_waiting_at_the_gate_is_cut_with_a_reset_when_revoked() -> Result<()> {
    let ip = origin_ip(10);
    let (seen, port) = recording_origin(ip, 0).await?;
    let builder = mediator().admin(true).timeout("revoke_grace", 1);
    let fx = fixture_with(ip, port, builder).await?;
    let mut conn = tunnel(&fx, port).await?;
    let answer = fx.mediator.revoke(AGENT_A).await?;
    ensure!(answer.status == 200, "{answer:?}");
    ensure!(
        conn.resets_within(Duration::from_secs(8)).await,
        "the tunnel was not reset"
    );
    let close = fx
        .mediator
        .wait_for_log(
            is(|r| r.event == Event::Close && r.host.as_deref() == Some(FRONT)),
            Duration::from_secs(5),
        )
        .await?;
    assert_eq!(close["close_reason"], "revoked", "{close}");
    let first = first_recorded(&seen).await?;
    assert!(first.is_empty(), "origin received {} bytes", first.len());
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(domain_fronting_with_another_sni_is_refused_before_the_origin_sees_a_byte)
            .needs(&[Tool::Curl]),
        case!(matching_sni_passes_and_the_hello_reaches_the_origin_unchanged).needs(&[Tool::Curl]),
        case!(non_tls_bytes_in_a_443_tunnel_are_refused_as_an_unreadable_hello),
        case!(domain_fronting_on_another_port_is_refused_too).needs(&[Tool::Curl]),
        case!(a_server_that_speaks_first_is_not_held_up_on_other_ports),
        case!(a_binary_stream_starting_with_0x16_passes_off_443),
        case!(a_long_hello_naming_another_host_off_443_is_refused),
        case!(a_long_matching_hello_off_443_reaches_the_origin_byte_for_byte),
        case!(a_hello_sent_after_the_request_head_timeout_is_still_checked),
        case!(a_tunnel_where_nobody_speaks_is_cut_at_the_idle_timeout),
        case!(a_tunnel_waiting_at_the_gate_is_cut_with_a_reset_when_revoked),
    ]
}
