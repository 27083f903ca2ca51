//! What the tests share: scratch directories, a stand-in mediator on a Unix socket, and
//! running the `shim` binary with this binary's probe as the confined command.
//!
//! Network rule: every address used here is loopback, or inside the sandbox's own network
//! namespace. Nothing here asserts: helpers return what they saw, or why they could not.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::TestResult;

/// The binary under test.
pub(crate) const SHIM: &str = env!("CARGO_BIN_EXE_shim");

/// The CA variables the shim sets when given a CA (design section 12).
pub(crate) const CA_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "AWS_CA_BUNDLE",
    "CARGO_HTTP_CAINFO",
    "DENO_CERT",
    "NIX_SSL_CERT_FILE",
    "npm_config_cafile",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "HTTPLIB2_CA_CERTS",
    "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE",
];

/// The system bundles the shim looks for, in order.
pub(crate) const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The files of the mandatory deny set that [`Fixture::make_repo`] creates at the top of
/// the repository.
pub(crate) const REPO_FILES: &[&str] = &[
    ".bashrc",
    ".profile",
    ".zshrc",
    ".gitconfig",
    ".gitmodules",
    ".ripgreprc",
    ".mcp.json",
];

/// This test binary (the probe inside the sandbox).
pub(crate) fn me() -> PathBuf {
    std::env::current_exe().unwrap()
}

/// A fresh scratch directory (canonical; per uid, process and tag), removed on drop.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    pub(crate) fn new(tag: &str) -> Self {
        let base = std::env::temp_dir().join(format!(
            "shim-e2e-{}-{}-{tag}",
            nix::unistd::geteuid(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        Self(std::fs::canonicalize(&base).unwrap())
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The signature of a PROXY protocol v2 header.
const PROXY_V2: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// Reads the PROXY protocol v2 header the shim writes before anything else on an
/// authority's socket (design section 20: the run's labels) and returns its labels as
/// `(TLV type, value)` pairs: a stand-in for the mediator reads it first, as the
/// mediator does.
pub(crate) fn read_labels(c: &mut impl Read) -> Vec<(u8, String)> {
    let mut fixed = [0u8; 16];
    if c.read_exact(&mut fixed).is_err() || &fixed[..12] != PROXY_V2 {
        return Vec::new();
    }
    let mut rest = vec![0u8; usize::from(u16::from_be_bytes([fixed[14], fixed[15]]))];
    if c.read_exact(&mut rest).is_err() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = 0;
    while at + 3 <= rest.len() {
        let len = usize::from(u16::from_be_bytes([rest[at + 1], rest[at + 2]]));
        let value = rest.get(at + 3..at + 3 + len).unwrap_or_default();
        out.push((rest[at], String::from_utf8_lossy(value).into_owned()));
        at += 3 + len;
    }
    out
}

/// A Unix-socket server standing in for the mediator: echoes lines back. Its socket is
/// `<dir>/sockets/authority.sock`, in a directory of its own as a mediator's socket_dir
/// (the shim masks that directory).
fn echo_server(dir: &Path) -> PathBuf {
    let sockets = dir.join("sockets");
    std::fs::create_dir_all(&sockets).unwrap();
    let path = sockets.join("authority.sock");
    let l = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                read_labels(&mut c);
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
    path
}

/// `SHIM FLAGS -- <this binary> probe PROBE...`.
pub(crate) fn probe_command(flags: &[OsString], probe: &[OsString]) -> Command {
    let mut c = Command::new(SHIM);
    c.args(flags).arg("--").arg(me()).arg("probe").args(probe);
    c
}

/// What most tests start from: a scratch directory, a stand-in mediator socket in it, and
/// optionally a `HOME` for the shim.
pub(crate) struct Fixture {
    pub(crate) dir: Scratch,
    /// The stand-in mediator's socket.
    pub(crate) socket: PathBuf,
    home: Option<PathBuf>,
}

impl Fixture {
    pub(crate) fn new(tag: &str) -> Self {
        let dir = Scratch::new(tag);
        let socket = echo_server(&dir.0);
        Self {
            dir,
            socket,
            home: None,
        }
    }

    /// Run every shim of this fixture with `HOME=home`.
    pub(crate) fn with_home(mut self, home: &Path) -> Self {
        self.home = Some(home.to_owned());
        self
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.dir.path(rel)
    }

    /// `SHIM --mediator-socket S FLAGS -- COMMAND`, from the scratch directory.
    pub(crate) fn shim(&self, flags: &[OsString], command: &[&str]) -> Command {
        let mut c = Command::new(SHIM);
        c.arg("--mediator-socket")
            .arg(&self.socket)
            .args(flags)
            .arg("--")
            .args(command);
        self.place(c)
    }

    /// The shim running `probe PROBE...` with `FLAGS`, from the scratch directory.
    pub(crate) fn probe_command(&self, flags: &[OsString], probe: &[OsString]) -> Command {
        let mut all = Vec::from(args!["--mediator-socket", &self.socket]);
        all.extend_from_slice(flags);
        self.place(probe_command(&all, probe))
    }

    fn place(&self, mut c: Command) -> Command {
        c.current_dir(&self.dir.0);
        if let Some(home) = &self.home {
            c.env("HOME", home);
        }
        c
    }

    /// What the probe printed, or why the shim failed.
    pub(crate) fn probe(&self, flags: &[OsString], probe: &[OsString]) -> Result<String, String> {
        succeeded(self.probe_command(flags, probe).output().unwrap()).map(|o| stdout(&o))
    }

    /// Expect the probe to print `want`.
    pub(crate) fn check(&self, flags: &[OsString], probe: &[OsString], want: &str) -> TestResult {
        let what = probe
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        expect(&what, &self.probe(flags, probe)?, want)
    }

    /// A repository at `work/` with the mandatory deny set present (each file reading
    /// `original\n`), a `.git` with `config`, `hooks/`, `objects/`, `index` and `HEAD`.
    pub(crate) fn make_repo(&self) -> PathBuf {
        let w = self.path("work");
        std::fs::create_dir_all(w.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(w.join(".git/objects/ab")).unwrap();
        std::fs::write(w.join(".git/config"), "[core]\n").unwrap();
        std::fs::write(w.join(".git/index"), "").unwrap();
        std::fs::write(w.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        for f in REPO_FILES {
            std::fs::write(w.join(f), "original\n").unwrap();
        }
        std::fs::create_dir_all(w.join(".vscode")).unwrap();
        std::fs::write(w.join(".vscode/settings.json"), "{}").unwrap();
        w
    }

    /// An empty directory `rel` in the scratch directory.
    pub(crate) fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

/// `out` if the shim (and the command) succeeded, else why not.
pub(crate) fn succeeded(out: Output) -> Result<Output, String> {
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "shim failed: {:?}, stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The command's standard output, trimmed.
pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub(crate) fn expect(what: &str, got: &str, want: &str) -> TestResult {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: expected {want:?}, got {got:?}"))
    }
}

/// A report file the shim wrote.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}: {text}", path.display()))
}

/// The names in `dir` (none if it is missing).
pub(crate) fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A fresh CA certificate (the mediator's kind), written to `path`.
pub(crate) fn write_ca(path: &Path) {
    let ca = certs::Ca::create(&certs::CaOptions::default()).unwrap();
    std::fs::write(path, ca.cert_pem()).unwrap();
}

/// A number to mark this test's background processes (`sleep MARKER`) on the host, so
/// that they can be found in `/proc`.
pub(crate) fn marker(base: u32, span: u32) -> String {
    format!("{}", base + std::process::id() % span)
}

pub(crate) fn host_has_process_with_arg(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == marker.as_bytes()))
        })
}

pub(crate) fn wait_until(mut cond: impl FnMut() -> bool, secs: u64) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Send `signal` to the shim `child`.
pub(crate) fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
}

/// The shim with `flags` running `script` (sh), whose fd 5 reads what the test writes on
/// the returned pipe: the script waits on it (for a rebind, a question's answer, the
/// test's word to start).
pub(crate) fn shim_waiting<S: AsRef<OsStr>>(
    flags: &[S],
    script: &str,
) -> (Child, std::io::PipeWriter) {
    let (r, w) = std::io::pipe().unwrap();
    let child = Command::new("sh")
        .arg("-c")
        .arg(r#"exec 5<&0 0</dev/null; shift; exec "$@""#)
        .arg("sh")
        .arg("-")
        .arg(SHIM)
        .args(flags)
        .args(["--pass-fd", "5", "--", "sh", "-c", script])
        .stdin(Stdio::from(r))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, w)
}
