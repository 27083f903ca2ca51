//! One host-selected connection (design section 18): `--pass-fd N` hands the caller's
//! accepted connection to the command under the same number, every other inherited
//! descriptor is closed, and nothing else reaches in or out; `--listen-fd N` hands a
//! listening socket at descriptor 3 with `LISTEN_FDS`/`LISTEN_PID`; the caller's own
//! `LISTEN_*` variables never pass without it; a listening socket given as `--pass-fd`,
//! a descriptor that is not open, and a collision are refused before anything runs.
//!
//! Network rule: the sockets are on 127.0.0.1 of the test's host side; inside, the
//! command reaches nothing but what it was handed.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::process::{Command, Output, Stdio};

use crate::support::{SHIM, expect};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        a_passed_connection_is_served_and_nothing_else_is_held_or_reached,
        a_listening_socket_comes_at_3_with_listen_fds,
        bad_handovers_are_refused_before_anything_runs,
    ]
}

/// The Python the commands run (a system one, readable by any user).
const PYTHON: &str = "/usr/bin/python3";

/// Runs the shim with `fd` (given as its stdin) moved to descriptor 5 and `/etc/hostname`
/// open as 6, with `flags` and a Python `script` as the command.
fn shim_with_fd5(
    fd: OwnedFd,
    flags: &str,
    script: &str,
    env: &[(&str, &str)],
) -> std::process::Child {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            r#"exec 5<&0 6</etc/hostname 0</dev/null; exec "$0" --no-capture --allow example.com {flags} -- {PYTHON} -c "$1""#
        ))
        .arg(SHIM)
        .arg(script)
        .envs(env.iter().copied())
        .stdin(Stdio::from(fd))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finished(child: std::process::Child) -> Result<Output, String> {
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "shim failed ({:?}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn a_passed_connection_is_served_and_nothing_else_is_held_or_reached() -> TestResult {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (accepted, _) = listener.accept().unwrap();
    // A port free on the host: the command listens on it inside its namespace, and the
    // host cannot reach that listener.
    let inner_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = format!(
        r#"
import os, socket
s = socket.socket(fileno=5)
inner = socket.socket()
inner.bind(("127.0.0.1", {inner_port}))
inner.listen()
s.sendall(b"hello from the sandbox\n")
got = s.makefile("rb").readline()
s.sendall(b"got " + got)
s.close()
try:
    os.fstat(6); print("fd 6 open")
except OSError:
    print("fd 6 closed")
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5); print("reached the host")
except OSError:
    print("host unreachable")
print("LISTEN_FDS", os.environ.get("LISTEN_FDS"))
"#
    );
    let child = shim_with_fd5(
        accepted.into(),
        "--pass-fd 5",
        &script,
        &[("LISTEN_FDS", "1")],
    );
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    expect("greeting", &line, "hello from the sandbox\n")?;
    // The command listens now; no connection from outside its namespace reaches it.
    if let Ok(c) = TcpStream::connect(("127.0.0.1", inner_port)) {
        return Err(format!(
            "the host reached a listener inside the sandbox: {c:?}"
        ));
    }
    (&client).write_all(b"ping\n").map_err(|e| e.to_string())?;
    line.clear();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    expect("answer", &line, "got ping\n")?;
    let out = finished(child)?;
    expect(
        "inside",
        &String::from_utf8_lossy(&out.stdout),
        "fd 6 closed\nhost unreachable\nLISTEN_FDS None\n",
    )?;
    // The host's listener saw the one connection the test made, no other.
    listener.set_nonblocking(true).unwrap();
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
        other => Err(format!(
            "the sandbox reached the host's listener: {other:?}"
        )),
    }
}

fn a_listening_socket_comes_at_3_with_listen_fds() -> TestResult {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = r#"
import os, socket
print(os.environ["LISTEN_FDS"], os.environ["LISTEN_PID"] == str(os.getpid()), flush=True)
l = socket.socket(fileno=3)
for i in range(2):
    c, _ = l.accept()
    c.sendall(b"served %d\n" % i)
    c.close()
"#;
    let child = shim_with_fd5(listener.into(), "--listen-fd 5", script, &[]);
    // The backlog holds the connections until the command accepts them.
    for i in 0..2 {
        let c = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(c)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        expect("served", &line, &format!("served {i}\n"))?;
    }
    let out = finished(child)?;
    expect("env", &String::from_utf8_lossy(&out.stdout), "1 True\n")
}

fn bad_handovers_are_refused_before_anything_runs() -> TestResult {
    let run = |fd: OwnedFd, flags: &str| -> Result<String, String> {
        let child = shim_with_fd5(fd, flags, "print('ran')", &[]);
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() || !out.stdout.is_empty() {
            return Err(format!("{flags}: the command ran: {out:?}"));
        }
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let listening = || -> OwnedFd { TcpListener::bind("127.0.0.1:0").unwrap().into() };
    let file = || -> OwnedFd { std::fs::File::open("/etc/hostname").unwrap().into() };
    for (fd, flags, want) in [
        (
            listening(),
            "--pass-fd 5",
            "--pass-fd 5 is a listening socket",
        ),
        (
            file(),
            "--listen-fd 5",
            "--listen-fd 5 is not a listening socket",
        ),
        (
            file(),
            "--pass-fd 9",
            "--pass-fd 9: descriptor 9 is not open",
        ),
        (
            file(),
            "--pass-fd 1",
            "descriptors 0, 1 and 2 are the command's standard streams",
        ),
        // (The shell opens 3 for this one.)
        (
            listening(),
            "--listen-fd 5 --pass-fd 3 3</etc/hostname",
            "--pass-fd 3 collides",
        ),
    ] {
        let err = run(fd, flags)?;
        if !err.contains(want) {
            return Err(format!("{flags}: expected {want:?} in {err:?}"));
        }
    }
    Ok(())
}
