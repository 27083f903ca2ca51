//! The external programs the end-to-end suite runs, each with the Debian/Ubuntu package
//! that ships it, so that a test needing one that this machine lacks is reported ignored
//! with what to install (or failed under `CI=true`: CI never skips quietly).
//!
//! Every program is started through [`Tool::command`], which also keeps the declarations
//! honest: a test that runs a tool its case did not declare fails, naming the tool, even
//! where the tool is installed ([`declare`] is what the harness sets for each test).

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Result, bail};

/// A program (or set of programs from one feature) the suite runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// `curl`: the real client of most tests.
    Curl,
    /// MIT Kerberos' KDC and tools: `krb5kdc`, `kdb5_util`, `kadmin.local`, `kinit`, `kvno`.
    Kerberos,
    /// Squid, with its `negotiate_kerberos_auth` helper.
    Squid,
    /// `ss` (socket statistics).
    Ss,
    /// `dconf` (compiles a keyfile into a GVDB database).
    Dconf,
    /// `setpriv` (runs a command as another user).
    Setpriv,
    /// `prlimit` (runs a command with other resource limits).
    Prlimit,
    /// `git`.
    Git,
    /// A C compiler, `cc`.
    Cc,
    /// Node.js, `node` (npm's runtime: its TLS client is npm's).
    Node,
    /// etcd, the key-value store of the shared registry (design section 17), and its
    /// `etcdctl`.
    Etcd,
    /// Python's `jsonschema` (a JSON Schema 2020-12 validator), run by `python3`: checks
    /// the OCSF events against the published schema (design section 19).
    Jsonschema,
    /// Debian's pip, run as `/usr/bin/python3 -m pip` (the shim's registry clients).
    Pip,
    /// npm, with Node (the shim's registry clients).
    Npm,
    /// cargo (the shim's registry clients; the toolchain that builds the suite has it).
    Cargo,
    /// apt-get (the shim's registry clients).
    AptGet,
}

impl Tool {
    /// The programs this tool stands for, each with the package that ships it
    /// (Debian/Ubuntu names).
    pub fn programs(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Curl => &[("curl", "curl")],
            Self::Kerberos => &[
                ("krb5kdc", "krb5-kdc"),
                ("kdb5_util", "krb5-kdc"),
                ("kadmin.local", "krb5-admin-server"),
                ("kinit", "krb5-user"),
                ("kvno", "krb5-user"),
            ],
            Self::Squid => &[
                ("squid", "squid"),
                ("/usr/lib/squid/negotiate_kerberos_auth", "squid"),
            ],
            Self::Ss => &[("ss", "iproute2")],
            Self::Dconf => &[("dconf", "dconf-cli")],
            Self::Setpriv => &[("setpriv", "util-linux")],
            Self::Prlimit => &[("prlimit", "util-linux")],
            Self::Git => &[("git", "git")],
            Self::Cc => &[("cc", "gcc")],
            Self::Node => &[("node", "nodejs")],
            Self::Etcd => &[("etcd", "etcd-server"), ("etcdctl", "etcd-client")],
            Self::Jsonschema => &[
                ("python3", "python3"),
                (
                    "/usr/lib/python3/dist-packages/jsonschema/__init__.py",
                    "python3-jsonschema",
                ),
            ],
            Self::Pip => &[
                ("/usr/bin/python3", "python3"),
                (
                    "/usr/lib/python3/dist-packages/pip/__init__.py",
                    "python3-pip",
                ),
            ],
            Self::Npm => &[("npm", "npm"), ("node", "nodejs")],
            Self::Cargo => &[("cargo", "cargo")],
            Self::AptGet => &[("apt-get", "apt")],
        }
    }

    /// The packages to install for this tool's missing programs (empty: all present).
    pub fn missing_packages(self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = self
            .programs()
            .iter()
            .filter(|(program, _)| find(program).is_none())
            .map(|(_, package)| *package)
            .collect();
        out.dedup();
        out
    }

    /// A command for `program` (one of [`Self::programs`]), found on `PATH` or in
    /// `/usr/sbin`, `/sbin`.
    ///
    /// # Errors
    /// The running test did not declare this tool (see the module docs), or the program
    /// is not installed (the message names the package).
    pub fn std_command(self, program: &str) -> Result<std::process::Command> {
        check_declared(self)?;
        let Some((_, package)) = self.programs().iter().find(|(p, _)| *p == program) else {
            bail!("{program} is not one of the programs of {self:?}");
        };
        let Some(path) = find(program) else {
            bail!("{program} is not installed here: install the package {package}");
        };
        Ok(std::process::Command::new(path))
    }

    /// [`Self::std_command`] as a tokio command.
    ///
    /// # Errors
    /// As [`Self::std_command`].
    pub fn command(self, program: &str) -> Result<tokio::process::Command> {
        self.std_command(program).map(tokio::process::Command::from)
    }

    /// The path of `program` (one of [`Self::programs`]).
    ///
    /// # Errors
    /// As [`Self::std_command`].
    pub fn path(self, program: &str) -> Result<PathBuf> {
        check_declared(self)?;
        find(program).ok_or_else(|| anyhow::anyhow!("{program} is not installed here"))
    }
}

/// `program` on `PATH`, or in the system directories root's `PATH` may lack.
fn find(program: &str) -> Option<PathBuf> {
    if program.starts_with('/') {
        return Path::new(program).exists().then(|| PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

thread_local! {
    /// The running test's name and declared tools, on every thread that runs its code.
    static DECLARED: Cell<Option<(&'static str, &'static [Tool])>> = const { Cell::new(None) };
}

/// Says which test runs on this thread and which tools it declared (the harness calls
/// this on the test's thread and on each thread of its runtime).
pub fn declare(test: &'static str, tools: &'static [Tool]) {
    DECLARED.with(|d| d.set(Some((test, tools))));
}

/// The tools each test has run so far, by test name.
static USED: Mutex<Vec<(&'static str, Tool)>> = Mutex::new(Vec::new());

/// Fails when the test running on this thread did not declare `tool`; else notes that it
/// ran it. Code run outside the harness (no declaration on this thread) is not checked.
fn check_declared(tool: Tool) -> Result<()> {
    let Some((test, tools)) = DECLARED.with(Cell::get) else {
        return Ok(());
    };
    if !tools.contains(&tool) {
        bail!("{test} runs {tool:?} without declaring it: add Tool::{tool:?} to its case's needs");
    }
    let mut used = USED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !used.contains(&(test, tool)) {
        used.push((test, tool));
    }
    Ok(())
}

/// The tools `test` declared but never ran (checked when it passed, so that a declaration
/// cannot outlive the use that needed it).
pub fn declared_but_unused(test: &'static str, declared: &[Tool]) -> Vec<Tool> {
    let used = USED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    declared
        .iter()
        .copied()
        .filter(|t| !used.contains(&(test, *t)))
        .collect()
}
