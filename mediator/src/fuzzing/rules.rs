//! Request rules and credential placeholders: paths, queries and headers judged as the
//! terminated leg judges them, placeholders found however they are encoded.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;

use http::Uri;
use policy::{Grant, Reason, Verdict, parse_authority_form};
use serde_json::Value;

/// The grant the `request_rule` target decides with, as docs/tls.md's examples: rule 1,
/// `GET`/`HEAD` under `/repos/` with only the query parameters `page` and `per_page`;
/// rule 2, `POST` under `/upload/` with a `content-type` of `application/json*` and no
/// query parameter at all.
fn request_rule_grant() -> &'static Grant {
    static GRANT: OnceLock<policy::config::Config> = OnceLock::new();
    let config = GRANT.get_or_init(|| {
        let text = "[tls]\nca_dir = \"/nonexistent/fuzz-ca\"\n\n[[authority]]\nname = \"fuzz\"\nallow = [\"api.test\"]\ntls_terminate = [\"api.test\"]\n\n[[authority.request_rule]]\nhost = \"api.test\"\nmethods = [\"GET\", \"HEAD\"]\npath_prefixes = [\"/repos/\"]\nquery = [\"page\", \"per_page\"]\n\n[[authority.request_rule]]\nhost = \"api.test\"\nmethods = [\"POST\"]\npath_prefixes = [\"/upload/\"]\nheaders = { \"Content-Type\" = \"application/json*\" }\nquery = []\n";
        // The fixture's own text: a failure here is a broken fuzzer, not a finding.
        policy::config::parse(text, "<fuzz>").expect("the request_rule fixture loads")
    });
    &config.authorities[0].grant
}

/// Percent-decodes `text` leniently (the oracle: every `%XX` with two hex digits is
/// its byte, anything else is itself), repeatedly until it no longer changes.
fn decoded_fully(text: &str) -> Vec<u8> {
    let mut cur = text.as_bytes().to_vec();
    for _ in 0..8 {
        let out = decoded_once(&cur);
        if out == cur {
            break;
        }
        cur = out;
    }
    cur
}

/// One lenient percent-decoding of `text` (the oracle's): `%XX` with two hex digits is
/// its byte, anything else is itself.
fn decoded_once(text: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'%'
            && let (Some(h), Some(l)) = (
                text.get(i + 1).copied().and_then(hex),
                text.get(i + 2).copied().and_then(hex),
            )
        {
            // Two hex digits: at most 0xff.
            out.push(u8::try_from(h * 16 + l).unwrap());
            i += 3;
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

/// `%XX` of `b`, in upper- or lowercase hex.
fn escaped(b: u8, upper: bool) -> String {
    if upper {
        format!("%{b:02X}")
    } else {
        format!("%{b:02x}")
    }
}

/// A deterministic stream of bits drawn from the input (FNV-1a, then xorshift), for
/// the re-encodings a target tries.
struct Bits(u64);

impl Bits {
    fn of(data: &[u8]) -> Self {
        let mut h = 0xcbf2_9ce4_8422_2325_u64;
        for &b in data {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Self(h | 1)
    }

    fn next(&mut self) -> bool {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 & 1 == 1
    }
}

/// The headers of a `request_rule` input, as a header map is asked (names in any case).
struct FuzzHeaders(Vec<(String, Vec<u8>)>);

impl policy::HeaderLookup for FuzzHeaders {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        self.0
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
            .collect()
    }
}

/// The decision of [`request_rule_grant`] on one request to `api.test:443`.
fn decide_request(
    method: &str,
    path: &str,
    query: Option<&str>,
    headers: &FuzzHeaders,
) -> policy::Decision {
    let host = parse_authority_form("api.test:443").expect("a fixed target");
    let facts = policy::RequestFacts::new(method, path)
        .with_query(query)
        .with_headers(headers);
    request_rule_grant().decide_request(&host, &facts)
}

/// The query parameter names of `query` (the part of each `&`-piece before `=`), raw.
fn raw_query_names(query: &str) -> impl Iterator<Item = &str> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').map_or(p, |(n, _)| n))
}

/// Request rules on method, path, headers and query names (`Grant::decide_request`, with
/// [`request_rule_grant`]). The input is UTF-8 lines: the first is a method, a space and
/// the request target (path, optionally `?query`); each further line is a header,
/// `name: value`. Properties:
/// - an allowed request is what one of the two rules allows: `GET`/`HEAD` under
///   `/repos/` whose every query parameter name, however often percent-decoded, is
///   `page` or `per_page`; or `POST` under `/upload/` without query parameters, with at
///   least one `content-type` and every one starting with `application/json`;
/// - an allowed request stays allowed, by the same rule, when its path and query names
///   are spelt otherwise with the same canonical form (unreserved path bytes and name
///   bytes percent-encoded, in upper- or lowercase hex; escapes decoded);
/// - an allowed request whose query name is encoded twice (`%2570`) is refused as
///   `malformed_target`.
pub fn request_rule(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let Some((method, target)) = lines.next().unwrap_or_default().split_once(' ') else {
        return;
    };
    let headers = FuzzHeaders(
        lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_owned(), v.trim().as_bytes().to_vec()))
            .collect(),
    );
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let d = decide_request(method, path, query, &headers);
    if d.verdict != Verdict::Allow {
        return;
    }
    let names: Vec<Vec<u8>> = raw_query_names(query.unwrap_or_default())
        .map(|n| decoded_fully(&n.replace('+', " ")))
        .collect();
    match d.rule.as_deref() {
        Some("request_rule[1] api.test") => {
            assert!(method == "GET" || method == "HEAD", "{method:?} allowed");
            assert!(
                decoded_once(path.as_bytes()).starts_with(b"/repos/"),
                "{path:?} allowed"
            );
            for name in &names {
                assert!(
                    name == b"page" || name == b"per_page",
                    "query name {:?} allowed in {query:?}",
                    String::from_utf8_lossy(name)
                );
            }
        }
        Some("request_rule[2] api.test") => {
            assert_eq!(method, "POST");
            assert!(
                decoded_once(path.as_bytes()).starts_with(b"/upload/"),
                "{path:?} allowed"
            );
            assert!(names.is_empty(), "query {query:?} allowed");
            let types = policy::HeaderLookup::values(&headers, "content-type");
            assert!(!types.is_empty(), "no content-type allowed");
            for t in types {
                assert!(t.starts_with(b"application/json"), "content-type {t:?}");
            }
        }
        other => panic!("allowed by {other:?}"),
    }
    let mut bits = Bits::of(data);
    for _ in 0..4 {
        let upper = bits.next();
        let path2 = respelt_path(path, &mut bits, upper);
        let query2 = query.map(|q| respelt_query(q, &mut bits, upper));
        let again = decide_request(method, &path2, query2.as_deref(), &headers);
        assert_eq!(
            (again.verdict, again.rule.as_deref()),
            (Verdict::Allow, d.rule.as_deref()),
            "{method} {path}?{query:?} allowed, {path2}?{query2:?} not"
        );
    }
    // A name encoded twice: its first byte (or the `%` of its first escape) as `%25`.
    if let Some(q) = query
        && let Some(first) = q.split('&').position(|p| !p.is_empty())
    {
        let pieces: Vec<String> = q
            .split('&')
            .enumerate()
            .map(|(i, p)| match (i == first, p.strip_prefix('%')) {
                (false, _) => p.to_owned(),
                (true, Some(rest)) => format!("%25{rest}"),
                (true, None) => format!("%25{:02X}{}", p.as_bytes()[0], &p[1..]),
            })
            .collect();
        let twice = pieces.join("&");
        let refused = decide_request(method, path, Some(&twice), &headers);
        assert_eq!(refused.reason, Reason::MalformedTarget, "{twice:?}");
    }
}

/// `path` (one that normalises) spelt otherwise: decoded, then each letter, digit,
/// `-`, `_` and `~` percent-encoded as the bits say.
fn respelt_path(path: &str, bits: &mut Bits, upper: bool) -> String {
    let mut out = String::new();
    for b in decoded_once(path.as_bytes()) {
        if (b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~')) && bits.next() {
            out.push_str(&escaped(b, upper));
        } else {
            out.push(char::from(b));
        }
    }
    out
}

/// `query` (one whose names decode) with each name decoded, then each of its bytes
/// percent-encoded as the bits say; values unchanged.
fn respelt_query(query: &str, bits: &mut Bits, upper: bool) -> String {
    let pieces: Vec<String> = query
        .split('&')
        .map(|piece| {
            let (name, value) = match piece.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (piece, None),
            };
            let mut out = String::new();
            for b in decoded_once(name.as_bytes()) {
                if bits.next() {
                    out.push_str(&escaped(b, upper));
                } else {
                    out.push(char::from(b));
                }
            }
            if let Some(v) = value {
                out.push('=');
                out.push_str(v);
            }
            out
        })
        .collect();
    pieces.join("&")
}

/// `bytes` percent-encoded once (RFC 3986 section 2.1) as `choose` says for each byte,
/// `%` always (a once-encoded text holds no bare `%`); uppercase hex when `upper`.
fn percent_encoded(bytes: &[u8], mut choose: impl FnMut() -> bool, upper: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() * 3);
    for &b in bytes {
        if b == b'%' || choose() {
            out.extend_from_slice(escaped(b, upper).as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

/// Whether `needle` occurs in `text` as sent or after one or two percent-decodings (the
/// oracle: every level, each decoding as lenient as the mediator's).
fn occurs_decoded(text: &[u8], needle: &[u8]) -> bool {
    let once = decoded_once(text);
    let twice = decoded_once(&once);
    [text, &once, &twice]
        .iter()
        .any(|t| t.windows(needle.len()).any(|w| w == needle))
}

/// The credential placeholder search (`credential::check_plain`, `credential::apply`) and
/// its percent-decoder (`credential::percent_decode`), against an authority whose one
/// credential (`Authorization` for `api.test`) has the input's placeholder. The input is
/// lines: the placeholder (8 to 256 bytes of visible ASCII, else the input only feeds the
/// decoder), a prefix, a suffix, then the encoding: its first byte's value modulo 3 is how
/// often the placeholder is percent-encoded (0, 1 or 2 times), its bits which bytes are
/// (cycled; a `%` always is), its first byte's bit 7 the hex case. The text
/// `prefix + encoded placeholder + suffix` is sent in an `x-other` header and in the query
/// (`/x?k=...`). Properties:
/// - decoding never makes a text longer;
/// - the placeholder is found (`credential_misuse`, for a plain request and for a
///   terminated one to its own host) wherever it occurs as sent or once or twice
///   percent-decoded, and only there; built without a `%` around it, it always occurs.
pub fn placeholder(data: &[u8]) {
    assert!(
        crate::credential::percent_decode(data)
            .iter()
            .all(|d| d.len() <= data.len())
    );
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.splitn(4, '\n');
    let (placeholder, prefix, suffix, how) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default().as_bytes(),
    );
    if !(8..=256).contains(&placeholder.len()) || !placeholder.bytes().all(|b| b.is_ascii_graphic())
    {
        return;
    }
    let levels = how.first().map_or(0, |b| b % 3);
    let upper = how.first().is_some_and(|b| b & 0x80 != 0);
    let mask = how.get(1..).unwrap_or_default();
    let mut k = 0usize;
    let mut choose = || {
        let b = !mask.is_empty() && mask[(k / 8) % mask.len()] >> (k % 8) & 1 == 1;
        k += 1;
        b
    };
    let mut encoded = placeholder.as_bytes().to_vec();
    for _ in 0..levels {
        encoded = percent_encoded(&encoded, &mut choose, upper);
    }
    let sent = [prefix.as_bytes(), &encoded, suffix.as_bytes()].concat();
    if !prefix.contains('%') && !suffix.contains('%') {
        assert!(occurs_decoded(&sent, placeholder.as_bytes()), "{sent:?}");
    }
    let toml = format!(
        "[tls]\nca_dir = \"/nonexistent/fuzz-ca\"\n\n[[authority]]\nname = \"fuzz\"\nallow = [\"api.test\", \"other.test\"]\ntls_terminate = [\"api.test\", \"other.test\"]\n\n[[authority.credential]]\nhost = \"api.test\"\nheader = \"Authorization\"\nsecret_env = \"UNUSED\"\nplaceholder = {}\n",
        Value::String(placeholder.to_owned())
    );
    let Ok(mut config) = policy::config::parse(&toml, "<fuzz>") else {
        return;
    };
    let mut authority = config.authorities.remove(0);
    authority.credentials[0]
        .set_secret(b"fuzz-secret-value".to_vec())
        .expect("a fixed secret");
    let target = parse_authority_form("api.test:443").expect("a fixed target");
    let misuse = |uri: &Uri, headers: &http::HeaderMap| {
        let plain = crate::credential::check_plain(&authority, &target, uri, headers);
        let mut terminated = headers.clone();
        let applied = crate::credential::apply(&authority, &target, uri, &mut terminated);
        let refused = |r: Option<Reason>| r == Some(Reason::CredentialMisuse);
        let (a, b) = (
            refused(plain.err().map(|d| d.reason)),
            refused(applied.err().map(|d| d.reason)),
        );
        assert_eq!(a, b, "plain and terminated disagree");
        a
    };
    let bare: Uri = "/x".parse().expect("a fixed path");
    if let Ok(value) = http::HeaderValue::from_bytes(&sent) {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-other", value);
        let found = misuse(&bare, &headers);
        let occurs = occurs_decoded(&sent, placeholder.as_bytes());
        assert_eq!(
            found,
            occurs,
            "x-other: {:?}",
            String::from_utf8_lossy(&sent)
        );
    }
    if let Ok(uri) = format!("/x?k={}", String::from_utf8_lossy(&sent)).parse::<Uri>() {
        let found = misuse(&uri, &http::HeaderMap::new());
        let occurs = occurs_decoded(uri.to_string().as_bytes(), placeholder.as_bytes());
        assert_eq!(found, occurs, "{uri}");
    }
}
