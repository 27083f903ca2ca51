//! Everyday clients under the shim, with nothing set by the caller: the real pip, npm,
//! cargo, apt-get and curl reach loopback stand-ins of their registries (e2e::registry:
//! a PyPI simple index and its wheels, npm packuments and tarballs, a sparse cargo index
//! and its crates, a Debian repository; each over HTTPS from a test CA) in embedded mode
//! (the origins' CA given with `--ca-cert`), in socket mode through a standalone mediator
//! (the same), and with that mediator terminating TLS for every registry host (the
//! clients then trust the mediator's CA, from its config, through the shim's CA
//! settings). Each works, with no `fs_denied` line; and with one needed host left out
//! of the grant, it fails and the shim names the denied host on stderr (in embedded
//! mode before the client's own error).
//!
//! Each client is a declared tool (e2e::Tool): a machine without it ignores its cases,
//! naming the Debian package (CI=true fails them). cargo runs from the toolchain that
//! runs these tests, given with `--allow-read` (beneath `/root` here: root's command
//! reads it through the shim's idmapped copy).
//!
//! Network rule: every origin is on 127.0.0.1; the names are resolved to it by the
//! mediator (`--resolve`, `[resolver] hosts`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Output;

use e2e::Tool;
use e2e::registry::{StaticOrigin, cargo, debian, npm, pypi};

use crate::standalone::{Grant, Standalone};
use crate::support::{Scratch, read_json};
use crate::{IGNORED, Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        pip_embedded,
        pip_socket,
        pip_terminated,
        pip_denied_embedded,
        pip_denied_socket,
        npm_embedded,
        npm_socket,
        npm_terminated,
        npm_denied_embedded,
        npm_denied_socket,
        cargo_embedded,
        cargo_socket,
        cargo_terminated,
        cargo_denied_embedded,
        cargo_denied_socket,
        apt_embedded,
        apt_socket,
        apt_terminated,
        apt_denied_embedded,
        apt_denied_socket,
        curl_embedded,
        curl_socket,
        curl_terminated,
        curl_denied_embedded,
        curl_denied_socket,
    ]
}

/// How the command reaches its registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `--allow` flags: the shim's own mediator (which never terminates TLS).
    Embedded,
    /// A standalone mediator's authority socket (`--config`, `--authority`).
    Socket,
    /// The same, terminating TLS for every registry host.
    Terminated,
}

/// One client's run: its registry's origins (the last one is what a denial case leaves
/// out), the script run inside, the last line it prints when it works, and how its own
/// errors start.
struct Case {
    tools: &'static [Tool],
    origins: Vec<StaticOrigin>,
    script: String,
    works: &'static str,
    error: &'static str,
    /// A `~/.npmrc` for the run's home, if the case needs one.
    npmrc: Option<String>,
    /// `--allow-read` paths the client needs (its toolchain).
    reads: Vec<PathBuf>,
}

/// The clients' programs, each checked for this user: ignored where missing (naming the
/// package), failed under CI=true. The toolchain that runs these tests has cargo, but it
/// may live where this user cannot reach it (`/root/.cargo` for uid 65534): ignored then.
fn needs(tools: &[Tool]) -> TestResult {
    let missing: Vec<&str> = tools.iter().flat_map(|t| t.missing_packages()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if missing == ["cargo"] && std::env::var_os("CARGO").is_some() {
        return Err(format!(
            "{IGNORED}the toolchain's cargo is not on a PATH this user (uid {}) can reach",
            nix::unistd::geteuid()
        ));
    }
    let list = missing.join(" ");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        Err(format!(
            "CI=true, and this test needs the package(s) {list}"
        ))
    } else {
        Err(format!(
            "{IGNORED}needs the package(s) {list}: sudo apt-get install {list}"
        ))
    }
}

/// The toolchain's directories, for `--allow-read`: the cargo home holding `cargo` (found
/// on `PATH`, rustup's proxy) and rustup's home, where they exist. Root's command runs
/// as an unprivileged uid, and both are beneath `/root` (mode 0700) here.
fn toolchain() -> Vec<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let cargo_home = std::env::split_paths(&path)
        .map(|d| d.join("cargo"))
        .find(|p| p.is_file())
        .and_then(|p| Some(p.parent()?.parent()?.to_owned()));
    let rustup_home = std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".rustup")));
    cargo_home
        .into_iter()
        .chain(rustup_home)
        .filter(|d| d.is_dir())
        .collect()
}

fn pip(ca: &certs::Ca) -> Result<Case, String> {
    let index = origin("pypi.test", ca)?;
    let files = origin("pypifiles.test", ca)?;
    let projects = [
        pypi::Project {
            name: "shimtest-alpha",
            version: "1.0",
            requires: &["shimtest-beta"],
        },
        pypi::Project {
            name: "shimtest-beta",
            version: "1.0",
            requires: &[],
        },
    ];
    pypi::serve(&index, &files, &projects).map_err(|e| e.to_string())?;
    let pip = "/usr/bin/python3 -m pip";
    let opts = format!(
        "--disable-pip-version-check --retries 0 --index-url {}/simple/",
        index.url()
    );
    let script = format!(
        "set -e; cd /tmp\n\
         {pip} download {opts} --no-deps -d /tmp/dl shimtest-beta\n\
         {pip} install {opts} --target /tmp/site shimtest-alpha\n\
         ls /tmp/dl\n\
         PYTHONPATH=/tmp/site /usr/bin/python3 -c 'import shimtest_alpha, shimtest_beta; print(shimtest_alpha.NAME, shimtest_beta.NAME)'"
    );
    Ok(Case {
        tools: &[Tool::Pip],
        origins: vec![index, files],
        script,
        works: "shimtest-alpha shimtest-beta",
        error: "ERROR:",
        npmrc: None,
        reads: Vec::new(),
    })
}

fn npm_case(ca: &certs::Ca) -> Result<Case, String> {
    let registry = origin("npm.test", ca)?;
    let files = origin("npmfiles.test", ca)?;
    let packages = [
        npm::Package {
            name: "shimtest-alpha",
            version: "1.0.0",
            dependencies: &[("shimtest-beta", "^1.0.0")],
        },
        npm::Package {
            name: "shimtest-beta",
            version: "1.0.0",
            dependencies: &[],
        },
    ];
    npm::serve(&registry, &files, &packages).map_err(|e| e.to_string())?;
    let npm = format!(
        "npm --registry {}/ --fetch-retries=0 --no-update-notifier --no-audit --no-fund",
        registry.url()
    );
    let script = format!(
        "set -e; mkdir /tmp/p; cd /tmp/p\n\
         {npm} view shimtest-alpha version\n\
         {npm} install shimtest-alpha\n\
         node -e 'console.log(require(\"shimtest-alpha\"), require(\"shimtest-beta\"))'"
    );
    Ok(Case {
        tools: &[Tool::Npm],
        origins: vec![registry, files],
        script,
        works: "shimtest-alpha shimtest-beta",
        error: "npm error",
        // As many machines have (Debian's npm reads /usr/etc/npmrc too): a `cafile` that
        // replaces npm's CA list, which NODE_EXTRA_CA_CERTS alone does not reach.
        npmrc: Some(format!("cafile={}\n", system_bundle())),
        reads: Vec::new(),
    })
}

fn cargo_case(ca: &certs::Ca) -> Result<Case, String> {
    let index = origin("crates.test", ca)?;
    let files = origin("cratefiles.test", ca)?;
    cargo::serve(
        &index,
        &files,
        &[cargo::Crate {
            name: "shimtest",
            version: "1.0.0",
        }],
    )
    .map_err(|e| e.to_string())?;
    let script = format!(
        "set -e; mkdir -p /tmp/c/src /tmp/c/.cargo; cd /tmp/c; touch src/lib.rs\n\
         printf '[registries.test]\\nindex = \"sparse+{url}{path}\"\\n[net]\\nretry = 0\\n' > .cargo/config.toml\n\
         printf '[package]\\nname = \"c\"\\nversion = \"0.1.0\"\\nedition = \"2021\"\\n[dependencies]\\nshimtest = {{ version = \"1\", registry = \"test\" }}\\n' > Cargo.toml\n\
         cargo fetch --quiet\n\
         ls \"$CARGO_HOME\"/registry/cache/*/",
        url = index.url(),
        path = cargo::INDEX_PATH
    );
    Ok(Case {
        tools: &[Tool::Cargo],
        origins: vec![index, files],
        script,
        works: "shimtest-1.0.0.crate",
        error: "error:",
        npmrc: None,
        reads: toolchain(),
    })
}

fn apt(ca: &certs::Ca) -> Result<Case, String> {
    let repo = origin("deb.test", ca)?;
    let hello = debian::Package {
        name: "shimtest-hello",
        version: "1.0",
    };
    debian::serve(&repo, &[hello]).map_err(|e| e.to_string())?;
    let script = format!(
        "set -e; mkdir -p /tmp/lists/partial; cd /tmp\n\
         echo 'deb [trusted=yes] {url}{root} stable main' > /tmp/s.list\n\
         O='-o Dir::Etc::SourceList=/tmp/s.list -o Dir::Etc::SourceParts=/nonexistent -o Dir::State::Lists=/tmp/lists -o Acquire::Retries=0'\n\
         apt-get update -q $O\n\
         apt-get download -q $O shimtest-hello\n\
         ls *.deb",
        url = repo.url(),
        root = debian::ROOT
    );
    Ok(Case {
        tools: &[Tool::AptGet],
        origins: vec![repo],
        script,
        works: "shimtest-hello_1.0_all.deb",
        error: "E:",
        npmrc: None,
        reads: Vec::new(),
    })
}

fn curl(ca: &certs::Ca) -> Result<Case, String> {
    let index = origin("pypi.test", ca)?;
    index.serve(
        "/simple/",
        "text/html",
        "<a href=\"/simple/shimtest/\">shimtest</a>\n",
    );
    // Transparent capture: curl ignores the proxy variables.
    let script = format!(
        "set -e; curl -sS --noproxy '*' -o /tmp/page {}/simple/; grep -o shimtest/ /tmp/page",
        index.url()
    );
    Ok(Case {
        tools: &[Tool::Curl],
        origins: vec![index],
        script,
        works: "shimtest/",
        error: "curl:",
        npmrc: None,
        reads: Vec::new(),
    })
}

/// The system's CA bundle (the shim's own list: the first that exists).
fn system_bundle() -> &'static str {
    crate::support::SYSTEM_BUNDLES
        .iter()
        .find(|p| Path::new(p).exists())
        .copied()
        .unwrap_or("/etc/ssl/certs/ca-certificates.crt")
}

fn origin(name: &str, ca: &certs::Ca) -> Result<StaticOrigin, String> {
    StaticOrigin::start(name, Some(ca)).map_err(|e| format!("origin {name}: {e}"))
}

/// What a run left: the shim's output and its report.
struct Ran {
    out: Output,
    report: serde_json::Value,
    /// The standalone mediator's decision log and stderr (socket modes).
    mediator: String,
}

impl Ran {
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    fn all(&self) -> String {
        format!(
            "stdout:\n{}\nstderr:\n{}\nmediator:\n{}",
            String::from_utf8_lossy(&self.out.stdout),
            self.stderr(),
            self.mediator
        )
    }
}

/// Runs `case` in `mode`, its last origin left out of the grant with `leave_out`.
fn run(
    tag: &str,
    make: fn(&certs::Ca) -> Result<Case, String>,
    mode: Mode,
    leave_out: bool,
) -> Result<(Case, Ran), String> {
    let s = Scratch::new(tag);
    let ca = certs::Ca::create(&certs::CaOptions {
        common_name: "shim tests' registry CA".into(),
        ..certs::CaOptions::default()
    })
    .map_err(|e| e.to_string())?;
    let ca_pem = s.path("origin-ca.pem");
    std::fs::write(&ca_pem, ca.cert_pem()).unwrap();
    let case = make(&ca)?;
    needs(case.tools)?;
    let names: Vec<String> = case.origins.iter().map(|o| o.name().to_owned()).collect();
    let granted = &case.origins[..case.origins.len() - usize::from(leave_out)];
    let allow: Vec<String> = granted.iter().map(StaticOrigin::host_port).collect();
    let report = s.path("report.json");
    let mut flags: Vec<OsString> = Vec::from(args!["--report-file", &report]);
    for r in &case.reads {
        flags.extend(args!["--allow-read", r]);
    }
    let standalone = match mode {
        Mode::Embedded => {
            for n in &names {
                flags.extend(args!["--resolve", format!("{n}=127.0.0.1")]);
            }
            for a in &allow {
                flags.extend(args!["--allow", a]);
            }
            flags.extend(args![
                "--allow-private",
                "127.0.0.1/32",
                "--ca-cert",
                &ca_pem
            ]);
            None
        }
        Mode::Socket | Mode::Terminated => {
            let terminate: Vec<String> = if mode == Mode::Terminated {
                granted.iter().map(|o| o.name().to_owned()).collect()
            } else {
                Vec::new()
            };
            let m = Standalone::start(
                &s.path("mediator"),
                &Grant {
                    names: &names,
                    allow: &allow,
                    terminate: &terminate,
                    origin_ca: &ca_pem,
                },
            )?;
            flags.extend(m.flags());
            if mode == Mode::Socket {
                flags.extend(args!["--ca-cert", &ca_pem]);
            }
            Some(m)
        }
    };
    let mut shim = std::process::Command::new(crate::support::SHIM);
    if let Some(npmrc) = &case.npmrc {
        let home = s.path("home");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(home.join(".npmrc"), npmrc).unwrap();
        shim.env("HOME", home);
    }
    let out = shim
        .args(&flags)
        .args(["--", "sh", "-c", &case.script])
        .current_dir(&s.0)
        .env_remove("PIP_FIND_LINKS")
        .env_remove("PIP_INDEX_URL")
        .env_remove("PIP_EXTRA_INDEX_URL")
        .output()
        .map_err(|e| format!("shim: {e}"))?;
    let mediator = standalone.as_ref().map_or_else(String::new, |m| {
        format!(
            "{}{}",
            std::fs::read_to_string(&m.stderr).unwrap_or_default(),
            std::fs::read_to_string(&m.log).unwrap_or_default()
        )
    });
    let report = read_json(&report)?;
    Ok((
        case,
        Ran {
            out,
            report,
            mediator,
        },
    ))
}

/// The client works, and nothing it wrote was refused by the walls.
fn works(tag: &str, make: fn(&certs::Ca) -> Result<Case, String>, mode: Mode) -> TestResult {
    let (case, ran) = run(tag, make, mode, false)?;
    let stdout = String::from_utf8_lossy(&ran.out.stdout);
    if !ran.out.status.success() || stdout.trim_end().lines().last() != Some(case.works) {
        return Err(format!(
            "expected the client to work and print {:?} last ({:?}):\n{}",
            case.works,
            ran.out.status,
            ran.all()
        ));
    }
    let fs = &ran.report["filesystem"];
    if fs["denied"] != 0 || ran.stderr().contains("shim: filesystem:") {
        return Err(format!(
            "the walls refused a write of the working client: {fs}\n{}",
            ran.all()
        ));
    }
    if ran.report["denials"] != serde_json::json!([]) {
        return Err(format!("denials: {}\n{}", ran.report["denials"], ran.all()));
    }
    Ok(())
}

/// With the last origin left out of the grant the client fails, and the shim says which
/// host it was denied (in embedded mode, before the client's first error line).
fn denied(tag: &str, make: fn(&certs::Ca) -> Result<Case, String>, mode: Mode) -> TestResult {
    let (case, ran) = run(tag, make, mode, true)?;
    let left = case
        .origins
        .last()
        .map(|o| o.name().to_owned())
        .unwrap_or_default();
    if ran.out.status.success() {
        return Err(format!(
            "expected the client to fail without {left}:\n{}",
            ran.all()
        ));
    }
    let stderr = ran.stderr();
    let line = format!("mediator: denied {left}");
    let Some(said) = stderr.find(&line) else {
        return Err(format!("no {line:?} on stderr:\n{}", ran.all()));
    };
    if mode == Mode::Embedded
        && let Some(first_error) = stderr.lines().find(|l| l.starts_with(case.error))
        && stderr.find(first_error).is_some_and(|at| at < said)
    {
        return Err(format!(
            "the client's error came before the denial line:\n{}",
            ran.all()
        ));
    }
    Ok(())
}

fn pip_embedded() -> TestResult {
    works("clients-pip-embedded", pip, Mode::Embedded)
}
fn pip_socket() -> TestResult {
    works("clients-pip-socket", pip, Mode::Socket)
}
fn pip_terminated() -> TestResult {
    works("clients-pip-tls", pip, Mode::Terminated)
}
fn pip_denied_embedded() -> TestResult {
    denied("clients-pip-denied", pip, Mode::Embedded)
}
fn pip_denied_socket() -> TestResult {
    denied("clients-pip-denied-socket", pip, Mode::Socket)
}
fn npm_embedded() -> TestResult {
    works("clients-npm-embedded", npm_case, Mode::Embedded)
}
fn npm_socket() -> TestResult {
    works("clients-npm-socket", npm_case, Mode::Socket)
}
fn npm_terminated() -> TestResult {
    works("clients-npm-tls", npm_case, Mode::Terminated)
}
fn npm_denied_embedded() -> TestResult {
    denied("clients-npm-denied", npm_case, Mode::Embedded)
}
fn npm_denied_socket() -> TestResult {
    denied("clients-npm-denied-socket", npm_case, Mode::Socket)
}
fn cargo_embedded() -> TestResult {
    works("clients-cargo-embedded", cargo_case, Mode::Embedded)
}
fn cargo_socket() -> TestResult {
    works("clients-cargo-socket", cargo_case, Mode::Socket)
}
fn cargo_terminated() -> TestResult {
    works("clients-cargo-tls", cargo_case, Mode::Terminated)
}
fn cargo_denied_embedded() -> TestResult {
    denied("clients-cargo-denied", cargo_case, Mode::Embedded)
}
fn cargo_denied_socket() -> TestResult {
    denied("clients-cargo-denied-socket", cargo_case, Mode::Socket)
}
fn apt_embedded() -> TestResult {
    works("clients-apt-embedded", apt, Mode::Embedded)
}
fn apt_socket() -> TestResult {
    works("clients-apt-socket", apt, Mode::Socket)
}
fn apt_terminated() -> TestResult {
    works("clients-apt-tls", apt, Mode::Terminated)
}
fn apt_denied_embedded() -> TestResult {
    denied("clients-apt-denied", apt, Mode::Embedded)
}
fn apt_denied_socket() -> TestResult {
    denied("clients-apt-denied-socket", apt, Mode::Socket)
}
fn curl_embedded() -> TestResult {
    works("clients-curl-embedded", curl, Mode::Embedded)
}
fn curl_socket() -> TestResult {
    works("clients-curl-socket", curl, Mode::Socket)
}
fn curl_terminated() -> TestResult {
    works("clients-curl-tls", curl, Mode::Terminated)
}
fn curl_denied_embedded() -> TestResult {
    denied("clients-curl-denied", curl, Mode::Embedded)
}
fn curl_denied_socket() -> TestResult {
    denied("clients-curl-denied-socket", curl, Mode::Socket)
}
