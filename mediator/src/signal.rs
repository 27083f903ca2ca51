//! The one shutdown mechanism: cancellation tokens in a tree (tokio-util's
//! `CancellationToken`). Cancelling a token cancels its children; dropping one cancels
//! nothing, so no signal ever fires because its owner went away.
//!
//! ```text
//! draining (listeners stop, keep-alive connections finish their request)
//!   └─ per authority: stop (its socket stops accepting; revocation cancels it alone)
//! closing (shutdown grace over: every live tunnel ends)
//!   └─ per authority: closing (revoke grace over; its live connections end)
//! ```
//!
//! This module is a leaf: it imports nothing from the crate.

use tokio_util::sync::CancellationToken;

/// The mediator-wide signals every connection and listener watches.
#[derive(Debug, Clone, Default)]
pub(crate) struct Signals {
    /// Cancelled when the mediator stops accepting: listeners return, idle keep-alive
    /// connections end after their request in flight, `/readyz` answers 503.
    pub(crate) draining: CancellationToken,
    /// Cancelled when the shutdown grace is over: every live connection ends now (each
    /// still writes its close record).
    pub(crate) closing: CancellationToken,
}

impl Signals {
    /// Fresh, uncancelled signals.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether the mediator is draining (shutting down).
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }
}
