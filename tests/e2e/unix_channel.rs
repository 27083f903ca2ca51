//! The per-authority Unix socket channel (design section 5): the socket file and its
//! mode, identity by socket alone (no credential), SO_PEERCRED in the decision log, and
//! HTTP CONNECT, absolute-form and SOCKS5 on the same socket.
//!
//! curl cannot use an HTTP proxy on a Unix socket, so CONNECT uses our raw client; curl
//! does drive SOCKS5 over the socket (`socks5h://localhost/<path>`).

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::socks::{METHOD_NO_AUTH, REP_NOT_ALLOWED, REP_SUCCEEDED};
use e2e::{
    AGENT_A, AGENT_B, Fixture, HttpConn, ORIGIN_HOST, Socks5, SocksTarget, agent_a_spec,
    check_deny, check_line, curl,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::support::mediator;

async fn fixture() -> Result<Fixture> {
    Fixture::start(
        mediator()
            .authority(agent_a_spec())
            .authority(e2e::AuthoritySpec::new(AGENT_B).allow(&["other.test"])),
    )
    .await
}

/// Checks the `peer` of a Unix-channel line: `pid` as given, uid/gid ours.
fn check_unix_peer(line: &Value, pid: u32) -> Result<()> {
    let peer = &line["peer"];
    ensure!(
        peer["pid"] == json!(pid),
        "peer.pid should be {pid}: {line}"
    );
    ensure!(
        peer["uid"] == json!(nix::unistd::getuid().as_raw()),
        "peer.uid: {line}"
    );
    ensure!(
        peer["gid"] == json!(nix::unistd::getgid().as_raw()),
        "peer.gid: {line}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_authority_gets_a_socket_with_mode_0600() -> Result<()> {
    let fx = fixture().await?;
    for name in [AGENT_A, AGENT_B] {
        let path = fx.mediator.socket_path(name);
        let meta = std::fs::symlink_metadata(&path)?;
        assert!(
            meta.file_type().is_socket(),
            "{} is not a socket",
            path.display()
        );
        assert_eq!(
            meta.permissions().mode() & 0o7777,
            0o600,
            "{}",
            path.display()
        );
        assert_eq!(
            path.file_name().unwrap().to_string_lossy(),
            format!("{name}.sock")
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_over_unix_socket_needs_no_credential_and_logs_peer_pid() -> Result<()> {
    let fx = fixture().await?;
    let mut conn = HttpConn::unix(&fx.mediator.socket_path(AGENT_A)).await?;
    let resp = conn.connect(&fx.origin_target(), None).await?;
    assert_eq!(resp.status, 200, "{resp:?} {}", resp.text());
    let req = format!(
        "GET /unix HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        fx.origin_target()
    );
    let inner = conn.request(req.as_bytes()).await?;
    assert_eq!(inner.status, 200);
    assert_eq!(inner.json()?["target"], "/unix");

    let line = fx
        .mediator
        .wait_for_decision("allowed", Some(ORIGIN_HOST))
        .await?;
    check_line(
        &line,
        &[
            ("authority", json!(AGENT_A)),
            ("channel", json!("unix")),
            ("protocol", json!("connect")),
            ("decision", json!("allow")),
            ("pin", json!("127.0.0.1")),
            ("route", json!("direct")),
        ],
    )?;
    check_unix_peer(&line, std::process::id())?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_over_unix_socket_is_forwarded() -> Result<()> {
    let fx = fixture().await?;
    let mut conn = HttpConn::unix(&fx.mediator.socket_path(AGENT_A)).await?;
    let t = fx.origin_target();
    let resp = conn
        .request(format!("GET http://{t}/abs HTTP/1.1\r\nHost: {t}\r\n\r\n").as_bytes())
        .await?;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.json()?["target"], "/abs");
    let line = fx
        .mediator
        .wait_for_decision("allowed", Some(ORIGIN_HOST))
        .await?;
    check_line(
        &line,
        &[("channel", json!("unix")), ("protocol", json!("http"))],
    )?;
    check_unix_peer(&line, std::process::id())?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_grant_over_unix_is_403_attributed_to_the_sockets_authority() -> Result<()> {
    let fx = fixture().await?;
    // agent-b's socket; agent-b may not reach origin.test.
    let mut conn = HttpConn::unix(&fx.mediator.socket_path(AGENT_B)).await?;
    let resp = conn.connect(&fx.origin_target(), None).await?;
    let body = check_deny(&resp, 403, "not_in_allowlist")?;
    assert_eq!(body["authority"], AGENT_B);
    let line = fx
        .mediator
        .wait_for_decision("not_in_allowlist", Some(ORIGIN_HOST))
        .await?;
    check_line(
        &line,
        &[("authority", json!(AGENT_B)), ("channel", json!("unix"))],
    )?;
    check_unix_peer(&line, std::process::id())?;
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_over_unix_socket_with_no_auth_method() -> Result<()> {
    let fx = fixture().await?;
    let stream = UnixStream::connect(fx.mediator.socket_path(AGENT_A)).await?;
    let mut s = Socks5::new(stream);
    assert_eq!(s.greet(&[METHOD_NO_AUTH]).await?, METHOD_NO_AUTH);
    let reply = s
        .request(
            e2e::socks::CMD_CONNECT,
            &SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port()),
        )
        .await?;
    assert_eq!(reply.rep, REP_SUCCEEDED, "{reply:?}");
    let io = s.stream();
    io.write_all(
        format!(
            "GET /s HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            fx.origin_target()
        )
        .as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), io.read_to_end(&mut out)).await??;
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    let line = fx
        .mediator
        .wait_for_decision("allowed", Some(ORIGIN_HOST))
        .await?;
    check_line(
        &line,
        &[
            ("channel", json!("unix")),
            ("protocol", json!("socks5")),
            ("authority", json!(AGENT_A)),
        ],
    )?;
    check_unix_peer(&line, std::process::id())?;

    // The same socket refuses a destination outside the grant with REP 0x02.
    let stream = UnixStream::connect(fx.mediator.socket_path(AGENT_A)).await?;
    let mut s = Socks5::new(stream);
    assert_eq!(s.greet(&[METHOD_NO_AUTH]).await?, METHOD_NO_AUTH);
    let reply = s
        .request(
            e2e::socks::CMD_CONNECT,
            &SocksTarget::Domain("other.test".into(), 80),
        )
        .await?;
    assert_eq!(reply.rep, REP_NOT_ALLOWED, "{reply:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_socks5h_over_unix_socket_is_attributed_to_curls_pid() -> Result<()> {
    let fx = fixture().await?;
    let proxy = format!(
        "socks5h://localhost{}",
        fx.mediator.socket_path(AGENT_A).display()
    );
    let url = format!("http://{}/curl-unix", fx.origin_target());
    let out = curl(&["--proxy", &proxy, &url]).await?;
    ensure!(out.exit_code == 0 && out.http_code == 200, "curl: {out:?}");
    let echo: Value = serde_json::from_str(&out.body)?;
    assert_eq!(echo["target"], "/curl-unix");
    let line = fx
        .mediator
        .wait_for_decision("allowed", Some(ORIGIN_HOST))
        .await?;
    check_line(
        &line,
        &[
            ("channel", json!("unix")),
            ("protocol", json!("socks5")),
            ("authority", json!(AGENT_A)),
        ],
    )?;
    check_unix_peer(&line, out.pid.unwrap())?;
    Ok(())
}
