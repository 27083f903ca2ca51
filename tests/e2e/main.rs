//! End-to-end tests of the egress mediator: each module drives the real `mediator`
//! binary over real sockets (HTTP CONNECT, absolute-form HTTP, SOCKS5, the admin API), with
//! real curl as a client and a DNS server, origins and parent proxies on loopback from the
//! `e2e` support crate (`tests/src`). Nothing here connects anywhere but loopback.
//!
//! One test binary, a test target of the `mediator` package (see `mediator/Cargo.toml`),
//! so that Cargo builds the binary first and names it in `CARGO_BIN_EXE_mediator`
//! ([`support::bin`]). Run one area with `cargo test -p mediator --test e2e -- socks5::`.
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

mod admin;
mod attribution;
mod cli;
mod control;
mod credentials;
mod dns_pinning;
mod forward;
mod grant_denials;
mod lifecycle;
mod limits;
mod negotiate;
mod pac;
mod parent;
mod parent_https;
mod rejudge;
mod request_rules;
mod service;
mod sni;
mod socks5;
mod system;
mod tcp_connect;
mod tls_terminate;
mod unix_channel;
mod websocket;

fn main() {
    e2e::harness::run(
        [
            admin::cases(),
            attribution::cases(),
            cli::cases(),
            control::cases(),
            credentials::cases(),
            dns_pinning::cases(),
            forward::cases(),
            grant_denials::cases(),
            lifecycle::cases(),
            limits::cases(),
            negotiate::cases(),
            pac::cases(),
            parent::cases(),
            parent_https::cases(),
            rejudge::cases(),
            request_rules::cases(),
            service::cases(),
            sni::cases(),
            socks5::cases(),
            system::cases(),
            tcp_connect::cases(),
            tls_terminate::cases(),
            unix_channel::cases(),
            websocket::cases(),
        ]
        .concat(),
    )
}
