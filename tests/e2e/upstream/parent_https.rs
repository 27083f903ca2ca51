//! HTTPS parents (design section 8): TLS to the parent, verified against `[tls]
//! extra_ca_files` (here a test CA of ours), SNI = the parent's name, then CONNECT or
//! absolute-form inside as with a plain HTTP parent; a parent whose certificate does not
//! verify is a connection failure of that parent (the next route is tried), logged in
//! words; PAC `HTTPS host:port` entries and SOCKS5 clients use the same path.

use crate::support::is;
use anyhow::Result;
use e2e::case;
use e2e::harness::Case;
use e2e::parent::{HttpParent, HttpParentMode, PacServer};
use e2e::socks::{REP_SUCCEEDED, SocksTarget};
use e2e::tls::TestCa;
use e2e::{
    AGENT_A, Fixture, LOOPBACK, MediatorBuilder, ORIGIN_HOST, TOKEN_A, agent_a_spec,
    check_contains, get_through, proxy_authorization,
};
use mediator::vocab::{Event, Protocol};
use serde_json::json;

use crate::support::mediator;

/// The HTTPS parent's name (resolved to 127.0.0.1 by the test DNS server).
const PARENT_HOST: &str = "proxy.e2e.test";

/// `mode = "parent"` with `parents` and the test CA trusted for upstream TLS.
fn https_parents(ca: &TestCa, parents: &[String]) -> MediatorBuilder {
    let list: Vec<String> = parents.iter().map(|p| format!("{p:?}")).collect();
    mediator()
        .upstream_line("mode = \"parent\"")
        .upstream_line(&format!("parents = [{}]", list.join(", ")))
        .extra_toml(&format!(
            "[tls]\nextra_ca_files = [{:?}]\n",
            ca.pem_path.display().to_string()
        ))
        .authority(agent_a_spec())
}

async fn connect_through_an_https_parent_runs_inside_tls() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = TestCa::create(dir.path())?;
    let parent = HttpParent::start_tls(&ca.ca, PARENT_HOST, HttpParentMode::Serve).await?;
    let url = format!("https://{PARENT_HOST}:{}", parent.addr().port());
    let fx = Fixture::start(https_parents(&ca, std::slice::from_ref(&url))).await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    let resp = fx.tunnel_get("origin.test", "/inside").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()?["target"], "/inside");
    let seen = parent.wait_requests(1).await?;
    let port = fx.origin.port();
    assert_eq!(
        seen[0],
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
        "inside the TLS the parent gets the pin, as a plain parent does"
    );
    let line = fx
        .mediator
        .expect_allow(
            ORIGIN_HOST,
            &[
                ("route", json!(format!("parent {url}"))),
                ("pin", json!("127.0.0.1")),
            ],
        )
        .await?;
    let close = fx.mediator.wait_for_close(&line["id"]).await?;
    assert_eq!(close["route"], json!(format!("parent {url}")), "{close}");
    assert!(
        close["bytes_down"].as_u64().unwrap_or(0) > 0,
        "the tunnel's bytes are counted through TLS: {close}"
    );
    Ok(())
}

async fn plain_http_and_socks5_go_through_the_https_parent_too() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = TestCa::create(dir.path())?;
    let parent = HttpParent::start_tls(&ca.ca, PARENT_HOST, HttpParentMode::Serve).await?;
    let url = format!("https://{PARENT_HOST}:{}", parent.addr().port());
    let fx = Fixture::start(https_parents(&ca, std::slice::from_ref(&url))).await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    let target = fx.origin_target();
    let mut conn = fx.tcp_conn().await?;
    let req = format!(
        "GET http://{target}/plain HTTP/1.1\r\n{}\r\n",
        proxy_authorization(AGENT_A, TOKEN_A)
    );
    let resp = conn.request(req.as_bytes()).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = parent.wait_requests(1).await?;
    assert!(
        seen[0].starts_with(&format!("GET http://{target}/plain HTTP/1.1\r\n")),
        "absolute-form inside the parent's TLS: {:?}",
        seen[0]
    );
    let (mut client, reply) = fx
        .socks_connect_a(&SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port()))
        .await?;
    assert_eq!(reply.rep, REP_SUCCEEDED);
    let body = get_through(client.stream(), "x", "/s").await?;
    assert!(body.contains("\"/s\""), "{body}");
    parent.wait_requests(2).await?;
    let line = fx
        .mediator
        .wait_for_log(
            is(|r| r.event == Event::Decision && r.protocol == Protocol::Socks5),
            e2e::LOG_TIMEOUT,
        )
        .await?;
    assert_eq!(line["route"], json!(format!("parent {url}")), "{line}");
    assert_eq!(line["decision"], "allow", "{line}");
    Ok(())
}

async fn an_untrusted_parent_certificate_falls_back_and_says_why() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let trusted = TestCa::create(dir.path())?;
    let other_dir = tempfile::tempdir()?;
    let untrusted = TestCa::create(other_dir.path())?;
    let bad = HttpParent::start_tls(&untrusted.ca, PARENT_HOST, HttpParentMode::Serve).await?;
    let good = HttpParent::start().await?;
    let bad_url = format!("https://{PARENT_HOST}:{}", bad.addr().port());
    let good_url = format!("http://{}", good.addr());
    let fx = Fixture::start(
        https_parents(&trusted, &[bad_url.clone(), good_url.clone()]).connect_timeout_secs(5),
    )
    .await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    let resp = fx.tunnel_get("origin.test", "/x").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    good.wait_requests(1).await?;
    assert!(
        bad.requests().is_empty(),
        "nothing is sent to a parent whose certificate did not verify"
    );
    fx.mediator
        .expect_allow(
            ORIGIN_HOST,
            &[("route", json!(format!("parent {good_url}")))],
        )
        .await?;
    let why = fx
        .mediator
        .wait_for_stderr(
            |l| l.contains(&bad_url) && l.contains("TLS"),
            e2e::LOG_TIMEOUT,
        )
        .await?;
    assert!(
        why.contains("signed by an issuer that is not trusted"),
        "the reason in words: {why}"
    );
    assert!(!why.contains("UnknownIssuer"), "{why}");
    Ok(())
}

async fn an_only_parent_with_a_bad_certificate_is_an_upstream_failure_in_words() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let trusted = TestCa::create(dir.path())?;
    let other_dir = tempfile::tempdir()?;
    let untrusted = TestCa::create(other_dir.path())?;
    // A certificate for another name, from a CA the mediator does not trust.
    let bad = HttpParent::start_tls(&untrusted.ca, "other.e2e.test", HttpParentMode::Serve).await?;
    let url = format!("https://{PARENT_HOST}:{}", bad.addr().port());
    let fx = Fixture::start(https_parents(&trusted, std::slice::from_ref(&url))).await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    let target = fx.origin_target();
    let resp = fx.connect(&target, Some((AGENT_A, TOKEN_A))).await?;
    let denial = fx
        .mediator
        .expect_deny(&resp, 502, "upstream_failure", Some(ORIGIN_HOST), &[])
        .await?;
    check_contains(&denial.body, "detail", &url)?;
    check_contains(&denial.body, "detail", "TLS: the server's certificate")?;
    check_contains(&denial.line, "detail", "TLS: the server's certificate")?;
    Ok(())
}

async fn a_pac_https_entry_is_an_https_parent() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = TestCa::create(dir.path())?;
    let parent = HttpParent::start_tls(&ca.ca, PARENT_HOST, HttpParentMode::Serve).await?;
    let port = parent.addr().port();
    let pac = PacServer::start(&format!(
        "function FindProxyForURL(url, host) {{ return \"HTTPS {PARENT_HOST}:{port}; DIRECT\"; }}"
    ))
    .await?;
    let fx = Fixture::start(
        mediator()
            .upstream_line("mode = \"pac\"")
            .upstream_line(&format!("pac = \"{}\"", pac.url()))
            .upstream_line(&format!("allowed_parents = [\"{PARENT_HOST}:{port}\"]"))
            .extra_toml(&format!(
                "[tls]\nextra_ca_files = [{:?}]\n",
                ca.pem_path.display().to_string()
            ))
            .authority(agent_a_spec()),
    )
    .await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    let resp = fx.tunnel_get("origin.test", "/pac").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    parent.wait_requests(1).await?;
    fx.mediator
        .expect_allow(
            ORIGIN_HOST,
            &[(
                "route",
                json!(format!("parent https://{PARENT_HOST}:{port}")),
            )],
        )
        .await?;
    Ok(())
}

async fn a_parent_certificate_for_another_name_is_said_in_words_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = TestCa::create(dir.path())?;
    let parent = HttpParent::start_tls(&ca.ca, "other.e2e.test", HttpParentMode::Serve).await?;
    let url = format!("https://{PARENT_HOST}:{}", parent.addr().port());
    let fx = Fixture::start(https_parents(&ca, std::slice::from_ref(&url))).await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    let resp = fx
        .connect(&fx.origin_target(), Some((AGENT_A, TOKEN_A)))
        .await?;
    let denial = fx
        .mediator
        .expect_deny(&resp, 502, "upstream_failure", Some(ORIGIN_HOST), &[])
        .await?;
    check_contains(
        &denial.body,
        "detail",
        &format!("it is not valid for the name {PARENT_HOST} (it is for other.e2e.test)"),
    )?;
    let detail = denial.body["detail"].as_str().unwrap_or_default();
    assert_eq!(
        detail.matches(&url).count(),
        1,
        "the parent is named once: {detail}"
    );
    assert!(!detail.contains("DnsName"), "{detail}");
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(connect_through_an_https_parent_runs_inside_tls),
        case!(plain_http_and_socks5_go_through_the_https_parent_too),
        case!(an_untrusted_parent_certificate_falls_back_and_says_why),
        case!(an_only_parent_with_a_bad_certificate_is_an_upstream_failure_in_words),
        case!(a_pac_https_entry_is_an_https_parent),
        case!(a_parent_certificate_for_another_name_is_said_in_words_once),
    ]
}
