//! The policy crate's one error type. Its messages are read by people (operators at
//! load, agents in a denial's detail), so each names the input and what would fix it; they
//! never carry a secret the input did not already show.

use thiserror::Error;

/// Everything that can go wrong in the policy crate. Each message names the offending
/// input and, where it helps, what would fix it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    /// A host (destination or pattern) could not be canonicalised.
    #[error("invalid host {input:?}: {why}")]
    Host {
        /// The input as given (control characters escaped by `{:?}`).
        input: String,
        /// What is wrong with it.
        why: String,
    },
    /// A grant entry (allow, deny, allow_private, tls_terminate) is not acceptable.
    #[error("invalid {field} entry {entry:?}: {why}")]
    Pattern {
        /// The field: `allow`, `deny`, `allow_private`, `tls_terminate`.
        field: &'static str,
        /// The entry as written.
        entry: String,
        /// What is wrong with it and, where possible, what to write instead.
        why: String,
    },
    /// The configuration is invalid; every problem is listed with its location.
    #[error("{}", .0.join("\n"))]
    Config(Vec<String>),
}
