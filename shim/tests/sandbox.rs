//! End-to-end tests of the shim as real processes (`harness = false`).
//!
//! The binary plays two roles. Run normally, it drives the `shim` binary: each test
//! builds a scratch directory, starts `shim ... -- <this binary> probe ...` and asserts on
//! the probe's output (an errno name or `ok`) and on what the host sees afterwards. Run
//! as `probe`, it is the confined command and reports one system call's result, so the
//! assertions name exact errnos instead of parsing shell error messages.
//!
//! When started as root, the whole suite then runs again as uid/gid 65534 through
//! `setpriv`, if this machine allows unprivileged user namespaces.
//!
//! Network rule: every address used here is loopback, or inside the sandbox's own network
//! namespace.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::zombie_processes,
    missing_docs,
    // The probe issues raw system calls that the sandbox must refuse.
    unsafe_code
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SHIM: &str = env!("CARGO_BIN_EXE_shim");

/// The CA variables the shim sets when given a CA (design section 12).
const CA_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "AWS_CA_BUNDLE",
    "CARGO_HTTP_CAINFO",
    "DENO_CERT",
];

/// The system bundles the shim looks for, in order.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

// ------------------------------------------------------------------------------------
// Probe side: runs inside the sandbox.

fn errno_result<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => match e.raw_os_error() {
            Some(n) => format!("err:{:?}", nix::errno::Errno::from_raw(n)),
            None => format!("err:{e}"),
        },
    }
}

fn nix_result<T>(r: nix::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("err:{e:?}"),
    }
}

fn probe(args: &[String]) -> i32 {
    let a = |i: usize| args.get(i).cloned().unwrap_or_default();
    let out = match a(0).as_str() {
        "write" => errno_result(
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(a(1))
                .and_then(|mut f| f.write_all(b"pwned")),
        ),
        "append" => errno_result(
            std::fs::OpenOptions::new()
                .append(true)
                .open(a(1))
                .and_then(|mut f| f.write_all(b"x")),
        ),
        "read" => errno_result(std::fs::read(a(1))),
        "mkdir" => errno_result(std::fs::create_dir(a(1))),
        "rename" => errno_result(std::fs::rename(a(1), a(2))),
        "remove" => errno_result(std::fs::remove_file(a(1))),
        "chmod" => errno_result(std::fs::set_permissions(
            a(1),
            std::fs::Permissions::from_mode(0o666),
        )),
        "socket-unix" => nix_result(nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::empty(),
            None,
        )),
        "socketpair" => nix_result(nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            None,
            nix::sys::socket::SockFlag::empty(),
        )),
        "connect-unix" => errno_result(std::os::unix::net::UnixStream::connect(a(1))),
        "unshare-user" => nix_result(nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER)),
        "unshare-net" => nix_result(nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)),
        "io-uring" => {
            let mut params = [0u8; 120];
            // SAFETY: io_uring_setup reads/writes our 120-byte params buffer only.
            let rc = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4, params.as_mut_ptr()) };
            if rc < 0 {
                format!("err:{:?}", nix::errno::Errno::last())
            } else {
                "ok".into()
            }
        }
        "clone3" => {
            // SAFETY: a NULL clone_args with size 0 makes no memory access; only
            // the filter's answer matters.
            let rc = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
            if rc < 0 {
                format!("err:{:?}", nix::errno::Errno::last())
            } else {
                "ok".into()
            }
        }
        "x32-getpid" => {
            // SAFETY: getpid through the x32 ABI number; takes no arguments.
            let rc = unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
            format!("returned {rc}")
        }
        "remount-rw" => nix_result(nix::mount::mount(
            None::<&str>,
            "/",
            None::<&str>,
            nix::mount::MsFlags::MS_REMOUNT,
            None::<&str>,
        )),
        "umount" => nix_result(nix::mount::umount2(
            a(1).as_str(),
            nix::mount::MntFlags::MNT_DETACH,
        )),
        "capeff" => std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("Cap") || l.starts_with("NoNewPrivs"))
            .collect::<Vec<_>>()
            .join(" "),
        "ifaces" => {
            let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v.join(",")
        }
        "routes" => {
            // Non-header lines of the kernel's route tables (main table, IPv4 and IPv6).
            let v4 = std::fs::read_to_string("/proc/net/route")
                .unwrap_or_default()
                .lines()
                .skip(1)
                .count();
            let v6 = std::fs::read_to_string("/proc/net/ipv6_route")
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.contains(" lo"))
                .count();
            format!("v4={v4} v6={v6}")
        }
        "connect" => {
            match TcpStream::connect_timeout(&a(1).parse().unwrap(), Duration::from_secs(2)) {
                Ok(_) => "ok".into(),
                Err(e) => errno_result::<()>(Err(e)),
            }
        }
        "pids" => {
            let mut pids: Vec<u32> = std::fs::read_dir("/proc")
                .unwrap()
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect();
            pids.sort();
            format!("{pids:?}")
        }
        "env" => args[1..]
            .iter()
            .map(|k| std::env::var(k).unwrap_or_default())
            .collect::<Vec<_>>()
            .join(" "),
        "echo-via-proxy" => {
            let proxy = std::env::var("HTTP_PROXY").unwrap();
            let addr = proxy.trim_start_matches("http://");
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"ping\n").unwrap();
            let mut line = String::new();
            BufReader::new(s).read_line(&mut line).unwrap();
            line.trim().to_owned()
        }
        "http-via-proxy" => {
            // Absolute-form GET through the proxy; prints the status line.
            let proxy = std::env::var("HTTP_PROXY").unwrap();
            let mut s = TcpStream::connect(proxy.trim_start_matches("http://")).unwrap();
            write!(
                s,
                "GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                a(1)
            )
            .unwrap();
            let mut all = String::new();
            let _ = s.read_to_string(&mut all);
            all.lines().next().unwrap_or_default().to_owned()
        }
        "connect-via-proxy" => {
            // HTTP CONNECT through the proxy; prints the status line.
            let proxy = std::env::var("HTTP_PROXY").unwrap();
            let mut s = TcpStream::connect(proxy.trim_start_matches("http://")).unwrap();
            write!(s, "CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", a(1)).unwrap();
            let mut line = String::new();
            let _ = BufReader::new(s).read_line(&mut line);
            line.trim().to_owned()
        }
        "spawn-and-exit" => {
            // Leave a background child (a `sleep` whose argument marks it) and exit.
            Command::new("sleep")
                .arg(a(1))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            "ok".into()
        }
        "ca-check" => {
            // One line per CA variable: unset, or what can be done with the file it names
            // and whether it holds the expected CA (a(1), a PEM file) and the system bundle.
            let squeeze = |b: &[u8]| -> Vec<u8> {
                b.iter()
                    .copied()
                    .filter(|c| !c.is_ascii_whitespace())
                    .collect()
            };
            let want = squeeze(&std::fs::read(a(1)).unwrap());
            let system = SYSTEM_BUNDLES
                .iter()
                .find_map(|p| std::fs::read(p).ok())
                .map(|b| squeeze(&b))
                .unwrap_or_default();
            let contains = |hay: &[u8], needle: &[u8]| {
                !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
            };
            let mut lines = Vec::new();
            for name in CA_VARS {
                let Ok(path) = std::env::var(name) else {
                    lines.push(format!("{name} unset"));
                    continue;
                };
                let body = std::fs::read(&path).map(|b| squeeze(&b));
                let read =
                    errno_result(body.as_ref().map(|_| ()).map_err(|e| {
                        std::io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(0))
                    }));
                let body = body.unwrap_or_default();
                let write = errno_result(
                    std::fs::OpenOptions::new()
                        .append(true)
                        .open(&path)
                        .and_then(|mut f| f.write_all(b"x")),
                );
                let chmod = errno_result(std::fs::set_permissions(
                    &path,
                    std::fs::Permissions::from_mode(0o666),
                ));
                let remove = errno_result(std::fs::remove_file(&path));
                let ca = if body == want {
                    "only"
                } else if body.ends_with(&want) {
                    "last"
                } else {
                    "missing"
                };
                let sys = if body.starts_with(&system) && contains(&system, b"BEGINCERTIFICATE") {
                    "system"
                } else {
                    "no-system"
                };
                lines.push(format!(
                    "{name} read={read} write={write} chmod={chmod} remove={remove} ca={ca} {sys}"
                ));
            }
            lines.join("\n")
        }
        other => format!("unknown probe {other}"),
    };
    println!("{out}");
    0
}

// ------------------------------------------------------------------------------------
// Driver side.

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let base = std::env::temp_dir().join(format!(
            "shim-e2e-{}-{}-{tag}",
            nix::unistd::geteuid(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        Self(std::fs::canonicalize(&base).unwrap())
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A Unix-socket server standing in for the mediator: echoes lines back.
struct EchoServer {
    path: PathBuf,
}

impl EchoServer {
    fn start(dir: &Path) -> Self {
        // A directory of its own, as a mediator's socket_dir: the shim masks it.
        let sockets = dir.join("sockets");
        std::fs::create_dir_all(&sockets).unwrap();
        let path = sockets.join("authority.sock");
        let l = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { continue };
                std::thread::spawn(move || {
                    let mut w = c.try_clone().unwrap();
                    for line in BufReader::new(c).lines() {
                        let Ok(line) = line else { break };
                        if writeln!(w, "{line}").is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self { path }
    }
}

fn me() -> String {
    std::env::current_exe()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn shim_cmd(socket: &Path, extra: &[&str], probe_args: &[&str]) -> Command {
    let mut c = Command::new(SHIM);
    c.arg("--mediator-socket")
        .arg(socket)
        .args(extra)
        .arg("--")
        .arg(me())
        .arg("probe")
        .args(probe_args);
    c
}

fn run_probe(
    s: &Scratch,
    socket: &Path,
    extra: &[&str],
    probe_args: &[&str],
) -> Result<String, String> {
    let out = shim_cmd(socket, extra, probe_args)
        .current_dir(&s.0)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(format!(
            "shim failed: {:?}, stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn expect(what: &str, got: &str, want: &str) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: expected {want:?}, got {got:?}"))
    }
}

fn make_repo(s: &Scratch) -> PathBuf {
    let w = s.path("work");
    std::fs::create_dir_all(w.join(".git/hooks")).unwrap();
    std::fs::create_dir_all(w.join(".git/objects/ab")).unwrap();
    std::fs::write(w.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(w.join(".git/index"), "").unwrap();
    std::fs::write(w.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    for f in [
        ".bashrc",
        ".profile",
        ".zshrc",
        ".gitconfig",
        ".gitmodules",
        ".ripgreprc",
        ".mcp.json",
    ] {
        std::fs::write(w.join(f), "original\n").unwrap();
    }
    std::fs::create_dir_all(w.join(".vscode")).unwrap();
    std::fs::write(w.join(".vscode/settings.json"), "{}").unwrap();
    w
}

fn writable(w: &Path) -> Vec<String> {
    vec!["--allow-write".into(), w.to_string_lossy().into_owned()]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn host_has_process_with_arg(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == marker.as_bytes()))
        })
}

fn wait_until(mut cond: impl FnMut() -> bool, secs: u64) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

// ------------------------------------------------------------------------------------
// The tests.

fn writing_each_mandatory_deny_file_fails_while_git_objects_and_index_stay_writable()
-> Result<(), String> {
    let s = Scratch::new("deny");
    let srv = EchoServer::start(&s.0);
    let w = make_repo(&s);
    let extra = writable(&w);
    for f in [
        ".bashrc",
        ".profile",
        ".zshrc",
        ".gitconfig",
        ".gitmodules",
        ".ripgreprc",
        ".mcp.json",
        ".git/config",
        ".vscode/settings.json",
    ] {
        let got = run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["write", w.join(f).to_str().unwrap()],
        )?;
        expect(&format!("write {f}"), &got, "err:EROFS")?;
        let got = run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["remove", w.join(f).to_str().unwrap()],
        )?;
        // A protected path is a mount point (EBUSY); inside a protected directory the
        // whole directory is read-only (EROFS).
        let want = if f.contains('/') && !f.starts_with(".git/") {
            "err:EROFS"
        } else {
            "err:EBUSY"
        };
        expect(&format!("remove {f}"), &got, want)?;
    }
    expect(
        "write .git/hooks/pre-commit",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["write", w.join(".git/hooks/pre-commit").to_str().unwrap()],
        )?,
        "err:EROFS",
    )?;
    expect(
        "write .git/index",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["write", w.join(".git/index").to_str().unwrap()],
        )?,
        "ok",
    )?;
    expect(
        "write .git/objects/ab/obj",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["write", w.join(".git/objects/ab/obj").to_str().unwrap()],
        )?,
        "ok",
    )?;
    expect(
        "write a project file",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["write", w.join("src.rs").to_str().unwrap()],
        )?,
        "ok",
    )?;
    expect(
        "original content kept",
        &std::fs::read_to_string(w.join(".bashrc")).unwrap(),
        "original\n",
    )?;
    Ok(())
}

fn renaming_dot_git_away_fails() -> Result<(), String> {
    let s = Scratch::new("mvgit");
    let srv = EchoServer::start(&s.0);
    let w = make_repo(&s);
    let got = run_probe(
        &s,
        &srv.path,
        &strs(&writable(&w)),
        &[
            "rename",
            w.join(".git").to_str().unwrap(),
            w.join(".git_old").to_str().unwrap(),
        ],
    )?;
    expect("mv .git .git_old", &got, "err:EBUSY")?;
    // Also with the real mv, from inside the repository.
    let out = Command::new(SHIM)
        .arg("--mediator-socket")
        .arg(&srv.path)
        .args(writable(&w))
        .args(["--", "mv", ".git", ".git_old"])
        .current_dir(&w)
        .output()
        .unwrap();
    if out.status.success() || !w.join(".git/config").exists() {
        return Err(format!("mv .git succeeded: {out:?}"));
    }
    Ok(())
}

fn creating_a_missing_protected_path_fails_and_leaves_nothing_behind() -> Result<(), String> {
    let s = Scratch::new("missing");
    let srv = EchoServer::start(&s.0);
    let w = s.path("work");
    std::fs::create_dir_all(w.join(".git")).unwrap(); // no hooks, no config
    std::fs::create_dir_all(w.join("nested/inner/.git/hooks")).unwrap();
    let extra = writable(&w);
    for (op, p) in [
        ("write", ".mcp.json"),
        ("write", ".gitmodules"),
        ("write", ".vscode/tasks.json"),
        ("mkdir", ".idea/x"),
        ("write", ".git/hooks/pre-commit"),
        ("write", ".git/config"),
        ("write", "nested/inner/.mcp.json"),
        ("write", "nested/inner/.git/hooks/post-checkout"),
    ] {
        let got = run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &[op, w.join(p).to_str().unwrap()],
        )?;
        if !got.starts_with("err:") {
            return Err(format!("{op} {p}: expected an error, got {got}"));
        }
    }
    // The placeholders that made this possible are gone again.
    for p in [
        ".mcp.json",
        ".gitmodules",
        ".vscode",
        ".idea",
        ".git/hooks",
        ".git/config",
        "nested/inner/.mcp.json",
    ] {
        if w.join(p).exists() {
            return Err(format!("leftover placeholder {p}"));
        }
    }
    Ok(())
}

fn symlink_in_allowed_dir_to_denied_file_cannot_be_read() -> Result<(), String> {
    let s = Scratch::new("symlink");
    let srv = EchoServer::start(&s.0);
    let w = s.path("work");
    std::fs::create_dir_all(&w).unwrap();
    std::fs::write(s.path("secret"), "token").unwrap();
    std::fs::create_dir_all(s.path("secrets-dir")).unwrap();
    std::fs::write(s.path("secrets-dir/key"), "token").unwrap();
    std::os::unix::fs::symlink(s.path("secret"), w.join("link")).unwrap();
    std::os::unix::fs::symlink(s.path("secrets-dir"), w.join("dirlink")).unwrap();
    let mut extra = writable(&w);
    extra.extend([
        "--deny-read".into(),
        s.path("secret").to_string_lossy().into_owned(),
    ]);
    extra.extend([
        "--deny-read".into(),
        s.path("secrets-dir").to_string_lossy().into_owned(),
    ]);
    expect(
        "read via symlink",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["read", w.join("link").to_str().unwrap()],
        )?,
        "err:EACCES",
    )?;
    expect(
        "read denied file",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["read", s.path("secret").to_str().unwrap()],
        )?,
        "err:EACCES",
    )?;
    expect(
        "read in denied dir via symlink",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["read", w.join("dirlink/key").to_str().unwrap()],
        )?,
        "err:EACCES",
    )?;
    expect(
        "write in denied dir",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["write", s.path("secrets-dir/new").to_str().unwrap()],
        )?,
        "err:EACCES",
    )?;
    Ok(())
}

fn deny_read_masks_and_allow_read_reopens_beneath() -> Result<(), String> {
    let s = Scratch::new("reopen");
    let srv = EchoServer::start(&s.0);
    std::fs::create_dir_all(s.path("home/.ssh")).unwrap();
    std::fs::create_dir_all(s.path("home/project")).unwrap();
    std::fs::write(s.path("home/.ssh/id"), "key").unwrap();
    std::fs::write(s.path("home/project/readme"), "hello").unwrap();
    let extra: Vec<String> = vec![
        "--deny-read".into(),
        s.path("home").to_string_lossy().into(),
        "--allow-read".into(),
        s.path("home/project").to_string_lossy().into(),
        "--deny-read".into(),
        s.path("does-not-exist").to_string_lossy().into(),
    ];
    expect(
        "masked",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["read", s.path("home/.ssh/id").to_str().unwrap()],
        )?,
        // Inside the mask only the re-opened path exists.
        "err:ENOENT",
    )?;
    expect(
        "re-opened",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["read", s.path("home/project/readme").to_str().unwrap()],
        )?,
        "ok",
    )?;
    expect(
        "re-opened is not writable",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["write", s.path("home/project/readme").to_str().unwrap()],
        )?,
        "err:EROFS",
    )?;
    Ok(())
}

fn writing_outside_allow_write_roots_fails_and_dev_null_works() -> Result<(), String> {
    let s = Scratch::new("outside");
    let srv = EchoServer::start(&s.0);
    let w = s.path("work");
    std::fs::create_dir_all(&w).unwrap();
    let extra = writable(&w);
    expect(
        "write beside the root",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["write", s.path("outside").to_str().unwrap()],
        )?,
        "err:EROFS",
    )?;
    expect(
        "write /tmp",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["write", "/tmp/shim-e2e-should-not-exist"],
        )?,
        "err:EROFS",
    )?;
    expect(
        "write /dev/null",
        &run_probe(&s, &srv.path, &strs(&extra), &["write", "/dev/null"])?,
        "ok",
    )?;
    expect(
        "write in root",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["write", w.join("ok").to_str().unwrap()],
        )?,
        "ok",
    )?;
    if s.path("outside").exists() || Path::new("/tmp/shim-e2e-should-not-exist").exists() {
        return Err("a write outside the roots landed".into());
    }
    Ok(())
}

fn read_only_file_in_writable_dir_stays_read_only() -> Result<(), String> {
    let s = Scratch::new("rofile");
    let srv = EchoServer::start(&s.0);
    let w = s.path("work");
    std::fs::create_dir_all(&w).unwrap();
    std::fs::write(w.join("ro"), "keep").unwrap();
    std::fs::set_permissions(w.join("ro"), std::fs::Permissions::from_mode(0o444)).unwrap();
    let got = run_probe(
        &s,
        &srv.path,
        &strs(&writable(&w)),
        &["append", w.join("ro").to_str().unwrap()],
    )?;
    expect("append to a 0444 file", &got, "err:EACCES")?;
    expect(
        "content",
        &std::fs::read_to_string(w.join("ro")).unwrap(),
        "keep",
    )
}

fn umount_of_a_mask_and_remount_rw_fail_and_no_capabilities_remain() -> Result<(), String> {
    let s = Scratch::new("caps");
    let srv = EchoServer::start(&s.0);
    std::fs::write(s.path("secret"), "x").unwrap();
    let extra: Vec<String> = vec![
        "--deny-read".into(),
        s.path("secret").to_string_lossy().into(),
    ];
    let caps = run_probe(&s, &srv.path, &strs(&extra), &["capeff"])?;
    for want in [
        "CapInh:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "CapAmb:\t0000000000000000",
        "NoNewPrivs:\t1",
    ] {
        if !caps.contains(want) {
            return Err(format!("{want:?} not in {caps:?}"));
        }
    }
    expect(
        "umount mask",
        &run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &["umount", s.path("secret").to_str().unwrap()],
        )?,
        "err:EPERM",
    )?;
    expect(
        "remount / rw",
        &run_probe(&s, &srv.path, &strs(&extra), &["remount-rw"])?,
        "err:EPERM",
    )?;
    // And with the real tools (as root inside when the suite runs as root).
    let out = Command::new(SHIM)
        .arg("--mediator-socket")
        .arg(&srv.path)
        .args(["--", "mount", "-o", "remount,rw", "/"])
        .output()
        .unwrap();
    if out.status.success() {
        return Err("mount -o remount,rw / succeeded".into());
    }
    Ok(())
}

fn only_lo_exists_and_no_route_leaves_the_namespace() -> Result<(), String> {
    let s = Scratch::new("net");
    let srv = EchoServer::start(&s.0);
    expect(
        "interfaces",
        &run_probe(&s, &srv.path, &[], &["ifaces"])?,
        "lo",
    )?;
    expect(
        "routes",
        &run_probe(&s, &srv.path, &[], &["routes"])?,
        "v4=0 v6=0",
    )?;
    expect(
        "new netns",
        &run_probe(&s, &srv.path, &[], &["unshare-net"])?,
        "err:EPERM",
    )
}

fn host_loopback_listener_is_unreachable_from_inside() -> Result<(), String> {
    let s = Scratch::new("hostlo");
    let srv = EchoServer::start(&s.0);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    expect(
        "connect to host loopback listener",
        &run_probe(&s, &srv.path, &[], &["connect", &addr])?,
        "err:ECONNREFUSED",
    )
}

fn socket_af_unix_fails_eperm_while_socketpair_works() -> Result<(), String> {
    let s = Scratch::new("unix");
    let srv = EchoServer::start(&s.0);
    expect(
        "socket(AF_UNIX)",
        &run_probe(&s, &srv.path, &[], &["socket-unix"])?,
        "err:EPERM",
    )?;
    expect(
        "socketpair",
        &run_probe(&s, &srv.path, &[], &["socketpair"])?,
        "ok",
    )?;
    expect(
        "connect to the authority socket",
        &run_probe(
            &s,
            &srv.path,
            &[],
            &["connect-unix", srv.path.to_str().unwrap()],
        )?,
        "err:EPERM",
    )?;
    expect(
        "--allow-unix-sockets",
        &run_probe(&s, &srv.path, &["--allow-unix-sockets"], &["socket-unix"])?,
        "ok",
    )
}

fn unshare_user_and_io_uring_fail() -> Result<(), String> {
    let s = Scratch::new("unshare");
    let srv = EchoServer::start(&s.0);
    expect(
        "unshare(CLONE_NEWUSER)",
        &run_probe(&s, &srv.path, &[], &["unshare-user"])?,
        "err:EPERM",
    )?;
    expect(
        "io_uring_setup",
        &run_probe(&s, &srv.path, &[], &["io-uring"])?,
        "err:EPERM",
    )?;
    let out = Command::new(SHIM)
        .arg("--mediator-socket")
        .arg(&srv.path)
        .args(["--", "unshare", "-U", "true"])
        .output()
        .unwrap();
    if out.status.success() {
        return Err("unshare -U true succeeded".into());
    }
    Ok(())
}

fn clone3_is_enosys_and_x32_syscalls_kill() -> Result<(), String> {
    let s = Scratch::new("clone3");
    let srv = EchoServer::start(&s.0);
    expect(
        "clone3",
        &run_probe(&s, &srv.path, &[], &["clone3"])?,
        "err:ENOSYS",
    )?;
    let out = shim_cmd(&srv.path, &[], &["x32-getpid"]).output().unwrap();
    // SIGSYS (31) from SECCOMP_RET_KILL_PROCESS.
    expect(
        "x32 syscall",
        &format!("{:?}", out.status.code()),
        "Some(159)",
    )
}

fn background_children_die_when_the_command_exits() -> Result<(), String> {
    let s = Scratch::new("bg");
    let srv = EchoServer::start(&s.0);
    let marker = format!("{}", 900_000 + std::process::id() % 50_000);
    expect(
        "spawn",
        &run_probe(&s, &srv.path, &[], &["spawn-and-exit", &marker])?,
        "ok",
    )?;
    if !wait_until(|| !host_has_process_with_arg(&marker), 3) {
        return Err(format!("sleep {marker} survived the command"));
    }
    Ok(())
}

fn background_children_placeholders_and_ca_files_go_when_the_shim_is_killed() -> Result<(), String>
{
    let s = Scratch::new("kill");
    let srv = EchoServer::start(&s.0);
    let w = s.path("work");
    std::fs::create_dir_all(&w).unwrap();
    let tmp = s.path("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let ca = s.path("ca.pem");
    write_ca(&ca);
    let marker = format!("{}", 950_000 + std::process::id() % 40_000);
    let mut child: Child = Command::new(SHIM)
        .arg("--mediator-socket")
        .arg(&srv.path)
        .args(writable(&w))
        .arg("--ca-cert")
        .arg(&ca)
        .env("TMPDIR", &tmp)
        .args([
            "--",
            "sh",
            "-c",
            &format!("sleep {marker} & sleep {marker}"),
        ])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    if !wait_until(|| host_has_process_with_arg(&marker), 5) {
        let _ = child.kill();
        return Err("the command did not start".into());
    }
    if !w.join(".mcp.json").exists() {
        return Err("expected a placeholder while running".into());
    }
    if entries(&tmp).len() != 1 {
        return Err(format!("expected the CA directory: {:?}", entries(&tmp)));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = child.wait();
    if !wait_until(|| !host_has_process_with_arg(&marker), 3) {
        return Err(format!("sleep {marker} survived SIGKILL of the shim"));
    }
    if !wait_until(|| std::fs::read_dir(&w).unwrap().next().is_none(), 3) {
        return Err(format!(
            "leftover files: {:?}",
            std::fs::read_dir(&w)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect::<Vec<_>>()
        ));
    }
    if !wait_until(|| entries(&tmp).is_empty(), 3) {
        return Err(format!("leftover CA files: {:?}", entries(&tmp)));
    }
    Ok(())
}

fn proc_inside_shows_only_sandbox_processes() -> Result<(), String> {
    let s = Scratch::new("ps");
    let srv = EchoServer::start(&s.0);
    // init (1) and the probe (2).
    expect("pids", &run_probe(&s, &srv.path, &[], &["pids"])?, "[1, 2]")?;
    let out = Command::new(SHIM)
        .arg("--mediator-socket")
        .arg(&srv.path)
        .args(["--", "ps", "-e", "-o", "pid="])
        .output()
        .unwrap();
    let pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if pids != ["1", "2"] {
        return Err(format!("ps shows {pids:?}"));
    }
    Ok(())
}

fn relay_reaches_the_unix_socket_server_outside() -> Result<(), String> {
    let s = Scratch::new("relay");
    let srv = EchoServer::start(&s.0);
    expect(
        "echo through the channel",
        &run_probe(&s, &srv.path, &[], &["echo-via-proxy"])?,
        "ping",
    )
}

fn proxy_variables_point_at_the_sandbox_listener() -> Result<(), String> {
    let s = Scratch::new("env");
    let srv = EchoServer::start(&s.0);
    let got = run_probe(
        &s,
        &srv.path,
        &[],
        &[
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

fn exit_status_passes_through_and_signals_become_128_plus_n() -> Result<(), String> {
    let s = Scratch::new("exit");
    let srv = EchoServer::start(&s.0);
    let run = |script: &str| -> Option<i32> {
        Command::new(SHIM)
            .arg("--mediator-socket")
            .arg(&srv.path)
            .args(["--", "sh", "-c", script])
            .status()
            .unwrap()
            .code()
    };
    expect("exit 7", &format!("{:?}", run("exit 7")), "Some(7)")?;
    expect(
        "killed by SIGKILL",
        &format!("{:?}", run("kill -KILL $$")),
        "Some(137)",
    )?;
    let nf = Command::new(SHIM)
        .arg("--mediator-socket")
        .arg(&srv.path)
        .args(["--", "/nonexistent/cmd"])
        .output()
        .unwrap();
    expect(
        "command not found",
        &format!("{:?}", nf.status.code()),
        "Some(127)",
    )
}

fn sigterm_to_the_shim_reaches_the_command() -> Result<(), String> {
    let s = Scratch::new("sigterm");
    let srv = EchoServer::start(&s.0);
    let w = s.path("work");
    std::fs::create_dir_all(&w).unwrap();
    let mut child = Command::new(SHIM)
        .arg("--mediator-socket")
        .arg(&srv.path)
        .args(writable(&w))
        .args([
            "--",
            "sh",
            "-c",
            &format!(
                "trap 'exit 42' TERM; touch {}/started; while :; do sleep 0.05; done",
                w.display()
            ),
        ])
        .spawn()
        .unwrap();
    if !wait_until(|| w.join("started").exists(), 5) {
        let _ = child.kill();
        return Err("did not start".into());
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    expect(
        "status after SIGTERM",
        &format!("{:?}", status.code()),
        "Some(42)",
    )
}

fn missing_mediator_socket_is_a_clear_error() -> Result<(), String> {
    let out: Output = Command::new(SHIM)
        .args(["--mediator-socket", "/nonexistent/x.sock", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(125) || !err.contains("/nonexistent/x.sock") {
        return Err(format!("{:?} {err}", out.status));
    }
    Ok(())
}

fn report_lists_the_denials_the_mediator_sent() -> Result<(), String> {
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
    let out = shim_cmd(
        &path,
        &["--report-file", report.to_str().unwrap()],
        &["http-via-proxy", "http://blocked.test/"],
    )
    .output()
    .unwrap();
    expect(
        "status line",
        String::from_utf8_lossy(&out.stdout).trim(),
        "HTTP/1.1 403 Forbidden",
    )?;
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).map_err(|e| e.to_string())?)
            .unwrap();
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

fn embedded_mode_reaches_an_allowed_loopback_origin_and_denies_others() -> Result<(), String> {
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
    let run = |url: String| -> String {
        let out = Command::new(SHIM)
            .args([
                "--allow",
                &format!("127.0.0.1:{port}"),
                "--allow-private",
                "127.0.0.1/32",
                "--report-file",
                report.to_str().unwrap(),
                "--",
            ])
            .arg(me())
            .args(["probe", "http-via-proxy", &url])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    expect(
        "allowed origin",
        &run(format!("http://127.0.0.1:{port}/")),
        "HTTP/1.1 200 OK",
    )?;
    expect(
        "denied host",
        &run(format!("http://127.0.0.2:{port}/")),
        "HTTP/1.1 403 Forbidden",
    )?;
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    expect(
        "report reason",
        &v["denials"][0]["reason"].to_string(),
        "\"not_in_allowlist\"",
    )?;
    expect(
        "report status",
        &v["denials"][0]["status"].to_string(),
        "403",
    )?;
    expect(
        "report protocol",
        &v["denials"][0]["protocol"].to_string(),
        "\"http\"",
    )?;
    // A CONNECT denial is labelled as the decision log labels it.
    let out = Command::new(SHIM)
        .args([
            "--allow",
            "x.test",
            "--report-file",
            report.to_str().unwrap(),
            "--",
        ])
        .arg(me())
        .args(["probe", "connect-via-proxy", "denied.test:443"])
        .output()
        .unwrap();
    expect(
        "CONNECT denied",
        String::from_utf8_lossy(&out.stdout).trim(),
        "HTTP/1.1 403 Forbidden",
    )?;
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    expect(
        "CONNECT report",
        &format!(
            "{} {} {}",
            v["denials"][0]["protocol"], v["denials"][0]["status"], v["denials"][0]["hint"]
        ),
        "\"connect\" 403 null",
    )
}

/// Runs one probe with `HOME` set, returns its output.
fn run_probe_home(
    s: &Scratch,
    socket: &Path,
    home: &Path,
    extra: &[&str],
    probe_args: &[&str],
) -> Result<String, String> {
    let out = shim_cmd(socket, extra, probe_args)
        .current_dir(&s.0)
        .env("HOME", home)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(format!(
            "shim failed: {:?}, stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn renaming_a_parent_of_a_protected_path_or_link_target_fails() -> Result<(), String> {
    let s = Scratch::new("mvparent");
    let srv = EchoServer::start(&s.0);
    let w = s.path("home");
    std::fs::create_dir_all(w.join("dotfiles")).unwrap();
    std::fs::write(w.join("dotfiles/bashrc"), "original\n").unwrap();
    std::os::unix::fs::symlink("dotfiles/bashrc", w.join(".bashrc")).unwrap();
    std::fs::create_dir_all(w.join("cfg")).unwrap();
    std::fs::write(w.join("cfg/mcp.json"), "{}").unwrap();
    std::os::unix::fs::symlink("cfg/mcp.json", w.join(".mcp.json")).unwrap();
    std::os::unix::fs::symlink("missing/vscode", w.join(".vscode")).unwrap();
    std::fs::create_dir_all(w.join("src/nested/.git")).unwrap();
    std::fs::write(w.join("src/nested/.git/config"), "[core]\n").unwrap();
    let extra = writable(&w);
    let p = |r: &str| w.join(r).to_string_lossy().into_owned();
    for (op, a, b, want) in [
        ("rename", "dotfiles", "dotfiles.old", "err:EBUSY"),
        ("rename", "cfg", "cfg-old", "err:EBUSY"),
        ("rename", "src", "src-x", "err:EBUSY"),
        ("rename", "src/nested", "src/nested-x", "err:EBUSY"),
        ("write", "missing/vscode/tasks.json", "", "err:EROFS"),
        ("mkdir", "missing", "", "err:EEXIST"),
        ("write", "dotfiles/other", "", "ok"),
    ] {
        let mut args = vec![op.to_owned(), p(a)];
        if !b.is_empty() {
            args.push(p(b));
        }
        let got = run_probe_home(&s, &srv.path, &w, &strs(&extra), &strs(&args))?;
        expect(&format!("{op} {a} {b}"), &got, want)?;
    }
    expect(
        "bashrc kept",
        &std::fs::read_to_string(w.join(".bashrc")).unwrap(),
        "original\n",
    )?;
    if std::fs::symlink_metadata(w.join("missing")).is_ok() {
        return Err("leftover placeholder for the dangling link target".into());
    }
    Ok(())
}

fn git_metadata_of_submodules_and_worktrees_is_protected() -> Result<(), String> {
    let s = Scratch::new("gitmeta");
    let srv = EchoServer::start(&s.0);
    let w = make_repo(&s);
    let m = w.join(".git/modules/sub");
    std::fs::create_dir_all(m.join("hooks")).unwrap();
    std::fs::write(m.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(m.join("config"), "[core]\n").unwrap();
    let inner = m.join("modules/a/b");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::write(inner.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(inner.join("config"), "[core]\n").unwrap();
    let wt = w.join(".git/worktrees/wt");
    std::fs::create_dir_all(&wt).unwrap();
    for f in ["commondir", "gitdir", "HEAD"] {
        std::fs::write(wt.join(f), "x\n").unwrap();
    }
    let extra = writable(&w);
    let g = |r: &str| w.join(".git").join(r).to_string_lossy().into_owned();
    for (op, a, b, want) in [
        ("write", "modules/sub/config", "", "err:EROFS"),
        ("write", "modules/sub/hooks/post-checkout", "", "err:EROFS"),
        ("write", "modules/sub/config.worktree", "", "err:EROFS"),
        ("write", "modules/sub/modules/a/b/config", "", "err:EROFS"),
        (
            "write",
            "modules/sub/modules/a/b/hooks/pre-commit",
            "",
            "err:EROFS",
        ),
        ("write", "worktrees/wt/commondir", "", "err:EROFS"),
        ("write", "worktrees/wt/gitdir", "", "err:EROFS"),
        ("write", "worktrees/wt/config.worktree", "", "err:EROFS"),
        ("write", "config.worktree", "", "err:EROFS"),
        ("rename", "modules/sub", "modules/sub-x", "err:EBUSY"),
        ("rename", "modules", "modules-x", "err:EBUSY"),
        ("write", "modules/sub/index", "", "ok"),
    ] {
        let mut args = vec![op.to_owned(), g(a)];
        if !b.is_empty() {
            args.push(g(b));
        }
        let got = run_probe(&s, &srv.path, &strs(&extra), &strs(&args))?;
        expect(&format!("{op} {a} {b}"), &got, want)?;
    }
    for p in ["config.worktree", "modules/sub/modules/a/b/hooks"] {
        if w.join(".git").join(p).exists() {
            return Err(format!("leftover placeholder {p}"));
        }
    }
    Ok(())
}

fn a_new_git_commondir_is_quarantined_and_reported() -> Result<(), String> {
    let s = Scratch::new("commondir");
    let srv = EchoServer::start(&s.0);
    let w = make_repo(&s);
    let report = s.path("report.json");
    let mut extra = writable(&w);
    extra.extend(["--report-file".into(), report.to_string_lossy().into()]);
    let out = shim_cmd(
        &srv.path,
        &strs(&extra),
        &["write", w.join(".git/commondir").to_str().unwrap()],
    )
    .output()
    .unwrap();
    expect(
        "write commondir inside",
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok",
    )?;
    if w.join(".git/commondir").exists() {
        return Err("commondir left in place".into());
    }
    let moved: Vec<String> = entries(&w.join(".git"))
        .into_iter()
        .filter(|e| e.starts_with("commondir.shim-quarantine-"))
        .collect();
    if moved.len() != 1 {
        return Err(format!("quarantined copies: {moved:?}"));
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if !err.contains("tampering") || !err.contains(&moved[0]) {
        return Err(format!("stderr: {err}"));
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    expect(
        "report tampering path",
        &v["tampering"][0]["path"].to_string(),
        &format!("{:?}", w.join(".git/commondir").to_str().unwrap()),
    )
}

fn git_init_in_a_writable_root_without_a_repository_fails() -> Result<(), String> {
    let s = Scratch::new("gitinit");
    let srv = EchoServer::start(&s.0);
    let w = s.path("plain");
    std::fs::create_dir_all(&w).unwrap();
    let extra = writable(&w);
    for (op, p, want) in [
        ("mkdir", ".git", "err:EEXIST"),
        ("write", ".git/config", "err:EROFS"),
        ("mkdir", ".git/objects", "err:EROFS"),
        ("write", "file", "ok"),
    ] {
        let got = run_probe(
            &s,
            &srv.path,
            &strs(&extra),
            &[op, w.join(p).to_str().unwrap()],
        )?;
        expect(&format!("{op} {p}"), &got, want)?;
    }
    if w.join(".git").exists() {
        return Err("leftover .git placeholder".into());
    }
    Ok(())
}

fn per_user_git_and_ssh_configs_in_home_are_protected() -> Result<(), String> {
    let s = Scratch::new("homecfg");
    let srv = EchoServer::start(&s.0);
    let w = s.path("home");
    std::fs::create_dir_all(&w).unwrap();
    let extra = writable(&w);
    for p in [
        ".config/git/config",
        ".config/git/attributes",
        ".ssh/config",
        ".ssh/rc",
        ".bash_aliases",
    ] {
        let got = run_probe_home(
            &s,
            &srv.path,
            &w,
            &strs(&extra),
            &["write", w.join(p).to_str().unwrap()],
        )?;
        if !got.starts_with("err:") {
            return Err(format!("write {p} (missing): {got}"));
        }
    }
    for p in [".config", ".ssh", ".bash_aliases"] {
        if std::fs::symlink_metadata(w.join(p)).is_ok() {
            return Err(format!("leftover placeholder {p}"));
        }
    }
    std::fs::create_dir_all(w.join(".ssh")).unwrap();
    std::fs::create_dir_all(w.join(".config/git")).unwrap();
    std::fs::write(w.join(".config/git/config"), "[core]\n").unwrap();
    for (p, want) in [
        (".ssh/authorized_keys", "err:EROFS"),
        (".config/git/config", "err:EROFS"),
        (".config/other", "ok"),
    ] {
        let got = run_probe_home(
            &s,
            &srv.path,
            &w,
            &strs(&extra),
            &["write", w.join(p).to_str().unwrap()],
        )?;
        expect(&format!("write {p}"), &got, want)?;
    }
    expect(
        "rename .config",
        &run_probe_home(
            &s,
            &srv.path,
            &w,
            &strs(&extra),
            &[
                "rename",
                w.join(".config").to_str().unwrap(),
                w.join(".config-x").to_str().unwrap(),
            ],
        )?,
        "err:EBUSY",
    )
}

fn other_authority_sockets_are_unreachable_even_with_unix_sockets_allowed() -> Result<(), String> {
    let s = Scratch::new("sockdir");
    let srv = EchoServer::start(&s.0);
    let other = srv.path.parent().unwrap().join("agent-b.sock");
    let _l = UnixListener::bind(&other).unwrap();
    let got = run_probe(
        &s,
        &srv.path,
        &["--allow-unix-sockets"],
        &["connect-unix", other.to_str().unwrap()],
    )?;
    expect("connect to another authority's socket", &got, "err:EACCES")
}

fn a_missing_allow_write_path_is_reported_once() -> Result<(), String> {
    let out = Command::new(SHIM)
        .args([
            "--allow",
            "x.test",
            "--allow-write",
            "/nonexistent-shim-dir",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(125) || err.matches("os error 2").count() != 1 {
        return Err(format!("{:?} {err}", out.status));
    }
    Ok(())
}

/// A fresh CA certificate (the mediator's kind), written to `path`.
fn write_ca(path: &Path) {
    let ca = certs::Ca::create(&certs::CaOptions::default()).unwrap();
    std::fs::write(path, ca.cert_pem()).unwrap();
}

/// What `probe ca-check` prints when every CA variable names a read-only file holding
/// the CA (and the bundles the system certificates before it). Writing fails on the
/// files' mode (0444) first; chmod and unlink, which the owner could otherwise do, show
/// the read-only mount.
fn ca_check_all_set() -> String {
    let system = if SYSTEM_BUNDLES.iter().any(|p| Path::new(p).exists()) {
        "system"
    } else {
        "no-system"
    };
    CA_VARS
        .iter()
        .map(|v| {
            let (ca, sys) = if *v == "NODE_EXTRA_CA_CERTS" {
                ("only", "no-system")
            } else {
                ("last", system)
            };
            format!("{v} read=ok write=err:EACCES chmod=err:EROFS remove=err:EROFS ca={ca} {sys}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn ca_cert_exports_read_only_bundles_and_leaves_nothing_behind() -> Result<(), String> {
    let s = Scratch::new("ca");
    let srv = EchoServer::start(&s.0);
    let ca = s.path("ca.pem");
    write_ca(&ca);
    let w = s.path("work");
    let hidden = s.path("hidden");
    // The shim's temporary directory inside a writable root, then inside a masked one:
    // the CA files stay read-only in the first and readable in the second.
    for (tmp, extra) in [
        (w.join("tmp"), writable(&w)),
        (
            hidden.join("tmp"),
            vec!["--deny-read".into(), hidden.to_string_lossy().into_owned()],
        ),
    ] {
        std::fs::create_dir_all(&tmp).unwrap();
        let mut args = extra.clone();
        args.extend(["--ca-cert".into(), ca.to_string_lossy().into_owned()]);
        let mut cmd = shim_cmd(&srv.path, &strs(&args), &["ca-check", ca.to_str().unwrap()]);
        cmd.current_dir(&s.0)
            .env("TMPDIR", &tmp)
            .env("SSL_CERT_FILE", "/caller/bundle.pem")
            .env("NODE_EXTRA_CA_CERTS", "/caller/extra.pem");
        let out = cmd.output().unwrap();
        if !out.status.success() {
            return Err(format!(
                "shim failed: {:?}, stderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        expect(
            &format!("CA variables ({extra:?})"),
            String::from_utf8_lossy(&out.stdout).trim(),
            &ca_check_all_set(),
        )?;
        let left = entries(&tmp);
        if !left.is_empty() {
            return Err(format!("left in {}: {left:?}", tmp.display()));
        }
    }
    Ok(())
}

fn without_a_ca_no_ca_variable_is_set_and_the_callers_are_kept() -> Result<(), String> {
    let s = Scratch::new("noca");
    let srv = EchoServer::start(&s.0);
    let ca = s.path("ca.pem");
    write_ca(&ca);
    let tmp = s.path("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let mut cmd = shim_cmd(&srv.path, &[], &["ca-check", ca.to_str().unwrap()]);
    cmd.current_dir(&s.0).env("TMPDIR", &tmp);
    for v in CA_VARS {
        cmd.env_remove(v);
    }
    let out = cmd.output().unwrap();
    let want = CA_VARS
        .iter()
        .map(|v| format!("{v} unset"))
        .collect::<Vec<_>>()
        .join("\n");
    expect(
        "no CA variable",
        String::from_utf8_lossy(&out.stdout).trim(),
        &want,
    )?;
    let mut cmd = shim_cmd(&srv.path, &[], &["env", "SSL_CERT_FILE", "CURL_CA_BUNDLE"]);
    cmd.current_dir(&s.0)
        .env("TMPDIR", &tmp)
        .env("SSL_CERT_FILE", "/caller/bundle.pem")
        .env_remove("CURL_CA_BUNDLE");
    let out = cmd.output().unwrap();
    expect(
        "the caller's CA variable",
        String::from_utf8_lossy(&out.stdout).trim(),
        "/caller/bundle.pem",
    )?;
    let left = entries(&tmp);
    if !left.is_empty() {
        return Err(format!("created in TMPDIR without a CA: {left:?}"));
    }
    Ok(())
}

fn config_authority_with_tls_terminate_trusts_the_config_ca() -> Result<(), String> {
    let s = Scratch::new("cfgca");
    let srv = EchoServer::start(&s.0); // <socket_dir>/authority.sock
    let socket_dir = srv.path.parent().unwrap().to_owned();
    let ca_dir = s.path("ca");
    let cfg = s.path("mediator.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nsocket_dir = {:?}\n[tls]\nca_dir = {:?}\n\
             [[authority]]\nname = \"authority\"\nallow = [\"a.example\"]\n\
             tls_terminate = [\"a.example\"]\n",
            socket_dir.to_str().unwrap(),
            ca_dir.to_str().unwrap()
        ),
    )
    .unwrap();
    let ca_pem = ca_dir.join("ca.pem");
    let run = || {
        Command::new(SHIM)
            .arg("--config")
            .arg(&cfg)
            .args(["--authority", "authority", "--"])
            .arg(me())
            .args(["probe", "ca-check", ca_pem.to_str().unwrap()])
            .current_dir(&s.0)
            .output()
            .unwrap()
    };
    // No CA yet: a clear error naming the file and the command that creates it; the
    // shim creates nothing.
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    let how = format!("mediator ca-cert --config {}", cfg.display());
    if out.status.code() != Some(125)
        || !err.contains(ca_pem.to_str().unwrap())
        || !err.contains(&how)
    {
        return Err(format!("missing CA: {:?} {err}", out.status));
    }
    if ca_dir.exists() {
        return Err("the shim created the CA directory".into());
    }
    certs::Ca::create(&certs::CaOptions::default())
        .unwrap()
        .persist(&ca_dir)
        .unwrap();
    let out = run();
    if !out.status.success() {
        return Err(format!(
            "shim failed: {:?}, stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    expect(
        "CA variables from the config's CA",
        String::from_utf8_lossy(&out.stdout).trim(),
        &ca_check_all_set(),
    )
}

type Test = (&'static str, fn() -> Result<(), String>);

const TESTS: &[Test] = &[
    (
        "writing_each_mandatory_deny_file_fails_while_git_objects_and_index_stay_writable",
        writing_each_mandatory_deny_file_fails_while_git_objects_and_index_stay_writable,
    ),
    ("renaming_dot_git_away_fails", renaming_dot_git_away_fails),
    (
        "creating_a_missing_protected_path_fails_and_leaves_nothing_behind",
        creating_a_missing_protected_path_fails_and_leaves_nothing_behind,
    ),
    (
        "symlink_in_allowed_dir_to_denied_file_cannot_be_read",
        symlink_in_allowed_dir_to_denied_file_cannot_be_read,
    ),
    (
        "deny_read_masks_and_allow_read_reopens_beneath",
        deny_read_masks_and_allow_read_reopens_beneath,
    ),
    (
        "writing_outside_allow_write_roots_fails_and_dev_null_works",
        writing_outside_allow_write_roots_fails_and_dev_null_works,
    ),
    (
        "read_only_file_in_writable_dir_stays_read_only",
        read_only_file_in_writable_dir_stays_read_only,
    ),
    (
        "umount_of_a_mask_and_remount_rw_fail_and_no_capabilities_remain",
        umount_of_a_mask_and_remount_rw_fail_and_no_capabilities_remain,
    ),
    (
        "only_lo_exists_and_no_route_leaves_the_namespace",
        only_lo_exists_and_no_route_leaves_the_namespace,
    ),
    (
        "host_loopback_listener_is_unreachable_from_inside",
        host_loopback_listener_is_unreachable_from_inside,
    ),
    (
        "socket_af_unix_fails_eperm_while_socketpair_works",
        socket_af_unix_fails_eperm_while_socketpair_works,
    ),
    (
        "unshare_user_and_io_uring_fail",
        unshare_user_and_io_uring_fail,
    ),
    (
        "clone3_is_enosys_and_x32_syscalls_kill",
        clone3_is_enosys_and_x32_syscalls_kill,
    ),
    (
        "background_children_die_when_the_command_exits",
        background_children_die_when_the_command_exits,
    ),
    (
        "background_children_placeholders_and_ca_files_go_when_the_shim_is_killed",
        background_children_placeholders_and_ca_files_go_when_the_shim_is_killed,
    ),
    (
        "proc_inside_shows_only_sandbox_processes",
        proc_inside_shows_only_sandbox_processes,
    ),
    (
        "relay_reaches_the_unix_socket_server_outside",
        relay_reaches_the_unix_socket_server_outside,
    ),
    (
        "proxy_variables_point_at_the_sandbox_listener",
        proxy_variables_point_at_the_sandbox_listener,
    ),
    (
        "exit_status_passes_through_and_signals_become_128_plus_n",
        exit_status_passes_through_and_signals_become_128_plus_n,
    ),
    (
        "sigterm_to_the_shim_reaches_the_command",
        sigterm_to_the_shim_reaches_the_command,
    ),
    (
        "missing_mediator_socket_is_a_clear_error",
        missing_mediator_socket_is_a_clear_error,
    ),
    (
        "report_lists_the_denials_the_mediator_sent",
        report_lists_the_denials_the_mediator_sent,
    ),
    (
        "embedded_mode_reaches_an_allowed_loopback_origin_and_denies_others",
        embedded_mode_reaches_an_allowed_loopback_origin_and_denies_others,
    ),
    (
        "ca_cert_exports_read_only_bundles_and_leaves_nothing_behind",
        ca_cert_exports_read_only_bundles_and_leaves_nothing_behind,
    ),
    (
        "without_a_ca_no_ca_variable_is_set_and_the_callers_are_kept",
        without_a_ca_no_ca_variable_is_set_and_the_callers_are_kept,
    ),
    (
        "config_authority_with_tls_terminate_trusts_the_config_ca",
        config_authority_with_tls_terminate_trusts_the_config_ca,
    ),
    (
        "renaming_a_parent_of_a_protected_path_or_link_target_fails",
        renaming_a_parent_of_a_protected_path_or_link_target_fails,
    ),
    (
        "git_metadata_of_submodules_and_worktrees_is_protected",
        git_metadata_of_submodules_and_worktrees_is_protected,
    ),
    (
        "a_new_git_commondir_is_quarantined_and_reported",
        a_new_git_commondir_is_quarantined_and_reported,
    ),
    (
        "git_init_in_a_writable_root_without_a_repository_fails",
        git_init_in_a_writable_root_without_a_repository_fails,
    ),
    (
        "per_user_git_and_ssh_configs_in_home_are_protected",
        per_user_git_and_ssh_configs_in_home_are_protected,
    ),
    (
        "other_authority_sockets_are_unreachable_even_with_unix_sockets_allowed",
        other_authority_sockets_are_unreachable_even_with_unix_sockets_allowed,
    ),
    (
        "a_missing_allow_write_path_is_reported_once",
        a_missing_allow_write_path_is_reported_once,
    ),
];

fn run_suite(label: &str, filter: Option<&str>) -> (usize, usize) {
    let (mut passed, mut failed) = (0, 0);
    for (name, f) in TESTS {
        if filter.is_some_and(|flt| !name.contains(flt)) {
            continue;
        }
        match f() {
            Ok(()) => {
                println!("test {label}::{name} ... ok");
                passed += 1;
            }
            Err(e) => {
                println!("test {label}::{name} ... FAILED\n    {e}");
                failed += 1;
            }
        }
    }
    (passed, failed)
}

fn unprivileged_userns_works() -> bool {
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "unshare",
            "-Ur",
            "true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("probe") {
        std::process::exit(probe(&args[1..]));
    }
    let unprivileged_pass = args.iter().any(|a| a == "--unprivileged-pass");
    let filter = args.iter().find(|a| !a.starts_with("--")).cloned();
    let start = Instant::now();
    let label = if nix::unistd::geteuid().is_root() {
        "as_root"
    } else {
        "as_user"
    };
    let (mut passed, mut failed) = run_suite(label, filter.as_deref());
    let mut ignored = 0;
    if nix::unistd::geteuid().is_root() && !unprivileged_pass {
        if unprivileged_userns_works() {
            let out = Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(me())
                .arg("--unprivileged-pass")
                .args(filter.iter())
                .env("HOME", "/nonexistent")
                .stderr(Stdio::inherit())
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            for line in text.lines() {
                if line.starts_with("test ") && line.ends_with(" ... ok") {
                    passed += 1;
                } else if line.starts_with("test ") && line.ends_with(" ... FAILED") {
                    failed += 1;
                }
                if !line.starts_with("test result:") {
                    println!("{line}");
                }
            }
            if !out.status.success() && failed == 0 {
                failed += 1;
                println!("unprivileged pass failed: {:?}", out.status);
            }
        } else {
            println!("unprivileged pass skipped: setpriv/unshare -Ur does not work here");
            ignored = TESTS.len();
        }
    }
    if unprivileged_pass {
        // The parent counts our lines.
        std::process::exit(i32::from(failed > 0));
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; 0 filtered out; finished in {:.2}s",
        start.elapsed().as_secs_f64()
    );
    std::process::exit(i32::from(failed > 0));
}
