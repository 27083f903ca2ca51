//! `[upstream] mode = "system"`: the desktop's proxy settings, from fixture files only
//! (never the machine's own): a GNOME dconf database compiled by the test with `dconf
//! compile` from a keyfile, a KDE `kioslaverc`, then the environment. The first source
//! that holds a setting decides; a PAC URL is used as `mode = "pac"` would use it, WPAD
//! never; `mediator check` and `explain` say which source was used and what it said;
//! SIGHUP reads the settings again.

use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use e2e::parent::{HttpParent, PacServer};
use e2e::{AGENT_A, Fixture, MediatorBuilder, ORIGIN_HOST, agent_a_spec};
use nix::sys::signal::Signal;
use serde_json::json;

use crate::support::mediator;

/// Writes the dconf database `<dir>/<name>` holding the keyfile `keyfile` (GVariant text
/// values) with gvdb's writer, as `dconf compile` would.
fn dconf_db(dir: &Path, name: &str, keyfile: &str) -> Result<PathBuf> {
    let out = dir.join(name);
    e2e::dconf::write_db(&out, keyfile)?;
    Ok(out)
}

/// Compiles the dconf keyfile `keyfile` into the database `<dir>/<name>` with the real
/// `dconf compile` (package dconf-cli).
async fn dconf_compile(dir: &Path, name: &str, keyfile: &str) -> Result<PathBuf> {
    let src = dir.join(format!("{name}.d"));
    std::fs::create_dir_all(&src)?;
    std::fs::write(src.join("00-proxy"), keyfile)?;
    let out = dir.join(name);
    let status = Tool::Dconf
        .command("dconf")?
        .arg("compile")
        .arg(&out)
        .arg(&src)
        .status()
        .await
        .context("running dconf compile")?;
    ensure!(status.success(), "dconf compile failed");
    Ok(out)
}

/// The databases the other tests write with gvdb read exactly as those `dconf compile`
/// makes: every kind of value they use (strings, an int32 port, booleans, a string
/// array), one `mediator check` on each, the same reading but for the file's name.
async fn a_database_from_dconf_compile_reads_as_the_one_the_tests_write() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let keyfile = "[system/proxy]\nmode='manual'\nuse-same-proxy=false\n\
                   ignore-hosts=['*.internal.test', 'localhost']\n\n\
                   [system/proxy/https]\nhost='127.0.0.1'\nport=3129\n\n\
                   [system/proxy/http]\nhost='127.0.0.1'\nport=3128\n\
                   use-authentication=@b false\n";
    let compiled = dconf_compile(dir.path(), "compiled", keyfile).await?;
    let written = dconf_db(dir.path(), "written", keyfile)?;
    let kde = dir.path().join("kioslaverc");
    std::fs::write(&kde, "[Proxy Settings]\nProxyType=0\n")?;
    let mut readings = Vec::new();
    for db in [&compiled, &written] {
        let (status, out) = system_mode(&[db], &[&kde]).check().await?;
        ensure!(status.success(), "{out}");
        let line = out
            .lines()
            .find(|l| l.contains("upstream: system: GNOME"))
            .with_context(|| format!("no GNOME reading in {out}"))?;
        readings.push(line.replace(&db.display().to_string(), "DB"));
    }
    ensure!(
        readings[0] == readings[1]
            && readings[0].contains("3129")
            && readings[0].contains("*.internal.test"),
        "dconf compile: {}\ngvdb writer:   {}",
        readings[0],
        readings[1]
    );
    Ok(())
}

/// `mode = "system"` reading exactly `dconf` and `kioslaverc` (fixture paths).
fn system_mode(dconf: &[&Path], kioslaverc: &[&Path]) -> MediatorBuilder {
    let list = |paths: &[&Path]| {
        let quoted: Vec<String> = paths
            .iter()
            .map(|p| format!("{:?}", p.display().to_string()))
            .collect();
        format!("[{}]", quoted.join(", "))
    };
    mediator()
        .upstream_line("mode = \"system\"")
        .upstream_line(&format!("dconf_databases = {}", list(dconf)))
        .upstream_line(&format!("kioslaverc_files = {}", list(kioslaverc)))
        .authority(agent_a_spec())
}

async fn gnome_manual_settings_route_through_their_parents() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tunnels = HttpParent::start().await?;
    let plain = HttpParent::start().await?;
    let db = dconf_db(
        dir.path(),
        "local",
        &format!(
            "[system/proxy]\nmode='manual'\nignore-hosts=['*.internal.test', 'localhost']\n\n\
             [system/proxy/https]\nhost='127.0.0.1'\nport={}\n\n\
             [system/proxy/http]\nhost='127.0.0.1'\nport={}\n",
            tunnels.addr().port(),
            plain.addr().port()
        ),
    )?;
    let kde = dir.path().join("kioslaverc");
    std::fs::write(&kde, "[Proxy Settings]\nProxyType=0\n")?;
    let builder = system_mode(&[&db], &[&kde]);
    let (status, out) = builder.check().await?;
    assert!(status.success(), "{out}");
    let tunnel_url = format!("http://{}", tunnels.addr());
    assert!(
        out.contains(&format!("upstream: system: GNOME (dconf {})", db.display()))
            && out.contains("mode 'manual'")
            && out.contains(&format!("tunnels via parent {tunnel_url}")),
        "check says which source was used and what it said: {out}"
    );
    assert_eq!(
        out.matches(&format!("GNOME (dconf {})", db.display()))
            .count(),
        1,
        "check says it once: {out}"
    );
    let fx = Fixture::start(builder).await?;
    let resp = fx.tunnel_get("origin.test", "/gnome").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    tunnels.wait_requests(1).await?;
    fx.mediator
        .expect_allow(
            ORIGIN_HOST,
            &[("route", json!(format!("parent {tunnel_url}")))],
        )
        .await?;
    let out = fx
        .mediator
        .cli("explain", &["--authority", AGENT_A, "origin.test:443"])
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("upstream: system: GNOME"), "{text}");
    // Plain HTTP goes to GNOME's HTTP proxy.
    let curl = fx
        .mediator
        .curl_via(
            "http",
            (AGENT_A, e2e::TOKEN_A),
            &["-sS", &format!("http://{}/plain", fx.origin_target())],
        )
        .await?;
    assert_eq!(curl.http_code, 200, "{curl:?}");
    plain.wait_requests(1).await?;
    Ok(())
}

async fn a_gnome_autoconfig_url_is_a_pac_and_wpad_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let parent = HttpParent::start().await?;
    let pac = PacServer::start(&format!(
        "function FindProxyForURL(url, host) {{ return \"PROXY {}\"; }}",
        parent.addr()
    ))
    .await?;
    let db = dconf_db(
        dir.path(),
        "auto",
        &format!(
            "[system/proxy]\nmode='auto'\nautoconfig-url='{}'\n",
            pac.url()
        ),
    )?;
    let fx = Fixture::start(
        system_mode(&[&db], &[])
            .upstream_line(&format!("allowed_parents = [\"{}\"]", parent.addr())),
    )
    .await?;
    let resp = fx.tunnel_get("origin.test", "/pac").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    parent.wait_requests(1).await?;

    let wpad = dconf_db(dir.path(), "wpad", "[system/proxy]\nmode='auto'\n")?;
    let err = system_mode(&[&wpad], &[]).start_err().await?;
    assert!(
        err.contains("WPAD") && err.contains(&wpad.display().to_string()),
        "a WPAD setting stops the start and says why: {err}"
    );
    Ok(())
}

async fn without_gnome_settings_kde_decides_then_the_environment() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let kde_parent = HttpParent::start().await?;
    let env_parent = HttpParent::start().await?;
    // A GNOME database that sets nothing about proxies does not decide.
    let db = dconf_db(
        dir.path(),
        "other",
        "[org/gnome/desktop/interface]\nclock-format='24h'\n",
    )?;
    let kde = dir.path().join("kioslaverc");
    std::fs::write(
        &kde,
        format!(
            "[Proxy Settings]\nProxyType=1\nhttpsProxy=http://127.0.0.1 {}\nNoProxyFor=localhost\n",
            kde_parent.addr().port()
        ),
    )?;
    let env_url = format!("http://{}", env_parent.addr());
    let fx = Fixture::start(system_mode(&[&db], &[&kde]).env("HTTPS_PROXY", &env_url)).await?;
    let resp = fx.tunnel_get("origin.test", "/kde").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    kde_parent.wait_requests(1).await?;
    assert!(env_parent.requests().is_empty());
    fx.mediator
        .wait_for_stderr(
            |l| l.contains("upstream system: KDE") && l.contains("httpsProxy="),
            e2e::LOG_TIMEOUT,
        )
        .await?;

    let builder = system_mode(&[&db], &[]).env("HTTPS_PROXY", &env_url);
    let fx = Fixture::start(builder).await?;
    let resp = fx.tunnel_get("origin.test", "/env").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    env_parent.wait_requests(1).await?;
    fx.mediator
        .expect_allow(
            ORIGIN_HOST,
            &[("route", json!(format!("parent {env_url}")))],
        )
        .await?;
    fx.mediator
        .wait_for_stderr(
            |l| l.contains("upstream system: the environment"),
            e2e::LOG_TIMEOUT,
        )
        .await?;
    Ok(())
}

async fn sighup_reads_the_settings_again() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let first = HttpParent::start().await?;
    let second = HttpParent::start().await?;
    let kde = dir.path().join("kioslaverc");
    let write = |port: u16| {
        std::fs::write(
            &kde,
            format!("[Proxy Settings]\nProxyType=1\nhttpsProxy=http://127.0.0.1:{port}\n"),
        )
    };
    write(first.addr().port())?;
    let fx = Fixture::start(system_mode(&[], &[&kde])).await?;
    let resp = fx.tunnel_get("origin.test", "/one").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    first.wait_requests(1).await?;

    // A bad setting keeps the routing in force.
    std::fs::write(&kde, "[Proxy Settings]\nProxyType=3\n")?;
    fx.mediator.signal(Signal::SIGHUP)?;
    fx.mediator
        .wait_for_stderr(
            |l| l.contains("re-read failed; the routing in force is kept") && l.contains("WPAD"),
            e2e::LOG_TIMEOUT,
        )
        .await?;
    let resp = fx.tunnel_get("origin.test", "/still-one").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    first.wait_requests(2).await?;

    write(second.addr().port())?;
    fx.mediator.signal(Signal::SIGHUP)?;
    let second_url = format!("http://{}", second.addr());
    fx.mediator
        .wait_for_stderr(
            |l| l.contains("upstream system settings re-read") && l.contains(&second_url),
            e2e::LOG_TIMEOUT,
        )
        .await?;
    // The line is printed once the new routing is installed.
    let resp = fx.tunnel_get("origin.test", "/two").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    second.wait_requests(1).await?;
    assert_eq!(first.requests().len(), 2, "{:?}", first.requests());
    Ok(())
}

async fn after_a_reread_a_pac_may_name_only_allowed_parents() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let parent = HttpParent::start().await?;
    let pac = PacServer::start(&format!(
        "function FindProxyForURL(url, host) {{ return \"PROXY {}\"; }}",
        parent.addr()
    ))
    .await?;
    let manual = format!(
        "[system/proxy]\nmode='manual'\n\n[system/proxy/https]\nhost='127.0.0.1'\nport={}\n",
        parent.addr().port()
    );
    let db = dconf_db(dir.path(), "user", &manual)?;
    let fx = Fixture::start(system_mode(&[&db], &[])).await?;
    let resp = fx.tunnel_get("origin.test", "/manual").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    parent.wait_requests(1).await?;

    // The desktop now names a PAC that returns the parent of the manual setting, which is
    // not in allowed_parents (there are none): no route, as at a fresh start.
    dconf_db(
        dir.path(),
        "user",
        &format!(
            "[system/proxy]\nmode='auto'\nautoconfig-url='{}'\n",
            pac.url()
        ),
    )?;
    fx.mediator.signal(Signal::SIGHUP)?;
    fx.mediator
        .wait_for_stderr(
            |l| l.contains("upstream system settings re-read") && l.contains("the PAC"),
            e2e::LOG_TIMEOUT,
        )
        .await?;
    let accepted = parent.accepted();
    let resp = fx.connect_a(&fx.origin_target()).await?;
    let body = e2e::check_deny(&resp, 502, "upstream_failure")?;
    e2e::check_contains(&body, "detail", "allowed_parents")?;
    assert_eq!(
        parent.accepted(),
        accepted,
        "a parent of an earlier reading is not allowed for the PAC"
    );
    Ok(())
}

async fn gnome_use_authentication_gives_the_http_proxy_basic_credentials() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let parent = HttpParent::start_with(Some(("alice", "s3cret")), Default::default()).await?;
    let keyfile = |flag: &str| {
        format!(
            "[system/proxy]\nmode='manual'\n\n\
             [system/proxy/http]\nhost='127.0.0.1'\nport={}\nuse-authentication={flag}\n\
             authentication-user='alice'\nauthentication-password='s3cret'\n",
            parent.addr().port()
        )
    };
    let db = dconf_db(dir.path(), "user", &keyfile("true"))?;
    let builder = system_mode(&[&db], &[]);
    let (status, out) = builder.check().await?;
    assert!(
        status.success() && out.contains("http authentication-user 'alice'"),
        "{out}"
    );
    assert!(!out.contains("s3cret"), "{out}");
    let fx = Fixture::start(builder).await?;
    let curl = fx
        .mediator
        .curl_via(
            "http",
            (AGENT_A, e2e::TOKEN_A),
            &["-sS", &format!("http://{}/auth", fx.origin_target())],
        )
        .await?;
    assert_eq!(curl.http_code, 200, "{curl:?}");
    parent.wait_requests(1).await?;

    // `false` (here as a typed GVariant) means no credentials.
    dconf_db(dir.path(), "user", &keyfile("@b false"))?;
    let (status, out) = system_mode(&[&db], &[]).check().await?;
    assert!(
        status.success() && !out.contains("authentication-user"),
        "{out}"
    );
    Ok(())
}

async fn a_named_settings_file_that_is_missing_or_headerless_is_an_error() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let parent = HttpParent::start().await?;
    let db = dconf_db(
        dir.path(),
        "user",
        &format!(
            "[system/proxy]\nmode='manual'\n\n[system/proxy/https]\nhost='127.0.0.1'\nport={}\n",
            parent.addr().port()
        ),
    )?;
    let missing = dir.path().join("no-such-kioslaverc");
    let (status, out) = system_mode(&[&db], &[&missing]).check().await?;
    assert!(
        !status.success() && out.contains("kioslaverc_files") && out.contains("no-such-kioslaverc"),
        "check refuses a named file that is missing: {out}"
    );
    let headerless = dir.path().join("kioslaverc");
    std::fs::write(&headerless, "ProxyType=0\n")?;
    let err = system_mode(&[], &[&headerless]).start_err().await?;
    assert!(
        err.contains("no [Proxy Settings] group"),
        "start refuses a named kioslaverc without the group: {err}"
    );

    // At start the line says which files were found; a database removed later makes the
    // re-read fail and keeps the routing in force.
    let fx = Fixture::start(system_mode(&[&db], &[])).await?;
    fx.mediator
        .wait_for_stderr(
            |l| {
                l.contains("upstream system: GNOME")
                    && l.contains(&format!("files found: dconf {}", db.display()))
            },
            e2e::LOG_TIMEOUT,
        )
        .await?;
    std::fs::remove_file(&db)?;
    fx.mediator.signal(Signal::SIGHUP)?;
    fx.mediator
        .wait_for_stderr(
            |l| {
                l.contains("re-read failed; the routing in force is kept")
                    && l.contains("dconf_databases")
            },
            e2e::LOG_TIMEOUT,
        )
        .await?;
    let resp = fx.tunnel_get("origin.test", "/kept").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    parent.wait_requests(1).await?;
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(gnome_manual_settings_route_through_their_parents).needs(&[Tool::Curl]),
        case!(a_database_from_dconf_compile_reads_as_the_one_the_tests_write).needs(&[Tool::Dconf]),
        case!(a_gnome_autoconfig_url_is_a_pac_and_wpad_is_refused),
        case!(without_gnome_settings_kde_decides_then_the_environment),
        case!(sighup_reads_the_settings_again),
        case!(after_a_reread_a_pac_may_name_only_allowed_parents),
        case!(gnome_use_authentication_gives_the_http_proxy_basic_credentials).needs(&[Tool::Curl]),
        case!(a_named_settings_file_that_is_missing_or_headerless_is_an_error),
    ]
}
