//! How a connection arrives and whom it belongs to (config.md): the per-authority Unix
//! sockets, the shared TCP listener with credentials, SOCKS5 and absolute-form HTTP on
//! both, and that one destination gets opposite verdicts by channel.

mod attribution;
mod forward;
mod labels;
mod socks5;
mod tcp_connect;
mod unix_channel;

use e2e::harness::Case;

/// This area's cases.
pub(crate) fn cases() -> Vec<Case> {
    [
        unix_channel::cases(),
        tcp_connect::cases(),
        attribution::cases(),
        socks5::cases(),
        forward::cases(),
        labels::cases(),
    ]
    .concat()
}
