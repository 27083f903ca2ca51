//! Property tests of the policy crate's public API (proptest): grant decisions against an
//! oracle of design section 4, address classification against the IANA special-purpose
//! registries (written down here, independently of the classifier's own table), and the
//! agreement of an IPv4 address with its IPv6 embeddings. A failing case is shrunk and
//! kept in `policy/tests/proptest-regressions/` (commit it: it runs first next time).

// Test code: a setup failure must fail the test.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod classify;
mod decide;
mod embedding;
mod iana;
