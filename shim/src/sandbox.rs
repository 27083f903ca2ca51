//! The boundary between the portable shim and an OS backend: what the portable part
//! ([`crate::launch`]) asks of a backend, and nothing about how a backend does it. Linux
//! (`crate::linux`) is the only backend built (design section 17); a macOS (Seatbelt) or
//! Windows backend would implement [`Backend`] beside it.
//!
//! A backend must never run the command with less than the [`Job`] asks: a protection it
//! cannot provide is an error ([`crate::Error::MissingFeature`]) unless the job names it
//! in `allow_degraded`. It must never expose the channel itself (a socket path, a helper
//! process) inside the sandbox: the command reaches its authority only through the
//! listener the backend hands to `serve`.

use std::ffi::OsString;
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::ca::TrustFiles;
use crate::capture::Addresses;
use crate::cli::Degradation;
use crate::error::Result;
pub(crate) use crate::rejected::ProgramOf;
use crate::report::{RunsAs, Tampering};
use crate::violations::Violations;

/// Exit status of the shim when it fails itself (as `docker run` and `env` do).
pub const EXIT_SHIM_FAILURE: i32 = 125;
/// Exit status when the command exists but cannot be executed.
pub(crate) const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit status when the command is not found.
pub(crate) const EXIT_NOT_FOUND: i32 = 127;

/// What to confine and run, with every path still as the user gave it (a backend
/// resolves them in its own way and fails on one it cannot resolve).
#[derive(Debug)]
pub(crate) struct Job<'a> {
    /// The program and its arguments (the program is looked up in `PATH`).
    pub(crate) command: &'a [OsString],
    /// Writable roots; everything else is read-only.
    pub(crate) allow_write: &'a [PathBuf],
    /// Paths the command may not read: the user's, and the channel's socket directory.
    pub(crate) deny_read: &'a [PathBuf],
    /// Paths beneath a `deny_read` path that are readable again (read-only).
    pub(crate) allow_read: &'a [PathBuf],
    /// Whether the command may create AF_UNIX sockets.
    pub(crate) allow_unix_sockets: bool,
    /// Protections the user gave up explicitly, for a kernel that lacks them.
    pub(crate) allow_degraded: &'a [Degradation],
    /// The CA files the command must trust: shown read-only inside, whatever the paths
    /// above say, and named by the CA variables. The backend removes them at exit with its
    /// own leftovers, and makes sure they are removed if the shim is killed.
    pub(crate) trust: Option<&'a TrustFiles>,
    /// Transparent capture (design section 15): `None` with `--no-capture`.
    pub(crate) capture: Option<CaptureJob>,
    /// Variables set in the command's environment over inherited ones of the same name:
    /// the placeholders of its authority's credentials (design section 14).
    pub(crate) child_env: &'a [(String, String)],
    /// Variables the command never inherits: every `secret_env` of the config's
    /// credentials (design section 14). A name also in `child_env` is set all the same.
    pub(crate) hidden_env: &'a [String],
    /// `--violations` or `--report`: observe the command's refused filesystem operations
    /// (design section 18) and hand them here. Observation only: a backend that cannot
    /// observe a kind says so ([`Violations::unobservable`]) and runs all the same.
    pub(crate) violations: Option<Arc<Violations>>,
    /// `--pass-fd` and `--listen-fd` (design section 18), checked: the only descriptors
    /// beyond the standard streams the command gets.
    pub(crate) handover: &'a crate::handover::Handover,
    /// The private temporary directory's bound (`None`: `--no-tmp`): a writable tmpfs at
    /// `/tmp` and `/var/tmp` that dies with the sandbox, unless a writable root or mask
    /// covers them; `TMPDIR` and the caches' variables point there ([`crate::caches`]).
    pub(crate) tmp: Option<&'a crate::cli::TmpSize>,
    /// `--cache DIR`, made and canonical: the caches' variables point there instead (it
    /// is also in `allow_write`).
    pub(crate) cache: Option<&'a Path>,
}

/// What capture asks of a backend: a TUN device as the sandbox's default route, its own
/// addresses from `addrs`, its descriptor handed to `serve` and `/etc/resolv.conf` naming
/// the stub resolver. Nothing else of the sandbox changes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CaptureJob {
    /// This run's addresses.
    pub(crate) addrs: Addresses,
    /// `--capture` was given: a TUN device that cannot be made stops the run.
    pub(crate) required: bool,
}

/// Whether the sandbox got its TUN device.
#[derive(Debug)]
pub(crate) enum CaptureState {
    /// Not asked for (`--no-capture`).
    Off,
    /// The TUN device, to serve.
    Up(OwnedFd),
    /// Asked for by default, but the kernel refused: why (the run goes on without it).
    Unavailable(String),
}

/// What a backend hands to `serve` once the sandbox exists.
#[derive(Debug)]
pub(crate) struct Handoff {
    /// The sandbox's loopback proxy listener.
    pub(crate) listener: TcpListener,
    /// The TUN device, if capture is up.
    pub(crate) capture: CaptureState,
}

impl Job<'_> {
    /// Whether the user gave up `what` explicitly.
    pub(crate) fn degraded(&self, what: Degradation) -> bool {
        self.allow_degraded.contains(&what)
    }
}

/// How a run ended.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The status to leave with: the command's own, 128+N when signal N killed it, or
    /// [`EXIT_SHIM_FAILURE`], [`EXIT_CANNOT_EXECUTE`], [`EXIT_NOT_FOUND`] when the sandbox
    /// failed after it was built (the backend has printed why).
    pub(crate) exit_status: i32,
    /// What the command left that would have run code on the host, moved aside.
    pub(crate) tampering: Vec<Tampering>,
    /// The host uid and gid the command ran as.
    pub(crate) runs_as: RunsAs,
}

/// An OS backend: confinement of one command tree.
pub(crate) trait Backend {
    /// Confine and run `job.command`. Once the sandbox's loopback proxy listener (and its
    /// TUN device, with capture) exists, hand them to `serve` (at most once, before
    /// waiting for the command); if `serve`
    /// fails, stop the sandbox and return that error. Return when the whole command tree
    /// is gone and every host-side leftover of the run (including `job.trust`) is removed.
    ///
    /// # Errors
    /// Any error that stops the sandbox from being built exactly as `job` asks, or the
    /// error of `serve`.
    fn run(&self, job: &Job<'_>, serve: impl FnOnce(Handoff) -> Result<()>) -> Result<Outcome>;

    /// What descriptor `fd` of this process is: `None` when it is not open, else whether
    /// it is a listening socket (for `--pass-fd` and `--listen-fd`).
    fn probe_fd(&self, fd: std::os::fd::RawFd) -> Option<bool>;

    /// The host uid the command will run as, given the protections the user gave up: the
    /// caller's own, or an unprivileged one (design section 12: the command never runs
    /// as the uid that owns the mediator's files).
    fn command_uid(&self, allow_degraded: &[Degradation]) -> u32;

    /// How to name the program behind one of the sandbox's connections (for the line
    /// that tells a client it does not trust the mediator's CA); `None`: it cannot.
    fn program_of(&self) -> Option<ProgramOf> {
        None
    }
}
