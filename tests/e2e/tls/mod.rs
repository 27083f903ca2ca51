//! TLS (tls.md): the SNI rule on tunnels to 443, termination with a leaf for exactly the
//! tunnel host, request rules, credentials the child never sees, WebSockets through
//! termination, and the upstream connections terminated tunnels reuse.

mod credentials;
mod request_rules;
mod reuse;
mod sni;
mod tls_terminate;
mod websocket;

use e2e::harness::Case;

/// This area's cases.
pub(crate) fn cases() -> Vec<Case> {
    [
        sni::cases(),
        tls_terminate::cases(),
        request_rules::cases(),
        credentials::cases(),
        websocket::cases(),
        reuse::cases(),
    ]
    .concat()
}
