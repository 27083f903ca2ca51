//! The network namespace and the channel: only loopback inside, nothing of the host's
//! reachable, the proxy listener carried to the authority's socket (relay) or to the
//! embedded mediator, and the denials the `--report` shows.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;

use crate::support::{Fixture, Scratch, expect, probe_command, read_json, stdout};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        without_capture_only_lo_exists_and_no_route_leaves_the_namespace,
        host_loopback_listener_is_unreachable_from_inside,
        relay_reaches_the_unix_socket_server_outside,
        proxy_variables_point_at_the_sandbox_listener,
        other_authority_sockets_are_unreachable_even_with_unix_sockets_allowed,
        report_lists_the_denials_the_mediator_sent,
        embedded_mode_reaches_an_allowed_loopback_origin_and_denies_others,
        identical_denials_are_reported_once_with_a_count,
    ]
}

fn without_capture_only_lo_exists_and_no_route_leaves_the_namespace() -> TestResult {
    let fx = Fixture::new("net");
    fx.check(&args!["--no-capture"], &args!["ifaces"], "lo")?;
    fx.check(&args!["--no-capture"], &args!["routes"], "v4=0 v6=0")?;
    fx.check(&[], &args!["unshare-net"], "err:EPERM")
}

fn host_loopback_listener_is_unreachable_from_inside() -> TestResult {
    let fx = Fixture::new("hostlo");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    fx.check(&[], &args!["connect", addr], "err:ECONNREFUSED")
}

fn relay_reaches_the_unix_socket_server_outside() -> TestResult {
    let fx = Fixture::new("relay");
    fx.check(&[], &args!["echo-via-proxy"], "ping")
}

fn proxy_variables_point_at_the_sandbox_listener() -> TestResult {
    let fx = Fixture::new("env");
    let got = fx.probe(
        &[],
        &args![
            "env",
            "https_proxy",
            "ALL_PROXY",
            "NO_PROXY",
            "GRPC_PROXY",
            "HTTP_PROXY",
        ],
    )?;
    let v: Vec<&str> = got.split(' ').collect();
    let Some(port) = v[0].strip_prefix("http://127.0.0.1:") else {
        return Err(format!("https_proxy={}", v[0]));
    };
    let http = format!("http://127.0.0.1:{port}");
    let want = [
        http.as_str(),
        &format!("socks5h://127.0.0.1:{port}"),
        "localhost,127.0.0.1,::1",
        http.as_str(),
        http.as_str(),
    ];
    expect("proxy variables", &got, &want.join(" "))
}

fn other_authority_sockets_are_unreachable_even_with_unix_sockets_allowed() -> TestResult {
    let fx = Fixture::new("sockdir");
    let other = fx.socket.parent().unwrap().join("agent-b.sock");
    let _l = UnixListener::bind(&other).unwrap();
    fx.check(
        &args!["--allow-unix-sockets"],
        &args!["connect-unix", &other],
        "err:EACCES",
    )
}

fn report_lists_the_denials_the_mediator_sent() -> TestResult {
    let s = Scratch::new("report");
    std::fs::create_dir_all(s.path("sockets")).unwrap();
    let path = s.path("sockets/deny.sock");
    let l = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf);
            let body = r#"{"error":"egress_denied","authority":"a","host":"blocked.test","port":80,"reason":"not_in_allowlist","detail":"d","hint":"h"}"#;
            let _ = write!(
                c,
                "HTTP/1.1 403 Forbidden\r\nX-Mediator-Decision: deny; reason=not_in_allowlist\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let report = s.path("report.json");
    let out = probe_command(
        &args!["--mediator-socket", &path, "--report-file", &report],
        &args!["http-via-proxy", "http://blocked.test/"],
    )
    .output()
    .unwrap();
    expect("status line", &stdout(&out), "HTTP/1.1 403 Forbidden")?;
    let v = read_json(&report)?;
    expect("connections", &v["connections"].to_string(), "1")?;
    expect(
        "denied host",
        &v["denials"][0]["host"].to_string(),
        "\"blocked.test\"",
    )?;
    expect(
        "reason",
        &v["denials"][0]["reason"].to_string(),
        "\"not_in_allowlist\"",
    )
}

fn embedded_mode_reaches_an_allowed_loopback_origin_and_denies_others() -> TestResult {
    let s = Scratch::new("embedded");
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in origin.incoming() {
            let Ok(mut c) = c else { continue };
            let mut buf = [0u8; 2048];
            let _ = c.read(&mut buf);
            let _ =
                c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi");
        }
    });
    let report = s.path("report.json");
    // The first line of what the probe printed, in embedded mode with `grant` and a report.
    let run = |grant: &[OsString], probe: &[OsString]| -> String {
        let mut flags = grant.to_vec();
        flags.extend(args!["--report-file", &report]);
        stdout(&probe_command(&flags, probe).output().unwrap())
    };
    let grant = args![
        "--allow",
        format!("127.0.0.1:{port}"),
        "--allow-private",
        "127.0.0.1/32",
    ];
    expect(
        "allowed origin",
        &run(
            &grant,
            &args!["http-via-proxy", format!("http://127.0.0.1:{port}/")],
        ),
        "HTTP/1.1 200 OK",
    )?;
    expect(
        "denied host",
        &run(
            &grant,
            &args!["http-via-proxy", format!("http://127.0.0.2:{port}/")],
        ),
        "HTTP/1.1 403 Forbidden",
    )?;
    let v = read_json(&report)?;
    let denial = &v["denials"][0];
    expect(
        "report reason",
        &denial["reason"].to_string(),
        "\"not_in_allowlist\"",
    )?;
    expect("report status", &denial["status"].to_string(), "403")?;
    expect(
        "report protocol",
        &denial["protocol"].to_string(),
        "\"http\"",
    )?;
    // A CONNECT denial is labelled as the decision log labels it, and its hint names the
    // flag that would allow it.
    expect(
        "CONNECT denied",
        &run(
            &args!["--allow", "x.test"],
            &args!["connect-via-proxy", "denied.test:443"],
        ),
        "HTTP/1.1 403 Forbidden",
    )?;
    let v = read_json(&report)?;
    let d = &v["denials"][0];
    expect(
        "CONNECT report",
        &format!("{} {} {}", d["protocol"], d["status"], d["hint"]),
        "\"connect\" 403 \"add --allow denied.test:443 to the shim command\"",
    )
}

/// A client that retries is denied the same way each time: the report lists the denial
/// once, with how many times it happened.
fn identical_denials_are_reported_once_with_a_count() -> TestResult {
    let s = Scratch::new("report-count");
    let report = s.path("report.json");
    let shim = crate::support::SHIM;
    let me = crate::support::me();
    let script = format!(
        "for i in 1 2 3; do {me} probe connect-via-proxy denied.test:443; done; {me} probe connect-via-proxy other.test:443",
        me = me.display()
    );
    let out = std::process::Command::new(shim)
        .args(["--allow", "x.test", "--quiet-denials", "--report-file"])
        .arg(&report)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    expect(
        "the four CONNECTs",
        &stdout(&out),
        "HTTP/1.1 403 Forbidden\nHTTP/1.1 403 Forbidden\nHTTP/1.1 403 Forbidden\nHTTP/1.1 403 Forbidden",
    )?;
    let v = read_json(&report)?;
    let listed: Vec<String> = v["denials"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|d| format!("{} x{}", d["host"].as_str().unwrap_or(""), d["count"]))
        .collect();
    expect(
        "the report's denials",
        &listed.join(", "),
        "denied.test x3, other.test x1",
    )
}
