//! The egress mediator: a proxy (HTTP CONNECT, absolute-form HTTP, SOCKS5) that learns
//! which *authority* a connection belongs to from its channel, decides with that
//! authority's immutable grant, refuses destinations that resolve to non-public
//! addresses, connects only to the vetted addresses (the pin), and writes one JSON line
//! per decision and per closed connection.
//!
//! Where to read (ARCHITECTURE.md has the whole map):
//! - `conn`: the life of one connection, in order: accept -> identify -> establish
//!   (decide, resolve, vet, watchdog, route, connect, decision line) -> tunnel -> close;
//! - `front`: the protocol front-ends (HTTP CONNECT and forwarding, SOCKS5);
//! - `denial` and `vocab`: the typed vocabulary of decisions and records;
//! - `server`: [`start`] and the [`Running`] handle (used by the binary, the demo and the
//!   shim's embedded mode).

mod admin;
pub mod ask;
pub mod audit;
mod authorities;
pub mod config;
mod conn;
mod control;
mod counting;
mod credential;
pub mod decision_log;
pub mod demo;
pub mod denial;
pub mod error;
pub mod explain;
mod export;
mod front;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod journal;
pub mod labels;
mod limits;
mod members;
mod metrics;
mod redact;
mod relay;
mod request;
pub mod resolve;
mod reuse;
pub mod review;
mod rewind;
pub mod route;
mod server;
pub mod service;
mod serving;
mod shared;
mod signal;
mod sni;
mod socket_file;
pub mod suggest;
mod tap;
mod terminate;
#[cfg(any(test, feature = "fuzzing"))]
mod testing;
pub mod tls;
pub mod version;
pub mod vocab;
mod watchdog;
mod writable;

pub use control::asks::Refused as AnswerRefused;
pub use control::body::{BodyError as StrictJsonError, parse as parse_strict_json};
pub use control::registry::inspect::{Listed, Listing};
pub use control::{ReloadRefused, ReloadReport};
pub use decision_log::{DecisionLog, Record, Reopened, Sink, Tap};
pub use denial::{Cause, Denial};
pub use error::{Error, ErrorCause};
pub use server::{Options, Running, check_resources, limits_of, registry_listing, start};
pub use vocab::{CloseReason, Protocol};
