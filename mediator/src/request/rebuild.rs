//! The upstream request of a terminated one, rebuilt from canonical values: hop-by-hop
//! headers removed, the target in the form the upstream's HTTP version wants. Pure: no
//! I/O.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Uri, Version};
use policy::Target;

use super::rewrite::{host_value, is_chunked, keep_chunked, strip_hop_by_hop};

/// What the rebuilt requests of one tunnel take from its target, made once per tunnel:
/// the canonical `host[:port]` (the port when it is not 443) and its `Host` value.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    authority: String,
    /// `None` when the authority is no header value (then each rebuild fails, saying why).
    host: Option<HeaderValue>,
}

impl Origin {
    /// The origin of the tunnel to `target`.
    pub(crate) fn of(target: &Target) -> Self {
        let authority = host_value(target, 443);
        let host = HeaderValue::from_str(&authority).ok();
        Self { authority, host }
    }
}

/// The upstream request: hop-by-hop headers removed (keeping `TE: trailers` for HTTP/2,
/// which gRPC needs), the target rebuilt from canonical values (`origin`'s): origin-form
/// with a `Host` header for HTTP/1.1, an absolute URI (hence `:authority`) without `Host`
/// for HTTP/2.
pub(crate) fn rebuild<B>(
    req: Request<B>,
    origin: &Origin,
    version: Version,
) -> Result<Request<B>, RebuildError> {
    let (mut parts, body) = req.into_parts();
    let te_trailers = parts
        .headers
        .get(header::TE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    let chunked = is_chunked(&parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    let authority = &origin.authority;
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    parts.version = version;
    if version == Version::HTTP_2 {
        parts.uri = format!("https://{authority}{}", path.as_str())
            .parse::<Uri>()
            .map_err(RebuildError::Target)?;
        if te_trailers {
            parts
                .headers
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
    } else {
        parts.uri = origin_form(path)?;
        let host = match &origin.host {
            Some(host) => host.clone(),
            None => HeaderValue::from_str(authority).map_err(RebuildError::Host)?,
        };
        parts.headers.insert(header::HOST, host);
        keep_chunked(chunked, &mut parts.headers);
    }
    remove_h2_forbidden(&mut parts.headers);
    Ok(Request::from_parts(parts, body))
}

/// The origin-form target of `path`: what parsing its text gives (the path parsed
/// already when it starts with `/`: the same parser made it, so it is taken as it is).
fn origin_form(path: PathAndQuery) -> Result<Uri, RebuildError> {
    if path.as_str().starts_with('/') {
        let mut parts = http::uri::Parts::default();
        parts.path_and_query = Some(path.clone());
        if let Ok(uri) = Uri::from_parts(parts) {
            return Ok(uri);
        }
    }
    path.as_str().parse::<Uri>().map_err(RebuildError::Target)
}

/// Why a request could not be rebuilt (the detail of its `400`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RebuildError {
    #[error("bad request target: {0}")]
    Target(http::uri::InvalidUri),
    #[error("bad host: {0}")]
    Host(header::InvalidHeaderValue),
}

/// Connection-specific headers that HTTP/2 forbids (RFC 9113 section 8.2.2) and that
/// `strip_hop_by_hop` may not know by name.
fn remove_h2_forbidden(headers: &mut HeaderMap) {
    headers.remove(HeaderName::from_static("proxy-connection"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        policy::parse_authority_form("api.example.com:443").unwrap()
    }

    fn client_request() -> Request<()> {
        Request::builder()
            .uri("https://API.example.com/v1/x?q=1")
            .header(header::HOST, "api.example.com")
            .header(header::CONNECTION, "keep-alive, x-drop")
            .header("x-drop", "1")
            .header("proxy-connection", "keep-alive")
            .header(header::TE, "trailers")
            .header("x-keep", "2")
            .body(())
            .unwrap()
    }

    #[test]
    fn http1_gets_origin_form_and_a_host_header_from_canonical_values() {
        let r = rebuild(client_request(), &Origin::of(&target()), Version::HTTP_11).unwrap();
        assert_eq!(r.version(), Version::HTTP_11);
        assert_eq!(r.uri().to_string(), "/v1/x?q=1");
        assert_eq!(r.headers()[header::HOST], "api.example.com");
        for gone in ["connection", "x-drop", "proxy-connection", "te"] {
            assert!(!r.headers().contains_key(gone), "{gone} kept");
        }
        assert_eq!(r.headers()["x-keep"], "2");
    }

    /// The origin-form target is what parsing the path and query gives, for every form
    /// a client's target takes.
    #[test]
    fn the_origin_form_is_the_parsed_path() {
        for uri in [
            "/",
            "/v1/x?q=1",
            "/a%20b/../c?d=e&f#g",
            "/?",
            "*",
            "https://api.example.com",
            "https://api.example.com?x",
            "api.example.com:443",
        ] {
            let req = Request::builder().uri(uri).body(()).unwrap();
            let text = req
                .uri()
                .path_and_query()
                .map_or("/", |pq| pq.as_str())
                .to_owned();
            let r = rebuild(req, &Origin::of(&target()), Version::HTTP_11);
            match text.parse::<Uri>() {
                Ok(parsed) => assert_eq!(r.unwrap().uri(), &parsed, "{uri}"),
                Err(_) => assert!(matches!(r, Err(RebuildError::Target(_))), "{uri}"),
            }
        }
    }

    #[test]
    fn http2_gets_an_absolute_uri_no_host_and_keeps_te_trailers() {
        let r = rebuild(client_request(), &Origin::of(&target()), Version::HTTP_2).unwrap();
        assert_eq!(r.version(), Version::HTTP_2);
        assert_eq!(r.uri().to_string(), "https://api.example.com/v1/x?q=1");
        assert!(!r.headers().contains_key(header::HOST));
        assert_eq!(r.headers()[header::TE], "trailers");
        assert!(!r.headers().contains_key("proxy-connection"));
        // Only `TE: trailers` survives.
        let mut other = client_request();
        other
            .headers_mut()
            .insert(header::TE, HeaderValue::from_static("gzip"));
        let r = rebuild(other, &Origin::of(&target()), Version::HTTP_2).unwrap();
        assert!(!r.headers().contains_key(header::TE));
    }
}
