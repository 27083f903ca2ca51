//! Transparent capture (design section 15): a client that ignores the proxy variables
//! (`curl --noproxy '*'`, a Python raw socket, `getent`) is carried by the shim's TUN
//! device and user-space stack to the authority's channel, decided and logged there
//! (`capture: true`); names outside an embedded grant get NXDOMAIN; a denial resets the
//! connection at once; other UDP is dropped and counted; without a TUN device, an explicit
//! `--capture` is an error and the default says so once and runs without it. Socket mode's
//! report of the run's denials from the mediator's admin API is here too (its flows are
//! the captured ones and the proxy's alike).
//!
//! Network rule: the origins are on 127.0.0.1 (reached by the mediator, outside the
//! sandbox); inside, only synthetic addresses of the sandbox's own namespace are targets.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{SHIM, Scratch, expect, read_json, stdout};
use crate::{IGNORED, Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        curl_without_proxy_reaches_an_allowed_origin_and_the_log_says_capture,
        a_raw_socket_client_is_carried_byte_exact_with_half_close,
        bytes_an_origin_sends_first_reach_the_client_every_time,
        a_name_outside_the_grant_is_nxdomain_at_once_and_reported,
        socket_mode_marks_the_connect_and_a_denial_resets_at_once,
        a_denied_ssh_client_prints_the_operators_reason,
        a_channel_that_cannot_be_reached_is_said_and_listed,
        getent_shows_synthetic_addresses,
        a_burst_of_dns_queries_is_answered_in_full,
        localhost_is_answered_as_loopback_without_a_denial,
        udp_to_a_synthetic_address_is_dropped_and_counted,
        tls_on_443_passes_the_sni_rule_and_a_mismatched_sni_is_refused,
        the_tun_device_is_the_only_route_out,
        the_tun_device_has_no_link_local_address,
        explicit_capture_failing_outside_the_sandbox_stops_before_the_command,
        the_default_failing_outside_the_sandbox_says_so_once_and_runs,
        explicit_capture_without_a_tun_device_fails_with_the_reason,
        the_default_without_a_tun_device_says_so_once_and_runs,
        socket_mode_reads_the_runs_denials_with_their_reasons_from_the_admin_api,
    ]
}

/// The Python the tests run inside (a system one, readable by any user).
const PYTHON: &str = "/usr/bin/python3";

/// `Err(IGNORED...)` when this user cannot open `/dev/net/tun` (capture then degrades,
/// which other tests cover).
pub(crate) fn tun_usable() -> TestResult {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
    {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "{IGNORED}/dev/net/tun is not usable by uid {} here ({e}); capture degrades (tested by the_default_without_a_tun_device_says_so_once_and_runs)",
            nix::unistd::geteuid()
        )),
    }
}

/// An HTTP origin on 127.0.0.1 answering every request with `hi`.
pub(crate) fn http_origin() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ =
                c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi");
        }
    });
    port
}

/// An echo origin on 127.0.0.1: bytes back until EOF, then its own FIN.
pub(crate) fn echo_origin() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if c.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = c.shutdown(Shutdown::Write);
            });
        }
    });
    port
}

/// The shim in embedded mode with `grant`, its decision log and report in `s`, running
/// `sh -c script`.
fn embedded(s: &Scratch, grant: &[OsString], script: &str) -> Output {
    Command::new(SHIM)
        .args(grant)
        .arg("--decision-log")
        .arg(s.path("log.json"))
        .arg("--report-file")
        .arg(s.path("report.json"))
        .args(["--", "sh", "-c", script])
        .current_dir(&s.0)
        .output()
        .unwrap()
}

/// A grant of `name:port` (resolved by the mediator to 127.0.0.1).
fn grant(name: &str, port: u16) -> Vec<OsString> {
    Vec::from(args![
        "--allow",
        format!("{name}:{port}"),
        "--resolve",
        format!("{name}=127.0.0.1"),
        "--allow-private",
        "127.0.0.1/32",
    ])
}

fn log_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn all_output(out: &Output) -> String {
    format!(
        "status {:?}, stdout: {}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn curl_without_proxy_reaches_an_allowed_origin_and_the_log_says_capture() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-curl");
    let port = http_origin();
    let out = embedded(
        &s,
        &grant("origin.test", port),
        &format!("curl -sS --noproxy '*' -m 10 http://origin.test:{port}/"),
    );
    expect("curl through capture", &stdout(&out), "hi")
        .map_err(|e| format!("{e}; {}", all_output(&out)))?;
    let lines = log_lines(&s.path("log.json"));
    let decision = lines
        .iter()
        .find(|l| l["event"] == "decision")
        .ok_or_else(|| format!("no decision line: {lines:?}"))?;
    expect(
        "decision line",
        &format!(
            "{} {} {} {} {}",
            decision["protocol"],
            decision["host"],
            decision["decision"],
            decision["pin"],
            decision["capture"]
        ),
        "\"connect\" \"origin.test\" \"allow\" \"127.0.0.1\" true",
    )?;
    let close = lines.iter().find(|l| l["event"] == "close");
    expect(
        "close line capture",
        &close.map(|c| c["capture"].to_string()).unwrap_or_default(),
        "true",
    )?;
    let report = read_json(&s.path("report.json"))?;
    expect(
        "report capture state",
        &report["capture"]["state"].to_string(),
        "\"on\"",
    )?;
    expect(
        "captured connections",
        &report["capture"]["connections"].to_string(),
        "1",
    )
}

fn a_raw_socket_client_is_carried_byte_exact_with_half_close() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-echo");
    let port = echo_origin();
    // 10 MiB up while reading; the write half is shut once all is sent, and the echo
    // ends only if that FIN reached the origin and the origin's came back.
    let client = format!(
        r#"{PYTHON} -c '
import socket, threading, random
n = 10 * 1024 * 1024
data = random.Random(7).randbytes(n)
s = socket.create_connection(("echo.test", {port}), timeout=60)
def send():
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
t = threading.Thread(target=send)
t.start()
got = bytearray()
while True:
    b = s.recv(65536)
    if not b:
        break
    got += b
t.join()
print("same" if bytes(got) == data else "differ: %d bytes back" % len(got))
'"#
    );
    let out = embedded(&s, &grant("echo.test", port), &client);
    expect("echo", &stdout(&out), "same").map_err(|e| format!("{e}; {}", all_output(&out)))
}

/// An origin on 127.0.0.1 that speaks first: `banner` on accept, then, if `half_close`,
/// its FIN at once (and it reads until the client's); else an echo until EOF.
fn speaking_origin(banner: &'static [u8], half_close: bool) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                if c.write_all(banner).is_err() {
                    return;
                }
                if half_close {
                    let _ = c.shutdown(Shutdown::Write);
                }
                let mut buf = [0u8; 4096];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if !half_close && c.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = c.shutdown(Shutdown::Write);
            });
        }
    });
    port
}

fn bytes_an_origin_sends_first_reach_the_client_every_time() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-first");
    let banner = speaking_origin(b"SSH-2.0-banner\r\n", false);
    let bye = speaking_origin(b"bye-first\n", true);
    // The origin's first bytes often come in the same read as the channel's 200, while
    // the child's handshake with the stack is still completing; 50 connections of each
    // kind, each checked byte for byte.
    let client = format!(
        r#"{PYTHON} -c '
import socket
bad = []
def read_all(s):
    got = b""
    while True:
        b = s.recv(4096)
        if not b:
            return got
        got += b
for i in range(50):
    s = socket.create_connection(("banner.test", {banner}), timeout=10)
    got = b""
    while not got.endswith(b"\r\n"):
        b = s.recv(4096)
        if not b:
            break
        got += b
    if got != b"SSH-2.0-banner\r\n":
        bad.append(("banner", i, got))
    s.sendall(b"hello\n")
    s.shutdown(socket.SHUT_WR)
    got = read_all(s)
    if got != b"hello\n":
        bad.append(("echo", i, got))
    s.close()
    s = socket.create_connection(("bye.test", {bye}), timeout=10)
    got = read_all(s)
    if got != b"bye-first\n":
        bad.append(("bye", i, got))
    s.close()
print("all %d" % (2 * 50) if not bad else "lost %d: %r" % (len(bad), bad[:5]))
'"#
    );
    let flags = args![
        "--allow",
        format!("banner.test:{banner}"),
        "--allow",
        format!("bye.test:{bye}"),
        "--resolve",
        "banner.test=127.0.0.1",
        "--resolve",
        "bye.test=127.0.0.1",
        "--allow-private",
        "127.0.0.1/32",
    ];
    let out = embedded(&s, &flags, &client);
    expect("first bytes", &stdout(&out), "all 100")
        .map_err(|e| format!("{e}; {}", all_output(&out)))
}

fn a_name_outside_the_grant_is_nxdomain_at_once_and_reported() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-nx");
    let port = http_origin();
    let client = format!(
        r#"{PYTHON} -c '
import socket, time
t = time.monotonic()
try:
    socket.create_connection(("elsewhere.test", {port}), timeout=10)
    print("connected")
except socket.gaierror as e:
    print("gaierror %.3f" % (time.monotonic() - t))
'"#
    );
    let out = embedded(&s, &grant("origin.test", port), &client);
    let got = stdout(&out);
    let secs: f64 = got
        .strip_prefix("gaierror ")
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("expected a resolution failure; {}", all_output(&out)))?;
    if secs >= 1.0 {
        return Err(format!("the failure took {secs} s"));
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = "mediator: denied elsewhere.test (not_in_allowlist): add --allow elsewhere.test to the shim command";
    if stderr.matches(line).count() != 1 {
        return Err(format!("expected the denial said once on stderr: {stderr}"));
    }
    let report = read_json(&s.path("report.json"))?;
    let d = &report["denials"][0];
    expect(
        "report",
        &format!(
            "{} {} {} {}",
            d["protocol"], d["status"], d["reason"], d["host"]
        ),
        "\"dns\" 3 \"not_in_allowlist\" \"elsewhere.test\"",
    )
}

/// A stand-in for a mediator's authority socket: answers each CONNECT (recording its
/// head) with a 200 and a relay to `origin` when the target is `allowed`, else with the
/// mediator's 403 JSON.
pub(crate) fn stand_in(
    dir: &Path,
    allowed: String,
    origin: u16,
) -> (PathBuf, Arc<Mutex<Vec<String>>>) {
    std::fs::create_dir_all(dir.join("sockets")).unwrap();
    let path = dir.join("sockets/agent.sock");
    let l = UnixListener::bind(&path).unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let h = Arc::clone(&heads);
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let labels = crate::support::read_labels(&mut c);
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            // The labels the shim put in front, as a last line of the head.
            let labels: Vec<String> = labels
                .iter()
                .map(|(t, v)| format!("{t:#04x}={v}"))
                .collect();
            h.lock()
                .unwrap()
                .push(format!("{head}PROXY {}\r\n", labels.join(" ")));
            let target = head.split(' ').nth(1).unwrap_or_default().to_owned();
            if target == allowed {
                let mut o = TcpStream::connect(("127.0.0.1", origin)).unwrap();
                c.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
                let mut o2 = o.try_clone().unwrap();
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut r, &mut o2);
                    let _ = o2.shutdown(Shutdown::Write);
                });
                let _ = std::io::copy(&mut o, &mut c);
                continue;
            }
            let (host, port) = target.rsplit_once(':').unwrap_or((&target, "0"));
            // On port 22, the operator's reason too (design 18).
            let message = if port == "22" {
                format!(r#","message":"{SSH_REASON}""#)
            } else {
                String::new()
            };
            let body = format!(
                r#"{{"error":"egress_denied","authority":"agent","host":"{host}","port":{port},"reason":"not_in_allowlist","detail":"{host} is not in the allow list","hint":"add \"{host}:{port}\" to the allow list of authority \"agent\""{message}}}"#
            );
            let _ = write!(
                c,
                "HTTP/1.1 403 Forbidden\r\nX-Mediator-Decision: deny; reason=not_in_allowlist\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (path, heads)
}

fn socket_mode_marks_the_connect_and_a_denial_resets_at_once() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-sock");
    let port = http_origin();
    let (socket, heads) = stand_in(&s.0, format!("origin.test:{port}"), port);
    let script = format!(
        r#"curl -sS --noproxy '*' -m 10 http://origin.test:{port}/; echo; {PYTHON} -c '
import socket, time
t = time.monotonic()
try:
    socket.create_connection(("198.51.100.7", 5432), timeout=10)
    print("connected")
except ConnectionRefusedError:
    print("refused %.3f" % (time.monotonic() - t))
'"#
    );
    let out = Command::new(SHIM)
        .arg("--mediator-socket")
        .arg(&socket)
        .arg("--report-file")
        .arg(s.path("report.json"))
        .args(["--", "sh", "-c", &script])
        .current_dir(&s.0)
        .output()
        .unwrap();
    let got = stdout(&out);
    let mut lines = got.lines();
    expect("allowed", lines.next().unwrap_or_default(), "hi")
        .map_err(|e| format!("{e}; {}", all_output(&out)))?;
    let secs: f64 = lines
        .next()
        .and_then(|l| l.strip_prefix("refused "))
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("expected a reset; {}", all_output(&out)))?;
    if secs >= 1.0 {
        return Err(format!("the reset took {secs} s"));
    }
    let heads = heads.lock().unwrap().clone();
    let want = [
        format!("CONNECT origin.test:{port} HTTP/1.1\r\n"),
        "CONNECT 198.51.100.7:5432 HTTP/1.1\r\n".to_owned(),
    ];
    for w in &want {
        let Some(h) = heads.iter().find(|h| h.starts_with(w.as_str())) else {
            return Err(format!("no {w:?} in {heads:?}"));
        };
        if !h.contains("X-Mediator-Capture: 1\r\n") {
            return Err(format!("unmarked: {h:?}"));
        }
        // The run's labels came first, from the shim (design section 20).
        if !h.contains("PROXY 0xe0=inv-") {
            return Err(format!("unlabelled: {h:?}"));
        }
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.contains("mediator: denied 198.51.100.7:5432 (not_in_allowlist): add \"198.51.100.7:5432\" to the allow list of authority \"agent\"") {
        return Err(format!("no live denial line: {stderr}"));
    }
    let report = read_json(&s.path("report.json"))?;
    let d = &report["denials"][0];
    expect(
        "report",
        &format!(
            "{} {} {} {} {}",
            d["protocol"], d["status"], d["reason"], d["host"], d["port"]
        ),
        "\"connect\" 403 \"not_in_allowlist\" \"198.51.100.7\" 5432",
    )?;
    expect("refused", &report["capture"]["refused"].to_string(), "1")
}

/// The operator's reason the stand-in gives for port 22.
const SSH_REASON: &str = "forges are reached through the mirror; use git.mirror.test";

fn a_denied_ssh_client_prints_the_operators_reason() -> TestResult {
    tun_usable()?;
    if !Path::new("/usr/bin/ssh").exists() {
        let why = "needs ssh: sudo apt-get install openssh-client";
        return if std::env::var("CI").is_ok_and(|v| v == "true") {
            Err(format!("CI=true, and this test cannot run: {why}"))
        } else {
            Err(format!("{IGNORED}{why}"))
        };
    }
    let s = Scratch::new("cap-ssh");
    let (socket, _) = stand_in(&s.0, "none.test:1".to_owned(), http_origin());
    let out = Command::new(SHIM)
        .arg("--mediator-socket")
        .arg(&socket)
        .args([
            "--",
            "/usr/bin/ssh",
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=10",
            "git@198.51.100.7",
            "true",
        ])
        .current_dir(&s.0)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "Received disconnect from 198.51.100.7 port 22:1: egress to 198.51.100.7 port 22 denied (not_in_allowlist): {SSH_REASON}"
    );
    if !stderr.contains(&want) {
        return Err(format!("ssh should print {want:?}; {}", all_output(&out)));
    }
    // And the live line says it too.
    if !stderr.contains(&format!(
        "mediator: denied 198.51.100.7:22 (not_in_allowlist): {SSH_REASON}"
    )) {
        return Err(format!("no live denial line with the reason: {stderr}"));
    }
    Ok(())
}

fn a_channel_that_cannot_be_reached_is_said_and_listed() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-dead");
    std::fs::create_dir_all(s.path("dead")).unwrap();
    let socket = s.path("dead/x.sock");
    // A socket file nobody listens on: connect() is refused.
    drop(UnixListener::bind(&socket).unwrap());
    let out = Command::new(SHIM)
        .arg("--mediator-socket")
        .arg(&socket)
        .arg("--report-file")
        .arg(s.path("report.json"))
        .args([
            "--",
            "sh",
            "-c",
            "curl -sS --noproxy '*' -m 5 http://origin.test:9/ 2>/dev/null; \
             curl -sS -m 5 http://proxied.test:9/ 2>/dev/null; echo ran",
        ])
        .current_dir(&s.0)
        .output()
        .unwrap();
    expect("command", &stdout(&out), "ran").map_err(|e| format!("{e}; {}", all_output(&out)))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = format!(
        "shim: cannot reach the channel {} (Connection refused (os error 111)): the command's connections fail until a mediator serves it",
        socket.display()
    );
    if !stderr.contains(&line) {
        return Err(format!("expected {line:?} on stderr: {stderr}"));
    }
    let report = read_json(&s.path("report.json"))?;
    let failures = report["channel_failures"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let errors = report["channel_errors"].as_u64().unwrap_or(0);
    if errors == 0 || failures.len() as u64 != errors {
        return Err(format!(
            "expected each of the channel_errors listed: {errors} vs {failures:?}"
        ));
    }
    let has = |via: &str, target: serde_json::Value| {
        failures.iter().any(|f| {
            f["via"] == via
                && f["target"] == target
                && f["error"] == "Connection refused (os error 111)"
        })
    };
    if !has("capture", "origin.test:9".into()) || !has("proxy", serde_json::Value::Null) {
        return Err(format!(
            "expected a capture and a proxy failure: {failures:?}"
        ));
    }
    Ok(())
}

fn getent_shows_synthetic_addresses() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-getent");
    // `getent hosts` asks for AAAA first (glibc's getent): it shows the ULA address;
    // `ahostsv4` shows the 198.18.0.0/15 one.
    let out = embedded(
        &s,
        &grant("origin.test", 80),
        "getent hosts origin.test; getent ahostsv4 origin.test | head -1",
    );
    let got = stdout(&out);
    let mut lines = got.lines();
    let v6 = lines.next().unwrap_or_default();
    if !(v6.starts_with("fd") && v6.ends_with(" origin.test")) {
        return Err(format!("getent hosts: {v6:?}; {}", all_output(&out)));
    }
    let v4 = lines.next().unwrap_or_default();
    let ip: std::net::Ipv4Addr = v4
        .split_whitespace()
        .next()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("getent ahostsv4: {v4:?}"))?;
    if ip.octets()[0] != 198 || !(18..=19).contains(&ip.octets()[1]) {
        return Err(format!("{ip} is not in 198.18.0.0/15"));
    }
    Ok(())
}

fn a_burst_of_dns_queries_is_answered_in_full() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-dns-burst");
    let out = Command::new(SHIM)
        .args(["--allow", "*.burst.test"])
        .arg("--report-file")
        .arg(s.path("report.json"))
        .arg("--")
        .arg(crate::support::me())
        .args(["probe", "dns-burst", "3000"])
        .current_dir(&s.0)
        .output()
        .unwrap();
    expect("burst", &stdout(&out), "answered 3000 of 3000")
        .map_err(|e| format!("{e}; {}", all_output(&out)))?;
    let report = read_json(&s.path("report.json"))?;
    expect("dropped", &report["capture"]["dropped"].to_string(), "[]")
}

fn localhost_is_answered_as_loopback_without_a_denial() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-localhost");
    // A raw A query for `localhost` to the stub (glibc answers it from /etc/hosts and
    // never asks; other resolvers do).
    let client = format!(
        r#"{PYTHON} -c '
import socket
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x09localhost\x00\x00\x01\x00\x01"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(5)
u.sendto(q, (ns, 53))
r = u.recv(512)
print("rcode %d answers %d %s" % (r[3] & 15, r[7], socket.inet_ntoa(r[-4:])))
'"#
    );
    let out = embedded(&s, &grant("origin.test", 80), &client);
    expect("localhost", &stdout(&out), "rcode 0 answers 1 127.0.0.1")
        .map_err(|e| format!("{e}; {}", all_output(&out)))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("denied") {
        return Err(format!("a denial for localhost: {stderr}"));
    }
    let report = read_json(&s.path("report.json"))?;
    expect("denials", &report["denials"].to_string(), "[]")
}

fn udp_to_a_synthetic_address_is_dropped_and_counted() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-udp");
    let client = format!(
        r#"{PYTHON} -c '
import socket
ip = socket.getaddrinfo("origin.test", 9, socket.AF_INET)[0][4][0]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"x", (ip, 9))
u.sendto(b"y", (ip, 9))
print(ip)
'"#
    );
    let out = embedded(&s, &grant("origin.test", 80), &client);
    let ip = stdout(&out);
    let report = read_json(&s.path("report.json"))?;
    let dropped = &report["capture"]["dropped"];
    let entry = dropped
        .as_array()
        .and_then(|a| a.iter().find(|d| d["kind"] == "udp"))
        .ok_or_else(|| format!("no UDP drop in {dropped}; {}", all_output(&out)))?;
    expect(
        "UDP drop",
        &format!(
            "{} {} {} {}",
            entry["destination"], entry["port"], entry["host"], entry["packets"]
        ),
        &format!("\"{ip}\" 9 \"origin.test\" 2"),
    )
}

fn tls_on_443_passes_the_sni_rule_and_a_mismatched_sni_is_refused() -> TestResult {
    tun_usable()?;
    // An origin on 127.44.0.1:443 that records the first bytes of each connection.
    let l = match TcpListener::bind("127.44.0.1:443") {
        Ok(l) => l,
        Err(e) => {
            return Err(format!(
                "{IGNORED}binding 127.44.0.1:443 needs root here ({e})"
            ));
        }
    };
    let seen = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let rec = Arc::clone(&seen);
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = [0u8; 16];
            let n = c.read(&mut buf).unwrap_or(0);
            rec.lock().unwrap().push(buf[..n].to_vec());
        }
    });
    let s = Scratch::new("cap-sni");
    let flags = args![
        "--allow",
        "front.test:443",
        "--resolve",
        "front.test=127.44.0.1",
        "--allow-private",
        "127.44.0.1/32",
    ];
    // The same client twice: SNI front.test (passes), then SNI other.test on a
    // connection to front.test's address (refused before the origin sees a byte).
    let out = embedded(
        &s,
        &flags,
        "curl -sk --noproxy '*' -m 5 https://front.test/ >/dev/null 2>&1; \
         curl -sk --noproxy '*' -m 5 --connect-to other.test:443:front.test:443 https://other.test/ >/dev/null 2>&1; true",
    );
    let start = Instant::now();
    while seen.lock().unwrap().is_empty() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let seen = seen.lock().unwrap().clone();
    if seen.len() != 2 || seen[0].first() != Some(&0x16) {
        return Err(format!(
            "the origin should see one ClientHello and one empty connection: {seen:?}; {}",
            all_output(&out)
        ));
    }
    if !seen[1].is_empty() {
        return Err(format!(
            "bytes reached the origin after a mismatched SNI: {seen:?}"
        ));
    }
    let report = read_json(&s.path("report.json"))?;
    let reasons: Vec<String> = report["denials"]
        .as_array()
        .map(|a| a.iter().map(|d| d["reason"].to_string()).collect())
        .unwrap_or_default();
    expect("denials", &reasons.join(","), "\"sni_mismatch\"")
}

fn the_tun_device_is_the_only_route_out() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-routes");
    let me = crate::support::me();
    let run = |probe: &str| {
        let out = Command::new(SHIM)
            .args(grant("origin.test", 80))
            .arg("--")
            .arg(&me)
            .args(["probe", probe])
            .current_dir(&s.0)
            .output()
            .unwrap();
        stdout(&out)
    };
    expect("interfaces", &run("ifaces"), "lo,tun0")?;
    expect("routes leave by", &run("route-ifaces"), "tun0")
}

/// No link-local address on the device: the kernel would send a router solicitation
/// from it as the device comes up, a packet that starts the capture stack in every run,
/// however little the command does.
fn the_tun_device_has_no_link_local_address() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-lla");
    let out = Command::new(SHIM)
        .args(grant("origin.test", 80))
        .args(["--", "cat", "/proc/net/if_inet6"])
        .current_dir(&s.0)
        .output()
        .unwrap();
    let on_tun: Vec<String> = stdout(&out)
        .lines()
        .filter(|l| l.ends_with("tun0"))
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
        .collect();
    if on_tun.len() != 1 || on_tun[0].starts_with("fe80") {
        return Err(format!(
            "tun0 should have only the sandbox's own IPv6 address: {on_tun:?}; {}",
            all_output(&out)
        ));
    }
    Ok(())
}

/// The shim in a mount namespace (of a new user namespace mapping this user to root)
/// where `/dev/net` is an empty tmpfs: no TUN device can be made there.
fn without_tun(s: &Scratch, flags: &[&str]) -> Output {
    with_tun_mounted(s, "mount -t tmpfs tmpfs /dev/net", flags)
}

/// The shim where `/dev/net/tun` opens but is not a TUN device (`/dev/null` bound over
/// it): init opens it, and the outer shim's `TUNSETIFF` is what fails.
fn with_tun_not_a_tun(s: &Scratch, flags: &[&str]) -> Output {
    with_tun_mounted(s, "mount --bind /dev/null /dev/net/tun", flags)
}

fn with_tun_mounted(s: &Scratch, mount: &str, flags: &[&str]) -> Output {
    Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c"])
        .arg(format!(r#"{mount} && exec "$@""#))
        .arg("sh")
        .arg(SHIM)
        .args(flags)
        // Root of a namespace that maps one uid cannot give the command another.
        .args(["--allow-degraded", "same-uid"])
        .args([
            "--allow",
            "origin.test",
            "--report-file",
            s.path("report.json").to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo ran",
        ])
        .current_dir(&s.0)
        .output()
        .unwrap()
}

/// Checks that `out` is a run `--capture` stopped before its command: exit 125, the reason
/// said once with the way out, and no word from a hand-off cut short.
fn stopped_before_the_command(out: &Output) -> TestResult {
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(125) || !stdout(out).is_empty() {
        return Err(format!(
            "expected exit 125 before the command ran; {}",
            all_output(out)
        ));
    }
    let said = stderr
        .matches("transparent capture (--capture) is not possible here: create a TUN device through /dev/net/tun:")
        .count();
    if said != 1 || !stderr.contains("run with --no-capture") || stderr.contains("may start") {
        return Err(format!(
            "expected the reason once, and nothing else: {stderr}"
        ));
    }
    Ok(())
}

/// Checks that `out` ran its command without capture, said so once, and that the report
/// in `s` says capture was unavailable; returns the report's `capture` section.
fn degraded_once(out: &Output, s: &Scratch) -> Result<serde_json::Value, String> {
    expect("command", &stdout(out), "ran").map_err(|e| format!("{e}; {}", all_output(out)))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said = stderr.matches("shim: transparent capture is off: ").count();
    if said != 1 || !stderr.contains("clients that ignore HTTP_PROXY have no network") {
        return Err(format!("expected one degradation line: {stderr}"));
    }
    let report = read_json(&s.path("report.json"))?;
    expect(
        "capture state",
        &report["capture"]["state"].to_string(),
        "\"unavailable\"",
    )?;
    Ok(report["capture"].clone())
}

fn explicit_capture_without_a_tun_device_fails_with_the_reason() -> TestResult {
    let s = Scratch::new("cap-notun");
    stopped_before_the_command(&without_tun(&s, &["--capture"]))
}

/// The device fails in the outer shim (after init handed it over): under `--capture`
/// the command never starts, the reason is said once, and the report is still written.
fn explicit_capture_failing_outside_the_sandbox_stops_before_the_command() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-notatun");
    stopped_before_the_command(&with_tun_not_a_tun(&s, &["--capture"]))?;
    let report = read_json(&s.path("report.json"))?;
    expect("exit status", &report["exit_status"].to_string(), "125")
}

/// The same without `--capture`: said once, the command runs without capture, and the
/// report says why.
fn the_default_failing_outside_the_sandbox_says_so_once_and_runs() -> TestResult {
    tun_usable()?;
    let s = Scratch::new("cap-notatun-degrade");
    let capture = degraded_once(&with_tun_not_a_tun(&s, &[]), &s)?;
    let reason = capture["reason"].to_string();
    if !reason.contains("create a TUN device through /dev/net/tun") {
        return Err(format!("the report's reason: {reason}"));
    }
    Ok(())
}

fn the_default_without_a_tun_device_says_so_once_and_runs() -> TestResult {
    let s = Scratch::new("cap-degrade");
    degraded_once(&without_tun(&s, &[]), &s).map(drop)
}

/// A stand-in for a mediator whose config names an admin socket: its authority socket
/// answers every SOCKS5 request with REP 0x02 (no reason on the wire); its admin API lists
/// two denials, one of the shim's own process (with the reason and hint) and one of
/// another process. Returns the config file and where the shim's pid goes.
fn stand_in_with_admin(dir: &Path) -> (PathBuf, Arc<std::sync::atomic::AtomicU32>) {
    std::fs::create_dir_all(dir.join("sockets")).unwrap();
    let channel = UnixListener::bind(dir.join("sockets/agent.sock")).unwrap();
    std::thread::spawn(move || {
        for c in channel.incoming() {
            let Ok(mut c) = c else { continue };
            crate::support::read_labels(&mut c);
            let mut buf = [0u8; 512];
            let _ = c.read(&mut buf); // greeting
            let _ = c.write_all(&[5, 0]);
            let _ = c.read(&mut buf); // request
            let _ = c.write_all(&[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
        }
    });
    let admin_path = dir.join("admin.sock");
    let admin = UnixListener::bind(&admin_path).unwrap();
    let pid = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let p = Arc::clone(&pid);
    std::thread::spawn(move || {
        for c in admin.incoming() {
            let Ok(mut c) = c else { continue };
            let mut buf = [0u8; 2048];
            let _ = c.read(&mut buf);
            let mine = p.load(std::sync::atomic::Ordering::SeqCst);
            let body = format!(
                r#"{{"authority":"agent","denials":[{{"id":7,"ts":"2026-01-01T00:00:00.000Z","protocol":"socks5","host":"blocked.test","port":443,"reason":"denied_by_rule","rule":"blocked.test","detail":"blocked.test:443 matches deny entry","hint":"the grant denies this destination","status":2,"peer":{{"pid":{mine},"uid":0,"gid":0}}}},{{"id":8,"ts":"2026-01-01T00:00:00.000Z","protocol":"connect","host":"other-run.test","port":443,"reason":"not_in_allowlist","rule":null,"detail":"d","hint":"h","status":403,"peer":{{"pid":1,"uid":0,"gid":0}}}}],"dropped":0}}"#
            );
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let config = dir.join("mediator.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\nsocket_dir = \"{}\"\nadmin_socket = \"{}\"\n\n[[authority]]\nname = \"agent\"\nallow = [\"x.test\"]\n",
            dir.join("sockets").display(),
            admin_path.display()
        ),
    )
    .unwrap();
    (config, pid)
}

fn socket_mode_reads_the_runs_denials_with_their_reasons_from_the_admin_api() -> TestResult {
    let s = Scratch::new("cap-admin");
    let (config, pid) = stand_in_with_admin(&s.0);
    let child = Command::new(SHIM)
        .arg("--config")
        .arg(&config)
        .args(["--authority", "agent", "--report-file"])
        .arg(s.path("report.json"))
        .args([
            "--",
            "sh",
            "-c",
            "curl -sS -m 5 -x \"$ALL_PROXY\" http://blocked.test:443/ 2>&1 | head -1",
        ])
        .current_dir(&s.0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    pid.store(child.id(), std::sync::atomic::Ordering::SeqCst);
    let out = child.wait_with_output().unwrap();
    let report = read_json(&s.path("report.json"))?;
    let denials = report["denials"].as_array().cloned().unwrap_or_default();
    if denials.len() != 1 {
        return Err(format!(
            "expected this run's one denial from the admin API: {denials:?}; {}",
            all_output(&out)
        ));
    }
    let d = &denials[0];
    expect(
        "denial",
        &format!(
            "{} {} {} {} {}",
            d["protocol"], d["status"], d["reason"], d["host"], d["port"]
        ),
        "\"socks5\" 2 \"denied_by_rule\" \"blocked.test\" 443",
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line =
        "mediator: denied blocked.test:443 (denied_by_rule): the grant denies this destination";
    if stderr.matches(line).count() != 1 {
        return Err(format!("expected the denial said once: {stderr}"));
    }
    Ok(())
}
