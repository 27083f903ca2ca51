//! The shim: confine one child process tree on Linux (user, mount, PID, IPC and network
//! namespaces; a filesystem view with read masks, write roots and a mandatory deny set;
//! Landlock; seccomp; no capabilities) and bind it to its authority's mediator channel
//! through a loopback listener inside the sandbox, relayed by the shim outside it.
//!
//! Design section 12 is the contract. The OS-specific part lives in [`linux`]; the rest
//! (flags, profile, environment, CA files, relay, report) is portable so that other backends
//! (macOS Seatbelt, Windows) can be added beside it.

pub mod ca;
pub mod cli;
pub mod embedded;
pub mod env;
pub mod error;
#[cfg(target_os = "linux")]
pub mod linux;
pub mod relay;
pub mod report;

pub use error::{Error, Result};

/// Run `settings.command` confined; returns the exit status to leave with.
///
/// # Errors
/// See [`linux::run`].
#[cfg(target_os = "linux")]
pub fn run(settings: &cli::Settings) -> Result<i32> {
    linux::run(settings)
}
