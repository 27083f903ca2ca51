//! The mediator's files are never the command's (design sections 12, 14 and 17): what a
//! `--config` names (a credential's `secret_file`, the CA's key in `ca_dir`, the
//! registry's `state_dir`, a parents' credentials file, the config itself when it holds a
//! parent's password) is masked, and the mediator's default locations too, in embedded
//! and socket mode; the CA certificate stays readable. Root's command runs as an
//! unprivileged uid outside, with its writable roots idmapped: it still writes them, and
//! what it writes is the caller's on the host. The rows of the table in docs/shim.md
//! ("What the command can read") are these tests.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::{Fixture, expect, read_json, signal, stdout, succeeded, wait_until};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        config_secrets_are_masked_and_the_ca_certificate_stays_readable,
        default_locations_are_masked_in_every_mode,
        a_secret_in_a_writable_root_or_missing_is_refused_by_name,
        the_command_writes_its_roots_and_its_files_are_the_callers,
        root_runs_the_command_as_a_stranger_unless_degraded,
        a_writable_root_under_a_closed_directory_stays_reachable,
        an_allow_read_beneath_a_closed_directory_is_the_commands_to_read,
        a_program_beneath_a_closed_directory_is_named_with_its_flag,
        an_attacker_cannot_reach_a_masked_secret,
        the_socket_owner_is_told_when_the_command_shares_its_uid,
        a_mediator_of_its_own_user_keeps_its_files,
        root_is_refused_where_the_command_cannot_be_mapped,
        the_admin_socket_is_masked_even_with_unix_sockets_allowed,
    ]
}

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The uid and gid the caller's files have on the host.
fn caller() -> (u32, u32) {
    (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    )
}

/// `text` in a new file `path` (and its directories), mode 0600, as a secret is.
fn secret(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A CA in `dir` as the mediator makes it (`ca.pem` 0644, `ca-key.pem` 0600).
fn make_ca(dir: &Path) {
    certs::Ca::create(&certs::CaOptions::default())
        .unwrap()
        .persist(dir)
        .unwrap();
}

/// The mediator's files of the session, under `<fixture>/srv`, and a config
/// naming them (its parent URL with a password) for the fixture's stand-in socket.
struct Mediator {
    config: PathBuf,
    secret: PathBuf,
    ca: PathBuf,
    state: PathBuf,
    parents: PathBuf,
}

impl Mediator {
    fn new(fx: &Fixture, password: bool) -> Self {
        let srv = fx.path("srv");
        let m = Self {
            config: fx.path("m.toml"),
            secret: srv.join("secrets/github"),
            ca: srv.join("ca"),
            state: srv.join("state"),
            parents: srv.join("parents.cred"),
        };
        secret(&m.secret, "REAL-SECRET-123\n");
        make_ca(&m.ca);
        secret(&m.state.join("authorities/x.json"), "{}");
        secret(&m.parents, "proxy.test:3128 user:hunter2\n");
        let parent = if password {
            "http://user:hunter2@127.0.0.1:3128"
        } else {
            "http://127.0.0.1:3128"
        };
        std::fs::write(
            &m.config,
            format!(
                "[listen]\nsocket_dir = {:?}\n[tls]\nca_dir = {:?}\n\
                 [upstream]\nmode = \"parent\"\nparents = [{parent:?}]\n\
                 parent_credentials_file = {:?}\n[registry]\nstate_dir = {:?}\n\
                 [[authority]]\nname = \"authority\"\nallow = [\"api.github.com\"]\n\
                 tls_terminate = [\"api.github.com\"]\n\
                 [[authority.credential]]\nhost = \"api.github.com\"\nheader = \"Authorization\"\n\
                 secret_file = {:?}\nformat = \"Bearer {{secret}}\"\n\
                 placeholder = \"PLACEHOLDER-GITHUB-0000\"\nchild_env = \"GITHUB_TOKEN\"\n",
                fx.socket.parent().unwrap(),
                m.ca,
                m.parents,
                m.state,
                m.secret,
            ),
        )
        .unwrap();
        m
    }

    fn flags(&self) -> Vec<std::ffi::OsString> {
        Vec::from(args!["--config", &self.config, "--authority", "authority"])
    }
}

fn config_secrets_are_masked_and_the_ca_certificate_stays_readable() -> TestResult {
    let fx = Fixture::new("sec-config");
    let m = Mediator::new(&fx, true);
    let w = fx.mkdir("work");
    let report = fx.path("report.json");
    let mut flags = m.flags();
    flags.extend(args!["--allow-write", &w, "--report-file", &report]);
    let out = crate::support::probe_command(
        &flags,
        &args![
            "read-each",
            &m.secret,
            m.ca.join("ca-key.pem"),
            m.state.join("authorities/x.json"),
            &m.parents,
            &m.config,
            m.ca.join("ca.pem"),
        ],
    )
    .current_dir(&fx.dir.0)
    .output()
    .unwrap();
    let out = succeeded(out)?;
    // Masked files read EACCES; in ca_dir, only ca.pem is there (the key is ENOENT).
    expect(
        "secret_file, CA key, state, parents' credentials, config, CA certificate",
        &stdout(&out),
        "err:EACCES err:ENOENT err:EACCES err:EACCES err:EACCES ok",
    )?;
    let masked = read_json(&report)?["mediator_masked"].clone();
    for p in [&m.secret, &m.ca, &m.state, &m.parents, &m.config] {
        let listed = masked
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["path"] == p.to_str().unwrap()));
        if !listed {
            return Err(format!(
                "{} not in the report's mediator_masked: {masked}",
                p.display()
            ));
        }
    }
    // The same config without a password is the command's to read.
    let fx = Fixture::new("sec-config-plain");
    let m = Mediator::new(&fx, false);
    let out = crate::support::probe_command(&m.flags(), &args!["read-each", &m.config, &m.secret])
        .current_dir(&fx.dir.0)
        .output()
        .unwrap();
    expect(
        "a config without a password, the secret",
        &stdout(&succeeded(out)?),
        "ok err:EACCES",
    )
}

/// The mediator's files in its default state directory (`$XDG_STATE_HOME/egress-mediator`
/// of the shim's environment) are masked whichever way the command is bound; the CA
/// certificate reaches it through `--ca-cert`.
fn default_locations_are_masked_in_every_mode() -> TestResult {
    let fx = Fixture::new("sec-defaults");
    let state = fx.path("xdg/egress-mediator");
    make_ca(&state.join("ca"));
    secret(&state.join("authorities/x.json"), "{}");
    let m = Mediator::new(&fx, false);
    let ca = state.join("ca/ca.pem");
    let modes: [Vec<std::ffi::OsString>; 3] = [
        Vec::from(args!["--allow", "example.com", "--ca-cert", &ca]),
        Vec::from(args!["--mediator-socket", &fx.socket, "--ca-cert", &ca]),
        m.flags(),
    ];
    for flags in modes {
        let out = crate::support::probe_command(
            &flags,
            &args![
                "read-each",
                state.join("ca/ca-key.pem"),
                state.join("authorities/x.json"),
            ],
        )
        .current_dir(&fx.dir.0)
        .env("XDG_STATE_HOME", fx.path("xdg"))
        .output()
        .unwrap();
        expect(
            &format!("the default state directory's CA key and records with {flags:?}"),
            &stdout(&succeeded(out)?),
            "err:EACCES err:EACCES",
        )?;
    }
    // The CA certificate through the variables the shim sets (compared with a copy: the
    // original is masked).
    let copy = fx.path("ca-copy.pem");
    std::fs::copy(&ca, &copy).unwrap();
    let out = crate::support::probe_command(
        &args!["--allow", "example.com", "--ca-cert", &ca],
        &args!["ca-check", &copy],
    )
    .current_dir(&fx.dir.0)
    .env("XDG_STATE_HOME", fx.path("xdg"))
    .output()
    .unwrap();
    let lines = stdout(&succeeded(out)?);
    if !lines.lines().all(|l| l.contains("read=ok")) {
        return Err(format!("the CA certificate is not readable: {lines}"));
    }
    Ok(())
}

fn a_secret_in_a_writable_root_or_missing_is_refused_by_name() -> TestResult {
    let fx = Fixture::new("sec-refuse");
    let m = Mediator::new(&fx, true);
    let refused = |extra: &[std::ffi::OsString], want: &str| -> TestResult {
        let mut flags = m.flags();
        flags.extend_from_slice(extra);
        let out = crate::support::probe_command(&flags, &args!["read", "/"])
            .current_dir(&fx.dir.0)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(125) || !stderr.contains(want) {
            return Err(format!(
                "{extra:?}: expected status 125 naming {want:?}, got {:?}: {stderr}",
                out.status
            ));
        }
        Ok(())
    };
    // The state directory inside a writable root: the command could plant records.
    refused(
        &args!["--allow-write", fx.path("srv")],
        &format!("{}, is inside the writable root", m.secret.display()),
    )?;
    refused(
        &args!["--allow-read", m.ca.join("ca-key.pem")],
        "would be re-opened by --allow-read",
    )?;
    std::fs::remove_file(&m.secret).unwrap();
    refused(&[], &format!("{}, does not exist", m.secret.display()))
}

/// Whatever the caller: the command writes its writable roots (a file of the caller's
/// there included), and what it makes is the caller's on the host; the report and
/// violations files the shim writes are the caller's too.
fn the_command_writes_its_roots_and_its_files_are_the_callers() -> TestResult {
    let fx = Fixture::new("sec-owner");
    let w = fx.mkdir("work");
    secret(&w.join("mine"), "mine");
    let (report, violations) = (fx.path("r.json"), fx.path("v.jsonl"));
    for flags in [
        Vec::from(args!["--allow", "example.com"]),
        Vec::from(args!["--mediator-socket", &fx.socket]),
    ] {
        let mut flags = flags;
        flags.extend(args![
            "--allow-write",
            &w,
            "--report-file",
            &report,
            "--violations",
            &violations
        ]);
        let sh = format!(
            "{me} probe append {w}/mine; {me} probe write {w}/new; {me} probe mkdir {w}/dir; {me} probe write {w}/dir/f; {me} probe write /outside; {me} probe ids",
            me = crate::support::me().display(),
            w = w.display()
        );
        let out = Command::new(crate::support::SHIM)
            .args(&flags)
            .args(["--", "sh", "-c", &sh])
            .current_dir(&fx.dir.0)
            .output()
            .unwrap();
        let inside = if root() { "0 0 []" } else { "65534 65534 []" };
        expect(
            &format!("append, write, mkdir, write, outside, ids with {flags:?}"),
            &stdout(&succeeded(out)?),
            &format!("ok\nok\nok\nok\nerr:EROFS\n{inside}"),
        )?;
        for p in [
            w.join("mine"),
            w.join("new"),
            w.join("dir"),
            w.join("dir/f"),
            report.clone(),
            violations.clone(),
        ] {
            let md = std::fs::metadata(&p).unwrap();
            if (md.uid(), md.gid()) != caller() {
                return Err(format!(
                    "{} is {}:{} on the host, not the caller's {:?}",
                    p.display(),
                    md.uid(),
                    md.gid(),
                    caller()
                ));
            }
        }
        for p in ["new", "dir/f", "dir"] {
            let p = w.join(p);
            let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir(&p));
        }
    }
    Ok(())
}

/// The uid of the host process `sleep MARKER` (the command, not the shim that names it).
fn host_uid_of(marker: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .find_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            if argv.get(..2) != Some(&[b"sleep".as_slice(), marker.as_bytes()]) {
                return None;
            }
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
}

/// Root's command is uid 2100000000 on the host, root inside: a root-owned `0600` file
/// that no mask covers is out of its reach; with `--allow-degraded same-uid` it is root
/// (without capabilities) and reads it. An unprivileged caller's command is the caller.
fn root_runs_the_command_as_a_stranger_unless_degraded() -> TestResult {
    let fx = Fixture::new("sec-stranger");
    let private = fx.path("private");
    secret(&private, "root's own");
    let report = fx.path("r.json");
    for (degraded, want_read, want_uid) in [
        (
            false,
            if root() { "err:EACCES" } else { "ok" },
            if root() { 2_100_000_000 } else { caller().0 },
        ),
        (true, "ok", caller().0),
    ] {
        let mut flags = Vec::from(args!["--allow", "example.com", "--report-file", &report]);
        if degraded {
            flags.extend(args!["--allow-degraded", "same-uid"]);
        }
        let out = crate::support::probe_command(&flags, &args!["read", &private])
            .current_dir(&fx.dir.0)
            .output()
            .unwrap();
        expect(
            &format!("a file of the caller's, degraded: {degraded}"),
            &stdout(&succeeded(out)?),
            want_read,
        )?;
        let runs_as = read_json(&report)?["runs_as"]["uid"].as_u64();
        if runs_as != Some(u64::from(want_uid)) {
            return Err(format!("report runs_as {runs_as:?}, want {want_uid}"));
        }
    }
    // What the host sees: the command's process and its uid.
    let marker = crate::support::marker(7_300_000, 50_000);
    let mut child = Command::new(crate::support::SHIM)
        .args(["--allow", "example.com", "--", "sleep", &marker])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut uid = None;
    wait_until(
        || {
            uid = host_uid_of(&marker);
            uid.is_some()
        },
        10,
    );
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    let _ = child.wait();
    let want = if root() { 2_100_000_000 } else { caller().0 };
    if uid != Some(want) {
        return Err(format!(
            "the command's uid on the host is {uid:?}, want {want}"
        ));
    }
    Ok(())
}

/// A writable root below a directory others may not enter (`/root`, mode 0700) stays
/// reachable for root's command: that directory is masked, holding the way through.
fn a_writable_root_under_a_closed_directory_stays_reachable() -> TestResult {
    let fx = Fixture::new("sec-closed");
    let closed = fx.mkdir("closed");
    let w = closed.join("work");
    std::fs::create_dir_all(&w).unwrap();
    std::fs::write(closed.join("other"), "x").unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sh = format!(
        "cd {w} && {me} probe write {w}/new && {me} probe read {o}",
        me = crate::support::me().display(),
        w = w.display(),
        o = closed.join("other").display()
    );
    // `--no-tmp`: the fixture is under the host's /tmp, which the private one would hide.
    let out = Command::new(crate::support::SHIM)
        .args(["--allow", "example.com", "--no-tmp", "--allow-write"])
        .arg(&w)
        .args(["--", "sh", "-c", &sh])
        .current_dir(&w)
        .output()
        .unwrap();
    // Root's command never could read the closed directory's other files (they are
    // hidden now); an unprivileged caller's command is the caller, who owns it.
    let other = if root() { "err:ENOENT" } else { "ok" };
    expect(
        "a write in the root, a read beside it",
        &stdout(&succeeded(out)?),
        &format!("ok\n{other}"),
    )?;
    let md = std::fs::metadata(w.join("new")).unwrap();
    expect(
        "the new file's owner",
        &md.uid().to_string(),
        &caller().0.to_string(),
    )
}

/// An `--allow-read` path beneath a directory others may not enter (a toolchain in
/// `/root/.cargo`, `/root` being mode 0700) is root's command's to read and run, as it is
/// an unprivileged caller's, its `0600` files too (an idmapped read-only copy); a
/// `--deny-read` inside it stays masked, and the closed directory's other files stay out
/// of reach. Without the flag root's command cannot run the tool.
fn an_allow_read_beneath_a_closed_directory_is_the_commands_to_read() -> TestResult {
    let fx = Fixture::new("sec-grant");
    let closed = fx.mkdir("closed");
    let tool = closed.join("tool");
    std::fs::create_dir_all(&tool).unwrap();
    std::fs::write(tool.join("run"), "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(tool.join("run"), std::fs::Permissions::from_mode(0o755)).unwrap();
    secret(&tool.join("private"), "mine\n");
    std::fs::write(tool.join("hidden"), "x").unwrap();
    std::fs::write(closed.join("other"), "x").unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sh = format!(
        "{t}/run && {me} probe read-each {t}/private {t}/hidden {o}",
        me = crate::support::me().display(),
        t = tool.display(),
        o = closed.join("other").display()
    );
    let run = |flags: &[std::ffi::OsString]| {
        Command::new(crate::support::SHIM)
            .args(["--allow", "example.com"])
            .args(flags)
            .args(["--", "sh", "-c", &sh])
            .current_dir(&fx.dir.0)
            .output()
            .unwrap()
    };
    let out = run(&args![
        "--allow-read",
        &tool,
        "--deny-read",
        tool.join("hidden")
    ]);
    // The mask that holds the way to the copy hides the rest of the closed directory.
    let other = if root() { "err:ENOENT" } else { "ok" };
    expect(
        "the tool, its 0600 file, a --deny-read in it, a file beside it",
        &stdout(&succeeded(out)?),
        &format!("ran\nok err:EACCES {other}"),
    )?;
    if root() {
        let out = run(&[]);
        if out.status.success() || stdout(&out).contains("ran") {
            return Err(format!(
                "root's command ran the tool beneath the closed directory without --allow-read: {out:?}"
            ));
        }
    }
    Ok(())
}

/// Root's command cannot run a program found on `PATH` beneath a directory others may not
/// enter (rustup's proxies in `/root/.cargo/bin`): the shim says so in one line naming the
/// `--allow-read` flags to add (the toolchain's directory, and rustup's home beside a
/// `rustup`), and with them the program runs. An unprivileged caller's command is the
/// caller, who may enter: no such line.
fn a_program_beneath_a_closed_directory_is_named_with_its_flag() -> TestResult {
    let fx = Fixture::new("sec-hint");
    let closed = fx.mkdir("closed");
    let (tool, rustup) = (closed.join("tool"), closed.join("rustup-home"));
    std::fs::create_dir_all(tool.join("bin")).unwrap();
    std::fs::create_dir_all(&rustup).unwrap();
    std::fs::write(tool.join("bin/run"), "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(tool.join("bin/run"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(tool.join("bin/rustup"), "").unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let run = |flags: &[std::ffi::OsString]| {
        Command::new(crate::support::SHIM)
            .args(["--allow", "example.com"])
            .args(flags)
            .args(["--", "run"])
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", tool.join("bin").display()),
            )
            .env("RUSTUP_HOME", &rustup)
            .current_dir(&fx.dir.0)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let hints: Vec<&str> = stderr.lines().filter(|l| l.contains("hint:")).collect();
    let flags = format!(
        "--allow-read {} --allow-read {}",
        tool.display(),
        rustup.display()
    );
    if root() {
        if out.status.code() != Some(126) || hints.len() != 1 || !hints[0].ends_with(&flags) {
            return Err(format!(
                "expected exit 126 and one line ending {flags:?}: {:?} {stderr}",
                out.status
            ));
        }
    } else if !hints.is_empty() {
        return Err(format!("a hint for the caller's own command: {stderr}"));
    }
    let out = run(&args!["--allow-read", &tool, "--allow-read", &rustup]);
    expect("with the flags", &stdout(&succeeded(out)?), "ran")
}

/// Ways around a mask a command might try: a link in its writable root, `/proc/self/root`,
/// a hard link into the writable root, init's memory, unmounting the mask.
fn an_attacker_cannot_reach_a_masked_secret() -> TestResult {
    let fx = Fixture::new("sec-attack");
    let m = Mediator::new(&fx, true);
    let w = fx.mkdir("work");
    std::os::unix::fs::symlink(&m.secret, w.join("link")).unwrap();
    let mut flags = m.flags();
    flags.extend(args!["--allow-write", &w]);
    let key = m.ca.join("ca-key.pem");
    let me = crate::support::me();
    let sh = format!(
        "{me} probe read-each {w}/link /proc/self/root{s} /proc/1/environ /proc/1/root{k}; \
         {me} probe link {s} {w}/hard; {me} probe link {k} {w}/key; {me} probe umount {s}; \
         {me} probe chmod-mode {s} 644",
        me = me.display(),
        w = w.display(),
        s = m.secret.display(),
        k = key.display(),
    );
    let out = Command::new(crate::support::SHIM)
        .args(&flags)
        .args(["--", "sh", "-c", &sh])
        .current_dir(&fx.dir.0)
        .output()
        .unwrap();
    let got = stdout(&succeeded(out)?);
    let lines: Vec<&str> = got.lines().collect();
    let fail = |what: &str, r: &str| -> TestResult {
        if r.starts_with("err:") {
            Ok(())
        } else {
            Err(format!("{what}: {r} (all: {got})"))
        }
    };
    let reads: Vec<&str> = lines
        .first()
        .copied()
        .unwrap_or_default()
        .split(' ')
        .collect();
    for (what, r) in [
        "via a link",
        "via /proc/self/root",
        "init's environment",
        "via /proc/1/root",
    ]
    .iter()
    .zip(&reads)
    {
        fail(what, r)?;
    }
    for (what, r) in [
        "hard link of the secret",
        "hard link of the CA key",
        "umount",
        "chmod",
    ]
    .iter()
    .zip(lines.iter().skip(1))
    {
        fail(what, r)?;
    }
    if reads.len() != 4 || lines.len() != 5 {
        return Err(format!("unexpected output: {got}"));
    }
    Ok(())
}

/// The command running as the uid that owns the mediator's socket is said on stderr:
/// an unprivileged caller's (the stand-in socket is the caller's), root's only with
/// `--allow-degraded same-uid`.
fn the_socket_owner_is_told_when_the_command_shares_its_uid() -> TestResult {
    let fx = Fixture::new("sec-owner-line");
    for degraded in [false, true] {
        let mut flags = Vec::from(args!["--mediator-socket", &fx.socket]);
        if degraded {
            flags.extend(args!["--allow-degraded", "same-uid"]);
        }
        let out = crate::support::probe_command(&flags, &args!["read", "/"])
            .current_dir(&fx.dir.0)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said = stderr.matches("which owns the mediator's socket").count();
        let want = usize::from(degraded || !root());
        if said != want {
            return Err(format!(
                "degraded {degraded}: said {said} times, want {want}: {stderr}"
            ));
        }
    }
    Ok(())
}

/// A mediator of its own user (a systemd `DynamicUser`, uid 61184 here): its `0600`
/// secret is not the command's to read, masked or not, even with `--allow-degraded
/// same-uid` (root without capabilities is not its owner).
fn a_mediator_of_its_own_user_keeps_its_files() -> TestResult {
    if !root() {
        return Err(format!(
            "{}making a file of another user needs root",
            crate::IGNORED
        ));
    }
    let fx = Fixture::new("sec-own-user");
    let theirs = fx.path("srv/secrets/github");
    secret(&theirs, "REAL-SECRET-123");
    std::os::unix::fs::chown(&theirs, Some(61184), Some(61184)).unwrap();
    for extra in [Vec::new(), Vec::from(args!["--allow-degraded", "same-uid"])] {
        let mut flags = Vec::from(args!["--mediator-socket", &fx.socket]);
        flags.extend(extra.iter().cloned());
        let out = crate::support::probe_command(&flags, &args!["read", &theirs])
            .current_dir(&fx.dir.0)
            .output()
            .unwrap();
        expect(
            &format!("another user's secret with {extra:?}"),
            &stdout(&succeeded(out)?),
            "err:EACCES",
        )?;
    }
    Ok(())
}

/// Where root's command cannot run as 2100000000 the shim refuses, naming
/// `--allow-degraded same-uid`: root of a user namespace that maps one uid (a rootless
/// container's root; `unshare -r` here, as root and as an unprivileged user), and, as
/// root, a writable root or an `--allow-read` path closed to others on a filesystem
/// without idmapped mounts (sysfs, proc here; nothing runs).
fn root_is_refused_where_the_command_cannot_be_mapped() -> TestResult {
    let fx = Fixture::new("sec-unmappable");
    let w = fx.mkdir("work");
    let refused = |out: std::process::Output, what: &str, cause: &str| -> TestResult {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(125)
            || !stderr.contains("--allow-degraded same-uid")
            || !stderr.contains(cause)
            || !stdout(&out).is_empty()
        {
            return Err(format!("{what}: {:?} {stderr}", out.status));
        }
        Ok(())
    };
    let in_userns = |extra: &[&str]| {
        Command::new("unshare")
            .args(["--user", "--map-root-user"])
            .arg(crate::support::SHIM)
            .args(extra)
            .args(["--allow", "example.com", "--allow-write"])
            .arg(&w)
            .args(["--", "echo", "ran"])
            .current_dir(&fx.dir.0)
            .output()
            .unwrap()
    };
    refused(in_userns(&[]), "root of a one-uid namespace", "uid_map")?;
    expect(
        "with --allow-degraded same-uid",
        &stdout(&succeeded(in_userns(&["--allow-degraded", "same-uid"]))?),
        "ran",
    )?;
    if root() {
        let out = Command::new(crate::support::SHIM)
            .args([
                "--allow",
                "example.com",
                "--allow-write",
                "/sys/fs",
                "--",
                "echo",
                "ran",
            ])
            .output()
            .unwrap();
        refused(out, "a writable root on sysfs", "idmapped mount")?;
        // A path closed to others on a filesystem without idmapped mounts (proc): no
        // copy root's command could read, so no run.
        let out = Command::new(crate::support::SHIM)
            .args(["--allow", "example.com", "--allow-read", "/proc/1/fd"])
            .args(["--", "echo", "ran"])
            .output()
            .unwrap();
        refused(
            out,
            "an --allow-read on proc",
            "idmapped read-only mount of each --allow-read path",
        )?;
    }
    Ok(())
}

/// The admin API's socket (`[listen] admin_socket`; whoever reaches it can make
/// authorities) is masked when it exists: with `--allow-unix-sockets` the command still
/// cannot connect to it.
fn the_admin_socket_is_masked_even_with_unix_sockets_allowed() -> TestResult {
    let fx = Fixture::new("sec-admin");
    let admin = fx.mkdir("admin").join("admin.sock");
    let _listening = std::os::unix::net::UnixListener::bind(&admin).unwrap();
    let cfg = fx.path("m.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nsocket_dir = {:?}\nadmin_socket = {admin:?}\n\
             [[authority]]\nname = \"authority\"\nallow = [\"example.com\"]\n",
            fx.socket.parent().unwrap(),
        ),
    )
    .unwrap();
    let out = crate::support::probe_command(
        &args![
            "--config",
            &cfg,
            "--authority",
            "authority",
            "--allow-unix-sockets"
        ],
        &args!["connect-unix", &admin],
    )
    .current_dir(&fx.dir.0)
    .output()
    .unwrap();
    expect(
        "a connection to the admin socket",
        &stdout(&succeeded(out)?),
        "err:EACCES",
    )
}
