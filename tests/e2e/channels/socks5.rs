//! SOCKS5 on the shared TCP listener (design sections 5, 6; RFC 1928/1929): real curl
//! with `--socks5-hostname`, each address type, the method and authentication failures,
//! unsupported commands, and the `REP` codes for policy, DNS and upstream failures.

use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::socks::{
    CMD_BIND, CMD_UDP_ASSOCIATE, METHOD_NO_AUTH, METHOD_NONE_ACCEPTABLE, METHOD_USER_PASS,
    REP_COMMAND_NOT_SUPPORTED, REP_HOST_UNREACHABLE, REP_NOT_ALLOWED, REP_REFUSED, REP_SUCCEEDED,
};
use e2e::{
    AGENT_A, Fixture, LOG_TIMEOUT, LOOPBACK, ORIGIN_HOST, Origin, Socks5, SocksTarget, TOKEN_A,
    Watchdog, WatchdogMode, agent_a_spec, closed_loopback_port, expect_http_200, get_through,
    wait_until,
};
use serde_json::{Value, json};

use crate::support::mediator;

/// `agent-a`, which may also reach the loopback literals (IPv4 and IPv6) and `nx.test`.
async fn fixture() -> Result<Fixture> {
    Fixture::start(
        mediator().authority(
            agent_a_spec()
                .allow(&["127.0.0.1", "::1", "nx.test"])
                .allow_private(&["::1/128"]),
        ),
    )
    .await
}

async fn curl_socks5_hostname_with_user_pass_reaches_origin() -> Result<()> {
    let fx = fixture().await?;
    let url = format!("http://{}/s5", fx.origin_target());
    // socks5h: the name goes to the proxy (curl's --socks5-hostname).
    let out = fx
        .mediator
        .curl_via("socks5h", (AGENT_A, TOKEN_A), &[&url])
        .await?;
    ensure!(out.exit_code == 0 && out.http_code == 200, "curl: {out:?}");
    let echo: Value = serde_json::from_str(&out.body)?;
    assert_eq!(echo["target"], "/s5");
    let line = fx.expect_origin_allowed("socks5").await?;
    let close = fx.mediator.wait_for_close(&line["id"]).await?;
    assert!(
        close["bytes_down"].as_u64().is_some_and(|b| b > 0),
        "{close}"
    );
    Ok(())
}

async fn socks5_domain_outside_grant_gets_rep_0x02() -> Result<()> {
    let fx = fixture().await?;
    fx.dns.set("other.test", [LOOPBACK]);
    let (_s, reply) = fx
        .socks_connect_a(&SocksTarget::Domain("other.test".into(), fx.origin.port()))
        .await?;
    assert_eq!(reply.rep, REP_NOT_ALLOWED, "{reply:?}");
    fx.mediator
        .expect_decision(
            "not_in_allowlist",
            Some("other.test"),
            &[
                ("protocol", json!("socks5")),
                ("authority", json!(AGENT_A)),
                ("decision", json!("deny")),
            ],
        )
        .await?;
    assert_eq!(fx.dns.queries("other.test"), 0);
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

async fn socks5_without_user_pass_method_on_tcp_gets_0xff() -> Result<()> {
    let fx = fixture().await?;
    let mut s = fx.socks().await?;
    let method = s.greet(&[METHOD_NO_AUTH]).await?;
    assert_eq!(method, METHOD_NONE_ACCEPTABLE);
    assert!(
        s.closes_within(Duration::from_secs(5)).await,
        "connection should close after 0xFF"
    );
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

/// A handshake that is not SOCKS5 the mediator takes (an RFC 1929 subnegotiation of
/// another version; a request of another version) is cut, and logged as `bad_request`.
async fn socks5_handshakes_it_does_not_take_are_cut_and_logged() -> Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let fx = fixture().await?;
    let mut s = fx.socks().await?;
    assert_eq!(s.greet(&[METHOD_USER_PASS]).await?, METHOD_USER_PASS);
    s.stream()
        .write_all(&[0x02, 0x01, b'a', 0x01, b'b'])
        .await?;
    assert!(s.closes_within(Duration::from_secs(5)).await);
    let mut s = fx.socks().await?;
    assert_eq!(s.greet(&[METHOD_USER_PASS]).await?, METHOD_USER_PASS);
    assert_eq!(s.auth(AGENT_A, TOKEN_A).await?, 0);
    s.stream()
        .write_all(&[0x04, 0x01, 0x00, 0x01, 127, 0, 0, 1, 0, 80])
        .await?;
    assert!(s.closes_within(Duration::from_secs(5)).await);
    let lines = fx
        .mediator
        .wait_for_count(
            |v| v["protocol"] == "socks5" && v["reason"] == "bad_request",
            2,
            LOG_TIMEOUT,
        )
        .await?;
    ensure!(
        lines[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("RFC 1929")),
        "{lines:#?}"
    );
    assert_eq!(lines[1]["authority"], AGENT_A, "{lines:#?}");
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

async fn socks5_prefers_user_pass_when_offered_alongside_no_auth() -> Result<()> {
    let fx = fixture().await?;
    let mut s = fx.socks().await?;
    let method = s.greet(&[METHOD_NO_AUTH, METHOD_USER_PASS]).await?;
    assert_eq!(
        method, METHOD_USER_PASS,
        "TCP listener must require a credential"
    );
    Ok(())
}

async fn socks5_wrong_password_fails_auth_and_closes() -> Result<()> {
    let fx = fixture().await?;
    let mut s = fx.socks().await?;
    assert_eq!(s.greet(&[METHOD_USER_PASS]).await?, METHOD_USER_PASS);
    let status = s.auth(AGENT_A, "wrong").await?;
    assert_ne!(status, 0, "bad password accepted");
    assert!(
        s.closes_within(Duration::from_secs(5)).await,
        "connection should close"
    );
    fx.mediator
        .expect_decision(
            "bad_credential",
            None,
            &[("protocol", json!("socks5")), ("decision", json!("deny"))],
        )
        .await?;
    Ok(())
}

async fn socks5_unknown_authority_fails_auth_and_closes() -> Result<()> {
    let fx = fixture().await?;
    let mut s = fx.socks().await?;
    assert_eq!(s.greet(&[METHOD_USER_PASS]).await?, METHOD_USER_PASS);
    let status = s.auth("nobody", TOKEN_A).await?;
    assert_ne!(status, 0);
    assert!(s.closes_within(Duration::from_secs(5)).await);
    fx.mediator
        .expect_decision(
            "unknown_authority",
            None,
            &[("authority", Value::Null), ("decision", json!("deny"))],
        )
        .await?;
    Ok(())
}

async fn socks5_bind_and_udp_associate_get_rep_0x07() -> Result<()> {
    let fx = fixture().await?;
    let target = SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port());
    for cmd in [CMD_BIND, CMD_UDP_ASSOCIATE] {
        let mut s = fx.socks().await?;
        assert_eq!(s.greet(&[METHOD_USER_PASS]).await?, METHOD_USER_PASS);
        assert_eq!(s.auth(AGENT_A, TOKEN_A).await?, 0);
        let reply = s.request(cmd, &target).await?;
        assert_eq!(reply.rep, REP_COMMAND_NOT_SUPPORTED, "cmd {cmd}: {reply:?}");
    }
    assert_eq!(fx.origin.connections(), 0);
    // Each refusal is a decision: logged, attributed, and counted.
    let lines = fx
        .mediator
        .wait_for_count(
            |v| {
                v["event"] == "decision"
                    && v["reason"] == "malformed_target"
                    && v["protocol"] == "socks5"
                    && v["authority"] == AGENT_A
                    && v["host"] == ORIGIN_HOST
            },
            2,
            LOG_TIMEOUT,
        )
        .await?;
    ensure!(
        lines[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("BIND"))
            && lines[1]["detail"]
                .as_str()
                .is_some_and(|d| d.contains("UDP ASSOCIATE")),
        "{lines:?}"
    );
    Ok(())
}

async fn socks5_atyp_ipv4_connects_to_allowed_literal() -> Result<()> {
    let fx = fixture().await?;
    let (mut s, reply) = fx
        .socks_connect_a(&SocksTarget::Ip(fx.origin.addr()))
        .await?;
    assert_eq!(reply.rep, REP_SUCCEEDED, "{reply:?}");
    expect_http_200(&get_through(s.stream(), &fx.origin.addr().to_string(), "/via-socks").await?)?;
    fx.mediator
        .expect_allow(
            "127.0.0.1",
            &[("protocol", json!("socks5")), ("pin", json!("127.0.0.1"))],
        )
        .await?;
    Ok(())
}

async fn socks5_atyp_ipv6_connects_to_allowed_literal() -> Result<()> {
    let fx = fixture().await?;
    let origin6 = Origin::start_on("[::1]:0".parse()?).await?;
    let (mut s, reply) = fx.socks_connect_a(&SocksTarget::Ip(origin6.addr())).await?;
    assert_eq!(reply.rep, REP_SUCCEEDED, "{reply:?}");
    expect_http_200(&get_through(s.stream(), &origin6.addr().to_string(), "/via-socks").await?)?;
    fx.mediator
        .expect_allow(
            "::1",
            &[
                ("protocol", json!("socks5")),
                ("pin", json!("::1")),
                ("port", json!(origin6.port())),
            ],
        )
        .await?;
    assert_eq!(origin6.connections(), 1);
    Ok(())
}

async fn socks5_atyp_domain_connects_and_relays() -> Result<()> {
    let fx = fixture().await?;
    let (mut s, reply) = fx
        .socks_connect_a(&SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port()))
        .await?;
    assert_eq!(reply.rep, REP_SUCCEEDED, "{reply:?}");
    expect_http_200(&get_through(s.stream(), &fx.origin_target(), "/via-socks").await?)?;
    Ok(())
}

async fn socks5_nxdomain_gets_rep_0x04() -> Result<()> {
    let fx = fixture().await?;
    let (_s, reply) = fx
        .socks_connect_a(&SocksTarget::Domain("nx.test".into(), 80))
        .await?;
    assert_eq!(reply.rep, REP_HOST_UNREACHABLE, "{reply:?}");
    fx.mediator
        .expect_decision(
            "dns_failure",
            Some("nx.test"),
            &[("protocol", json!("socks5")), ("decision", json!("deny"))],
        )
        .await?;
    Ok(())
}

async fn socks5_refused_upstream_gets_rep_0x05() -> Result<()> {
    let fx = fixture().await?;
    let dead = SocketAddr::from((LOOPBACK, closed_loopback_port()?));
    let (_s, reply) = fx.socks_connect_a(&SocksTarget::Ip(dead)).await?;
    assert_eq!(reply.rep, REP_REFUSED, "{reply:?}");
    fx.mediator
        .expect_decision(
            "upstream_failure",
            Some("127.0.0.1"),
            &[("protocol", json!("socks5")), ("port", json!(dead.port()))],
        )
        .await?;
    Ok(())
}

async fn socks5_non_canonical_ip_as_domain_is_refused_malformed_target() -> Result<()> {
    let fx = fixture().await?;
    let (_s, reply) = fx
        .socks_connect_a(&SocksTarget::Domain("127.1".into(), fx.origin.port()))
        .await?;
    assert_ne!(reply.rep, REP_SUCCEEDED, "{reply:?}");
    fx.mediator
        .expect_decision(
            "malformed_target",
            None,
            &[("protocol", json!("socks5")), ("decision", json!("deny"))],
        )
        .await?;
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

/// The client goes away between its request and the mediator's success reply: the
/// connection was allowed and opened upstream, so its close record must still be written
/// (a missing close record is lost accounting). The watchdog holds the decision until the
/// client is gone, so the reply's write is sure to fail.
async fn a_success_reply_the_client_cannot_take_still_gets_its_close_record() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let watchdog = Watchdog::start(dir.path(), "gate", WatchdogMode::Gate(gate.clone()))?;
    let fx = Fixture::start(
        mediator().authority(agent_a_spec().raw(&format!("watchdog = {:?}", watchdog.endpoint()))),
    )
    .await?;
    let stream = tokio::net::UnixStream::connect(fx.mediator.socket_path(AGENT_A)).await?;
    let mut socks = Socks5::new(stream);
    ensure!(socks.greet(&[METHOD_NO_AUTH]).await? == METHOD_NO_AUTH);
    // Send the request without waiting for the reply: the decision is held at the gate.
    let mut request = vec![0x05, 0x01, 0x00, 0x03, u8::try_from(ORIGIN_HOST.len())?];
    request.extend_from_slice(ORIGIN_HOST.as_bytes());
    request.extend_from_slice(&fx.origin.port().to_be_bytes());
    tokio::io::AsyncWriteExt::write_all(socks.stream(), &request).await?;
    wait_until(LOG_TIMEOUT, "the watchdog is asked", || {
        !watchdog.questions().is_empty()
    })
    .await?;
    drop(socks);
    gate.notify_one();
    let allow = fx
        .mediator
        .expect_allow(ORIGIN_HOST, &[("protocol", json!("socks5"))])
        .await?;
    let close = fx.mediator.wait_for_close(&allow["id"]).await?;
    ensure!(
        close["close_reason"] == "client_closed" && close["bytes_up"] == 0,
        "{close}"
    );
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(curl_socks5_hostname_with_user_pass_reaches_origin).needs(&[Tool::Curl]),
        case!(socks5_domain_outside_grant_gets_rep_0x02),
        case!(socks5_without_user_pass_method_on_tcp_gets_0xff),
        case!(socks5_prefers_user_pass_when_offered_alongside_no_auth),
        case!(socks5_handshakes_it_does_not_take_are_cut_and_logged),
        case!(socks5_wrong_password_fails_auth_and_closes),
        case!(socks5_unknown_authority_fails_auth_and_closes),
        case!(socks5_bind_and_udp_associate_get_rep_0x07),
        case!(socks5_atyp_ipv4_connects_to_allowed_literal),
        case!(socks5_atyp_ipv6_connects_to_allowed_literal),
        case!(socks5_atyp_domain_connects_and_relays),
        case!(socks5_nxdomain_gets_rep_0x04),
        case!(socks5_refused_upstream_gets_rep_0x05),
        case!(socks5_non_canonical_ip_as_domain_is_refused_malformed_target),
        case!(a_success_reply_the_client_cannot_take_still_gets_its_close_record),
    ]
}
