//! The policy core of the egress mediator: canonical hosts, host patterns, IP address
//! classification, grants and decisions, and the configuration schema.
//!
//! This crate is pure: it performs no I/O, spawns nothing and has no async code, so that
//! every verdict can be tested (and fuzzed) as a function of its inputs. It must never
//! resolve a name: callers hand it the addresses they resolved, and it tells them which
//! of those may be connected to (the *pin*).
#![forbid(unsafe_code)]

pub mod classify;
pub mod config;
pub mod decision;
pub mod error;
pub mod grant;
pub mod host;
pub mod pattern;
pub mod sni;
pub mod upstream;

pub use classify::{AddrClass, classify};
pub use decision::{Decision, Reason, Verdict};
pub use error::PolicyError;
pub use grant::{Grant, GrantSpec, OwnAddrs, Pin, RequestRule, RequestRuleSpec};
pub use host::{CanonicalHost, Target, canonicalize_host, parse_authority_form};
pub use pattern::{HostPattern, PatternUse};
pub use sni::{SniMismatch, check_sni};
