//! End-to-end tests of the shim as real processes, on the `libtest-mimic` harness (so
//! `--list`, filters, `--exact`, `--ignored` and `--test-threads` work as with libtest).
//!
//! The binary plays two roles. Run normally, it drives the `shim` binary: each test
//! builds a scratch directory, starts `shim ... -- <this binary> probe ...` and asserts on
//! the probe's output (an errno name or `ok`) and on what the host sees afterwards. Run
//! as `probe`, it is the confined command ([`probe`]).
//!
//! Every test runs twice when the suite is started as root: `as_root::NAME` in this
//! process, and `as_user::NAME` in a copy of this binary started as uid/gid 65534 through
//! `setpriv` (ignored, with the reason, where this machine does not allow unprivileged
//! user namespaces). Started as another user, only `as_user::NAME` runs, in this process.
//! Tests run one at a time unless `--test-threads` says otherwise.
//!
//! Network rule: every address used here is loopback, or inside the sandbox's own network
//! namespace.

#![allow(
    // A `harness = false` binary is not compiled with `cfg(test)`, so clippy's
    // allow-unwrap-in-tests does not reach it: the whole binary is test code.
    clippy::unwrap_used,
    clippy::expect_used,
    // Children are waited for by `output()`/`status()`, or killed and waited for.
    clippy::zombie_processes,
    missing_docs,
    // The probe issues raw system calls that the sandbox must refuse.
    unsafe_code
)]

use std::process::{Command, Stdio};
use std::sync::OnceLock;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// `args!["write", path]`: strings and paths, as the arguments of a command (an array of
/// `OsString`).
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        [$(::std::ffi::OsString::from($a)),*]
    };
}

/// `cases![f, g]`: test functions with their names (`area::f`, the area being the
/// module), each name written once.
macro_rules! cases {
    ($($f:ident),* $(,)?) => {
        vec![$((
            crate::area_name(concat!(module_path!(), "::", stringify!($f))),
            $f as crate::Test,
        )),*]
    };
}

mod answers;
mod ca;
mod capture;
mod clients;
mod control;
mod credential;
mod errors;
mod fs;
mod handover;
mod lifecycle;
mod net;
mod privileges;
mod probe;
mod protect;
mod secrets;
mod standalone;
mod support;
mod tmp;
mod violations;

/// What a test returns: `Err` says what was expected and what was seen.
pub(crate) type TestResult = Result<(), String>;
type Test = fn() -> TestResult;

/// The argument that makes this binary run one test by name (as uid 65534).
const RUN_ONE: &str = "run-one-unprivileged";

/// A test that cannot run here returns `Err` starting with this, then the reason; it is
/// reported as ignored with that reason.
pub(crate) const IGNORED: &str = "ignored: ";

/// The exit status of [`run_one`] for an ignored test (its reason on stderr).
const EXIT_IGNORED: i32 = 77;

/// A test's result as libtest-mimic takes it.
fn completion(r: TestResult) -> Result<Completion, Failed> {
    match r {
        Ok(()) => Ok(Completion::Completed),
        Err(e) => match e.strip_prefix(IGNORED) {
            Some(reason) => Ok(Completion::ignored_with(reason)),
            None => Err(Failed::from(e)),
        },
    }
}

fn all() -> Vec<(&'static str, Test)> {
    [
        protect::tests(),
        fs::tests(),
        privileges::tests(),
        net::tests(),
        lifecycle::tests(),
        ca::tests(),
        credential::tests(),
        capture::tests(),
        errors::tests(),
        violations::tests(),
        handover::tests(),
        control::tests(),
        tmp::tests(),
        clients::tests(),
        secrets::tests(),
        answers::tests(),
    ]
    .concat()
}

/// `sandbox::net::f` as `net::f`: the crate's name says nothing.
fn area_name(path: &'static str) -> &'static str {
    path.split_once("::").map_or(path, |(_, rest)| rest)
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match argv.first().map(String::as_str) {
        Some("probe") => std::process::exit(probe::main(&argv[1..])),
        Some("mediator") => std::process::exit(standalone::main(&argv[1..])),
        Some(RUN_ONE) => std::process::exit(run_one(argv.get(1).map_or("", String::as_str))),
        _ => {}
    }
    let mut args = Arguments::from_args();
    // One at a time, as before the harness existed: some tests watch host-wide state
    // (processes by marker, a TMPDIR's entries) within a few seconds.
    args.test_threads.get_or_insert(1);
    let root = nix::unistd::geteuid().is_root();
    // Every case runs these programs (the shim's child is a shell script with curl or
    // python3 in it; as_user runs through setpriv) and makes the sandbox's namespaces:
    // where either is missing, every case is ignored with the reason, or failed under
    // CI=true, which never skips.
    let missing = missing_packages();
    let unable = if missing.is_empty() {
        namespaces_unavailable().map(|why| {
            format!(
                "this machine cannot make the sandbox's namespaces ({why}); run the shim's tests where user namespaces are allowed (as root outside a chroot, or with unprivileged user namespaces)"
            )
        })
    } else {
        let list = missing.join(" ");
        Some(format!(
            "needs the package(s) {list}: sudo apt-get install {list}"
        ))
    };
    if let Some(reason) = unable {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        let trials = all()
            .into_iter()
            .map(|(name, _)| {
                let reason = reason.clone();
                Trial::ignorable_test(format!("as_user::{name}"), move || {
                    if ci {
                        Err(Failed::from(format!(
                            "CI=true, and this test cannot run: {reason}"
                        )))
                    } else {
                        Ok(Completion::ignored_with(reason))
                    }
                })
            })
            .collect();
        libtest_mimic::run(&args, trials).exit();
    }
    let mut trials = Vec::new();
    if root {
        for (name, test) in all() {
            trials.push(Trial::ignorable_test(
                format!("as_root::{name}"),
                move || completion(test()),
            ));
        }
    }
    for (name, test) in all() {
        trials.push(Trial::ignorable_test(
            format!("as_user::{name}"),
            move || {
                if root {
                    as_unprivileged(name)
                } else {
                    completion(test())
                }
            },
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}

/// The packages that ship the programs every case runs and this machine lacks.
fn missing_packages() -> Vec<&'static str> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = |program: &str| {
        program.starts_with('/') && std::path::Path::new(program).exists()
            || std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
    };
    let mut out: Vec<&'static str> = [
        ("setpriv", "util-linux"),
        ("unshare", "util-linux"),
        ("curl", "curl"),
        ("/usr/bin/python3", "python3"),
    ]
    .into_iter()
    .filter(|(program, _)| !found(program))
    .map(|(_, package)| package)
    .collect();
    out.dedup();
    out
}

/// Why this process cannot make a user namespace with mount, PID, IPC and network
/// namespaces in it (a chroot, a container without the privilege, a sysctl), if it cannot.
fn namespaces_unavailable() -> Option<String> {
    let out = Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--mount",
            "--pid",
            "--ipc",
            "--net",
            "--fork",
            "true",
        ])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "unshare -Urmpin --fork: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("unshare: {e}")),
    }
}

/// Run the test `name` in this process (the child side of [`as_unprivileged`]).
fn run_one(name: &str) -> i32 {
    let Some((_, test)) = all().into_iter().find(|(n, _)| *n == name) else {
        eprintln!("no test named {name:?}");
        return 2;
    };
    match test() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            if e.starts_with(IGNORED) {
                EXIT_IGNORED
            } else {
                1
            }
        }
    }
}

/// Run the test `name` in a copy of this binary as uid/gid 65534, with no home.
fn as_unprivileged(name: &str) -> Result<Completion, Failed> {
    static USERNS: OnceLock<bool> = OnceLock::new();
    if !*USERNS.get_or_init(unprivileged_userns_works) {
        return Ok(Completion::ignored_with(
            "setpriv/unshare -Ur does not work here (no unprivileged user namespaces)",
        ));
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(support::me())
        .args([RUN_ONE, name])
        .env("HOME", "/nonexistent")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("setpriv: {e}"))?;
    if out.status.success() {
        Ok(Completion::Completed)
    } else if out.status.code() == Some(EXIT_IGNORED) {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let reason = stderr.trim().strip_prefix(IGNORED).unwrap_or(stderr.trim());
        Ok(Completion::ignored_with(format!("as uid 65534: {reason}")))
    } else {
        Err(format!(
            "as uid 65534 ({:?}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr).trim_end()
        )
        .into())
    }
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
