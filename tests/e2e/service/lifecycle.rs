//! Configuration checking and process lifecycle (design sections 5, 11): `mediator
//! check` reports every problem with its location, a bad config refuses to start, and
//! SIGTERM shuts down cleanly and removes the per-authority socket files.

use crate::support::{is, record};
use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use mediator::vocab::{Event, Protocol};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use e2e::mediator::{run, run_check};
use e2e::{
    AGENT_A, AGENT_B, AuthoritySpec, Fixture, ORIGIN_HOST, TOKEN_A, agent_a_spec,
    proxy_authorization, stalled_loopback_listener, wait_until,
};
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::{agent_a, bin, mediator};

/// A config with five independent problems. Each entry: (a string that identifies the
/// problem in a message, the 1-based line it is on).
fn bad_config(dir: &Path) -> (String, Vec<(&'static str, usize)>) {
    let sockets = dir.join("sockets");
    let lines = [
        "[listen]".to_owned(),                                   // 1
        format!("socket_dir = {:?}", sockets.to_string_lossy()), // 2
        "".to_owned(),                                           // 3
        "[[authority]]".to_owned(),                              // 4
        "name = \"dup-name\"".to_owned(),                        // 5
        "allow = [\"ok.test\", \"*.co.uk\"]".to_owned(),         // 6
        "".to_owned(),                                           // 7
        "[[authority]]".to_owned(),                              // 8
        "name = \"second\"".to_owned(),                          // 9
        "allow = [\"a.*.example\"]".to_owned(),                  // 10
        "allow_private = [\"not-a-cidr\"]".to_owned(),           // 11
        "token_sha256 = \"xyz\"".to_owned(),                     // 12
        "".to_owned(),                                           // 13
        "[[authority]]".to_owned(),                              // 14
        "name = \"dup-name\"".to_owned(),                        // 15
        "allow = [\"fine.test\"]".to_owned(),                    // 16
    ];
    let problems = vec![
        ("*.co.uk", 6),
        ("a.*.example", 10),
        ("not-a-cidr", 11),
        ("token_sha256", 12),
        ("dup-name", 15),
    ];
    (lines.join("\n") + "\n", problems)
}

/// SIGTERMs the mediator, checks that it exits cleanly and returns the close record of
/// the (one) CONNECT tunnel.
async fn exit_and_tunnel_close(fx: &mut Fixture) -> Result<Value> {
    let status = fx.mediator.terminate().await?;
    ensure!(status.success(), "exit status {status}");
    let lines = fx.mediator.decision_lines()?;
    lines
        .into_iter()
        .find(is(|r| {
            r.event == Event::Close && r.protocol == Protocol::Connect
        }))
        .ok_or_else(|| anyhow!("no close record: {:?}", fx.mediator.decision_lines()))
}

async fn check_accepts_a_valid_config() -> Result<()> {
    let b = mediator().authority(agent_a_spec()).authority(
        AuthoritySpec::new(AGENT_B)
            .allow(&["*.example.com", "example.com:443"])
            .deny(&["*:25"]),
    );
    let (status, stderr) = b.check().await?;
    ensure!(
        status.success(),
        "check rejected a valid config ({status}):\n{stderr}\nconfig:\n{}",
        b.render(Path::new("<temp dir>"))
    );
    Ok(())
}

async fn check_lists_every_problem_with_its_location() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (text, problems) = bad_config(dir.path());
    let path = dir.path().join("mediator.toml");
    std::fs::write(&path, &text)?;
    let (status, stderr) = run_check(bin(), &path).await?;
    ensure!(
        !status.success(),
        "check accepted a config with {} problems",
        problems.len()
    );
    let file = path.to_string_lossy().into_owned();
    let mut missing = Vec::new();
    for (needle, line_no) in &problems {
        // The problem must be named on a line that also says where: FILE:LINE[:COL] or a
        // key path (`authority[..]`).
        let found = stderr.lines().any(|l| {
            l.contains(needle)
                && (l.contains(&format!("{file}:{line_no}")) || l.contains("authority["))
        });
        if !found {
            missing.push(format!("{needle} (line {line_no})"));
        }
    }
    ensure!(
        missing.is_empty(),
        "`mediator check` did not report, with a location: {missing:?}\nstderr:\n{stderr}"
    );
    Ok(())
}

async fn mediator_refuses_to_start_on_a_bad_config() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (text, _) = bad_config(dir.path());
    let path = dir.path().join("mediator.toml");
    std::fs::write(&path, &text)?;
    let out = run(bin(), &[Path::new("--config"), &path])
        .await
        .context("mediator kept running on a bad config")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "exited 0 on a bad config");
    ensure!(
        !stderr.lines().any(|l| l.starts_with("ready ")),
        "printed ready:\n{stderr}"
    );
    ensure!(
        stderr.contains("a.*.example"),
        "problems not printed:\n{stderr}"
    );
    assert!(!dir.path().join("sockets").join("dup-name.sock").exists());
    Ok(())
}

async fn sigterm_exits_cleanly_and_removes_socket_files() -> Result<()> {
    let mut fx = Fixture::start(
        mediator().authority(agent_a_spec()).authority(
            AuthoritySpec::new(AGENT_B)
                .allow(&["other.test"])
                .token("tb"),
        ),
    )
    .await?;
    let sockets = [
        fx.mediator.socket_path(AGENT_A),
        fx.mediator.socket_path(AGENT_B),
    ];
    for s in &sockets {
        ensure!(s.exists(), "{} missing after ready", s.display());
    }
    let status = fx.mediator.terminate().await?;
    let left: Vec<_> = sockets.iter().filter(|s| s.exists()).collect();
    ensure!(
        status.success() && left.is_empty(),
        "on SIGTERM the mediator exited with {status} and left {left:?}; stderr:\n{}",
        fx.mediator.stderr_text()
    );
    Ok(())
}

async fn sigterm_lets_a_live_tunnel_finish_within_grace() -> Result<()> {
    let mut fx = agent_a().await?;
    let sock = fx.mediator.socket_path(AGENT_A);
    let mut conn = fx.unix_conn(AGENT_A).await?;
    let resp = conn.connect(&fx.origin_target(), None).await?;
    assert_eq!(resp.status, 200);
    fx.mediator.signal(Signal::SIGTERM)?;
    // It stops accepting at once: the socket file goes away...
    wait_until(Duration::from_secs(5), "socket file gone", || {
        !sock.exists()
    })
    .await?;
    // ...while the live tunnel keeps working during the grace (2 s in this config).
    let inner = conn.get(ORIGIN_HOST, "/drain", true).await?;
    assert_eq!(inner.status, 200, "the tunnel was cut instead of drained");
    drop(conn);
    // Nothing lost: the drained tunnel has its close record, closed by the client.
    let close = exit_and_tunnel_close(&mut fx).await?;
    ensure!(close["close_reason"] != "shutdown", "{close}");
    ensure!(close["bytes_up"].as_u64().unwrap_or(0) > 0, "{close}");
    Ok(())
}

async fn sigterm_cuts_a_tunnel_left_open_at_the_grace_and_still_logs_its_close() -> Result<()> {
    let mut fx = agent_a().await?;
    let mut conn = fx.tcp_conn().await?;
    let resp = conn
        .connect(&fx.origin_target(), Some((AGENT_A, TOKEN_A)))
        .await?;
    assert_eq!(resp.status, 200);
    // The client never closes: the grace (2 s) runs out and the tunnel is cut.
    let close = exit_and_tunnel_close(&mut fx).await?;
    assert_eq!(close["close_reason"], "shutdown");
    drop(conn);
    Ok(())
}

/// A CONNECT still waiting on its upstream connect when the shutdown grace ends gets its
/// decision line (and the client its answer): no request goes unaccounted.
async fn a_connect_pending_at_shutdown_still_gets_its_decision_line() -> Result<()> {
    // A listener with backlog 1 that never accepts: once its queue is full the kernel drops
    // further SYNs, so the mediator's connect waits (up to its 30 s timeout).
    let (listener, held) = stalled_loopback_listener().await?;
    let addr = listener.local_addr()?;

    let mut fx = Fixture::start(
        mediator()
            .authority(agent_a_spec())
            .connect_timeout_secs(30),
    )
    .await?;
    let mut conn = fx.tcp_conn().await?;
    let target = format!("{ORIGIN_HOST}:{}", addr.port());
    let head = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{}\r\n",
        proxy_authorization(AGENT_A, TOKEN_A)
    );
    conn.send(head.as_bytes()).await?;
    // The name is resolved right before the connect: once the query is in, the connect is
    // (about to be) pending.
    wait_until(
        Duration::from_secs(10),
        "the mediator resolved the target",
        || fx.dns.queries(ORIGIN_HOST) > 0,
    )
    .await?;
    let status = fx.mediator.terminate().await?;
    ensure!(status.success(), "exit status {status}");
    let decisions = fx.mediator.decisions()?;
    let line = decisions
        .iter()
        .find(|v| {
            let r = record(v);
            r.event == Event::Decision && r.protocol == Protocol::Connect
        })
        .with_context(|| format!("no decision line for the pending CONNECT: {decisions:?}"))?;
    assert_eq!(line["decision"], "deny", "{line}");
    assert_eq!(line["reason"], "upstream_failure", "{line}");
    let resp = conn.read_response(true).await?;
    assert!(resp.status >= 500, "{resp:?}");
    drop((listener, held));
    Ok(())
}

/// `mediator check` loads what a start loads (design section 11): for each broken
/// resource, check fails naming it, and a start on the same config fails too; with every
/// resource sound, check passes and says what it loaded.
async fn check_loads_what_a_start_loads() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let p = |name: &str| dir.path().join(name).display().to_string();
    let broken_ca = dir.path().join("broken-ca");
    std::fs::create_dir(&broken_ca)?;
    std::fs::write(broken_ca.join("ca.pem"), "not a certificate\n")?;
    std::fs::write(broken_ca.join("ca-key.pem"), "not a key\n")?;
    std::fs::write(
        p("bad.pac"),
        "function FindProxyForURL(url, host) { return ; ;; (\n",
    )?;
    std::fs::write(
        p("good.pac"),
        "function FindProxyForURL(url, host) { return \"DIRECT\"; }\n",
    )?;
    std::fs::write(p("parents.cred"), "127.0.0.1:3128 user:pw\n")?;
    let pac = |file: &str| {
        mediator()
            .upstream_line("mode = \"pac\"")
            .upstream_line(&format!("pac = {:?}", p(file)))
            .upstream_line("allowed_parents = [\"127.0.0.1:3128\"]")
    };
    let cases: Vec<(&str, e2e::mediator::MediatorBuilder, String)> = vec![
        (
            "an unreadable CA",
            mediator().extra_toml(&format!(
                "[tls]\nca_dir = {:?}",
                broken_ca.display().to_string()
            )),
            broken_ca.display().to_string(),
        ),
        (
            "a missing extra CA file",
            mediator().extra_toml(&format!("[tls]\nextra_ca_files = [{:?}]", p("none.pem"))),
            p("none.pem"),
        ),
        (
            "a PAC that does not parse",
            pac("bad.pac"),
            "PAC".to_owned(),
        ),
        ("a missing PAC file", pac("none.pac"), p("none.pac")),
        (
            "a missing parent credentials file",
            pac("good.pac")
                .upstream_line(&format!("parent_credentials_file = {:?}", p("none.cred"))),
            p("none.cred"),
        ),
    ];
    for (what, b, named) in cases {
        let b = b.authority(agent_a_spec());
        let (status, stderr) = b.check().await?;
        ensure!(
            !status.success() && stderr.contains("a start would fail") && stderr.contains(&named),
            "check on {what}: {status}, expected a failure naming {named:?}:\n{stderr}"
        );
        let err = b.start_err().await.with_context(|| what.to_owned())?;
        ensure!(
            err.contains(&named),
            "start on {what} failed without naming {named:?}:\n{err}"
        );
    }
    let sound = pac("good.pac")
        .upstream_line(&format!(
            "parent_credentials_file = {:?}",
            p("parents.cred")
        ))
        .authority(agent_a_spec());
    let (status, out) = sound.check().await?;
    ensure!(status.success(), "check on a sound config: {status}\n{out}");
    ensure!(out.contains("mode = \"pac\": usable"), "{out}");
    Ok(())
}

/// `mediator check` as uid 65534 on `config` (readable by all): its exit status and output.
fn check_as_nobody(config: &Path) -> Result<(std::process::ExitStatus, String)> {
    let out = Tool::Setpriv
        .std_command("setpriv")?
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .arg(bin())
        .arg("check")
        .arg("--config")
        .arg(config)
        .output()
        .context("running setpriv")?;
    Ok((
        out.status,
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

async fn check_fails_where_a_start_could_not_write() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // World-readable, root-owned: uid 65534 may read the config but write nothing here.
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let p = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(p("a-file"), "")?;
    let authority = "[[authority]]\nname = \"agent-a\"\nallow = [\"origin.test\"]\n";
    let sockets = format!("[listen]\nsocket_dir = {:?}\n", p("sockets"));
    let cases = [
        (
            "a decision log in a missing directory",
            format!(
                "{sockets}[log]\ndecisions = {:?}\n{authority}",
                p("none/decisions.jsonl")
            ),
            p("none/decisions.jsonl"),
        ),
        (
            "a socket_dir under a regular file",
            format!(
                "[listen]\nsocket_dir = {:?}\n{authority}",
                p("a-file/sockets")
            ),
            p("a-file"),
        ),
        (
            "an admin_socket under a regular file",
            format!(
                "{sockets}admin_socket = {:?}\n{authority}",
                p("a-file/admin/admin.sock")
            ),
            p("a-file"),
        ),
    ];
    for (i, (what, text, named)) in cases.iter().enumerate() {
        let config = dir.path().join(format!("case-{i}.toml"));
        std::fs::write(&config, text)?;
        let (status, out) = run_check(bin(), &config).await?;
        ensure!(
            !status.success() && out.contains("a start would fail") && out.contains(named),
            "check on {what}: {status}, expected a failure naming {named:?}:\n{out}"
        );
    }
    // As a user who may not write the directory (what a service user meets).
    let config = dir.path().join("unwritable.toml");
    std::fs::write(
        &config,
        format!(
            "{sockets}[log]\ndecisions = {:?}\n{authority}",
            p("decisions.jsonl")
        ),
    )?;
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644))?;
    let (status, out) = check_as_nobody(&config)?;
    ensure!(
        !status.success() && out.contains("not writable by this user"),
        "check as uid 65534 of an unwritable log directory: {status}\n{out}"
    );
    // The same config passes for a user who may write there (root), creating nothing.
    let (status, out) = run_check(bin(), &config).await?;
    ensure!(status.success(), "check as root: {status}\n{out}");
    ensure!(
        !dir.path().join("decisions.jsonl").exists(),
        "check created the log file"
    );
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(check_accepts_a_valid_config),
        case!(check_lists_every_problem_with_its_location),
        case!(mediator_refuses_to_start_on_a_bad_config),
        case!(sigterm_exits_cleanly_and_removes_socket_files),
        case!(sigterm_lets_a_live_tunnel_finish_within_grace),
        case!(sigterm_cuts_a_tunnel_left_open_at_the_grace_and_still_logs_its_close),
        case!(a_connect_pending_at_shutdown_still_gets_its_decision_line),
        case!(check_loads_what_a_start_loads),
        case!(check_fails_where_a_start_could_not_write).needs(&[Tool::Setpriv]),
    ]
}
