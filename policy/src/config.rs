//! The configuration schema (design section 11): `mediator.toml` parsed with serde
//! (`deny_unknown_fields`) into raw structs, then validated into [`Config`], whose grants
//! are frozen [`Grant`]s. Validation reports *every* problem, each with its location
//! (`FILE:LINE:COL` where the TOML parser knows it, else a key path such as
//! `authority[1] "agent-b" allow[2]`).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::error::PolicyError;
use crate::grant::Grant;

/// A validated configuration.
#[derive(Debug)]
pub struct Config {
    /// `[listen]`.
    pub listen: Listen,
    /// `[resolver]`.
    pub resolver: Resolver,
    /// `[upstream]`; only `mode = "direct"` is accepted by this build.
    pub upstream: Upstream,
    /// `[timeouts]`.
    pub timeouts: Timeouts,
    /// `[limits]`.
    pub limits: Limits,
    /// `[log]`.
    pub log: Log,
    /// `[tls]` (accepted, used by TLS termination).
    pub tls: Tls,
    /// `[[authority]]`, in file order, names unique.
    pub authorities: Vec<Authority>,
}

/// `[listen]`.
#[derive(Debug, Clone)]
pub struct Listen {
    /// Directory of the per-authority Unix sockets (`<socket_dir>/<name>.sock`).
    pub socket_dir: Option<PathBuf>,
    /// Optional shared TCP listener (credentials required).
    pub tcp: Option<SocketAddr>,
    /// Optional admin listener (loopback only).
    pub admin: Option<SocketAddr>,
}

/// `[resolver]`.
#[derive(Debug, Clone, Default)]
pub struct Resolver {
    /// Explicit nameservers (`ip:port`); empty means the system configuration.
    pub nameservers: Vec<SocketAddr>,
    /// Static answers, consulted before DNS: canonical name -> addresses.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
}

/// `[upstream]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// Only `"direct"` in this build.
    pub mode: String,
    /// Whether CONNECTs to a parent name the pinned IP.
    pub pin_through_parent: bool,
}

/// `[timeouts]`, all given in seconds in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Reading a request head (default 10 s).
    pub request_head: Duration,
    /// One resolution (default 5 s).
    pub dns: Duration,
    /// One upstream connect (default 10 s).
    pub connect: Duration,
    /// A tunnel with no bytes either way is closed after this (default 300 s).
    pub idle_tunnel: Duration,
    /// On SIGTERM/SIGINT, live tunnels get this long to drain (default 10 s).
    pub shutdown_grace: Duration,
    /// On revocation, live tunnels get this long (default 5 s).
    pub revoke_grace: Duration,
    /// Watchdog answer deadline (default 2 s).
    pub watchdog: Duration,
}

/// `[limits]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request head accepted, in bytes (default 65536); larger gets 431.
    pub request_head_bytes: usize,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Log {
    /// Decision log lines go to stdout.
    Stdout,
    /// Decision log lines are appended to this file.
    File(PathBuf),
}

/// `[tls]`.
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// Where the CA lives (created on first start if absent).
    pub ca_dir: Option<PathBuf>,
    /// Extra PEM bundles trusted upstream.
    pub extra_ca_files: Vec<PathBuf>,
}

/// One `[[authority]]`.
#[derive(Debug)]
pub struct Authority {
    /// The frozen grant (its name is the authority's name).
    pub grant: Grant,
    /// SHA-256 of the token, 32 bytes, when the authority may use the TCP listener.
    pub token_sha256: Option<[u8; 32]>,
    /// Mode of the Unix socket file (default 0o600).
    pub socket_mode: u32,
    /// Owner uid of the socket file (default: the mediator's).
    pub socket_uid: Option<u32>,
    /// Group gid of the socket file (default: the mediator's).
    pub socket_gid: Option<u32>,
    /// Watchdog endpoint, empty when none.
    pub watchdog: String,
}

/// Parses and validates `text`, the contents of the file `origin` (used in messages).
///
/// # Errors
/// [`PolicyError::Config`] with every problem found, each prefixed with its location.
pub fn parse(text: &str, origin: &str) -> Result<Config, PolicyError> {
    todo!("{text} {origin}")
}
