//! `diff` over pairs of configurations: one row per pair, with the outcome and every
//! (direction, class) its changes have. Rows cover each risk class both ways, the
//! containment cases (a wider wildcard, an exact host under a wildcard, an IP and its
//! single-address CIDR) and rewrites that change nothing.

use std::collections::BTreeSet;

use super::*;
use Direction::{Changed as C, Narrowed as N, Widened as W};
use RiskClass as K;

/// A configuration with a CA (for `tls_terminate`) and a TCP listener (for tokens) around
/// `body`.
fn conf(body: &str) -> String {
    format!("[listen]\ntcp = \"127.0.0.1:3128\"\n[tls]\nca_dir = \"/var/lib/ca\"\n{body}")
}

/// One authority `a` with the given keys.
fn a(keys: &str) -> String {
    conf(&format!("[[authority]]\nname = \"a\"\n{keys}\n"))
}

const GH: &str = "allow = [\"api.github.com:443\", \"*.githubusercontent.com:443\"]";
const TERM: &str = "allow = [\"api.github.com\"]\ntls_terminate = [\"api.github.com\"]";
const RULE_GET: &str = "[[authority.request_rule]]\nhost = \"api.github.com\"\nmethods = [\"GET\"]\npath_prefixes = [\"/repos/\"]";
const CRED: &str = "[[authority.credential]]\nhost = \"api.github.com\"\nheader = \"Authorization\"\nsecret_file = \"/etc/egress/gh\"";

struct Row {
    name: &'static str,
    old: String,
    new: String,
    outcome: Outcome,
    /// Every (direction, class) of the changes.
    changes: &'static [(Direction, RiskClass)],
}

fn row(
    name: &'static str,
    old: String,
    new: String,
    outcome: Outcome,
    changes: &'static [(Direction, RiskClass)],
) -> Row {
    Row {
        name,
        old,
        new,
        outcome,
        changes,
    }
}

#[expect(clippy::too_many_lines, reason = "one row per pair of configurations")]
fn rows() -> Vec<Row> {
    use Outcome::{Narrowed as Narrow, Unchanged as Same, Widened as Wide};
    vec![
        // No-op rewrites.
        row("identical", a(GH), a(GH), Same, &[]),
        row(
            "reordered allow list",
            a(GH),
            a("allow = [\"*.githubusercontent.com:443\", \"api.github.com:443\"]"),
            Same,
            &[],
        ),
        row(
            "case and trailing dot",
            a(GH),
            a("allow = [\"API.GitHub.com.:443\", \"*.GitHubUserContent.com:443\"]"),
            Same,
            &[],
        ),
        row(
            "IDN spelled as A-labels",
            a("allow = [\"bücher.example\"]"),
            a("allow = [\"xn--bcher-kva.example\"]"),
            Same,
            &[],
        ),
        row(
            "exact host under an existing wildcard",
            a(GH),
            a(
                "allow = [\"api.github.com:443\", \"*.githubusercontent.com:443\", \"raw.githubusercontent.com:443\"]",
            ),
            Same,
            &[],
        ),
        row(
            "an address and its single-address CIDR",
            a("allow = [\"192.0.2.7\"]"),
            a("allow = [\"192.0.2.7/32\"]"),
            Same,
            &[],
        ),
        row(
            "IPv6 spellings",
            a("allow = [\"[2001:db8::1]:443\"]"),
            a("allow = [\"[2001:DB8:0::1]:443\"]"),
            Same,
            &[],
        ),
        row(
            "allow_private address and /32",
            a("allow = [\"o.test\"]\nallow_private = [\"127.0.0.1\"]"),
            a("allow = [\"o.test\"]\nallow_private = [\"127.0.0.1/32\"]"),
            Same,
            &[],
        ),
        row(
            "a new allow entry its deny entry refuses whole",
            a("allow = [\"a.example.com\"]\ndeny = [\"*.example.com\"]"),
            a("allow = [\"a.example.com\", \"b.example.com\"]\ndeny = [\"*.example.com\"]"),
            Same,
            &[],
        ),
        row(
            "a duplicate entry dropped",
            a("allow = [\"x.example.com\", \"x.example.com:443\"]"),
            a("allow = [\"x.example.com\"]"),
            Same,
            &[],
        ),
        // Hosts and wildcards.
        row(
            "wider wildcard",
            a("allow = [\"*.svc.example.net\"]"),
            a("allow = [\"*.example.net\"]"),
            Wide,
            &[(W, K::Host)],
        ),
        row(
            "narrower wildcard",
            a("allow = [\"*.example.net\"]"),
            a("allow = [\"*.svc.example.net\"]"),
            Narrow,
            &[(N, K::Host)],
        ),
        row(
            "new host",
            a(GH),
            a(
                "allow = [\"api.github.com:443\", \"*.githubusercontent.com:443\", \"pastebin.com:443\"]",
            ),
            Wide,
            &[(W, K::Host)],
        ),
        row(
            "host removed",
            a(GH),
            a("allow = [\"api.github.com:443\"]"),
            Narrow,
            &[(N, K::Host)],
        ),
        row(
            "new address range",
            a("allow = [\"192.0.2.0/25\"]"),
            a("allow = [\"192.0.2.0/24\"]"),
            Wide,
            &[(W, K::Host)],
        ),
        // Ports.
        row(
            "port opened to every port",
            a(GH),
            a("allow = [\"api.github.com\", \"*.githubusercontent.com:443\"]"),
            Wide,
            &[(W, K::Port)],
        ),
        row(
            "another port",
            a(GH),
            a(
                "allow = [\"api.github.com:443\", \"api.github.com:8443\", \"*.githubusercontent.com:443\"]",
            ),
            Wide,
            &[(W, K::Port)],
        ),
        row(
            "every port narrowed to one",
            a("allow = [\"api.github.com\"]"),
            a("allow = [\"api.github.com:443\"]"),
            Narrow,
            &[(N, K::Port)],
        ),
        // Address exceptions.
        row(
            "allow_private added",
            a("allow = [\"o.test\"]"),
            a("allow = [\"o.test\"]\nallow_private = [\"10.0.0.0/8\"]"),
            Wide,
            &[(W, K::AllowPrivate)],
        ),
        row(
            "allow_private widened",
            a("allow = [\"o.test\"]\nallow_private = [\"10.1.0.0/24\"]"),
            a("allow = [\"o.test\"]\nallow_private = [\"10.1.0.0/16\"]"),
            Wide,
            &[(W, K::AllowPrivate)],
        ),
        row(
            "allow_private removed",
            a("allow = [\"o.test\"]\nallow_private = [\"10.1.0.0/24\"]"),
            a("allow = [\"o.test\"]"),
            Narrow,
            &[(N, K::AllowPrivate)],
        ),
        // Termination, credentials, request rules.
        row(
            "TLS terminated",
            a("allow = [\"api.github.com\"]"),
            a(TERM),
            Wide,
            &[(W, K::TlsTerminate)],
        ),
        row(
            "TLS no longer terminated",
            a(TERM),
            a("allow = [\"api.github.com\"]"),
            Narrow,
            &[(N, K::TlsTerminate)],
        ),
        row(
            "credential added",
            a(TERM),
            a(&format!("{TERM}\n{CRED}")),
            Wide,
            &[(W, K::Credential)],
        ),
        row(
            "credential removed",
            a(&format!("{TERM}\n{CRED}")),
            a(TERM),
            Narrow,
            &[(N, K::Credential)],
        ),
        row(
            "credential to more hosts",
            a(&format!("{TERM}\n{CRED}")),
            a(&format!(
                "allow = [\"api.github.com\", \"*.github.com\"]\ntls_terminate = [\"api.github.com\", \"*.github.com\"]\n{}",
                CRED.replace("host = \"api.github.com\"", "host = \"*.github.com\"")
            )),
            Wide,
            &[(W, K::Host), (W, K::TlsTerminate), (W, K::Credential)],
        ),
        row(
            "credential from another secret",
            a(&format!("{TERM}\n{CRED}")),
            a(&format!(
                "{TERM}\n{}",
                CRED.replace("/etc/egress/gh", "/etc/egress/gh-admin")
            )),
            Wide,
            &[(W, K::Credential)],
        ),
        row(
            "request rule gains a method",
            a(&format!("{TERM}\n{RULE_GET}")),
            a(&format!(
                "{TERM}\n{}",
                RULE_GET.replace("[\"GET\"]", "[\"GET\", \"DELETE\"]")
            )),
            Wide,
            &[(W, K::RequestRule)],
        ),
        row(
            "request rule gains a path",
            a(&format!("{TERM}\n{RULE_GET}")),
            a(&format!(
                "{TERM}\n{RULE_GET}\n[[authority.request_rule]]\nhost = \"api.github.com\"\nmethods = [\"GET\"]\npath_prefixes = [\"/admin/\"]"
            )),
            Wide,
            &[(W, K::RequestRule)],
        ),
        row(
            "last request rule of a host removed",
            a(&format!("{TERM}\n{RULE_GET}")),
            a(TERM),
            Wide,
            &[(W, K::RequestRule)],
        ),
        row(
            "request rule for an unnarrowed host",
            a(TERM),
            a(&format!("{TERM}\n{RULE_GET}")),
            Narrow,
            &[(N, K::RequestRule)],
        ),
        row(
            "request rule path narrowed",
            a(&format!("{TERM}\n{RULE_GET}")),
            a(&format!(
                "{TERM}\n{}",
                RULE_GET.replace("/repos/", "/repos/org/")
            )),
            Narrow,
            &[(N, K::RequestRule)],
        ),
        row(
            "request rule rules reordered",
            a(&format!(
                "{TERM}\n{RULE_GET}\n[[authority.request_rule]]\nhost = \"api.github.com\"\nmethods = [\"HEAD\"]"
            )),
            a(&format!(
                "{TERM}\n[[authority.request_rule]]\nhost = \"api.github.com\"\nmethods = [\"HEAD\"]\n{RULE_GET}"
            )),
            Same,
            &[],
        ),
        // Deny entries and the operator's words.
        row(
            "deny entry removed",
            a("allow = [\"*.example.com\"]\ndeny = [\"admin.example.com\"]"),
            a("allow = [\"*.example.com\"]"),
            Wide,
            &[(W, K::Deny)],
        ),
        row(
            "deny entry added",
            a("allow = [\"*.example.com\"]"),
            a("allow = [\"*.example.com\"]\ndeny = [\"admin.example.com\"]"),
            Narrow,
            &[(N, K::Deny)],
        ),
        row(
            "deny entries folded into a wildcard",
            a("allow = [\"*.example.com\"]\ndeny = [\"a.example.com\", \"b.example.com\"]"),
            a("allow = [\"*.example.com\"]\ndeny = [\"*.example.com\"]"),
            Narrow,
            &[(N, K::Deny)],
        ),
        row(
            "deny reason removed",
            a(
                "allow = [\"*.example.com\"]\ndeny = [{ host = \"admin.example.com\", reason = \"no admin\" }]",
            ),
            a("allow = [\"*.example.com\"]\ndeny = [\"admin.example.com\"]"),
            Narrow,
            &[(C, K::OperatorReason)],
        ),
        row(
            "default_deny_reason changed",
            a("allow = [\"x.test\"]\ndefault_deny_reason = \"ask the platform team\""),
            a("allow = [\"x.test\"]\ndefault_deny_reason = \"ask security\""),
            Narrow,
            &[(C, K::OperatorReason)],
        ),
        // [global].
        row(
            "global deny entry removed",
            conf(
                "[global]\ndeny = [\"*:25\"]\n[[authority]]\nname = \"a\"\nallow = [\"mail.test\"]",
            ),
            conf("[[authority]]\nname = \"a\"\nallow = [\"mail.test\"]"),
            Wide,
            &[(W, K::Global)],
        ),
        row(
            "global deny entry added",
            conf("[[authority]]\nname = \"a\"\nallow = [\"mail.test\"]"),
            conf(
                "[global]\ndeny = [\"*:25\"]\n[[authority]]\nname = \"a\"\nallow = [\"mail.test\"]",
            ),
            Narrow,
            &[(N, K::Global)],
        ),
        // Settings of the grant.
        row(
            "sni_check off",
            a(GH),
            a(&format!("{GH}\nsni_check = false")),
            Wide,
            &[(W, K::SniCheck)],
        ),
        row(
            "watchdog removed",
            a(&format!("{GH}\nwatchdog = \"unix:/run/wd.sock\"")),
            a(GH),
            Wide,
            &[(W, K::Watchdog)],
        ),
        row(
            "watchdog added",
            a(GH),
            a(&format!("{GH}\nwatchdog = \"unix:/run/wd.sock\"")),
            Narrow,
            &[(N, K::Watchdog)],
        ),
        row(
            "max_connections raised",
            a(&format!("{GH}\nmax_connections = 10")),
            a(&format!("{GH}\nmax_connections = 100")),
            Wide,
            &[(W, K::Limits)],
        ),
        row(
            "connect_rate removed",
            a(&format!("{GH}\nconnect_rate = 5")),
            a(GH),
            Wide,
            &[(W, K::Limits)],
        ),
        row(
            "token added",
            a(GH),
            a(&format!(
                "{GH}\ntoken_sha256 = \"42e6b7873d248e37a115cb08d13a99147b10362deb90d006a03e5ce1ae11b824\""
            )),
            Wide,
            &[(W, K::Channel)],
        ),
        row(
            "socket opened to the group",
            a(GH),
            a(&format!("{GH}\nsocket_mode = \"0660\"")),
            Wide,
            &[(W, K::Channel)],
        ),
        // Asking the host (design section 20): answers can let a miss through.
        row(
            "ask added",
            a(GH),
            a(&format!("{GH}\nask = \"admin\"")),
            Wide,
            &[(W, K::Ask)],
        ),
        row(
            "ask removed",
            a(&format!("{GH}\nask = \"unix:/run/ask.sock\"")),
            a(GH),
            Narrow,
            &[(N, K::Ask)],
        ),
        row(
            "ask answered elsewhere",
            a(&format!("{GH}\nask = \"admin\"")),
            a(&format!(
                "{GH}\nask = \"http://127.0.0.1:7000/ask\"\nask_timeout_s = 5"
            )),
            Wide,
            &[(W, K::Ask), (C, K::Ask)],
        ),
        row(
            "placed on every node",
            a(&format!("{GH}\nnode = \"node-a\"")),
            a(GH),
            Wide,
            &[(W, K::Channel)],
        ),
        row(
            "placed on one node",
            a(GH),
            a(&format!("{GH}\nnode = \"node-a\"")),
            Narrow,
            &[(N, K::Channel)],
        ),
        // Whole authorities and sections.
        row(
            "authority added",
            conf(""),
            a(&format!("{GH}\nallow_private = [\"10.0.0.0/8\"]")),
            Wide,
            &[(W, K::Host), (W, K::AllowPrivate)],
        ),
        row(
            "authority removed",
            a(GH),
            conf(""),
            Narrow,
            &[(N, K::Host)],
        ),
        row(
            "a section that is not a grant",
            a(GH),
            format!("[upstream]\nmode = \"env\"\n{}", a(GH)),
            Narrow,
            &[(C, K::Section)],
        ),
        // Sections that change who may act or where a name goes: widenings of their own.
        row(
            "the proxy listener on every interface",
            a(GH),
            a(GH).replace("127.0.0.1:3128", "0.0.0.0:3128"),
            Wide,
            &[(W, K::Channel), (C, K::Section)],
        ),
        row(
            "the proxy listener back on loopback",
            a(GH).replace("127.0.0.1:3128", "192.0.2.7:3128"),
            a(GH),
            Narrow,
            &[(N, K::Channel), (C, K::Section)],
        ),
        row(
            "the proxy listener on another loopback port",
            a(GH),
            a(GH).replace("127.0.0.1:3128", "127.0.0.1:3129"),
            Narrow,
            &[(C, K::Channel), (C, K::Section)],
        ),
        row(
            "anonymous admin writes",
            a(GH).replace("[tls]", "admin = \"127.0.0.1:9090\"\n[tls]"),
            a(GH).replace(
                "[tls]",
                "admin = \"127.0.0.1:9090\"\nadmin_allow_anonymous_writes = true\n[tls]",
            ),
            Wide,
            &[(W, K::Channel), (C, K::Section)],
        ),
        row(
            "a name pinned by [resolver] hosts",
            a(GH),
            format!(
                "[resolver]\nhosts = {{ \"api.github.com\" = [\"10.1.2.3\"] }}\n{}",
                a(GH)
            ),
            Wide,
            &[(W, K::Host), (C, K::Section)],
        ),
        row(
            "a pinned name with fewer addresses",
            format!(
                "[resolver]\nhosts = {{ \"api.github.com\" = [\"10.1.2.3\", \"10.1.2.4\"] }}\n{}",
                a(GH)
            ),
            format!(
                "[resolver]\nhosts = {{ \"api.github.com\" = [\"10.1.2.3\"] }}\n{}",
                a(GH)
            ),
            Narrow,
            &[(N, K::Host), (C, K::Section)],
        ),
    ]
}

fn side(text: &str) -> Side {
    Side::of_config(&crate::config::parse(text, "t.toml").unwrap_or_else(|e| panic!("{e}\n{text}")))
}

#[test]
fn diff_over_pairs_of_configurations() {
    let rows = rows();
    assert!(rows.len() >= 30, "{} rows", rows.len());
    let mut failures = Vec::new();
    for r in &rows {
        let review = diff(&side(&r.old), &side(&r.new)).unwrap();
        let got: BTreeSet<(Direction, RiskClass)> =
            review.changes().map(|c| (c.direction, c.class)).collect();
        let want: BTreeSet<(Direction, RiskClass)> = r.changes.iter().copied().collect();
        if review.outcome != r.outcome || got != want {
            failures.push(format!(
                "{}: outcome {:?} (want {:?}), changes {got:?} (want {want:?}):\n{:#?}",
                r.name, review.outcome, r.outcome, review
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_risk_class_appears_in_the_table() {
    let seen: BTreeSet<RiskClass> = rows()
        .iter()
        .flat_map(|r| r.changes.iter().map(|(_, k)| *k))
        .collect();
    for k in [
        K::Host,
        K::Port,
        K::AllowPrivate,
        K::TlsTerminate,
        K::Credential,
        K::RequestRule,
        K::Deny,
        K::OperatorReason,
        K::SniCheck,
        K::Watchdog,
        K::Ask,
        K::Limits,
        K::Channel,
        K::Global,
        K::Section,
    ] {
        assert!(seen.contains(&k), "no row for {}", k.as_str());
    }
}

#[test]
fn a_wider_wildcard_names_what_it_replaces() {
    let review = diff(
        &side(&a("allow = [\"*.svc.example.net\"]")),
        &side(&a("allow = [\"*.example.net\"]")),
    )
    .unwrap();
    let c = &review.authorities[0].changes[0];
    assert_eq!(c.entry, "*.example.net");
    assert!(c.detail.contains("wider wildcard"), "{}", c.detail);
    assert!(c.detail.contains("*.svc.example.net"), "{}", c.detail);
}

#[test]
fn a_view_reads_back_and_builds_the_same_grant() {
    let config = crate::config::parse(
        &a(&format!("{TERM}\ndeny = [{{ host = \"x.github.com\", reason = \"no\" }}]\nwatchdog = \"unix:/run/wd.sock\"\nsocket_mode = \"0660\"\n{RULE_GET}\n{CRED}")),
        "t.toml",
    )
    .unwrap();
    let reach = Reach::of(&config.authorities[0], Sources::Hidden);
    assert_eq!(reach.credentials[0].source, None, "the source is not shown");
    let json = serde_json::to_string(&reach).unwrap();
    let back: Reach = serde_json::from_str(&json).unwrap();
    assert_eq!(back, reach);
    let rebuilt = back.authority(&[]).unwrap();
    assert_eq!(Reach::of(&rebuilt, Sources::Hidden).credentials, vec![]);
    assert!(
        compare(Some((&reach, &[])), Some((&back, &[])))
            .unwrap()
            .is_empty()
    );
    assert_eq!(rebuilt.socket_mode, 0o660);
}

#[test]
fn an_added_authority_lists_only_what_it_widens() {
    let changes = compare(
        None,
        Some((
            &Reach::of(
                &crate::config::parse(&a(&format!("{GH}\nwatchdog = \"unix:/w\"")), "t")
                    .unwrap()
                    .authorities[0],
                Sources::Shown,
            ),
            &[],
        )),
    )
    .unwrap();
    assert!(
        changes.iter().all(|c| c.direction == Direction::Widened),
        "{changes:#?}"
    );
    assert_eq!(changes.len(), 2, "{changes:#?}");
}
