//! The mediator's files are never the command's (design sections 12, 14 and 17): what a
//! `--config` names (a credential's `secret_file`, the CA's key in `ca_dir`, the
//! registry's `state_dir`, a parents' credentials file, the config itself when it holds a
//! parent's password) is masked, and the mediator's default locations too, in embedded
//! and socket mode; the CA certificate stays readable.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{Fixture, expect, read_json, stdout, succeeded};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        config_secrets_are_masked_and_the_ca_certificate_stays_readable,
        default_locations_are_masked_in_every_mode,
        a_secret_in_a_writable_root_or_missing_is_refused_by_name,
        an_attacker_cannot_reach_a_masked_secret,
    ]
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
