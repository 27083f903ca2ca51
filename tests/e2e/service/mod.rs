//! Running as a service (operating.md): signals, shutdown and drain, the CLI (check,
//! explain, version, completions), and the shipped configs.

mod cli;
mod lifecycle;
mod signals;

use e2e::harness::Case;

/// This area's cases.
pub(crate) fn cases() -> Vec<Case> {
    [signals::cases(), lifecycle::cases(), cli::cases()].concat()
}
