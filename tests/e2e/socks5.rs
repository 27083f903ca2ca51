//! SOCKS5 on the shared TCP listener (design sections 5, 6; RFC 1928/1929): real curl
//! with `--socks5-hostname`, each address type, the method and authentication failures,
//! unsupported commands, and the `REP` codes for policy, DNS and upstream failures.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::socks::{
    CMD_BIND, CMD_UDP_ASSOCIATE, METHOD_NO_AUTH, METHOD_NONE_ACCEPTABLE, METHOD_USER_PASS,
    REP_COMMAND_NOT_SUPPORTED, REP_HOST_UNREACHABLE, REP_NOT_ALLOWED, REP_REFUSED, REP_SUCCEEDED,
};
use e2e::{
    AGENT_A, AuthoritySpec, Fixture, ORIGIN_HOST, Origin, Socks5, SocksTarget, TOKEN_A, check_line,
    check_tcp_peer, curl,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::mediator;

async fn fixture() -> Result<Fixture> {
    Fixture::start(
        mediator().authority(
            AuthoritySpec::new(AGENT_A)
                .allow(&[ORIGIN_HOST, "127.0.0.1", "::1", "nx.test"])
                .allow_private(&["127.0.0.0/8", "::1/128"])
                .token(TOKEN_A),
        ),
    )
    .await
}

async fn socks(fx: &Fixture) -> Result<Socks5<TcpStream>> {
    Ok(Socks5::new(
        TcpStream::connect(fx.mediator.tcp_addr()).await?,
    ))
}

/// Sends a minimal HTTP request through an established tunnel and returns the response.
async fn get_through(stream: &mut TcpStream, host: &str) -> Result<String> {
    let req = format!("GET /via-socks HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut out)).await??;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_socks5_hostname_with_user_pass_reaches_origin() -> Result<()> {
    let fx = fixture().await?;
    let proxy = fx.mediator.tcp_addr().to_string();
    let user = format!("{AGENT_A}:{TOKEN_A}");
    let url = format!("http://{}/s5", fx.origin_target());
    let out = curl(&["--socks5-hostname", &proxy, "--proxy-user", &user, &url]).await?;
    ensure!(out.exit_code == 0 && out.http_code == 200, "curl: {out:?}");
    let echo: Value = serde_json::from_str(&out.body)?;
    assert_eq!(echo["target"], "/s5");
    let line = fx
        .mediator
        .wait_for_decision("allowed", Some(ORIGIN_HOST))
        .await?;
    check_line(
        &line,
        &[
            ("authority", json!(AGENT_A)),
            ("channel", json!("tcp")),
            ("protocol", json!("socks5")),
            ("port", json!(fx.origin.port())),
            ("decision", json!("allow")),
            ("pin", json!("127.0.0.1")),
            ("route", json!("direct")),
        ],
    )?;
    check_tcp_peer(&line)?;
    let close = fx.mediator.wait_for_close(&line["id"]).await?;
    assert!(
        close["bytes_down"].as_u64().is_some_and(|b| b > 0),
        "{close}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_domain_outside_grant_gets_rep_0x02() -> Result<()> {
    let fx = fixture().await?;
    fx.dns.set("other.test", [e2e::LOOPBACK]);
    let mut s = socks(&fx).await?;
    let reply = s
        .connect_with_auth(
            AGENT_A,
            TOKEN_A,
            &SocksTarget::Domain("other.test".into(), fx.origin.port()),
        )
        .await?;
    assert_eq!(reply.rep, REP_NOT_ALLOWED, "{reply:?}");
    let line = fx
        .mediator
        .wait_for_decision("not_in_allowlist", Some("other.test"))
        .await?;
    check_line(
        &line,
        &[
            ("protocol", json!("socks5")),
            ("authority", json!(AGENT_A)),
            ("decision", json!("deny")),
        ],
    )?;
    assert_eq!(fx.dns.queries("other.test"), 0);
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_without_user_pass_method_on_tcp_gets_0xff() -> Result<()> {
    let fx = fixture().await?;
    let mut s = socks(&fx).await?;
    let method = s.greet(&[METHOD_NO_AUTH]).await?;
    assert_eq!(method, METHOD_NONE_ACCEPTABLE);
    assert!(
        s.closes_within(Duration::from_secs(5)).await,
        "connection should close after 0xFF"
    );
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_prefers_user_pass_when_offered_alongside_no_auth() -> Result<()> {
    let fx = fixture().await?;
    let mut s = socks(&fx).await?;
    let method = s.greet(&[METHOD_NO_AUTH, METHOD_USER_PASS]).await?;
    assert_eq!(
        method, METHOD_USER_PASS,
        "TCP listener must require a credential"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_wrong_password_fails_auth_and_closes() -> Result<()> {
    let fx = fixture().await?;
    let mut s = socks(&fx).await?;
    assert_eq!(s.greet(&[METHOD_USER_PASS]).await?, METHOD_USER_PASS);
    let status = s.auth(AGENT_A, "wrong").await?;
    assert_ne!(status, 0, "bad password accepted");
    assert!(
        s.closes_within(Duration::from_secs(5)).await,
        "connection should close"
    );
    let line = fx
        .mediator
        .wait_for_decision("bad_credential", None)
        .await?;
    check_line(
        &line,
        &[("protocol", json!("socks5")), ("decision", json!("deny"))],
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_unknown_authority_fails_auth_and_closes() -> Result<()> {
    let fx = fixture().await?;
    let mut s = socks(&fx).await?;
    assert_eq!(s.greet(&[METHOD_USER_PASS]).await?, METHOD_USER_PASS);
    let status = s.auth("nobody", TOKEN_A).await?;
    assert_ne!(status, 0);
    assert!(s.closes_within(Duration::from_secs(5)).await);
    let line = fx
        .mediator
        .wait_for_decision("unknown_authority", None)
        .await?;
    check_line(
        &line,
        &[("authority", Value::Null), ("decision", json!("deny"))],
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_bind_and_udp_associate_get_rep_0x07() -> Result<()> {
    let fx = fixture().await?;
    let target = SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port());
    for cmd in [CMD_BIND, CMD_UDP_ASSOCIATE] {
        let mut s = socks(&fx).await?;
        assert_eq!(s.greet(&[METHOD_USER_PASS]).await?, METHOD_USER_PASS);
        assert_eq!(s.auth(AGENT_A, TOKEN_A).await?, 0);
        let reply = s.request(cmd, &target).await?;
        assert_eq!(reply.rep, REP_COMMAND_NOT_SUPPORTED, "cmd {cmd}: {reply:?}");
    }
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_atyp_ipv4_connects_to_allowed_literal() -> Result<()> {
    let fx = fixture().await?;
    let mut s = socks(&fx).await?;
    let reply = s
        .connect_with_auth(AGENT_A, TOKEN_A, &SocksTarget::Ip(fx.origin.addr()))
        .await?;
    assert_eq!(reply.rep, REP_SUCCEEDED, "{reply:?}");
    let text = get_through(s.stream(), &fx.origin.addr().to_string()).await?;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let line = fx
        .mediator
        .wait_for_decision("allowed", Some("127.0.0.1"))
        .await?;
    check_line(
        &line,
        &[("protocol", json!("socks5")), ("pin", json!("127.0.0.1"))],
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_atyp_ipv6_connects_to_allowed_literal() -> Result<()> {
    let fx = fixture().await?;
    let origin6 = Origin::start_on("[::1]:0".parse()?).await?;
    let mut s = socks(&fx).await?;
    let reply = s
        .connect_with_auth(AGENT_A, TOKEN_A, &SocksTarget::Ip(origin6.addr()))
        .await?;
    assert_eq!(reply.rep, REP_SUCCEEDED, "{reply:?}");
    let text = get_through(s.stream(), &origin6.addr().to_string()).await?;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let line = fx
        .mediator
        .wait_for_decision("allowed", Some("::1"))
        .await?;
    check_line(
        &line,
        &[
            ("protocol", json!("socks5")),
            ("pin", json!("::1")),
            ("port", json!(origin6.port())),
        ],
    )?;
    assert_eq!(origin6.connections(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_atyp_domain_connects_and_relays() -> Result<()> {
    let fx = fixture().await?;
    let mut s = socks(&fx).await?;
    let reply = s
        .connect_with_auth(
            AGENT_A,
            TOKEN_A,
            &SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port()),
        )
        .await?;
    assert_eq!(reply.rep, REP_SUCCEEDED, "{reply:?}");
    let text = get_through(s.stream(), &fx.origin_target()).await?;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_nxdomain_gets_rep_0x04() -> Result<()> {
    let fx = fixture().await?;
    let mut s = socks(&fx).await?;
    let reply = s
        .connect_with_auth(AGENT_A, TOKEN_A, &SocksTarget::Domain("nx.test".into(), 80))
        .await?;
    assert_eq!(reply.rep, REP_HOST_UNREACHABLE, "{reply:?}");
    let line = fx
        .mediator
        .wait_for_decision("dns_failure", Some("nx.test"))
        .await?;
    check_line(
        &line,
        &[("protocol", json!("socks5")), ("decision", json!("deny"))],
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_refused_upstream_gets_rep_0x05() -> Result<()> {
    let fx = fixture().await?;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let dead: SocketAddr = l.local_addr()?;
    drop(l);
    let mut s = socks(&fx).await?;
    let reply = s
        .connect_with_auth(AGENT_A, TOKEN_A, &SocksTarget::Ip(dead))
        .await?;
    assert_eq!(reply.rep, REP_REFUSED, "{reply:?}");
    let line = fx
        .mediator
        .wait_for_decision("upstream_failure", Some("127.0.0.1"))
        .await?;
    check_line(
        &line,
        &[("protocol", json!("socks5")), ("port", json!(dead.port()))],
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_non_canonical_ip_as_domain_is_refused_malformed_target() -> Result<()> {
    let fx = fixture().await?;
    let mut s = socks(&fx).await?;
    let reply = s
        .connect_with_auth(
            AGENT_A,
            TOKEN_A,
            &SocksTarget::Domain("127.1".into(), fx.origin.port()),
        )
        .await?;
    assert_ne!(reply.rep, REP_SUCCEEDED, "{reply:?}");
    let line = fx
        .mediator
        .wait_for_decision("malformed_target", None)
        .await?;
    check_line(
        &line,
        &[("protocol", json!("socks5")), ("decision", json!("deny"))],
    )?;
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}
