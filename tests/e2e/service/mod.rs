//! Running as a service (operating.md): signals, shutdown and drain, the CLI (check,
//! explain, version, completions, diff and test of policy), the shipped configs, and the metrics the shipped
//! dashboard and alerts name.

mod cli;
mod dashboard;
mod lifecycle;
mod review;
mod signals;

use e2e::harness::Case;

/// This area's cases.
pub(crate) fn cases() -> Vec<Case> {
    [
        signals::cases(),
        lifecycle::cases(),
        cli::cases(),
        dashboard::cases(),
        review::cases(),
    ]
    .concat()
}
