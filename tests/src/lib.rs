//! Test support for the end-to-end tests (`tests/e2e`, one test binary of the `mediator`
//! package): a loopback origin, a DNS server on loopback, parent proxies, helpers to run
//! the real `mediator` binary (whose path the caller passes in: this crate never builds
//! it), small clients (raw HTTP over TCP or a Unix socket, SOCKS5, real curl), one
//! [`Fixture`] that wires them together, and the shared assertions ([`expect`]).
//!
//! Hard rule for everything here and in `tests/e2e`: connect only to loopback. Names that
//! must resolve "privately" are answered by [`DnsServer`]; the mediator must refuse those
//! answers, and nothing in the tests ever connects to them itself. Every wait is for a
//! condition, with a deadline ([`wait`]).

pub mod admin;
pub mod curl;
pub mod dconf;
pub mod dns;
pub mod etcd;
pub mod expect;
pub mod fixture;
pub mod h2frames;
pub mod harness;
pub mod http;
pub mod kerberos;
pub mod mediator;
pub mod origin;
pub mod parent;
pub mod port;
pub mod registry;
pub mod socks;
pub mod squid;
pub mod tls;
pub mod tool;
pub mod upgrade;
pub mod wait;
pub mod websocket;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::Result;

pub use crate::admin::{PromText, Watchdog, WatchdogMode};
pub use crate::curl::{CurlOutput, curl};
pub use crate::dns::{DnsServer, QueryKind};
pub use crate::expect::{
    CLOSE_FIELDS, DECISION_FIELDS, Denial, PROXY_CHALLENGE, check_contains, check_deny,
    check_fields, check_line, check_stamp, check_tcp_peer, expect_http_200,
};
pub use crate::fixture::Fixture;
pub use crate::http::{HttpConn, HttpResponse, basic_auth, get_through, proxy_authorization};
pub use crate::mediator::{AuthoritySpec, LOG_TIMEOUT, Mediator, MediatorBuilder, sha256_hex};
pub use crate::origin::{FORGED_DECISION, Origin};
pub use crate::socks::{Socks5, SocksReply, SocksTarget};
pub use crate::tool::Tool;
pub use crate::wait::{retry_for, wait_for, wait_until};

/// The name the tests' DNS server resolves to the origin (127.0.0.1).
pub const ORIGIN_HOST: &str = "origin.test";
/// The authority most tests use.
pub const AGENT_A: &str = "agent-a";
/// `agent-a`'s token on the TCP listener.
pub const TOKEN_A: &str = "token-a-3f9c";
/// A second authority.
pub const AGENT_B: &str = "agent-b";
/// `agent-b`'s token.
pub const TOKEN_B: &str = "token-b-77e1";
/// IPv4 loopback.
pub const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// `agent-a`: `allow = ["origin.test"]`, `allow_private = ["127.0.0.0/8"]`, token
/// [`TOKEN_A`].
pub fn agent_a_spec() -> AuthoritySpec {
    agent_a_allowing(&[ORIGIN_HOST])
}

/// `agent-a` (token [`TOKEN_A`]) whose grant allows exactly `allow`, with
/// `allow_private = ["127.0.0.0/8"]` so loopback origins pass.
pub fn agent_a_allowing<S: AsRef<str>>(allow: &[S]) -> AuthoritySpec {
    AuthoritySpec::new(AGENT_A)
        .allow(allow)
        .allow_private(&["127.0.0.0/8"])
        .token(TOKEN_A)
}

/// A loopback listener (backlog 1, never accepting) whose accept queue is full, so the
/// kernel drops further SYNs and a connect to it hangs. Keep both values alive while the
/// stall is needed.
///
/// # Errors
/// Binding fails, or the queue cannot be filled.
pub async fn stalled_loopback_listener()
-> Result<(tokio::net::TcpListener, Vec<tokio::net::TcpStream>)> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind("127.0.0.1:0".parse()?)?;
    let listener = socket.listen(1)?;
    let addr = listener.local_addr()?;
    let mut held = Vec::new();
    for _ in 0..16 {
        match tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(s)) => held.push(s),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Ok((listener, held)),
        }
    }
    anyhow::bail!("could not fill the accept queue of {addr}")
}

/// A loopback port with no listener (an ephemeral port bound, then released), where a
/// connect is refused at once.
///
/// # Errors
/// Binding fails.
pub fn closed_loopback_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}
