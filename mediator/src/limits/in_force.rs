//! The limits in force: each 0 of the configuration derived from the open-files limit
//! ([`InForce::derive`]), which a start first raises to its hard limit.

use std::fmt;

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use policy::config::Limits;

use super::ADMIN_CONNECTIONS;

/// Descriptors kept out of every connection budget: the decision log, listeners, the
/// resolver's sockets, PAC fetches, the watchdog, metrics.
const RESERVED_FDS: u64 = 128;

/// The limits in force, every 0 of the configuration replaced by its derived value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InForce {
    /// The soft open-files limit the counts were derived from.
    pub(crate) nofile: u64,
    /// Open client connections in all.
    pub(crate) max_connections: u32,
    /// The default cap per authority.
    pub(crate) authority_connections: u32,
    /// TCP connections not identified yet.
    pub(crate) unidentified_connections: u32,
    /// Descriptor pairs spliced tunnels may hold in pipes.
    pub(crate) pipes: u32,
    /// Which of the three counts were derived (not configured).
    derived: [bool; 3],
}

impl InForce {
    /// The limits of `limits` for a process allowed `nofile` open files that holds
    /// `listeners` listening sockets:
    ///
    /// - `max_connections = (nofile - 128 - 64 - listeners - idle_upstream_connections) / 4`
    ///   (at least 16): a tunnel costs two descriptors, and as many again may go to splice
    ///   pipes; the idle upstream connections kept for reuse (`crate::reuse`) one each;
    /// - `authority_connections = max_connections / 4` (at least 4): one authority can
    ///   hold at most a quarter;
    /// - `unidentified_connections = max_connections / 4` (at least 8): so can an
    ///   unauthenticated flood, which leaves half for everyone else;
    /// - pipes: as many descriptor pairs as `max_connections`.
    pub(crate) fn derive(limits: &Limits, nofile: u64, listeners: usize) -> Self {
        let reserve = RESERVED_FDS
            + ADMIN_CONNECTIONS as u64
            + listeners as u64
            + u64::from(limits.idle_upstream_connections);
        let budget = nofile.saturating_sub(reserve) / 4;
        let derived_max = u32::try_from(budget).unwrap_or(u32::MAX).max(16);
        let pick = |configured: u32, derived: u32| {
            if configured == 0 {
                (derived, true)
            } else {
                (configured, false)
            }
        };
        let (max_connections, d0) = pick(limits.max_connections, derived_max);
        // A derived share never exceeds the overall cap (a tiny max_connections).
        let (authority_connections, d1) = pick(
            limits.authority_connections,
            (max_connections / 4).max(4).min(max_connections),
        );
        let (unidentified_connections, d2) = pick(
            limits.unidentified_connections,
            (max_connections / 4).max(8).min(max_connections),
        );
        Self {
            nofile,
            max_connections,
            authority_connections,
            unidentified_connections,
            pipes: derived_max,
            derived: [d0, d1, d2],
        }
    }

    /// The TCP listener stops accepting at this many open client connections.
    pub(super) fn tcp_mark(&self) -> usize {
        let max = self.max_connections as usize;
        max - max / 8
    }

    /// Whether the descriptors cannot carry `max_connections` tunnels (a configured
    /// value too large for the open-files limit).
    pub(crate) fn overcommitted(&self) -> bool {
        u64::from(self.max_connections) * 2 + RESERVED_FDS > self.nofile
    }

    /// The counts as `key=value` fields, no spaces inside a field (for the `ready` line).
    pub(crate) fn fields(&self) -> String {
        format!(
            "max_connections={} authority_connections={} unidentified_connections={} open_files={}",
            self.max_connections,
            self.authority_connections,
            self.unidentified_connections,
            self.nofile
        )
    }
}

/// The counts with the derived ones marked (`mediator check`).
impl fmt::Display for InForce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = |d: bool| if d { " (derived)" } else { "" };
        write!(
            f,
            "max_connections = {}{}, authority_connections = {}{}, unidentified_connections = {}{} (open files: {})",
            self.max_connections,
            mark(self.derived[0]),
            self.authority_connections,
            mark(self.derived[1]),
            self.unidentified_connections,
            mark(self.derived[2]),
            self.nofile,
        )
    }
}

/// The open-files limit a start would run with: the hard limit, which the soft one is
/// raised to (for `mediator check`, which changes nothing).
pub(crate) fn nofile_hard() -> u64 {
    getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(_, hard)| hard)
}

/// Raises the soft open-files limit (`RLIMIT_NOFILE`) to the hard limit; returns the soft
/// limit in force afterwards (unchanged if the raise is refused).
pub(crate) fn raise_nofile() -> u64 {
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!("cannot raise the open-files limit from {soft} to {hard}: {e}");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(e) => {
            tracing::warn!("cannot read the open-files limit: {e}; assuming 1024");
            1024
        }
    }
}
