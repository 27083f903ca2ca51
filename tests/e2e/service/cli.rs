//! The messages of `mediator explain` and `mediator check` that a newcomer reads: a URL
//! given as a target, a name that live traffic would deny after resolving it (only
//! `--resolve` resolves), a placeholder in the host name, the count of authorities.

use crate::support::is;
use anyhow::{Result, ensure};
use e2e::case;
use e2e::harness::Case;
use e2e::mediator::{toml_list, toml_str};
use e2e::{AGENT_A, Fixture, agent_a_spec};
use mediator::vocab::Event;
use policy::Reason;
use std::net::{IpAddr, Ipv4Addr};

use crate::support::mediator;

/// A name that resolves to a private address (RFC 1918) the grant does not except.
const PRIVATE_NAME: &str = "private.test";

async fn fixture() -> Result<Fixture> {
    let fx = Fixture::start(mediator().authority(agent_a_spec().allow(&[PRIVATE_NAME]))).await?;
    fx.dns
        .set(PRIVATE_NAME, [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))]);
    Ok(fx)
}

/// `mediator explain` with `args`: its exit code and stdout.
async fn explain(fx: &Fixture, args: &[&str]) -> Result<(i32, String)> {
    let mut all = vec!["--authority", AGENT_A];
    all.extend_from_slice(args);
    let out = fx.mediator.cli("explain", &all).await?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok((out.status.code().unwrap_or(-1), text))
}

async fn explain_says_a_url_is_not_a_target() -> Result<()> {
    let fx = fixture().await?;
    let (code, text) = explain(&fx, &["http://origin.test:8081/"]).await?;
    ensure!(code == 1, "exit {code}: {text}");
    ensure!(
        text.contains("reason:    malformed_target")
            && text.contains("is a URL; a target is host:port")
            && text.contains("\"origin.test:8081\""),
        "{text}"
    );
    ensure!(!text.contains("must be bracketed"), "{text}");
    ensure!(
        text.contains("hint:      give the target as HOST[:PORT]"),
        "{text}"
    );
    Ok(())
}

async fn explain_resolves_only_with_resolve() -> Result<()> {
    let fx = fixture().await?;
    // Without --resolve: the name decision alone, said to be that, and no DNS query (the
    // config's resolver is the fixture's loopback DNS server, which counts queries).
    for extra in [&[][..], &["--no-resolve"][..]] {
        let mut args = vec![format!("{PRIVATE_NAME}:443")];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, text) = explain(&fx, &args).await?;
        ensure!(code == 0, "exit {code}: {text}");
        ensure!(
            text.contains("decision:  allow")
                && text.contains("rule:      private.test")
                && text.contains("name decision only: not resolved and no address vetted")
                && text.contains("pass --resolve"),
            "{text}"
        );
        ensure!(!text.contains("address:"), "{text}");
        ensure!(
            fx.dns.queries(PRIVATE_NAME) == 0,
            "explain {args:?} resolved"
        );
    }
    let out = fx
        .mediator
        .cli(
            "explain",
            &[
                "--authority",
                AGENT_A,
                &format!("{PRIVATE_NAME}:443"),
                "--json",
            ],
        )
        .await?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure!(v["resolved"] == false && v["decision"] == "allow", "{v}");
    ensure!(fx.dns.queries(PRIVATE_NAME) == 0, "explain --json resolved");
    // With --resolve: one resolution and the vetting, denied as live traffic is.
    let (code, text) = explain(&fx, &[&format!("{PRIVATE_NAME}:443"), "--resolve"]).await?;
    ensure!(code == 1, "exit {code}: {text}");
    ensure!(
        text.contains("decision:  deny") && text.contains("reason:    private_address"),
        "{text}"
    );
    ensure!(text.contains("address:   10.0.0.1 private"), "{text}");
    ensure!(
        fx.dns.queries(PRIVATE_NAME) > 0,
        "--resolve did not resolve"
    );
    Ok(())
}

async fn explain_refuses_a_placeholder_in_the_host_as_live_traffic_does() -> Result<()> {
    // A credential whose placeholder is a valid DNS label, under an allowed `*.wild.test`.
    const LABEL: &str = "ph-t15-github-agent";
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "ghp_explainSecret0\n")?;
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let authority = agent_a_spec()
        .allow(&["*.wild.test", "api.test"])
        .raw(&format!("tls_terminate = {}", toml_list(&["api.test"])))
        .raw("\n[[authority.credential]]")
        .raw("host = \"api.test\"")
        .raw("header = \"Authorization\"")
        .raw(&format!(
            "secret_file = {}",
            toml_str(&secret.display().to_string())
        ))
        .raw("format = \"Bearer {secret}\"")
        .raw(&format!("placeholder = {}", toml_str(LABEL)));
    let fx = Fixture::start(
        mediator()
            .extra_toml(&format!(
                "\n[tls]\nca_dir = {}\n",
                toml_str(&dir.path().join("ca").display().to_string())
            ))
            .authority(authority),
    )
    .await?;
    let name = format!("{LABEL}.wild.test");
    fx.dns.set(&name, [e2e::LOOPBACK]);
    let target = format!("{name}:42101");
    let live = fx.connect_a(&target).await?;
    let body = e2e::check_deny(&live, 403, "credential_misuse")?;
    let line = fx
        .mediator
        .wait_for_log(
            is(|r| r.event == Event::Decision && r.reason == Reason::CredentialMisuse),
            std::time::Duration::from_secs(10),
        )
        .await?;
    for extra in [&[][..], &["--resolve"][..]] {
        let mut args = vec![target.as_str()];
        args.extend_from_slice(extra);
        let (code, text) = explain(&fx, &args).await?;
        ensure!(code == 1, "explain {args:?}: exit {code}: {text}");
        ensure!(
            text.contains("decision:  deny")
                && text.contains("reason:    credential_misuse")
                && text.contains("in the host name itself"),
            "explain {args:?}: {text}"
        );
        ensure!(
            text.contains(&format!(
                "rule:      {}\n",
                line["rule"].as_str().unwrap_or("?")
            )) && text.contains(&format!(
                "detail:    {}\n",
                body["detail"].as_str().unwrap_or("?")
            )),
            "explain {args:?} says other than live traffic ({body}, {line}): {text}"
        );
    }
    // Refused before resolution, by both.
    ensure!(fx.dns.queries(&name) == 0, "{name} was resolved");
    Ok(())
}

async fn check_counts_authorities_in_words() -> Result<()> {
    let (status, out) = mediator().authority(agent_a_spec()).check().await?;
    ensure!(status.success(), "{out}");
    ensure!(out.contains(": OK (1 authority)"), "{out}");
    let (status, out) = mediator()
        .authority(agent_a_spec())
        .authority(e2e::AuthoritySpec::new("agent-b"))
        .check()
        .await?;
    ensure!(
        status.success() && out.contains(": OK (2 authorities)"),
        "{out}"
    );
    Ok(())
}

/// `mediator <args>` with its stdout a pipe whose reader has already gone (`| head -1`
/// after its line): the exit code and stderr.
async fn with_closed_stdout(
    bin: &std::path::Path,
    args: &[&std::ffi::OsStr],
) -> Result<(i32, String)> {
    let (reader, writer) = std::io::pipe()?;
    drop(reader);
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        tokio::process::Command::new(bin)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .output(),
    )
    .await??;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

async fn check_and_explain_end_quietly_when_the_reader_has_gone() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let builder = mediator().authority(agent_a_spec());
    let config = dir.path().join("mediator.toml");
    std::fs::write(&config, builder.render(dir.path()))?;
    let check = [
        std::ffi::OsStr::new("check"),
        "--config".as_ref(),
        config.as_os_str(),
    ];
    let (code, stderr) = with_closed_stdout(builder.bin(), &check).await?;
    ensure!(
        code == 0 && !stderr.contains("panicked"),
        "check | head: exit {code}, {stderr}"
    );
    let explain = [
        std::ffi::OsStr::new("explain"),
        "--config".as_ref(),
        config.as_os_str(),
        "--authority".as_ref(),
        AGENT_A.as_ref(),
        "--no-resolve".as_ref(),
        "origin.test:443".as_ref(),
    ];
    let (code, stderr) = with_closed_stdout(builder.bin(), &explain).await?;
    ensure!(
        code != 101 && !stderr.contains("panicked"),
        "explain | head: exit {code}, {stderr}"
    );
    Ok(())
}
/// `mediator check` warns, with the location, about an allow entry a deny entry refuses
/// whole, and still exits 0.
async fn check_warns_about_an_allow_entry_a_deny_entry_refuses_whole() -> Result<()> {
    let (status, out) = mediator()
        .authority(agent_a_spec().deny(&["*"]))
        .check()
        .await?;
    ensure!(status.success(), "{out}");
    ensure!(
        out.lines().any(|l| l.starts_with("warning: ")
            && l.contains(": authority \"agent-a\": allow entry \"origin.test\" never allows anything: deny entry \"*\" refuses every destination it matches")),
        "{out}"
    );
    Ok(())
}

/// `mediator suggest` reads a real run's decision log and prints a table that `mediator
/// check` accepts, naming the denied destination.
async fn suggest_turns_a_runs_denials_into_a_table_check_accepts() -> Result<()> {
    let fx = crate::support::agent_a().await?;
    let resp = fx.connect_a("blocked.test:443").await?;
    ensure!(resp.status == 403, "{resp:?}");
    fx.mediator
        .wait_for_decision("not_in_allowlist", Some("blocked.test"))
        .await?;
    let log = fx.mediator.log_path().display().to_string();
    let out = e2e::mediator::run(
        crate::support::bin(),
        &["suggest", "--authority", AGENT_A, log.as_str()],
    )
    .await?;
    ensure!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout)?;
    ensure!(
        table.contains("  \"blocked.test:443\", # 1 denial, at "),
        "{table}"
    );
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("suggested.toml");
    std::fs::write(&path, &table)?;
    let (status, check) = e2e::mediator::run_check(crate::support::bin(), &path).await?;
    ensure!(status.success(), "{check}\n{table}");
    Ok(())
}

/// `mediator suggest` on the decision log of the shim's embedded mode (the library's
/// mediator, as the shim runs it: authority `shim`, channel `embedded`) prints the shim
/// flags to add, not an `[[authority]]` table.
async fn suggest_on_an_embedded_runs_log_prints_shim_flags() -> Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("decisions.log");
    let config = policy::config::parse(
        "[registry]\nbackend = \"memory\"\n\n[[authority]]\nname = \"shim\"\nallow = [\"x.test:443\"]\n",
        "embedded",
    )?;
    let running = mediator::start(
        config,
        mediator::Options {
            sink: Some(mediator::Sink::File(log.clone())),
            tap: None,
        },
    )
    .await?;
    let (mut client, server) = tokio::io::duplex(4096);
    ensure!(running.serve_embedded(server, "shim"));
    client
        .write_all(b"CONNECT blocked.test:443 HTTP/1.1\r\nHost: blocked.test:443\r\n\r\n")
        .await?;
    let mut answer = vec![0u8; 4096];
    let n = client.read(&mut answer).await?;
    ensure!(
        answer[..n].starts_with(b"HTTP/1.1 403"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    drop(client);
    running.shutdown().await;
    let path = log.display().to_string();
    let out = e2e::mediator::run(
        crate::support::bin(),
        &["suggest", "--authority", "shim", path.as_str()],
    )
    .await?;
    ensure!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout)?;
    let commands: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    ensure!(commands == ["--allow blocked.test:443"], "{text}");
    ensure!(!text.contains("[[authority]]"), "{text}");
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(explain_says_a_url_is_not_a_target),
        case!(explain_resolves_only_with_resolve),
        case!(explain_refuses_a_placeholder_in_the_host_as_live_traffic_does),
        case!(check_counts_authorities_in_words),
        case!(check_and_explain_end_quietly_when_the_reader_has_gone),
        case!(check_warns_about_an_allow_entry_a_deny_entry_refuses_whole),
        case!(suggest_turns_a_runs_denials_into_a_table_check_accepts),
        case!(suggest_on_an_embedded_runs_log_prints_shim_flags),
    ]
}
