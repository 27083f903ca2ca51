//! The grant decision and its companions (config.md): every denial reason on the wire and
//! in the log, resolution once and connection to the vetted pin only, and the limits that
//! keep one authority from starving another.

mod dns_pinning;
mod grant_denials;
mod limits;
pub(crate) mod ocsf;
mod operator_reasons;
mod otlp;

use e2e::harness::Case;

/// This area's cases.
pub(crate) fn cases() -> Vec<Case> {
    [
        grant_denials::cases(),
        dns_pinning::cases(),
        limits::cases(),
        operator_reasons::cases(),
        ocsf::cases(),
        otlp::cases(),
    ]
    .concat()
}
