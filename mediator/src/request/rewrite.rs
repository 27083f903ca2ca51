//! What the mediator sends upstream instead of what the client sent (RFC 9110 section
//! 7.6.1, RFC 9112 section 3.2.2): hop-by-hop headers removed, the request target and
//! `Host` rebuilt from canonical values only (so no CRLF or second host can pass), the
//! client's `Proxy-Authorization` never forwarded (a parent's comes from configuration).
//! Pure functions over `http` types, shared by forwarding and the TLS-terminated leg.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Uri, Version};
use policy::Target;

use crate::route::ForwardProxy;

/// The `Host` value (and absolute-form authority) of `target`: its port omitted when it is
/// `default_port`.
pub(crate) fn host_value(target: &Target, default_port: u16) -> String {
    if target.port == default_port {
        target.host.to_uri_host()
    } else {
        format!("{}:{}", target.host.to_uri_host(), target.port)
    }
}

/// Builds the upstream request of a forwarded `http://` request: origin-form target
/// (absolute-form `http://<canonical host[:port]><path>` when `forward` says the connection
/// goes to an HTTP parent), `Host` from the canonical target, hop-by-hop headers and the
/// client's `Proxy-Authorization` removed (a parent's is added from configuration).
///
/// # Errors
/// A message when the rebuilt target or a header value is not valid.
pub(crate) fn forward_request<B>(
    req: Request<B>,
    target: &Target,
    forward: Option<&ForwardProxy>,
) -> Result<Request<B>, RewriteError> {
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let host = host_value(target, 80);
    let request_target = match forward {
        Some(_) => format!("http://{host}{path}"),
        None => path,
    };
    parts.uri = request_target.parse::<Uri>().map_err(RewriteError::Path)?;
    parts.version = Version::HTTP_11;
    let chunked = is_chunked(&parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    keep_chunked(chunked, &mut parts.headers);
    parts.headers.remove(header::HOST);
    let host = HeaderValue::from_str(&host).map_err(RewriteError::Host)?;
    parts.headers.insert(header::HOST, host);
    if let Some(auth) = forward.and_then(ForwardProxy::authorization) {
        let value = HeaderValue::from_str(&auth).map_err(RewriteError::Credentials)?;
        parts.headers.insert(header::PROXY_AUTHORIZATION, value);
    }
    Ok(Request::from_parts(parts, body))
}

/// Why a forwarded request could not be rebuilt.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RewriteError {
    /// The rebuilt request target.
    #[error("bad request path: {0}")]
    Path(http::uri::InvalidUri),
    /// The `Host` value.
    #[error("bad host: {0}")]
    Host(header::InvalidHeaderValue),
    /// The parent's `Proxy-Authorization` value.
    #[error("bad parent credentials: {0}")]
    Credentials(header::InvalidHeaderValue),
}

/// Whether a request's body is chunked (RFC 9112 section 6.1; the only coding a request
/// reaching here may have).
pub(crate) fn is_chunked(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
}

/// Says again, on an HTTP/1.1 upstream request whose hop-by-hop headers were stripped,
/// that its body is `chunked`: without it hyper would send a `GET` (or `HEAD`) with a body
/// of unknown length as a request with no body, and the client's body would be lost.
pub(crate) fn keep_chunked(chunked: bool, headers: &mut HeaderMap) {
    if chunked {
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
    }
}

/// Removes hop-by-hop headers (RFC 9110 section 7.6.1): those named in `Connection`, and
/// `Connection`, `Keep-Alive`, `Proxy-Connection`, `Proxy-Authenticate`,
/// `Proxy-Authorization`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names finds the fixed fields there (a removal hashes its name;
    // most messages carry one or two of the nine), and only those are removed.
    let fixed = &*HOP_BY_HOP;
    let mut present = 0u16;
    for name in headers.keys() {
        if let Some(i) = fixed.iter().position(|f| f == name) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    if present & 1 != 0 {
        // The fields `Connection` names go first. Its values are cloned (a reference
        // count, no copy) so that the map may change meanwhile, and each name is looked
        // up as text (no allocation; one that is not a field name removes nothing).
        let mut values = headers.get_all(header::CONNECTION).iter();
        let first = values.next().cloned();
        let more: Vec<HeaderValue> = values.cloned().collect();
        for value in first.iter().chain(&more) {
            for name in value.to_str().into_iter().flat_map(|v| v.split(',')) {
                headers.remove(name.trim());
            }
        }
    }
    for (i, name) in fixed.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
}

/// The fixed hop-by-hop fields [`strip_hop_by_hop`] removes, in the order it removes
/// them (`Connection` first); made once (`from_static` checks its name at every call).
static HOP_BY_HOP: std::sync::LazyLock<[HeaderName; 9]> = std::sync::LazyLock::new(|| {
    [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ]
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::target;

    #[test]
    fn hop_by_hop_fields_and_the_ones_connection_names_go() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "close, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic abc"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("x-kept", "yes"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
        let mut none = HeaderMap::new();
        none.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut none);
        assert_eq!(none.len(), 1);
    }

    /// What `strip_hop_by_hop` did before it skipped the fields that are not there: the
    /// same fields go and the rest keep their order.
    #[test]
    fn hop_by_hop_removal_is_the_plain_one() {
        fn plain(headers: &mut HeaderMap) {
            let named: Vec<HeaderName> = headers
                .get_all(header::CONNECTION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
                .collect();
            for name in named.into_iter().chain(HOP_BY_HOP.iter().cloned()) {
                headers.remove(name);
            }
        }
        let fields: &[(&str, &[u8])] = &[
            ("server", b"nginx"),
            ("connection", b"Keep-Alive, X-Hop , , bad name, te"),
            ("x-hop", b"1"),
            ("content-length", b"5"),
            ("connection", b"\xff, x-other"),
            ("x-other", b"2"),
            ("connection", b"x-third"),
            ("x-third", b"3"),
            ("keep-alive", b"timeout=5"),
            ("transfer-encoding", b"chunked"),
            ("te", b"trailers"),
            ("date", b"today"),
            ("proxy-connection", b"close"),
            ("x-last", b"4"),
        ];
        // Every subset of the fields, in their order.
        for mask in 0u32..1 << fields.len() {
            let mut h = HeaderMap::new();
            for (i, (k, v)) in fields.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    h.append(
                        HeaderName::from_static(k),
                        HeaderValue::from_bytes(v).unwrap(),
                    );
                }
            }
            let mut expected = h.clone();
            plain(&mut expected);
            strip_hop_by_hop(&mut h);
            let fields = |h: &HeaderMap| -> Vec<(String, Vec<u8>)> {
                h.iter()
                    .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                    .collect()
            };
            assert_eq!(fields(&h), fields(&expected), "fields {mask:b}");
        }
    }

    #[test]
    fn forwarded_requests_are_rebuilt_from_canonical_values() {
        let req = Request::builder()
            .uri("http://Origin.TEST:8080/a?b=c")
            .header(header::HOST, "other.test")
            .header(header::HOST, "second.test")
            .header(header::PROXY_AUTHORIZATION, "Basic client")
            .body(())
            .unwrap();
        let t = target("origin.test:8080");
        let direct = forward_request(req, &t, None).unwrap();
        assert_eq!(direct.uri(), "/a?b=c");
        assert_eq!(direct.version(), Version::HTTP_11);
        let hosts: Vec<_> = direct.headers().get_all(header::HOST).iter().collect();
        assert_eq!(hosts, ["origin.test:8080"]);
        assert!(direct.headers().get(header::PROXY_AUTHORIZATION).is_none());

        let req = Request::builder().uri("/x").body(()).unwrap();
        let parent = ForwardProxy::basic(String::new(), Some("Basic cGFyZW50".into()));
        let via = forward_request(req, &target("[2001:db8::1]:80"), Some(&parent)).unwrap();
        assert_eq!(via.uri(), "http://[2001:db8::1]/x");
        assert_eq!(via.headers()[header::HOST], "[2001:db8::1]");
        assert_eq!(via.headers()[header::PROXY_AUTHORIZATION], "Basic cGFyZW50");
    }
}
