//! The configuration's tables: whole files that load, every problem listed with its
//! location, and the messages a user reads.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::authority::parse_mode;
use super::validate::{Ctx, parse_sha256};
use super::{
    FieldError, Log, Registry, RegistryBackend, Timeouts, Upstream, check_node_name, parse,
    parse_authority,
};
use crate::error::PolicyError;
use crate::upstream::{PacOnError, PacSource};

fn errors(text: &str) -> Vec<String> {
    match parse(text, "m.toml") {
        Ok(_) => panic!("expected errors"),
        Err(PolicyError::Config(v)) => v,
        Err(e) => panic!("unexpected error kind {e}"),
    }
}

const FULL: &str = r#"
[listen]
socket_dir = "/run/egress-mediator"
tcp = "127.0.0.1:3128"
admin = "[::1]:9901"

[resolver]
nameservers = ["127.0.0.1:5353", "[::1]:53"]
hosts = { "Origin.Test." = ["127.0.0.1", "::1"], "bücher.test" = ["192.0.2.1"] }

[upstream]
mode = "direct"
parents = []
pac = ""
allowed_parents = []
pin_through_parent = false

[tls]
ca_dir = "/var/lib/egress-mediator/ca"
extra_ca_files = ["/etc/ssl/extra.pem"]

[timeouts]
request_head = 11
dns = 6
connect = 12
idle_tunnel = 301
shutdown_grace = 0
revoke_grace = 0
watchdog = 3

[limits]
request_head_bytes = 32768

[log]
decisions = "/var/log/egress/decisions.jsonl"

[global]
deny = ["*:25", "metadata.google.internal"]

[[authority]]
name = "agent-a"
allow = ["api.github.com", "raw.githubusercontent.com", "registry.npmjs.org:443"]
deny = []
allow_private = []
token_sha256 = "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08"
sni_check = true
tls_terminate = []
watchdog = ""

[[authority]]
name = "agent-b"
allow = ["origin.test"]
allow_private = ["127.0.0.1", "::1"]
sni_check = false
tls_terminate = ["origin.test"]
watchdog = "unix:/run/watchdog.sock"
socket_mode = "0660"
socket_uid = 1000
socket_gid = 1001
"#;

#[test]
fn full_config_loads() {
    let c = parse(FULL, "m.toml").unwrap();
    assert_eq!(
        c.listen.socket_dir,
        Some(PathBuf::from("/run/egress-mediator"))
    );
    assert_eq!(c.listen.tcp, Some("127.0.0.1:3128".parse().unwrap()));
    assert_eq!(c.listen.admin, Some("[::1]:9901".parse().unwrap()));
    assert_eq!(
        c.resolver.nameservers,
        vec![
            "127.0.0.1:5353".parse::<SocketAddr>().unwrap(),
            "[::1]:53".parse().unwrap()
        ]
    );
    assert_eq!(
        c.resolver.hosts.get("origin.test"),
        Some(&vec![
            "127.0.0.1".parse::<IpAddr>().unwrap(),
            "::1".parse().unwrap()
        ])
    );
    assert!(c.resolver.hosts.contains_key("xn--bcher-kva.test"));
    assert_eq!(
        c.upstream,
        Upstream {
            pin_through_parent: false,
            ..Upstream::default()
        }
    );
    assert_eq!(
        c.tls.ca_dir,
        Some(PathBuf::from("/var/lib/egress-mediator/ca"))
    );
    assert_eq!(
        c.tls.extra_ca_files,
        vec![PathBuf::from("/etc/ssl/extra.pem")]
    );
    assert_eq!(
        c.timeouts,
        Timeouts {
            request_head: Duration::from_secs(11),
            dns: Duration::from_secs(6),
            connect: Duration::from_secs(12),
            idle_tunnel: Duration::from_secs(301),
            shutdown_grace: Duration::ZERO,
            revoke_grace: Duration::ZERO,
            watchdog: Duration::from_secs(3),
            idle_upstream: Duration::from_secs(4),
        }
    );
    assert_eq!(c.limits.request_head_bytes, 32768);
    assert_eq!(
        c.log,
        Log::File(PathBuf::from("/var/log/egress/decisions.jsonl"))
    );
    assert_eq!(c.authorities.len(), 2);
    let a = &c.authorities[0];
    assert_eq!(a.grant.name(), "agent-a");
    assert!(a.grant.sni_check());
    assert_eq!(a.token_sha256.unwrap()[..4], [0x9f, 0x86, 0xd0, 0x81]);
    assert_eq!(a.token_sha256.unwrap()[31], 0x08);
    assert_eq!(a.socket_mode, 0o600);
    assert_eq!((a.socket_uid, a.socket_gid), (None, None));
    assert_eq!(
        a.grant.deny_entries().collect::<Vec<_>>(),
        ["*:25", "metadata.google.internal"]
    );
    let b = &c.authorities[1];
    assert_eq!(b.grant.name(), "agent-b");
    assert!(!b.grant.sni_check());
    assert_eq!(b.token_sha256, None);
    assert_eq!(b.socket_mode, 0o660);
    assert_eq!((b.socket_uid, b.socket_gid), (Some(1000), Some(1001)));
    assert_eq!(
        b.watchdog.as_ref().map(ToString::to_string).as_deref(),
        Some("unix:/run/watchdog.sock")
    );
    assert_eq!(b.grant.allow_private().len(), 2);
}

#[test]
fn empty_file_gives_defaults() {
    let c = parse("", "m.toml").unwrap();
    assert_eq!(
        (c.listen.socket_dir, c.listen.tcp, c.listen.admin),
        (None, None, None)
    );
    assert!(c.resolver.nameservers.is_empty() && c.resolver.hosts.is_empty());
    assert_eq!(c.upstream, Upstream::default());
    assert_eq!(
        c.timeouts,
        Timeouts {
            request_head: Duration::from_secs(10),
            dns: Duration::from_secs(5),
            connect: Duration::from_secs(10),
            idle_tunnel: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(10),
            revoke_grace: Duration::from_secs(5),
            watchdog: Duration::from_secs(2),
            idle_upstream: Duration::from_secs(4),
        }
    );
    assert_eq!(c.limits.request_head_bytes, 65536);
    assert_eq!(c.log, Log::Stdout);
    assert!(c.tls.ca_dir.is_none() && c.tls.extra_ca_files.is_empty());
    assert!(c.authorities.is_empty());
    let c = parse("[[authority]]\nname = \"a\"\n", "m.toml").unwrap();
    assert!(c.authorities[0].grant.sni_check());
    assert_eq!(c.authorities[0].grant.allow_entries().count(), 0);
    assert_eq!(c.authorities[0].watchdog, None);
}

#[test]
fn every_problem_is_listed_with_its_location() {
    let text = r#"[listen]
socket_dir = "/run/x"
bogus = 1
tcp = "localhost:3128"
admin = "0.0.0.0:9901"

[timeouts]
dns = "five"
connect = 0
idle_tunnel = 100000

[limits]
request_head_bytes = 10

[upstream]
mode = "pac"
parents = ["http://proxy:8080"]

[resolver]
nameservers = ["127.0.0.1"]
hosts = { "127.0.0.1" = ["1.2.3.4"], "a b" = ["1.2.3.4"], "ok.test" = ["nope"], "OK.test" = ["1.1.1.1"], "empty.test" = [] }

[global]
deny = ["*.com", "*:25"]

[[authority]]
name = "agent-a"
allow = ["example.com", "*.com", "a.*.com"]
nope = true
deny = [5]
token_sha256 = "abc"
socket_mode = "0666"
watchdog = "ftp://x"

[[authority]]
allow = ["x.example.com"]

[[authority]]
name = "agent-a"

[[authority]]
name = "bad name"
allow_private = ["10.0.0.1/8"]

[log]
decisions = ""

[extra]
x = 1
"#;
    assert_eq!(
        errors(text),
        vec![
            "m.toml:3:1: [listen]: unknown field `bogus`, expected one of `socket_dir`, `tcp`, `admin`, `admin_socket`, `admin_token_sha256`, `admin_allow_anonymous_writes`",
            "m.toml:4:7: [listen]: tcp \"localhost:3128\" is not an ip:port address (write \"127.0.0.1:3128\" or \"[::1]:3128\")",
            "m.toml:5:9: [listen]: admin \"0.0.0.0:9901\" is not a loopback address; the admin API must not be reachable from other hosts",
            "m.toml:8:7: [timeouts]: invalid type: string \"five\", expected u64",
            "m.toml:9:11: [timeouts]: connect = 0 is out of range; give whole seconds 1..=86400",
            "m.toml:10:15: [timeouts]: idle_tunnel = 100000 is out of range; give whole seconds 1..=86400",
            "m.toml:13:22: [limits]: request_head_bytes = 10 is out of range 8192..=1048576",
            "m.toml:16:8: [upstream]: mode = \"pac\" needs pac = \"/path/proxy.pac\" or \"https://host/proxy.pac\"",
            "m.toml:17:11: [upstream]: parents is only used with mode = \"parent\", not \"pac\"",
            "m.toml:20:16: [resolver]: nameserver \"127.0.0.1\" is not an ip:port address (write \"127.0.0.1:53\")",
            "m.toml:21:11: [resolver]: hosts key \"127.0.0.1\" is an IP address; keys must be names",
            "m.toml:21:38: [resolver]: hosts key: invalid host \"a b\": contains the control or space character ' '",
            "m.toml:21:72: [resolver]: hosts entry \"ok.test\": \"nope\" is not an IP address",
            "m.toml:21:81: [resolver]: hosts key \"OK.test\" is the same host as the key at m.toml:21:59",
            "m.toml:21:106: [resolver]: hosts entry \"empty.test\" has no addresses",
            "m.toml:24:9: [global]: invalid global deny entry \"*.com\": wildcard over public suffix \"com\"; write \"*.example.com\" for one domain",
            "m.toml:28:25: authority \"agent-a\": invalid allow entry \"*.com\": wildcard over public suffix \"com\"; write \"*.example.com\" for one domain",
            "m.toml:28:34: authority \"agent-a\": invalid allow entry \"a.*.com\": a wildcard must be a whole first label followed by a domain, like \"*.example.com\"",
            "m.toml:29:1: authority \"agent-a\": unknown field `nope`, expected one of `name`, `allow`, `deny`, `default_deny_reason`, `allow_private`, `token_sha256`, `sni_check`, `tls_terminate`, `watchdog`, `socket_mode`, `socket_uid`, `socket_gid`, `request_rule`, `credential`, `max_connections`, `connect_rate`, `connect_burst`, `ask`, `ask_timeout_s`, `max_pending_asks`, `node`",
            "m.toml:30:9: authority \"agent-a\": invalid type: integer `5`, expected a host pattern, or a table { host = \"...\", reason = \"...\" }",
            "m.toml:31:16: authority \"agent-a\": token_sha256 must be 64 hex digits (the SHA-256 of a non-empty token); omit the key if the authority does not use the TCP listener",
            "m.toml:32:15: authority \"agent-a\": socket_mode \"0666\": bits for others would let every local user act as this authority; use socket_gid and \"0660\" to share the socket with a group",
            "m.toml:33:12: authority \"agent-a\": watchdog \"ftp://x\" must be \"unix:/absolute/path\" or \"http://127.0.0.1:port/...\" (a loopback IP literal or localhost, no userinfo): the watchdog sees every allowed destination and must run on this host",
            "m.toml:35:1: authority[2]: missing key \"name\"",
            "m.toml:39:8: authority \"agent-a\": duplicate name; first defined at m.toml:27:8",
            "m.toml:42:8: authority \"bad name\": authority name \"bad name\" contains ' '; use only ASCII letters, digits, '-' and '_'",
            "m.toml:43:18: authority \"bad name\": invalid allow_private entry \"10.0.0.1/8\": CIDR has host bits set; write \"10.0.0.0/8\"",
            "m.toml:46:13: [log]: decisions is empty; write \"stdout\" or a file path",
            "m.toml:48:2: unknown top-level key \"extra\"; expected one of listen, resolver, upstream, tls, timeouts, limits, log, telemetry, global, registry, authority",
        ]
    );
}

#[test]
fn syntax_errors_name_the_file_and_position() {
    assert_eq!(
        errors("[listen\nx = 1\n"),
        vec!["m.toml:1:8: unclosed table, expected `]`"]
    );
    let e = errors("[listen]\ntcp = \"a\"\ntcp = \"b\"\n");
    assert_eq!(e.len(), 1);
    assert!(e[0].starts_with("m.toml:3:1: duplicate key"), "{e:?}");
}

#[test]
fn authority_must_be_an_array_of_tables() {
    assert_eq!(
        errors("[authority]\nname = \"a\"\n"),
        vec!["m.toml:1:1: authority must be an array of tables: write each one as [[authority]]"]
    );
    let e = errors("listen = 5\n");
    assert_eq!(
        e,
        vec!["m.toml:1:10: [listen]: must be a table, not integer"]
    );
}

#[test]
fn upstream_modes() {
    for (text, ok) in [
        ("mode = \"direct\"", true),
        ("mode = \"parent\"", false),
        ("mode = \"parent\"\nparents = [\"http://p:3128\"]", true),
        ("mode = \"env\"", true),
        ("mode = \"pac\"", false),
        ("mode = \"pac\"\npac = \"/etc/p.pac\"", true),
        ("mode = \"socks\"", false),
    ] {
        let r = parse(&format!("[upstream]\n{text}\n"), "m.toml");
        assert_eq!(r.is_ok(), ok, "{text}: {r:?}");
    }
    assert_eq!(
        errors("[upstream]\nmode = \"socks\"\n"),
        vec![
            "m.toml:2:8: [upstream]: unknown mode \"socks\"; expected one of \"direct\", \"parent\", \"env\", \"pac\", \"system\""
        ]
    );
    assert_eq!(
        errors("[upstream]\npac = \"/etc/p.pac\"\nallowed_parents = [\"p:1\"]\n"),
        vec![
            "m.toml:2:7: [upstream]: pac is only used with mode = \"pac\", not \"direct\"",
            "m.toml:3:19: [upstream]: allowed_parents is only used with mode = \"pac\" or \"system\", not \"direct\"",
        ]
    );
}

#[test]
fn upstream_system_and_negotiate_keys() {
    let c = parse(
        r#"[upstream]
mode = "system"
system_user = "alice"
dconf_databases = ["/home/alice/.config/dconf/user", "/etc/dconf/db/local"]
kioslaverc_files = ["/home/alice/.config/kioslaverc"]
allowed_parents = ["proxy.corp.example:8080"]
parent_auth = { "Proxy.Corp.Example:8080" = "negotiate" }
kerberos_ccache = "FILE:/var/lib/egress/krb5cc"
kerberos_keytab = "/etc/egress/mediator.keytab"
"#,
        "m.toml",
    )
    .unwrap();
    let u = &c.upstream;
    assert_eq!(u.mode, crate::config::UpstreamMode::System);
    assert_eq!(u.system.user.as_deref(), Some("alice"));
    assert_eq!(u.system.dconf.as_ref().map(Vec::len), Some(2));
    assert_eq!(
        u.parent_auth
            .get(&crate::parse_authority_form("proxy.corp.example:8080").unwrap()),
        Some(&crate::upstream::ParentAuth::Negotiate)
    );
    assert_eq!(
        u.kerberos.ccache.as_deref(),
        Some("FILE:/var/lib/egress/krb5cc")
    );
    assert_eq!(
        u.kerberos.keytab.as_deref(),
        Some("/etc/egress/mediator.keytab")
    );
    let c = parse(
        "[upstream]\nmode = \"parent\"\nparents = [\"https://p.corp:8443\"]\nparent_auth = { \"p.corp:8443\" = \"negotiate\" }\n",
        "m.toml",
    )
    .unwrap();
    assert_eq!(
        c.upstream.parents[0].auth,
        crate::upstream::ParentAuth::Negotiate
    );
    assert_eq!(
        errors(
            "[upstream]\nmode = \"parent\"\nparents = [\"socks5://s:1080\"]\nparent_auth = { \"s:1080\" = \"negotiate\", \"n:1\" = \"ntlm\" }\nkerberos_ccache = \"krb5cc\"\nsystem_user = \"bob\"\n"
        ),
        vec![
            "m.toml:4:28: [upstream]: parent_auth for s:1080: \"negotiate\" is for http:// and https:// parents, not socks5://",
            "m.toml:4:49: [upstream]: parent_auth: NTLM is not supported; use \"negotiate\" (Kerberos) or \"basic\"",
            "m.toml:5:19: [upstream]: kerberos_ccache: write a ccache name (\"FILE:/path\", \"DIR:/path\", \"KEYRING:persistent:1000\") or an absolute path",
            "m.toml:6:15: [upstream]: system_user is only used with mode = \"system\", not \"parent\"",
        ]
    );
    assert_eq!(
        errors(
            "[upstream]\nmode = \"system\"\nsystem_user = \"../x\"\ndconf_databases = [\"db/user\"]\n"
        ),
        vec![
            "m.toml:3:15: [upstream]: system_user \"../x\" is not a user name",
            "m.toml:4:20: [upstream]: dconf_databases entry \"db/user\" must be an absolute path",
        ]
    );
}

#[test]
fn upstream_parent_and_pac_keys() {
    let c = parse(
        r#"[upstream]
mode = "pac"
pac = "https://pac.corp.example/proxy.pac"
allowed_parents = ["Proxy.Corp.Example:8080", "[::1]:1080"]
pac_fetch_via = "http://u:pw@127.0.0.1:3128"
pin_through_parent = false
parent_retry_secs = 5
pac_cache_secs = 0
pac_refresh_secs = 60
pac_budget_ms = 50
pac_memory_mb = 4
pac_on_error = "direct"
parent_credentials_file = "/etc/egress/parents.cred"
"#,
        "m.toml",
    )
    .unwrap();
    let u = c.upstream;
    assert_eq!(u.mode, super::UpstreamMode::Pac);
    assert_eq!(
        u.pac,
        Some(PacSource::Url("https://pac.corp.example/proxy.pac".into()))
    );
    let allowed: Vec<String> = u.allowed_parents.iter().map(ToString::to_string).collect();
    assert_eq!(allowed, ["proxy.corp.example:8080", "[::1]:1080"]);
    assert_eq!(
        u.pac_fetch_via.as_ref().map(ToString::to_string).as_deref(),
        Some("http://127.0.0.1:3128")
    );
    assert!(!u.pin_through_parent);
    assert_eq!(u.parent_retry, Duration::from_secs(5));
    assert_eq!(u.pac_cache, Duration::ZERO);
    assert_eq!(u.pac_refresh, Duration::from_secs(60));
    assert_eq!(u.pac_budget, Duration::from_millis(50));
    assert_eq!(u.pac_memory, 4 << 20);
    assert_eq!(u.pac_on_error, PacOnError::Direct);

    let c = parse(
            "[upstream]\nmode = \"parent\"\nparents = [\"http://a:b@p.corp:3128\", \"socks5://127.0.0.1:1080\"]\n",
            "m.toml",
        )
        .unwrap();
    let shown: Vec<String> = c.upstream.parents.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["http://p.corp:3128", "socks5://127.0.0.1:1080"]);

    assert_eq!(
        errors(
            r#"[upstream]
mode = "parent"
parents = ["http://user:s3cret@p:80/x", "socks4://p:44", "p:3128"]
pac_budget_ms = 0
pac_on_error = "maybe"
parent_credentials_file = "rel"
"#
        ),
        vec![
            "m.toml:3:12: [upstream]: parent \"http://user:***@p:80/x\": a parent URL has no path, query or fragment: write scheme://host:port",
            "m.toml:3:41: [upstream]: parent \"socks4://p:44\": SOCKS4 is not supported; use socks5://",
            "m.toml:3:58: [upstream]: parent \"p:3128\": write scheme://host:port, like \"http://proxy.corp.example:8080\" or \"socks5://127.0.0.1:1080\"",
            "m.toml:4:17: [upstream]: pac_budget_ms = 0 is out of range 1..=10000",
            "m.toml:5:16: [upstream]: pac_on_error \"maybe\": write \"deny\" or \"direct\"",
            "m.toml:6:27: [upstream]: parent_credentials_file must be an absolute path",
        ]
    );
    assert_eq!(
        errors(
            "[upstream]\nmode = \"pac\"\npac = \"/p.pac\"\nallowed_parents = [\"p\"]\npac_fetch_via = \"http://p:1\"\n"
        ),
        vec![
            "m.toml:4:20: [upstream]: allowed_parents entry: invalid host \"p\": a port is required (host:port); write \"host:port\"",
            "m.toml:5:17: [upstream]: pac_fetch_via is only used when pac is an http(s):// URL",
        ]
    );
}

#[test]
fn socket_modes_and_tokens() {
    for (mode, want) in [
        ("0600", Ok(0o600)),
        ("600", Ok(0o600)),
        ("0660", Ok(0o660)),
        ("0640", Ok(0o640)),
    ] {
        assert_eq!(parse_mode(mode), want);
    }
    for bad in [
        "0666", "0601", "4600", "06000", "60", "0x600", "0680", "", "+600",
    ] {
        assert!(parse_mode(bad).is_err(), "{bad}");
    }
    let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let bytes = parse_sha256(hex).unwrap();
    assert_eq!(bytes[0], 0x9f);
    assert_eq!(parse_sha256(&hex.to_uppercase()), Some(bytes));
    assert_eq!(parse_sha256(&hex[1..]), None);
    assert_eq!(parse_sha256(&format!("{}g", &hex[1..])), None);
    assert_eq!(parse_sha256(&format!("{hex}00")), None);
    assert_eq!(
        parse_sha256("+f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
        None
    );
}

#[test]
fn design_example_wildcard_over_private_psl_suffix_is_accepted() {
    // Design section 11 grants "*.githubusercontent.com"; githubusercontent.com is in
    // the private section of the Public Suffix List, which does not count as public.
    let cfg = parse(
        "[[authority]]\nname = \"agent-a\"\nallow = [\"*.githubusercontent.com\"]\n",
        "m.toml",
    );
    assert!(cfg.is_ok(), "{cfg:?}");
}

#[test]
fn one_authority_from_a_flat_table() {
    let global = vec![crate::grant::DenyEntry::from("*:25")];
    let a = parse_authority(
        "name = \"api-made\"\nallow = [\"origin.test\"]\nallow_private = [\"127.0.0.0/8\"]\n",
        &global,
    )
    .unwrap();
    assert_eq!(a.grant.name(), "api-made");
    assert_eq!(a.grant.deny_entries().collect::<Vec<_>>(), ["*:25"]);
    assert_eq!(a.socket_mode, 0o600);

    let e = parse_authority(
        "name = \"x\"\nallow = [\"ok.test\", \"*.com\"]\nnope = 1\ntoken_sha256 = \"abc\"\n",
        &[],
    )
    .unwrap_err();
    let fields: Vec<&str> = e.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["allow", "nope", "token_sha256"], "{e:?}");
    assert!(
        e[0].message.starts_with("invalid allow entry \"*.com\""),
        "{e:?}"
    );
    assert!(e[1].message.contains("unknown field `nope`"), "{e:?}");

    let e = parse_authority("allow = [\"ok.test\"]\n", &[]).unwrap_err();
    assert_eq!(
        e,
        vec![FieldError {
            field: String::new(),
            message: "missing key \"name\"".into()
        }]
    );
    let e = parse_authority("name = \"bad name\"\n", &[]).unwrap_err();
    assert_eq!(e[0].field, "name", "{e:?}");
    let e = parse_authority("name = \"x\"\nsni_check = \"yes\"\n", &[]).unwrap_err();
    assert_eq!(e[0].field, "sni_check", "{e:?}");
}

#[test]
fn admin_listen_keys() {
    let c = parse(
            "[listen]\nsocket_dir = \"/run/m\"\nadmin_socket = \"/run/admin.sock\"\nadmin_token_sha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"\n[global]\ndeny = [\"*:25\"]\n",
            "m.toml",
        )
        .unwrap();
    assert_eq!(
        c.listen.admin_socket,
        Some(PathBuf::from("/run/admin.sock"))
    );
    assert_eq!(c.listen.admin_token_sha256.unwrap()[0], 0x9f);
    assert_eq!(c.global_deny, [crate::grant::DenyEntry::from("*:25")]);
    assert_eq!(
        errors(
            "[listen]\nsocket_dir = \"/run/m\"\nadmin_socket = \"/run/m/admin.sock\"\nadmin_token_sha256 = \"x\"\n"
        ),
        vec![
            "m.toml:3:16: [listen]: admin_socket \"/run/m/admin.sock\" is inside socket_dir; the admin API needs a socket of its own, never a channel's",
            "m.toml:4:22: [listen]: admin_token_sha256 must be 64 hex digits (the SHA-256 of a non-empty admin token); omit it for no token",
        ]
    );
    assert_eq!(
        errors("[listen]\nadmin_socket = \"rel.sock\"\n"),
        vec!["m.toml:2:16: [listen]: admin_socket \"rel.sock\" must be an absolute path"]
    );
}

#[test]
fn location_columns_count_characters() {
    let e = errors("# ünïcödé\n[log]\ndecisions = \"\" \n");
    assert_eq!(
        e,
        vec!["m.toml:3:13: [log]: decisions is empty; write \"stdout\" or a file path"]
    );
    let c = Ctx::new("ab\ncdé\nx", "f");
    assert_eq!(c.at(Some(0..1)), "f:1:1");
    assert_eq!(c.at(Some(3..4)), "f:2:1");
    assert_eq!(c.at(Some(5..7)), "f:2:3");
    assert_eq!(c.at(Some(6..7)), "f:2:3");
    assert_eq!(c.at(Some(100..101)), "f:3:2");
    assert_eq!(c.at(Some(8..9)), "f:3:1");
    assert_eq!(c.at(None), "f");
}

/// `upgrade` on a request rule: tokens load lowercase; h2c and non-tokens are errors
/// located at the rule.
#[test]
fn request_rule_upgrade_tokens_load_and_h2c_is_refused() {
    let with = |list: &str| {
        format!(
            r#"
[tls]
ca_dir = "/tmp/ca"

[[authority]]
name = "agent-a"
allow = ["origin.test"]
tls_terminate = ["origin.test"]

[[authority.request_rule]]
host = "origin.test"
upgrade = {list}
"#
        )
    };
    let c = parse(&with(r#"["Foo", "tls/1.2"]"#), "m.toml").unwrap();
    let rules = c.authorities[0].grant.request_rules();
    let tokens: Vec<&str> = rules[0].upgrade.iter().map(|t| t.as_str()).collect();
    assert_eq!(tokens, ["foo", "tls/1.2"]);
    let Err(PolicyError::Config(errors)) = parse(&with(r#"["h2c", "a b"]"#), "m.toml") else {
        panic!("expected errors");
    };
    assert_eq!(
        errors,
        [
            "m.toml:10:1: authority \"agent-a\": request_rule[1]: upgrade \"h2c\": h2c is never relayed (it would carry HTTP/2 requests past the request rules); clients that use TLS get HTTP/2 by ALPN",
            "m.toml:10:1: authority \"agent-a\": request_rule[1]: upgrade: upgrade token \"a b\" is not protocol-name[/protocol-version] of HTTP token characters (RFC 9110 section 7.8)",
        ]
    );
}

#[test]
fn request_rules_load_and_errors_are_located() {
    let good = r#"
[tls]
ca_dir = "/tmp/ca"

[[authority]]
name = "agent-a"
allow = ["origin.test"]
tls_terminate = ["origin.test"]

[[authority.request_rule]]
host = "origin.test"
methods = ["GET"]
path_prefixes = ["/public/"]
"#;
    let c = parse(good, "m.toml").unwrap();
    let rules = c.authorities[0].grant.request_rules();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].methods, ["GET"]);
    assert_eq!(rules[0].path_prefixes, ["/public/"]);

    let bad = r#"
[tls]
ca_dir = "/tmp/ca"

[[authority]]
name = "agent-a"
allow = ["origin.test"]
tls_terminate = ["origin.test"]

[[authority.request_rule]]
host = "origin.test"
methods = ["GET"]

[[authority.request_rule]]
host = "other.test"
methods = ["post"]
path_prefixes = ["public"]
"#;
    let Err(PolicyError::Config(errors)) = parse(bad, "m.toml") else {
        panic!("expected errors");
    };
    let joined = errors.join("\n");
    assert!(
            joined.contains("m.toml:14:1: authority \"agent-a\": request_rule[2]: host \"other.test\" is not covered by tls_terminate"),
            "{joined}"
        );
    assert!(
        joined.contains("request_rule[2]: method \"post\""),
        "{joined}"
    );
    assert!(
        joined.contains("request_rule[2]: path prefix \"public\" must start with /"),
        "{joined}"
    );

    let no_ca = good.replace("ca_dir = \"/tmp/ca\"", "");
    let Err(PolicyError::Config(errors)) = parse(&no_ca, "m.toml") else {
        panic!("expected errors");
    };
    assert_eq!(
        errors,
        [
            "m.toml:8:17: authority \"agent-a\": tls_terminate needs the CA that issues the leaf certificates: set [tls] ca_dir (created on first start)"
        ]
    );

    let unknown = format!(
        "{}\n[[authority.request_rule]]\nhost = \"origin.test\"\nnope = 1\n",
        &good[..good.find("[[authority.request_rule]]").unwrap()]
    );
    let Err(PolicyError::Config(errors)) = parse(&unknown, "m.toml") else {
        panic!("expected errors");
    };
    assert!(
        errors[0]
            .contains("unknown field `nope`, expected one of `host`, `methods`, `path_prefixes`, `headers`, `query`, `upgrade`"),
        "{errors:?}"
    );
}

#[test]
fn limit_keys_are_counts_and_a_burst_needs_a_rate() {
    let c = parse(
        "[limits]\nmax_connections = 500\nunidentified_connections = 40\n[[authority]]\nname = \"a\"\nmax_connections = 7\nconnect_rate = 5\n[[authority]]\nname = \"b\"\nconnect_rate = 2\nconnect_burst = 10\n",
        "m.toml",
    )
    .unwrap();
    assert_eq!(
        (
            c.limits.max_connections,
            c.limits.authority_connections,
            c.limits.unidentified_connections
        ),
        (500, 0, 40)
    );
    let a = &c.authorities[0].limits;
    assert_eq!(
        (a.max_connections, a.connect_rate, a.connect_burst),
        (Some(7), 5, 5)
    );
    let b = &c.authorities[1].limits;
    assert_eq!(
        (b.max_connections, b.connect_rate, b.connect_burst),
        (None, 2, 10)
    );
    assert_eq!(
        errors(
            "[limits]\nmax_connections = -1\n[[authority]]\nname = \"a\"\nconnect_burst = 3\n[[authority]]\nname = \"b\"\nconnect_rate = 1\nconnect_burst = 0\n"
        ),
        vec![
            "m.toml:2:19: [limits]: max_connections = -1 is out of range 0..=1000000",
            "m.toml:5:17: authority \"a\": connect_burst needs connect_rate (new connections per second) to be set",
            "m.toml:9:17: authority \"b\": connect_burst = 0 would refuse every connection; give at least 1, or omit it (it defaults to connect_rate)",
        ]
    );
}

const CREDENTIAL_BASE: &str = r#"
[tls]
ca_dir = "/tmp/ca"

[[authority]]
name = "agent-a"
allow = ["origin.test", "other.test"]
tls_terminate = ["origin.test"]
"#;

#[test]
fn credentials_load_with_their_defaults() {
    let text = format!(
        "{CREDENTIAL_BASE}
[[authority.credential]]
host = \"origin.test\"
header = \"Authorization\"
secret_env = \"ORIGIN_TOKEN\"
format = \"Bearer {{secret}}\"
placeholder = \"mediator:origin:agent-a\"
child_env = \"ORIGIN_TOKEN\"

[[authority.credential]]
host = \"origin.test\"
header = \"X-Api-Key\"
secret_file = \"/etc/egress/key\"
"
    );
    let mut c = parse(&text, "m.toml").unwrap();
    let creds = &mut c.authorities[0].credentials;
    assert_eq!(creds.len(), 2);
    assert_eq!(creds[0].host(), "origin.test");
    assert_eq!(creds[0].header(), "authorization");
    assert_eq!(creds[0].placeholder(), Some("mediator:origin:agent-a"));
    assert_eq!(creds[0].child_env(), Some("ORIGIN_TOKEN"));
    assert_eq!(
        creds[0].source,
        crate::config::SecretSource::Env("ORIGIN_TOKEN".into())
    );
    assert!(
        creds[0]
            .location
            .starts_with("m.toml:10:1: authority \"agent-a\": credential[1]")
    );
    assert!(!creds[0].has_secret());
    creds[0].set_secret(b"s3cret\n".to_vec()).unwrap();
    assert_eq!(creds[0].header_value(), b"Bearer s3cret");
    assert!(!format!("{:?}", creds[0]).contains("s3cret"));
    creds[1].set_secret(b"k".to_vec()).unwrap();
    assert_eq!(creds[1].header_value(), b"k");
    assert_eq!(creds[1].placeholder(), None);
    for bad in [&b"\n"[..], b"", b"a\nb", b"a\x00b", b" a", "é".as_bytes()] {
        let e = creds[1].set_secret(bad.to_vec()).unwrap_err().to_string();
        assert!(
            e.starts_with("secret_file \"/etc/egress/key\": the secret"),
            "{e}"
        );
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a table of located credential errors"
)]
fn credential_errors_are_located() {
    let cases: &[(&str, &str)] = &[
        (
            "host = \"other.test\"\nheader = \"Authorization\"\nsecret_env = \"T\"",
            "credential[1]: host \"other.test\" is not covered by tls_terminate",
        ),
        (
            "host = \"origin.test\"\nheader = \"Authorization\"\nsecret_env = \"T\"\nsecret_file = \"/k\"",
            "credential[1]: give either secret_file or secret_env, not both",
        ),
        (
            "host = \"origin.test\"\nheader = \"Authorization\"",
            "credential[1]: missing the secret: give secret_file",
        ),
        (
            "host = \"origin.test\"\nheader = \"Host\"\nsecret_env = \"T\"",
            "credential[1]: header \"Host\" frames or routes the request",
        ),
        (
            "host = \"origin.test\"\nheader = \"Bad Name\"\nsecret_env = \"T\"",
            "credential[1]: header \"Bad Name\" is not a header name",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nformat = \"Bearer\"",
            "credential[1]: format \"Bearer\" must hold {secret} exactly once",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_file = \"relative\"",
            "credential[1]: secret_file \"relative\" must be an absolute path",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nchild_env = \"T\"",
            "credential[1]: child_env needs a placeholder",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"short\"",
            "credential[1]: placeholder \"short\" must be 8 to 256 bytes long",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\nchild_env = \"LD_PRELOAD\"",
            "credential[1]: child_env \"LD_PRELOAD\" is a dynamic loader variable (LD_*)",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\nchild_env = \"ld_library_path\"",
            "credential[1]: child_env \"ld_library_path\" is a dynamic loader variable (LD_*)",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\nchild_env = \"HTTPS_PROXY\"",
            "credential[1]: child_env \"HTTPS_PROXY\" is a variable the shim sets itself",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\nchild_env = \"Https_Proxy\"",
            "credential[1]: child_env \"Https_Proxy\" is a variable the shim sets itself",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\nchild_env = \"no_proxy\"",
            "credential[1]: child_env \"no_proxy\" is a variable the shim sets itself",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\nchild_env = \"SSL_CERT_FILE\"",
            "credential[1]: child_env \"SSL_CERT_FILE\" is a variable the shim sets itself",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\nchild_env = \"NODE_EXTRA_CA_CERTS\"",
            "credential[1]: child_env \"NODE_EXTRA_CA_CERTS\" is a variable the shim sets itself",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\nchild_env = \"NPM_CONFIG_CAFILE\"",
            "credential[1]: child_env \"NPM_CONFIG_CAFILE\" is a variable the shim sets itself",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\nchild_env = \"JAVA_TOOL_OPTIONS\"",
            "credential[1]: child_env \"JAVA_TOOL_OPTIONS\" is a variable the shim sets itself",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\nchild_env = \"TMPDIR\"",
            "credential[1]: child_env \"TMPDIR\" is a variable the shim sets itself",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\nchild_env = \"API-TOKEN\"",
            "credential[1]: child_env \"API-TOKEN\" is not a variable name",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin:1\"\nchild_env = \"API_TOKEN\"\n\n[[authority.credential]]\nhost = \"origin.test\"\nheader = \"B\"\nsecret_env = \"U\"\nplaceholder = \"mediator:second\"\nchild_env = \"API_TOKEN\"",
            "m.toml:17:1: authority \"agent-a\": credential[2]: child_env \"API_TOKEN\" is the child_env of credential[1] too",
        ),
        (
            "host = \"origin.test\"\nheader = \"Authorization\"\nsecret_env = \"T\"\n\n[[authority.credential]]\nhost = \"ORIGIN.test\"\nheader = \"authorization\"\nsecret_env = \"U\"",
            "m.toml:15:1: authority \"agent-a\": credential[2]: header \"authorization\" on host \"ORIGIN.test\" is set by credential[1] too (host \"origin.test\")",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\n\n[[authority.credential]]\nhost = \"origin.test:443\"\nheader = \"A\"\nsecret_env = \"U\"",
            "m.toml:15:1: authority \"agent-a\": credential[2]: header \"a\" on host \"origin.test:443\" is set by credential[1] too",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nnope = 1",
            "unknown field `nope`, expected one of `host`, `header`, `secret_file`, `secret_env`, `format`, `placeholder`, `child_env`",
        ),
        (
            "host = \"origin.test\"\nheader = \"A\"\nsecret_env = \"T\"\nplaceholder = \"mediator:origin\"\n\n[[authority.credential]]\nhost = \"origin.test\"\nheader = \"B\"\nsecret_env = \"U\"\nplaceholder = \"mediator:origin:2\"",
            "m.toml:16:1: authority \"agent-a\": credential[2]: its placeholder and the placeholder of credential[1]: one is a substring of the other",
        ),
    ];
    for (table, expected) in cases {
        let text = format!("{CREDENTIAL_BASE}\n[[authority.credential]]\n{table}\n");
        let Err(PolicyError::Config(errors)) = parse(&text, "m.toml") else {
            panic!("expected errors for {table}");
        };
        let joined = errors.join("\n");
        assert!(joined.contains(expected), "{table}:\n{joined}");
        if expected.starts_with("credential[") {
            assert!(
                joined.starts_with("m.toml:10:1: authority \"agent-a\": "),
                "{joined}"
            );
        }
    }
}

#[test]
fn credentials_of_one_authority_may_share_a_host_or_a_header_but_not_both() {
    let text = format!(
        "{CREDENTIAL_BASE}
[[authority.credential]]
host = \"origin.test\"
header = \"Authorization\"
secret_env = \"T\"
placeholder = \"mediator:one\"
child_env = \"ONE_TOKEN\"

[[authority.credential]]
host = \"origin.test\"
header = \"X-Key\"
secret_env = \"U\"
placeholder = \"mediator:two\"
child_env = \"TWO_TOKEN\"

[[authority.credential]]
host = \"origin.test:8443\"
header = \"X-Other\"
secret_env = \"V\"

[[authority.credential]]
host = \"origin.test:9443\"
header = \"X-Other\"
secret_env = \"W\"
"
    );
    let c = parse(&text, "m.toml").unwrap();
    assert_eq!(c.authorities[0].credentials.len(), 4);
}

#[test]
fn policy_that_cannot_do_what_it_says_is_warned_about_with_its_location() {
    let text = r#"[listen]
tcp = "0.0.0.0:3128"

[tls]
ca_dir = "/tmp/ca"

[global]
deny = ["*.internal.example"]

[[authority]]
name = "agent-a"
allow = ["api.example.com", "a.internal.example", "b.example.com"]
deny = ["*"]
token_sha256 = "0000000000000000000000000000000000000000000000000000000000000001"
tls_terminate = ["api.example.com", "other.example.com"]

[[authority.request_rule]]
host = "other.example.com"
methods = ["GET"]

[[authority.credential]]
host = "other.example.com"
header = "Authorization"
secret_env = "T"
"#;
    let c = parse(text, "m.toml").unwrap();
    assert_eq!(
        c.warnings,
        [
            "m.toml:2:7: [listen]: tcp = \"0.0.0.0:3128\" is not a loopback address: every host that can reach it may try tokens (the listener is meant for this host's processes)",
            "m.toml:12:10: authority \"agent-a\": allow entry \"api.example.com\" never allows anything: deny entry \"*\" refuses every destination it matches",
            "m.toml:12:29: authority \"agent-a\": allow entry \"a.internal.example\" never allows anything: deny entry \"*\" refuses every destination it matches",
            "m.toml:12:51: authority \"agent-a\": allow entry \"b.example.com\" never allows anything: deny entry \"*\" refuses every destination it matches",
            "m.toml:17:1: authority \"agent-a\": request_rule[1]: no allow entry reaches host \"other.example.com\", so the rule never applies",
            "m.toml:21:1: authority \"agent-a\": credential[1]: no allow entry reaches host \"other.example.com\", so the secret is never used",
        ]
    );
    // Without a TCP listener, a token is never used; the global deny list shadows too.
    let text = text
        .replace("tcp = \"0.0.0.0:3128\"", "")
        .replace("deny = [\"*\"]", "deny = []");
    let c = parse(&text, "m.toml").unwrap();
    assert!(
        c.warnings.iter().any(|w| w.contains("allow entry \"a.internal.example\" never allows anything: deny entry \"*.internal.example\"")),
        "{:?}",
        c.warnings
    );
    assert!(
        c.warnings.iter().any(|w| w.starts_with(
            "m.toml:14:16: authority \"agent-a\": token_sha256 is set but there is no TCP listener"
        )),
        "{:?}",
        c.warnings
    );
    assert_eq!(c.warnings.len(), 4, "{:?}", c.warnings);
}

#[test]
fn registry_backends_and_their_keys() {
    let c = parse("", "m.toml").unwrap();
    assert_eq!(c.registry, Registry::default());
    assert_eq!(c.registry.backend, RegistryBackend::Local);
    let c = parse(
        "[registry]\nbackend = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\", \"https://[::1]:2379/\"]\nprefix = \"/t/\"\nmax_staleness_s = 3\nca_file = \"/ca.pem\"\n",
        "m.toml",
    )
    .unwrap();
    assert_eq!(c.registry.backend, RegistryBackend::Etcd);
    assert_eq!(c.registry.endpoints.len(), 2);
    assert_eq!(c.registry.prefix, "/t/");
    assert_eq!(c.registry.max_staleness, Duration::from_secs(3));
    let c = parse("[registry]\nstate_dir = \"/var/lib/x\"\n", "m.toml").unwrap();
    assert_eq!(
        c.registry.state_dir.as_deref(),
        Some(Path::new("/var/lib/x"))
    );
    for (text, want) in [
        ("[registry]\nbackend = \"sql\"\n", "backend \"sql\""),
        ("[registry]\nbackend = \"etcd\"\n", "needs endpoints"),
        (
            "[registry]\nstate_dir = \"relative\"\n",
            "state_dir: write an absolute path",
        ),
        (
            "[registry]\nbackend = \"etcd\"\nendpoints = [\"127.0.0.1:2379\"]\n",
            "write http://host:port",
        ),
        (
            "[registry]\nbackend = \"etcd\"\nendpoints = [\"ftp://a:1\"]\n",
            "scheme is http or https",
        ),
        (
            "[registry]\nbackend = \"etcd\"\nendpoints = [\"http://u@a:1/x\"]\n",
            "no path or userinfo",
        ),
        (
            "[registry]\nbackend = \"etcd\"\nendpoints = [\"http://a\"]\n",
            "not valid",
        ),
        (
            "[registry]\nbackend = \"etcd\"\nendpoints = [\"http://a:1\"]\nprefix = \"x\"\n",
            "prefix must start and end",
        ),
        (
            "[registry]\nbackend = \"etcd\"\nendpoints = [\"http://a:1\"]\nmax_staleness_s = 0\n",
            "out of range",
        ),
        (
            "[registry]\nbackend = \"etcd\"\nendpoints = [\"http://a:1\"]\ncert_file = \"/c\"\n",
            "cert_file and key_file go together",
        ),
        (
            "[registry]\nendpoints = [\"http://a:1\"]\n",
            "endpoints is for backend = \"etcd\"",
        ),
        (
            "[registry]\nbackend = \"memory\"\nstate_dir = \"/x\"\n",
            "\"memory\" keeps nothing",
        ),
        ("[registry]\nttl = 1\n", "unknown field `ttl`"),
    ] {
        let e = errors(text);
        assert!(
            e.iter().any(|l| l.contains(want) && l.contains("m.toml:")),
            "{text:?}: {e:?}"
        );
    }
}

#[test]
fn placement_by_node_is_checked_at_load_with_its_location() {
    let text = r#"
[registry]
node = "worker-7.eu-west-1.compute.internal"

[[authority]]
name = "everywhere"
allow = ["x.test"]

[[authority]]
name = "here"
allow = ["x.test"]
node = "worker-7.eu-west-1.compute.internal"

[[authority]]
name = "there"
allow = ["x.test"]
node = "worker-8"

[[authority]]
name = "star"
allow = ["x.test"]
node = "*"
"#;
    let mut c = parse(text, "m.toml").unwrap();
    assert_eq!(
        c.registry.node.as_deref(),
        Some("worker-7.eu-west-1.compute.internal")
    );
    let nodes: Vec<String> = c.authorities.iter().map(|a| a.node.to_string()).collect();
    assert_eq!(
        nodes,
        ["*", "worker-7.eu-west-1.compute.internal", "worker-8", "*"]
    );
    c.place("worker-7.eu-west-1.compute.internal");
    let here: Vec<&str> = c.authorities.iter().map(|a| a.grant.name()).collect();
    assert_eq!(here, ["everywhere", "here", "star"]);
    assert_eq!(c.placed_elsewhere, ["there"]);
    for bad in [
        "",
        "Worker-7",
        "-a",
        "a-",
        "a..b",
        "a_b",
        "a/b",
        "*x",
        "a b",
        &"a".repeat(64),
        &format!("{}.b", "a".repeat(250)),
    ] {
        assert!(check_node_name(bad).is_err(), "{bad:?}");
        for (section, key) in [
            ("[registry]", "node"),
            ("[[authority]]\nname = \"a\"", "node"),
        ] {
            let e = errors(&format!("{section}\n{key} = {bad:?}\n"));
            assert!(
                e.iter()
                    .any(|l| l.contains("node") && l.contains("m.toml:")),
                "{section} {bad:?}: {e:?}"
            );
        }
    }
    for good in [
        "a",
        "0",
        "worker-7",
        "ip-10-0-1-23.ec2.internal",
        &"a".repeat(63),
    ] {
        assert_eq!(check_node_name(good), Ok(()), "{good:?}");
    }
    let e = errors("[registry]\nnode = \"Worker-7\"\n");
    assert!(e.iter().any(|l| l.contains("\"worker-7\"")), "{e:?}");
}

#[test]
fn operator_reasons_reach_the_decision_and_are_checked_at_load() {
    let c = parse(
        r#"
[global]
deny = [{ host = "*:25", reason = "no mail from agents" }, "*:23"]

[[authority]]
name = "agent-a"
allow = ["ok.test", "*.pastebin.com", "mail.test"]
deny = ["plain.test", { host = "*.pastebin.com", reason = "paste sites are off limits; use gist.corp" }]
default_deny_reason = "ask #netops for new hosts"
"#,
        "m.toml",
    )
    .unwrap();
    let g = &c.authorities[0].grant;
    let message = |t: &str| g.decide(&crate::parse_authority_form(t).unwrap()).message;
    assert_eq!(
        message("x.pastebin.com:443").as_deref(),
        Some("paste sites are off limits; use gist.corp")
    );
    assert_eq!(
        message("mail.test:25").as_deref(),
        Some("no mail from agents")
    );
    assert_eq!(message("mail.test:23"), None, "a plain entry has no reason");
    assert_eq!(message("plain.test:443"), None);
    assert_eq!(
        message("elsewhere.test:443").as_deref(),
        Some("ask #netops for new hosts"),
        "outside the grant"
    );
    assert_eq!(message("ok.test:443"), None, "an allow carries no message");

    // Checked at load, each at its location.
    let long = "x".repeat(401);
    assert_eq!(
        errors(&format!(
            r#"
[global]
deny = [{{ host = "*:25", reason = "tab	inside" }}]

[[authority]]
name = "a"
deny = [{{ host = "b.test", reason = "{long}" }}]
default_deny_reason = ""
"#
        )),
        [
            "m.toml:3:9: [global]: invalid reason of global deny entry \"*:25\": a reason is printable ASCII only; byte 3 is '\\t'",
            "m.toml:7:9: authority \"a\": invalid reason of deny entry \"b.test\": a reason is at most 400 bytes; this one has 401",
            "m.toml:8:23: authority \"a\": invalid default_deny_reason: a reason must not be empty",
        ]
    );
    assert_eq!(
        errors("[[authority]]\nname = \"a\"\ndeny = [{ host = \"c.test\", reson = \"typo\" }]\n"),
        ["m.toml:3:28: authority \"a\": unknown field `reson`, expected `host` or `reason`"]
    );
    assert_eq!(
        errors("[[authority]]\nname = \"a\"\ndefault_deny_reason = \"caf\u{e9}\"\n"),
        [
            "m.toml:3:23: authority \"a\": invalid default_deny_reason: a reason is printable ASCII only; byte 3 is '\u{e9}'"
        ]
    );
}

#[test]
fn the_otlp_endpoint_is_an_http_url() {
    let c = parse(
        "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\n",
        "m.toml",
    )
    .unwrap();
    let e = c.otlp_endpoint.unwrap();
    assert_eq!(
        (e.authority.as_str(), e.path.as_str()),
        ("127.0.0.1:4318", "/v1/logs")
    );
    let c = parse(
        "[telemetry]\notlp_endpoint = \"http://collector.test/otlp/v1/logs\"\n",
        "m.toml",
    )
    .unwrap();
    let e = c.otlp_endpoint.unwrap();
    assert_eq!(
        (e.authority.as_str(), e.path.as_str()),
        ("collector.test:4318", "/otlp/v1/logs")
    );
    assert!(parse("", "m.toml").unwrap().otlp_endpoint.is_none());
    for bad in [
        "https://x.test:4318",
        "127.0.0.1:4318",
        "http://",
        "http://u@x.test",
    ] {
        let e = errors(&format!("[telemetry]\notlp_endpoint = {bad:?}\n"));
        assert!(e[0].contains("is not an OTLP/HTTP URL"), "{bad}: {e:?}");
    }
}

#[test]
fn asking_is_typed_at_load_and_checked_with_its_location() {
    let c = parse(
        "[[authority]]\nname = \"a\"\nask = \"unix:/run/ask.sock\"\nask_timeout_s = 5\n[[authority]]\nname = \"b\"\nask = \"admin\"\n[[authority]]\nname = \"c\"\n",
        "m.toml",
    )
    .unwrap();
    let a = c.authorities[0].ask.as_ref().unwrap();
    assert_eq!(a.endpoint.to_string(), "unix:/run/ask.sock");
    assert_eq!((a.timeout, a.max_pending), (Duration::from_secs(5), 8));
    let b = c.authorities[1].ask.as_ref().unwrap();
    assert_eq!(
        (&b.endpoint, b.timeout, b.max_pending),
        (
            &crate::config::AskEndpoint::Admin,
            Duration::from_secs(30),
            8
        )
    );
    assert!(c.authorities[2].ask.is_none());
    assert_eq!(
        errors("[[authority]]\nname = \"a\"\nask = \"http://10.0.0.1/\"\n")[0],
        "m.toml:3:7: authority \"a\": ask \"http://10.0.0.1/\" must be \"unix:/absolute/path\", \"http://127.0.0.1:port/...\" (a loopback IP literal or localhost, no userinfo) or \"admin\": the questions name the hosts a child reaches for and must stay on this host"
    );
    assert_eq!(
        errors("[[authority]]\nname = \"a\"\nmax_pending_asks = 2\n"),
        [
            "m.toml:3:20: authority \"a\": max_pending_asks needs ask (where the questions go); set ask, or remove max_pending_asks"
        ]
    );
    let e = errors(
        "[[authority]]\nname = \"a\"\nask = \"admin\"\nask_timeout_s = 0\nmax_pending_asks = 5000\n",
    );
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].contains("m.toml:4:17") && e[0].contains("ask_timeout_s = 0"),
        "{e:?}"
    );
    assert!(
        e[1].contains("m.toml:5:20") && e[1].contains("out of range 0..=1024"),
        "{e:?}"
    );
}
