//! Socket mode against a real mediator (the `mediator` library, started in this process
//! with a per-authority socket, an admin socket, and TLS termination where asked): the
//! denial line is said before the client's own error (proxy CONNECT, SOCKS5, a captured
//! flow; curl and pip), once, with and without the admin API; and a client that refuses
//! the mediator's certificate gets a line saying what to do, and a report entry.
//!
//! Each run's stdout and stderr are one pipe, so the shim's lines and the client's
//! errors arrive in the order they were written: "our line first" is read off that one
//! stream, never off two.
//!
//! Network rule: the mediator and the origin are on this host's loopback (and Unix
//! sockets in the scratch directory); the denied names are refused before any resolution.

use std::io::Read;
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::{SHIM, Scratch, read_json, write_ca};
use crate::{IGNORED, Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        the_denial_line_comes_before_curls_error_with_the_admin_api,
        the_denial_line_comes_before_curls_error_without_the_admin_api,
        the_denial_line_comes_before_pips_error,
        a_captured_flows_denial_line_comes_before_curls_error,
        a_client_refusing_the_mediators_certificate_is_told_what_to_do,
        npm_refusing_the_mediators_certificate_without_an_alert_is_told_what_to_do,
    ]
}

/// A real mediator, in this process, on its own runtime; stopped on drop.
struct Real {
    runtime: tokio::runtime::Runtime,
    running: Option<mediator::Running>,
    /// Its configuration file (what `--config` reads).
    config: PathBuf,
    /// The authority `agent`'s socket.
    socket: PathBuf,
}

impl Real {
    /// A mediator in `dir` whose authority `agent` may reach `api.test` (on 127.0.0.1)
    /// and `x.test:443`; with `terminate`, TLS to `api.test` is terminated with a CA in
    /// `dir/ca`.
    fn start(dir: &Path, terminate: bool) -> Self {
        for d in ["sockets", "admin", "ca"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let tls = if terminate {
            format!("\n[tls]\nca_dir = \"{}\"\n", dir.join("ca").display())
        } else {
            String::new()
        };
        let terminated = if terminate {
            "tls_terminate = [\"api.test\"]\n"
        } else {
            ""
        };
        let text = format!(
            "[listen]\nsocket_dir = \"{}\"\nadmin_socket = \"{}\"\n\n[registry]\nbackend = \"memory\"\n\n[resolver]\nhosts = {{ \"api.test\" = [\"127.0.0.1\"] }}\n{tls}\n[[authority]]\nname = \"agent\"\nallow = [\"x.test:443\", \"api.test\"]\nallow_private = [\"127.0.0.0/8\"]\n{terminated}",
            dir.join("sockets").display(),
            dir.join("admin/admin.sock").display(),
        );
        let config = dir.join("mediator.toml");
        std::fs::write(&config, &text).unwrap();
        let parsed = policy::config::parse(&text, "mediator.toml").unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let running = runtime
            .block_on(mediator::start(
                parsed,
                mediator::Options {
                    sink: Some(mediator::Sink::File(dir.join("decisions.log"))),
                    tap: None,
                },
            ))
            .unwrap();
        Self {
            runtime,
            running: Some(running),
            config,
            socket: dir.join("sockets/agent.sock"),
        }
    }

    /// `--config F --authority agent` (the admin API is known: the feed reads it).
    fn with_admin(&self) -> Vec<String> {
        vec![
            "--config".into(),
            self.config.display().to_string(),
            "--authority".into(),
            "agent".into(),
        ]
    }

    /// `--mediator-socket S` (no admin API: only the answers tell).
    fn socket_only(&self) -> Vec<String> {
        vec![
            "--mediator-socket".into(),
            self.socket.display().to_string(),
        ]
    }
}

impl Drop for Real {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            self.runtime.block_on(running.shutdown());
        }
    }
}

/// Runs `shim FLAGS -- sh -c SCRIPT` from `dir` with its stdout and stderr on one pipe
/// (the command's too): the exit status and everything written, in order.
fn run_merged(dir: &Path, flags: &[String], script: &str, env: &[(&str, &Path)]) -> String {
    let (read, write) = nix::unistd::pipe().unwrap();
    let write2: OwnedFd = write.try_clone().unwrap();
    let mut cmd = Command::new(SHIM);
    cmd.args(flags)
        .args(["--", "sh", "-c", script])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::from(write2));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    // Our copies of the write end are gone with `cmd`: the read ends when the shim and
    // its command have exited.
    drop(cmd);
    let mut text = String::new();
    std::fs::File::from(read).read_to_string(&mut text).unwrap();
    let status = child.wait().unwrap();
    format!("{text}[exit {:?}]", status.code())
}

/// `ours` (a line of the shim's) is in `out` exactly once, and before the first line
/// `theirs` finds (the client's error).
fn ours_first(out: &str, ours: &str, theirs: impl Fn(&str) -> bool) -> TestResult {
    let lines: Vec<&str> = out.lines().collect();
    let mine: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains(ours))
        .collect();
    let Some(client) = lines.iter().position(|l| theirs(l)) else {
        return Err(format!("no error line of the client in:\n{out}"));
    };
    match mine.as_slice() {
        [i] if *i < client => Ok(()),
        [_] => Err(format!("the client's error came first:\n{out}")),
        _ => Err(format!(
            "expected {ours:?} once, before the client's error:\n{out}"
        )),
    }
}

fn curl_error(l: &str) -> bool {
    l.starts_with("curl: (")
}

/// A CONNECT (`HTTPS_PROXY`) and a SOCKS5 request (`ALL_PROXY`, `socks5h`) to names the
/// grant does not have, with the admin API known (`admin`) or the socket alone; each
/// line must come before curl's error.
fn denial_lines_come_first(admin: bool, socks_line: &str) -> TestResult {
    let s = Scratch::new("answers");
    let real = Real::start(&s.0, false);
    let flags = if admin {
        real.with_admin()
    } else {
        real.socket_only()
    };
    let connect = run_merged(&s.0, &flags, "curl -sS -m 10 https://denied.test/", &[]);
    ours_first(
        &connect,
        "mediator: denied denied.test:443 (not_in_allowlist)",
        curl_error,
    )?;
    let socks = run_merged(
        &s.0,
        &flags,
        "curl -sS -m 10 --proxy \"$ALL_PROXY\" https://denied2.test/",
        &[],
    );
    ours_first(&socks, socks_line, curl_error)
}

/// With `--config` (the admin API known), the line is the API's (reason, hint), asked
/// for as the answer passes: before curl's error, not a poll later.
fn the_denial_line_comes_before_curls_error_with_the_admin_api() -> TestResult {
    denial_lines_come_first(
        true,
        "mediator: denied denied2.test:443 (not_in_allowlist): add \"denied2.test:443\" to the allow list of authority \"agent\"",
    )
}

/// With `--mediator-socket` alone, the line is the answer's (a SOCKS5 reply has no
/// reason; the request named the host), said before the answer is passed on.
fn the_denial_line_comes_before_curls_error_without_the_admin_api() -> TestResult {
    denial_lines_come_first(
        false,
        "mediator: denied denied2.test:443 (socks5 2): SOCKS5 REP 0x02",
    )
}

/// pip (the system's, `python3 -m pip`) through the proxy: our line before its first
/// warning or error.
fn the_denial_line_comes_before_pips_error() -> TestResult {
    if Command::new("/usr/bin/python3")
        .args(["-m", "pip", "--version"])
        .output()
        .map_or(true, |o| !o.status.success())
    {
        let why = "needs pip: sudo apt-get install python3-pip";
        return if std::env::var("CI").is_ok_and(|v| v == "true") {
            Err(format!("CI=true, and this test cannot run: {why}"))
        } else {
            Err(format!("{IGNORED}{why}"))
        };
    }
    let s = Scratch::new("answers-pip");
    let real = Real::start(&s.0, false);
    // pip writes its temporary files and downloads under `work` (the mediator's files stay
    // outside the writable root).
    let work = s.path("work");
    let tmp = work.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let mut flags = real.with_admin();
    flags.extend(["--allow-write".into(), work.display().to_string()]);
    let out = run_merged(
        &work,
        &flags,
        "/usr/bin/python3 -m pip download --no-cache-dir --disable-pip-version-check --retries 0 --timeout 10 --index-url https://pypi.denied.test/simple/ -d dl nothing-here",
        &[("TMPDIR", &tmp), ("HOME", &work)],
    );
    ours_first(
        &out,
        "mediator: denied pypi.denied.test:443 (not_in_allowlist)",
        |l| l.contains("ERROR") || l.contains("WARNING") || l.contains("Error"),
    )
}

/// A captured flow (`curl --noproxy '*'`) that the mediator denies is reset after the
/// line is said (with the admin API's words).
fn a_captured_flows_denial_line_comes_before_curls_error() -> TestResult {
    crate::capture::tun_usable()?;
    let s = Scratch::new("answers-capture");
    let real = Real::start(&s.0, false);
    let out = run_merged(
        &s.0,
        &real.with_admin(),
        "curl -sS -m 10 --noproxy '*' https://captured.denied.test/",
        &[],
    );
    ours_first(
        &out,
        "mediator: denied captured.denied.test:443 (not_in_allowlist)",
        curl_error,
    )
}

/// The mediator terminates TLS to `api.test`; curl, told to trust another CA, refuses
/// the mediator's certificate: the shim names curl and says what to do on stderr, and
/// the report lists it with reason `client_rejected_certificate`.
fn a_client_refusing_the_mediators_certificate_is_told_what_to_do() -> TestResult {
    let s = Scratch::new("answers-reject");
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    // The origin only has to accept: the client's handshake fails before any request.
    std::thread::spawn(move || for _c in origin.incoming() {});
    let real = Real::start(&s.0, true);
    write_ca(&s.path("other-ca.pem"));
    let mut flags = real.with_admin();
    flags.extend([
        "--report-file".into(),
        s.path("report.json").display().to_string(),
    ]);
    let out = run_merged(
        &s.0,
        &flags,
        &format!(
            "curl -sS -m 10 --cacert {} https://api.test:{port}/",
            s.path("other-ca.pem").display()
        ),
        &[],
    );
    // The program is named (read from /proc while its tunnel was open), and so is what
    // overrides the shim's variables for it.
    let line = format!(
        "shim: curl does not trust the mediator's CA: it refused the certificate for api.test:{port} (TLS alert unknown_ca); the shim's CA variables"
    );
    if !out.contains("curl reads CURL_CA_BUNDLE unless --cacert") {
        return Err(format!("no advice for curl:\n{out}"));
    }
    if out.matches(&line).count() != 1 {
        return Err(format!("expected {line:?} once:\n{out}"));
    }
    let report = read_json(&s.path("report.json"))?;
    let entry = report["denials"].as_array().and_then(|d| {
        d.iter()
            .find(|e| e["reason"] == "client_rejected_certificate")
    });
    match entry {
        Some(e) if e["host"] == "api.test" && e["port"] == port => Ok(()),
        _ => Err(format!(
            "no client_rejected_certificate entry: {report}\n{out}"
        )),
    }
}

/// npm (Node.js) does not send an alert when it refuses a certificate: it hangs up during
/// the handshake. The mediator's close record says so (`client_tls:
/// closed_after_certificate`), and the shim names npm, says it hung up, and what
/// overrides the shim's variables for it (its own `cafile`). npm prints its error as soon
/// as it has hung up, while the refusal reaches the shim through the mediator's close
/// record: the order of the two lines is not the test's.
fn npm_refusing_the_mediators_certificate_without_an_alert_is_told_what_to_do() -> TestResult {
    if Command::new("npm")
        .arg("--version")
        .output()
        .map_or(true, |o| !o.status.success())
    {
        let why = "needs npm: sudo apt-get install npm";
        return if std::env::var("CI").is_ok_and(|v| v == "true") {
            Err(format!("CI=true, and this test cannot run: {why}"))
        } else {
            Err(format!("{IGNORED}{why}"))
        };
    }
    let s = Scratch::new("answers-npm");
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    // The origin only has to accept: the client's handshake fails before any request.
    std::thread::spawn(move || for _c in origin.incoming() {});
    let real = Real::start(&s.0, true);
    // npm's cache and logs go under `work` (the mediator's files stay outside the
    // writable root).
    let work = s.path("work");
    std::fs::create_dir_all(&work).unwrap();
    write_ca(&work.join("other-ca.pem"));
    let mut flags = real.with_admin();
    flags.extend(["--allow-write".into(), work.display().to_string()]);
    let out = run_merged(
        &work,
        &flags,
        &format!(
            "npm view nothing-here --registry https://api.test:{port}/ --cafile other-ca.pem --fetch-retries 0 --cache cache --no-update-notifier"
        ),
        &[("HOME", &work)],
    );
    let line = format!(
        "shim: npm does not trust the mediator's CA: it refused the certificate for api.test:{port} (it hung up during the TLS handshake, without an alert); the shim's CA variables"
    );
    if out.matches(&line).count() != 1 {
        return Err(format!("expected {line:?} once:\n{out}"));
    }
    if !out.contains("npm error code SELF_SIGNED_CERT_IN_CHAIN") {
        return Err(format!("npm did not refuse the certificate:\n{out}"));
    }
    if out.contains("npm's own `cafile` setting") {
        Ok(())
    } else {
        Err(format!("no advice for npm:\n{out}"))
    }
}
