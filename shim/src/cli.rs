//! Command-line flags and the TOML profile, in two stages (as ripgrep does): the raw
//! flags ([`Cli`]) and profile ([`Profile`]) as typed, then one validated [`Settings`]
//! that the rest of the shim trusts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Parser, ValueEnum};
use serde::Deserialize;

use crate::error::{Error, Result};

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
    /// The authority's Unix socket (`<socket_dir>/<authority>.sock` of a running mediator).
    #[arg(long, value_name = "PATH")]
    pub(crate) mediator_socket: Option<PathBuf>,

    /// A mediator config file; with --authority, the socket is `<listen.socket_dir>/<NAME>.sock`.
    #[arg(long, value_name = "FILE", requires = "authority")]
    pub(crate) config: Option<PathBuf>,

    /// The authority whose socket to use, with --config.
    #[arg(long, value_name = "NAME", requires = "config")]
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

    /// A PEM CA certificate the command must trust (the mediator's, when it terminates
    /// TLS): the CA variables (SSL_CERT_FILE, NODE_EXTRA_CA_CERTS, ...) then point at it,
    /// joined to the system bundle. With --config it is found by itself when the
    /// authority has tls_terminate.
    #[arg(long, value_name = "FILE")]
    pub(crate) ca_cert: Option<PathBuf>,

    /// A TOML profile with the same fields (snake_case); flags add to it.
    #[arg(long, value_name = "FILE")]
    pub(crate) profile: Option<PathBuf>,

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
    /// allows it; with this flag, a TUN device that cannot be made is an error.
    #[arg(long, conflicts_with = "no_capture")]
    pub(crate) capture: bool,

    /// No transparent capture: clients that ignore HTTP_PROXY have no network.
    #[arg(long)]
    pub(crate) no_capture: bool,

    /// Print no line on stderr for each denial as it happens.
    #[arg(long)]
    pub(crate) quiet_denials: bool,

    /// Embedded mode: the mediator resolves NAME to ADDR (as curl's --resolve), for a
    /// local origin (repeatable; a non-public ADDR also needs --allow-private).
    #[arg(long, value_name = "NAME=ADDR")]
    pub(crate) resolve: Vec<String>,

    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

/// A protection that the user may explicitly give up when the kernel lacks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Degradation {
    /// Run without Landlock (the second write layer). The mount layer still makes every
    /// regular file, directory and symlink outside the writable roots read-only, but
    /// named pipes (FIFOs) outside them stay writable to the sandbox's uid.
    Landlock,
}

/// The `--profile` TOML file: the same fields as the flags, snake_case.
///
/// Relative paths are resolved against the profile file's directory.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Profile {
    /// As `--mediator-socket`.
    pub(crate) mediator_socket: Option<PathBuf>,
    /// As `--config`.
    pub(crate) config: Option<PathBuf>,
    /// As `--authority`.
    pub(crate) authority: Option<String>,
    /// As `--allow-write`.
    #[serde(default)]
    pub(crate) allow_write: Vec<PathBuf>,
    /// As `--deny-read`.
    #[serde(default)]
    pub(crate) deny_read: Vec<PathBuf>,
    /// As `--allow-read`.
    #[serde(default)]
    pub(crate) allow_read: Vec<PathBuf>,
    /// As `--allow-unix-sockets`.
    #[serde(default)]
    pub(crate) allow_unix_sockets: bool,
    /// As `--report`.
    #[serde(default)]
    pub(crate) report: bool,
    /// As `--report-file`.
    pub(crate) report_file: Option<PathBuf>,
    /// As `--ca-cert`.
    pub(crate) ca_cert: Option<PathBuf>,
    /// As `--allow`.
    #[serde(default)]
    pub(crate) allow: Vec<String>,
    /// As `--deny`.
    #[serde(default)]
    pub(crate) deny: Vec<String>,
    /// As `--allow-private`.
    #[serde(default)]
    pub(crate) allow_private: Vec<String>,
    /// As `--decision-log`.
    pub(crate) decision_log: Option<PathBuf>,
    /// As `--allow-degraded`.
    #[serde(default)]
    pub(crate) allow_degraded: Vec<Degradation>,
    /// `true` as `--capture`, `false` as `--no-capture`; absent: the default.
    pub(crate) capture: Option<bool>,
    /// As `--quiet-denials`.
    #[serde(default)]
    pub(crate) quiet_denials: bool,
    /// As `--resolve`.
    #[serde(default)]
    pub(crate) resolve: Vec<String>,
}

impl Profile {
    /// Read and parse a profile file, resolving its relative paths against its directory.
    ///
    /// # Errors
    /// [`Error::ProfileRead`] if it cannot be read, [`Error::ProfileParse`] (with line and
    /// column, and the unknown key if any) if it does not match the schema.
    pub(crate) fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ProfileRead {
            path: path.to_owned(),
            source,
        })?;
        let mut profile: Self = toml::from_str(&text).map_err(|source| Error::ProfileParse {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        for p in profile
            .allow_write
            .iter_mut()
            .chain(profile.deny_read.iter_mut())
            .chain(profile.allow_read.iter_mut())
            .chain(profile.mediator_socket.iter_mut())
            .chain(profile.config.iter_mut())
            .chain(profile.report_file.iter_mut())
            .chain(profile.ca_cert.iter_mut())
            .chain(profile.decision_log.iter_mut())
        {
            fix(p);
        }
        Ok(profile)
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
    /// The program and its arguments.
    pub(crate) command: Vec<OsString>,
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
            Some(p) => Profile::load(p)?,
            None => Profile::default(),
        };
        let cat = |a: Vec<PathBuf>, b: Vec<PathBuf>| a.into_iter().chain(b).collect::<Vec<_>>();
        let allow: Vec<String> = profile.allow.into_iter().chain(cli.allow).collect();
        let deny: Vec<String> = profile.deny.into_iter().chain(cli.deny).collect();
        let allow_private: Vec<String> = profile
            .allow_private
            .into_iter()
            .chain(cli.allow_private)
            .collect();
        let socket = cli.mediator_socket.or(profile.mediator_socket);
        let config = cli.config.or(profile.config);
        let authority = cli.authority.or(profile.authority);
        let mut config_ca = None;
        let mut admin = None;
        let mut child_env = Vec::new();
        let mut hidden_env = Vec::new();
        let socket = match (socket, config, authority) {
            (Some(s), None, _) => Some(s),
            (None, Some(c), Some(a)) => {
                let (socket, ca, endpoint) = from_config(&c, &a)?;
                let env = credential_env(&c, &a)?;
                (child_env, hidden_env) = (env.set, env.hidden);
                config_ca = ca;
                admin = endpoint.map(|e| (e, a));
                Some(socket)
            }
            (None, None, None) => None,
            (Some(_), Some(_), _) => {
                return Err(Error::Usage(
                    "give either --mediator-socket or --config/--authority, not both".into(),
                ));
            }
            (None, Some(_), None) | (None, None, Some(_)) => {
                return Err(Error::Usage("--config and --authority go together".into()));
            }
        };
        let resolve: Vec<String> = profile.resolve.into_iter().chain(cli.resolve).collect();
        let embedded_rules = !(allow.is_empty() && deny.is_empty() && allow_private.is_empty());
        if socket.is_some() && !resolve.is_empty() {
            return Err(Error::Usage(
                "--resolve is for embedded mode; a standalone mediator resolves with its own [resolver] config".into(),
            ));
        }
        let decision_log = cli.decision_log.or(profile.decision_log);
        if socket.is_some() && decision_log.is_some() {
            return Err(Error::Usage(
                "--decision-log is for embedded mode; a standalone mediator writes its own log"
                    .into(),
            ));
        }
        let channel = match socket {
            Some(_) if embedded_rules => {
                return Err(Error::Usage(
                    "--allow/--deny/--allow-private build an embedded mediator's grant; with --mediator-socket the grant lives in that mediator's config".into(),
                ));
            }
            Some(s) => ChannelSpec::Socket(s),
            None if embedded_rules => ChannelSpec::Embedded {
                allow,
                deny,
                allow_private,
                decision_log,
                resolve,
            },
            None => {
                return Err(Error::Usage(
                    "no channel: pass --mediator-socket PATH (a running mediator) or --allow HOST_PATTERN (embedded mode)".into(),
                ));
            }
        };
        let report_file = cli.report_file.or(profile.report_file);
        let report = if cli.report || profile.report || report_file.is_some() {
            Some(report_file)
        } else {
            None
        };
        let mut allow_degraded = profile.allow_degraded;
        allow_degraded.extend(cli.allow_degraded);
        // An explicit CA wins over the one the config implies.
        let ca_cert = match cli.ca_cert.or(profile.ca_cert) {
            Some(path) => Some(CaCert {
                path,
                origin: CaOrigin::Flag,
            }),
            None => config_ca,
        };
        Ok(Self {
            channel,
            allow_write: cat(profile.allow_write, cli.allow_write),
            deny_read: cat(profile.deny_read, cli.deny_read),
            allow_read: cat(profile.allow_read, cli.allow_read),
            allow_unix_sockets: cli.allow_unix_sockets || profile.allow_unix_sockets,
            report,
            allow_degraded,
            ca_cert,
            capture: match (cli.capture, cli.no_capture, profile.capture) {
                (true, _, _) => CaptureMode::Required,
                (_, true, _) => CaptureMode::Off,
                (false, false, Some(true)) => CaptureMode::Required,
                (false, false, Some(false)) => CaptureMode::Off,
                (false, false, None) => CaptureMode::Auto,
            },
            live_denials: !(cli.quiet_denials || profile.quiet_denials),
            admin,
            child_env,
            hidden_env,
            command: cli.command,
        })
    }
}

/// From a mediator config (only these keys are read; the mediator validates the rest):
/// the socket `<listen.socket_dir>/<authority>.sock`, and, when the authority's
/// `tls_terminate` is not empty, the CA certificate `<[tls] ca_dir>/ca.pem` (read later,
/// never created here), and the admin API's endpoint (`[listen] admin_socket`, else
/// `admin`) when it names one.
fn from_config(
    config: &Path,
    authority: &str,
) -> Result<(PathBuf, Option<CaCert>, Option<AdminEndpoint>)> {
    if authority.is_empty() || authority.contains('/') || authority.starts_with('.') {
        return Err(Error::Usage(format!(
            "--authority {authority:?} is not a valid authority name"
        )));
    }
    let text = std::fs::read_to_string(config).map_err(|source| Error::ProfileRead {
        path: config.to_owned(),
        source,
    })?;
    let value: toml::Table = toml::from_str(&text).map_err(|source| Error::ProfileParse {
        path: config.to_owned(),
        source,
    })?;
    let dir = value
        .get("listen")
        .and_then(|l| l.get("socket_dir"))
        .and_then(|d| d.as_str())
        .ok_or_else(|| {
            Error::Usage(format!(
                "{}: no listen.socket_dir, so no per-authority socket",
                config.display()
            ))
        })?;
    let socket = Path::new(dir).join(format!("{authority}.sock"));
    let listen = value.get("listen");
    let admin = listen
        .and_then(|l| l.get("admin_socket"))
        .and_then(|p| p.as_str())
        .map(|p| AdminEndpoint::Unix(PathBuf::from(p)))
        .or_else(|| {
            listen
                .and_then(|l| l.get("admin"))
                .and_then(|a| a.as_str())
                .and_then(|a| a.parse().ok())
                .map(AdminEndpoint::Tcp)
        });
    let tables = || {
        value
            .get("authority")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
    };
    let listed: Vec<String> = tables()
        .filter_map(|a| a.get("name").and_then(|n| n.as_str()))
        .map(str::to_owned)
        .collect();
    // An authority added through the admin API is not in the file, but its socket exists.
    if !listed.iter().any(|n| n == authority)
        && std::fs::symlink_metadata(&socket)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
    {
        return Err(Error::UnknownAuthority {
            authority: authority.to_owned(),
            config: config.to_owned(),
            listed,
            socket,
        });
    }
    // An authority added later through the admin API is not in the file: pass --ca-cert.
    let terminates = tables()
        .filter(|a| a.get("name").and_then(|n| n.as_str()) == Some(authority))
        .any(|a| {
            a.get("tls_terminate")
                .and_then(|t| t.as_array())
                .is_some_and(|t| !t.is_empty())
        });
    if !terminates {
        return Ok((socket, None, admin));
    }
    let ca_dir = value
        .get("tls")
        .and_then(|t| t.get("ca_dir"))
        .and_then(|d| d.as_str())
        .filter(|d| !d.is_empty())
        .ok_or_else(|| {
            Error::Usage(format!(
                "{}: authority {authority:?} has tls_terminate but [tls] ca_dir is not set (the mediator refuses this config too)",
                config.display()
            ))
        })?;
    let ca = CaCert {
        path: Path::new(ca_dir).join(certs::CA_CERT_FILE),
        origin: CaOrigin::Config {
            config: config.to_owned(),
            authority: authority.to_owned(),
        },
    };
    Ok((socket, Some(ca), admin))
}

/// The child's environment as the config's credentials shape it.
struct CredentialEnv {
    /// `child_env` and its placeholder, for each credential of the authority that has one.
    set: Vec<(String, String)>,
    /// Every `secret_env` of the config, of any authority.
    hidden: Vec<String>,
}

/// From the `[[authority.credential]]` tables of the mediator config: the `child_env`
/// variables of `authority`'s credentials, each with its placeholder, and the
/// `secret_env` variables of every authority's credentials (the child must not inherit
/// them). Only these three keys are read: the secret stays with the mediator (its file is
/// not even opened here).
///
/// # Errors
/// [`Error::ProfileRead`] / [`Error::ProfileParse`] for a config that cannot be read or
/// parsed; [`Error::Usage`] for a `child_env` without a placeholder or a `secret_env`
/// that is not a string (the mediator refuses both too).
fn credential_env(config: &Path, authority: &str) -> Result<CredentialEnv> {
    let text = std::fs::read_to_string(config).map_err(|source| Error::ProfileRead {
        path: config.to_owned(),
        source,
    })?;
    let value: toml::Table = toml::from_str(&text).map_err(|source| Error::ProfileParse {
        path: config.to_owned(),
        source,
    })?;
    let mut set = Vec::new();
    let mut hidden = Vec::new();
    let tables = value
        .get("authority")
        .and_then(|a| a.as_array())
        .into_iter()
        .flatten();
    for a in tables {
        let name = a.get("name").and_then(|n| n.as_str());
        let credentials = a.get("credential").and_then(|c| c.as_array());
        for c in credentials.into_iter().flatten() {
            match c.get("secret_env") {
                None => {}
                Some(toml::Value::String(var)) => hidden.push(var.clone()),
                Some(_) => {
                    return Err(Error::Usage(format!(
                        "{}: authority {:?}: a credential's secret_env is not a string",
                        config.display(),
                        name.unwrap_or_default()
                    )));
                }
            }
            if name != Some(authority) {
                continue;
            }
            let Some(var) = c.get("child_env").and_then(|v| v.as_str()) else {
                continue;
            };
            let Some(placeholder) = c.get("placeholder").and_then(|v| v.as_str()) else {
                return Err(Error::Usage(format!(
                    "{}: authority {authority:?}: credential child_env {var:?} has no placeholder",
                    config.display()
                )));
            };
            set.push((var.to_owned(), placeholder.to_owned()));
        }
    }
    Ok(CredentialEnv { set, hidden })
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
