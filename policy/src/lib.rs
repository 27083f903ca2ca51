//! The policy core of the egress mediator: canonical hosts, host patterns, IP address
//! classification, grants and decisions, and the configuration schema.
//!
//! This crate is pure: it performs no I/O, spawns nothing and has no async code, so that
//! every verdict can be tested (and fuzzed) as a function of its inputs. It must never
//! resolve a name: callers hand it the addresses they resolved, and it tells them which
//! of those may be connected to (the *pin*).
//!
//! Entry points: [`canonicalize_host`] and [`parse_authority_form`] turn untrusted text
//! into a [`CanonicalHost`] or a [`Target`]; [`Grant::decide`] and [`Grant::vet`] give the
//! [`Decision`] and the [`Pin`]; [`classify`](fn@classify) names an address's IANA special-purpose
//! block; [`config::parse`] validates `mediator.toml`; [`upstream`] holds the parent proxy
//! and PAC values of `[upstream]`; [`review`] tells what a change of a grant widens.
#![forbid(unsafe_code)]

mod classify;
pub mod config;
pub mod decision;
mod error;
mod grant;
mod host;
mod pattern;
mod request;
pub mod review;
mod sni;
pub mod upstream;

pub use classify::{AddrClass, classify};
pub use decision::{Decision, MAX_OPERATOR_REASON, Reason, Verdict, check_operator_reason};
pub use error::{HostError, PatternError, PolicyError, RuleError, UpstreamError, ValueError};
pub use grant::{
    Advice, DenyEntry, EntryKind, Grant, GrantSpec, OwnAddrs, Pin, RequestRuleSpec,
    check_authority_name, check_entry,
};
pub use host::{CanonicalHost, Target, canonicalize_host, parse_authority_form};
pub use request::{HeaderLookup, RequestFacts, UpgradeToken};
pub use sni::{SniMismatch, check_sni};
