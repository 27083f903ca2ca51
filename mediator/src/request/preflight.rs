//! The first request head of a connection, read before hyper sees it (RFC 9112 section
//! 3): bounded by the request-head timeout and `[limits] request_head_bytes`. A head whose
//! request line does not parse, or whose target is not a URI, is answered by the mediator
//! itself with the JSON 400 and a decision line (hyper would answer a bare 400 and no
//! record); a CONNECT head is handed to the fast path; anything else (including a head
//! that is only too large, which hyper answers with 431) goes to hyper.
//!
//! It never holds a buffer of its own across an await: every connection's task carries
//! this future.

use http::Uri;
use http::header::HeaderValue;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::conn::TargetLabel;
use crate::redact::escape_raw;
use crate::vocab::Protocol;

/// The request header by which the shim marks a CONNECT it made for a transparently
/// captured connection (design section 15).
pub(crate) const CAPTURE_HEADER: &str = "x-mediator-capture";

/// hyper refuses buffers smaller than this.
pub(crate) const MIN_BUF: usize = 8192;

/// The verdict on a connection's first request head.
#[derive(Debug)]
pub(crate) enum Preflight {
    /// Serve the request.
    Pass(Head),
    /// The request line cannot be parsed: answer the JSON 400.
    Reject {
        /// `malformed_target` (the target is not a URI) or `bad_request` (the head is not
        /// HTTP/1.1 the mediator takes).
        reason: policy::Reason,
        /// The raw target, escaped (none for a `bad_request`: its request line is not
        /// trusted to say where the client meant to go).
        label: TargetLabel,
        /// What is wrong.
        detail: String,
        /// `connect` or `http`, for the log.
        protocol: Protocol,
        /// The credential, when the head parsed far enough to have one.
        proxy_authorization: Option<HeaderValue>,
    },
    /// The client went away or timed out before sending a head.
    Closed,
}

/// A first request head that parsed.
#[derive(Debug)]
pub(crate) enum Head {
    /// `CONNECT`: served by the fast path.
    Connect {
        /// Every byte read so far: the head, then any early tunnel bytes.
        buf: Vec<u8>,
        /// Length of the head within `buf`.
        head_len: usize,
        /// The request target, as sent.
        target: String,
        /// Every `Proxy-Authorization` value.
        proxy_authorization: Vec<HeaderValue>,
        /// The head carries `X-Mediator-Capture: 1`: the client says the shim captured
        /// this connection (design section 15; logged, never decided on).
        capture: bool,
    },
    /// Anything else (or a head hyper must judge, e.g. one too large): served by hyper.
    Other(Vec<u8>),
}

impl Head {
    /// Every byte read so far, to be replayed to whoever serves the connection.
    pub(crate) fn into_buf(self) -> Vec<u8> {
        match self {
            Self::Connect { buf, .. } | Self::Other(buf) => buf,
        }
    }
}

/// The start of the HTTP/2 connection preface (RFC 9113 section 3.4): a client with prior
/// knowledge sends it where an HTTP/1.1 head would be; it is for hyper to judge.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// Reads the first request head (by `deadline`, at most `limit` bytes before hyper judges
/// it) and judges it.
pub(crate) async fn preflight<S: AsyncRead + Unpin>(
    io: &mut S,
    limit: usize,
    deadline: tokio::time::Instant,
) -> Preflight {
    let limit = limit.max(MIN_BUF);
    let mut buf = Vec::with_capacity(1024);
    loop {
        buf = match judge(buf, limit) {
            Ok(verdict) => return verdict,
            Err(buf) => buf,
        };
        // Straight into `buf`: this future holds no buffer (nor httparse's header array,
        // see `judge`) of its own.
        buf.reserve(4096);
        match tokio::time::timeout_at(deadline, io.read_buf(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Preflight::Closed,
            Ok(Ok(_)) => {}
        }
    }
}

/// The verdict on the bytes read so far, or the bytes back when the head is incomplete.
pub(crate) fn judge(buf: Vec<u8>, limit: usize) -> Result<Preflight, Vec<u8>> {
    if buf.starts_with(H2_PREFACE) {
        return Ok(Preflight::Pass(Head::Other(buf)));
    }
    if H2_PREFACE.starts_with(&buf) {
        return Err(buf);
    }
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(&buf) {
        Ok(httparse::Status::Complete(head_len)) => {
            let target = req.path.unwrap_or_default();
            let protocol = if req.method == Some("CONNECT") {
                Protocol::Connect
            } else {
                Protocol::Http
            };
            if let Some(reject) = unimplemented_coding(&req, protocol) {
                return Ok(reject);
            }
            if let Err(e) = target.parse::<Uri>() {
                let proxy_authorization = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("proxy-authorization"))
                    .and_then(|h| HeaderValue::from_bytes(h.value).ok());
                return Ok(Preflight::Reject {
                    reason: policy::Reason::MalformedTarget,
                    label: TargetLabel {
                        host: Some(escape_raw(target.as_bytes())),
                        port: None,
                    },
                    detail: format!("the request target is not a valid URI: {e}"),
                    protocol,
                    proxy_authorization,
                });
            }
            // A head over the limit goes to hyper, which answers 431.
            if protocol == Protocol::Connect && head_len <= limit {
                let target = target.to_owned();
                let proxy_authorization = req
                    .headers
                    .iter()
                    .filter(|h| h.name.eq_ignore_ascii_case("proxy-authorization"))
                    .filter_map(|h| HeaderValue::from_bytes(h.value).ok())
                    .collect();
                let capture = req
                    .headers
                    .iter()
                    .any(|h| h.name.eq_ignore_ascii_case(CAPTURE_HEADER) && h.value == b"1");
                return Ok(Preflight::Pass(Head::Connect {
                    buf,
                    head_len,
                    target,
                    proxy_authorization,
                    capture,
                }));
            }
            return Ok(Preflight::Pass(Head::Other(buf)));
        }
        Ok(httparse::Status::Partial) => {}
        Err(httparse::Error::TooManyHeaders) => return Ok(Preflight::Pass(Head::Other(buf))),
        Err(e) => return Ok(unparsable(&buf, &e)),
    }
    if buf.len() > limit {
        return Ok(Preflight::Pass(Head::Other(buf)));
    }
    Err(buf)
}

/// RFC 9112 section 6.1: a request with a transfer coding the recipient does not
/// implement is answered 400. Only `chunked` is implemented.
fn unimplemented_coding(req: &httparse::Request<'_, '_>, protocol: Protocol) -> Option<Preflight> {
    let te = req.headers.iter().find(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding")
            && !h.value.trim_ascii().eq_ignore_ascii_case(b"chunked")
    })?;
    Some(Preflight::Reject {
        reason: policy::Reason::BadRequest,
        label: TargetLabel {
            host: None,
            port: None,
        },
        detail: format!(
            "Transfer-Encoding: {} is not a coding this proxy implements (only chunked)",
            escape_raw(te.value)
        ),
        protocol,
        proxy_authorization: req
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("proxy-authorization"))
            .and_then(|h| HeaderValue::from_bytes(h.value).ok()),
    })
}

/// The rejection of a head httparse refused. A request line that is not three tokens
/// names no target to go by: `malformed_target`, labelled with the line. A bare CR
/// anywhere, or a bad header line (obs-fold, a bad name) under a sound request line, is
/// the head's fault: `bad_request`, and the line is not shown as a host.
fn unparsable(buf: &[u8], e: &httparse::Error) -> Preflight {
    let line_end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
    let line = buf[..line_end]
        .strip_suffix(b"\r")
        .unwrap_or(&buf[..line_end]);
    let bare_cr = buf
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\r' && buf.get(i + 1).is_some_and(|&n| n != b'\n'));
    let sound_line = line.split(|&b| b == b' ').count() == 3
        && line.iter().all(|&b| b.is_ascii_graphic() || b == b' ');
    let (reason, host) = if bare_cr || sound_line {
        (policy::Reason::BadRequest, None)
    } else {
        (
            policy::Reason::MalformedTarget,
            Some(escape_raw(&buf[..line_end.min(256)])),
        )
    };
    Preflight::Reject {
        reason,
        label: TargetLabel { host, port: None },
        detail: format!("unparsable request head: {e}"),
        protocol: if buf.starts_with(b"CONNECT ") {
            Protocol::Connect
        } else {
            Protocol::Http
        },
        proxy_authorization: raw_proxy_authorization(buf),
    }
}

/// The `Proxy-Authorization` value of a head that httparse refused (its request line is
/// malformed, its header lines may still be fine), found line by line.
fn raw_proxy_authorization(head: &[u8]) -> Option<HeaderValue> {
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = line.split_at(colon);
        name.eq_ignore_ascii_case(b"proxy-authorization")
            .then(|| HeaderValue::from_bytes(value[1..].trim_ascii()).ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(head: &[u8]) -> Result<Preflight, Vec<u8>> {
        judge(head.to_vec(), MIN_BUF)
    }

    #[test]
    fn a_connect_head_goes_to_the_fast_path_with_its_early_bytes() {
        let raw = b"CONNECT a.test:443 HTTP/1.1\r\nProxy-Authorization: Basic x\r\n\r\n\x16\x03";
        let Ok(Preflight::Pass(Head::Connect {
            buf,
            head_len,
            target,
            proxy_authorization,
            capture,
        })) = judged(raw)
        else {
            panic!("not a CONNECT pass");
        };
        assert!(!capture);
        assert_eq!(target, "a.test:443");
        assert_eq!(&buf[head_len..], b"\x16\x03");
        assert_eq!(proxy_authorization, [HeaderValue::from_static("Basic x")]);
    }

    #[test]
    fn the_capture_header_marks_a_connect() {
        for (raw, want) in [
            (
                &b"CONNECT a.test:80 HTTP/1.1\r\nX-Mediator-Capture: 1\r\n\r\n"[..],
                true,
            ),
            (
                b"CONNECT a.test:80 HTTP/1.1\r\nx-mediator-capture: 1\r\n\r\n",
                true,
            ),
            (
                b"CONNECT a.test:80 HTTP/1.1\r\nX-Mediator-Capture: yes\r\n\r\n",
                false,
            ),
        ] {
            let Ok(Preflight::Pass(Head::Connect { capture, .. })) = judged(raw) else {
                panic!("not a CONNECT pass");
            };
            assert_eq!(capture, want, "{}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn an_http2_preface_is_for_hyper_to_judge() {
        assert!(judged(b"PRI * HTTP/2").is_err(), "read on");
        assert!(matches!(
            judged(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            Ok(Preflight::Pass(Head::Other(_)))
        ));
    }

    #[test]
    fn other_requests_and_incomplete_heads() {
        assert!(matches!(
            judged(b"GET http://a.test/ HTTP/1.1\r\n\r\n"),
            Ok(Preflight::Pass(Head::Other(_)))
        ));
        assert!(judged(b"GET http://a.test/ HTTP/1.1\r\nHost: a").is_err());
        // Too large for the limit: hyper judges (431).
        let big = vec![b'a'; MIN_BUF + 1];
        let mut head = b"GET / HTTP/1.1\r\nX: ".to_vec();
        head.extend_from_slice(&big);
        assert!(matches!(
            judge(head, MIN_BUF),
            Ok(Preflight::Pass(Head::Other(_)))
        ));
    }

    #[test]
    fn unparsable_heads_are_rejected_with_an_escaped_label_and_the_credential() {
        let raw = b"CONNECT a b c\x01\r\nProxy-Authorization: Basic eA==\r\n\r\n";
        let Ok(Preflight::Reject {
            label,
            protocol,
            proxy_authorization,
            ..
        }) = judged(raw)
        else {
            panic!("not rejected");
        };
        assert_eq!(protocol, Protocol::Connect);
        assert_eq!(label.host.as_deref(), Some("CONNECT a b c\\x01\\x0d"));
        assert_eq!(
            proxy_authorization,
            Some(HeaderValue::from_static("Basic eA=="))
        );
        let Ok(Preflight::Reject { detail, .. }) = judged(b"GET http://a b/ HTTP/1.1\r\n\r\n")
        else {
            panic!("not rejected");
        };
        assert!(
            detail.contains("unparsable") || detail.contains("URI"),
            "{detail}"
        );
    }
}
