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
use crate::route::{PacEntry, parse_pac_answer};
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

/// The grant the `request_rule` target decides with: `GET`/`HEAD` under `/repos/` with
/// only the query parameters `page` and `per_page`, as docs/tls.md's example.
fn request_rule_grant() -> &'static Grant {
    static GRANT: OnceLock<policy::config::Config> = OnceLock::new();
    let config = GRANT.get_or_init(|| {
        let text = "[tls]\nca_dir = \"/nonexistent/fuzz-ca\"\n\n[[authority]]\nname = \"fuzz\"\nallow = [\"api.test\"]\ntls_terminate = [\"api.test\"]\n\n[[authority.request_rule]]\nhost = \"api.test\"\nmethods = [\"GET\", \"HEAD\"]\npath_prefixes = [\"/repos/\"]\nquery = [\"page\", \"per_page\"]\n";
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
        let mut out = Vec::with_capacity(cur.len());
        let mut i = 0;
        while i < cur.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if cur[i] == b'%'
                && i + 2 < cur.len()
                && let (Some(h), Some(l)) = (hex(cur[i + 1]), hex(cur[i + 2]))
            {
                out.push((h * 16 + l) as u8);
                i += 3;
            } else {
                out.push(cur[i]);
                i += 1;
            }
        }
        if out == cur {
            break;
        }
        cur = out;
    }
    cur
}

/// Request rules on method, path and query names (`Grant::decide_request`, with
/// [`request_rule_grant`]). The input is UTF-8: a method, a space, then the request
/// target (path, optionally `?query`). Properties: an allowed request is `GET` or `HEAD`,
/// its path starts with `/repos/`, and every query parameter name, however often it is
/// percent-decoded, is `page` or `per_page`.
pub fn request_rule(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some((method, target)) = text.split_once(' ') else {
        return;
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let Ok(host) = parse_authority_form("api.test:443") else {
        return;
    };
    let facts = policy::RequestFacts {
        method,
        path,
        query,
        headers: None,
        upgrade: None,
    };
    let d = request_rule_grant().decide_request(&host, &facts);
    if d.verdict != Verdict::Allow {
        return;
    }
    assert!(method == "GET" || method == "HEAD", "{method:?} allowed");
    assert!(path.starts_with("/repos/"), "{path:?} allowed");
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let name = pair.split_once('=').map_or(pair, |(n, _)| n);
        let name = decoded_fully(&name.replace('+', " "));
        assert!(
            name == b"page" || name == b"per_page",
            "query name {:?} allowed in {query:?}",
            String::from_utf8_lossy(&name)
        );
    }
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
