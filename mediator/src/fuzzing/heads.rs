//! HTTP on the wire: the first head and its target, Basic credentials, protocol
//! switches, HTTP/2 resets, a parent's Negotiate offer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use http::Uri;

use crate::front::http::credentials::parse_basic;
use crate::front::http::forward::target_of;
use crate::request::preflight::{Head, MIN_BUF, Preflight, judge};

use super::{canonical_target, connect_target};

/// The first request head of a connection (`preflight::judge`), and the target the
/// CONNECT or forwarding front-end takes from it. Properties: the bytes are handed on
/// unchanged; an incomplete head is never longer than the limit; a rejected head's label
/// is printable ASCII; a target, once parsed, is canonical (its text parses back
/// to it).
pub fn http_head(data: &[u8]) {
    match judge(data.to_vec(), MIN_BUF) {
        Err(buf) => {
            assert_eq!(buf, data);
            assert!(buf.len() <= MIN_BUF);
        }
        Ok(Preflight::Closed) => panic!("judge never answers Closed"),
        Ok(Preflight::Reject { label, .. }) => {
            let host = label.host.unwrap_or_default();
            assert!(host.bytes().all(|b| (0x20..0x7f).contains(&b)), "{host:?}");
        }
        Ok(Preflight::Pass(Head::Connect {
            buf,
            head_len,
            target,
            ..
        })) => {
            assert_eq!(buf, data);
            assert!(head_len <= buf.len() && head_len <= MIN_BUF);
            let uri = target.parse::<Uri>().expect("the preflight parsed it");
            if let Some(Ok(t)) = connect_target(&uri) {
                canonical_target(&t);
            }
        }
        Ok(Preflight::Pass(Head::Other(buf))) => {
            assert_eq!(buf, data);
            let mut headers = [httparse::EMPTY_HEADER; 100];
            let mut req = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(_)) = req.parse(&buf)
                && let Some(Ok(uri)) = req.path.map(str::parse::<Uri>)
                && uri.scheme_str() == Some("http")
                && let Ok(t) = target_of(&uri)
            {
                canonical_target(&t);
            }
        }
    }
}

/// `Proxy-Authorization: Basic` values (`credentials::parse_basic`). The input is the
/// header value. Properties: the name holds no `:` (the first one splits), and encoding
/// the pair again gives the same pair.
pub fn basic(data: &[u8]) {
    let Some((name, token)) = parse_basic(data) else {
        return;
    };
    assert!(!name.contains(':'), "{name:?}");
    let mut pair = name.clone().into_bytes();
    pair.push(b':');
    pair.extend_from_slice(&token);
    let again = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(&pair)
    );
    assert_eq!(parse_basic(again.as_bytes()), Some((name, token)));
}

/// `s` without the optional whitespace of RFC 9110 section 5.6.3 (`OWS`: spaces and
/// horizontal tabs) at either end.
fn ows_trimmed(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = s.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(a), Some(b)) => &s[a..=b],
        _ => &[],
    }
}

/// The non-empty elements of the comma-separated lists `values` (RFC 9110 section 5.6.1),
/// each without its `OWS`.
fn list_elements<'a>(values: &[&'a [u8]]) -> Vec<&'a [u8]> {
    values
        .iter()
        .flat_map(|v| v.split(|&b| b == b','))
        .map(ows_trimmed)
        .filter(|t| !t.is_empty())
        .collect()
}

/// The protocol switch a terminated request asks for (`terminate::upgrade::requested`). The
/// input's first byte holds flags: bit 0 the version (0: HTTP/1.1, 1: HTTP/2), bit 1 the
/// method (0: `GET`, 1: `CONNECT`), bit 2 whether a `:protocol` is given; the rest is
/// lines: the `:protocol` value when given, then the `Connection` value (an empty line:
/// no `Connection`), then one `Upgrade` value per line (a line that is no header value is
/// skipped). Properties: no switch exactly when there is neither `:protocol` nor an
/// `Upgrade` field and the method is `GET`; an HTTP/1.1 upgrade only for a `GET` whose
/// `Upgrade` list (RFC 9110 section 7.8) holds one protocol (a token, optionally `/` and
/// a version token) other than `h2c`, with `upgrade` in its `Connection` list, and the switch names that
/// token (websocket exactly when it is `websocket` in any case, RFC 6455 section 4.2.1);
/// an extended CONNECT (RFC 8441) only for an HTTP/2 `CONNECT` with a `:protocol` and no
/// `Upgrade`; a refusal's detail holds no control character.
pub fn upgrade(data: &[u8]) {
    use crate::terminate::upgrade::Via;
    use http::header::{CONNECTION, HeaderMap, HeaderValue, UPGRADE};
    use policy::UpgradeToken;
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let version = if flags & 1 == 0 {
        http::Version::HTTP_11
    } else {
        http::Version::HTTP_2
    };
    let method = if flags & 2 == 0 {
        http::Method::GET
    } else {
        http::Method::CONNECT
    };
    let mut lines = rest.split(|&b| b == b'\n');
    let protocol = if flags & 4 == 0 {
        None
    } else {
        Some(lines.next().unwrap_or_default())
    };
    let mut headers = HeaderMap::new();
    let mut connection = Vec::new();
    if let Some(line) = lines.next().filter(|l| !l.is_empty())
        && let Ok(v) = HeaderValue::from_bytes(line)
    {
        headers.append(CONNECTION, v);
        connection.push(line);
    }
    let mut upgrades = Vec::new();
    for line in lines {
        if let Ok(v) = HeaderValue::from_bytes(line) {
            headers.append(UPGRADE, v);
            upgrades.push(line);
        }
    }
    let answer = crate::terminate::upgrade::requested(&method, &headers, version, protocol);
    let protocols = list_elements(&upgrades);
    match &answer {
        Ok(None) => assert!(
            upgrades.is_empty() && protocol.is_none() && method == http::Method::GET,
            "{method} {upgrades:?} {protocol:?} is no switch"
        ),
        Ok(Some(switch)) if switch.via == Via::Upgrade => {
            let [one] = protocols.as_slice() else {
                panic!("{upgrades:?} is one protocol");
            };
            assert!(version == http::Version::HTTP_11 && method == http::Method::GET);
            assert!(protocol.is_none());
            assert!(
                list_elements(&connection)
                    .iter()
                    .any(|t| t.eq_ignore_ascii_case(b"upgrade")),
                "Connection {connection:?}"
            );
            // protocol-name ["/" protocol-version], each a token (RFC 9110 section 7.8).
            let parts: Vec<&[u8]> = one.splitn(2, |&b| b == b'/').collect();
            assert!(
                parts
                    .iter()
                    .all(|p| !p.is_empty() && p.iter().all(|&b| is_tchar(b))),
                "{one:?} is a protocol"
            );
            assert!(switch.token != UpgradeToken::H2c);
            assert!(switch.token.as_str().as_bytes().eq_ignore_ascii_case(one));
            assert_eq!(
                switch.token == UpgradeToken::WebSocket,
                one.eq_ignore_ascii_case(b"websocket")
            );
        }
        Ok(Some(switch)) => {
            assert!(version == http::Version::HTTP_2 && method == http::Method::CONNECT);
            assert!(upgrades.is_empty(), "{upgrades:?} beside :protocol");
            let given = protocol.unwrap_or_default();
            assert!(switch.token.as_str().as_bytes().eq_ignore_ascii_case(given));
            assert!(switch.token != UpgradeToken::H2c);
        }
        Err(detail) => {
            assert!(
                !detail.to_string().chars().any(char::is_control),
                "{detail:?}"
            );
        }
    }
}

/// The frame scan of the terminated leg's HTTP/2 server output
/// (`terminate::h2_resets`). The input's first byte is the write size (0 counts as 1); the
/// rest is the byte stream, as if the server had written it. Properties: the refusals
/// found do not depend on how the stream is split into writes, and the resets among them
/// are exactly those of an independent walk of the frames (RFC 9113 section 4.1: 9-byte
/// headers, a 24-bit length; a complete `RST_STREAM`, type 0x3, of length 4 whose error
/// code is `PROTOCOL_ERROR`, 0x1, or `REFUSED_STREAM`, 0x7).
pub fn h2_resets(data: &[u8]) {
    use crate::terminate::h2_resets::{Refusal, resets_in};
    let Some((&step, bytes)) = data.split_first() else {
        return;
    };
    let found = resets_in(bytes, usize::from(step));
    assert_eq!(found, resets_in(bytes, bytes.len()));
    let mut expected = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let Some(payload) = rest.get(9..9 + len) else {
            break;
        };
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
        if rest[3] == 0x3 && len == 4 {
            match u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) {
                1 => expected.push(Refusal::Malformed(stream)),
                7 => expected.push(Refusal::Refused(stream)),
                _ => {}
            }
        }
        rest = &rest[9 + len..];
    }
    let resets: Vec<Refusal> = found
        .into_iter()
        .filter(|r| !matches!(r, Refusal::TooLarge(_)))
        .collect();
    assert_eq!(resets, expected);
}

/// An RFC 9110 section 5.6.2 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A parent proxy's `Proxy-Authenticate` offers, as the Negotiate exchange reads them
/// (`route::handshake::negotiate_in`, `offered_in`; `route::negotiate::decode`). The input
/// is UTF-8 lines, one challenge per line. Properties:
/// - a Negotiate token is taken exactly from the first challenge whose auth-scheme
///   (RFC 9110 section 11.6.1: up to the first space, `OWS` trimmed) is `Negotiate` in
///   any case (RFC 4559 section 4), the rest without its `OWS`;
/// - a token that decodes is canonical base64 (RFC 4648 section 4): encoding the bytes
///   again gives the token;
/// - the offered schemes, for messages, are printable ASCII and name Negotiate whenever
///   it was offered.
pub fn negotiate_offer(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let challenges: Vec<&str> = text.split('\n').collect();
    let offer = crate::route::handshake::negotiate_in(challenges.iter().copied());
    let want = challenges.iter().find_map(|c| {
        let v = ows_trimmed(c.as_bytes());
        let (scheme, rest) = match v.iter().position(|&b| b == b' ') {
            Some(at) => (&v[..at], ows_trimmed(&v[at..])),
            None => (v, &[][..]),
        };
        scheme.eq_ignore_ascii_case(b"negotiate").then_some(rest)
    });
    assert_eq!(offer.map(str::as_bytes), want, "{challenges:?}");
    if let Some(token) = offer
        && let Some(bytes) = crate::route::negotiate::decode(token)
    {
        assert_eq!(
            base64::engine::general_purpose::STANDARD.encode(&bytes),
            token
        );
    }
    let offered = crate::route::handshake::offered_in(challenges.iter().copied());
    assert!(
        offered.bytes().all(|b| (0x20..0x7f).contains(&b)),
        "{offered:?}"
    );
    if offer.is_some() {
        assert!(
            offered.to_ascii_lowercase().contains("negotiate"),
            "{offered:?}"
        );
    }
}
