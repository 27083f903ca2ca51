//! The shim: confine one child process tree on Linux (user, mount, PID, IPC and network
//! namespaces; a filesystem view with read masks, write roots and a mandatory deny set;
//! Landlock; seccomp; no capabilities) and bind it to its authority's mediator channel
//! through a loopback listener inside the sandbox, relayed by the shim outside it.
//!
//! Design section 12 is the contract. The OS-specific part lives in `linux`; the rest
//! (flags, profile, environment, CA files, relay, report) is portable so that other backends
//! (macOS Seatbelt, Windows) can be added beside it. The library exists for the `shim`
//! binary: its public surface is what `main` needs, nothing more.

mod ca;
mod cli;
mod embedded;
mod env;
mod error;
#[cfg(target_os = "linux")]
mod linux;
mod relay;
mod report;

pub use cli::{Cli, Settings};
pub use error::{Error, Result};
#[cfg(target_os = "linux")]
pub use linux::EXIT_SHIM_FAILURE;

/// Run `settings.command` confined; returns the exit status to leave with: the command's
/// own, 128+N when signal N killed it, [`EXIT_SHIM_FAILURE`] (125) when the sandbox failed
/// after it was built, 126 when the command cannot be executed, 127 when it is not found.
///
/// # Errors
/// Any [`Error`] that stops the sandbox from being built exactly as asked; nothing has run
/// then.
#[cfg(target_os = "linux")]
pub fn run(settings: &Settings) -> Result<i32> {
    linux::run(settings)
}
