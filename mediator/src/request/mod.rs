//! One HTTP request, judged and sent: what absolute-form forwarding
//! (`crate::front::http::forward`) and a terminated tunnel's requests (`crate::terminate`)
//! share, below both. Each path keeps only what is its own (forwarding: the scheme and
//! `Host` checks, the kept upstream connection; a tunnel: the tunnel host, protocol
//! switches, the origin's HTTP version) and calls the same steps, in order:
//!
//! 0. [`preflight`]: a connection's first request head (the proxy's own, or the first
//!    inside a terminated tunnel), read and judged before hyper sees it;
//! 1. [`judge`]: the judgement of one request, without a connection: its authority still
//!    live, the request rules, the credentials; what may happen next is a
//!    [`judge::Judged`];
//! 2. the upstream request, rebuilt from canonical values: [`rewrite`] (absolute-form, to
//!    an origin or an HTTP parent) or [`rebuild`] (a terminated request, for the origin's
//!    HTTP version); [`authority`] is a terminated request's tunnel-host rule;
//! 3. [`send`]: the trailer fields checked as the body streams, the outcome sorted, the
//!    answer passed on without hop-by-hop fields;
//! 4. [`response`]: every refusal is the JSON denial.

pub(crate) mod authority;
pub(crate) mod judge;
pub(crate) mod preflight;
pub(crate) mod rebuild;
pub(crate) mod response;
pub(crate) mod rewrite;
pub(crate) mod send;
