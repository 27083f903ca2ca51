//! Rebinding, never editing (design section 18): `--control PATH` is a 0600 socket of the
//! caller's, masked inside the sandbox; `{"rebind": ...}` moves the command's new
//! connections to another authority's channel (socket mode) or to a new in-process
//! authority with the grant given (embedded mode), a bad command changes nothing, and
//! the report lists each rebind.
//!
//! Network rule: the stand-in mediators and the origin are on the host's 127.0.0.1; the
//! command reaches them only through the shim's proxy listener inside its namespace.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::capture::{echo_origin, http_origin, stand_in};
use crate::support::{Scratch, expect, read_json, shim_waiting};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        socket_mode_rebinds_new_connections_to_another_authority,
        an_open_tunnel_finishes_on_the_channel_it_was_opened_on,
        embedded_mode_rebinds_to_a_new_grant,
        after_a_rebind_the_report_has_the_new_authoritys_denials,
        with_unix_sockets_allowed_a_rebind_stays_in_the_masked_directory,
    ]
}

/// One command line on the control socket, and its answer.
fn send(control: &Path, line: &str) -> Result<serde_json::Value, String> {
    let mut c = UnixStream::connect(control).map_err(|e| format!("control socket: {e}"))?;
    writeln!(c, "{line}").map_err(|e| e.to_string())?;
    let mut answer = String::new();
    BufReader::new(c)
        .read_line(&mut answer)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&answer).map_err(|e| format!("{answer:?}: {e}"))
}

/// The script: one request before the rebind, one after; each prints curl's CONNECT
/// status and the body (`hi` from the origin). It also says whether it sees `control`.
fn script(port: u16, control: &Path) -> String {
    format!(
        r#"test -S {c} && echo control visible || echo control hidden
curl -s -p -o /dev/null -w '%{{http_connect}}\n' -m 10 http://origin.test:{port}/
read go <&5
curl -s -p -w '\n%{{http_connect}}\n' -m 10 http://origin.test:{port}/"#,
        c = control.display()
    )
}

fn first_lines(child: &mut Child, n: usize) -> Result<Vec<String>, String> {
    let out = child.stdout.as_mut().ok_or("no stdout")?;
    let mut r = BufReader::new(out);
    let mut lines = Vec::new();
    for _ in 0..n {
        let mut l = String::new();
        r.read_line(&mut l).map_err(|e| e.to_string())?;
        lines.push(l.trim_end().to_owned());
    }
    Ok(lines)
}

fn socket_mode_rebinds_new_connections_to_another_authority() -> TestResult {
    let s = Scratch::new("control-sock");
    let port = http_origin();
    // `narrow` allows nothing useful; `wide` allows the origin.
    let (narrow, _) = stand_in(&s.path("narrow"), "none.test:1".to_owned(), port);
    let (wide, heads) = stand_in(&s.path("wide"), format!("origin.test:{port}"), port);
    let control = s.path("control.sock");
    let report = s.path("report.json");
    let (mut child, mut go) = shim_waiting(
        &[
            "--no-capture",
            "--mediator-socket",
            narrow.to_str().unwrap(),
            "--control",
            control.to_str().unwrap(),
            "--report-file",
            report.to_str().unwrap(),
        ],
        &script(port, &control),
    );
    let before = first_lines(&mut child, 2)?;
    expect("before", &before.join(" "), "control hidden 403")?;
    let mode = std::fs::metadata(&control)
        .map_err(|e| e.to_string())?
        .permissions()
        .mode();
    expect("control mode", &format!("{:o}", mode & 0o777), "600")?;
    // A bad command changes nothing.
    for bad in [
        r#"{"rebind": "no-such-authority"}"#,
        r#"{"edit": {"allow": ["*"]}}"#,
        "not json",
    ] {
        let a = send(&control, bad)?;
        if a["ok"] != false || a["error"].as_str().is_none_or(str::is_empty) {
            return Err(format!("{bad}: {a}"));
        }
    }
    let a = send(
        &control,
        &format!(r#"{{"rebind": {:?}}}"#, wide.to_str().unwrap()),
    )?;
    if a["ok"] != true {
        return Err(format!("rebind refused: {a}"));
    }
    writeln!(go, "go").map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    expect("after", &String::from_utf8_lossy(&out.stdout), "hi\n200\n")?;
    if !heads
        .lock()
        .unwrap()
        .iter()
        .any(|h| h.starts_with("CONNECT origin.test"))
    {
        return Err("the wide authority never saw the request".into());
    }
    let r = read_json(&report)?;
    let rebinds = r["rebinds"].as_array().cloned().unwrap_or_default();
    if rebinds.len() != 1
        || rebinds[0]["from"] != narrow.to_str().unwrap()
        || rebinds[0]["to"] != wide.to_str().unwrap()
        || rebinds[0]["ts"].as_str().is_none()
    {
        return Err(format!("report rebinds: {}", r["rebinds"]));
    }
    if control.exists() {
        return Err("the control socket outlived the run".into());
    }
    Ok(())
}

/// A tunnel opened before a rebind keeps working on its channel; the next one opens on
/// the new channel.
fn an_open_tunnel_finishes_on_the_channel_it_was_opened_on() -> TestResult {
    let s = Scratch::new("control-open");
    let port = echo_origin();
    let target = format!("echo.test:{port}");
    let (old, old_heads) = stand_in(&s.path("old"), target.clone(), port);
    let (new, new_heads) = stand_in(&s.path("new"), target.clone(), port);
    let control = s.path("control.sock");
    let script = format!(
        r#"exec /usr/bin/python3 -c '
import os, socket, sys
def tunnel():
    c = socket.create_connection(("127.0.0.1", int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1].strip("/"))))
    c.sendall(b"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += c.recv(1)
    return c
t = tunnel()
t.sendall(b"one"); print(t.recv(3).decode(), flush=True)
os.read(5, 3)
t.sendall(b"two"); print(t.recv(3).decode(), flush=True)
u = tunnel(); u.sendall(b"new"); print(u.recv(3).decode(), flush=True)
'"#
    );
    let (mut child, mut go) = shim_waiting(
        &[
            "--no-capture",
            "--mediator-socket",
            old.to_str().unwrap(),
            "--control",
            control.to_str().unwrap(),
        ],
        &script,
    );
    expect("before", &first_lines(&mut child, 1)?.join(" "), "one")?;
    let a = send(
        &control,
        &format!(r#"{{"rebind": {:?}}}"#, new.to_str().unwrap()),
    )?;
    if a["ok"] != true {
        return Err(format!("rebind refused: {a}"));
    }
    writeln!(go, "go").map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    expect("after", &String::from_utf8_lossy(&out.stdout), "two\nnew\n")
        .map_err(|e| format!("{e}; {}", String::from_utf8_lossy(&out.stderr)))?;
    let count = |h: &Arc<std::sync::Mutex<Vec<String>>>| {
        h.lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("CONNECT"))
            .count()
    };
    expect(
        "CONNECTs seen by the old and the new channel",
        &format!("{} {}", count(&old_heads), count(&new_heads)),
        "1 1",
    )
}

fn embedded_mode_rebinds_to_a_new_grant() -> TestResult {
    let s = Scratch::new("control-emb");
    let port = http_origin();
    let control = s.path("control.sock");
    let report = s.path("report.json");
    let resolve = "origin.test=127.0.0.1".to_owned();
    let (mut child, mut go) = shim_waiting(
        &[
            "--no-capture",
            "--allow",
            "none.test",
            "--allow-private",
            "127.0.0.1",
            "--resolve",
            &resolve,
            "--control",
            control.to_str().unwrap(),
            "--report-file",
            report.to_str().unwrap(),
        ],
        &script(port, &control),
    );
    let before = first_lines(&mut child, 2)?;
    expect("before", &before.join(" "), "control hidden 403")?;
    let a = send(&control, r#"{"rebind": {"allow": ["*.com"]}}"#)?;
    if a["ok"] != false || !a["error"].as_str().unwrap_or("").contains("*.com") {
        return Err(format!("a bad grant must be refused naming it: {a}"));
    }
    let a = send(
        &control,
        &format!(
            r#"{{"rebind": {{"allow": ["origin.test:{port}"], "allow_private": ["127.0.0.1"]}}}}"#
        ),
    )?;
    if a["ok"] != true {
        return Err(format!("rebind refused: {a}"));
    }
    writeln!(go, "go").map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    expect("after", &String::from_utf8_lossy(&out.stdout), "hi\n200\n")?;
    let r = read_json(&report)?;
    expect(
        "rebinds",
        &format!("{} -> {}", r["rebinds"][0]["from"], r["rebinds"][0]["to"]),
        "\"embedded:shim\" -> \"embedded:rebind-1\"",
    )
}

/// A stand-in authority socket that answers every SOCKS5 request with REP 0x02.
fn refusing_socket(path: &Path) {
    let l = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            crate::support::read_labels(&mut c);
            let mut buf = [0u8; 512];
            let _ = c.read(&mut buf); // greeting
            let _ = c.write_all(&[5, 0]);
            let _ = c.read(&mut buf); // request
            let _ = c.write_all(&[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
        }
    });
}

/// Socket mode with the mediator's admin API (`--config`): after a rebind to another
/// authority, the run's denials under it (which the SOCKS5 reply cannot carry) come from
/// its own `/denials`, so the report has them with their operator's message.
fn after_a_rebind_the_report_has_the_new_authoritys_denials() -> TestResult {
    let s = Scratch::new("control-feed");
    std::fs::create_dir_all(s.path("sockets")).unwrap();
    refusing_socket(&s.path("sockets/agent.sock"));
    refusing_socket(&s.path("sockets/wide.sock"));
    let admin = UnixListener::bind(s.path("admin.sock")).unwrap();
    let pid = Arc::new(AtomicU32::new(0));
    let p = Arc::clone(&pid);
    std::thread::spawn(move || {
        for c in admin.incoming() {
            let Ok(mut c) = c else { continue };
            let mut buf = [0u8; 2048];
            let n = c.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]);
            let mine = p.load(Ordering::SeqCst);
            let body = if head.starts_with("GET /v1/authorities/wide/denials") {
                format!(
                    r#"{{"authority":"wide","denials":[{{"id":9,"ts":"2026-01-01T00:00:00.000Z","protocol":"socks5","host":"wide-denied.test","port":443,"reason":"denied_by_rule","rule":"wide-denied.test","detail":"d","hint":"h","message":"not from agents","status":2,"peer":{{"pid":{mine},"uid":0,"gid":0}}}}],"dropped":0}}"#
                )
            } else {
                r#"{"authority":"agent","denials":[],"dropped":0}"#.to_owned()
            };
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let config = s.path("mediator.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\nsocket_dir = \"{}\"\nadmin_socket = \"{}\"\n\n[[authority]]\nname = \"agent\"\nallow = [\"x.test\"]\n\n[[authority]]\nname = \"wide\"\nallow = [\"y.test\"]\n",
            s.path("sockets").display(),
            s.path("admin.sock").display()
        ),
    )
    .unwrap();
    let control = s.path("control.sock");
    let report = s.path("report.json");
    let (child, mut go) = shim_waiting(
        &[
            "--no-capture",
            "--config",
            config.to_str().unwrap(),
            "--authority",
            "agent",
            "--control",
            control.to_str().unwrap(),
            "--report-file",
            report.to_str().unwrap(),
        ],
        r#"read go <&5
curl -sS -m 5 -x "$ALL_PROXY" http://wide-denied.test:443/ >/dev/null 2>&1
echo done"#,
    );
    pid.store(child.id(), Ordering::SeqCst);
    // The control socket listens once the sandbox is up: ask until it answers (5 s).
    let mut answer = Err("the control socket never answered".to_owned());
    for _ in 0..100 {
        answer = send(&control, r#"{"rebind": "wide"}"#);
        if answer.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let a = answer?;
    if a["ok"] != true {
        return Err(format!("rebind refused: {a}"));
    }
    writeln!(go, "go").map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    expect("script", &String::from_utf8_lossy(&out.stdout), "done\n")?;
    let r = read_json(&report)?;
    let denials = r["denials"].as_array().cloned().unwrap_or_default();
    if !denials
        .iter()
        .any(|d| d["host"] == "wide-denied.test" && d["message"] == "not from agents")
    {
        return Err(format!(
            "the new authority's denial is not in the report: {}; stderr: {}",
            r["denials"],
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// With `--allow-unix-sockets` the command can connect to any socket it sees: a rebind to
/// a socket outside the first one's directory (which is masked inside) is refused, since
/// the command could reach that authority directly and keep it after a later rebind
/// narrows it again; a socket in that directory is taken.
fn with_unix_sockets_allowed_a_rebind_stays_in_the_masked_directory() -> TestResult {
    let s = Scratch::new("control-unix");
    let (narrow, _) = stand_in(&s.path("narrow"), "none.test:1".to_owned(), 1);
    let (elsewhere, _) = stand_in(&s.path("elsewhere"), "none.test:1".to_owned(), 1);
    // A second authority beside the first, in the masked directory.
    let beside = narrow.with_file_name("wide.sock");
    let _keep = UnixListener::bind(&beside).map_err(|e| e.to_string())?;
    let control = s.path("control.sock");
    let (child, mut go) = shim_waiting(
        &[
            "--no-capture",
            "--allow-unix-sockets",
            "--mediator-socket",
            narrow.to_str().unwrap(),
            "--control",
            control.to_str().unwrap(),
        ],
        "read go <&5",
    );
    // The control socket is made before the command runs.
    if !crate::support::wait_until(|| control.exists(), 10) {
        return Err("no control socket".into());
    }
    let answers = [elsewhere.to_str().unwrap(), "wide"]
        .iter()
        .map(|target| send(&control, &format!(r#"{{"rebind": {target:?}}}"#)))
        .collect::<Result<Vec<_>, _>>()?;
    writeln!(go, "go").map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let refused = &answers[0];
    if refused["ok"] != false
        || !refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("--allow-unix-sockets"))
    {
        return Err(format!("a socket outside the masked directory: {refused}"));
    }
    if answers[1]["ok"] != true || answers[1]["rebind"]["to"] != beside.to_str().unwrap() {
        return Err(format!("a socket beside the first: {}", answers[1]));
    }
    if !out.status.success() {
        return Err(format!(
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}
