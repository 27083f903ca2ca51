//! PAC routing (design section 8): scripts that route by host, by
//! `isInNet(dnsResolve(host), ...)` (the mediator's resolver) and by `shExpMatch`;
//! fallback lists with the first parent down; `allowed_parents`; the CPU and memory
//! budgets with `pac_on_error`; the per-host cache; the URL handed to the script; fetching
//! over HTTP with refresh and the last good copy; and failing closed at start.

use crate::support::is;
use e2e::case;
use e2e::harness::Case;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use e2e::parent::{ClosingParent, HttpParent, PacServer, Socks5Parent};
use e2e::{
    Fixture, LOOPBACK, ORIGIN_HOST, agent_a_spec, check_contains, check_deny, retry_for, wait_until,
};
use serde_json::json;

use crate::support::mediator;

/// A fixture in `pac` mode with the script in a file; `allowed` are `host:port` parents.
async fn pac_fixture(
    script: &str,
    allowed: &[String],
    extra: &[&str],
) -> Result<(Fixture, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("proxy.pac");
    std::fs::write(&path, script)?;
    let allowed: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
    let mut b = mediator()
        .upstream_line("mode = \"pac\"")
        .upstream_line(&format!("pac = {:?}", path.display().to_string()))
        .upstream_line(&format!("allowed_parents = [{}]", allowed.join(", ")))
        .env("MEDIATOR_LOG", "mediator=debug");
    for line in extra {
        b = b.upstream_line(line);
    }
    let fx = Fixture::start(b.authority(agent_a_spec().allow(&[
        "*.corp.test",
        "direct.test",
        "intranet.test",
    ])))
    .await?;
    fx.resolve(&["a.corp.test", "direct.test", "intranet.test"], LOOPBACK);
    Ok((fx, dir))
}

/// How long a test waits for a PAC refresh (every second here) to take effect.
const PAC_REFRESH_WAIT: Duration = Duration::from_secs(15);

/// CONNECT `host:<origin port>` and one GET inside; returns the status seen by the client
/// (the CONNECT answer's when it was not 200).
async fn tunnel_status(fx: &Fixture, host: &str) -> Result<u16> {
    Ok(fx.tunnel_get(host, "/").await?.status)
}

async fn route_of(fx: &Fixture, host: &str) -> Result<String> {
    let line = fx.mediator.wait_for_decision("allowed", Some(host)).await?;
    Ok(line["route"].as_str().unwrap_or_default().to_owned())
}

/// Waits for a stderr line (the debug log) containing `needle`.
async fn wait_stderr(fx: &Fixture, needle: &str) -> Result<()> {
    fx.mediator
        .wait_for_stderr(|l| l.contains(needle), Duration::from_secs(10))
        .await
        .map(drop)
}

/// Opens tunnels to the origin, each of which must work, until `used()` says the new
/// PAC answered one (a refresh installs it within [`PAC_REFRESH_WAIT`]).
async fn tunnel_until_used(
    fx: &Fixture,
    what: &str,
    used: impl Fn() -> Result<bool>,
) -> Result<()> {
    retry_for(
        PAC_REFRESH_WAIT,
        async || {
            let status = tunnel_status(fx, ORIGIN_HOST).await?;
            ensure!(status == 200, "a tunnel while waiting for {what}: {status}");
            Ok(used()?.then_some(()))
        },
        || {
            format!(
                "{what} was never used; stderr:\n{}",
                fx.mediator.stderr_text()
            )
        },
    )
    .await
}

async fn pac_routes_by_host_shexpmatch_and_isinnet_dnsresolve() -> Result<()> {
    let http = HttpParent::start().await?;
    let socks = Socks5Parent::start(None).await?;
    let script = format!(
        r#"function FindProxyForURL(url, host) {{
            if (host == "origin.test") return "PROXY {http}";
            if (shExpMatch(host, "*.corp.test")) return "SOCKS5 {socks}";
            if (isInNet(dnsResolve(host), "127.0.0.0", "255.0.0.0") && host == "intranet.test") return "PROXY {http}; DIRECT";
            return "DIRECT";
        }}"#,
        http = http.addr(),
        socks = socks.addr()
    );
    let (fx, _dir) = pac_fixture(
        &script,
        &[http.addr().to_string(), socks.addr().to_string()],
        &[],
    )
    .await?;

    assert_eq!(tunnel_status(&fx, ORIGIN_HOST).await?, 200);
    assert_eq!(
        route_of(&fx, ORIGIN_HOST).await?,
        format!("parent http://{}", http.addr())
    );
    assert!(http.wait_requests(1).await?[0].starts_with("CONNECT 127.0.0.1:"));

    assert_eq!(tunnel_status(&fx, "a.corp.test").await?, 200);
    assert_eq!(
        route_of(&fx, "a.corp.test").await?,
        format!("parent socks5://{}", socks.addr())
    );
    assert_eq!(socks.wait_requests(1).await?[0].host, "127.0.0.1");

    assert_eq!(tunnel_status(&fx, "intranet.test").await?, 200);
    assert_eq!(
        route_of(&fx, "intranet.test").await?,
        format!("parent http://{}", http.addr())
    );
    assert_eq!(http.wait_requests(2).await?.len(), 2);

    assert_eq!(tunnel_status(&fx, "direct.test").await?, 200);
    assert_eq!(route_of(&fx, "direct.test").await?, "direct");
    // The PAC's answers are in the debug log.
    wait_stderr(&fx, "PAC answered").await?;
    Ok(())
}

async fn pac_fallback_list_with_the_first_parent_down() -> Result<()> {
    let down = ClosingParent::start().await?;
    let good = HttpParent::start().await?;
    let script = format!(
        r#"function FindProxyForURL(url, host) {{ return "PROXY {down}; PROXY {good}; DIRECT"; }}"#,
        down = down.addr(),
        good = good.addr()
    );
    let (fx, _dir) = pac_fixture(
        &script,
        &[down.addr().to_string(), good.addr().to_string()],
        &[],
    )
    .await?;
    assert_eq!(tunnel_status(&fx, ORIGIN_HOST).await?, 200);
    assert_eq!(
        route_of(&fx, ORIGIN_HOST).await?,
        format!("parent http://{}", good.addr())
    );
    assert_eq!(down.accepted(), 1);
    good.wait_requests(1).await?;
    Ok(())
}

async fn pac_may_name_only_allowed_parents() -> Result<()> {
    let allowed = HttpParent::start().await?;
    let other = HttpParent::start().await?;
    let script = format!(
        r#"function FindProxyForURL(url, host) {{
            if (host == "direct.test") return "PROXY {other}; DIRECT";
            return "PROXY {other}";
        }}"#,
        other = other.addr()
    );
    let (fx, _dir) = pac_fixture(&script, &[allowed.addr().to_string()], &[]).await?;
    // Only a parent that is not allowed: no route, denied.
    let resp = fx.connect_a(&fx.origin_target()).await?;
    let body = check_deny(&resp, 502, "upstream_failure")?;
    check_contains(&body, "detail", "allowed_parents")?;
    // The not-allowed entry is skipped and the list goes on.
    assert_eq!(tunnel_status(&fx, "direct.test").await?, 200);
    assert_eq!(route_of(&fx, "direct.test").await?, "direct");
    assert_eq!(
        other.accepted(),
        0,
        "a parent outside allowed_parents is never contacted"
    );
    wait_stderr(&fx, "not in allowed_parents; skipped").await?;
    Ok(())
}

async fn infinite_loop_and_huge_allocation_are_cut_off() -> Result<()> {
    let script = r#"function FindProxyForURL(url, host) {
        if (host == "origin.test") { while (true) {} }
        if (host == "direct.test") { var s = "x"; while (true) { s = s + s; } }
        return "DIRECT";
    }"#;
    // pac_on_error = "deny" (the default): both are refused, quickly.
    let (fx, _dir) =
        pac_fixture(script, &[], &["pac_budget_ms = 100", "pac_memory_mb = 8"]).await?;
    let started = Instant::now();
    let resp = fx.connect_a(&fx.origin_target()).await?;
    let body = check_deny(&resp, 502, "upstream_failure")?;
    check_contains(&body, "detail", "CPU budget")?;
    let resp = fx
        .connect_a(&format!("direct.test:{}", fx.origin.port()))
        .await?;
    let body = check_deny(&resp, 502, "upstream_failure")?;
    check_contains(&body, "detail", "memory limit")?;
    assert!(started.elapsed() < Duration::from_secs(10));
    wait_stderr(&fx, "PAC evaluation failed").await?;
    // The engine is still usable afterwards.
    assert_eq!(tunnel_status(&fx, "intranet.test").await?, 200);
    drop(fx);

    // pac_on_error = "direct": the same scripts fall back to DIRECT.
    let (fx, _dir) = pac_fixture(
        script,
        &[],
        &[
            "pac_budget_ms = 100",
            "pac_memory_mb = 8",
            "pac_on_error = \"direct\"",
        ],
    )
    .await?;
    assert_eq!(tunnel_status(&fx, ORIGIN_HOST).await?, 200);
    assert_eq!(route_of(&fx, ORIGIN_HOST).await?, "direct");
    assert_eq!(tunnel_status(&fx, "direct.test").await?, 200);
    Ok(())
}

async fn pac_answers_are_cached_per_host_and_urls_have_no_path() -> Result<()> {
    let parent = HttpParent::start().await?;
    // alert() logs every evaluation; the route depends on the exact URL handed over.
    let script = format!(
        r#"function FindProxyForURL(url, host) {{
            alert("evaluated " + url);
            if (url == "https://origin.test:{port}/") return "PROXY {parent}";
            return "DIRECT";
        }}"#,
        port = "ORIGIN_PORT",
        parent = parent.addr()
    );
    // The origin port is only known once the fixture runs: write the final script then.
    let (fx, dir) = pac_fixture(
        "function FindProxyForURL(u, h) { return 'DIRECT'; }",
        &[parent.addr().to_string()],
        &["pac_refresh_secs = 1"],
    )
    .await?;
    std::fs::write(
        dir.path().join("proxy.pac"),
        script.replace("ORIGIN_PORT", &fx.origin.port().to_string()),
    )?;
    // Wait for the refresh to install it (the answer changes).
    let via_parent = json!(format!("parent http://{}", parent.addr()));
    tunnel_until_used(&fx, "the refreshed PAC", || {
        Ok(fx
            .mediator
            .decisions()?
            .iter()
            .any(|l| l["route"] == via_parent))
    })
    .await?;
    let before = fx
        .mediator
        .stderr_text()
        .matches("PAC alert: evaluated")
        .count();
    for _ in 0..3 {
        assert_eq!(tunnel_status(&fx, ORIGIN_HOST).await?, 200);
    }
    let after = fx
        .mediator
        .stderr_text()
        .matches("PAC alert: evaluated")
        .count();
    assert_eq!(before, after, "cached answers are not evaluated again");
    let text = fx.mediator.stderr_text();
    assert!(
        text.contains(&format!(
            "PAC alert: evaluated https://origin.test:{}/",
            fx.origin.port()
        )),
        "{text}"
    );
    Ok(())
}

async fn pac_from_http_url_refreshes_and_keeps_the_last_good_copy() -> Result<()> {
    let parent = HttpParent::start().await?;
    let server = PacServer::start("function FindProxyForURL(u, h) { return 'DIRECT'; }").await?;
    let fx = Fixture::start(
        mediator()
            .upstream_line("mode = \"pac\"")
            .upstream_line(&format!("pac = {:?}", server.url()))
            .upstream_line(&format!(
                "allowed_parents = [{:?}]",
                parent.addr().to_string()
            ))
            .upstream_line("pac_refresh_secs = 1")
            .upstream_line("pac_cache_secs = 0")
            .authority(agent_a_spec()),
    )
    .await?;
    assert_eq!(tunnel_status(&fx, ORIGIN_HOST).await?, 200);
    assert_eq!(route_of(&fx, ORIGIN_HOST).await?, "direct");
    // A broken refresh (500, then a syntax error) keeps the last good copy.
    for broken in [None, Some("function FindProxyForURL(u, h) { return ")] {
        server.set(broken);
        let seen = server.fetches();
        wait_until(PAC_REFRESH_WAIT, "two more PAC fetches", || {
            server.fetches() > seen + 1
        })
        .await?;
    }
    assert_eq!(tunnel_status(&fx, ORIGIN_HOST).await?, 200);
    let lines = fx.mediator.decisions()?;
    assert!(
        lines
            .iter()
            .all(is(|r| r.route.as_deref() == Some("direct"))),
        "{lines:?}"
    );
    // A good new script is used.
    server.set(Some(&format!(
        "function FindProxyForURL(u, h) {{ return 'PROXY {}'; }}",
        parent.addr()
    )));
    tunnel_until_used(&fx, "the new PAC", || Ok(parent.accepted() > 0)).await?;
    Ok(())
}

async fn no_usable_pac_at_start_fails_closed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("missing.pac");
    let bad = dir.path().join("bad.pac");
    std::fs::write(
        &bad,
        "function FindProxyForURL(u, h) { while (true) {} } while (true) {}",
    )?;
    let server = PacServer::start("x").await?;
    server.set(None);
    for (source, needle) in [
        (missing.display().to_string(), "cannot read"),
        (bad.display().to_string(), "CPU budget"),
        (server.url(), "status 500"),
    ] {
        let text = mediator()
            .upstream_line("mode = \"pac\"")
            .upstream_line(&format!("pac = {source:?}"))
            .authority(agent_a_spec())
            .start_err()
            .await?;
        assert!(
            text.contains("no usable PAC at start") && text.contains(needle),
            "{source}: {text}"
        );
    }
    Ok(())
}

async fn https_pac_is_verified_against_the_configured_trust() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = e2e::tls::TestCa::create(dir.path())?;
    // An HTTPS server for pac.test whose answer is not a PAC: getting as far as the script
    // check proves the TLS handshake verified.
    let server = e2e::tls::TlsOrigin::start(&ca.ca, "pac.test").await?;
    let dns = e2e::DnsServer::start().await?;
    dns.set("pac.test", [LOOPBACK]);
    let url = format!("https://pac.test:{}/proxy.pac", server.port());
    let start = |trust: bool| {
        let mut b = mediator()
            .nameserver(dns.addr())
            .upstream_line("mode = \"pac\"")
            .upstream_line(&format!("pac = {url:?}"))
            .authority(agent_a_spec());
        if trust {
            b = b.extra_toml(&format!(
                "[tls]\nextra_ca_files = [{:?}]",
                ca.pem_path.display().to_string()
            ));
        }
        b
    };
    let untrusted = start(false).start_err().await?;
    assert!(
        untrusted.contains("no usable PAC at start") && untrusted.contains("TLS"),
        "{untrusted}"
    );
    assert_eq!(server.requests(), 0, "no request without a verified server");
    let trusted = start(true).start_err().await?;
    assert!(
        trusted.contains("no usable PAC at start") && trusted.contains("PAC script error"),
        "{trusted}"
    );
    assert_eq!(server.requests(), 1);
    Ok(())
}

async fn pac_is_fetched_through_pac_fetch_via() -> Result<()> {
    let server = PacServer::start("function FindProxyForURL(u, h) { return 'DIRECT'; }").await?;
    let via = HttpParent::start().await?;
    // pac.test is unknown to the mediator's resolver: only the parent can reach it.
    let url = format!("http://pac.test:{}/proxy.pac", server.port());
    let fx = Fixture::start(
        mediator()
            .upstream_line("mode = \"pac\"")
            .upstream_line(&format!("pac = {url:?}"))
            .upstream_line(&format!("pac_fetch_via = \"http://{}\"", via.addr()))
            .upstream_line("pac_refresh_secs = 0")
            .authority(agent_a_spec()),
    )
    .await?;
    let seen = via.wait_requests(1).await?;
    assert!(
        seen[0].starts_with(&format!("GET {url} HTTP/1.1\r\n")),
        "{seen:?}"
    );
    assert_eq!(server.fetches(), 1);
    assert_eq!(tunnel_status(&fx, ORIGIN_HOST).await?, 200);
    assert_eq!(route_of(&fx, ORIGIN_HOST).await?, "direct");
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(pac_routes_by_host_shexpmatch_and_isinnet_dnsresolve),
        case!(pac_fallback_list_with_the_first_parent_down),
        case!(pac_may_name_only_allowed_parents),
        case!(infinite_loop_and_huge_allocation_are_cut_off),
        case!(pac_answers_are_cached_per_host_and_urls_have_no_path),
        case!(pac_from_http_url_refreshes_and_keeps_the_last_good_copy),
        case!(no_usable_pac_at_start_fails_closed),
        case!(https_pac_is_verified_against_the_configured_trust),
        case!(pac_is_fetched_through_pac_fetch_via),
    ]
}
