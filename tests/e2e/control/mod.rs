//! Live control (control.md): the admin API, metrics, reloads that add and revoke
//! authorities, and connections judged again under a new grant.

mod admin;
mod rejudge;
mod reload;

use e2e::harness::Case;

/// This area's cases.
pub(crate) fn cases() -> Vec<Case> {
    [admin::cases(), reload::cases(), rejudge::cases()].concat()
}
