//! Unit tests of `suggest`.

use super::*;

fn line(ts: &str, authority: &str, host: &str, port: u16, reason: &str) -> String {
    serde_json::json!({
        "event": "decision", "ts": ts, "authority": authority, "host": host,
        "port": port, "decision": "deny", "reason": reason,
    })
    .to_string()
}

#[test]
#[expect(clippy::too_many_lines, reason = "a table of grouping rows")]
fn the_smallest_grant_groups_by_the_psl_and_keeps_address_classes_denied() {
    let log = [
        line(
            "2026-12-01T10:00:00.000Z",
            "agent-a",
            "api.example.com",
            443,
            "not_in_allowlist",
        ),
        line(
            "2026-12-01T10:05:00.000Z",
            "agent-a",
            "api.example.com",
            443,
            "not_in_allowlist",
        ),
        line(
            "2026-12-01T10:01:00.000Z",
            "agent-a",
            "a.cdn.example.net",
            443,
            "not_in_allowlist",
        ),
        line(
            "2026-12-01T10:02:00.000Z",
            "agent-a",
            "b.cdn.example.net",
            443,
            "not_in_allowlist",
        ),
        line(
            "2026-12-01T10:03:00.000Z",
            "agent-a",
            "c.example.net",
            443,
            "not_in_allowlist",
        ),
        line(
            "2026-12-01T10:04:00.000Z",
            "agent-a",
            "x.github.io",
            443,
            "not_in_allowlist",
        ),
        line(
            "2026-12-01T10:04:30.000Z",
            "agent-a",
            "y.github.io",
            443,
            "not_in_allowlist",
        ),
        line(
            "2026-12-01T10:04:40.000Z",
            "agent-a",
            "z.github.io",
            443,
            "not_in_allowlist",
        ),
        line(
            "2026-12-01T10:06:00.000Z",
            "agent-a",
            "origin.test",
            8080,
            "port_not_allowed",
        ),
        line(
            "2026-12-01T10:07:00.000Z",
            "agent-a",
            "10.0.0.5",
            80,
            "private_address",
        ),
        line(
            "2026-12-01T10:08:00.000Z",
            "agent-a",
            "intranet.example.com",
            443,
            "private_address",
        ),
        line(
            "2026-12-01T10:09:00.000Z",
            "agent-b",
            "other.example.org",
            443,
            "not_in_allowlist",
        ),
        line(
            "2026-12-01T10:10:00.000Z",
            "agent-a",
            "evil.example",
            443,
            "denied_by_rule",
        ),
        line(
            "2026-12-01T10:11:00.000Z",
            "agent-a",
            "10.1.2.3",
            80,
            "not_in_allowlist",
        ),
    ]
    .join("\n");
    let got = suggest(&log, "agent-a").unwrap().to_string();
    let want = r#"# Suggested by `mediator suggest` from 12 denials of authority "agent-a":
# the smallest allow list that would have allowed its not_in_allowlist and port_not_allowed denials.
[[authority]]
name = "agent-a"
allow = [
  # 3 names under example.net grouped (the Public Suffix List makes example.net a registrable domain): a.cdn.example.net, b.cdn.example.net, c.example.net
  "*.example.net:443", # 3 denials, first 2026-12-01T10:01:00.000Z, last 2026-12-01T10:03:00.000Z
  "api.example.com:443", # 2 denials, first 2026-12-01T10:00:00.000Z, last 2026-12-01T10:05:00.000Z
  "origin.test:8080", # 1 denial, at 2026-12-01T10:06:00.000Z
  "x.github.io:443", # 1 denial, at 2026-12-01T10:04:00.000Z
  "y.github.io:443", # 1 denial, at 2026-12-01T10:04:30.000Z
  "z.github.io:443", # 1 denial, at 2026-12-01T10:04:40.000Z
]
# Stay denied (address class: never widened by a suggestion; use allow_private only for a destination you mean):
#   10.0.0.5:80 private_address (1 denial, at 2026-12-01T10:07:00.000Z)
#   10.1.2.3:80 private_address (1 denial, at 2026-12-01T10:11:00.000Z)
#   intranet.example.com:443 private_address (1 denial, at 2026-12-01T10:08:00.000Z)
"#;
    assert_eq!(got, want, "\n{got}");
    // What it prints is a configuration the loader accepts.
    let c = policy::config::parse(&got, "suggested.toml").unwrap();
    assert_eq!(c.authorities[0].grant.allow_entries().count(), 6);
}

#[test]
fn separators_and_bidi_controls_are_escaped_in_comments() {
    for c in [
        '\u{2028}', '\u{2029}', '\u{202E}', '\u{2066}', '\u{200F}', '\u{061C}',
    ] {
        let text = comment_text(&format!("a{c}b"));
        assert_eq!(text, format!("a{}b", c.escape_default()), "{c:?}");
    }
    assert_eq!(comment_text("b\u{fc}cher.test"), "b\u{fc}cher.test");
}

#[test]
fn a_shim_report_is_read_too() {
    let report = serde_json::json!({
        "report": "shim",
        "denials": [
            {"protocol": "connect", "status": 403, "reason": "not_in_allowlist", "host": "pypi.org", "port": 443},
            {"protocol": "connect", "status": 403, "reason": "special_address", "host": "192.0.2.1", "port": 443},
        ],
    })
    .to_string();
    let got = suggest(&report, "agent-a").unwrap().to_string();
    assert!(got.contains("  \"pypi.org:443\", # 1 denial\n"), "{got}");
    assert!(
        got.contains("#   192.0.2.1:443 special_address (1 denial)"),
        "{got}"
    );
    // Identical denials listed once with their count are counted as many.
    let counted = serde_json::json!({
        "report": "shim",
        "channel": "embedded",
        "denials": [
            {"protocol": "connect", "status": 403, "reason": "not_in_allowlist", "host": "pypi.org", "port": 443, "count": 6},
        ],
    })
    .to_string();
    let flags = suggest(&counted, "shim").unwrap().to_string();
    assert!(flags.contains("from 6 denials"), "{flags}");
    assert!(flags.contains("--allow pypi.org:443: 6 denials"), "{flags}");
    assert!(suggest("{not json", "a").is_err());
    // A host or time with a line break stays inside its comment: no line of its own.
    let injected = serde_json::json!({
        "event": "decision", "decision": "deny", "authority": "agent-a",
        "host": "10.0.0.1\n\"evil.test:443\",", "port": 443, "reason": "private_address",
        "ts": "t\n  \"evil.test:443\", #",
    });
    let ok = serde_json::json!({
        "event": "decision", "decision": "deny", "authority": "agent-a",
        "host": "a.test", "port": 443, "reason": "not_in_allowlist",
        "ts": "t\n  \"evil.test:443\", #\u{0}",
    });
    let safe = suggest(&format!("{injected}\n{ok}"), "agent-a")
        .unwrap()
        .to_string();
    let c = policy::config::parse(&safe, "suggested.toml").unwrap();
    assert_eq!(
        c.authorities[0].grant.allow_entries().collect::<Vec<_>>(),
        ["a.test:443"],
        "{safe}"
    );
    // A name the loader refuses is refused here, not printed into a table.
    for bad in ["", "no spaces", "a\nallow = [\"*\"]"] {
        let e = suggest(&report, bad).unwrap_err();
        assert!(e.starts_with("--authority: "), "{e}");
    }
    // The report among other lines of the shim's stderr.
    let mixed = format!("mediator: denied pypi.org:443 (not_in_allowlist): ...\n{report}\n");
    assert_eq!(suggest(&mixed, "agent-a").unwrap().to_string(), got);
}

#[test]
fn an_embedded_runs_denials_become_shim_flags() {
    let denial = |host: &str, reason: &str| {
        serde_json::json!({
            "event": "decision", "decision": "deny", "authority": "shim",
            "channel": "embedded", "host": host, "port": 443, "reason": reason,
            "ts": "2026-12-01T10:00:00.000Z",
        })
        .to_string()
    };
    let log = [
        denial("pypi.org", "not_in_allowlist"),
        denial("a.files.example.net", "not_in_allowlist"),
        denial("b.files.example.net", "not_in_allowlist"),
        denial("c.files.example.net", "not_in_allowlist"),
        denial("10.0.0.1", "not_in_allowlist"),
    ]
    .join("\n");
    let got = suggest(&log, "shim").unwrap();
    let Suggestion::ShimFlags { flags, text } = &got else {
        panic!("a table for an embedded run: {got}");
    };
    assert_eq!(
        flags,
        &["--allow", "*.example.net:443", "--allow", "pypi.org:443"]
    );
    let commands: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        commands,
        ["--allow '*.example.net:443' --allow pypi.org:443"],
        "{text}"
    );
    assert!(!text.contains("[[authority]]"), "{text}");
    assert!(
        text.contains("#   10.0.0.1:443 private_address (1 denial, at 2026-12-01T10:00:00.000Z)"),
        "{text}"
    );
    // The report of an embedded run says so by its channel.
    let report = serde_json::json!({
        "report": "shim", "channel": "embedded",
        "denials": [{"protocol": "connect", "status": 403, "reason": "not_in_allowlist", "host": "2606:4700::1", "port": 8080}],
    })
    .to_string();
    let Suggestion::ShimFlags { flags, text } = suggest(&report, "shim").unwrap() else {
        panic!("a table for an embedded run's report");
    };
    assert_eq!(flags, ["--allow", "[2606:4700::1]:8080"]);
    assert!(
        text.ends_with("\n--allow '[2606:4700::1]:8080'\n"),
        "{text}"
    );
    // A mediator's log and a socket-mode report still get a table.
    let tcp = log.replace("\"embedded\"", "\"tcp\"");
    assert!(matches!(
        suggest(&tcp, "shim").unwrap(),
        Suggestion::Table(_)
    ));
    let socket = report.replace("\"embedded\"", "\"/run/m/a.sock\"");
    assert!(matches!(
        suggest(&socket, "shim").unwrap(),
        Suggestion::Table(_)
    ));
    assert_eq!(shell_word("it's"), "'it'\\''s'");
}
