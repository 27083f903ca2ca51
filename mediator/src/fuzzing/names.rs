//! Host names and patterns: canonicalisation, grant entries, a PAC's answer, and
//! `mediator suggest`'s grouping.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use http::Uri;
use policy::{
    CanonicalHost, EntryKind, Grant, GrantSpec, Reason, Target, Verdict, canonicalize_host,
    check_entry, parse_authority_form,
};

use crate::front::http::forward::target_of;
use crate::route::pac::answer::{PacEntry, parse_pac_answer};

use super::{canonical_target, connect_target};

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
                deny: deny.iter().map(|d| (*d).into()).collect(),
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
        deny: deny.iter().map(|d| (*d).into()).collect(),
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

/// `mediator suggest` (`suggest::suggest`). The input is UTF-8: the authority (the
/// first line, as `--authority` gives it), then the decision log or shim report.
/// Properties: it never panics; a table is a configuration that `mediator check`'s
/// parser (`config::parse`) accepts, with one authority: the one asked for; shim flags
/// are `--allow` values the shim's grant accepts, and the text's only line that is not a
/// comment is those flags (none when there are none).
pub fn suggest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (authority, log) = text.split_once('\n').unwrap_or((text, ""));
    let Ok(out) = crate::suggest::suggest(log, authority) else {
        return;
    };
    match &out {
        crate::suggest::Suggestion::Table(table) => {
            let config = crate::config::parse(table, "<suggested>")
                .unwrap_or_else(|e| panic!("the suggestion does not load: {e}\n{out}"));
            let names: Vec<&str> = config.authorities.iter().map(|a| a.grant.name()).collect();
            assert_eq!(names, [authority], "{out}");
        }
        crate::suggest::Suggestion::ShimFlags { flags, text } => {
            for pair in flags.chunks(2) {
                assert_eq!(pair[0], "--allow", "{out}");
                assert!(check_entry(EntryKind::Allow, &pair[1]).is_ok(), "{out}");
            }
            let commands = text.lines().filter(|l| !l.starts_with('#')).count();
            assert_eq!(commands, usize::from(!flags.is_empty()), "{out}");
        }
    }
}
