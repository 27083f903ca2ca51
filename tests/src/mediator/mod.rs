//! Runs the real `mediator` binary with a generated configuration in a temporary
//! directory, waits for its `ready` line, and reads its decision log.
//!
//! This crate never builds or looks for the binary: the caller names it. The end-to-end
//! test binary is a test target of the `mediator` package, so Cargo builds the binary
//! before it and hands over its path as `env!("CARGO_BIN_EXE_mediator")`, which the test
//! binary passes to [`MediatorBuilder::new`] and [`run`].
//!
//! Start-up contract: once every listener is bound, the mediator prints one stderr line
//! `ready tcp=<addr|-> admin=<addr|-> socket_dir=<path|->`. Nothing here sleeps and
//! hopes: every wait is for a condition, bounded by a deadline.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tempfile::TempDir;

use crate::wait::wait_for;

/// How long the mediator gets to print its `ready` line.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// How long the mediator gets to exit after SIGTERM before it is killed.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(15);

/// The default deadline for [`Mediator::wait_for_log`] in tests.
pub const LOG_TIMEOUT: Duration = Duration::from_secs(10);

mod builder;

pub use builder::{AuthoritySpec, MediatorBuilder, sha256_hex, toml_list, toml_str};

/// What the mediator printed on its `ready` line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ready {
    /// Bound shared TCP listener, if any.
    pub tcp: Option<SocketAddr>,
    /// Bound admin listener, if any.
    pub admin: Option<SocketAddr>,
    /// Directory of the per-authority sockets, if any.
    pub socket_dir: Option<PathBuf>,
    /// The limits in force (design section 13), by key (`max_connections`,
    /// `authority_connections`, `unidentified_connections`, `open_files`).
    pub limits: BTreeMap<String, u64>,
}

/// Parses `ready tcp=<addr|-> admin=<addr|-> socket_dir=<path|-> KEY=N...` (the limits in
/// force).
///
/// # Errors
/// When the line does not have that shape or an address does not parse.
pub fn parse_ready(line: &str) -> Result<Ready> {
    let rest = line
        .trim()
        .strip_prefix("ready ")
        .ok_or_else(|| anyhow!("not a ready line: {line:?}"))?;
    let mut ready = Ready::default();
    for field in rest.split_whitespace() {
        let (k, v) = field
            .split_once('=')
            .ok_or_else(|| anyhow!("bad field {field:?} in ready line {line:?}"))?;
        let v = (v != "-").then_some(v);
        match k {
            "tcp" => ready.tcp = v.map(str::parse).transpose().context("ready tcp=")?,
            "admin" => ready.admin = v.map(str::parse).transpose().context("ready admin=")?,
            "socket_dir" => ready.socket_dir = v.map(PathBuf::from),
            other => {
                if let Some(n) = v.and_then(|v| v.parse::<u64>().ok()) {
                    ready.limits.insert(other.to_owned(), n);
                }
            }
        }
    }
    Ok(ready)
}

/// How the `mediator` process is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// The binary itself.
    Direct,
    /// Through `prlimit --nofile=SOFT:HARD` (this process's hard limit).
    SoftNofile(u64),
}

/// A running `mediator` process. Dropping it sends SIGTERM, waits (bounded), then kills.
#[derive(Debug)]
pub struct Mediator {
    bin: PathBuf,
    child: Option<Child>,
    dir: TempDir,
    config_path: PathBuf,
    log_path: PathBuf,
    ready: Ready,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Mediator {
    /// Writes `config` to `<dir>/mediator.toml`, spawns `<bin> --config` on it and waits
    /// for the `ready` line, with extra environment variables `env` for the process (the
    /// test process's own proxy variables are removed first). The decision log is
    /// expected at `<dir>/decisions.jsonl` (where [`MediatorBuilder`] puts it).
    ///
    /// # Errors
    /// Spawn failure, the process exiting before `ready` (its stderr is included), or no
    /// `ready` line within [`READY_TIMEOUT`].
    pub async fn start_with_env(
        bin: &Path,
        dir: TempDir,
        config: &str,
        env: &[(String, String)],
    ) -> Result<Self> {
        Self::start_with(bin, Launcher::Direct, dir, config, env, &[]).await
    }

    /// [`Self::start_with_env`], started by `launcher`, with `args` after `--config FILE`.
    ///
    /// # Errors
    /// As [`Self::start_with_env`].
    pub async fn start_with(
        bin: &Path,
        launcher: Launcher,
        dir: TempDir,
        config: &str,
        env: &[(String, String)],
        args: &[String],
    ) -> Result<Self> {
        let config_path = dir.path().join("mediator.toml");
        std::fs::write(&config_path, config).context("writing mediator.toml")?;
        let log_path = dir.path().join("decisions.jsonl");
        let mut command = match launcher {
            Launcher::Direct => Command::new(bin),
            Launcher::SoftNofile(soft) => {
                let (_, hard) =
                    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                        .context("reading the open-files limit")?;
                let mut c = crate::Tool::Prlimit.std_command("prlimit")?;
                c.arg(format!("--nofile={soft}:{hard}")).arg("--").arg(bin);
                c
            }
        };
        let mut child = command
            .arg("--config")
            .arg(&config_path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env("RUST_BACKTRACE", "1")
            .env_remove("http_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("https_proxy")
            .env_remove("HTTPS_PROXY")
            .env_remove("all_proxy")
            .env_remove("ALL_PROXY")
            .env_remove("no_proxy")
            .env_remove("NO_PROXY")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let stderr_pipe = child
            .stderr
            .take()
            .ok_or_else(|| anyhow!("no stderr pipe"))?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::oneshot::channel::<String>();
        {
            let stderr = Arc::clone(&stderr);
            // A plain thread: it must keep draining stderr for the process's whole life so
            // the mediator never blocks on a full pipe.
            std::thread::spawn(move || {
                let mut tx = Some(tx);
                for line in BufReader::new(stderr_pipe).lines() {
                    let Ok(line) = line else { break };
                    if line.starts_with("ready ")
                        && let Some(tx) = tx.take()
                    {
                        let _ = tx.send(line.clone());
                    }
                    stderr
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(line);
                }
            });
        }
        let mut me = Self {
            bin: bin.to_owned(),
            child: Some(child),
            dir,
            config_path,
            log_path,
            ready: Ready::default(),
            stderr,
        };
        let line = match tokio::time::timeout(READY_TIMEOUT, rx).await {
            Ok(Ok(line)) => line,
            Ok(Err(_closed)) => {
                let status = me.wait_exit(EXIT_TIMEOUT).await.ok();
                bail!(
                    "mediator exited before printing its ready line (status {status:?}); \
                     config:\n{config}\nstderr:\n{}",
                    me.stderr_text()
                );
            }
            Err(_) => bail!(
                "mediator printed no ready line within {READY_TIMEOUT:?}; stderr:\n{}",
                me.stderr_text()
            ),
        };
        me.ready = parse_ready(&line)?;
        Ok(me)
    }

    /// Stops this mediator (SIGTERM, checked to exit cleanly) and starts a new one in the
    /// same directory with the config file as it is now (same socket dir, same decision
    /// log, appended), with no extra environment or arguments: a restart.
    ///
    /// # Errors
    /// The old process does not exit cleanly, or the new one does not start.
    pub async fn restart(mut self) -> Result<Self> {
        let status = self.terminate().await?;
        anyhow::ensure!(status.success(), "exit status {status} before the restart");
        let config = std::fs::read_to_string(&self.config_path).context("reading mediator.toml")?;
        let placeholder = tempfile::tempdir().context("creating a temp dir")?;
        let dir = std::mem::replace(&mut self.dir, placeholder);
        Self::start_with(&self.bin, Launcher::Direct, dir, &config, &[], &[]).await
    }

    /// Kills this mediator with SIGKILL (no cleanup of any kind: what a crash, an OOM kill
    /// or a power cut leaves), reaps it, and starts a new one in the same directory with
    /// the config file as it is now: a crash and a restart.
    ///
    /// # Errors
    /// The signal cannot be sent, or the new one does not start.
    pub async fn crash_restart(mut self) -> Result<Self> {
        self.signal(Signal::SIGKILL)?;
        self.wait_exit(EXIT_TIMEOUT).await?;
        self.restart_after_exit().await
    }

    /// Starts a new mediator in the same directory with the config file as it is now,
    /// once this one has exited (after [`Self::exited`], or a kill).
    ///
    /// # Errors
    /// The new one does not start.
    pub async fn restart_after_exit(mut self) -> Result<Self> {
        let config = std::fs::read_to_string(&self.config_path).context("reading mediator.toml")?;
        let placeholder = tempfile::tempdir().context("creating a temp dir")?;
        let dir = std::mem::replace(&mut self.dir, placeholder);
        Self::start_with(&self.bin, Launcher::Direct, dir, &config, &[], &[]).await
    }

    /// The binary this mediator runs.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The parsed `ready` line.
    pub fn ready(&self) -> &Ready {
        &self.ready
    }

    /// The shared TCP listener's address.
    ///
    /// # Panics
    /// When the mediator reported no TCP listener (the test configured one, so that is a
    /// contract violation worth a loud failure).
    #[allow(clippy::expect_used)]
    pub fn tcp_addr(&self) -> SocketAddr {
        self.ready
            .tcp
            .expect("the mediator's ready line names no tcp listener")
    }

    /// `<socket_dir>/<authority>.sock`, using the directory from the `ready` line, or the
    /// configured one if the line said `-`.
    pub fn socket_path(&self, authority: &str) -> PathBuf {
        let dir = self
            .ready
            .socket_dir
            .clone()
            .unwrap_or_else(|| self.dir.path().join("sockets"));
        dir.join(format!("{authority}.sock"))
    }

    /// The temp dir holding config, sockets and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The config file the mediator was started with.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// Runs `<bin> <subcommand> --config <this mediator's config> ARGS...` (e.g.
    /// `explain`, `ca-cert`) to completion and returns its output.
    ///
    /// # Errors
    /// As [`run`].
    pub async fn cli(&self, subcommand: &str, args: &[&str]) -> Result<Output> {
        let mut all = vec![
            OsStr::new(subcommand),
            OsStr::new("--config"),
            self.config_path.as_os_str(),
        ];
        all.extend(args.iter().map(OsStr::new));
        run(&self.bin, &all).await
    }

    /// The decision log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The mediator's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything the mediator wrote to stderr so far, one entry per line.
    pub fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .join("\n")
    }

    /// Every complete line of the decision log, parsed as JSON. A missing file is an
    /// empty log; a trailing line without its newline is still being written and is
    /// skipped.
    ///
    /// # Errors
    /// A complete line that is not JSON (the log must be JSON lines only).
    pub fn decision_lines(&self) -> Result<Vec<Value>> {
        let text = match std::fs::read_to_string(&self.log_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).context("reading the decision log"),
        };
        let complete = match text.rfind('\n') {
            Some(i) => &text[..i],
            None => return Ok(Vec::new()),
        };
        complete
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l)
                    .with_context(|| format!("decision log line is not JSON: {l:?}"))
            })
            .collect()
    }

    /// The `event: "decision"` lines only.
    ///
    /// # Errors
    /// As [`Self::decision_lines`].
    pub fn decisions(&self) -> Result<Vec<Value>> {
        Ok(self
            .decision_lines()?
            .into_iter()
            .filter(|v| v["event"] == "decision")
            .collect())
    }

    /// Waits until a log line satisfies `pred` and returns it (the first such line).
    ///
    /// # Errors
    /// No such line within `timeout` (the error shows the whole log and stderr), or a
    /// malformed log line.
    pub async fn wait_for_log(
        &self,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Result<Value> {
        wait_for(
            timeout,
            || Ok(self.decision_lines()?.into_iter().find(|v| pred(v))),
            || {
                format!(
                    "no matching decision log line; {}\nstderr:\n{}",
                    self.log_dump(),
                    self.stderr_text()
                )
            },
        )
        .await
    }

    /// Waits until at least `n` log lines satisfy `pred`, and returns all that do.
    ///
    /// # Errors
    /// Fewer than `n` such lines within `timeout` (the error shows the log), or a
    /// malformed log line.
    pub async fn wait_for_count(
        &self,
        pred: impl Fn(&Value) -> bool,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<Value>> {
        wait_for(
            timeout,
            || {
                let matching: Vec<Value> = self
                    .decision_lines()?
                    .into_iter()
                    .filter(|v| pred(v))
                    .collect();
                Ok((matching.len() >= n).then_some(matching))
            },
            || format!("fewer than {n} matching log lines; {}", self.log_dump()),
        )
        .await
    }

    /// The decision log as text for an error message.
    fn log_dump(&self) -> String {
        match std::fs::read_to_string(&self.log_path) {
            Ok(text) => format!("log:\n{text}"),
            Err(e) => format!("no log ({e})"),
        }
    }

    /// Waits for the `event: "decision"` line with this `reason` (and `host`, if given).
    ///
    /// # Errors
    /// As [`Self::wait_for_log`].
    pub async fn wait_for_decision(&self, reason: &str, host: Option<&str>) -> Result<Value> {
        self.wait_for_log(
            |v| {
                v["event"] == "decision"
                    && v["reason"] == reason
                    && host.is_none_or(|h| v["host"] == h)
            },
            LOG_TIMEOUT,
        )
        .await
    }

    /// Waits for the `event: "close"` line of the connection whose decision line had `id`.
    ///
    /// # Errors
    /// As [`Self::wait_for_log`].
    pub async fn wait_for_close(&self, id: &Value) -> Result<Value> {
        self.wait_for_log(|v| v["event"] == "close" && &v["id"] == id, LOG_TIMEOUT)
            .await
    }

    /// Sends SIGTERM and waits (up to [`EXIT_TIMEOUT`]) for the process to exit.
    ///
    /// # Errors
    /// The signal cannot be sent, or the process outlives the deadline (it is then killed).
    pub async fn terminate(&mut self) -> Result<ExitStatus> {
        self.signal(Signal::SIGTERM)?;
        self.wait_exit(EXIT_TIMEOUT).await
    }

    /// Waits (bounded) for a mediator that stops by itself to exit, and reaps it.
    ///
    /// # Errors
    /// It is already reaped, or it did not exit in time (then it is killed).
    pub async fn exited(&mut self) -> Result<ExitStatus> {
        self.wait_exit(EXIT_TIMEOUT).await
    }

    /// Sends `signal` to the running mediator, without waiting for anything.
    ///
    /// # Errors
    /// The process is already reaped, or the signal cannot be sent.
    pub fn signal(&self, signal: Signal) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| anyhow!("mediator already reaped"))?;
        kill(Pid::from_raw(pid as i32), signal).with_context(|| format!("sending {signal}"))
    }

    async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let Some(child) = self.child.as_mut() else {
            bail!("mediator already reaped");
        };
        let exited = wait_for(
            timeout,
            || Ok(child.try_wait()?),
            || "mediator did not exit; killed it".to_owned(),
        )
        .await;
        if exited.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.child = None;
        exited
    }
}

impl Drop for Mediator {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if std::thread::panicking() {
            eprintln!(
                "--- mediator stderr ---\n{}\n--- decision log ---\n{}",
                self.stderr_text(),
                std::fs::read_to_string(&self.log_path).unwrap_or_default()
            );
        }
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// How long a one-shot run of the binary ([`run`]) may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `<bin> ARGS...` to completion (stdin empty, killed after [`RUN_TIMEOUT`]) and
/// returns its output.
///
/// # Errors
/// Spawn failure, or the process outliving [`RUN_TIMEOUT`].
pub async fn run<S: AsRef<OsStr>>(bin: &Path, args: &[S]) -> Result<Output> {
    tokio::time::timeout(
        RUN_TIMEOUT,
        tokio::process::Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("`{}` did not finish within {RUN_TIMEOUT:?}", bin.display()))?
    .with_context(|| format!("spawning {}", bin.display()))
}

/// Runs `<bin> check --config <config_path>` and returns its exit status and its output:
/// stdout (the `OK` line), then stderr (the problems).
///
/// # Errors
/// As [`run`].
pub async fn run_check(bin: &Path, config_path: &Path) -> Result<(ExitStatus, String)> {
    let out = run(
        bin,
        &[
            OsStr::new("check"),
            OsStr::new("--config"),
            config_path.as_os_str(),
        ],
    )
    .await?;
    Ok((
        out.status,
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}
