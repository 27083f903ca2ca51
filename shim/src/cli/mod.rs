//! Command-line flags and the TOML profile, in two stages (as ripgrep does): the raw
//! options ([`Options`]: the flags of [`Cli`], or a profile file) as typed, then one
//! validated [`Settings`] that the rest of the shim trusts.

mod config;
mod tmp;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Parser, ValueEnum};
use serde::Deserialize;

use crate::error::{Error, Result};
use config::from_config;
pub(crate) use tmp::TmpSize;

/// `shim`: confine one command (and everything it starts) and bind it to its authority's
/// mediator channel.
#[derive(Debug, Parser)]
#[command(
    name = "shim",
    version = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("GIT_REVISION_SHORT"), ")"),
    long_version = concat!(
        env!("CARGO_PKG_VERSION"),
        " (git ",
        env!("GIT_REVISION_SHORT"),
        ")\nrevision ",
        env!("GIT_REVISION")
    ),
    about,
    long_about = None
)]
pub struct Cli {
    /// What the run may do and where its channel is: the flags below, also the keys of
    /// a `--profile` file.
    #[command(flatten)]
    pub(crate) options: Options,

    /// A TOML profile with the same fields (snake_case); flags add to it.
    #[arg(long, value_name = "FILE")]
    pub(crate) profile: Option<PathBuf>,

    /// Hand the caller's open descriptor N (one accepted connection, a socketpair end) to
    /// the command under the same number (repeatable). Not a listening socket: that is
    /// --listen-fd. Every other inherited descriptor is closed.
    #[arg(long, value_name = "N")]
    pub(crate) pass_fd: Vec<i32>,

    /// Hand the caller's listening socket N to the command, placed at descriptor 3 (then
    /// 4, ...) with LISTEN_FDS and LISTEN_PID set (sd_listen_fds(3)): the command may then
    /// accept any number of inbound connections on it (repeatable).
    #[arg(long, value_name = "N")]
    pub(crate) listen_fd: Vec<i32>,

    /// Make a control socket at PATH (outside the sandbox, mode 0600, masked inside) on
    /// which the host sends one JSON line per command: {"rebind": "NAME" or "/path.sock"}
    /// moves the command's new connections to another authority's channel (embedded
    /// mode: {"rebind": {"allow": [...]}} to a new grant); open ones finish on the old.
    /// Embedded mode: a grant miss is also held and asked about as an {"ask": {...}} line
    /// on every open connection; the host answers {"answer": ID, "allow_via": ...} or
    /// {"answer": ID, "deny": "..."} (with no connection open, a miss is denied at once).
    #[arg(long, value_name = "PATH")]
    pub(crate) control: Option<PathBuf>,

    /// No transparent capture: clients that ignore HTTP_PROXY have no network (in a
    /// profile: `capture = false`).
    #[arg(long, conflicts_with = "capture")]
    pub(crate) no_capture: bool,

    /// No private temporary directory: /tmp and /var/tmp are the host's, read-only like
    /// the rest of the tree, and TMPDIR and the cache variables are left as they are (in
    /// a profile: `tmp = false`).
    #[arg(long, conflicts_with = "tmp_size")]
    pub(crate) no_tmp: bool,

    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

/// The shim's options, one definition for both sources: each field is a flag
/// (`--allow-write`) and a key of the `--profile` TOML file (`allow_write`). Relative
/// paths in a profile are resolved against its directory.
#[derive(Debug, Default, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct Options {
    /// The authority's Unix socket (`<socket_dir>/<authority>.sock` of a running mediator).
    #[arg(long, value_name = "PATH")]
    pub(crate) mediator_socket: Option<PathBuf>,

    /// A mediator config file; with --authority, the socket is `<listen.socket_dir>/<NAME>.sock`.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,

    /// The authority whose socket to use, with --config.
    #[arg(long, value_name = "NAME")]
    pub(crate) authority: Option<String>,

    /// A directory tree the command may write (repeatable). Everything else is read-only.
    #[arg(long = "allow-write", value_name = "P")]
    pub(crate) allow_write: Vec<PathBuf>,

    /// A file or directory the command may not read (repeatable). A missing path is ignored.
    #[arg(long = "deny-read", value_name = "P")]
    pub(crate) deny_read: Vec<PathBuf>,

    /// Re-open for reading a path beneath a --deny-read path (repeatable).
    #[arg(long = "allow-read", value_name = "P")]
    pub(crate) allow_read: Vec<PathBuf>,

    /// Let the command create new AF_UNIX sockets (denied by default; socketpair always works).
    #[arg(long)]
    pub(crate) allow_unix_sockets: bool,

    /// At exit, print a JSON summary of this run's denials to stderr.
    #[arg(long)]
    pub(crate) report: bool,

    /// Write the --report JSON to this file instead of stderr (implies --report).
    #[arg(long, value_name = "FILE")]
    pub(crate) report_file: Option<PathBuf>,

    /// Write each refused filesystem operation of the command as one JSON line, live, to
    /// PATH (appended) or to the descriptor N this shim was given (`fd:N`); also said on
    /// stderr unless --quiet-denials. --report lists them too.
    #[arg(long, value_name = "PATH|fd:N")]
    pub(crate) violations: Option<String>,

    /// A PEM CA certificate the command must trust (the mediator's, when it terminates
    /// TLS): the CA variables (SSL_CERT_FILE, NODE_EXTRA_CA_CERTS, ...) then point at it,
    /// joined to the system bundle. With --config it is found by itself when the
    /// authority has tls_terminate.
    #[arg(long, value_name = "FILE")]
    pub(crate) ca_cert: Option<PathBuf>,

    /// Embedded mode: a host pattern the command may reach (repeatable).
    #[arg(long, value_name = "HOST_PATTERN")]
    pub(crate) allow: Vec<String>,

    /// Embedded mode: a host pattern the command may not reach (repeatable).
    #[arg(long, value_name = "HOST_PATTERN")]
    pub(crate) deny: Vec<String>,

    /// Embedded mode: a non-public CIDR the command may reach anyway (repeatable).
    #[arg(long, value_name = "CIDR")]
    pub(crate) allow_private: Vec<String>,

    /// Embedded mode: append the mediator's decision log (JSON lines) to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) decision_log: Option<PathBuf>,

    /// Run without a protection the kernel lacks, naming it (repeatable). Never implied.
    #[arg(long, value_enum, value_name = "WHAT")]
    pub(crate) allow_degraded: Vec<Degradation>,

    /// Transparent capture, required: clients that ignore HTTP_PROXY are mediated too (a
    /// TUN device is the sandbox's default route). It is on by default where the kernel
    /// allows it; with this flag, a TUN device that cannot be made is an error. In a
    /// profile `capture = true` or `false` (as --no-capture).
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub(crate) capture: Option<bool>,

    /// Print no line on stderr for each denial as it happens.
    #[arg(long)]
    pub(crate) quiet_denials: bool,

    /// Embedded mode: the mediator resolves NAME to ADDR (as curl's --resolve), for a
    /// local origin (repeatable; a non-public ADDR also needs --allow-private).
    #[arg(long, value_name = "NAME=ADDR")]
    pub(crate) resolve: Vec<String>,

    /// A label the host puts on every record of this run (repeatable; e.g. the agent's
    /// tool-call id, `--tag tool=call_12`), beside the run's random invocation id. Set
    /// outside the sandbox: the command cannot add, change or remove one.
    #[arg(long, value_name = "KEY=VALUE")]
    pub(crate) tag: Vec<String>,
    /// The bound of the private temporary directory (a tmpfs at /tmp and /var/tmp, shared
    /// with the tools' caches): bytes with an optional k, m, g or t suffix, or a
    /// percentage of the memory (default 50%, the kernel's own default for a tmpfs).
    #[arg(long, value_name = "SIZE")]
    pub(crate) tmp_size: Option<String>,

    /// Keep the tools' caches (pip, npm, cargo, Go, XDG_CACHE_HOME) in DIR, a directory of
    /// the caller's that the command may write and that outlives the run, instead of the
    /// private temporary directory (created if missing).
    #[arg(long, value_name = "DIR")]
    pub(crate) cache: Option<PathBuf>,

    /// In a profile only: `tmp = false` is `--no-tmp`.
    #[arg(skip)]
    pub(crate) tmp: Option<bool>,
}

/// A protection that the user may explicitly give up when the kernel lacks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Degradation {
    /// Run without Landlock (the second write layer). The mount layer still makes every
    /// regular file, directory and symlink outside the writable roots read-only, but
    /// named pipes (FIFOs) outside them stay writable to the sandbox's uid.
    Landlock,
    /// Run the command under the caller's own uid when the shim runs as root (uid 0
    /// without capabilities): it can then read every file root owns that no mask covers.
    /// Without it, root's command runs as an unprivileged uid outside the sandbox, with
    /// idmapped writable roots, and the shim refuses where those cannot be made.
    SameUid,
}

impl Options {
    /// Reads a `--profile` file, resolving its relative paths against its directory.
    ///
    /// # Errors
    /// [`Error::ProfileRead`] if it cannot be read, [`Error::ProfileParse`] (with line and
    /// column, and the unknown key if any) if it does not match the schema.
    pub(crate) fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ProfileRead {
            path: path.to_owned(),
            source,
        })?;
        let parse_error = |source| Error::ProfileParse {
            path: path.to_owned(),
            source,
        };
        // Checked as the options first: an error then names its line and column.
        toml::from_str::<Self>(&text).map_err(parse_error)?;
        let mut table: toml::Table = toml::from_str(&text).map_err(parse_error)?;
        let base = path.parent().unwrap_or(Path::new("."));
        for key in Self::path_keys() {
            let values = match table.get_mut(&key) {
                Some(toml::Value::String(s)) => std::slice::from_mut(s).iter_mut().collect(),
                Some(toml::Value::Array(list)) => list
                    .iter_mut()
                    .filter_map(|v| match v {
                        toml::Value::String(s) => Some(s),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            for value in values {
                if Path::new(value.as_str()).is_relative() {
                    *value = base.join(&*value).into_os_string().into_string().map_err(|_| {
                        Error::Usage(format!(
                            "profile {}: {key} = {value:?} is relative to a directory whose name is not UTF-8; give an absolute path",
                            path.display()
                        ))
                    })?;
                }
            }
        }
        table.try_into().map_err(parse_error)
    }

    /// The keys of the options that hold paths (a profile's relative ones are resolved
    /// against its directory): every field whose values parse as a [`PathBuf`], read
    /// from the flags' own definitions (clap's id is the field's name, the key).
    fn path_keys() -> Vec<String> {
        let flags = <Self as clap::Args>::augment_args(clap::Command::new("shim"));
        flags
            .get_arguments()
            .filter(|a| a.get_value_parser().type_id() == std::any::TypeId::of::<PathBuf>())
            .map(|a| a.get_id().to_string())
            .collect()
    }

    /// `over` (the flags) on top of `self` (the profile): lists are concatenated, a
    /// single value given in `over` wins, a switch is on if either turns it on.
    fn merge(self, over: Self) -> Self {
        fn cat<T>(mut a: Vec<T>, b: Vec<T>) -> Vec<T> {
            a.extend(b);
            a
        }
        Self {
            mediator_socket: over.mediator_socket.or(self.mediator_socket),
            config: over.config.or(self.config),
            authority: over.authority.or(self.authority),
            allow_write: cat(self.allow_write, over.allow_write),
            deny_read: cat(self.deny_read, over.deny_read),
            allow_read: cat(self.allow_read, over.allow_read),
            allow_unix_sockets: self.allow_unix_sockets || over.allow_unix_sockets,
            report: self.report || over.report,
            report_file: over.report_file.or(self.report_file),
            violations: over.violations.or(self.violations),
            ca_cert: over.ca_cert.or(self.ca_cert),
            allow: cat(self.allow, over.allow),
            deny: cat(self.deny, over.deny),
            allow_private: cat(self.allow_private, over.allow_private),
            decision_log: over.decision_log.or(self.decision_log),
            allow_degraded: cat(self.allow_degraded, over.allow_degraded),
            capture: over.capture.or(self.capture),
            quiet_denials: self.quiet_denials || over.quiet_denials,
            resolve: cat(self.resolve, over.resolve),
            tag: cat(self.tag, over.tag),
            tmp_size: over.tmp_size.or(self.tmp_size),
            cache: over.cache.or(self.cache),
            tmp: over.tmp.or(self.tmp),
        }
    }
}

/// Where a mediator's admin API listens (read from `--config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AdminEndpoint {
    /// `[listen] admin`: a loopback TCP address.
    Tcp(std::net::SocketAddr),
    /// `[listen] admin_socket`: a Unix socket path.
    Unix(PathBuf),
}

/// Transparent capture (design section 15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CaptureMode {
    /// The default: on where the kernel allows it, else said once on stderr.
    Auto,
    /// `--capture`: on, or the run stops with the reason.
    Required,
    /// `--no-capture`.
    Off,
}

/// Where the command's proxy traffic goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChannelSpec {
    /// A running mediator's per-authority Unix socket.
    Socket(PathBuf),
    /// An in-process mediator with a one-authority grant built from flags.
    Embedded {
        /// Allowed host patterns.
        allow: Vec<String>,
        /// Denied host patterns.
        deny: Vec<String>,
        /// Private-range exceptions.
        allow_private: Vec<String>,
        /// Where the decision log goes (`None`: kept in memory for `--report`).
        decision_log: Option<PathBuf>,
        /// `--resolve NAME=ADDR` values, as given.
        resolve: Vec<String>,
    },
}

/// Where the CA certificate to trust inside comes from (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CaOrigin {
    /// `--ca-cert` (or `ca_cert` in the profile).
    Flag,
    /// `<[tls] ca_dir>/ca.pem` of `--config`, because the authority has `tls_terminate`.
    Config {
        /// The mediator config file.
        config: PathBuf,
        /// The authority whose grant terminates TLS.
        authority: String,
    },
}

/// A CA certificate (PEM file) the command must trust; read by [`crate::ca::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CaCert {
    /// The PEM file.
    pub(crate) path: PathBuf,
    /// Why it is used.
    pub(crate) origin: CaOrigin,
}

/// Validated settings: everything the launcher needs, with no contradiction left.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where proxy traffic goes.
    pub(crate) channel: ChannelSpec,
    /// Writable roots, as given (canonicalised later by the filesystem planner).
    pub(crate) allow_write: Vec<PathBuf>,
    /// Read-denied paths, as given.
    pub(crate) deny_read: Vec<PathBuf>,
    /// Read re-opened paths, as given.
    pub(crate) allow_read: Vec<PathBuf>,
    /// Whether new AF_UNIX sockets are allowed.
    pub(crate) allow_unix_sockets: bool,
    /// `None`: no report; `Some(None)`: report to stderr; `Some(Some(f))`: to file `f`.
    pub(crate) report: Option<Option<PathBuf>>,
    /// `--violations PATH|fd:N`, as given.
    pub(crate) violations: Option<String>,
    /// Protections the user gave up explicitly.
    pub(crate) allow_degraded: Vec<Degradation>,
    /// The CA the command must trust (`None`: no CA variable is set or changed).
    pub(crate) ca_cert: Option<CaCert>,
    /// Transparent capture.
    pub(crate) capture: CaptureMode,
    /// Print one line on stderr per denial as it happens.
    pub(crate) live_denials: bool,
    /// Socket mode from `--config`: the mediator's admin API and the authority's name, to
    /// read the run's denials from (see [`crate::feed`]).
    pub(crate) admin: Option<(AdminEndpoint, String)>,
    /// Socket mode from `--config`: each `child_env` of the authority's credentials and
    /// its placeholder (design section 14); the child gets these instead of inherited
    /// values of the same names.
    pub(crate) child_env: Vec<(String, String)>,
    /// Socket mode from `--config`: every `secret_env` that a credential of any authority
    /// of the config names; the child never inherits these (a secret stays with the
    /// mediator, even one the caller's environment happens to hold).
    pub(crate) hidden_env: Vec<String>,
    /// Socket mode from `--config`: the mediator's files the config names (secrets, keys,
    /// state, the config itself), kept from the command ([`crate::secrets`]).
    pub(crate) mediator_paths: Vec<crate::secrets::MediatorPath>,
    /// The program and its arguments.
    pub(crate) command: Vec<OsString>,
    /// `--pass-fd`, as given (checked at launch).
    pub(crate) pass_fd: Vec<i32>,
    /// `--listen-fd`, as given (checked at launch).
    pub(crate) listen_fd: Vec<i32>,
    /// `--control PATH`: the rebind socket.
    pub(crate) control: Option<PathBuf>,
    /// The run's invocation id and `--tag`s (design section 20).
    pub(crate) labels: mediator::labels::Labels,
    /// The private temporary directory's bound (`None`: `--no-tmp`).
    pub(crate) tmp: Option<TmpSize>,
    /// `--cache DIR`: where the tools' caches go, kept across runs.
    pub(crate) cache: Option<PathBuf>,
}

impl Settings {
    /// Merge the flags over the profile (lists are concatenated, flags win for single
    /// values) and validate the result.
    ///
    /// # Errors
    /// [`Error::Usage`] for contradictions (a socket and embedded-mode rules at once, no
    /// channel at all, `--config` without a readable `listen.socket_dir`);
    /// [`Error::UnknownAuthority`] for an `--authority` that `--config` does not list and
    /// that has no socket; [`Error::ProfileRead`] and [`Error::ProfileParse`] for a
    /// `--profile` or `--config` file that cannot be read or parsed.
    pub fn from_cli(cli: Cli) -> Result<Self> {
        let profile = match &cli.profile {
            Some(p) => Options::load(p)?,
            None => Options::default(),
        };
        let mut flags = cli.options;
        flags.capture = cli.no_capture.then_some(false).or(flags.capture);
        flags.tmp = cli.no_tmp.then_some(false).or(flags.tmp);
        let mut o = profile.merge(flags);
        let mut config_ca = None;
        let mut admin = None;
        let mut child_env = Vec::new();
        let mut hidden_env = Vec::new();
        let mut mediator_paths = Vec::new();
        let socket = match (
            o.mediator_socket.take(),
            o.config.take(),
            o.authority.take(),
        ) {
            (Some(s), None, None) => Some(s),
            (None, Some(c), Some(a)) => {
                let found = from_config(&c, &a)?;
                (child_env, hidden_env) = (found.child_env, found.hidden_env);
                mediator_paths = found.mediator_paths;
                config_ca = found.ca;
                admin = found.admin.map(|e| (e, a));
                Some(found.socket)
            }
            (None, None, None) => None,
            (Some(_), Some(_), _) | (Some(_), None, Some(_)) => {
                return Err(Error::Usage(
                    "give either --mediator-socket or --config/--authority, not both".into(),
                ));
            }
            (None, Some(_), None) | (None, None, Some(_)) => {
                return Err(Error::Usage("--config and --authority go together".into()));
            }
        };
        let channel = channel_spec(socket, &mut o)?;
        let report = (o.report || o.report_file.is_some()).then_some(o.report_file);
        let tmp = TmpSize::setting(o.tmp, o.tmp_size)?;
        // An explicit CA wins over the one the config implies.
        let flag_ca = |path| CaCert {
            path,
            origin: CaOrigin::Flag,
        };
        let ca_cert = o.ca_cert.map(flag_ca).or(config_ca);
        Ok(Self {
            channel,
            allow_write: o.allow_write,
            deny_read: o.deny_read,
            allow_read: o.allow_read,
            allow_unix_sockets: o.allow_unix_sockets,
            report,
            violations: o.violations,
            allow_degraded: o.allow_degraded,
            ca_cert,
            capture: match o.capture {
                Some(true) => CaptureMode::Required,
                Some(false) => CaptureMode::Off,
                None => CaptureMode::Auto,
            },
            live_denials: !o.quiet_denials,
            admin,
            child_env,
            hidden_env,
            mediator_paths,
            command: cli.command,
            pass_fd: cli.pass_fd,
            listen_fd: cli.listen_fd,
            control: cli.control,
            labels: crate::invocation::labels(&o.tag)?,
            tmp,
            cache: o.cache,
        })
    }
}

/// The channel of a run: `socket` (a running mediator's, from `--mediator-socket` or the
/// config), or an embedded mediator built from the flags; the flags of one mode given
/// with the other are a usage error. Takes the embedded grant's flags out of `o`.
fn channel_spec(socket: Option<PathBuf>, o: &mut Options) -> Result<ChannelSpec> {
    let embedded_rules = !(o.allow.is_empty() && o.deny.is_empty() && o.allow_private.is_empty());
    if socket.is_some() && !o.resolve.is_empty() {
        return Err(Error::Usage(
            "--resolve is for embedded mode; a standalone mediator resolves with its own [resolver] config".into(),
        ));
    }
    if socket.is_some() && o.decision_log.is_some() {
        return Err(Error::Usage(
            "--decision-log is for embedded mode; a standalone mediator writes its own log".into(),
        ));
    }
    Ok(match socket {
        Some(_) if embedded_rules => {
            return Err(Error::Usage(
                "--allow/--deny/--allow-private build an embedded mediator's grant; with --mediator-socket the grant lives in that mediator's config".into(),
            ));
        }
        Some(s) => ChannelSpec::Socket(s),
        None if embedded_rules => ChannelSpec::Embedded {
            allow: std::mem::take(&mut o.allow),
            deny: std::mem::take(&mut o.deny),
            allow_private: std::mem::take(&mut o.allow_private),
            decision_log: o.decision_log.take(),
            resolve: std::mem::take(&mut o.resolve),
        },
        None => {
            return Err(Error::Usage(
                "no channel: pass --mediator-socket PATH (a running mediator) or --allow HOST_PATTERN (embedded mode)".into(),
            ));
        }
    })
}

#[cfg(test)]
mod tests;
