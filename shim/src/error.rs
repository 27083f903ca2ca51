//! The shim's one error type. Every message names what failed and, where the user can do
//! something about it, what would fix it.

use std::path::PathBuf;

/// Everything that can stop the shim from confining and running a command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The flags or the profile ask for something inconsistent or unsupported.
    #[error("invalid settings: {0}")]
    Usage(String),

    /// A `--profile` file could not be read.
    #[error("cannot read profile {path}: {source}")]
    ProfileRead {
        /// The profile file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },

    /// A `--profile` file is not valid TOML for the profile schema.
    #[error("invalid profile {path}: {source}")]
    ProfileParse {
        /// The profile file.
        path: PathBuf,
        /// The parser's message, with line and column.
        source: toml::de::Error,
    },

    /// The `--config` file is not a configuration the mediator would accept.
    #[error("invalid mediator config {path}: {source}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// Every problem the mediator's parser found, located.
        source: policy::PolicyError,
    },

    /// `--authority` names an authority that `--config` does not list, and that has no
    /// socket either (as one added through the admin API would).
    #[error(
        "authority {authority:?} is not in {config} ({}), and no socket {socket} exists, as one added through the admin API would have",
        names(listed)
    )]
    UnknownAuthority {
        /// The `--authority` value.
        authority: String,
        /// The `--config` file.
        config: PathBuf,
        /// The authorities the config lists, in its order.
        listed: Vec<String>,
        /// The socket the authority would have.
        socket: PathBuf,
    },

    /// Embedded-mode flags whose values the policy rejects (every one of them).
    #[error("{}", lines(.0))]
    Grant(Vec<BadFlag>),

    /// A path given in the settings could not be resolved.
    #[error("{what} {path}: {source}")]
    Path {
        /// Which setting the path came from (e.g. `--allow-write`).
        what: &'static str,
        /// The path as given.
        path: PathBuf,
        /// Why it could not be resolved.
        source: std::io::Error,
    },

    /// The kernel lacks something the sandbox needs; the shim refuses to run weaker.
    #[error("missing kernel feature: {feature} ({detail}); {hint}")]
    MissingFeature {
        /// The feature, e.g. `Landlock` or `unprivileged user namespaces`.
        feature: &'static str,
        /// What the kernel answered.
        detail: String,
        /// What the user can do about it.
        hint: &'static str,
    },

    /// A system call made while building the sandbox failed.
    #[error("{op}: {source}")]
    Sys {
        /// The step that failed, e.g. `mount proc on /proc`.
        op: String,
        /// The errno.
        source: nix::errno::Errno,
    },

    /// An I/O operation made while building the sandbox or relaying failed.
    #[error("{op}: {source}")]
    Io {
        /// The step that failed.
        op: String,
        /// The error.
        source: std::io::Error,
    },

    /// `--capture` was asked for, but the TUN device could not be made.
    #[error(
        "transparent capture (--capture) is not possible here: {0}; run with --no-capture to go without it (clients that ignore HTTP_PROXY then have no network)"
    )]
    Capture(String),

    /// Landlock could not be configured.
    #[error("Landlock: {0}")]
    Landlock(String),

    /// The seccomp filter could not be built or installed.
    #[error("seccomp: {0}")]
    Seccomp(String),

    /// The CA certificate to trust inside (or the system bundle it joins) is unusable.
    #[error("CA certificate {path}: {detail}")]
    Ca {
        /// The file.
        path: PathBuf,
        /// What is wrong with it, and what would fix it.
        detail: String,
    },

    /// A file of the mediator's (a secret, its CA's key, its state, its config) cannot be
    /// kept from the command as the run stands.
    #[error("the mediator's {what}, {path}, {detail}")]
    MediatorPath {
        /// The path as the config names it (or the default location).
        path: PathBuf,
        /// What it is (`m.toml:9:1: authority "a": credential[1]: secret_file`).
        what: String,
        /// Why the run cannot go on, and what would fix it.
        detail: String,
    },

    /// The mediator channel (its Unix socket) is unusable.
    #[error("mediator channel {path}: {detail}")]
    Channel {
        /// The socket path.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
}

impl Error {
    /// Shorthand for [`Error::Sys`].
    pub(crate) fn sys(op: impl Into<String>, source: nix::errno::Errno) -> Self {
        Self::Sys {
            op: op.into(),
            source,
        }
    }

    /// Shorthand for [`Error::Io`].
    pub(crate) fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            op: op.into(),
            source,
        }
    }
}

/// One value of `--allow`, `--deny` or `--allow-private` (or the profile's `allow`, `deny`,
/// `allow_private`) that the policy rejects, shown as `--allow '*.com': why`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} {}: {why}", shell_quote(value))]
pub struct BadFlag {
    /// The flag, e.g. `--allow`.
    pub flag: &'static str,
    /// The value as given.
    pub value: String,
    /// Why the policy rejects it, and what to write instead where it knows.
    pub why: String,
}

/// `'value'`, quoted as a POSIX shell reads it back.
fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

fn names(listed: &[String]) -> String {
    if listed.is_empty() {
        "it lists none".to_owned()
    } else {
        format!("its authorities: {}", listed.join(", "))
    }
}

fn lines(problems: &[BadFlag]) -> String {
    problems
        .iter()
        .map(BadFlag::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The shim's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
