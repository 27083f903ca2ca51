//! Negotiate (Kerberos, RFC 4559) parent authentication, for real: an MIT KDC started by
//! the test on loopback with a throwaway realm, a parent that demands Negotiate (Squid with
//! its `negotiate_kerberos_auth` helper, or a recording parent that checks tokens with
//! GSSAPI and its service keytab), and curl through the mediator. The mediator
//! gets `KRB5_CONFIG` for the realm and its credentials from `kerberos_ccache` (a `kinit`
//! ccache) or `kerberos_keytab` (a client keytab). Wrong, expired or missing credentials
//! are `upstream_failure` with a detail that names the parent and what failed; no token
//! ever reaches the log.

use anyhow::{Context, Result, ensure};
use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use e2e::kerberos::{Acceptor, Kdc, REALM};
use e2e::parent::{HttpParent, HttpParentMode};
use e2e::squid::Squid;
use e2e::tls::TestCa;
use e2e::{
    AGENT_A, Fixture, LOOPBACK, MediatorBuilder, ORIGIN_HOST, TOKEN_A, agent_a_spec,
    check_contains, proxy_authorization,
};
use serde_json::json;

use crate::support::mediator;

/// The parent's name: its service principal is `HTTP/proxy.e2e.test`.
const PARENT_HOST: &str = "proxy.e2e.test";

/// A realm with the user `alice` (password `alice-pw`) and the parent's service principal,
/// and the parent's keytab.
async fn realm() -> Result<(Kdc, std::path::PathBuf)> {
    let kdc = Kdc::start().await?;
    kdc.add_user("alice", "alice-pw").await?;
    kdc.add_service(PARENT_HOST).await?;
    let keytab = kdc
        .keytab(&format!("HTTP/{PARENT_HOST}"), "parent.keytab")
        .await?;
    Ok((kdc, keytab))
}

/// `mode = "parent"` through `url` with Negotiate, the realm's `krb5.conf`, and `creds`
/// (`kerberos_ccache = ...` / `kerberos_keytab = ...` lines).
fn negotiate_mediator(kdc: &Kdc, url: &str, creds: &[String]) -> MediatorBuilder {
    let host_port = url.split_once("://").map_or(url, |(_, r)| r);
    let mut b = mediator()
        .upstream_line("mode = \"parent\"")
        .upstream_line(&format!("parents = [{url:?}]"))
        .upstream_line(&format!(
            "parent_auth = {{ {host_port:?} = \"negotiate\" }}"
        ))
        .env("KRB5_CONFIG", &kdc.krb5_conf().display().to_string())
        .authority(agent_a_spec());
    for line in creds {
        b = b.upstream_line(line);
    }
    b
}

/// An HTTP parent demanding Negotiate with the service keys of `keytab`, and a mediator
/// routing through it with the credentials of `ccache` (the parent's name resolving to
/// loopback); the parent's URL as the mediator names it.
async fn kerberos_parent(
    kdc: &Kdc,
    keytab: &std::path::Path,
    ccache: &str,
) -> Result<(HttpParent, String, Fixture)> {
    let parent =
        HttpParent::start_with(None, HttpParentMode::Negotiate(Acceptor::new(keytab))).await?;
    let url = format!("http://{PARENT_HOST}:{}", parent.addr().port());
    let fx = Fixture::start(negotiate_mediator(
        kdc,
        &url,
        &[format!("kerberos_ccache = {ccache:?}")],
    ))
    .await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    Ok((parent, url, fx))
}

async fn curl_reaches_the_origin_through_a_kerberos_parent() -> Result<()> {
    let (kdc, keytab) = realm().await?;
    let ccache = kdc.kinit("alice", "alice-pw", "alice.ccache", "1h").await?;
    let (parent, url, fx) = kerberos_parent(&kdc, &keytab, &ccache).await?;
    let target = format!("http://{}/through-kerberos", fx.origin_target());
    let out = fx
        .mediator
        .curl_via("http", (AGENT_A, TOKEN_A), &["-sS", "-p", &target])
        .await?;
    assert_eq!(out.exit_code, 0, "curl: {out:?}");
    assert!(out.body.contains("/through-kerberos"), "{out:?}");
    let notes = parent.wait_note("principal").await?;
    assert!(
        notes.contains(&format!("principal alice@{REALM}")),
        "the parent saw alice's ticket: {notes:?}"
    );
    let seen = parent.wait_requests(2).await?;
    assert!(
        !seen[0].to_ascii_lowercase().contains("proxy-authorization"),
        "the first CONNECT carries no credentials: {:?}",
        seen[0]
    );
    assert!(
        seen[1].contains("Proxy-Authorization: Negotiate "),
        "the retry carries the token: {:?}",
        seen[1]
    );
    let token = seen[1]
        .lines()
        .find_map(|l| l.strip_prefix("Proxy-Authorization: Negotiate "))
        .unwrap_or_default()
        .to_owned();
    let line = fx
        .mediator
        .expect_allow(
            ORIGIN_HOST,
            &[
                ("route", json!(format!("parent {url}"))),
                ("protocol", json!("connect")),
            ],
        )
        .await?;
    fx.mediator.wait_for_close(&line["id"]).await?;
    assert!(token.len() > 100, "a real SPNEGO token: {token}");
    fx.mediator.expect_log_lacks(&token)?;
    fx.mediator.expect_log_lacks(&token[..40])?;
    Ok(())
}

async fn squid_with_negotiate_kerberos_auth_lets_the_mediator_through() -> Result<()> {
    let (kdc, keytab) = realm().await?;
    let ccache = kdc.kinit("alice", "alice-pw", "alice.ccache", "1h").await?;
    let squid = Squid::start_negotiate(&kdc, PARENT_HOST, &keytab, &[ORIGIN_HOST]).await?;
    let url = format!("http://{PARENT_HOST}:{}", squid.addr().port());
    let fx = Fixture::start(negotiate_mediator(
        &kdc,
        &url,
        &[format!("kerberos_ccache = {ccache:?}")],
    ))
    .await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    let port = fx.origin.port();
    // A tunnel: Squid answers 407, the mediator retries with the token.
    let target = format!("http://{}/tunnel", fx.origin_target());
    let out = fx
        .mediator
        .curl_via("http", (AGENT_A, TOKEN_A), &["-sS", "-p", &target])
        .await?;
    assert_eq!(out.exit_code, 0, "curl: {out:?}");
    assert!(out.body.contains("/tunnel"), "{out:?}");
    squid
        .wait_access(&["TCP_DENIED/407", &format!("CONNECT 127.0.0.1:{port}")])
        .await?;
    squid
        .wait_access(&["TCP_TUNNEL/200", &format!("alice@{REALM}")])
        .await?;
    // Plain HTTP: absolute-form, the token with the first request, two requests on the
    // authenticated connection.
    let first = format!("http://{}/plain-1", fx.origin_target());
    let second = format!("http://{}/plain-2", fx.origin_target());
    let out = fx
        .mediator
        .curl_via("http", (AGENT_A, TOKEN_A), &["-sS", &first, &second])
        .await?;
    assert_eq!(out.exit_code, 0, "curl: {out:?}");
    assert!(
        out.body.contains("/plain-1") && out.body.contains("/plain-2"),
        "{out:?}"
    );
    squid
        .wait_access(&["/plain-2", &format!("alice@{REALM}")])
        .await?;
    fx.mediator
        .expect_allow(
            ORIGIN_HOST,
            &[
                ("protocol", json!("connect")),
                ("route", json!(format!("parent {url}"))),
            ],
        )
        .await?;
    Ok(())
}

async fn a_client_keytab_and_plain_http_through_an_https_kerberos_parent() -> Result<()> {
    let (kdc, keytab) = realm().await?;
    // The mediator's own principal, with a client keytab and no ccache of its own yet
    // (KRB5_CLIENT_KTNAME semantics: initial credentials come from the keytab).
    kdc.add_user("mediator", "unused-pw").await?;
    let client_keytab = kdc.keytab("mediator", "mediator.keytab").await?;
    let ca_dir = tempfile::tempdir()?;
    let ca = TestCa::create(ca_dir.path())?;
    let parent = HttpParent::start_tls(
        &ca.ca,
        PARENT_HOST,
        HttpParentMode::Negotiate(Acceptor::new(&keytab)),
    )
    .await?;
    let url = format!("https://{PARENT_HOST}:{}", parent.addr().port());
    let ccache = format!("FILE:{}", kdc.path("mediator.ccache").display());
    let fx = Fixture::start(
        negotiate_mediator(
            &kdc,
            &url,
            &[
                format!(
                    "kerberos_keytab = {:?}",
                    client_keytab.display().to_string()
                ),
                format!("kerberos_ccache = {ccache:?}"),
            ],
        )
        .extra_toml(&format!(
            "[tls]\nextra_ca_files = [{:?}]\n",
            ca.pem_path.display().to_string()
        )),
    )
    .await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    // Plain HTTP: absolute-form to the parent, the token on the connection's first request.
    let target = fx.origin_target();
    let mut conn = fx.tcp_conn().await?;
    let req = format!(
        "GET http://{target}/plain HTTP/1.1\r\n{}\r\n",
        proxy_authorization(AGENT_A, TOKEN_A)
    );
    let resp = conn.request(req.as_bytes()).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let notes = parent.wait_note("principal").await?;
    assert!(
        notes.contains(&format!("principal mediator@{REALM}")),
        "{notes:?}"
    );
    // A tunnel: the 407 dance inside the parent's TLS.
    let resp = fx.tunnel_get("origin.test", "/tunnel").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = parent.wait_requests(3).await?;
    assert!(
        seen[0].starts_with(&format!("GET http://{target}/plain")),
        "{seen:?}"
    );
    assert!(
        seen[0]
            .to_ascii_lowercase()
            .contains("proxy-authorization: negotiate "),
        "{seen:?}"
    );
    assert!(seen[1].starts_with("CONNECT "), "{seen:?}");
    fx.mediator
        .expect_allow(ORIGIN_HOST, &[("route", json!(format!("parent {url}")))])
        .await?;
    Ok(())
}

async fn a_ticket_the_parent_cannot_accept_is_refused_with_a_clear_detail() -> Result<()> {
    let (kdc, stale_keytab) = realm().await?;
    // A new key for the service: the KDC now issues tickets the parent's (old) keytab
    // cannot decrypt.
    kdc.keytab(&format!("HTTP/{PARENT_HOST}"), "rotated.keytab")
        .await?;
    let ccache = kdc.kinit("alice", "alice-pw", "alice.ccache", "1h").await?;
    let (parent, url, fx) = kerberos_parent(&kdc, &stale_keytab, &ccache).await?;
    let resp = fx
        .connect(&fx.origin_target(), Some((AGENT_A, TOKEN_A)))
        .await?;
    let denial = fx
        .mediator
        .expect_deny(&resp, 502, "upstream_failure", Some(ORIGIN_HOST), &[])
        .await?;
    check_contains(&denial.body, "detail", &url)?;
    check_contains(
        &denial.body,
        "detail",
        "refused the Kerberos (Negotiate) credentials",
    )?;
    let notes = parent.wait_note("refused").await?;
    assert!(
        !notes.iter().any(|n| n.starts_with("principal")),
        "{notes:?}"
    );
    Ok(())
}

async fn expired_or_missing_credentials_are_refused_before_the_parent_sees_a_token() -> Result<()> {
    let (kdc, keytab) = realm().await?;
    let ccache = kdc.kinit("alice", "alice-pw", "short.ccache", "3s").await?;
    kdc.wait_expired(
        &ccache,
        &format!("HTTP/{PARENT_HOST}"),
        std::time::Duration::from_secs(30),
    )
    .await?;
    let (parent, url, fx) = kerberos_parent(&kdc, &keytab, &ccache).await?;
    let resp = fx
        .connect(&fx.origin_target(), Some((AGENT_A, TOKEN_A)))
        .await?;
    let denial = fx
        .mediator
        .expect_deny(&resp, 502, "upstream_failure", Some(ORIGIN_HOST), &[])
        .await?;
    check_contains(&denial.body, "detail", &url)?;
    check_contains(&denial.body, "detail", "demands Negotiate (Kerberos)")?;
    check_contains(&denial.body, "detail", "expired")?;

    // No credentials at all: a ccache that does not exist.
    let missing = format!("FILE:{}", kdc.path("nobody.ccache").display());
    let fx = Fixture::start(negotiate_mediator(
        &kdc,
        &url,
        &[format!("kerberos_ccache = {missing:?}")],
    ))
    .await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    let resp = fx
        .connect(&fx.origin_target(), Some((AGENT_A, TOKEN_A)))
        .await?;
    let denial = fx
        .mediator
        .expect_deny(&resp, 502, "upstream_failure", Some(ORIGIN_HOST), &[])
        .await?;
    check_contains(&denial.body, "detail", &url)?;
    check_contains(&denial.body, "detail", "no usable Kerberos credentials")?;
    let seen = parent.requests();
    assert!(
        seen.iter()
            .all(|r| !r.contains("Proxy-Authorization: Negotiate")),
        "no token was sent: {seen:?}"
    );
    Ok(())
}

/// `GET http://<origin>/<path>` through the mediator in absolute-form (plain HTTP).
async fn plain_get(fx: &Fixture, path: &str) -> Result<e2e::HttpResponse> {
    let mut conn = fx.tcp_conn().await?;
    let req = format!(
        "GET http://{}/{path} HTTP/1.1\r\n{}\r\n",
        fx.origin_target(),
        proxy_authorization(AGENT_A, TOKEN_A)
    );
    conn.request(req.as_bytes()).await
}

async fn plain_http_through_a_kerberos_parent_says_what_failed() -> Result<()> {
    let (kdc, stale_keytab) = realm().await?;
    kdc.keytab(&format!("HTTP/{PARENT_HOST}"), "rotated.keytab")
        .await?;
    let ccache = kdc.kinit("alice", "alice-pw", "alice.ccache", "1h").await?;
    let creds = [format!("kerberos_ccache = {ccache:?}")];

    // The parent cannot accept the ticket: a 407 after the token.
    let parent = HttpParent::start_with(
        None,
        HttpParentMode::Negotiate(Acceptor::new(&stale_keytab)),
    )
    .await?;
    let url = format!("http://{PARENT_HOST}:{}", parent.addr().port());
    let fx = Fixture::start(negotiate_mediator(&kdc, &url, &creds)).await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    let resp = plain_get(&fx, "stale").await?;
    let denial = fx
        .mediator
        .expect_deny(&resp, 502, "upstream_failure", Some(ORIGIN_HOST), &[])
        .await?;
    check_contains(&denial.body, "detail", &url)?;
    check_contains(
        &denial.body,
        "detail",
        "refused the Kerberos (Negotiate) credentials",
    )?;
    check_contains(&denial.body, "hint", "HTTP@proxy.e2e.test")?;
    parent.wait_note("refused").await?;

    // A parent that wants Basic, not Negotiate.
    let basic = HttpParent::start_with(Some(("u", "p")), HttpParentMode::Serve).await?;
    let url = format!("http://{PARENT_HOST}:{}", basic.addr().port());
    let fx = Fixture::start(negotiate_mediator(&kdc, &url, &creds)).await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    let resp = plain_get(&fx, "basic").await?;
    let denial = fx
        .mediator
        .expect_deny(&resp, 502, "upstream_failure", Some(ORIGIN_HOST), &[])
        .await?;
    check_contains(&denial.body, "detail", &url)?;
    check_contains(
        &denial.body,
        "detail",
        "407 without offering Negotiate (it offers Basic)",
    )?;
    check_contains(&denial.body, "hint", "parent_auth")?;
    Ok(())
}

async fn a_forged_mutual_authentication_token_is_refused_on_both_paths() -> Result<()> {
    let (kdc, keytab) = realm().await?;
    let ccache = kdc.kinit("alice", "alice-pw", "alice.ccache", "1h").await?;
    let parent = HttpParent::start_with(
        None,
        HttpParentMode::NegotiateForged(Acceptor::new(&keytab)),
    )
    .await?;
    let url = format!("http://{PARENT_HOST}:{}", parent.addr().port());
    let fx = Fixture::start(negotiate_mediator(
        &kdc,
        &url,
        &[format!("kerberos_ccache = {ccache:?}")],
    ))
    .await?;
    fx.resolve(&[PARENT_HOST], LOOPBACK);
    let resp = plain_get(&fx, "forged").await?;
    assert!(
        !resp.text().contains("forged"),
        "the parent's answer never reaches the client: {}",
        resp.text()
    );
    let denial = fx
        .mediator
        .expect_deny(&resp, 502, "upstream_failure", Some(ORIGIN_HOST), &[])
        .await?;
    check_contains(&denial.body, "detail", &url)?;
    check_contains(&denial.body, "detail", "mutual authentication failed")?;

    let resp = fx
        .connect(&fx.origin_target(), Some((AGENT_A, TOKEN_A)))
        .await?;
    let body = e2e::check_deny(&resp, 502, "upstream_failure")?;
    check_contains(&body, "detail", "mutual authentication failed")?;
    Ok(())
}

async fn check_says_which_parent_settings_cannot_be_meant() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let parent = |extra: &[&str]| {
        let mut b = mediator()
            .upstream_line("mode = \"parent\"")
            .upstream_line("parents = [\"http://u:p@proxy.e2e.test:3128\"]")
            .authority(agent_a_spec());
        for line in extra {
            b = b.upstream_line(line);
        }
        b
    };
    // A parent_auth key that matches no parent: a warning.
    let (status, out) = parent(&["parent_auth = { \"proxy.e2e.test:3129\" = \"basic\" }"])
        .check()
        .await?;
    assert!(
        status.success()
            && out.contains("parent_auth names proxy.e2e.test:3129, which is no parent"),
        "{out}"
    );
    // Negotiate and a user:password for the same parent: refused.
    let (status, out) = parent(&["parent_auth = { \"proxy.e2e.test:3128\" = \"negotiate\" }"])
        .check()
        .await?;
    assert!(
        !status.success()
            && out
                .contains("Negotiate (parent_auth or parent_credentials_file) and a user:password"),
        "{out}"
    );
    // The same through a credentials file's `negotiate` line.
    let creds = dir.path().join("parents.cred");
    std::fs::write(&creds, "proxy.e2e.test:3128 negotiate\n")?;
    let (status, out) = parent(&[&format!(
        "parent_credentials_file = {:?}",
        creds.display().to_string()
    )])
    .check()
    .await?;
    assert!(
        !status.success() && out.contains("and a user:password are both configured"),
        "{out}"
    );
    // A kerberos_keytab that does not exist: refused as a start would be useless.
    let keytab = dir.path().join("missing.keytab");
    let (status, out) = mediator()
        .upstream_line("mode = \"parent\"")
        .upstream_line("parents = [\"http://proxy.e2e.test:3128\"]")
        .upstream_line("parent_auth = { \"proxy.e2e.test:3128\" = \"negotiate\" }")
        .upstream_line(&format!(
            "kerberos_keytab = {:?}",
            keytab.display().to_string()
        ))
        .authority(agent_a_spec())
        .check()
        .await?;
    assert!(
        !status.success() && out.contains("kerberos_keytab") && out.contains("missing.keytab"),
        "{out}"
    );
    Ok(())
}

/// A config with a Negotiate parent: `mediator check` (and a start) load the GSSAPI
/// library and say which file; a config without one never loads it (the running
/// mediator's mappings hold no `libgssapi_krb5`).
async fn the_gssapi_library_is_loaded_only_for_a_negotiate_parent() -> Result<()> {
    let negotiate = mediator()
        .upstream_line("mode = \"parent\"")
        .upstream_line("parents = [\"http://proxy.e2e.test:3128\"]")
        .upstream_line("parent_auth = { \"proxy.e2e.test:3128\" = \"negotiate\" }")
        .authority(agent_a_spec());
    let (status, out) = negotiate.check().await?;
    ensure!(
        status.success() && out.contains("GSSAPI: loaded /") && out.contains("libgssapi_krb5"),
        "{out}"
    );
    let running = negotiate.start().await?;
    ensure!(
        mapped(&running, "libgssapi_krb5")?,
        "a Negotiate parent's mediator has not loaded the library"
    );
    let (status, out) = mediator().authority(agent_a_spec()).check().await?;
    ensure!(status.success() && !out.contains("GSSAPI"), "{out}");
    let plain = mediator()
        .upstream_line("mode = \"parent\"")
        .upstream_line("parents = [\"http://proxy.e2e.test:3128\"]")
        .authority(agent_a_spec())
        .start()
        .await?;
    ensure!(
        !mapped(&plain, "libgssapi_krb5")?,
        "a mediator without a Negotiate parent loaded the GSSAPI library"
    );
    Ok(())
}

/// Whether the running mediator has a file whose path contains `needle` mapped.
fn mapped(m: &e2e::Mediator, needle: &str) -> Result<bool> {
    let pid = m.pid().context("the mediator's pid")?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(maps.lines().any(|l| l.contains(needle)))
}

/// `gssapi_library` names the file to load: one that is no library is refused naming it
/// and the packages that ship the real one; a relative path is a config error; a library
/// without `gss_acquire_cred_from` (MIT krb5 before 1.11, here a stub built with `cc`)
/// works with the default credentials but refuses `kerberos_ccache`.
async fn gssapi_library_names_the_file_and_is_checked_before_it_loads() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let with = |library: &str, extra: &[&str]| {
        let mut b = mediator()
            .upstream_line("mode = \"parent\"")
            .upstream_line("parents = [\"http://proxy.e2e.test:3128\"]")
            .upstream_line("parent_auth = { \"proxy.e2e.test:3128\" = \"negotiate\" }")
            .upstream_line(&format!("gssapi_library = {library:?}"))
            .authority(agent_a_spec());
        for line in extra {
            b = b.upstream_line(line);
        }
        b
    };
    let junk = dir.path().join("libjunk.so");
    std::fs::write(&junk, "not a library")?;
    let (status, out) = with(&junk.display().to_string(), &[]).check().await?;
    ensure!(
        !status.success()
            && out.contains("cannot load the GSSAPI library")
            && out.contains("libjunk.so")
            && out.contains("libgssapi-krb5-2 on Debian/Ubuntu, krb5-libs on Fedora/RHEL"),
        "{out}"
    );
    let (status, out) = with("libgssapi_krb5.so.2", &[]).check().await?;
    ensure!(
        !status.success() && out.contains("gssapi_library: write an absolute path"),
        "{out}"
    );
    let stub = stub_library(dir.path()).await?;
    let (status, out) = with(&stub.display().to_string(), &[]).check().await?;
    ensure!(
        status.success() && out.contains("credential store: no, gss_acquire_cred_from missing"),
        "{out}"
    );
    let (status, out) = with(
        &stub.display().to_string(),
        &["kerberos_ccache = \"FILE:/tmp/krb5cc_e2e\""],
    )
    .check()
    .await?;
    ensure!(
        !status.success()
            && out.contains("has no gss_acquire_cred_from (MIT krb5 1.11 or later)")
            && out.contains("kerberos_ccache and kerberos_keytab cannot be used"),
        "{out}"
    );
    Ok(())
}

/// Builds a GSSAPI library with every function the mediator resolves but
/// `gss_acquire_cred_from` (each fails with `GSS_S_FAILURE`), as an old MIT krb5 or another
/// implementation would lack it.
async fn stub_library(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let names = [
        "gss_import_name",
        "gss_display_name",
        "gss_release_name",
        "gss_acquire_cred",
        "gss_release_cred",
        "gss_init_sec_context",
        "gss_accept_sec_context",
        "gss_delete_sec_context",
        "gss_release_buffer",
        "gss_display_status",
    ];
    let source: String = names
        .iter()
        .map(|n| format!("unsigned int {n}(void) {{ return 13u << 16; }}\n"))
        .collect();
    let c = dir.join("stub.c");
    std::fs::write(&c, source)?;
    let lib = dir.join("libgssapi_stub.so");
    let out = Tool::Cc
        .command("cc")?
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&c)
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(lib)
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(the_gssapi_library_is_loaded_only_for_a_negotiate_parent),
        case!(gssapi_library_names_the_file_and_is_checked_before_it_loads).needs(&[Tool::Cc]),
        case!(curl_reaches_the_origin_through_a_kerberos_parent)
            .needs(&[Tool::Curl, Tool::Kerberos]),
        case!(squid_with_negotiate_kerberos_auth_lets_the_mediator_through).needs(&[
            Tool::Curl,
            Tool::Kerberos,
            Tool::Squid,
        ]),
        case!(a_client_keytab_and_plain_http_through_an_https_kerberos_parent)
            .needs(&[Tool::Kerberos]),
        case!(a_ticket_the_parent_cannot_accept_is_refused_with_a_clear_detail)
            .needs(&[Tool::Kerberos]),
        case!(expired_or_missing_credentials_are_refused_before_the_parent_sees_a_token)
            .needs(&[Tool::Kerberos]),
        case!(plain_http_through_a_kerberos_parent_says_what_failed).needs(&[Tool::Kerberos]),
        case!(a_forged_mutual_authentication_token_is_refused_on_both_paths)
            .needs(&[Tool::Kerberos]),
        case!(check_says_which_parent_settings_cannot_be_meant),
    ]
}
