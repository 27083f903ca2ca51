//! Test support for the end-to-end tests: a loopback origin, a DNS server on loopback,
//! helpers to run the real `mediator` binary, and small clients (raw HTTP over TCP or a
//! Unix socket, SOCKS5, real curl).
//!
//! Hard rule for everything here and in `tests/`: connect only to loopback. Names that
//! must resolve "privately" are answered by [`DnsServer`]; the mediator must refuse those
//! answers, and nothing in the tests ever connects to them itself.

pub mod admin;
pub mod curl;
pub mod dns;
pub mod http;
pub mod mediator;
pub mod origin;
pub mod parent;
pub mod socks;
pub mod tls;

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Result, ensure};
use serde_json::Value;

pub use crate::admin::{PromText, Watchdog, WatchdogMode};
pub use crate::curl::{CurlOutput, curl};
pub use crate::dns::{DnsServer, QueryKind};
pub use crate::http::{HttpConn, HttpResponse, basic_auth};
pub use crate::mediator::{AuthoritySpec, LOG_TIMEOUT, Mediator, MediatorBuilder, sha256_hex};
pub use crate::origin::{FORGED_DECISION, Origin};
pub use crate::socks::{Socks5, SocksReply, SocksTarget};

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

/// A DNS server, an origin and a mediator wired together: `origin.test` resolves to
/// `127.0.0.1` and the mediator's resolver is the DNS server.
#[derive(Debug)]
pub struct Fixture {
    /// The loopback DNS server (program more names on it freely).
    pub dns: DnsServer,
    /// The echoing origin on 127.0.0.1.
    pub origin: Origin,
    /// The running mediator.
    pub mediator: Mediator,
}

impl Fixture {
    /// Starts DNS and origin, then the mediator `builder` describes, with the DNS server
    /// as its nameserver.
    ///
    /// # Errors
    /// When any of the three fails to start.
    pub async fn start(builder: MediatorBuilder) -> Result<Self> {
        let dns = DnsServer::start().await?;
        dns.set(ORIGIN_HOST, [LOOPBACK]);
        let origin = Origin::start().await?;
        let mediator = builder.nameserver(dns.addr()).start().await?;
        Ok(Self {
            dns,
            origin,
            mediator,
        })
    }

    /// `origin.test:<origin port>`.
    pub fn origin_target(&self) -> String {
        format!("{ORIGIN_HOST}:{}", self.origin.port())
    }

    /// A fresh connection to the mediator's TCP listener.
    ///
    /// # Errors
    /// Connect failure.
    pub async fn tcp_conn(&self) -> Result<HttpConn> {
        HttpConn::tcp(self.mediator.tcp_addr()).await
    }
}

/// `agent-a`: `allow = ["origin.test"]`, `allow_private = ["127.0.0.0/8"]`, token
/// [`TOKEN_A`].
pub fn agent_a_spec() -> AuthoritySpec {
    AuthoritySpec::new(AGENT_A)
        .allow(&[ORIGIN_HOST])
        .allow_private(&["127.0.0.0/8"])
        .token(TOKEN_A)
}

/// Checks the deny-response contract (design section 6): `status`, a JSON content type,
/// `X-Mediator-Decision: deny; reason=<reason>`, and a body with `error: egress_denied`,
/// this `reason`, and string `detail` and `hint`. Returns the body.
///
/// # Errors
/// The first deviation, with the whole response in the message.
pub fn check_deny(resp: &HttpResponse, status: u16, reason: &str) -> Result<Value> {
    let shown = || {
        format!(
            "{} {} {:?}\n{}",
            resp.status,
            resp.reason,
            resp.headers,
            resp.text()
        )
    };
    ensure!(
        resp.status == status,
        "expected status {status}, got: {}",
        shown()
    );
    let ct = resp.header("content-type").unwrap_or_default();
    ensure!(
        ct.to_ascii_lowercase().starts_with("application/json"),
        "expected Content-Type application/json, got: {}",
        shown()
    );
    let decision = resp.header("x-mediator-decision").unwrap_or_default();
    ensure!(
        decision == format!("deny; reason={reason}"),
        "expected X-Mediator-Decision `deny; reason={reason}`, got: {}",
        shown()
    );
    let body = resp.json()?;
    ensure!(
        body["error"] == "egress_denied",
        "error field, got: {}",
        shown()
    );
    ensure!(body["reason"] == reason, "reason field, got: {}", shown());
    for key in ["authority", "host", "port", "detail", "hint"] {
        ensure!(body.get(key).is_some(), "body lacks `{key}`: {}", shown());
    }
    ensure!(
        body["detail"].is_string(),
        "detail is not a string: {}",
        shown()
    );
    ensure!(
        body["hint"].as_str().is_some_and(|h| !h.is_empty()),
        "hint is not a non-empty string: {}",
        shown()
    );
    Ok(body)
}

/// The fields every `event: "decision"` line carries (design section 10 + the contract).
pub const DECISION_FIELDS: &[&str] = &[
    "event",
    "ts",
    "id",
    "authority",
    "channel",
    "peer",
    "protocol",
    "host",
    "port",
    "decision",
    "reason",
    "rule",
    "pin",
    "route",
    "dns_ms",
    "connect_ms",
    "detail",
];

/// The extra fields of an `event: "close"` line.
pub const CLOSE_FIELDS: &[&str] = &["bytes_up", "bytes_down", "duration_ms", "close_reason"];

/// Checks that a decision line has every field of [`DECISION_FIELDS`] and that each
/// `(key, value)` in `expect` matches exactly.
///
/// # Errors
/// The first missing field or mismatch, with the line in the message.
pub fn check_line(line: &Value, expect: &[(&str, Value)]) -> Result<()> {
    for key in DECISION_FIELDS {
        ensure!(
            line.get(*key).is_some(),
            "decision line lacks `{key}`: {line}"
        );
    }
    for (key, want) in expect {
        ensure!(
            &line[*key] == want,
            "decision line `{key}`: expected {want}, got {} in {line}",
            line[*key]
        );
    }
    Ok(())
}

/// Checks a TCP-channel peer: `{"addr": "127.0.0.1:<port>"}`.
///
/// # Errors
/// When `peer.addr` is not a loopback socket address.
pub fn check_tcp_peer(line: &Value) -> Result<()> {
    let addr = line["peer"]["addr"].as_str().unwrap_or_default();
    let parsed: Option<std::net::SocketAddr> = addr.parse().ok();
    ensure!(
        parsed.is_some_and(|a| a.ip().is_loopback()),
        "peer.addr should be our loopback address, got {} in {line}",
        line["peer"]
    );
    Ok(())
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
            std::time::Duration::from_millis(300),
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
