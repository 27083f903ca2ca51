//! The assertions the tests share: the deny-response contract on the wire, the fields of
//! a decision line, and the helpers that wait for a decision (or close) line and check it
//! in one step, so that every test checks the same things the same way.

use std::net::SocketAddr;

use anyhow::{Result, ensure};
use serde_json::{Value, json};

use crate::http::HttpResponse;
use crate::mediator::Mediator;

/// The `Proxy-Authenticate` challenge of the mediator's `407` answers.
pub const PROXY_CHALLENGE: &str = "Basic realm=\"mediator\"";

/// Checks the deny-response contract (design section 6): `status`, a JSON content type,
/// `X-Mediator-Decision: deny; reason=<reason>`, and a body with `error: egress_denied`,
/// this `reason`, and string `detail` and `hint`; a `407` also carries
/// [`PROXY_CHALLENGE`]. Returns the body.
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
    // RFC 9110 11.7.1: a 407 carries the challenge (ours names the realm "mediator").
    ensure!(
        status != 407 || resp.header("proxy-authenticate") == Some(PROXY_CHALLENGE),
        "expected Proxy-Authenticate `{PROXY_CHALLENGE}`, got: {}",
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
    check_fields(line, expect)
}

/// Checks that each `(key, value)` in `expect` matches `line` (any JSON object) exactly.
///
/// # Errors
/// The first mismatch, with the line in the message.
pub fn check_fields(line: &Value, expect: &[(&str, Value)]) -> Result<()> {
    for (key, want) in expect {
        ensure!(
            &line[*key] == want,
            "`{key}`: expected {want}, got {} in {line}",
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
    let parsed: Option<SocketAddr> = addr.parse().ok();
    ensure!(
        parsed.is_some_and(|a| a.ip().is_loopback()),
        "peer.addr should be our loopback address, got {} in {line}",
        line["peer"]
    );
    // Split out too (design 19), and the line says which mediator and run wrote it.
    ensure!(
        parsed.is_some_and(
            |a| line["peer_ip"] == a.ip().to_string().as_str() && line["peer_port"] == a.port()
        ),
        "peer_ip/peer_port should split {addr}: {line}"
    );
    check_stamp(line)
}

/// Checks that a decision line names its mediator (`instance`, non-empty) and run (16
/// hex digits).
///
/// # Errors
/// Either missing or malformed.
pub fn check_stamp(line: &Value) -> Result<()> {
    ensure!(
        line["instance"].as_str().is_some_and(|i| !i.is_empty()),
        "no instance: {line}"
    );
    ensure!(
        line["run"]
            .as_str()
            .is_some_and(|r| r.len() == 16 && r.bytes().all(|b| b.is_ascii_hexdigit())),
        "run should be 16 hex digits: {line}"
    );
    Ok(())
}

/// Checks that `v[key]` (a deny body's or a log line's `detail`, `hint`, ...) is a string
/// containing `needle`.
///
/// # Errors
/// Not a string, or `needle` missing (the whole value is in the message).
pub fn check_contains(v: &Value, key: &str, needle: &str) -> Result<()> {
    ensure!(
        v[key].as_str().is_some_and(|s| s.contains(needle)),
        "`{key}` should contain {needle:?}: {v}"
    );
    Ok(())
}

/// A denial as the client and the log saw it (see [`Mediator::expect_deny`]).
#[derive(Debug, Clone)]
pub struct Denial {
    /// The JSON body of the deny response.
    pub body: Value,
    /// The matching `event: "decision"` line.
    pub line: Value,
}

impl Mediator {
    /// Waits (up to [`crate::LOG_TIMEOUT`]) for the decision line with this `reason` (and
    /// `host`, when given) and checks it with [`check_line`] against `fields`. Returns it.
    ///
    /// # Errors
    /// No such line in time, or a missing field or mismatch.
    pub async fn expect_decision(
        &self,
        reason: &str,
        host: Option<&str>,
        fields: &[(&str, Value)],
    ) -> Result<Value> {
        let line = self.wait_for_decision(reason, host).await?;
        check_line(&line, fields)?;
        Ok(line)
    }

    /// Waits (up to [`crate::LOG_TIMEOUT`]) for the first log line of any event that
    /// satisfies `pred`, and checks `fields` on it ([`check_fields`]). Returns it.
    ///
    /// # Errors
    /// No such line in time, or a mismatch.
    pub async fn expect_log(
        &self,
        pred: impl Fn(&Value) -> bool,
        fields: &[(&str, Value)],
    ) -> Result<Value> {
        let line = self.wait_for_log(pred, crate::LOG_TIMEOUT).await?;
        check_fields(&line, fields)?;
        Ok(line)
    }

    /// [`Self::expect_decision`] for an allowed connection to `host`: reason `allowed`,
    /// decision `allow`, and `fields`.
    ///
    /// # Errors
    /// As [`Self::expect_decision`].
    pub async fn expect_allow(&self, host: &str, fields: &[(&str, Value)]) -> Result<Value> {
        let mut all = vec![("decision", json!("allow"))];
        all.extend_from_slice(fields);
        self.expect_decision("allowed", Some(host), &all).await
    }

    /// A denial on the wire and in the log: `resp` meets the deny contract
    /// ([`check_deny`]) with `status` and `reason`, and a decision line with that reason
    /// says `decision: deny` and `fields`. With `host`, the body and the line both name
    /// that host.
    ///
    /// # Errors
    /// The first deviation, or no decision line within [`crate::LOG_TIMEOUT`].
    pub async fn expect_deny(
        &self,
        resp: &HttpResponse,
        status: u16,
        reason: &str,
        host: Option<&str>,
        fields: &[(&str, Value)],
    ) -> Result<Denial> {
        let body = check_deny(resp, status, reason)?;
        if let Some(h) = host {
            ensure!(body["host"] == h, "deny body host should be {h}: {body}");
        }
        let mut all = vec![("decision", json!("deny"))];
        all.extend_from_slice(fields);
        let line = self.expect_decision(reason, host, &all).await?;
        Ok(Denial { body, line })
    }

    /// Waits for the close line of the connection `decision` opened and checks that it
    /// counted exactly `up` bytes from the client and `down` bytes to it.
    ///
    /// # Errors
    /// No close line in time, or other counts.
    pub async fn expect_close_bytes(
        &self,
        decision: &Value,
        up: usize,
        down: usize,
    ) -> Result<Value> {
        let close = self.wait_for_close(&decision["id"]).await?;
        ensure!(
            close["bytes_up"] == json!(up),
            "bytes_up should be {up}: {close}"
        );
        ensure!(
            close["bytes_down"] == json!(down),
            "bytes_down should be {down}: {close}"
        );
        Ok(close)
    }

    /// Waits for the allowed decision on `host` and for the close line of that connection,
    /// which must have counted exactly `up` bytes from the client and `down` to it.
    /// Returns the close line.
    ///
    /// # Errors
    /// As [`Self::expect_allow`] and [`Self::expect_close_bytes`].
    pub async fn expect_tunnel_bytes(&self, host: &str, up: usize, down: usize) -> Result<Value> {
        let line = self.expect_allow(host, &[]).await?;
        self.expect_close_bytes(&line, up, down).await
    }

    /// Checks that the raw decision log never contains `secret` (a token, a password, a
    /// query value).
    ///
    /// # Errors
    /// The log cannot be read, or it contains `secret`.
    pub fn expect_log_lacks(&self, secret: &str) -> Result<()> {
        let raw = std::fs::read_to_string(self.log_path())?;
        ensure!(
            !raw.contains(secret),
            "{secret:?} is in the decision log:\n{raw}"
        );
        Ok(())
    }
}

/// Checks that `raw`, a response a test read from a tunnel itself, starts with
/// `HTTP/1.1 200`.
///
/// # Errors
/// Any other start (the whole text is in the message).
pub fn expect_http_200(raw: &str) -> Result<()> {
    ensure!(
        raw.starts_with("HTTP/1.1 200"),
        "expected HTTP/1.1 200, got: {raw}"
    );
    Ok(())
}
