//! Running as a service (design section 16): the signals a service manager or logrotate
//! sends (SIGUSR1 reopens the decision log without losing a line, SIGUSR2 is ignored,
//! SIGQUIT shuts down cleanly), readiness notification (`sd_notify`), the config-file
//! watch, `mediator health`, `--version`, completions and man pages, the lifetime of
//! authorities created through the admin API, and the operator guide's config reference
//! against the config schema.

use crate::support::{is, record};
use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use mediator::vocab::Event;
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use e2e::mediator::run;
use e2e::{AGENT_A, AGENT_B, Fixture, LOG_TIMEOUT, ORIGIN_HOST, TOKEN_A, wait_for, wait_until};
use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::support::{agent_a, bin, mediator};

/// Every complete line of a decision log file, parsed; a line that is not JSON fails.
fn log_lines(path: &Path) -> Result<Vec<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    ensure!(
        text.is_empty() || text.ends_with('\n'),
        "{} ends inside a line",
        path.display()
    );
    text.lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l:?}")))
        .collect()
}

/// Waits for a stderr line of the mediator that contains `needle`.
async fn wait_stderr(fx: &e2e::Mediator, needle: &str) -> Result<()> {
    wait_until(LOG_TIMEOUT, &format!("stderr line {needle:?}"), || {
        fx.stderr_text().contains(needle)
    })
    .await
    .with_context(|| format!("stderr:\n{}", fx.stderr_text()))
}

async fn sigusr1_reopens_the_decision_log_without_losing_a_line() -> Result<()> {
    let fx = agent_a().await?;
    let m = &fx.mediator;
    let log = m.log_path().to_owned();
    let rotated = log.with_extension("jsonl.1");
    let target = fx.origin_target();

    // Requests keep coming while the file is renamed and the log reopened; each one is a
    // decision line (and a close line): none may be lost or split between the files.
    const REQUESTS: usize = 300;
    let sender = {
        let addr = m.tcp_addr();
        let target = target.clone();
        tokio::spawn(async move {
            let mut answered = 0usize;
            for _ in 0..REQUESTS {
                let mut c = e2e::HttpConn::tcp(addr).await?;
                let r = c.connect(&target, Some((AGENT_A, TOKEN_A))).await?;
                ensure!(r.status == 200, "CONNECT answered {}", r.status);
                answered += 1;
            }
            Ok::<_, anyhow::Error>(answered)
        })
    };
    m.wait_for_count(is(|r| r.event == Event::Decision), 50, LOG_TIMEOUT)
        .await?;
    std::fs::rename(&log, &rotated).context("rotating the log")?;
    m.signal(Signal::SIGUSR1)?;
    wait_stderr(m, &format!("decision log reopened: {}", log.display())).await?;
    let answered = sender.await??;
    assert_eq!(answered, REQUESTS);

    // Every decision (and its close record) is in exactly one of the two files.
    let complete = || -> Result<Option<(Vec<Value>, Vec<Value>)>> {
        let (old, new) = (log_lines(&rotated)?, log_lines(&log)?);
        let closes = old
            .iter()
            .chain(&new)
            .filter(|v| record(v).event == Event::Close)
            .count();
        Ok((closes >= REQUESTS).then_some((old, new)))
    };
    let (old, new) = wait_for(LOG_TIMEOUT, complete, || {
        format!("fewer than {REQUESTS} close records in the two files")
    })
    .await?;
    assert!(!old.is_empty(), "the rotated file got no line");
    assert!(!new.is_empty(), "the reopened file got no line");
    for event in ["decision", "close"] {
        let ids: Vec<u64> = old
            .iter()
            .chain(&new)
            .filter(|v| v["event"] == event)
            .map(|v| v["id"].as_u64().unwrap())
            .collect();
        let distinct: BTreeSet<u64> = ids.iter().copied().collect();
        assert_eq!(ids.len(), REQUESTS, "{event} lines");
        assert_eq!(distinct.len(), REQUESTS, "{event} ids repeat");
    }
    let mode = std::fs::metadata(&log)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the reopened file's mode");
    Ok(())
}

async fn a_reopen_that_fails_keeps_writing_to_the_old_file() -> Result<()> {
    let fx = agent_a().await?;
    let m = &fx.mediator;
    let log = m.log_path().to_owned();
    // The log's path becomes a directory: it cannot be opened for appending.
    let rotated = log.with_extension("jsonl.1");
    std::fs::rename(&log, &rotated).or_else(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            std::fs::write(&rotated, "")
        } else {
            Err(e)
        }
    })?;
    std::fs::create_dir(&log)?;
    m.signal(Signal::SIGUSR1)?;
    wait_stderr(m, "cannot reopen the decision log").await?;
    assert!(
        m.stderr_text().contains("still writing to the file it had"),
        "{}",
        m.stderr_text()
    );
    let r = fx.connect_a(&fx.origin_target()).await?;
    assert_eq!(r.status, 200);
    wait_for(
        LOG_TIMEOUT,
        || {
            Ok(log_lines(&rotated)?
                .into_iter()
                .find(is(|r| r.event == Event::Decision)))
        },
        || "no decision line in the old file".to_owned(),
    )
    .await?;
    Ok(())
}

async fn a_decision_log_that_cannot_be_written_stops_the_mediator() -> Result<()> {
    let mut fx = agent_a().await?;
    let log = fx.mediator.log_path().to_owned();
    let sock = fx.mediator.socket_path(AGENT_A);
    // After a rotation, the log's path names a device on which every write fails
    // (ENOSPC), as a full disk would.
    let _ = std::fs::remove_file(&log);
    std::os::unix::fs::symlink("/dev/full", &log)?;
    fx.mediator.signal(Signal::SIGUSR1)?;
    wait_stderr(&fx.mediator, "reopened").await?;
    // This decision cannot be recorded: the mediator stops instead of going on unlogged.
    let _ = fx.connect_a(&fx.origin_target()).await;
    wait_stderr(&fx.mediator, "the decision log cannot be written").await?;
    let status = fx.mediator.exited().await?;
    assert_eq!(status.code(), Some(3), "{}", fx.mediator.stderr_text());
    assert!(!sock.exists(), "the socket file stayed behind");
    Ok(())
}

async fn sigusr2_is_ignored_and_sigquit_shuts_down_cleanly() -> Result<()> {
    let mut fx = agent_a().await?;
    let sock = fx.mediator.socket_path(AGENT_A);
    assert!(sock.exists());
    fx.mediator.signal(Signal::SIGUSR2)?;
    wait_stderr(&fx.mediator, "SIGUSR2 ignored").await?;
    // Still serving after it.
    assert_eq!(fx.connect_a(&fx.origin_target()).await?.status, 200);
    fx.mediator.signal(Signal::SIGQUIT)?;
    wait_stderr(&fx.mediator, "mediator: shutting down").await?;
    wait_until(
        Duration::from_secs(15),
        "the socket file is removed",
        || !sock.exists(),
    )
    .await?;
    // Already exiting: terminate() reaps it.
    let status = fx.mediator.terminate().await?;
    assert!(status.success(), "exit status {status}");
    Ok(())
}

/// Receives one datagram from the notify socket within the log timeout.
async fn notification(sock: &UnixDatagram) -> Result<String> {
    wait_for(
        LOG_TIMEOUT,
        || {
            let mut buf = [0u8; 4096];
            match sock.recv(&mut buf) {
                Ok(n) => Ok(Some(String::from_utf8_lossy(&buf[..n]).into_owned())),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
                Err(e) => Err(e.into()),
            }
        },
        || "no notification".to_owned(),
    )
    .await
}

async fn the_service_manager_is_notified_ready_reloading_and_stopping() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path)?;
    sock.set_nonblocking(true)?;
    let mut fx = Fixture::start(
        mediator()
            .authority(e2e::agent_a_spec())
            .env("NOTIFY_SOCKET", &path.to_string_lossy()),
    )
    .await?;

    let ready = notification(&sock).await?;
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    let status = ready
        .lines()
        .find_map(|l| l.strip_prefix("STATUS="))
        .ok_or_else(|| anyhow!("no STATUS= in {ready:?}"))?;
    let tcp = e2e::mediator::parse_ready(status)?
        .tcp
        .ok_or_else(|| anyhow!("no tcp= in {status:?}"))?;
    assert_eq!(tcp, fx.mediator.tcp_addr());
    // READY=1 means served: the listener and the authority's socket take connections.
    assert_eq!(fx.connect_a(&fx.origin_target()).await?.status, 200);
    assert_eq!(
        fx.connect_unix(AGENT_A, &fx.origin_target()).await?.status,
        200
    );

    fx.mediator.signal(Signal::SIGHUP)?;
    let reloading = notification(&sock).await?;
    assert!(
        reloading.lines().any(|l| l == "RELOADING=1"),
        "{reloading:?}"
    );
    assert!(
        reloading.lines().any(|l| l.starts_with("MONOTONIC_USEC=")),
        "{reloading:?}"
    );
    let again = notification(&sock).await?;
    assert!(again.lines().any(|l| l == "READY=1"), "{again:?}");
    assert!(
        again.lines().any(|l| l == "STATUS=ready (reloaded)"),
        "{again:?}"
    );

    // A reload that fails says so in the status (`systemctl status` shows it).
    let config = fx.mediator.config_path().to_owned();
    let good = std::fs::read_to_string(&config)?;
    std::fs::write(
        &config,
        format!(
            "{good}
[[authority]\n"
        ),
    )?;
    fx.mediator.signal(Signal::SIGHUP)?;
    let reloading = notification(&sock).await?;
    assert!(
        reloading.lines().any(|l| l == "RELOADING=1"),
        "{reloading:?}"
    );
    let failed = notification(&sock).await?;
    assert!(failed.lines().any(|l| l == "READY=1"), "{failed:?}");
    assert!(
        failed
            .lines()
            .any(|l| l.starts_with("STATUS=") && l.contains("reload failed")),
        "{failed:?}"
    );
    std::fs::write(&config, good)?;

    fx.mediator.signal(Signal::SIGTERM)?;
    let stopping = notification(&sock).await?;
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let status = fx.mediator.terminate().await?;
    assert!(status.success(), "exit status {status}");
    Ok(())
}

async fn watch_config_reloads_when_the_file_is_replaced() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .authority(e2e::agent_a_spec())
            .arg("--watch-config"),
    )
    .await?;
    let m = &fx.mediator;
    let path = m.config_path().to_owned();
    let text = std::fs::read_to_string(&path)?;
    let added = format!(
        "{text}\n[[authority]]\nname = \"{AGENT_B}\"\nallow = [\"{ORIGIN_HOST}\"]\nallow_private = [\"127.0.0.0/8\"]\n"
    );
    // As the kubelet updates a ConfigMap volume: a new file renamed over the old path.
    let fresh = path.with_extension("new");
    std::fs::write(&fresh, &added)?;
    std::fs::rename(&fresh, &path)?;
    wait_stderr(m, &format!("{} changed; reloading", path.display())).await?;
    wait_stderr(m, "reload applied: added=agent-b@").await?;
    assert_eq!(
        fx.connect_unix(AGENT_B, &fx.origin_target()).await?.status,
        200
    );
    // A file that does not validate changes nothing.
    std::fs::write(&fresh, format!("{added}\nbogus = 1\n"))?;
    std::fs::rename(&fresh, &path)?;
    wait_stderr(m, "reload failed; the running authorities are unchanged").await?;
    assert_eq!(
        fx.connect_unix(AGENT_B, &fx.origin_target()).await?.status,
        200
    );
    Ok(())
}

async fn health_asks_the_admin_api() -> Result<()> {
    let fx = Fixture::start(mediator().authority(e2e::agent_a_spec()).admin(true)).await?;
    let admin = fx.mediator.admin_addr()?.to_string();
    let out = run(bin(), &["health", "--admin", &admin]).await?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{admin} /healthz: 200 ok")
    );
    let out = run(bin(), &["health", "--admin", &admin, "--ready"]).await?;
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(" /readyz: 200 ready"));

    // Nothing listening: exit 1, saying what failed.
    let closed = e2e::closed_loopback_port()?;
    let out = run(
        bin(),
        &["health", "--admin", &format!("127.0.0.1:{closed}")],
    )
    .await?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refused"),
        "{out:?}"
    );
    // No address to ask: a usage error.
    let out = run(bin(), &["health"]).await?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    Ok(())
}

async fn health_finds_the_admin_socket_in_the_config() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let admin_sock = dir.path().join("admin.sock");
    let fx = Fixture::start(
        mediator()
            .authority(e2e::agent_a_spec())
            .listen_line(&format!(
                "admin_socket = {:?}",
                admin_sock.to_string_lossy()
            )),
    )
    .await?;
    let config = fx.mediator.config_path().to_string_lossy().into_owned();
    let out = run(bin(), &["health", "--config", &config]).await?;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("unix:{} /healthz: 200 ok", admin_sock.display())),
        "{out:?}"
    );
    Ok(())
}

async fn version_names_the_git_revision() -> Result<()> {
    let out = run(bin(), &["--version"]).await?;
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    let revision = lines
        .next()
        .and_then(|l| l.strip_prefix("revision "))
        .ok_or_else(|| anyhow!("no revision line in {text:?}"))?;
    assert_eq!(
        first,
        format!(
            "mediator {} (git {})",
            env!("CARGO_PKG_VERSION"),
            &revision[..revision.len().min(12)]
        )
    );
    // Built from a checkout: the revision is its HEAD (40 hex digits).
    let head = Tool::Git
        .std_command("git")?
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()?;
    if head.status.success() && std::env::var_os("GIT_REVISION").is_none() {
        assert_eq!(revision, String::from_utf8_lossy(&head.stdout).trim());
    }
    assert!(
        revision == "unknown"
            || (revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())),
        "{revision:?}"
    );
    let short = run(bin(), &["-V"]).await?;
    assert_eq!(String::from_utf8_lossy(&short.stdout).trim(), first);
    Ok(())
}

async fn completions_and_man_pages_come_from_the_cli() -> Result<()> {
    let out = run(bin(), &["completions", "bash"]).await?;
    assert!(out.status.success(), "{out:?}");
    let bash = String::from_utf8_lossy(&out.stdout);
    for word in ["_mediator()", "health", "explain", "--watch-config"] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }
    let out = run(bin(), &["completions", "zsh"]).await?;
    assert!(String::from_utf8_lossy(&out.stdout).contains("#compdef mediator"));

    let out = run(bin(), &["man"]).await?;
    assert!(out.status.success(), "{out:?}");
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        page.starts_with(".ie \\n(.g .ds Aq") || page.contains(".TH mediator 1"),
        "{page}"
    );
    assert!(page.contains(".TH mediator 1"));
    assert!(page.contains("health"));

    let dir = tempfile::tempdir()?;
    let out = run(bin(), &["man", "--out-dir", &dir.path().to_string_lossy()]).await?;
    assert!(out.status.success(), "{out:?}");
    for page in [
        "mediator.1",
        "mediator-health.1",
        "mediator-check.1",
        "mediator-explain.1",
    ] {
        let text =
            std::fs::read_to_string(dir.path().join(page)).with_context(|| format!("no {page}"))?;
        assert!(text.contains(".TH "), "{page} is no man page");
    }
    Ok(())
}

async fn a_memory_registry_keeps_api_authorities_per_process_and_says_so() -> Result<()> {
    let Fixture {
        dns,
        origin,
        mediator: m,
    } = Fixture::start(
        mediator()
            .authority(e2e::agent_a_spec())
            .admin(true)
            .extra_toml("\n[registry]\nbackend = \"memory\"\n"),
    )
    .await?;
    let stderr = m.stderr_text();
    assert!(
        stderr.contains("WARNING: [registry] backend = \"memory\""),
        "{stderr}"
    );
    let target = format!("{ORIGIN_HOST}:{}", origin.port());
    let body = json!({
        "name": "agent-c",
        "allow": [ORIGIN_HOST],
        "allow_private": ["127.0.0.0/8"],
        "generate_token": true,
    })
    .to_string();
    let resp = m
        .admin("POST", "/v1/authorities", Some(&body), None)
        .await?;
    assert_eq!(resp.status, 201, "{}", resp.text());
    let created = resp.json()?;
    // The answer says plainly that it will not survive a restart.
    assert_eq!(created["persisted"], false);
    assert_eq!(created["backend"], "memory");
    let note = created["persistence_note"].as_str().unwrap_or_default();
    assert!(note.contains("gone when the mediator restarts"), "{note}");
    let token = created["token"].as_str().unwrap().to_owned();
    let sock = m.socket_path("agent-c");
    let mut c = e2e::HttpConn::tcp(m.tcp_addr()).await?;
    assert_eq!(
        c.connect(&target, Some(("agent-c", &token))).await?.status,
        200
    );
    drop(c);

    let m = m.restart().await?;
    // After the restart: the config's authority is back, the API's one is gone with its
    // socket and its token.
    let resp = m
        .admin("GET", "/v1/authorities/agent-c", None, None)
        .await?;
    assert_eq!(resp.status, 404, "{}", resp.text());
    assert!(!sock.exists(), "{} is still there", sock.display());
    let list = m.admin_get("/v1/authorities").await?;
    let names: Vec<&str> = list["authorities"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert_eq!(names, [AGENT_A]);
    let mut c = e2e::HttpConn::tcp(m.tcp_addr()).await?;
    let r = c.connect(&target, Some(("agent-c", &token))).await?;
    assert_eq!(r.status, 407, "{}", r.text());
    let mut c = e2e::HttpConn::tcp(m.tcp_addr()).await?;
    assert_eq!(
        c.connect(&target, Some((AGENT_A, TOKEN_A))).await?.status,
        200
    );
    drop((dns, origin));
    Ok(())
}

async fn every_shipped_config_passes_check() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for file in ["examples/mediator.toml", "docker/compose/mediator.toml"] {
        let path = root.join(file);
        let out = run(bin(), &["check", "--config", &path.to_string_lossy()]).await?;
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// ARCHITECTURE.md is the map of the code: every source file is named in it, as a code
/// span of its path below its crate's `src/` (or its test directory). A unit-test file
/// beside the code (`*_tests.rs`, a folder's `tests.rs`) is covered by the page's rule.
async fn architecture_names_every_source_file() -> Result<()> {
    let top = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let map = std::fs::read_to_string(top.join("ARCHITECTURE.md"))?;
    ensure!(
        map.contains("sibling `*_tests.rs`"),
        "ARCHITECTURE.md no longer states where unit tests sit"
    );
    let roots = [
        "policy/src",
        "certs/src",
        "gss/src",
        "mediator/src",
        "shim/src",
        "bench/src",
        "tests/src",
        "tests/e2e",
        "shim/tests/sandbox",
        "policy/tests",
    ];
    let mut missing = Vec::new();
    for root in roots {
        let base = top.join(root);
        let mut dirs = vec![base.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                if !name.ends_with(".rs") || name.ends_with("_tests.rs") || name == "tests.rs" {
                    continue;
                }
                let rel = path.strip_prefix(&base)?.to_string_lossy().into_owned();
                if !map.contains(&format!("`{rel}`")) {
                    missing.push(format!("{root}/{rel}"));
                }
            }
        }
    }
    missing.sort();
    ensure!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name {} source file(s): {missing:?}",
        missing.len()
    );
    Ok(())
}

/// Starts the mediator with `config`, its stderr a file, and `JOURNAL_STREAM` naming that
/// file (`journal`) or another stream; returns the stderr text once `until` is in it (or
/// the process ended).
async fn stderr_with_journal(config: &str, journal: bool, until: &str) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir()?;
    let config = config.replace("DIR", &dir.path().display().to_string());
    std::fs::write(dir.path().join("m.toml"), config)?;
    let err_path = dir.path().join("stderr");
    let err = std::fs::File::create(&err_path)?;
    let meta = err.metadata()?;
    let stream = if journal {
        format!("{}:{}", meta.dev(), meta.ino())
    } else {
        format!("{}:{}", meta.dev(), meta.ino() + 1)
    };
    let mut child = std::process::Command::new(bin())
        .arg("--config")
        .arg(dir.path().join("m.toml"))
        .env("JOURNAL_STREAM", stream)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .spawn()?;
    let waited = wait_until(LOG_TIMEOUT, until, || {
        std::fs::read_to_string(&err_path).is_ok_and(|t| t.contains(until))
            || child.try_wait().ok().flatten().is_some()
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    waited?;
    Ok(std::fs::read_to_string(&err_path)?)
}

/// Under systemd, stderr is the journal (`JOURNAL_STREAM`): each line carries its syslog
/// priority (`<3>` errors, `<4>` warnings, `<6>` the rest), so `journalctl -p warning`
/// finds the warnings; anywhere else the lines are plain (design section 19).
async fn stderr_lines_carry_priorities_when_stderr_is_the_journal() -> Result<()> {
    let config = r#"
[listen]
admin = "127.0.0.1:0"
admin_allow_anonymous_writes = true
[registry]
backend = "memory"
[log]
decisions = "DIR/decisions.jsonl"
"#;
    let text = stderr_with_journal(config, true, "ready tcp=").await?;
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("no line with {needle:?} in:\n{text}"))
    };
    ensure!(
        line("WARNING: admin_allow_anonymous_writes")?.starts_with("<4>mediator: WARNING"),
        "{text}"
    );
    ensure!(
        line("WARN mediator::server")?.starts_with("<4>"),
        "tracing's too: {text}"
    );
    ensure!(line("ready")?.starts_with("<6>"), "{text}");
    ensure!(
        text.lines().all(|l| l.starts_with('<')),
        "every line has a priority:\n{text}"
    );
    // A start that fails says so at priority 3.
    let failing = config.replace("DIR/decisions.jsonl", "DIR/missing/dir/decisions.jsonl");
    let text = stderr_with_journal(&failing, true, "decision log").await?;
    ensure!(
        text.lines()
            .any(|l| l.starts_with("<3>mediator:") && l.contains("decision log")),
        "{text}"
    );
    // Another stream: plain lines.
    let text = stderr_with_journal(config, false, "ready tcp=").await?;
    ensure!(!text.contains("<4>") && !text.contains("<6>"), "{text}");
    ensure!(text.contains("mediator: WARNING"), "{text}");
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(architecture_names_every_source_file),
        case!(stderr_lines_carry_priorities_when_stderr_is_the_journal),
        case!(sigusr1_reopens_the_decision_log_without_losing_a_line).threads(4),
        case!(a_reopen_that_fails_keeps_writing_to_the_old_file),
        case!(a_decision_log_that_cannot_be_written_stops_the_mediator),
        case!(sigusr2_is_ignored_and_sigquit_shuts_down_cleanly),
        case!(the_service_manager_is_notified_ready_reloading_and_stopping),
        case!(watch_config_reloads_when_the_file_is_replaced),
        case!(health_asks_the_admin_api),
        case!(health_finds_the_admin_socket_in_the_config),
        case!(version_names_the_git_revision).needs(&[Tool::Git]),
        case!(completions_and_man_pages_come_from_the_cli),
        case!(a_memory_registry_keeps_api_authorities_per_process_and_says_so),
        case!(every_shipped_config_passes_check),
    ]
}
