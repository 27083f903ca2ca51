//! What a test starts the mediator with: [`AuthoritySpec`] (one `[[authority]]` table)
//! and [`MediatorBuilder`] (the whole configuration, its files, the start and `check`).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{Launcher, Mediator, run_check};

/// Lowercase hex SHA-256 of `token`, the form `token_sha256` takes in the config.
pub fn sha256_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A TOML basic string holding `s` (JSON string escapes are valid TOML escapes).
pub fn toml_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// A TOML array of basic strings.
pub fn toml_list<S: AsRef<str>>(items: &[S]) -> String {
    let inner: Vec<String> = items.iter().map(|s| toml_str(s.as_ref())).collect();
    format!("[{}]", inner.join(", "))
}

/// A TOML `deny` array: the plain patterns, then `{ host, reason }` tables (design 18).
fn deny_list(plain: &[String], reasoned: &[(String, String)]) -> String {
    let inner: Vec<String> = plain
        .iter()
        .map(|s| toml_str(s))
        .chain(reasoned.iter().map(|(host, reason)| {
            format!(
                "{{ host = {}, reason = {} }}",
                toml_str(host),
                toml_str(reason)
            )
        }))
        .collect();
    format!("[{}]", inner.join(", "))
}

/// One `[[authority]]` table of the generated configuration.
#[derive(Debug, Clone, Default)]
pub struct AuthoritySpec {
    /// `name`.
    pub name: String,
    /// `allow` host patterns.
    pub allow: Vec<String>,
    /// `deny` host patterns.
    pub deny: Vec<String>,
    /// `deny` entries with the operator's reason: `(host, reason)`.
    pub deny_reasons: Vec<(String, String)>,
    /// `allow_private` CIDRs.
    pub allow_private: Vec<String>,
    /// The plain token; the config gets its SHA-256 as `token_sha256`.
    pub token: Option<String>,
    /// Extra raw `key = value` lines for this table.
    pub raw: Vec<String>,
}

impl AuthoritySpec {
    /// An authority named `name` with an empty grant.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Self::default()
        }
    }

    /// Adds `allow` entries.
    #[must_use]
    pub fn allow<S: AsRef<str>>(mut self, entries: &[S]) -> Self {
        self.allow
            .extend(entries.iter().map(|s| s.as_ref().to_owned()));
        self
    }

    /// Adds `deny` entries.
    #[must_use]
    pub fn deny<S: AsRef<str>>(mut self, entries: &[S]) -> Self {
        self.deny
            .extend(entries.iter().map(|s| s.as_ref().to_owned()));
        self
    }

    /// Adds a `deny` entry with the operator's `reason` (`{ host, reason }`).
    #[must_use]
    pub fn deny_because(mut self, host: &str, reason: &str) -> Self {
        self.deny_reasons.push((host.to_owned(), reason.to_owned()));
        self
    }

    /// Adds `allow_private` CIDRs.
    #[must_use]
    pub fn allow_private<S: AsRef<str>>(mut self, cidrs: &[S]) -> Self {
        self.allow_private
            .extend(cidrs.iter().map(|s| s.as_ref().to_owned()));
        self
    }

    /// Sets the token (stored hashed) that names this authority on the TCP listener.
    #[must_use]
    pub fn token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self
    }

    /// Adds a raw TOML line (e.g. `sni_check = false`) to this table.
    #[must_use]
    pub fn raw(mut self, line: &str) -> Self {
        self.raw.push(line.to_owned());
        self
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "\n[[authority]]");
        let _ = writeln!(out, "name = {}", toml_str(&self.name));
        let _ = writeln!(out, "allow = {}", toml_list(&self.allow));
        let _ = writeln!(out, "deny = {}", deny_list(&self.deny, &self.deny_reasons));
        let _ = writeln!(out, "allow_private = {}", toml_list(&self.allow_private));
        if let Some(t) = &self.token {
            let _ = writeln!(out, "token_sha256 = {}", toml_str(&sha256_hex(t)));
        }
        for line in &self.raw {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// Builds a configuration and starts a [`Mediator`] with it.
#[derive(Debug, Clone)]
pub struct MediatorBuilder {
    bin: PathBuf,
    authorities: Vec<AuthoritySpec>,
    tcp: bool,
    unix: bool,
    nameservers: Vec<SocketAddr>,
    global_deny: Vec<String>,
    global_deny_reasons: Vec<(String, String)>,
    request_head_bytes: Option<usize>,
    log_instance: Option<String>,
    log_format: Option<String>,
    connect_timeout_secs: Option<u64>,
    extra: String,
    admin: bool,
    listen_extra: Vec<String>,
    timeouts_extra: Vec<String>,
    upstream: Vec<String>,
    env: Vec<(String, String)>,
    limits_extra: Vec<String>,
    soft_nofile: Option<u64>,
    admin_secure: bool,
    args: Vec<String>,
}

impl MediatorBuilder {
    /// A builder for the `mediator` binary at `bin`, with the shared TCP listener and
    /// per-authority Unix sockets enabled and no authorities.
    pub fn new(bin: impl Into<PathBuf>) -> Self {
        Self {
            bin: bin.into(),
            authorities: Vec::new(),
            tcp: true,
            unix: true,
            nameservers: Vec::new(),
            global_deny: Vec::new(),
            global_deny_reasons: Vec::new(),
            request_head_bytes: None,
            log_instance: None,
            log_format: None,
            connect_timeout_secs: None,
            extra: String::new(),
            admin: false,
            listen_extra: Vec::new(),
            timeouts_extra: Vec::new(),
            upstream: Vec::new(),
            env: Vec::new(),
            limits_extra: Vec::new(),
            soft_nofile: None,
            admin_secure: false,
            args: Vec::new(),
        }
    }

    /// Adds a `[limits]` line (`"max_connections = 16"`).
    #[must_use]
    pub fn limits_line(mut self, line: &str) -> Self {
        self.limits_extra.push(line.to_owned());
        self
    }

    /// Starts the mediator with this soft open-files limit (its hard limit stays this
    /// process's), as a systemd service gets 1024: through `prlimit --nofile=SOFT:HARD`.
    #[must_use]
    pub fn soft_nofile(mut self, soft: u64) -> Self {
        self.soft_nofile = Some(soft);
        self
    }

    /// The binary this builder starts.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Adds an authority.
    #[must_use]
    pub fn authority(mut self, a: AuthoritySpec) -> Self {
        self.authorities.push(a);
        self
    }

    /// Points `[resolver] nameservers` at `addr` (our loopback [`crate::DnsServer`]).
    #[must_use]
    pub fn nameserver(mut self, addr: SocketAddr) -> Self {
        self.nameservers.push(addr);
        self
    }

    /// Whether to configure `[listen] tcp = "127.0.0.1:0"` (default on).
    #[must_use]
    pub fn tcp(mut self, on: bool) -> Self {
        self.tcp = on;
        self
    }

    /// Whether to configure `[listen] socket_dir` inside the temp dir (default on).
    #[must_use]
    pub fn unix(mut self, on: bool) -> Self {
        self.unix = on;
        self
    }

    /// Adds `[global] deny` entries applied to every authority.
    #[must_use]
    pub fn global_deny<S: AsRef<str>>(mut self, entries: &[S]) -> Self {
        self.global_deny
            .extend(entries.iter().map(|s| s.as_ref().to_owned()));
        self
    }

    /// Sets `[log] format` (`native`, `ocsf`).
    #[must_use]
    pub fn log_format(mut self, format: &str) -> Self {
        self.log_format = Some(format.to_owned());
        self
    }

    /// Sets `[log] instance`.
    #[must_use]
    pub fn log_instance(mut self, name: &str) -> Self {
        self.log_instance = Some(name.to_owned());
        self
    }

    /// Adds a `[global] deny` entry with the operator's `reason`.
    #[must_use]
    pub fn global_deny_because(mut self, host: &str, reason: &str) -> Self {
        self.global_deny_reasons
            .push((host.to_owned(), reason.to_owned()));
        self
    }

    /// Sets `[limits] request_head_bytes`.
    #[must_use]
    pub fn request_head_bytes(mut self, n: usize) -> Self {
        self.request_head_bytes = Some(n);
        self
    }

    /// Sets `[timeouts] connect` (seconds).
    #[must_use]
    pub fn connect_timeout_secs(mut self, secs: u64) -> Self {
        self.connect_timeout_secs = Some(secs);
        self
    }

    /// Whether to configure `[listen] admin = "127.0.0.1:0"` (default off). With no
    /// admin token configured (`admin_token_sha256` in [`Self::listen_line`]), the tests'
    /// admin API also takes writes without one (`admin_allow_anonymous_writes = true`), so
    /// tests of the control plane can create and revoke authorities; see
    /// [`Self::admin_secure`] for the default.
    #[must_use]
    pub fn admin(mut self, on: bool) -> Self {
        self.admin = on;
        self
    }

    /// The admin API as a config without the opt-out has it: writes on its TCP listener
    /// need a token.
    #[must_use]
    pub fn admin_secure(mut self) -> Self {
        self.admin = true;
        self.admin_secure = true;
        self
    }

    /// Adds a raw `key = value` line to `[listen]` (e.g. `admin_socket = "..."`).
    #[must_use]
    pub fn listen_line(mut self, line: &str) -> Self {
        self.listen_extra.push(line.to_owned());
        self
    }

    /// Sets `[timeouts] <key> = <secs>` (e.g. `revoke_grace`, `watchdog`).
    #[must_use]
    pub fn timeout(mut self, key: &str, secs: u64) -> Self {
        self.timeouts_extra.push(format!("{key} = {secs}"));
        self
    }

    /// Adds a raw `key = value` line to `[upstream]`; with none, `mode = "direct"`.
    #[must_use]
    pub fn upstream_line(mut self, line: &str) -> Self {
        self.upstream.push(line.to_owned());
        self
    }

    /// Sets an environment variable of the mediator process. Proxy variables of the test
    /// process itself never reach the mediator; only these do.
    #[must_use]
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Adds a command-line argument after `--config FILE` (e.g. `--watch-config`).
    #[must_use]
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_owned());
        self
    }

    /// Appends raw TOML after the generated tables (before the authorities).
    #[must_use]
    pub fn extra_toml(mut self, toml: &str) -> Self {
        self.extra.push_str(toml);
        self.extra.push('\n');
        self
    }

    /// The configuration text this builder would write, for a temp dir `dir`.
    pub fn render(&self, dir: &Path) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "[listen]");
        if self.unix {
            let sockets = dir.join("sockets");
            let _ = writeln!(out, "socket_dir = {}", toml_str(&sockets.to_string_lossy()));
        }
        if self.tcp {
            let _ = writeln!(out, "tcp = \"127.0.0.1:0\"");
        }
        if self.admin {
            let _ = writeln!(out, "admin = \"127.0.0.1:0\"");
            let token = self
                .listen_extra
                .iter()
                .any(|l| l.starts_with("admin_token_sha256"));
            if !token && !self.admin_secure {
                let _ = writeln!(out, "admin_allow_anonymous_writes = true");
            }
        }
        for line in &self.listen_extra {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out, "\n[resolver]");
        let ns: Vec<String> = self.nameservers.iter().map(ToString::to_string).collect();
        let _ = writeln!(out, "nameservers = {}", toml_list(&ns));
        if self.upstream.is_empty() {
            let _ = writeln!(out, "\n[upstream]\nmode = \"direct\"");
        } else {
            let _ = writeln!(out, "\n[upstream]\n{}", self.upstream.join("\n"));
        }
        let _ = writeln!(out, "\n[timeouts]");
        // Defaults, unless the test sets the key itself.
        for (key, value) in [("request_head", 10), ("dns", 5), ("shutdown_grace", 2)] {
            let prefix = format!("{key} =");
            if !self.timeouts_extra.iter().any(|l| l.starts_with(&prefix)) {
                let _ = writeln!(out, "{key} = {value}");
            }
        }
        if let Some(c) = self.connect_timeout_secs {
            let _ = writeln!(out, "connect = {c}");
        } else {
            let _ = writeln!(out, "connect = 10");
        }
        for line in &self.timeouts_extra {
            let _ = writeln!(out, "{line}");
        }
        if self.request_head_bytes.is_some() || !self.limits_extra.is_empty() {
            let _ = writeln!(out, "\n[limits]");
        }
        if let Some(n) = self.request_head_bytes {
            let _ = writeln!(out, "request_head_bytes = {n}");
        }
        for line in &self.limits_extra {
            let _ = writeln!(out, "{line}");
        }
        if !self.global_deny.is_empty() || !self.global_deny_reasons.is_empty() {
            let _ = writeln!(
                out,
                "\n[global]\ndeny = {}",
                deny_list(&self.global_deny, &self.global_deny_reasons)
            );
        }
        let log = dir.join("decisions.jsonl");
        let _ = writeln!(
            out,
            "\n[log]\ndecisions = {}",
            toml_str(&log.to_string_lossy())
        );
        if let Some(i) = &self.log_instance {
            let _ = writeln!(out, "instance = {}", toml_str(i));
        }
        if let Some(f) = &self.log_format {
            let _ = writeln!(out, "format = {}", toml_str(f));
        }
        // Each mediator keeps its registry in its own temp dir (the default, the machine's
        // state directory, is one mediator's at a time), unless the test says otherwise.
        if !self.extra.contains("[registry]") {
            let state = dir.join("state");
            let _ = writeln!(
                out,
                "\n[registry]\nstate_dir = {}",
                toml_str(&state.to_string_lossy())
            );
        }
        out.push_str(&self.extra);
        for a in &self.authorities {
            a.render(&mut out);
        }
        out
    }

    /// Writes the configuration into a fresh temp dir and starts the mediator on it.
    ///
    /// # Errors
    /// See [`Mediator::start_with_env`].
    pub async fn start(&self) -> Result<Mediator> {
        let dir = tempfile::Builder::new()
            .prefix("e2e-mediator-")
            .tempdir()
            .context("creating the mediator's temp dir")?;
        let text = self.render(dir.path());
        let launcher = match self.soft_nofile {
            None => Launcher::Direct,
            Some(soft) => Launcher::SoftNofile(soft),
        };
        Mediator::start_with(&self.bin, launcher, dir, &text, &self.env, &self.args).await
    }

    /// Starts a mediator that must refuse to start, and returns its error in full
    /// (`{:#}`: the context chain, with the mediator's stderr).
    ///
    /// # Errors
    /// The mediator started.
    pub async fn start_err(&self) -> Result<String> {
        match self.start().await {
            Ok(m) => bail!("the mediator started; stderr:\n{}", m.stderr_text()),
            Err(e) => Ok(format!("{e:#}")),
        }
    }

    /// Writes the configuration into a fresh temp dir and runs `mediator check` on it.
    ///
    /// # Errors
    /// As [`run_check`].
    pub async fn check(&self) -> Result<(ExitStatus, String)> {
        let dir = tempfile::tempdir().context("creating a temp dir for the config")?;
        let path = dir.path().join("mediator.toml");
        std::fs::write(&path, self.render(dir.path())).context("writing mediator.toml")?;
        run_check(&self.bin, &path).await
    }
}
