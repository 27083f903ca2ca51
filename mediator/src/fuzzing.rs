//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz), one function per target,
//! each taking the fuzzer's bytes: the parsers that face untrusted input, called exactly
//! as the mediator calls them, plus the properties each must keep. A function returns
//! quietly for every input; a panic (a parser's, or a broken property's `assert!`) is a
//! finding.
//!
//! Compiled with the cargo feature `fuzzing` (the fuzz crate enables it) and in this
//! crate's own tests, which replay every file of `fuzz/corpus/<target>/` through the
//! same function, so that the checked-in corpus runs in `cargo test` on the stable
//! toolchain. Not a public API: nothing else may use it.
//!
//! Never does I/O beyond in-memory pipes (`tokio::io::duplex`): no socket, no file, no
//! name resolution.

// Harness code: a setup failure or a broken property must panic, that is how the fuzzer
// (and the replay test) sees it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use http::Uri;
use policy::{
    CanonicalHost, EntryKind, Grant, GrantSpec, Reason, Target, Verdict, canonicalize_host,
    check_entry, parse_authority_form,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::authorities::Origin;
use crate::conn::Ctx;
use crate::control::Control;
use crate::decision_log::Peer;
use crate::front::http::credentials::parse_basic;
use crate::front::http::forward::target_of;
use crate::front::http::preflight::{Head, MIN_BUF, Preflight, judge};
use crate::front::socks::handshake;
use crate::route::pac::answer::{PacEntry, parse_pac_answer};
use crate::shared::{Shared, for_tests};
use crate::sni::{Hello, MAX_HELLO, inspect};

/// The name of the one authority of the fuzzing mediator (TCP credential
/// `agent-a:secret`; the SOCKS5 seeds carry it).
pub const AUTHORITY: &str = "agent-a";
/// The token of [`AUTHORITY`].
pub const TOKEN: &str = "secret";

/// One fuzz target: it takes the fuzzer's bytes and panics on a finding.
pub type FuzzTarget = fn(&[u8]);

/// The fuzz targets: every name has a function here, a cargo-fuzz binary in
/// `fuzz/fuzz_targets/<name>.rs` and a corpus in `fuzz/corpus/<name>/`.
pub const TARGETS: &[(&str, FuzzTarget)] = &[
    ("host", host),
    ("pattern", pattern),
    ("http_head", http_head),
    ("basic", basic),
    ("socks5", socks5),
    ("client_hello", client_hello),
    ("pac_answer", pac_answer),
    ("config", config),
    ("admin_json", admin_json),
    ("request_rule", request_rule),
    ("upgrade", upgrade),
    ("placeholder", placeholder),
    ("suggest", suggest),
    ("negotiate_offer", negotiate_offer),
    ("kioslaverc", kioslaverc),
    ("h2_resets", h2_resets),
];

/// Host canonicalisation (`policy::canonicalize_host`). Properties:
/// - idempotent: the canonical text (and its URI form) canonicalises to itself;
/// - a host that canonicalises to X is decided exactly as X at every front door: the
///   authority-form target (CONNECT, a PAC answer), the CONNECT request target and the
///   absolute-form `http://` URI (when `http::Uri` takes the spelling at all) all give the
///   target X, never another host;
/// - a grant entry written in that spelling and one written as X decide the same, and
///   as a deny entry it always denies X.
///
/// The input is the host, as UTF-8.
pub fn host(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(x) = canonicalize_host(raw) else {
        return;
    };
    for text in [x.as_text(), x.to_uri_host()] {
        assert_eq!(canonicalize_host(&text).ok(), Some(x.clone()), "{text:?}");
    }
    // A bare IPv6 literal needs brackets before a port; every other spelling is as sent.
    let bracketed = if raw.contains(':') && !raw.starts_with('[') {
        format!("[{raw}]")
    } else {
        raw.to_owned()
    };
    for port in [80, 443] {
        let want = Target {
            host: x.clone(),
            port,
        };
        let authority_form = format!("{bracketed}:{port}");
        assert_eq!(
            parse_authority_form(&authority_form).ok(),
            Some(want.clone()),
            "{authority_form:?}"
        );
        if let Ok(uri) = authority_form.parse::<Uri>()
            && let Some(t) = connect_target(&uri)
        {
            assert_eq!(t.ok(), Some(want.clone()), "CONNECT {authority_form:?}");
        }
        let url = format!("http://{authority_form}/");
        if let Ok(uri) = url.parse::<Uri>() {
            assert_eq!(target_of(&uri).ok(), Some(want.clone()), "{url:?}");
        }
    }
    decided_alike(raw, &x);
}

/// A grant entry in the spelling `raw` and one in the canonical spelling of `x` decide
/// alike (verdict and reason) on `x` and the names around it; as a deny entry `raw` denies
/// `x` on every port.
fn decided_alike(raw: &str, x: &CanonicalHost) {
    let grant = |allow: &str, deny: &[&str]| {
        Grant::new(
            &GrantSpec {
                name: "fuzz".into(),
                allow: vec![allow.to_owned()],
                deny: deny.iter().map(|d| (*d).to_owned()).collect(),
                ..GrantSpec::default()
            },
            &[],
        )
    };
    // A bare IPv6 entry is written without brackets; a bracketed one is one too.
    let Ok(as_sent) = grant(raw, &[]) else {
        return;
    };
    let canonical = grant(&x.to_uri_host(), &[]).expect("the canonical spelling loads");
    let mut probes = vec![x.clone()];
    if let Some(name) = x.name() {
        for around in [format!("a.{name}"), format!("a-{name}")] {
            if let Ok(h) = canonicalize_host(&around) {
                probes.push(h);
            }
        }
    }
    for host in probes {
        for port in [1, 443] {
            let t = Target {
                host: host.clone(),
                port,
            };
            let (a, b) = (as_sent.decide(&t), canonical.decide(&t));
            assert_eq!(
                (a.verdict, a.reason),
                (b.verdict, b.reason),
                "{raw:?} on {t}"
            );
        }
    }
    let denying = grant("*.example.com", &[raw]).expect("an allow entry is a deny entry too");
    for port in [1, 443, 65535] {
        let t = Target {
            host: x.clone(),
            port,
        };
        assert_eq!(
            denying.decide(&t).reason,
            Reason::DeniedByRule,
            "{raw:?} on {t}"
        );
    }
}

/// The target of a CONNECT request whose request target parsed as `uri`, as the CONNECT
/// front-end takes it (authority-form only), or `None` when it is not authority-form.
fn connect_target(uri: &Uri) -> Option<Result<Target, policy::PolicyError>> {
    match uri.authority() {
        Some(a) if uri.scheme().is_none() && uri.path_and_query().is_none() => {
            Some(parse_authority_form(a.as_str()))
        }
        _ => None,
    }
}

/// Host patterns (grant entries). The input is UTF-8 lines: the first is the entry, the
/// others are targets (`host:port`). Properties: checking an entry alone agrees with
/// loading it in a grant; an allow entry is also a valid deny entry; a grant that allows a
/// target names the entry as its rule, and the same entry as a deny rule then denies it
/// (deny beats allow).
pub fn pattern(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let entry = lines.next().unwrap_or_default();
    let spec = |allow: &[&str], deny: &[&str]| GrantSpec {
        name: "fuzz".into(),
        allow: allow.iter().map(|a| (*a).to_owned()).collect(),
        deny: deny.iter().map(|d| (*d).to_owned()).collect(),
        ..GrantSpec::default()
    };
    let as_allow = Grant::new(&spec(&[entry], &[]), &[]);
    let as_deny = Grant::new(&spec(&["*.example.com"], &[entry]), &[]);
    assert_eq!(
        check_entry(EntryKind::Allow, entry).is_ok(),
        as_allow.is_ok()
    );
    assert_eq!(check_entry(EntryKind::Deny, entry).is_ok(), as_deny.is_ok());
    let _ = check_entry(EntryKind::AllowPrivate, entry);
    let Ok(allowing) = as_allow else {
        return;
    };
    assert!(as_deny.is_ok(), "allow entry {entry:?} is no deny entry");
    assert_eq!(allowing.allow_entries().collect::<Vec<_>>(), [entry]);
    let both = Grant::new(&spec(&[entry], &[entry]), &[]).expect("loads as both");
    for line in lines {
        let Ok(t) = parse_authority_form(line) else {
            continue;
        };
        let d = allowing.decide(&t);
        if d.verdict == Verdict::Allow {
            assert_eq!(d.rule.as_deref(), Some(entry));
            let denied = both.decide(&t);
            assert_eq!(denied.reason, Reason::DeniedByRule, "{entry:?} on {t}");
            assert_eq!(denied.rule.as_deref(), Some(entry));
        }
    }
}

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

/// `t`'s text parses back to `t`.
fn canonical_target(t: &Target) {
    assert_eq!(
        parse_authority_form(&t.to_string()).ok().as_ref(),
        Some(t),
        "{t}"
    );
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

/// The SOCKS5 handshake (RFC 1928 greeting and request, RFC 1929 authentication), driven
/// over an in-memory pipe against a mediator with one authority, [`AUTHORITY`] (token
/// [`TOKEN`]). The input's first byte picks the channel (even: the shared TCP listener,
/// odd: the authority's Unix socket); the rest is what the client sends, then EOF.
/// Properties: the handshake ends (an early EOF is an error, never a wait); a target comes
/// back only for an identified connection, canonical and with a port; on the TCP listener
/// only after the right credential.
pub fn socks5(data: &[u8]) {
    let Some((&channel, sent)) = data.split_first() else {
        return;
    };
    let on_unix = channel & 1 == 1;
    let fx = fixture();
    let authority = on_unix.then(|| Arc::clone(&fx.authority));
    let mut ctx = Ctx::new(
        fx.shared.next_id(),
        Peer::Embedded,
        authority,
        fx.shared.limiter.admit(
            0,
            crate::limits::Door::Channel,
            &tokio_util::sync::CancellationToken::new(),
            || {},
        ),
    );
    let outcome = fx.runtime.block_on(async {
        use tokio::io::AsyncWriteExt;
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        client.write_all(sent).await.expect("fits the pipe");
        // EOF after the input; the client's end stays open, so the replies fit.
        client.shutdown().await.expect("in-memory pipe");
        let shake = handshake(&mut server, &fx.shared, &mut ctx);
        tokio::time::timeout(Duration::from_secs(10), shake)
            .await
            .expect("the handshake ends once the input is read")
    });
    if let Ok(Some(target)) = outcome {
        assert_ne!(target.port, 0);
        canonical_target(&target);
        assert_eq!(ctx.authority_name(), Some(AUTHORITY));
        if !on_unix {
            let user_pass = [&[1, 7][..], AUTHORITY.as_bytes(), &[6], TOKEN.as_bytes()].concat();
            assert!(
                sent.windows(user_pass.len()).any(|w| w == user_pass),
                "a target without the credential"
            );
        }
    }
    fx.forget();
}

/// A TLS ClientHello at the start of a tunnel (`sni::inspect`). Properties: never asks
/// for more once [`MAX_HELLO`] bytes are there; a final answer on a prefix of the input is
/// the answer on the whole input (bytes after a ClientHello are ignored, and a malformed
/// or non-TLS start stays so); server names are non-empty ASCII.
pub fn client_hello(data: &[u8]) {
    let whole = inspect(data);
    if data.len() >= MAX_HELLO {
        assert_ne!(whole, Hello::NeedMore);
    }
    if let Hello::Complete { server_names, .. } = &whole {
        assert!(
            server_names.iter().all(|n| !n.is_empty() && n.is_ascii()),
            "{server_names:?}"
        );
    }
    for cut in [data.len() / 2, data.len().saturating_sub(1)] {
        let part = inspect(&data[..cut]);
        if part != Hello::NeedMore {
            assert_eq!(part, whole, "prefix of {cut} bytes");
        }
    }
}

/// A PAC answer string (`route::parse_pac_answer`). Properties: at most one entry per
/// `;`-separated part, and every parent is a canonical target.
pub fn pac_answer(data: &[u8]) {
    let Ok(answer) = std::str::from_utf8(data) else {
        return;
    };
    let entries = parse_pac_answer(answer);
    assert!(entries.len() <= answer.split(';').count());
    for e in &entries {
        if let PacEntry::Proxy(_, t) = e {
            canonical_target(t);
        }
    }
}

/// The configuration file (`policy::config::parse`), as UTF-8 TOML. Property: it never
/// panics, and a configuration that loads has authorities with distinct names.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = policy::config::parse(text, "<fuzz>") {
        let mut names: Vec<&str> = config.authorities.iter().map(|a| a.grant.name()).collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "duplicate authority names");
    }
}

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

/// The body of `POST /v1/authorities` (`serde_json`, then `Control::create_from_json`),
/// against a mediator without a socket directory. Properties: a created authority has the
/// body's name, and a generated token is the one whose SHA-256 is stored; it is revoked
/// again at once.
pub fn admin_json(data: &[u8]) {
    let Ok(body) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let fx = fixture();
    let _enter = fx.runtime.enter();
    if let Ok(created) = fx.control.create_from_json(&body) {
        let name = created.live.authority.grant.name().to_owned();
        assert_eq!(
            body.get("name").and_then(Value::as_str),
            Some(name.as_str())
        );
        if let Some(token) = &created.token {
            let stored = created.live.authority.token_sha256;
            assert_eq!(stored, Some(Sha256::digest(token.as_bytes()).into()));
        }
        assert!(fx.control.revoke(&name).is_some());
    }
    fx.forget();
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
            assert!(!detail.chars().any(char::is_control), "{detail:?}");
        }
    }
}

/// The frame scan of the terminated leg's HTTP/2 server output
/// (`terminate::h2_resets`). The input's first byte is the write size (0 counts as 1); the
/// rest is the byte stream, as if the server had written it. Properties: the resets found
/// do not depend on how the stream is split into writes, and they are exactly those of an
/// independent walk of the frames (RFC 9113 section 4.1: 9-byte headers, a 24-bit
/// length; a complete `RST_STREAM`, type 0x3, of length 4 whose error code is
/// `PROTOCOL_ERROR`, 0x1).
pub fn h2_resets(data: &[u8]) {
    let Some((&step, bytes)) = data.split_first() else {
        return;
    };
    let found = crate::terminate::h2_resets::resets_in(bytes, usize::from(step));
    assert_eq!(
        found,
        crate::terminate::h2_resets::resets_in(bytes, bytes.len())
    );
    let mut expected = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let Some(payload) = rest.get(9..9 + len) else {
            break;
        };
        if rest[3] == 0x3 && len == 4 && payload == 1u32.to_be_bytes() {
            expected.push(u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff);
        }
        rest = &rest[9 + len..];
    }
    assert_eq!(found, expected);
}

/// An RFC 9110 section 5.6.2 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
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

/// `mediator suggest` (`suggest::suggest`). The input is UTF-8: the authority (the
/// first line, as `--authority` gives it), then the decision log or shim report.
/// Properties: it never panics, and what it prints is a configuration that
/// `mediator check`'s parser (`config::parse`) accepts, with one authority: the one asked
/// for.
pub fn suggest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (authority, log) = text.split_once('\n').unwrap_or((text, ""));
    let Ok(out) = crate::suggest::suggest(log, authority) else {
        return;
    };
    let config = crate::config::parse(&out, "<suggested>")
        .unwrap_or_else(|e| panic!("the suggestion does not load: {e}\n{out}"));
    let names: Vec<&str> = config.authorities.iter().map(|a| a.grant.name()).collect();
    assert_eq!(names, [authority], "{out}");
}

/// A parent proxy's `Proxy-Authenticate` offers, as the Negotiate exchange reads them
/// (`route::parent::negotiate_in`, `offered_in`; `route::negotiate::decode`). The input
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
    let offer = crate::route::parent::negotiate_in(challenges.iter().copied());
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
    let offered = crate::route::parent::offered_in(challenges.iter().copied());
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

/// KDE's proxy settings (`route::system::kde`, one `kioslaverc` text; `ProxyType=4`
/// reads an empty environment). Properties: it never panics, and what it yields is
/// usable as it stands: a parent is a `scheme://host:port` (http, https or socks5) with a
/// canonical host and a port other than 0, whose text parses back to it as a configured
/// parent URL; a PAC is an absolute path or an `http(s)://` URL from which the PAC
/// fetcher takes a canonical host and a port.
pub fn kioslaverc(data: &[u8]) {
    use crate::route::system::Setting;
    use policy::upstream::{PacSource, ParentSyntax, parse_parent_url};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(Some(reading)) = crate::route::system::kde::read_text(text, &|_: &str| None::<String>)
    else {
        return;
    };
    match &reading.setting {
        Setting::Direct => {}
        Setting::Manual {
            tunnel, forward, ..
        } => {
            for parent in [tunnel, forward].into_iter().flatten() {
                assert_ne!(parent.addr.port, 0, "{parent}");
                canonical_target(&parent.addr);
                let again = parse_parent_url(&parent.to_string(), ParentSyntax::Config)
                    .unwrap_or_else(|e| panic!("{parent}: {e}"));
                assert_eq!((again.scheme, &again.addr), (parent.scheme, &parent.addr));
            }
        }
        Setting::Pac(PacSource::File(path)) => assert!(path.is_absolute(), "{path:?}"),
        Setting::Pac(PacSource::Url(url)) => {
            let uri: Uri = url.parse().unwrap_or_else(|e| panic!("{url:?}: {e}"));
            assert!(
                matches!(uri.scheme_str(), Some("http" | "https")),
                "{url:?}"
            );
            let authority = uri.authority().expect("a PAC URL has a host");
            canonicalize_host(authority.host()).unwrap_or_else(|e| panic!("{url:?}: {e}"));
            let port = authority.as_str().rsplit_once(':').map(|(_, p)| p);
            if let Some(p) = port.filter(|p| !p.is_empty() && !p.contains(']')) {
                assert!(authority.port_u16().is_some(), "{url:?}: port {p:?}");
            }
        }
    }
}

/// The mediator the stateful targets run against, built once per process.
struct Fixture {
    runtime: tokio::runtime::Runtime,
    shared: Arc<Shared>,
    control: Control,
    authority: Arc<policy::config::Authority>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Fixture {
    /// Drops the decision-log lines written so far (a fuzzing run writes millions).
    fn forget(&self) {
        self.shared.log.flush();
        self.lines.lock().unwrap().clear();
    }
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let lines = Arc::default();
        let shared = for_tests(Arc::clone(&lines));
        let control = Control::new(Arc::clone(&shared), None, None, Duration::ZERO, Vec::new());
        let table = format!(
            "[[authority]]\nname = \"{AUTHORITY}\"\ntoken_sha256 = \"{}\"\nallow = [\"example.com\"]\n",
            hex::encode(Sha256::digest(TOKEN.as_bytes()))
        );
        let authority = policy::config::parse(&table, "<fuzz>")
            .unwrap()
            .authorities
            .remove(0);
        let live = {
            let _enter = runtime.enter();
            control.add(authority, Origin::Config).ok().unwrap()
        };
        Fixture {
            authority: Arc::clone(&live.authority),
            runtime,
            shared,
            control,
            lines,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fuzz/corpus/<target>/`, from this crate's directory.
    fn corpus(target: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/corpus")
            .join(target)
    }

    /// Every checked-in corpus file, through its target's function: a regression of a
    /// parser or of a property fails here, on stable, without the fuzzer.
    #[test]
    fn every_corpus_file_replays_cleanly() {
        let mut replayed = Vec::new();
        for (target, run) in TARGETS {
            let dir = corpus(target);
            let mut files: Vec<_> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|e| e.unwrap().path())
                .collect();
            files.sort();
            assert!(!files.is_empty(), "{} is empty", dir.display());
            for file in &files {
                let data = std::fs::read(file).unwrap();
                let outcome = std::panic::catch_unwind(|| run(&data));
                assert!(outcome.is_ok(), "{target}: {} fails", file.display());
            }
            replayed.push((*target, files.len()));
        }
        assert_eq!(replayed.len(), TARGETS.len(), "{replayed:?}");
    }

    /// Each target has its cargo-fuzz binary, and nothing else is there.
    #[test]
    fn every_target_has_a_fuzz_binary() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/fuzz_targets");
        let mut binaries: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        binaries.sort();
        let mut want: Vec<String> = TARGETS.iter().map(|(t, _)| format!("{t}.rs")).collect();
        want.sort();
        assert_eq!(binaries, want);
    }

    /// The SOCKS5 fixture reaches the request: the right credential gives a target, a
    /// wrong one none (so the corpus exercises both sides of authentication).
    #[test]
    fn the_socks5_fixture_authenticates() {
        let request = [
            5, 1, 0, 3, 11, b'e', b'x', b'a', b'm', b'p', b'l', b'e', b'.', b'c', b'o', b'm', 1,
            187,
        ];
        let run = |pass: &[u8]| {
            let mut sent = vec![0, 5, 1, 2, 1, 7];
            sent.extend_from_slice(AUTHORITY.as_bytes());
            sent.push(u8::try_from(pass.len()).unwrap());
            sent.extend_from_slice(pass);
            sent.extend_from_slice(&request);
            let fx = fixture();
            let mut ctx = Ctx::new(
                1,
                Peer::Embedded,
                None,
                fx.shared.limiter.admit(
                    0,
                    crate::limits::Door::Channel,
                    &tokio_util::sync::CancellationToken::new(),
                    || {},
                ),
            );
            fx.runtime.block_on(async {
                use tokio::io::AsyncWriteExt;
                let (mut client, mut server) = tokio::io::duplex(64 * 1024);
                client.write_all(&sent[1..]).await.unwrap();
                client.shutdown().await.unwrap();
                handshake(&mut server, &fx.shared, &mut ctx).await.unwrap()
            })
        };
        assert_eq!(
            run(TOKEN.as_bytes()).map(|t| t.to_string()),
            Some("example.com:443".into())
        );
        assert_eq!(run(b"wrong!"), None);
    }
}
