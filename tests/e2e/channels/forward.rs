//! Absolute-form HTTP forwarding (design section 6): what the origin receives (Host
//! rebuilt from the URI, hop-by-hop headers and `Proxy-Authorization` removed), what the
//! client receives (a forged `X-Mediator-Decision` stripped), and the requests that must
//! be refused with 400 or 431 before anything is resolved or connected.

use crate::support::is;
use e2e::case;
use e2e::harness::Case;
use policy::Reason;
use std::time::Duration;

use anyhow::Result;
use e2e::{
    AGENT_A, FORGED_DECISION, Fixture, LOOPBACK, TOKEN_A, agent_a_spec, basic_auth, check_deny,
    proxy_authorization,
};
use serde_json::{Value, json};

use crate::support::{agent_a, mediator};

/// `agent-a`'s `Proxy-Authorization` line.
fn auth_header() -> String {
    proxy_authorization(AGENT_A, TOKEN_A)
}

async fn absolute_form_get_rebuilds_host_and_drops_hop_by_hop_headers() -> Result<()> {
    let fx = agent_a().await?;
    let target = fx.origin_target();
    let req = format!(
        "GET http://{target}/echo?q=1 HTTP/1.1\r\n\
         Host: attacker.example\r\n\
         {auth}\
         Connection: x-foo, keep-alive\r\n\
         X-Foo: must-not-pass\r\n\
         Keep-Alive: timeout=5\r\n\
         TE: trailers\r\n\
         Proxy-Connection: keep-alive\r\n\
         Upgrade: websocket\r\n\
         X-Kept: yes\r\n\
         User-Agent: e2e\r\n\
         \r\n",
        auth = auth_header()
    );
    let resp = fx.request(&req).await?;
    assert_eq!(resp.status, 200, "{resp:?}\n{}", resp.text());
    for v in resp.header_all("x-mediator-decision") {
        assert!(
            !v.contains("forged-by-origin"),
            "origin's forged header reached the client"
        );
        assert_ne!(v, FORGED_DECISION);
    }
    let echo = resp.json()?;
    assert_eq!(echo["method"], "GET");
    assert_eq!(
        echo["target"], "/echo?q=1",
        "origin must receive origin-form: {echo}"
    );
    let headers = &echo["headers"];
    assert_eq!(
        headers["host"],
        json!([target]),
        "Host must be rebuilt from the URI: {echo}"
    );
    for gone in [
        "proxy-authorization",
        "x-foo",
        "keep-alive",
        "te",
        "proxy-connection",
        "upgrade",
    ] {
        assert!(
            headers.get(gone).is_none(),
            "`{gone}` was forwarded: {echo}"
        );
    }
    if let Some(conn_values) = headers.get("connection") {
        let s = conn_values.to_string().to_ascii_lowercase();
        assert!(
            !s.contains("x-foo"),
            "client's Connection tokens forwarded: {echo}"
        );
    }
    assert_eq!(headers["x-kept"], json!(["yes"]), "{echo}");
    assert_eq!(headers["user-agent"], json!(["e2e"]), "{echo}");

    fx.expect_origin_allowed("http").await?;
    Ok(())
}

async fn absolute_form_post_forwards_the_body() -> Result<()> {
    let fx = agent_a().await?;
    let req = format!(
        "POST http://{}/submit HTTP/1.1\r\nHost: {}\r\n{}Content-Type: text/plain\r\nContent-Length: 9\r\n\r\npayload!!",
        fx.origin_target(),
        fx.origin_target(),
        auth_header()
    );
    let resp = fx.request(&req).await?;
    assert_eq!(resp.status, 200, "{resp:?}");
    let echo = resp.json()?;
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["body"], "payload!!");
    Ok(())
}

async fn absolute_form_without_credential_is_407() -> Result<()> {
    let fx = agent_a().await?;
    let req = format!(
        "GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\n\r\n",
        t = fx.origin_target()
    );
    let resp = fx.request(&req).await?;
    // (check_deny holds a 407 to its Proxy-Authenticate challenge.)
    fx.mediator
        .expect_deny(
            &resp,
            407,
            "bad_credential",
            None,
            &[("authority", Value::Null)],
        )
        .await?;
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

async fn absolute_form_outside_grant_is_403_not_in_allowlist() -> Result<()> {
    let fx = agent_a().await?;
    fx.dns.set("other.test", [LOOPBACK]);
    let req = format!(
        "GET http://other.test:{p}/ HTTP/1.1\r\nHost: other.test:{p}\r\n{}\r\n",
        auth_header(),
        p = fx.origin.port()
    );
    let resp = fx.request(&req).await?;
    let denial = fx
        .mediator
        .expect_deny(
            &resp,
            403,
            "not_in_allowlist",
            Some("other.test"),
            &[("protocol", json!("http"))],
        )
        .await?;
    assert_eq!(denial.body["authority"], AGENT_A);
    assert_eq!(fx.origin.connections(), 0);
    assert_eq!(
        fx.dns.queries("other.test"),
        0,
        "a name outside the grant was resolved"
    );
    Ok(())
}

/// Sends `req` and checks the 400 `malformed_target` answer, that the decision was
/// logged, and that the origin was never contacted.
async fn expect_400(fx: &Fixture, req: &str) -> Result<()> {
    let resp = fx.request(req).await?;
    fx.mediator
        .expect_deny(
            &resp,
            400,
            "malformed_target",
            None,
            &[("channel", json!("tcp"))],
        )
        .await?;
    assert_eq!(
        fx.origin.connections(),
        0,
        "a malformed request reached the origin"
    );
    Ok(())
}

async fn two_host_headers_are_400() -> Result<()> {
    let fx = agent_a().await?;
    let t = fx.origin_target();
    let req = format!(
        "GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\nHost: other.test\r\n{}\r\n",
        auth_header()
    );
    expect_400(&fx, &req).await
}

async fn origin_form_sent_to_the_proxy_is_400() -> Result<()> {
    let fx = agent_a().await?;
    let t = fx.origin_target();
    let req = format!(
        "GET /index.html HTTP/1.1\r\nHost: {t}\r\n{}\r\n",
        auth_header()
    );
    expect_400(&fx, &req).await
}

async fn https_scheme_in_absolute_form_is_400() -> Result<()> {
    let fx = agent_a().await?;
    let t = fx.origin_target();
    let req = format!(
        "GET https://{t}/ HTTP/1.1\r\nHost: {t}\r\n{}\r\n",
        auth_header()
    );
    expect_400(&fx, &req).await
}

async fn non_http_scheme_in_absolute_form_is_400() -> Result<()> {
    let fx = agent_a().await?;
    let t = fx.origin_target();
    let req = format!(
        "GET ftp://{t}/file HTTP/1.1\r\nHost: {t}\r\n{}\r\n",
        auth_header()
    );
    expect_400(&fx, &req).await
}

async fn non_canonical_ip_in_absolute_form_is_400() -> Result<()> {
    let fx = agent_a().await?;
    let p = fx.origin.port();
    let req = format!(
        "GET http://127.1:{p}/ HTTP/1.1\r\nHost: 127.1:{p}\r\n{}\r\n",
        auth_header()
    );
    expect_400(&fx, &req).await
}

async fn absolute_form_port_that_is_not_a_port_is_400_never_port_80() -> Result<()> {
    for port in ["65536", "83617", "80a", "99999999999999999999"] {
        let fx = agent_a().await?;
        let req = format!(
            "GET http://origin.test:{port}/ HTTP/1.1\r\nHost: origin.test\r\n{}\r\n",
            auth_header()
        );
        let resp = fx.request(&req).await?;
        // Either our JSON 400 or hyper's own 400 for a URI it cannot parse; never a
        // decision on port 80.
        assert_eq!(resp.status, 400, "port {port}: {}", resp.text());
        let lines = fx.mediator.decision_lines()?;
        assert!(
            !lines.iter().any(|l| l["port"] == 80),
            "port {port} became 80: {lines:?}"
        );
    }
    Ok(())
}

async fn userinfo_in_a_target_is_never_logged_or_echoed() -> Result<()> {
    let fx = agent_a().await?;
    let p = fx.origin.port();
    let secret = "s3cr3t-pa55";
    let req = format!(
        "CONNECT alice:{secret}@origin.test:{p} HTTP/1.1\r\nHost: origin.test\r\n{}\r\n",
        auth_header()
    );
    let resp = fx.request(&req).await?;
    assert_eq!(resp.status, 400);
    assert!(!resp.text().contains(secret), "echoed: {}", resp.text());
    let req = format!(
        "GET http://alice:{secret}@origin.test:{p}/ HTTP/1.1\r\nHost: origin.test\r\n{}\r\n",
        auth_header()
    );
    let resp = fx.request(&req).await?;
    assert_eq!(resp.status, 400);
    assert!(!resp.text().contains(secret), "echoed: {}", resp.text());
    fx.mediator
        .wait_for_count(
            is(|r| r.reason == Reason::MalformedTarget),
            2,
            Duration::from_secs(5),
        )
        .await?;
    fx.mediator.expect_log_lacks(secret)?;
    Ok(())
}

/// Sends a head of about `head_len` bytes (absolute-form, then CONNECT) to a mediator
/// whose `request_head_bytes` is `limit`, and expects 431 both times.
async fn expect_431(limit: usize, head_len: usize) -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .authority(agent_a_spec())
            .request_head_bytes(limit),
    )
    .await?;
    let t = fx.origin_target();
    let filler = "a".repeat(head_len);
    let req = format!(
        "GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\n{}X-Filler: {filler}\r\n\r\n",
        auth_header()
    );
    let mut conn = fx.tcp_conn().await?;
    // The mediator may answer and close before reading everything; a failed write is
    // fine as long as the 431 arrives.
    let _ = conn.send(req.as_bytes()).await;
    let resp = conn.read_response(false).await?;
    assert_eq!(
        resp.status, 431,
        "absolute-form, limit {limit}: {} {:?}",
        resp.status, resp.headers
    );
    assert_eq!(fx.origin.connections(), 0);

    let mut conn = fx.tcp_conn().await?;
    let req = format!(
        "CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n{}X-Filler: {filler}\r\n\r\n",
        auth_header()
    );
    let _ = conn.send(req.as_bytes()).await;
    let resp = conn.read_response(true).await?;
    assert_eq!(
        resp.status, 431,
        "CONNECT, limit {limit}: {} {:?}",
        resp.status, resp.headers
    );
    assert_eq!(fx.origin.connections(), 0);
    Ok(())
}

async fn request_head_over_a_large_configured_limit_is_431() -> Result<()> {
    expect_431(16 * 1024, 20 * 1024).await
}

async fn request_head_limit_at_the_minimum_is_enforced() -> Result<()> {
    // 8192 is the smallest limit the HTTP/1 server can enforce exactly.
    expect_431(8192, 9000).await
}

async fn request_head_limit_below_the_minimum_is_refused_at_load() -> Result<()> {
    // A limit the server could not enforce is a config error, never a silent larger limit.
    let (status, stderr) = mediator()
        .authority(agent_a_spec())
        .request_head_bytes(2048)
        .check()
        .await?;
    anyhow::ensure!(
        !status.success(),
        "check accepted request_head_bytes = 2048"
    );
    anyhow::ensure!(
        stderr.contains("request_head_bytes = 2048 is out of range 8192..=1048576"),
        "stderr: {stderr}"
    );
    Ok(())
}

/// A Unix channel keeps the authority it was opened with: after a revoke, the next request
/// on that connection (whose upstream connection is kept alive) is `unknown_authority`,
/// not served under the revoked grant until the grace ends.
async fn reused_upstream_connection_gets_no_decision_after_a_revoke() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .timeout("revoke_grace", 60)
            .authority(agent_a_spec()),
    )
    .await?;
    let m = &fx.mediator;
    let target = fx.origin_target();
    let req = format!("GET http://{target}/x HTTP/1.1\r\nHost: {target}\r\n\r\n");
    let mut c = fx.unix_conn(AGENT_A).await?;
    assert_eq!(c.request(req.as_bytes()).await?.status, 200);
    let resp = m
        .admin("DELETE", &format!("/v1/authorities/{AGENT_A}"), None, None)
        .await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    check_deny(&c.request(req.as_bytes()).await?, 407, "unknown_authority")?;
    assert_eq!(fx.origin.requests(), 1);
    Ok(())
}

/// On a keep-alive connection the credential is checked on every request: a verified
/// value may be remembered, but a different one (a wrong token) is refused at once, and
/// the right one works again after it.
async fn every_request_on_a_kept_alive_connection_is_authenticated() -> Result<()> {
    let fx = agent_a().await?;
    let t = fx.origin_target();
    let get = |auth: &str, path: &str| {
        format!("GET http://{t}{path} HTTP/1.1\r\nHost: {t}\r\nProxy-Authorization: {auth}\r\n\r\n")
    };
    let good = basic_auth(AGENT_A, TOKEN_A);
    let wrong = basic_auth(AGENT_A, "not-the-token");
    let mut conn = fx.tcp_conn().await?;
    let first = conn.request(get(&good, "/one").as_bytes()).await?;
    assert_eq!(first.status, 200, "{first:?}");
    let second = conn.request(get(&wrong, "/two").as_bytes()).await?;
    check_deny(&second, 407, "bad_credential")?;
    let third = conn.request(get(&good, "/three").as_bytes()).await?;
    assert_eq!(third.status, 200, "{third:?}");
    let fourth = conn
        .request(format!("GET http://{t}/four HTTP/1.1\r\nHost: {t}\r\n\r\n").as_bytes())
        .await?;
    check_deny(&fourth, 407, "bad_credential")?;
    assert_eq!(
        fx.origin.requests(),
        2,
        "only the two authenticated requests went out"
    );
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(absolute_form_get_rebuilds_host_and_drops_hop_by_hop_headers),
        case!(absolute_form_post_forwards_the_body),
        case!(absolute_form_without_credential_is_407),
        case!(absolute_form_outside_grant_is_403_not_in_allowlist),
        case!(two_host_headers_are_400),
        case!(origin_form_sent_to_the_proxy_is_400),
        case!(https_scheme_in_absolute_form_is_400),
        case!(non_http_scheme_in_absolute_form_is_400),
        case!(non_canonical_ip_in_absolute_form_is_400),
        case!(absolute_form_port_that_is_not_a_port_is_400_never_port_80),
        case!(userinfo_in_a_target_is_never_logged_or_echoed),
        case!(request_head_over_a_large_configured_limit_is_431),
        case!(request_head_limit_at_the_minimum_is_enforced),
        case!(request_head_limit_below_the_minimum_is_refused_at_load),
        case!(reused_upstream_connection_gets_no_decision_after_a_revoke),
        case!(every_request_on_a_kept_alive_connection_is_authenticated),
    ]
}
