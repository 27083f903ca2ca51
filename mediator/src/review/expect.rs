//! `mediator test`'s expectations file and its judgement (design section 21).
//!
//! ```toml
//! hosts = { "api.github.com" = ["140.82.112.6"] }   # the resolver's only answers
//!
//! [[expect]]
//! name = "agent-a reads the GitHub API"             # optional
//! authority = "agent-a"
//! target = "https://api.github.com/repos/x/y"       # a URL, or HOST[:PORT]
//! method = "GET"                                    # optional: judge the request too
//! decision = "allow"
//! reason = "allowed"                                # optional
//! ```
//!
//! Each expectation is judged by the steps of live traffic: `crate::explain` (the name
//! decision, one resolution by a resolver that answers from `hosts` alone and asks no
//! DNS server, the vetting of every address), then, with a method, the grant's request
//! rules where live traffic applies them (a terminated host's requests; every plain
//! `http://` request, judged before resolution as `front/http/forward.rs` does). The
//! watchdog is not asked (it can only narrow). Unknown keys are refused, named.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::Path;

use policy::config::Config;
use policy::{Decision, Reason, RequestFacts, Verdict};
use serde::{Deserialize, Deserializer};
use serde_json::json;

use crate::error::Error;
use crate::explain::{Explanation, explain_with, parse_target};
use crate::resolve::Resolver;
use crate::vocab::Protocol;

/// The file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// Name -> addresses: the only answers the resolver gives.
    #[serde(default)]
    hosts: BTreeMap<String, Vec<IpAddr>>,
    /// The expectations, in file order.
    #[serde(default)]
    expect: Vec<Expect>,
}

/// One `[[expect]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    /// A label for the output; default `authority: target`.
    name: Option<String>,
    /// Whose grant decides.
    authority: String,
    /// `https://host[:port]/path?query`, `http://...`, or `HOST[:PORT]` (443 by default).
    target: String,
    /// `connect`, `http`, `socks5` or `tls`; default: `http` for an `http://` URL, else
    /// `connect`.
    protocol: Option<Protocol>,
    /// The request's method: judge the request rules too (default `GET` for `http` and
    /// `tls`, and wherever a path is named: the `path` key, or a URL's path beyond `/`;
    /// none otherwise).
    method: Option<String>,
    /// The request's path (default: the URL's, else `/`).
    path: Option<String>,
    /// `allow` or `deny`.
    #[serde(deserialize_with = "crate::vocab::deserialize_verdict")]
    decision: Verdict,
    /// The reason expected (design section 4.3), if any.
    #[serde(default, deserialize_with = "some_reason")]
    reason: Option<Reason>,
    /// The rule expected (the grant entry as written), if any.
    rule: Option<String>,
}

fn some_reason<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Reason>, D::Error> {
    crate::vocab::deserialize_reason(d).map(Some)
}

/// A read expectations file.
#[derive(Debug)]
pub(super) struct Expectations {
    hosts: BTreeMap<String, Vec<IpAddr>>,
    list: Vec<Expect>,
}

/// Reads the expectations at `path`.
///
/// # Errors
/// [`Error::Review`]: the file cannot be read, is not TOML, has an unknown key or a value
/// of the wrong kind (`FILE:LINE:COL: message`, naming the key), a `hosts` name that is
/// not a host name, or no `[[expect]]` at all.
pub(super) fn read(path: &Path) -> Result<Expectations, Error> {
    let at = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::review_by(format!("cannot read {at}"), e))?;
    let file: File = toml::from_str(&text).map_err(|e| {
        let (line, col) = e.span().map_or((1, 1), |s| line_col(&text, s.start));
        Error::review(format!("{at}:{line}:{col}: {}", e.message().trim()))
    })?;
    if file.expect.is_empty() {
        return Err(Error::review(format!(
            "{at}: no [[expect]] tables: nothing to test"
        )));
    }
    let mut hosts = BTreeMap::new();
    for (name, addrs) in file.hosts {
        let canonical = policy::canonicalize_host(&name)
            .ok()
            .and_then(|h| h.name().map(str::to_owned))
            .ok_or_else(|| {
                Error::review(format!(
                    "{at}: hosts: {name:?} is not a host name (an address needs no entry)"
                ))
            })?;
        hosts.insert(canonical, addrs);
    }
    Ok(Expectations {
        hosts,
        list: file.expect,
    })
}

/// The 1-based line and column of byte `offset` of `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// What was decided for one expectation.
#[derive(Debug, Clone)]
struct Got {
    decision: Verdict,
    reason: Reason,
    rule: Option<String>,
    detail: String,
    hint: String,
    /// A remark on how it was judged (a method on a host that is not terminated).
    note: Option<String>,
}

impl Got {
    fn of_explanation(e: Explanation) -> Self {
        Self {
            decision: e.decision,
            reason: e.reason,
            rule: e.rule,
            detail: e.detail,
            hint: e.hint,
            note: None,
        }
    }

    fn of_decision(d: Decision) -> Self {
        Self {
            decision: d.verdict,
            reason: d.reason,
            rule: d.rule,
            detail: d.detail,
            hint: d.hint,
            note: None,
        }
    }
}

/// One expectation and its judgement.
#[derive(Debug)]
pub(super) struct Judged {
    expect: Expect,
    /// What was decided, or why it could not be judged (an unknown authority, a target
    /// that is not a URL or `HOST:PORT`).
    got: Result<Got, String>,
}

impl Judged {
    /// Whether the decision (and the reason and rule, where expected) is as expected.
    pub(super) fn passed(&self) -> bool {
        let want = &self.expect;
        self.got.as_ref().is_ok_and(|g| {
            g.decision == want.decision
                && want.reason.is_none_or(|r| r == g.reason)
                && want
                    .rule
                    .as_ref()
                    .is_none_or(|r| Some(r) == g.rule.as_ref())
        })
    }

    fn label(&self) -> String {
        let e = &self.expect;
        e.name.clone().unwrap_or_else(|| {
            let request = e.method.as_ref().map_or_else(String::new, |m| {
                format!(" {m} {}", e.path.as_deref().unwrap_or(""))
            });
            format!("{}: {}{}", e.authority, e.target, request.trim_end())
        })
    }
}

/// Judges every expectation under `config`.
pub(super) async fn judge(config: &Config, expectations: &Expectations) -> Vec<Judged> {
    let resolver = Resolver::offline(expectations.hosts.clone());
    let mut out = Vec::with_capacity(expectations.list.len());
    for e in &expectations.list {
        out.push(Judged {
            expect: e.clone(),
            got: judge_one(config, &resolver, e).await,
        });
    }
    out
}

/// A target taken apart: `host:port` for the connection, the protocol its form implies,
/// and the request's path and query when it is a URL.
struct Aimed {
    host_port: String,
    protocol: Protocol,
    path: Option<String>,
    query: Option<String>,
}

fn aim(target: &str) -> Result<Aimed, String> {
    let Some((scheme, rest)) = target.split_once("://") else {
        return Ok(Aimed {
            host_port: target.to_owned(),
            protocol: Protocol::Connect,
            path: None,
            query: None,
        });
    };
    let (port, protocol) = match scheme.to_ascii_lowercase().as_str() {
        "https" => (443, Protocol::Connect),
        "http" => (80, Protocol::Http),
        other => {
            return Err(format!(
                "target {target:?}: scheme {other:?}: give an https:// or http:// URL, or HOST:PORT"
            ));
        }
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') {
        return Err(format!(
            "target {target:?}: a URL names a host (and no userinfo)"
        ));
    }
    let has_port = match authority.strip_prefix('[') {
        Some(v6) => v6.contains("]:"),
        None => authority.contains(':'),
    };
    let host_port = if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:{port}")
    };
    let tail = tail.split('#').next().unwrap_or_default();
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q.to_owned())),
        None => (tail, None),
    };
    Ok(Aimed {
        host_port,
        protocol,
        path: Some(if path.is_empty() { "/" } else { path }.to_owned()),
        query,
    })
}

async fn judge_one(config: &Config, resolver: &Resolver, e: &Expect) -> Result<Got, String> {
    let aimed = aim(&e.target)?;
    let protocol = e.protocol.unwrap_or(aimed.protocol);
    let explained = explain_with(config, &e.authority, &aimed.host_port, Some(resolver))
        .await
        .map_err(|err| err.to_string())?;
    let connection = Got::of_explanation(explained);
    // A path (the key, or a URL's beyond `/`) asks for the request rules too: judged as a
    // GET unless a method is given, never silently left out.
    let names_a_path = e.path.is_some() || aimed.path.as_deref().is_some_and(|p| p != "/");
    let method = e.method.clone().or_else(|| {
        (names_a_path || matches!(protocol, Protocol::Http | Protocol::Tls))
            .then(|| "GET".to_owned())
    });
    let Some(method) = method else {
        return Ok(connection);
    };
    let (Some(authority), Ok(target)) = (
        config.authority(&e.authority),
        parse_target(&aimed.host_port),
    ) else {
        return Ok(connection);
    };
    let path = e
        .path
        .clone()
        .or(aimed.path)
        .unwrap_or_else(|| "/".to_owned());
    let request = || {
        let facts = RequestFacts::new(&method, &path).with_query(aimed.query.as_deref());
        authority.grant.decide_request(&target, &facts)
    };
    Ok(match protocol {
        // A plain request: its rules are judged once the name is allowed, before
        // resolution (front/http/forward.rs).
        Protocol::Http if authority.grant.decide(&target).is_allow() => {
            let d = request();
            if d.is_allow() {
                connection
            } else {
                Got::of_decision(d)
            }
        }
        Protocol::Http => connection,
        // A tunnel: its requests are seen only when its TLS is terminated.
        Protocol::Connect | Protocol::Socks5 | Protocol::Tls => {
            if connection.decision != Verdict::Allow {
                connection
            } else if authority.grant.terminates_tls(&target) {
                let d = request();
                if d.is_allow() {
                    connection
                } else {
                    Got::of_decision(d)
                }
            } else {
                Got {
                    note: Some(format!(
                        "TLS to {target} is not terminated: the mediator never sees the method or path"
                    )),
                    ..connection
                }
            }
        }
    })
}

/// Quoted rule, or nothing.
fn rule_words(rule: Option<&String>) -> String {
    rule.map_or_else(String::new, |r| format!(", rule {r:?}"))
}

/// The results as a test runner prints them.
pub(super) fn text(results: &[Judged], file: &Path, against: &str) -> String {
    let mut s = format!("{}: against {against}\n", file.display());
    for (i, r) in results.iter().enumerate() {
        let n = i + 1;
        let want = &r.expect;
        match (&r.got, r.passed()) {
            (Ok(g), true) => {
                let _ = writeln!(
                    s,
                    "ok   {n:>3}  {} -> {} {}{}",
                    r.label(),
                    g.decision.as_str(),
                    g.reason,
                    rule_words(g.rule.as_ref())
                );
            }
            (got, _) => {
                let _ = writeln!(s, "FAIL {n:>3}  {}", r.label());
                let _ = writeln!(
                    s,
                    "           expected: {}{}{}",
                    want.decision.as_str(),
                    want.reason.map_or_else(String::new, |x| format!(" {x}")),
                    rule_words(want.rule.as_ref())
                );
                match got {
                    Ok(g) => {
                        let _ = writeln!(
                            s,
                            "           decided:  {} {}{}",
                            g.decision.as_str(),
                            g.reason,
                            rule_words(g.rule.as_ref())
                        );
                        for (key, value) in [("detail", &g.detail), ("hint", &g.hint)] {
                            if !value.is_empty() {
                                let _ = writeln!(
                                    s,
                                    "           {key}:{:>w$}{value}",
                                    "",
                                    w = 9 - key.len()
                                );
                            }
                        }
                    }
                    Err(why) => {
                        let _ = writeln!(s, "           not judged: {why}");
                    }
                }
            }
        }
        if let Ok(Got {
            note: Some(note), ..
        }) = &r.got
        {
            let _ = writeln!(s, "           note: {note}");
        }
    }
    let failed = results.iter().filter(|r| !r.passed()).count();
    let _ = writeln!(s, "{} passed, {failed} failed", results.len() - failed);
    s
}

/// The results as JSON.
pub(super) fn json(results: &[Judged], file: &Path, against: &str) -> String {
    let list: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            let e = &r.expect;
            let got = match &r.got {
                Ok(g) => json!({
                    "decision": g.decision.as_str(),
                    "reason": g.reason.as_str(),
                    "rule": g.rule,
                    "detail": g.detail,
                    "hint": g.hint,
                    "note": g.note,
                }),
                Err(why) => json!({ "error": why }),
            };
            json!({
                "name": r.label(),
                "authority": e.authority,
                "target": e.target,
                "expected": {
                    "decision": e.decision.as_str(),
                    "reason": e.reason.map(Reason::as_str),
                    "rule": e.rule,
                },
                "got": got,
                "passed": r.passed(),
            })
        })
        .collect();
    let failed = results.iter().filter(|r| !r.passed()).count();
    let v = json!({
        "file": file.display().to_string(),
        "against": against,
        "passed": results.len() - failed,
        "failed": failed,
        "results": list,
    });
    format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let a = aim("https://api.github.com/repos/x?per_page=1#top").unwrap();
        assert_eq!(a.host_port, "api.github.com:443");
        assert_eq!(a.protocol, Protocol::Connect);
        assert_eq!(a.path.as_deref(), Some("/repos/x"));
        assert_eq!(a.query.as_deref(), Some("per_page=1"));
        let a = aim("http://[2001:db8::1]:8080").unwrap();
        assert_eq!(
            (a.host_port.as_str(), a.protocol, a.path.as_deref()),
            ("[2001:db8::1]:8080", Protocol::Http, Some("/"))
        );
        let a = aim("registry.npmjs.org:443").unwrap();
        assert_eq!((a.protocol, a.path), (Protocol::Connect, None));
        assert!(aim("ftp://x.test/").is_err());
        assert!(aim("https://user@x.test/").is_err());
    }

    #[test]
    fn unknown_keys_are_named_with_their_location() {
        let (_dir, path) = crate::testing::file_in_temp_dir(
            "t.toml",
            "[[expect]]\nauthority = \"a\"\ntarget = \"x.test\"\ndecision = \"allow\"\ncolour = \"red\"\n",
        );
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("t.toml:5:1: unknown field `colour`"), "{e}");
        std::fs::write(&path, "hosts = {}\n").unwrap();
        assert!(
            read(&path)
                .unwrap_err()
                .to_string()
                .contains("no [[expect]]")
        );
    }

    /// A request rule allows only `GET /repos/` on a terminated host.
    const CONFIG: &str = r#"
[listen]
tcp = "127.0.0.1:3128"
[tls]
ca_dir = "/var/lib/ca"
[[authority]]
name = "a"
allow = ["api.github.com"]
tls_terminate = ["api.github.com"]
[[authority.request_rule]]
host = "api.github.com"
methods = ["GET"]
path_prefixes = ["/repos/"]
"#;

    fn judged(expectations: &str) -> Vec<Judged> {
        let config = policy::config::parse(CONFIG, "m.toml").unwrap();
        let (_dir, path) = crate::testing::file_in_temp_dir(
            "e.toml",
            format!("hosts = {{ \"api.github.com\" = [\"140.82.112.6\"] }}\n{expectations}"),
        );
        let e = read(&path).unwrap();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(judge(&config, &e))
    }

    #[test]
    fn a_path_without_a_method_judges_the_request_rules_as_a_get() {
        for (target, path) in [
            ("https://api.github.com/admin", None),
            ("https://api.github.com/", Some("/admin")),
        ] {
            let path = path.map_or_else(String::new, |p| format!("path = \"{p}\"\n"));
            let r = judged(&format!(
                "[[expect]]\nauthority = \"a\"\ntarget = \"{target}\"\n{path}decision = \"deny\"\nreason = \"denied_by_rule\"\n"
            ));
            assert!(r[0].passed(), "{target} {path}: {:?}", r[0].got);
        }
        // No path: the tunnel alone, as before.
        let r = judged(
            "[[expect]]\nauthority = \"a\"\ntarget = \"https://api.github.com/\"\ndecision = \"allow\"\n",
        );
        assert!(r[0].passed(), "{:?}", r[0].got);
    }
}
