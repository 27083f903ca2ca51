//! `mediator suggest`: from a decision log (or the shim's `--report`), the smallest
//! `[[authority]]` table that would have allowed one authority's `not_in_allowlist` and
//! `port_not_allowed` denials; for the denials of the shim's embedded mode (channel
//! `embedded`), whose grant is its command line, the `--allow` flags instead. Address-class denials (`private_address`,
//! `special_address`) are never widened: they are listed as comments. Many names under one
//! registrable domain (by the Public Suffix List) become one `*.` entry, with a comment
//! saying so. Every entry is checked as the configuration loader checks it, so the output
//! is a table `mediator check` accepts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use policy::{EntryKind, check_entry};
use serde_json::Value;

/// At least this many names under one registrable domain are grouped into `*.domain`.
const GROUP_AT: usize = 3;

/// What was seen of one destination.
#[derive(Debug, Default, Clone)]
struct Seen {
    count: u64,
    first: Option<String>,
    last: Option<String>,
}

impl Seen {
    fn add(&mut self, ts: Option<&str>) {
        self.add_n(ts, 1);
    }

    /// `n` identical denials (a shim report lists each once, with its count).
    fn add_n(&mut self, ts: Option<&str>, n: u64) {
        self.count += n;
        if let Some(ts) = ts {
            if self.first.as_deref().is_none_or(|f| ts < f) {
                self.first = Some(ts.to_owned());
            }
            if self.last.as_deref().is_none_or(|l| ts > l) {
                self.last = Some(ts.to_owned());
            }
        }
    }

    fn merge(&mut self, other: &Self) {
        let count = self.count + other.count;
        for ts in [&other.first, &other.last].into_iter().flatten() {
            self.add(Some(ts));
        }
        self.count = count;
    }

    fn comment(&self) -> String {
        let n = self.count;
        let what = if n == 1 { "denial" } else { "denials" };
        match (&self.first, &self.last) {
            (Some(f), Some(l)) if f == l => format!("{n} {what}, at {f}"),
            (Some(f), Some(l)) => format!("{n} {what}, first {f}, last {l}"),
            _ => format!("{n} {what}"),
        }
    }
}

/// What `mediator suggest` prints (its `Display` is the text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Suggestion {
    /// An `[[authority]]` table for a mediator's configuration, which `mediator check`
    /// loads.
    Table(String),
    /// The denials were those of the shim's embedded mode (their records' `channel`, or
    /// the report's, is `embedded`), whose grant is its command line: the flags to add,
    /// `--allow` and its value each (`flags`), and the text (comments, then the flags on
    /// one line, quoted for a POSIX shell).
    ShimFlags {
        /// `["--allow", "api.example.com:443", ...]`.
        flags: Vec<String>,
        /// What is printed.
        text: String,
    },
}

impl std::fmt::Display for Suggestion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Table(text) | Self::ShimFlags { text, .. } => f.write_str(text),
        }
    }
}

/// The denials read, by destination.
#[derive(Default)]
struct Denied {
    /// Denials counted.
    count: u64,
    /// `not_in_allowlist` and `port_not_allowed`, by `(host, port)`.
    widen: BTreeMap<(String, u16), Seen>,
    /// Address-class denials, by `(host, port, reason)`.
    kept: BTreeMap<(String, u16, String), Seen>,
    /// Some were taken in the shim's embedded mode.
    embedded: bool,
}

impl Denied {
    fn take(&mut self, v: &Value, ts: Option<&str>) {
        // A shim report lists identical denials once, with their `count`; a log line is one.
        let n = v["count"].as_u64().filter(|n| *n > 0).unwrap_or(1);
        let (Some(host), Some(port), Some(reason)) = (
            v["host"].as_str(),
            v["port"].as_u64().and_then(|p| u16::try_from(p).ok()),
            v["reason"].as_str(),
        ) else {
            return;
        };
        // An IP literal outside the global unicast space would stay denied by its
        // address whatever the allow list says: never suggest it.
        let class = host
            .parse::<std::net::IpAddr>()
            .ok()
            .map(policy::classify)
            .and_then(|c| match c {
                policy::AddrClass::Global => None,
                policy::AddrClass::Private(_) => Some("private_address"),
                _ => Some("special_address"),
            });
        let reason = match (reason, class) {
            ("not_in_allowlist" | "port_not_allowed", Some(c)) => c,
            (r, _) => r,
        };
        match reason {
            "not_in_allowlist" | "port_not_allowed" => {
                self.count += n;
                self.widen
                    .entry((host.to_owned(), port))
                    .or_default()
                    .add_n(ts, n);
            }
            "private_address" | "special_address" => {
                self.count += n;
                self.kept
                    .entry((host.to_owned(), port, reason.to_owned()))
                    .or_default()
                    .add_n(ts, n);
            }
            _ => {}
        }
    }

    /// The denials of a shim report.
    fn take_report(&mut self, report: &Value) {
        self.embedded |= report["channel"] == "embedded";
        for d in report["denials"].as_array().into_iter().flatten() {
            self.take(d, d["ts"].as_str());
        }
    }
}

/// The suggestion for `authority` from `input` (decision-log lines, or one shim report):
/// an `[[authority]]` table, or the shim's flags when the denials were taken in its
/// embedded mode.
///
/// # Errors
/// `authority` is not a valid authority name (the table would not load), or a line is not
/// JSON (its number in the message).
// A `String` error: the message `mediator suggest` prints; no caller branches on it.
pub fn suggest(input: &str, authority: &str) -> Result<Suggestion, String> {
    // The table is named `authority`: a name the loader refuses would make it unusable.
    policy::Grant::new(
        &policy::GrantSpec {
            name: authority.to_owned(),
            ..policy::GrantSpec::default()
        },
        &[],
    )
    .map_err(|e| format!("--authority: {e}"))?;
    let mut denied = Denied::default();
    // A shim report is one JSON document; a decision log is one JSON object per line.
    match serde_json::from_str::<Value>(input) {
        Ok(report) if report["report"] == "shim" => denied.take_report(&report),
        _ => {
            for (n, line) in input.lines().enumerate() {
                // Text around the JSON (the shim's stderr lines) is not part of the log.
                if !line.trim_start().starts_with('{') {
                    continue;
                }
                let v: Value = serde_json::from_str(line)
                    .map_err(|e| format!("line {}: not a decision-log line: {e}", n + 1))?;
                if v["report"] == "shim" {
                    denied.take_report(&v);
                } else if v["event"] == "decision"
                    && v["decision"] == "deny"
                    && v["authority"].as_str() == Some(authority)
                {
                    denied.embedded |= v["channel"] == "embedded";
                    denied.take(&v, v["ts"].as_str());
                }
            }
        }
    }
    Ok(if denied.embedded {
        render_flags(authority, &denied)
    } else {
        Suggestion::Table(render(authority, denied.count, &denied.widen, &denied.kept))
    })
}

/// The shim flags that would have allowed the denials of an embedded run: a comment per
/// entry (what it covers), the address classes that stay denied, then one line of flags.
fn render_flags(authority: &str, denied: &Denied) -> Suggestion {
    let entries = group(&denied.widen);
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# Suggested by `mediator suggest` from {} denials of the shim's embedded run (authority {authority:?}):",
        denied.count
    );
    let _ = writeln!(
        text,
        "# the shim flags that would have allowed its not_in_allowlist and port_not_allowed denials."
    );
    write_entries(&mut text, &entries, "#   ", |e| {
        format!(
            "#   --allow {}: {}",
            comment_text(&e.pattern),
            comment_text(&e.seen.comment())
        )
    });
    write_kept(&mut text, &denied.kept, "--allow-private");
    let flags: Vec<String> = entries
        .iter()
        .flat_map(|e| ["--allow".to_owned(), e.pattern.clone()])
        .collect();
    if flags.is_empty() {
        let _ = writeln!(text, "# (no flag to add)");
    } else {
        let words: Vec<String> = flags.iter().map(|f| shell_word(f)).collect();
        let _ = writeln!(text, "{}", words.join(" "));
    }
    Suggestion::ShimFlags { flags, text }
}

/// `s` as one word of a POSIX shell: as it is when it holds only characters no shell
/// reads specially, else in single quotes (a `'` inside as `'\''`).
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '/' | '='));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// One allow entry: the pattern, what it covers, and its comment.
struct Entry {
    pattern: String,
    seen: Seen,
    note: Option<String>,
}

/// Writes each of `entries` to `out`: its note, when it has one, as a line after
/// `note_prefix`, then the line `line` makes of it.
fn write_entries(
    out: &mut String,
    entries: &[Entry],
    note_prefix: &str,
    line: impl Fn(&Entry) -> String,
) {
    for e in entries {
        if let Some(note) = &e.note {
            let _ = writeln!(out, "{note_prefix}{}", comment_text(note));
        }
        let _ = writeln!(out, "{}", line(e));
    }
}

fn render(
    authority: &str,
    denials: u64,
    widen: &BTreeMap<(String, u16), Seen>,
    kept: &BTreeMap<(String, u16, String), Seen>,
) -> String {
    let entries = group(widen);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Suggested by `mediator suggest` from {denials} denials of authority {authority:?}:"
    );
    let _ = writeln!(
        out,
        "# the smallest allow list that would have allowed its not_in_allowlist and port_not_allowed denials."
    );
    let _ = writeln!(out, "[[authority]]");
    let _ = writeln!(out, "name = {}", toml_str(authority));
    if entries.is_empty() {
        let _ = writeln!(out, "allow = []");
    } else {
        let _ = writeln!(out, "allow = [");
        write_entries(&mut out, &entries, "  # ", |e| {
            format!(
                "  {}, # {}",
                toml_str(&e.pattern),
                comment_text(&e.seen.comment())
            )
        });
        let _ = writeln!(out, "]");
    }
    write_kept(&mut out, kept, "allow_private");
    out
}

/// The address-class denials a suggestion never widens, as comment lines under a header
/// that names `allow_private` (the flag or key that would) for a destination meant.
fn write_kept(out: &mut String, kept: &BTreeMap<(String, u16, String), Seen>, allow_private: &str) {
    if kept.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# Stay denied (address class: never widened by a suggestion; use {allow_private} only for a destination you mean):"
    );
    for ((host, port, reason), seen) in kept {
        let _ = writeln!(
            out,
            "#   {}",
            comment_text(&format!(
                "{}:{port} {reason} ({})",
                show_host(host),
                seen.comment()
            ))
        );
    }
}

/// Entries `host:port`, with names under one registrable domain grouped into `*.domain`
/// (per port) when there are at least [`GROUP_AT`] of them; only those an allow list
/// takes (`check_entry`).
fn group(widen: &BTreeMap<(String, u16), Seen>) -> Vec<Entry> {
    let mut by_domain: BTreeMap<(String, u16), BTreeSet<String>> = BTreeMap::new();
    for (host, port) in widen.keys() {
        if let Some(domain) = psl::domain_str(host)
            && domain != host
        {
            by_domain
                .entry((domain.to_owned(), *port))
                .or_default()
                .insert(host.clone());
        }
    }
    let mut grouped: BTreeMap<String, (String, u16)> = BTreeMap::new();
    let mut out = Vec::new();
    for ((domain, port), names) in &by_domain {
        let pattern = format!("*.{domain}:{port}");
        if names.len() < GROUP_AT || check_entry(EntryKind::Allow, &pattern).is_err() {
            continue;
        }
        let mut seen = Seen::default();
        for name in names {
            grouped.insert(name.clone(), (domain.clone(), *port));
            if let Some(s) = widen.get(&(name.clone(), *port)) {
                seen.merge(s);
            }
        }
        out.push(Entry {
            pattern,
            seen,
            note: Some(format!(
                "{} names under {domain} grouped (the Public Suffix List makes {domain} a registrable domain): {}",
                names.len(),
                names.iter().cloned().collect::<Vec<_>>().join(", ")
            )),
        });
    }
    for ((host, port), seen) in widen {
        if grouped.get(host) == Some(&(psl_domain(host), *port)) {
            continue;
        }
        out.push(Entry {
            pattern: format!("{}:{port}", show_host(host)),
            seen: seen.clone(),
            note: None,
        });
    }
    out.retain(|e| check_entry(EntryKind::Allow, &e.pattern).is_ok());
    out.sort_by(|a, b| a.pattern.cmp(&b.pattern));
    out
}

fn psl_domain(host: &str) -> String {
    psl::domain_str(host).unwrap_or_default().to_owned()
}

/// An IPv6 literal in brackets, as entries write it.
fn show_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// `s` as the text of a TOML comment: control characters (a line break would end the
/// comment and start a line of the table; TOML allows none but tab) escaped as `\n`,
/// `\u{..}`, and so are the characters that make a terminal or an editor show text other
/// than it is: the Unicode line and paragraph separators (U+2028, U+2029, line breaks to
/// some viewers) and the bidirectional controls (U+061C, U+200E, U+200F, U+202A-U+202E,
/// U+2066-U+2069, "Trojan Source", CVE-2021-42574). Hosts and timestamps come from the log
/// as they were sent.
fn comment_text(s: &str) -> String {
    s.chars()
        .map(|c| {
            let deceptive = matches!(
                c,
                '\u{2028}'
                    | '\u{2029}'
                    | '\u{061C}'
                    | '\u{200E}'
                    | '\u{200F}'
                    | '\u{202A}'..='\u{202E}'
                    | '\u{2066}'..='\u{2069}'
            );
            if c.is_control() || deceptive {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn toml_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

#[cfg(test)]
#[path = "suggest_tests.rs"]
mod tests;
