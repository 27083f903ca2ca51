//! The decision log (design section 10): one JSON line per decision and one per closed
//! connection, on stdout or appended to a file. Two jobs, two files: `record.rs` is the
//! format (the typed [`Record`] and what it holds), `writer.rs` the one writer thread
//! (queue, stamp, render, reopen, the failure that stops the service).

mod record;
mod writer;

pub use record::{CredentialUse, Peer, Record, now_rfc3339};
pub use writer::{DecisionLog, Reopened, Sink, Tap, check_can_open, open_append};
pub(crate) use writer::{Render, Ship, host_name};

#[cfg(test)]
mod tests;
