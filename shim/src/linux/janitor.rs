//! The janitor: a process outside the sandbox, forked before it, that undoes the run's
//! host-side leftovers (placeholders, the CA files, what appeared at watched paths) when
//! the shim dies without doing it itself (SIGKILL).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::signal::SigSet;

use super::init::FORWARDED;
use super::{Placeholder, fs, sys};
use crate::ca::TrustFiles;
use crate::error::{Error, Result};

/// A process outside the sandbox that removes the placeholders and the CA files if the
/// shim dies without doing it (SIGKILL). It waits for EOF on a pipe whose only writer is
/// the shim.
pub(super) fn spawn_janitor(
    placeholders: &[Placeholder],
    watch: &[fs::Watch],
    trust: Option<&TrustFiles>,
) -> Result<OwnedFd> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::sys("janitor pipe", e))?;
    match sys::fork_process().map_err(|e| Error::sys("fork the janitor", e))? {
        Some(_) => {
            drop(r);
            Ok(w)
        }
        None => {
            drop(w);
            let _ = nix::unistd::setsid();
            for s in FORWARDED {
                sys::ignore_signal(*s);
            }
            let _ = SigSet::all().thread_unblock();
            let _ = sys::close_fds_except(&[r.as_raw_fd()]);
            // Hold none of the caller's stdio: a reader waiting for EOF on the shim's
            // output must not wait for the janitor.
            if let Ok(null) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
            {
                for fd in 0..3 {
                    let _ = sys::dup_onto(null.as_fd(), fd);
                }
            }
            let mut b = [0u8; 1];
            loop {
                match nix::unistd::read(&r, &mut b) {
                    Err(Errno::EINTR) => {}
                    Ok(0) => break, // the shim died: clean up for it
                    Ok(_) | Err(_) => sys::exit_now(0), // the shim cleaned up itself
                }
            }
            // The shim is gone (or done); the sandbox dies with it (PR_SET_PDEATHSIG), and
            // removing a path that is a mount point in another namespace only detaches it.
            let _ = fs::quarantine(watch);
            for p in placeholders.iter().rev() {
                p.remove();
            }
            if let Some(t) = trust {
                t.remove();
            }
            sys::exit_now(0)
        }
    }
}
