//! Descriptors the caller hands to the command (design section 18): `--pass-fd N`, one
//! connection the host selected (an accepted TCP connection, a socketpair end), under the
//! same number; `--listen-fd N`, a listening socket, placed from descriptor 3 on with the
//! `LISTEN_FDS`/`LISTEN_PID` convention of `sd_listen_fds(3)`. Every other inherited
//! descriptor is closed in the sandbox, and the sandbox's own network namespace has no
//! other way in: a passed connection is the one inbound path, a listening socket the
//! wider capability of accepting any number of them.
//!
//! Checked before anything starts: each number is open, at least 3 (0 to 2 are the
//! command's standard streams anyway), given once; a `--pass-fd` is not a listening
//! socket (that would hand the wider capability silently) and a `--listen-fd` is one; no
//! `--pass-fd` sits where the listening sockets go.

use std::os::fd::RawFd;

use crate::error::{Error, Result};

/// The first descriptor of the `LISTEN_FDS` convention (`SD_LISTEN_FDS_START`).
pub(crate) const LISTEN_FDS_START: RawFd = 3;

/// The environment variables of the convention: the shim sets them when it hands
/// listening sockets, and never lets the caller's through otherwise.
pub(crate) const LISTEN_VARS: [&str; 3] = ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"];

/// The checked descriptors to hand over, as the caller numbers them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Handover {
    /// `--pass-fd`: kept under their own numbers.
    pub(crate) pass: Vec<RawFd>,
    /// `--listen-fd`: placed at 3, 4, ... in the order given.
    pub(crate) listen: Vec<RawFd>,
}

impl Handover {
    /// Checks the caller's descriptors (see the module documentation); `probe` tells
    /// what a descriptor of this process is: `None` when it is not open, else whether it
    /// is a listening socket (the backend's [`crate::sandbox::Backend::probe_fd`]).
    ///
    /// # Errors
    /// [`Error::Usage`] naming the flag and the descriptor.
    pub(crate) fn check(
        pass: &[RawFd],
        listen: &[RawFd],
        probe: impl Fn(RawFd) -> Option<bool>,
    ) -> Result<Self> {
        let mut seen = Vec::new();
        for (flag, fd, wants_listener) in pass
            .iter()
            .map(|fd| ("--pass-fd", *fd, false))
            .chain(listen.iter().map(|fd| ("--listen-fd", *fd, true)))
        {
            if fd < 3 {
                return Err(Error::Usage(format!(
                    "{flag} {fd}: descriptors 0, 1 and 2 are the command's standard streams already; hand over 3 or above"
                )));
            }
            if seen.contains(&fd) {
                return Err(Error::Usage(format!("{flag} {fd}: given twice")));
            }
            seen.push(fd);
            let Some(listening) = probe(fd) else {
                return Err(Error::Usage(format!(
                    "{flag} {fd}: descriptor {fd} is not open in the shim (the caller must leave it open across exec, without close-on-exec)"
                )));
            };
            match (wants_listener, listening) {
                (false, true) => {
                    return Err(Error::Usage(format!(
                        "--pass-fd {fd} is a listening socket, which accepts any number of connections: hand it with --listen-fd {fd} if that is meant"
                    )));
                }
                (true, false) => {
                    return Err(Error::Usage(format!(
                        "--listen-fd {fd} is not a listening socket (for one connection use --pass-fd {fd})"
                    )));
                }
                _ => {}
            }
        }
        // At most a few thousand descriptors (the open-files limit): fits.
        let count = RawFd::try_from(listen.len()).unwrap_or(RawFd::MAX - LISTEN_FDS_START);
        let places = LISTEN_FDS_START..LISTEN_FDS_START + count;
        if let Some(fd) = pass.iter().find(|fd| places.contains(fd)) {
            return Err(Error::Usage(format!(
                "--pass-fd {fd} collides with the listening sockets, which go to descriptors {}..={} (LISTEN_FDS); pass it under another number",
                places.start,
                places.end - 1
            )));
        }
        Ok(Self {
            pass: pass.to_vec(),
            listen: listen.to_vec(),
        })
    }

    /// Every descriptor the sandbox keeps open for the command.
    pub(crate) fn kept(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.pass.iter().chain(&self.listen).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3 and 4 are connections, 7 listens; nothing else is open.
    fn probe(fd: RawFd) -> Option<bool> {
        match fd {
            3 | 4 => Some(false),
            7 => Some(true),
            _ => None,
        }
    }

    fn error(pass: &[RawFd], listen: &[RawFd]) -> String {
        Handover::check(pass, listen, probe)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn each_kind_is_checked() {
        assert!(
            error(&[7], &[]).contains("use --listen-fd")
                || error(&[7], &[]).contains("--listen-fd 7")
        );
        assert!(error(&[], &[4]).contains("not a listening socket"));
        assert!(error(&[2], &[]).contains("standard streams"));
        assert!(error(&[4, 4], &[]).contains("given twice"));
        assert!(error(&[9], &[]).contains("not open"));
        assert!(error(&[3], &[7]).contains("collides"));
        let ok = Handover::check(&[4], &[7], probe).unwrap();
        assert_eq!(ok.kept().collect::<Vec<_>>(), [4, 7]);
    }
}
