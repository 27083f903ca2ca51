//! Live control (control.md): the admin API, metrics, reloads that add and revoke
//! authorities, the audit records of every change, connections judged again under a new
//! grant, and the registry of the authorities created through the admin API (local; etcd
//! with the feature `etcd`, and its placement by node).

mod admin;
mod audit;
#[cfg(feature = "etcd")]
mod placement;
mod registry;
mod rejudge;
mod reload;
#[cfg(feature = "etcd")]
mod shared_registry;

use e2e::harness::Case;

/// This area's cases.
pub(crate) fn cases() -> Vec<Case> {
    [
        admin::cases(),
        audit::cases(),
        reload::cases(),
        rejudge::cases(),
        registry::cases(),
        #[cfg(feature = "etcd")]
        shared_registry::cases(),
        #[cfg(feature = "etcd")]
        placement::cases(),
    ]
    .concat()
}
