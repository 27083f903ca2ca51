//! The per-authority Unix socket channel (design section 5): the socket file and its
//! mode, identity by socket alone (no credential), SO_PEERCRED in the decision log, and
//! HTTP CONNECT, absolute-form and SOCKS5 on the same socket.
//!
//! curl cannot use an HTTP proxy on a Unix socket, so CONNECT uses our raw client; curl
//! does drive SOCKS5 over the socket (`socks5h://localhost/<path>`).

use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};

use anyhow::{Result, ensure};
use e2e::socks::{CMD_CONNECT, METHOD_NO_AUTH, REP_NOT_ALLOWED, REP_SUCCEEDED};
use e2e::{
    AGENT_A, AGENT_B, AuthoritySpec, Fixture, ORIGIN_HOST, Socks5, SocksTarget, agent_a_spec, curl,
    expect_http_200, get_through,
};
use serde_json::{Value, json};
use tokio::net::UnixStream;

use crate::support::mediator;

async fn fixture() -> Result<Fixture> {
    Fixture::start(
        mediator()
            .authority(agent_a_spec())
            .authority(AuthoritySpec::new(AGENT_B).allow(&["other.test"])),
    )
    .await
}

/// The decision fields of a SOCKS5 connection on `agent-a`'s socket.
fn unix_socks5_a() -> [(&'static str, Value); 3] {
    [
        ("channel", json!("unix")),
        ("protocol", json!("socks5")),
        ("authority", json!(AGENT_A)),
    ]
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

async fn connect_over_unix_socket_needs_no_credential_and_logs_peer_pid() -> Result<()> {
    let fx = fixture().await?;
    let mut conn = fx.unix_conn(AGENT_A).await?;
    let resp = conn.connect(&fx.origin_target(), None).await?;
    assert_eq!(resp.status, 200, "{resp:?} {}", resp.text());
    let inner = conn.get(&fx.origin_target(), "/unix", true).await?;
    assert_eq!(inner.status, 200);
    assert_eq!(inner.json()?["target"], "/unix");

    let line = fx
        .mediator
        .expect_allow(
            ORIGIN_HOST,
            &[
                ("authority", json!(AGENT_A)),
                ("channel", json!("unix")),
                ("protocol", json!("connect")),
                ("pin", json!("127.0.0.1")),
                ("route", json!("direct")),
            ],
        )
        .await?;
    check_unix_peer(&line, std::process::id())?;
    // Not captured: no `capture` field at all.
    ensure!(
        line.get("capture").is_none(),
        "capture on a plain CONNECT: {line}"
    );
    Ok(())
}

/// The shim marks the CONNECT of a transparently captured connection (design section 15):
/// the mark is logged as `capture: true` (the client's own claim), and decides nothing.
async fn a_connect_marked_by_the_shims_capture_is_logged_capture_true() -> Result<()> {
    let fx = fixture().await?;
    let mut conn = fx.unix_conn(AGENT_A).await?;
    let t = fx.origin_target();
    let head = format!("CONNECT {t} HTTP/1.1\r\nHost: {t}\r\nX-Mediator-Capture: 1\r\n\r\n");
    conn.send(head.as_bytes()).await?;
    let resp = conn.read_response(true).await?;
    assert_eq!(resp.status, 200, "{resp:?}");
    fx.mediator
        .expect_allow(
            ORIGIN_HOST,
            &[
                ("channel", json!("unix")),
                ("protocol", json!("connect")),
                ("capture", json!(true)),
            ],
        )
        .await?;
    Ok(())
}

async fn absolute_form_over_unix_socket_is_forwarded() -> Result<()> {
    let fx = fixture().await?;
    let mut conn = fx.unix_conn(AGENT_A).await?;
    let t = fx.origin_target();
    let resp = conn
        .request(format!("GET http://{t}/abs HTTP/1.1\r\nHost: {t}\r\n\r\n").as_bytes())
        .await?;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.json()?["target"], "/abs");
    let line = fx
        .mediator
        .expect_allow(
            ORIGIN_HOST,
            &[("channel", json!("unix")), ("protocol", json!("http"))],
        )
        .await?;
    check_unix_peer(&line, std::process::id())?;
    Ok(())
}

async fn out_of_grant_over_unix_is_403_attributed_to_the_sockets_authority() -> Result<()> {
    let fx = fixture().await?;
    // agent-b's socket; agent-b may not reach origin.test.
    let resp = fx.connect_unix(AGENT_B, &fx.origin_target()).await?;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "not_in_allowlist",
            Some(ORIGIN_HOST),
            &[("authority", json!(AGENT_B)), ("channel", json!("unix"))],
        )
        .await?;
    assert_eq!(denial.body["authority"], AGENT_B);
    check_unix_peer(&denial.line, std::process::id())?;
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

async fn socks5_over_unix_socket_with_no_auth_method() -> Result<()> {
    let fx = fixture().await?;
    let stream = UnixStream::connect(fx.mediator.socket_path(AGENT_A)).await?;
    let mut s = Socks5::new(stream);
    assert_eq!(s.greet(&[METHOD_NO_AUTH]).await?, METHOD_NO_AUTH);
    let reply = s
        .request(
            CMD_CONNECT,
            &SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port()),
        )
        .await?;
    assert_eq!(reply.rep, REP_SUCCEEDED, "{reply:?}");
    expect_http_200(&get_through(s.stream(), &fx.origin_target(), "/s").await?)?;
    let line = fx
        .mediator
        .expect_allow(ORIGIN_HOST, &unix_socks5_a())
        .await?;
    check_unix_peer(&line, std::process::id())?;

    // The same socket refuses a destination outside the grant with REP 0x02.
    let stream = UnixStream::connect(fx.mediator.socket_path(AGENT_A)).await?;
    let mut s = Socks5::new(stream);
    assert_eq!(s.greet(&[METHOD_NO_AUTH]).await?, METHOD_NO_AUTH);
    let reply = s
        .request(CMD_CONNECT, &SocksTarget::Domain("other.test".into(), 80))
        .await?;
    assert_eq!(reply.rep, REP_NOT_ALLOWED, "{reply:?}");
    Ok(())
}

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
        .expect_allow(ORIGIN_HOST, &unix_socks5_a())
        .await?;
    check_unix_peer(&line, out.pid.unwrap())?;
    Ok(())
}

/// A socket directory the mediator makes is 0711: a local process may reach a socket its
/// mode lets it use, but cannot list which authorities exist.
async fn a_socket_directory_it_makes_cannot_be_listed_by_others() -> Result<()> {
    let fx = Fixture::start(mediator().authority(agent_a_spec())).await?;
    let sock = fx.mediator.socket_path(AGENT_A);
    let dir = sock.parent().expect("a socket path has a directory");
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
    ensure!(mode == 0o711, "socket_dir mode {mode:o}, want 711");
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(each_authority_gets_a_socket_with_mode_0600),
        case!(connect_over_unix_socket_needs_no_credential_and_logs_peer_pid),
        case!(a_connect_marked_by_the_shims_capture_is_logged_capture_true),
        case!(absolute_form_over_unix_socket_is_forwarded),
        case!(out_of_grant_over_unix_is_403_attributed_to_the_sockets_authority),
        case!(socks5_over_unix_socket_with_no_auth_method),
        case!(curl_socks5h_over_unix_socket_is_attributed_to_curls_pid).needs(&[Tool::Curl]),
        case!(a_socket_directory_it_makes_cannot_be_listed_by_others),
    ]
}
