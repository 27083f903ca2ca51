//! Routing through parent proxies (design section 8): `mode = "parent"` and
//! `mode = "env"`, asserted on what the recording parents on loopback received — the pin
//! (or the canonical name) in the CONNECT, absolute-form for plain HTTP, credentials from
//! configuration only, 407 as a clear `upstream_failure`, fallback on connection-level
//! failure only with the failed parent skipped afterwards, and no client-supplied CR/LF/NUL
//! reaching a parent. Routing comes after the decision: a denied target never reaches a
//! parent.

use crate::support::is;
use anyhow::{Context, Result};
use e2e::case;
use e2e::harness::Case;
use e2e::parent::{ClosingParent, HttpParent, HttpParentMode, Socks5Parent};
use e2e::socks::{REP_SUCCEEDED, SocksTarget};
use e2e::{
    AGENT_A, Denial, Fixture, HttpResponse, LOG_TIMEOUT, LOOPBACK, MediatorBuilder, ORIGIN_HOST,
    TOKEN_A, agent_a_spec, basic_auth, check_contains, check_deny, get_through,
    proxy_authorization,
};
use mediator::vocab::Event;
use policy::Reason;
use serde_json::json;

use crate::support::mediator;

fn parent_mode(b: MediatorBuilder, parents: &[String]) -> MediatorBuilder {
    let list: Vec<String> = parents.iter().map(|p| format!("{p:?}")).collect();
    b.upstream_line("mode = \"parent\"")
        .upstream_line(&format!("parents = [{}]", list.join(", ")))
}

/// CONNECT through the mediator, then one GET inside the tunnel; returns the origin's echo.
async fn get_through_tunnel(fx: &Fixture, host: &str) -> Result<HttpResponse> {
    fx.tunnel_get(host, "/inside").await
}

/// The decision lines of the requests that were allowed, once there are `n` of them.
async fn allowed_lines(fx: &Fixture, n: usize) -> Result<Vec<serde_json::Value>> {
    fx.mediator
        .wait_for_count(
            is(|r| r.event == Event::Decision && r.reason == Reason::Allowed),
            n,
            LOG_TIMEOUT,
        )
        .await
}

async fn connect_through_http_parent_names_the_vetted_ip() -> Result<()> {
    let parent = HttpParent::start().await?;
    let url = format!("http://{}", parent.addr());
    let fx = Fixture::start(
        parent_mode(mediator(), std::slice::from_ref(&url)).authority(agent_a_spec()),
    )
    .await?;
    let resp = get_through_tunnel(&fx, "Origin.Test").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()?["target"], "/inside");
    let seen = parent.wait_requests(1).await?;
    let port = fx.origin.port();
    assert_eq!(
        seen[0],
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
        "the parent must get the pin, canonical and nothing else"
    );
    let line = fx
        .mediator
        .expect_allow(
            ORIGIN_HOST,
            &[
                ("route", json!(format!("parent {url}"))),
                ("pin", json!("127.0.0.1")),
                ("protocol", json!("connect")),
            ],
        )
        .await?;
    let close = fx.mediator.wait_for_close(&line["id"]).await?;
    assert_eq!(close["route"], json!(format!("parent {url}")), "{close}");
    Ok(())
}

async fn pin_off_names_the_canonical_host() -> Result<()> {
    let parent = HttpParent::start().await?;
    let url = format!("http://{}", parent.addr());
    let fx = Fixture::start(
        parent_mode(mediator(), std::slice::from_ref(&url))
            .upstream_line("pin_through_parent = false")
            .authority(agent_a_spec()),
    )
    .await?;
    let resp = get_through_tunnel(&fx, "ORIGIN.test.").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = parent.wait_requests(1).await?;
    let port = fx.origin.port();
    assert_eq!(
        seen[0],
        format!("CONNECT origin.test:{port} HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n")
    );
    Ok(())
}

async fn absolute_form_goes_to_the_http_parent_with_configured_credentials_only() -> Result<()> {
    let parent = HttpParent::start_with(Some(("corp", "s3cret")), HttpParentMode::Serve).await?;
    let url = format!("http://corp:s3cret@{}", parent.addr());
    let fx = Fixture::start(parent_mode(mediator(), &[url]).authority(agent_a_spec())).await?;
    let target = fx.origin_target();
    let mut conn = fx.tcp_conn().await?;
    let req = format!(
        "GET http://{target}/page?q=1 HTTP/1.1\r\nHost: evil.example\r\n{}X-Kept: yes\r\n\r\n",
        proxy_authorization(AGENT_A, TOKEN_A)
    );
    let resp = conn.request(req.as_bytes()).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = parent.wait_requests(1).await?;
    let head = &seen[0];
    assert!(
        head.starts_with(&format!("GET http://{target}/page?q=1 HTTP/1.1\r\n")),
        "absolute-form to the parent: {head:?}"
    );
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains(&format!("\r\nhost: {target}\r\n")),
        "{head:?}"
    );
    assert!(lower.contains("\r\nx-kept: yes\r\n"), "{head:?}");
    // The parent's credential is there, the client's (the mediator token) is not.
    assert!(head.contains(&basic_auth("corp", "s3cret")), "{head:?}");
    assert!(
        !head.contains(&basic_auth(AGENT_A, TOKEN_A)[6..]),
        "{head:?}"
    );
    assert!(!lower.contains("evil.example"), "{head:?}");
    // Keep-alive reuse goes to the same parent connection and is logged with the route.
    let resp = conn
        .request(
            format!(
                "GET http://{target}/again HTTP/1.1\r\n{}\r\n",
                proxy_authorization(AGENT_A, TOKEN_A)
            )
            .as_bytes(),
        )
        .await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    for line in &allowed_lines(&fx, 2).await? {
        assert_eq!(
            line["route"],
            json!(format!("parent http://{}", parent.addr())),
            "{line}"
        );
    }
    // The decision log never shows the parent's password.
    fx.mediator.expect_log_lacks("s3cret")?;
    Ok(())
}

async fn parent_demanding_auth_wrong_then_right() -> Result<()> {
    let parent = HttpParent::start_with(Some(("corp", "right")), HttpParentMode::Serve).await?;
    let wrong = format!("http://corp:wrong@{}", parent.addr());
    let fx = Fixture::start(parent_mode(mediator(), &[wrong]).authority(agent_a_spec())).await?;
    let resp = fx.connect_a(&fx.origin_target()).await?;
    let Denial { body, line } = fx
        .mediator
        .expect_deny(&resp, 502, "upstream_failure", Some(ORIGIN_HOST), &[])
        .await?;
    check_contains(&body, "detail", "407")?;
    check_contains(&body, "detail", "credentials")?;
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        !detail.contains("wrong"),
        "no password in the detail: {detail}"
    );
    check_contains(&line, "detail", "407")?;
    drop(fx);

    let right = format!("http://corp:right@{}", parent.addr());
    let fx = Fixture::start(parent_mode(mediator(), &[right]).authority(agent_a_spec())).await?;
    let resp = get_through_tunnel(&fx, ORIGIN_HOST).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = parent.wait_requests(2).await?;
    assert!(seen[1].contains(&basic_auth("corp", "right")), "{seen:?}");
    Ok(())
}

async fn a_parent_407_on_plain_http_is_an_upstream_failure_not_the_origin_answer() -> Result<()> {
    let parent = HttpParent::start_with(Some(("corp", "right")), HttpParentMode::Serve).await?;
    let wrong = format!("http://corp:wrong@{}", parent.addr());
    let fx = Fixture::start(parent_mode(mediator(), &[wrong]).authority(agent_a_spec())).await?;
    let target = fx.origin_target();
    let req = format!(
        "GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{}\r\n",
        proxy_authorization(AGENT_A, TOKEN_A)
    );
    let resp = fx.request(&req).await?;
    let body = fx
        .mediator
        .expect_deny(
            &resp,
            502,
            "upstream_failure",
            Some(ORIGIN_HOST),
            &[("protocol", json!("http"))],
        )
        .await?
        .body;
    check_contains(&body, "detail", "407")?;
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        !detail.contains("wrong"),
        "no password in the detail: {detail}"
    );
    Ok(())
}

async fn credentials_file_supplies_parent_credentials() -> Result<()> {
    let parent = HttpParent::start_with(Some(("filed", "pw")), HttpParentMode::Serve).await?;
    let dir = tempfile::tempdir()?;
    let cred = dir.path().join("parents.cred");
    std::fs::write(&cred, format!("# parents\n{} filed:pw\n", parent.addr()))?;
    let fx = Fixture::start(
        parent_mode(mediator(), &[format!("http://{}", parent.addr())])
            .upstream_line(&format!(
                "parent_credentials_file = {:?}",
                cred.display().to_string()
            ))
            .authority(agent_a_spec()),
    )
    .await?;
    let resp = get_through_tunnel(&fx, ORIGIN_HOST).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    Ok(())
}

async fn socks5_parent_gets_the_pin_and_rfc1929_credentials() -> Result<()> {
    let parent = Socks5Parent::start(Some(("su", "sp"))).await?;
    let url = format!("socks5://su:sp@{}", parent.addr());
    let fx = Fixture::start(parent_mode(mediator(), &[url]).authority(agent_a_spec())).await?;
    // A SOCKS5 client of the mediator, routed through the SOCKS5 parent.
    let (mut client, reply) = fx
        .socks_connect_a(&SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port()))
        .await?;
    assert_eq!(reply.rep, REP_SUCCEEDED);
    let body = get_through(client.stream(), "x", "/s").await?;
    assert!(body.contains("\"/s\""), "{body}");
    let seen = parent.wait_requests(1).await?;
    assert_eq!(seen[0].atyp, 1, "{seen:?}");
    assert_eq!(seen[0].host, "127.0.0.1");
    assert_eq!(seen[0].port, fx.origin.port());
    assert_eq!(seen[0].credentials, Some(("su".into(), "sp".into())));
    fx.mediator
        .expect_allow(
            ORIGIN_HOST,
            &[
                ("route", json!(format!("parent socks5://{}", parent.addr()))),
                ("protocol", json!("socks5")),
            ],
        )
        .await?;
    Ok(())
}

async fn socks5_parent_with_pin_off_gets_the_name() -> Result<()> {
    let parent = Socks5Parent::start(None).await?;
    let fx = Fixture::start(
        parent_mode(mediator(), &[format!("socks5://{}", parent.addr())])
            .upstream_line("pin_through_parent = false")
            .authority(agent_a_spec()),
    )
    .await?;
    let resp = get_through_tunnel(&fx, ORIGIN_HOST).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = parent.wait_requests(1).await?;
    assert_eq!((seen[0].atyp, seen[0].host.as_str()), (3, ORIGIN_HOST));
    assert_eq!(seen[0].methods, vec![0x00]);
    Ok(())
}

async fn fallback_on_connection_failure_then_skip_the_failed_parent() -> Result<()> {
    let down = ClosingParent::start().await?;
    let good = HttpParent::start().await?;
    let fx = Fixture::start(
        parent_mode(
            mediator(),
            &[
                format!("http://{}", down.addr()),
                format!("http://{}", good.addr()),
            ],
        )
        .upstream_line("parent_retry_secs = 600")
        .authority(agent_a_spec()),
    )
    .await?;
    let resp = get_through_tunnel(&fx, ORIGIN_HOST).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(down.accepted(), 1);
    good.wait_requests(1).await?;
    // The fallback is a warning, seen at the default log level.
    fx.mediator
        .wait_for_stderr(
            |l| {
                l.contains("WARN")
                    && l.contains(&format!("route parent http://{} to ", down.addr()))
                    && l.contains("trying the next route")
            },
            LOG_TIMEOUT,
        )
        .await?;
    // The failed parent is skipped now: the second connection goes straight to the good one.
    let resp = get_through_tunnel(&fx, ORIGIN_HOST).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    good.wait_requests(2).await?;
    assert_eq!(
        down.accepted(),
        1,
        "the failed parent must be skipped for parent_retry_secs"
    );
    for l in allowed_lines(&fx, 2).await? {
        assert_eq!(l["route"], json!(format!("parent http://{}", good.addr())));
    }
    Ok(())
}

async fn a_parent_that_answers_is_not_a_reason_to_fall_back() -> Result<()> {
    let refusing = HttpParent::start_with(None, HttpParentMode::Refuse(403)).await?;
    let good = HttpParent::start().await?;
    let fx = Fixture::start(
        parent_mode(
            mediator(),
            &[
                format!("http://{}", refusing.addr()),
                format!("http://{}", good.addr()),
            ],
        )
        .authority(agent_a_spec()),
    )
    .await?;
    let resp = fx.connect_a(&fx.origin_target()).await?;
    let body = check_deny(&resp, 502, "upstream_failure")?;
    check_contains(&body, "detail", "403")?;
    assert_eq!(good.accepted(), 0, "no fallback after a parent's answer");
    Ok(())
}

async fn denied_targets_never_reach_a_parent() -> Result<()> {
    let parent = HttpParent::start().await?;
    let fx = Fixture::start(
        parent_mode(mediator(), &[format!("http://{}", parent.addr())]).authority(agent_a_spec()),
    )
    .await?;
    let resp = fx.connect_a("blocked.example:443").await?;
    check_deny(&resp, 403, "not_in_allowlist")?;
    assert_eq!(parent.accepted(), 0);
    Ok(())
}

async fn crlf_and_nul_in_client_fields_cannot_reach_the_parent() -> Result<()> {
    let parent = HttpParent::start().await?;
    let fx = Fixture::start(
        parent_mode(mediator(), &[format!("http://{}", parent.addr())])
            .upstream_line("pin_through_parent = false")
            .authority(agent_a_spec()),
    )
    .await?;
    let port = fx.origin.port();
    // CONNECT targets with injected lines: refused as malformed by the mediator itself.
    for target in [
        format!("origin.test\r\nX-Injected: 1\r\n:{port}"),
        format!("origin.test%0d%0aX-Injected:%201:{port}"),
        format!("origin.test\0:{port}"),
    ] {
        let raw = format!(
            "CONNECT {target} HTTP/1.1\r\n{}\r\n",
            proxy_authorization(AGENT_A, TOKEN_A)
        );
        let resp = fx
            .request(&raw)
            .await
            .with_context(|| format!("no answer to CONNECT {target:?}"))?;
        check_deny(&resp, 400, "malformed_target").with_context(|| format!("{target:?}"))?;
    }
    // SOCKS5 domain names with CR/LF/NUL: refused before any route.
    for name in [
        "origin.test\r\nX-Injected: 1",
        "origin.test\0",
        "origin.test\r",
    ] {
        let (_client, reply) = fx
            .socks_connect_a(&SocksTarget::Domain(name.into(), port))
            .await?;
        assert_ne!(reply.rep, REP_SUCCEEDED, "{name:?}");
    }
    // Absolute-form with a header value trying to smuggle a line: the head does not
    // parse, and the answer is the mediator's own 400.
    let raw = format!(
        "GET http://origin.test:{port}/ HTTP/1.1\r\n{}X-A: a\rX-Injected: 1\r\n\r\n",
        proxy_authorization(AGENT_A, TOKEN_A)
    );
    let resp = fx
        .request(&raw)
        .await
        .context("no answer to the smuggling absolute-form request")?;
    check_deny(&resp, 400, "bad_request")?;
    // One good request, so that the parent has something to show.
    let resp = get_through_tunnel(&fx, ORIGIN_HOST).await?;
    assert_eq!(resp.status, 200);
    let seen = parent.wait_requests(1).await?;
    for head in &seen {
        assert!(!head.contains("X-Injected"), "{head:?}");
        assert!(!head.contains('\0'), "{head:?}");
        for line in head.trim_end_matches("\r\n").split("\r\n") {
            assert!(!line.contains('\r') && !line.contains('\n'), "{head:?}");
        }
    }
    assert_eq!(
        seen.len(),
        1,
        "only the good request reached the parent: {seen:?}"
    );
    Ok(())
}

async fn env_mode_uses_https_proxy_for_tunnels_http_proxy_for_http_and_no_proxy() -> Result<()> {
    let tunnels = HttpParent::start().await?;
    let plain = HttpParent::start().await?;
    let fx = Fixture::start(
        mediator()
            .upstream_line("mode = \"env\"")
            .env("HTTPS_PROXY", &format!("http://{}", tunnels.addr()))
            .env("http_proxy", &plain.addr().to_string())
            .env("NO_PROXY", "direct.test, .skip.test")
            .authority(agent_a_spec().allow(&["direct.test", "a.skip.test"])),
    )
    .await?;
    fx.resolve(&["direct.test", "a.skip.test"], LOOPBACK);

    let resp = get_through_tunnel(&fx, ORIGIN_HOST).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(tunnels.wait_requests(1).await?[0].starts_with("CONNECT 127.0.0.1:"));

    let req = format!(
        "GET http://{}/plain HTTP/1.1\r\n{}\r\n",
        fx.origin_target(),
        proxy_authorization(AGENT_A, TOKEN_A)
    );
    assert_eq!(fx.request(&req).await?.status, 200);
    assert!(
        plain.wait_requests(1).await?[0]
            .starts_with(&format!("GET http://{}/plain", fx.origin_target()))
    );

    for host in ["direct.test", "a.skip.test"] {
        let resp = get_through_tunnel(&fx, host).await?;
        assert_eq!(resp.status, 200, "{}", resp.text());
        fx.mediator
            .expect_allow(host, &[("route", json!("direct"))])
            .await?;
    }
    assert_eq!(tunnels.requests().len(), 1, "NO_PROXY hosts went direct");
    Ok(())
}

async fn env_mode_with_an_unusable_variable_refuses_to_start() -> Result<()> {
    let text = mediator()
        .upstream_line("mode = \"env\"")
        .env("HTTPS_PROXY", "socks4://127.0.0.1:1080")
        .authority(agent_a_spec())
        .start_err()
        .await?;
    assert!(
        text.contains("HTTPS_PROXY") && text.contains("SOCKS4"),
        "{text}"
    );
    Ok(())
}

/// A listener on loopback that accepts connections, reads what they send and never
/// answers; it holds them until dropped.
async fn silent_listener() -> Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await;
            held.push(stream);
        }
    });
    Ok((addr, task))
}

async fn plain_http_to_a_silent_upstream_is_a_504_after_idle_tunnel() -> Result<()> {
    let (silent, _task) = silent_listener().await?;
    let fx = Fixture::start(
        parent_mode(mediator(), &[format!("http://{silent}")])
            .timeout("idle_tunnel", 2)
            .authority(agent_a_spec()),
    )
    .await?;
    let target = fx.origin_target();
    let req = format!(
        "GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{}\r\n",
        proxy_authorization(AGENT_A, TOKEN_A)
    );
    let started = std::time::Instant::now();
    let resp = fx.request(&req).await?;
    let body = fx
        .mediator
        .expect_deny(&resp, 504, "upstream_failure", Some(ORIGIN_HOST), &[])
        .await?
        .body;
    check_contains(
        &body,
        "detail",
        &format!("parent http://{silent} sent nothing for 2s"),
    )?;
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(2),
        "not before idle_tunnel: {:?}",
        started.elapsed()
    );

    // A destination reached directly that never answers: the same.
    let fx = Fixture::start(
        mediator()
            .timeout("idle_tunnel", 2)
            .authority(agent_a_spec()),
    )
    .await?;
    let target = format!("{ORIGIN_HOST}:{}", silent.port());
    let req = format!(
        "GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{}\r\n",
        proxy_authorization(AGENT_A, TOKEN_A)
    );
    let resp = fx.request(&req).await?;
    let body = check_deny(&resp, 504, "upstream_failure")?;
    check_contains(&body, "detail", "the destination sent nothing for 2s")?;
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(connect_through_http_parent_names_the_vetted_ip),
        case!(pin_off_names_the_canonical_host),
        case!(absolute_form_goes_to_the_http_parent_with_configured_credentials_only),
        case!(parent_demanding_auth_wrong_then_right),
        case!(a_parent_407_on_plain_http_is_an_upstream_failure_not_the_origin_answer),
        case!(credentials_file_supplies_parent_credentials),
        case!(socks5_parent_gets_the_pin_and_rfc1929_credentials),
        case!(socks5_parent_with_pin_off_gets_the_name),
        case!(fallback_on_connection_failure_then_skip_the_failed_parent),
        case!(a_parent_that_answers_is_not_a_reason_to_fall_back),
        case!(denied_targets_never_reach_a_parent),
        case!(crlf_and_nul_in_client_fields_cannot_reach_the_parent),
        case!(env_mode_uses_https_proxy_for_tunnels_http_proxy_for_http_and_no_proxy),
        case!(env_mode_with_an_unusable_variable_refuses_to_start),
        case!(plain_http_to_a_silent_upstream_is_a_504_after_idle_tunnel),
    ]
}
