//! End-to-end tests of the egress mediator: each module drives the real `mediator`
//! binary over real sockets (HTTP CONNECT, absolute-form HTTP, SOCKS5, the admin API), with
//! real curl as a client and a DNS server, origins and parent proxies on loopback from the
//! `e2e` support crate (`tests/src`). Nothing here connects anywhere but loopback.
//!
//! One test binary, a test target of the `mediator` package (see `mediator/Cargo.toml`),
//! so that Cargo builds the binary first and names it in `CARGO_BIN_EXE_mediator`
//! ([`support::bin`]). The cases sit by area, one directory each, as the manual's pages
//! (`channels/`, `decisions/`, `tls/`, `upstream/`, `control/`, `service/`), each
//! `mod.rs` saying what the area proves. Run one area or module with a filter:
//! `cargo test -p mediator --test e2e -- tls::` or `-- channels::socks5::`.
//!
//! Tests run in parallel threads of this one process. None changes process-wide state
//! (environment, working directory, signal dispositions): a mediator's environment is set
//! on its `Command`. Each test binds its own ephemeral loopback ports; the tests that need
//! port 443 use addresses of their own in 127.0.0.0/8.

#![allow(
    // A `harness = false` binary is not compiled with `cfg(test)`, so clippy's
    // allow-unwrap-in-tests does not reach it: the whole binary is test code.
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs
)]

mod support;

mod channels;
mod control;
mod decisions;
mod service;
mod tls;
mod upstream;

fn main() {
    e2e::harness::run(
        [
            channels::cases(),
            decisions::cases(),
            tls::cases(),
            upstream::cases(),
            control::cases(),
            service::cases(),
        ]
        .concat(),
    )
}
