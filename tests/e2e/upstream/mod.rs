//! Routing after the decision (routing.md): static parents (HTTP, HTTPS, SOCKS5, Basic
//! and Negotiate against a real KDC and Squid), PAC, the environment and the desktop
//! settings.

mod negotiate;
mod pac;
mod parent;
mod parent_https;
mod system;

use e2e::harness::Case;

/// This area's cases.
pub(crate) fn cases() -> Vec<Case> {
    [
        parent::cases(),
        parent_https::cases(),
        pac::cases(),
        negotiate::cases(),
        system::cases(),
    ]
    .concat()
}
