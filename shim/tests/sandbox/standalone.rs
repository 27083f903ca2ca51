//! A standalone mediator for socket mode: this binary, run as `mediator CONFIG`, loads the
//! config with the mediator's own parser and serves it with the mediator's own server
//! (`mediator::start`, what the `mediator` binary runs after its flags), in a process of
//! its own, until it is killed. [`Standalone`] writes the config (one authority, `agent`,
//! its socket in a directory of its own, names resolved to 127.0.0.1, optionally TLS
//! termination with a CA of its own that trusts the test origins' CA upstream) and starts
//! it.
//!
//! Network rule: the authority's grant reaches 127.0.0.1 only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::support::{me, wait_until};

/// The authority's name.
pub(crate) const AUTHORITY: &str = "agent";

/// `mediator CONFIG`: serve until killed. Returns the exit status when it cannot start.
pub(crate) fn main(args: &[String]) -> i32 {
    let Some(path) = args.first() else {
        eprintln!("usage: mediator CONFIG");
        return 2;
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{path}: {e}");
            return 1;
        }
    };
    let config = match policy::config::parse(&text, path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        match mediator::start(config, mediator::Options::default()).await {
            Ok(running) => {
                std::future::pending::<()>().await;
                drop(running);
                0
            }
            Err(e) => {
                eprintln!("mediator: {e}");
                1
            }
        }
    })
}

/// What the standalone mediator's authority may do.
pub(crate) struct Grant<'a> {
    /// Names that resolve to 127.0.0.1 (`[resolver] hosts`).
    pub(crate) names: &'a [String],
    /// `allow` entries (`name:port`).
    pub(crate) allow: &'a [String],
    /// Hosts whose TLS it terminates (`tls_terminate`); none: no `[tls]` at all.
    pub(crate) terminate: &'a [String],
    /// The test origins' CA, trusted upstream when it terminates.
    pub(crate) origin_ca: &'a Path,
}

/// A running standalone mediator; killed on drop.
pub(crate) struct Standalone {
    child: Child,
    /// Its config file (for `shim --config F --authority agent`).
    pub(crate) config: PathBuf,
    /// Its decision log.
    pub(crate) log: PathBuf,
    /// Where its stderr goes.
    pub(crate) stderr: PathBuf,
}

fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

impl Standalone {
    /// Writes the config into `dir` and starts the mediator on it; returns once the
    /// authority's socket exists.
    pub(crate) fn start(dir: &Path, grant: &Grant<'_>) -> Result<Self, String> {
        let sockets = dir.join("sockets");
        std::fs::create_dir_all(&sockets).map_err(|e| e.to_string())?;
        let log = dir.join("decisions.jsonl");
        let hosts: Vec<String> = grant
            .names
            .iter()
            .map(|n| format!("{n:?} = [\"127.0.0.1\"]"))
            .collect();
        let mut config = format!(
            "[listen]\nsocket_dir = {sockets:?}\n\n[resolver]\nhosts = {{ {hosts} }}\n\n\
             [upstream]\nmode = \"direct\"\n\n[log]\ndecisions = {log:?}\n\n\
             [registry]\nstate_dir = {state:?}\n",
            hosts = hosts.join(", "),
            state = dir.join("state"),
        );
        if !grant.terminate.is_empty() {
            config.push_str(&format!(
                "\n[tls]\nca_dir = {:?}\nextra_ca_files = [{:?}]\n",
                dir.join("ca"),
                grant.origin_ca
            ));
        }
        config.push_str(&format!(
            "\n[[authority]]\nname = \"{AUTHORITY}\"\nallow = {}\nallow_private = [\"127.0.0.1/32\"]\n",
            toml_list(grant.allow)
        ));
        if !grant.terminate.is_empty() {
            config.push_str(&format!("tls_terminate = {}\n", toml_list(grant.terminate)));
        }
        let path = dir.join("mediator.toml");
        std::fs::write(&path, config).map_err(|e| e.to_string())?;
        let stderr = dir.join("mediator.stderr");
        let child = Command::new(me())
            .arg("mediator")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("start the mediator: {e}"))?;
        let mut me = Self {
            child,
            config: path,
            log,
            stderr,
        };
        let socket = sockets.join(format!("{AUTHORITY}.sock"));
        if !wait_until(|| socket.exists(), 20) {
            let _ = me.child.kill();
            return Err(format!(
                "the mediator did not start: {}",
                std::fs::read_to_string(&me.stderr).unwrap_or_default()
            ));
        }
        Ok(me)
    }

    /// The `shim` flags that bind a command to this mediator's authority.
    pub(crate) fn flags(&self) -> Vec<std::ffi::OsString> {
        Vec::from(args!["--config", &self.config, "--authority", AUTHORITY])
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
