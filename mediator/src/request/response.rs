//! What the HTTP front-end (and the TLS-terminated leg) answers when it refuses: the JSON
//! denial of design section 6, with `X-Mediator-Decision: deny; reason=<reason>` and, for
//! credentials, `Proxy-Authenticate: Basic realm="mediator"`. The status comes from
//! [`Denial::http_status`], the one mapping. Also the raw-response writer for answers sent
//! without hyper (the CONNECT fast path, an unparsable first head).

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::conn::{Ctx, TargetLabel, record};
use crate::denial::Denial;
use crate::redact::escape_raw;
use crate::shared::Shared;
use crate::vocab::Protocol;

/// The body type of every response the front-end builds.
pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// The header that carries a decision to the client (design section 6).
pub(crate) const DECISION_HEADER: &str = "x-mediator-decision";

/// The denial a decision line records for a request head that hyper refused itself: a
/// head after the first on a kept-alive connection (the first is judged before hyper sees
/// it), answered by hyper with a bare `400`, or `431` for one over `[limits]
/// request_head_bytes` (`limit`, in bytes). `None` for an error that is not a refused
/// head.
pub(crate) fn refused_head(e: &hyper::Error, limit: usize) -> Option<Denial> {
    if e.is_parse_too_large() {
        return Some(Denial::new(
            policy::Reason::BadRequest,
            format!(
                "the request head is larger than [limits] request_head_bytes ({limit} bytes); it was answered 431 and the connection closed"
            ),
            "send a smaller request head, or ask the operator to raise [limits] request_head_bytes",
        ));
    }
    e.is_parse().then(|| {
        Denial::new(
            policy::Reason::BadRequest,
            format!("unparsable request head ({e}); it was answered 400 and the connection closed"),
            "send HTTP/1.1 request heads with CRLF line ends, no folded header lines, and no Transfer-Encoding other than chunked",
        )
    })
}

/// Logs `denial` for `ctx` and answers it.
pub(crate) fn refuse(
    shared: &Shared,
    ctx: &Ctx,
    protocol: Protocol,
    label: &TargetLabel,
    denial: Denial,
) -> Response<Body> {
    let denial = record::deny(shared, ctx, protocol, label, denial);
    deny_response(ctx.authority_name(), label, &denial)
}

/// The JSON denial of design section 6 (a rejected credential's in its uniform form).
pub(crate) fn deny_response(
    authority: Option<&str>,
    label: &TargetLabel,
    denial: &Denial,
) -> Response<Body> {
    let denial = denial.public();
    let denial = denial.as_ref();
    let mut body = serde_json::json!({
        "error": "egress_denied",
        "authority": authority,
        "host": label.host,
        "port": label.port,
        "reason": denial.reason.as_str(),
        "detail": denial.detail,
        "hint": denial.hint,
    });
    if let Some(message) = &denial.message {
        body["message"] = serde_json::Value::from(&**message);
    }
    let body = body.to_string();
    let status = StatusCode::from_u16(denial.http_status()).unwrap_or(StatusCode::FORBIDDEN);
    let length = body.len();
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    if let Ok(v) = HeaderValue::from_str(&format!("deny; reason={}", denial.reason.as_str())) {
        h.insert(DECISION_HEADER, v);
    }
    if let Some(secs) = denial.retry_after() {
        h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if denial.closes_connection() {
        // Answered, then closed (design section 13): hyper closes after this response.
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        h.insert(
            header::PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"mediator\""),
        );
    }
    resp
}

/// The raw target of a request for logs, escaped.
pub(crate) fn raw_label(uri: &Uri) -> TargetLabel {
    match uri.authority() {
        Some(a) => TargetLabel {
            host: Some(escape_raw(a.host().as_bytes())),
            port: a.port_u16(),
        },
        None => TargetLabel {
            host: Some(escape_raw(uri.to_string().as_bytes())),
            port: None,
        },
    }
}

/// Writes a complete HTTP/1.1 response with a full body and `Connection: close`.
pub(crate) async fn write_raw_response<S: AsyncWrite + Unpin>(
    io: &mut S,
    resp: Response<Body>,
) -> std::io::Result<()> {
    io.write_all(&encode_raw(resp).await).await?;
    io.shutdown().await
}

/// The bytes of `resp` as an HTTP/1.1 response that closes the connection.
async fn encode_raw(resp: Response<Body>) -> Vec<u8> {
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        parts.status.as_u16(),
        parts.status.canonical_reason().unwrap_or("")
    )
    .into_bytes();
    for (name, value) in parts
        .headers
        .iter()
        .filter(|(n, _)| *n != header::CONNECTION)
    {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out.extend_from_slice(&body);
    out
}

/// A full body.
pub(crate) fn full(s: String) -> Body {
    Full::new(Bytes::from(s))
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub(crate) fn empty() -> Body {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

#[cfg(test)]
mod tests {
    use policy::Reason;

    use super::*;
    use crate::denial::Cause;

    fn label() -> TargetLabel {
        TargetLabel {
            host: Some("evil.example".into()),
            port: Some(443),
        }
    }

    #[tokio::test]
    async fn a_denial_has_the_contract_shape() {
        let denial = Denial::new(Reason::NotInAllowlist, "no rule", "add evil.example:443");
        let resp = deny_response(Some("agent-a"), &label(), &denial);
        assert_eq!(resp.status(), 403);
        let h = resp.headers();
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
        assert_eq!(h[DECISION_HEADER], "deny; reason=not_in_allowlist");
        assert!(h.get(header::PROXY_AUTHENTICATE).is_none());
        let raw = String::from_utf8(encode_raw(resp).await).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{head}");
        assert!(head.ends_with("connection: close"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "error": "egress_denied", "authority": "agent-a", "host": "evil.example",
                "port": 443, "reason": "not_in_allowlist", "detail": "no rule",
                "hint": "add evil.example:443",
            })
        );
    }

    #[test]
    fn credential_denials_ask_for_basic_and_timeouts_are_504() {
        let d = Denial::new(Reason::BadCredential, "", "");
        let resp = deny_response(None, &TargetLabel::default(), &d);
        assert_eq!(resp.status(), 407);
        assert_eq!(
            resp.headers()[header::PROXY_AUTHENTICATE],
            "Basic realm=\"mediator\""
        );
        let d = Denial::new(Reason::UpstreamFailure, "", "").with_cause(Cause::ConnectTimeout);
        assert_eq!(deny_response(None, &label(), &d).status(), 504);
    }

    #[test]
    fn a_limit_says_when_to_retry_and_closes_the_connection() {
        let d = Denial::new(Reason::RateLimited, "over", "wait")
            .with_cause(Cause::Limited { retry_after: 7 });
        let resp = deny_response(Some("a"), &label(), &d);
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "7");
        assert_eq!(resp.headers()[header::CONNECTION], "close");
    }

    #[test]
    fn raw_labels_name_the_authority_or_the_whole_target() {
        let uri: Uri = "http://A.test:81/x".parse().unwrap();
        assert_eq!(
            raw_label(&uri),
            TargetLabel {
                host: Some("A.test".into()),
                port: Some(81)
            }
        );
        let uri: Uri = "/only/a/path".parse().unwrap();
        assert_eq!(raw_label(&uri).host.as_deref(), Some("/only/a/path"));
    }
}
