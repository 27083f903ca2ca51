//! The watchdog hook (design section 1, layer 2): an optional per-authority endpoint that
//! may narrow a decision the grant allows, never widen one.
//!
//! It is asked only after the grant allowed the destination and every resolved address
//! was vetted: an HTTP/1.1 `POST` with the JSON body
//! `{"authority","host","port","protocol"}` to `unix:/path` (request path `/`) or to an
//! `http://` URL on a loopback IP literal (or `localhost`, taken as `127.0.0.1`), parsed
//! once at load into a [`WatchdogEndpoint`] (the configuration refuses any other). Only a
//! `2xx` answer whose JSON body is `{"decision":"allow",...}` allows; `{"decision":"deny",
//! "reason":"..."}` denies with that reason in the detail, and anything else (no answer
//! within `timeouts.watchdog`, a connect error, another status, a body that is not that
//! JSON) denies too. The answer can only turn an
//! allow into a deny: a denied destination never reaches this module.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use policy::config::{Authority, WatchdogEndpoint};
use policy::{Reason, Target};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use crate::denial::Denial;
use crate::redact::escape_raw;
use crate::vocab::Protocol;

/// Largest watchdog answer body read, in bytes.
const MAX_ANSWER: usize = 16 * 1024;

/// Longest watchdog reason copied into a denial's detail, in characters.
const MAX_REASON: usize = 200;

/// What the watchdog is asked.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Question<'a> {
    /// The authority's name.
    pub(crate) authority: &'a str,
    /// The canonical host.
    pub(crate) host: &'a str,
    /// The destination port.
    pub(crate) port: u16,
    /// The protocol of the request.
    pub(crate) protocol: Protocol,
}

#[derive(Debug, Deserialize)]
struct Answer {
    decision: String,
    #[serde(default)]
    reason: String,
}

/// The outcome of asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The watchdog answered allow.
    Allow,
    /// Deny, with a human-readable explanation (the watchdog's reason, or what failed).
    Deny(String),
}

/// Asks the watchdog at `endpoint` (the authority's `watchdog` value) about `question`,
/// within `timeout`. Never fails: every error is a [`Verdict::Deny`].
pub(crate) async fn ask(
    endpoint: &WatchdogEndpoint,
    question: &Question<'_>,
    timeout: Duration,
) -> Verdict {
    match tokio::time::timeout(timeout, exchange(endpoint, question)).await {
        Err(_) => Verdict::Deny(format!(
            "the watchdog did not answer within {} s",
            timeout.as_secs_f64()
        )),
        Ok(Err(why)) => Verdict::Deny(format!("watchdog error: {why}")),
        Ok(Ok(answer)) => match answer.decision.as_str() {
            "allow" => Verdict::Allow,
            "deny" => {
                let reason: String = escape_raw(answer.reason.as_bytes())
                    .chars()
                    .take(MAX_REASON)
                    .collect();
                Verdict::Deny(format!("the watchdog denied: {reason}"))
            }
            other => Verdict::Deny(format!(
                "the watchdog answered decision {:?}; only \"allow\" allows",
                escape_raw(other.as_bytes())
            )),
        },
    }
}

/// Why the watchdog (or an `ask` endpoint, `crate::ask::endpoint`) could not be asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AskError {
    #[error("{0}")]
    Json(serde_json::Error),
    #[error("connect {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("{0}")]
    Http(hyper::Error),
    #[error("{0}")]
    Request(http::Error),
    #[error("reading the answer: {0}")]
    Read(String),
    #[error("HTTP status {0}")]
    Status(http::StatusCode),
    #[error("the answer is not the expected JSON: {0}")]
    Answer(serde_json::Error),
}

async fn exchange(
    endpoint: &WatchdogEndpoint,
    question: &Question<'_>,
) -> Result<Answer, AskError> {
    let body = serde_json::to_vec(question).map_err(AskError::Json)?;
    let (status, bytes) = post_json(endpoint, body, MAX_ANSWER).await?;
    if !status.is_success() {
        return Err(AskError::Status(status));
    }
    serde_json::from_slice(&bytes).map_err(AskError::Answer)
}

/// POSTs the JSON `body` to `endpoint` (HTTP/1.1; a Unix socket's request path is `/`)
/// and returns the answer's status and body (at most `max` bytes). Unbounded in time: the
/// caller bounds it.
///
/// # Errors
/// [`AskError`]: the connect, the exchange, or a body over `max`.
pub(crate) async fn post_json(
    endpoint: &WatchdogEndpoint,
    body: Vec<u8>,
    max: usize,
) -> Result<(http::StatusCode, Bytes), AskError> {
    match endpoint {
        WatchdogEndpoint::Unix(path) => {
            let stream = UnixStream::connect(path)
                .await
                .map_err(|e| AskError::Connect(path.display().to_string(), e))?;
            post(stream, "localhost", "/", body, max).await
        }
        WatchdogEndpoint::Http { addr, path } => {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|e| AskError::Connect(addr.to_string(), e))?;
            post(stream, &addr.to_string(), path, body, max).await
        }
    }
}

async fn post<S>(
    stream: S,
    host: &str,
    path: &str,
    body: Vec<u8>,
    max: usize,
) -> Result<(http::StatusCode, Bytes), AskError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(AskError::Http)?;
    let conn = tokio::spawn(conn);
    let req = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(AskError::Request)?;
    let resp = sender.send_request(req).await.map_err(AskError::Http)?;
    let status = resp.status();
    let bytes = Limited::new(resp.into_body(), max)
        .collect()
        .await
        .map_err(|e| AskError::Read(e.to_string()))?
        .to_bytes();
    conn.abort();
    Ok((status, bytes))
}

/// Asks `authority`'s watchdog, when it has one, about one connection to `target`; only an
/// answer of allow passes (silence, an error or a late answer deny).
///
/// # Errors
/// The `watchdog_denied` [`Denial`], its detail saying what the watchdog answered.
pub(crate) async fn consult(
    authority: &Authority,
    protocol: Protocol,
    target: &Target,
    timeout: Duration,
) -> Result<(), Denial> {
    let Some(endpoint) = &authority.watchdog else {
        return Ok(());
    };
    let host = target.host.as_text();
    let question = Question {
        authority: authority.grant.name(),
        host: &host,
        port: target.port,
        protocol,
    };
    match ask(endpoint, &question, timeout).await {
        Verdict::Allow => Ok(()),
        Verdict::Deny(detail) => Err(Denial::new(
            Reason::WatchdogDenied,
            detail,
            "the grant allows this destination but the authority's watchdog refused it; ask its operator",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn errors_and_silence_deny() {
        let q = Question {
            authority: "a",
            host: "h.test",
            port: 443,
            protocol: Protocol::Connect,
        };
        // Nothing listens there.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.sock");
        let v = ask(&WatchdogEndpoint::Unix(path), &q, Duration::from_secs(1)).await;
        assert!(matches!(v, Verdict::Deny(_)), "{v:?}");
        // A listener that never answers.
        let silent = tokio::net::UnixListener::bind(dir.path().join("s.sock")).unwrap();
        let endpoint = WatchdogEndpoint::Unix(dir.path().join("s.sock"));
        let v = ask(&endpoint, &q, Duration::from_millis(200)).await;
        drop(silent);
        assert!(
            matches!(&v, Verdict::Deny(w) if w.contains("did not answer")),
            "{v:?}"
        );
    }
}
