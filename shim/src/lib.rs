//! The shim: confine one child process tree on Linux (user, mount, PID, IPC and network
//! namespaces; a filesystem view with read masks, write roots and a mandatory deny set;
//! Landlock; seccomp; no capabilities) and bind it to its authority's mediator channel
//! through a loopback listener inside the sandbox, relayed by the shim outside it, and
//! (transparent capture) a TUN device served by a user-space TCP/IP stack in the shim.
//!
//! Design sections 12 and 15 are the contract. The OS-specific part is a backend behind the
//! `sandbox` boundary; `linux` is the only one, and this root is the only place that names
//! it. The rest (`cli` flags and profile, `env`, `ca` files, `caches`, `launch`, `relay`, `embedded`
//! mediator, `report`) is portable, so that other backends (macOS Seatbelt, Windows) can
//! be added beside it (design section 17).
//!
//! The library exists for the `shim` binary: its public surface is what `main` needs.

mod asking;
mod ca;
mod caches;
mod capture;
mod cli;
mod control;
mod embedded;
mod env;
mod error;
mod feed;
mod handover;
mod invocation;
mod jks;
mod launch;
#[cfg(target_os = "linux")]
mod linux;
mod rejected;
mod relay;
mod report;
mod sandbox;
mod secrets;
#[cfg(test)]
mod testing;
mod violations;

pub use cli::{Cli, Settings};
pub use error::{BadFlag, Error, Result};
pub use sandbox::EXIT_SHIM_FAILURE;

/// Run `settings.command` confined; returns the exit status to leave with: the command's
/// own, 128+N when signal N killed it, [`EXIT_SHIM_FAILURE`] (125) when the sandbox failed
/// after it was built, 126 when the command cannot be executed, 127 when it is not found.
///
/// # Errors
/// Any [`Error`] that stops the sandbox from being built exactly as asked (nothing has run
/// then), or a `--report` that cannot be written.
#[cfg(target_os = "linux")]
pub fn run(settings: &Settings) -> Result<i32> {
    launch::run(&linux::Linux, settings)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every file the README points at exists: link targets (relative to `shim/`) and
    /// backticked repository paths (`shim/...`, `bench/...`, relative to the workspace).
    #[test]
    fn readme_paths_exist() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = here.parent().unwrap();
        let readme = std::fs::read_to_string(here.join("README.md")).unwrap();
        let mut checked = 0;
        for (i, _) in readme.match_indices("](") {
            let target = &readme[i + 2..];
            let target = &target[..target.find(')').unwrap()];
            if !target.contains("://") && !target.starts_with('#') {
                assert!(here.join(target).exists(), "README links to {target}");
                checked += 1;
            }
        }
        for token in readme.split('`').skip(1).step_by(2) {
            let repo_path = ["shim/", "bench/", "examples/", "docs/", "docker/"]
                .iter()
                .any(|d| token.starts_with(d));
            if repo_path && !token.contains(char::is_whitespace) {
                assert!(root.join(token).exists(), "README names {token}");
                checked += 1;
            }
        }
        assert!(checked >= 3, "{checked} paths checked");
    }
}
