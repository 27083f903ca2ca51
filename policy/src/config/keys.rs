//! Every key of `mediator.toml` in one table: its section, default, an example and what
//! it means. The config reference of `docs/operating.md` is rendered from it
//! ([`reference`](fn@reference)); unit tests keep the page equal to the rendering, the keys equal to
//! those the parser accepts, and each checked default equal to what an empty config
//! yields. To change the page, change this table and run
//! `REGENERATE_DOCS=1 cargo test -p policy config::keys`.

use super::Config;

/// One key of one section.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// The key (`socket_dir`).
    pub key: &'static str,
    /// Its default, as the reference shows it (Markdown).
    pub default: &'static str,
    /// An example value (Markdown).
    pub example: &'static str,
    /// What it means (Markdown).
    pub meaning: &'static str,
    /// The default an empty configuration yields, rendered as `default`'s first code span
    /// shows it, for the test that reads it back (`None`: a default in words only).
    pub check: Option<fn(&Config) -> String>,
}

/// A key without a checked default.
const fn key(
    key: &'static str,
    default: &'static str,
    example: &'static str,
    meaning: &'static str,
) -> Key {
    Key {
        key,
        default,
        example,
        meaning,
        check: None,
    }
}

impl Key {
    /// The same key, its default checked by `check` against an empty config.
    const fn checked(self, check: fn(&Config) -> String) -> Self {
        Self {
            check: Some(check),
            ..self
        }
    }
}

/// One section (`[listen]`, `[[authority]]`) and its keys.
#[derive(Debug, Clone, Copy)]
pub struct Section {
    /// The heading: `[listen]`, `[[authority.credential]]`.
    pub heading: &'static str,
    /// Prose before the table (Markdown; may be empty).
    pub before: &'static str,
    /// The keys, in the reference's order.
    pub keys: &'static [Key],
    /// Prose after the table (Markdown; may be empty).
    pub after: &'static str,
}

/// Every section of `mediator.toml`, in the reference's order.
#[rustfmt::skip]
pub const SECTIONS: &[Section] = &[
    Section { heading: "[listen]", before: "", after: "", keys: &[
        key("socket_dir", "none (no Unix sockets)", "`\"/run/egress-mediator\"`", "one socket per authority, `<socket_dir>/<name>.sock`"),
        key("tcp", "none", "`\"0.0.0.0:3128\"`", "the shared TCP listener; clients name their authority by credential"),
        key("admin", "none", "`\"127.0.0.1:9901\"`", "the admin API; a loopback address only"),
        key("admin_socket", "none", "`\"/run/egress-mediator-admin/admin.sock\"`", "the admin API on a Unix socket of its own (mode 0600), never inside `socket_dir`"),
        key("admin_token_sha256", "none (no token)", "`\"9f86d081…\"` (64 hex)", "SHA-256 of the bearer token the admin API requires on every path but `/healthz`, `/readyz` and `/metrics`"),
        key("admin_allow_anonymous_writes", "`false`", "`true`", "let the TCP admin API create, reload and revoke without a token (warned at start); the admin socket is guarded by its file mode instead").checked(|c| c.listen.admin_allow_anonymous_writes.to_string()),
    ] },
    Section { heading: "[resolver]", before: "", after: "", keys: &[
        key("nameservers", "`[]`: the system's `/etc/resolv.conf`", "`[\"127.0.0.1:5353\"]`", "DNS servers, `ip:port`"),
        key("hosts", "`{}`", "`{ \"origin.test\" = [\"127.0.0.1\"] }`", "static answers, consulted before DNS (still vetted)"),
    ] },
    Section { heading: "[upstream]", before: "", after: "", keys: &[
        key("mode", "`\"direct\"`", "`\"pac\"`", "`direct`, `parent`, `env`, `pac` or `system` (the desktop's proxy settings) ([routing.md](routing.md))").checked(|c| format!("{:?}", c.upstream.mode.as_str())),
        key("parents", "`[]`", "`[\"http://proxy.corp.example:8080\"]`", "`mode = \"parent\"`: parents tried left to right (`http://[user:pass@]h:p`, `https://[user:pass@]h:p`, `socks5://h:p`)"),
        key("pac", "none", "`\"/etc/egress/proxy.pac\"`", "`mode = \"pac\"`: a file path or an `http(s)://` URL"),
        key("allowed_parents", "`[]`", "`[\"proxy.corp.example:8080\"]`", "the parents a PAC may name, `host:port`"),
        key("pin_through_parent", "`true`", "`false`", "a parent's CONNECT names the vetted IP (else the canonical name)").checked(|c| c.upstream.pin_through_parent.to_string()),
        key("parent_retry_secs", "`30`", "`60`", "a parent that failed at the connection level is tried last for this long").checked(|c| c.upstream.parent_retry.as_secs().to_string()),
        key("parent_credentials_file", "none", "`\"/etc/egress-mediator-secrets/parents.cred\"`", "lines `host:port user:password` for the parents"),
        key("parent_auth", "`{}` (Basic)", "`{ \"proxy.corp.example:8080\" = \"negotiate\" }`", "per parent `host:port`: `basic` or `negotiate` (Kerberos, RFC 4559)"),
        key("kerberos_ccache", "none (`KRB5CCNAME`, else the default cache)", "`\"FILE:/var/lib/egress-mediator/krb5cc\"`", "the credential cache Negotiate takes tickets from"),
        key("kerberos_keytab", "none (`KRB5_CLIENT_KTNAME`)", "`\"/etc/egress/mediator.keytab\"`", "a client keytab to get tickets with"),
        key("gssapi_library", "none (`libgssapi_krb5.so.2` from the loader's search path)", "`\"/opt/krb5/lib/libgssapi_krb5.so.2\"`", "the GSSAPI library Negotiate loads (absolute; not writable by group or others)"),
        key("system_user", "none", "`\"alice\"`", "`mode = \"system\"`: read this user's desktop settings before the system defaults"),
        key("dconf_databases", "the databases of `/etc/dconf/profile/user`", "`[\"/etc/dconf/db/local\"]`", "`mode = \"system\"`: exactly these dconf databases"),
        key("kioslaverc_files", "`~system_user/.config/kioslaverc`, then `/etc/xdg/kioslaverc`", "`[\"/etc/xdg/kioslaverc\"]`", "`mode = \"system\"`: exactly these kioslaverc files"),
        key("pac_cache_secs", "`300`", "`0`", "PAC answers cached per destination; 0 = evaluate every time").checked(|c| c.upstream.pac_cache.as_secs().to_string()),
        key("pac_refresh_secs", "`300`", "`0`", "the PAC is fetched again this often; 0 = never").checked(|c| c.upstream.pac_refresh.as_secs().to_string()),
        key("pac_budget_ms", "`200`", "`100`", "CPU time of one PAC evaluation").checked(|c| c.upstream.pac_budget.as_millis().to_string()),
        key("pac_memory_mb", "`16`", "`32`", "memory of the PAC engine").checked(|c| (c.upstream.pac_memory / (1024 * 1024)).to_string()),
        key("pac_on_error", "`\"deny\"`", "`\"direct\"`", "what a PAC that throws or overruns its budget means"),
        key("pac_fetch_via", "none (direct)", "`\"http://proxy.corp.example:8080\"`", "fetch the PAC through this parent"),
    ] },
    Section { heading: "[tls]", before: "", after: "", keys: &[
        key("ca_dir", "none (no TLS termination)", "`\"/var/lib/egress-mediator/ca\"`", "the CA leaves are issued from (`ca.pem`, `ca-key.pem` 0600); created on first start if absent"),
        key("extra_ca_files", "`[]`", "`[\"/etc/ssl/corp-root.pem\"]`", "PEM bundles trusted upstream besides the system store"),
    ] },
    Section { heading: "[timeouts]", before: "Whole seconds, at most 86400 (a day); `shutdown_grace` and `revoke_grace` may be 0, every\nother timeout is at least 1 (`1..=86400`). A value out of range is an error.", after: "", keys: &[
        key("request_head", "`10`", "`5`", "reading a request head").checked(|c| c.timeouts.request_head.as_secs().to_string()),
        key("dns", "`5`", "`3`", "one resolution").checked(|c| c.timeouts.dns.as_secs().to_string()),
        key("connect", "`10`", "`5`", "one upstream connect").checked(|c| c.timeouts.connect.as_secs().to_string()),
        key("idle_tunnel", "`300`", "`900`", "a tunnel with no bytes either way is closed after this; a plain `http://` request whose upstream (origin or parent) moves no byte this long while its answer is awaited gets `504 upstream_failure`").checked(|c| c.timeouts.idle_tunnel.as_secs().to_string()),
        key("shutdown_grace", "`10`", "`20`", "on SIGTERM, live connections get this long (may be 0)").checked(|c| c.timeouts.shutdown_grace.as_secs().to_string()),
        key("revoke_grace", "`5`", "`0`", "a revoked authority's live connections get this long (may be 0)").checked(|c| c.timeouts.revoke_grace.as_secs().to_string()),
        key("watchdog", "`2`", "`1`", "an authority's watchdog must answer within this").checked(|c| c.timeouts.watchdog.as_secs().to_string()),
        key("idle_upstream", "`4`", "`30`", "an idle upstream connection of a terminated tunnel, kept for the next tunnel of the same authority to the same host, pin and route, is closed after this; keep it below the origins' own keep-alive timeouts (5 s is common)").checked(|c| c.timeouts.idle_upstream.as_secs().to_string()),
    ] },
    Section { heading: "[limits]", before: "`request_head_bytes` is `8192..=1048576`; the connection counts are `0..=1000000` (0:\nderived). A value out of range is an error.", after: "`mediator check` and the `ready` line print the values in force.", keys: &[
        key("request_head_bytes", "`65536`", "`16384`", "larger request heads get 431 (8192..=1048576)").checked(|c| c.limits.request_head_bytes.to_string()),
        key("max_connections", "`0`: derived from the open-files limit", "`5000`", "open client connections in all").checked(|c| c.limits.max_connections.to_string()),
        key("authority_connections", "`0`: derived", "`500`", "the default cap per authority").checked(|c| c.limits.authority_connections.to_string()),
        key("unidentified_connections", "`0`: derived", "`500`", "TCP connections whose authority is not known yet").checked(|c| c.limits.unidentified_connections.to_string()),
        key("idle_upstream_connections", "`256`", "`1024`", "idle upstream connections of terminated tunnels kept for reuse, in all (`0..=100000`; 0 turns reuse off); when full, the authority holding the most gives up its oldest").checked(|c| c.limits.idle_upstream_connections.to_string()),
        key("authority_idle_upstream_connections", "`32`", "`8`", "the same, per authority (`0..=100000`; 0 turns reuse off); an authority at its cap gives up its own oldest").checked(|c| c.limits.authority_idle_upstream_connections.to_string()),
    ] },
    Section { heading: "[log]", before: "", after: "", keys: &[
        key("decisions", "`\"stdout\"`", "`\"/var/log/egress-mediator/decisions.jsonl\"`", "`\"stdout\"` or a file (appended, created 0600, reopened on SIGUSR1)"),
        key("format", "`\"native\"`", "`\"ocsf\"`", "`native` (the mediator's JSON lines) or `ocsf` (OCSF 1.5.0 Network Activity events, class 4001: [control.md](control.md#ocsf))").checked(|c| format!("{:?}", c.log_format.as_str())),
        key("instance", "the host name", "`\"mediator-eu-1\"`", "the name every decision record carries as `instance` (with `run`, random per start): which mediator wrote it"),
    ] },
    Section { heading: "[telemetry]", before: "Decision records sent off the box besides the decision log ([control.md](control.md#otlp)).", after: "", keys: &[
        key("otlp_endpoint", "none", "`\"http://127.0.0.1:4318\"`", "an OTLP/HTTP receiver: each record also goes there as an OTLP log record (protobuf), batched through a bounded queue that never delays a decision; what it drops is counted (`mediator_export_dropped_total`)"),
    ] },
    Section { heading: "[global]", before: "", after: "", keys: &[
        key("deny", "`[]`", "`[\"*:25\", { host = \"*.pastebin.com\", reason = \"paste sites are off limits\" }]`", "deny entries applied to every authority, those of the admin API included; a table entry carries the operator's `reason` (printable ASCII, at most 400 bytes), given to the denied client as `message`"),
    ] },
    Section { heading: "[registry]", before: "Where authorities created through the admin API are kept ([control.md](control.md#the-registry-authorities-that-outlive-the-process)). Nothing secret is stored: the table, its generation, `created_at`, `expires_at`, the token's SHA-256.", after: "", keys: &[
        key("backend", "`\"local\"`", "`\"etcd\"`", "`local` (files under `state_dir`, written durably), `etcd` (shared by every replica; built with the cargo feature `etcd`) or `memory` (lost when the process ends; warned at start)").checked(|c| format!("{:?}", c.registry.backend.as_str())),
        key("state_dir", "`$STATE_DIRECTORY`, else `$XDG_STATE_HOME/egress-mediator`, else `/var/lib/egress-mediator` as root, else `~/.local/state/egress-mediator`", "`\"/var/lib/egress-mediator\"`", "`local`: the directory of the records (made 0700; one mediator at a time: it is locked)"),
        key("endpoints", "`[]`", "`[\"http://10.0.0.5:2379\", \"http://10.0.0.6:2379\"]`", "`etcd`: the members' client URLs (`http://` or `https://`, host and port)").checked(|c| format!("{:?}", c.registry.endpoints)),
        key("prefix", "`\"/egress-mediator/\"`", "`\"/team-a/egress/\"`", "`etcd`: every key lives under it: `<prefix>fleet/<name>`, `<prefix>nodes/<node>/<name>`, the name index `<prefix>names/<name>` ([placement](#placement-one-node-or-every-replica))").checked(|c| format!("{:?}", c.registry.prefix)),
        key("max_staleness_s", "`10`", "`5`", "`etcd`: how long a replica may go without confirming its view is current before it refuses decisions under registry authorities (`registry_unavailable`), 1..=3600").checked(|c| c.registry.max_staleness.as_secs().to_string()),
        key("ca_file", "none", "`\"/etc/egress-mediator/etcd-ca.pem\"`", "`etcd` over https: the CA the members' certificates chain to"),
        key("cert_file", "none", "`\"/etc/egress-mediator/etcd-client.pem\"`", "`etcd` over https: client certificate (with `key_file`)"),
        key("key_file", "none", "`\"/etc/egress-mediator/etcd-client.key\"`", "`etcd` over https: client key (with `cert_file`)"),
        key("node", "`$MEDIATOR_NODE`, else the host name (in lower case)", "`\"worker-7\"`", "the node this replica serves: it serves the authorities placed on this node or on `\"*\"`, and (`etcd`) reads no record of another node's ([placement](#placement-one-node-or-every-replica)); a DNS name in lower case, as Kubernetes names nodes (`spec.nodeName`)"),
    ] },
    Section { heading: "[[authority]]", before: "", after: "", keys: &[
        key("name", "required", "`\"agent-a\"`", "the authority; letters, digits, `-`, `_` (its socket is `<name>.sock`)"),
        key("allow", "`[]` (nothing)", "`[\"api.github.com:443\", \"*.githubusercontent.com\"]`", "host patterns it may reach"),
        key("deny", "`[]`", "`[\"gist.githubusercontent.com\", { host = \"*.pastebin.com\", reason = \"use gist.corp\" }]`", "host patterns it may not reach (beat `allow`); a table entry carries the operator's `reason` (printable ASCII, at most 400 bytes), given to the denied client as `message`"),
        key("default_deny_reason", "none", "`\"ask #netops for new hosts\"`", "the operator's words for a host outside the grant (`not_in_allowlist`, `port_not_allowed`), given as `message`; printable ASCII, at most 400 bytes"),
        key("allow_private", "`[]`", "`[\"10.20.0.0/16\"]`", "CIDRs excepted from the non-public-address refusal"),
        key("token_sha256", "none (no TCP access)", "`\"42e6b787…\"` (64 hex)", "SHA-256 of its token on the TCP listener (`mediator hash-token`)"),
        key("sni_check", "`true`", "`false`", "a CONNECT to 443 must carry a ClientHello whose SNI is the CONNECT host"),
        key("tls_terminate", "`[]`", "`[\"api.github.com\"]`", "host patterns whose TLS the mediator terminates (needs `[tls] ca_dir`)"),
        key("watchdog", "none", "`\"unix:/run/watchdog.sock\"`", "asked before each allowed connection; can only narrow"),
        key("socket_mode", "`\"0600\"`", "`\"0660\"`", "mode of its socket file (octal string; no bits for others)"),
        key("socket_uid", "the mediator's", "`1000`", "owner of its socket file"),
        key("socket_gid", "the mediator's", "`20001`", "group of its socket file"),
        key("request_rule", "none", "see below", "`[[authority.request_rule]]` tables narrowing terminated requests"),
        key("credential", "none", "see below", "`[[authority.credential]]` tables: secrets the mediator adds to terminated requests ([tls.md](tls.md#credentials-the-child-never-sees))"),
        key("max_connections", "`[limits] authority_connections`", "`200`", "its cap on open connections"),
        key("connect_rate", "`0` (unlimited)", "`50`", "new connections per second (token bucket)"),
        key("connect_burst", "`connect_rate`", "`100`", "the bucket's size"),
        key("ask", "none (a grant miss is denied at once)", "`\"unix:/run/host/ask.sock\"`, `\"http://127.0.0.1:7000/ask\"`, `\"admin\"`", "hold a grant miss (`not_in_allowlist`, `port_not_allowed`) and ask the host: the question is POSTed there (`admin`: no endpoint, the admin API's `/v1/asks` only); see [control.md](control.md#asking-the-host)"),
        key("ask_timeout_s", "`30`", "`120`", "how long a request is held for the answer before it is denied `ask_timeout`, 1..=3600; needs `ask`"),
        key("max_pending_asks", "`8`", "`2`", "requests of this authority held at once; one more is denied `ask_overloaded` at once, 1..=1024; needs `ask`"),
        key("node", "`\"*\"` (every replica)", "`\"worker-7\"`", "where it is served: `\"*\"` on every replica, or a node name: only on the replica whose `[registry] node` it is (its socket and credential exist there only; elsewhere its token gets 407 like any unknown credential)"),
    ] },
    Section { heading: "[[authority.request_rule]]", before: "", after: "", keys: &[
        key("host", "required", "`\"api.github.com\"`", "a host of the authority's `tls_terminate`"),
        key("methods", "`[]` (any)", "`[\"GET\", \"HEAD\"]`", "the methods allowed to that host"),
        key("path_prefixes", "`[]` (any)", "`[\"/repos/\"]`", "the path prefixes allowed to that host"),
        key("headers", "`{}` (none)", "`{ \"content-type\" = \"application/json*\" }`", "headers the request must carry: each value equals the pattern, or starts with it when it ends in `*`"),
        key("query", "any query", "`[\"page\", \"per_page\"]`", "the query parameter names allowed (decoded); `[]`: no query"),
        key("upgrade", "`[]` (none)", "`[\"foo/1\"]`", "upgrade tokens besides `websocket` (always relayed) that the requests this rule allows may switch to (RFC 9110 section 7.8, any case); `h2c` is refused ([tls.md](tls.md#websocket-and-other-upgrades-through-termination))"),
    ] },
    Section { heading: "[[authority.credential]]", before: "", after: "", keys: &[
        key("host", "required", "`\"api.github.com\"`", "the host pattern the secret belongs to; must be covered by `tls_terminate`"),
        key("header", "required", "`\"Authorization\"`", "the request header the secret goes in"),
        key("secret_file", "one of the two", "`\"/etc/egress/secrets/github\"`", "file holding the secret (one trailing newline ignored); not readable by others"),
        key("secret_env", "one of the two", "`\"GITHUB_TOKEN\"`", "variable of the mediator's own environment holding the secret"),
        key("format", "`\"{secret}\"`", "`\"Bearer {secret}\"`", "the header value, `{secret}` exactly once"),
        key("placeholder", "none (always add)", "`\"mediator:github:agent-a\"`", "what the child holds; the header is set only where the client sent it"),
        key("child_env", "none", "`\"GITHUB_TOKEN\"`", "the shim (`--config F --authority A`) sets this variable to the placeholder"),
    ] },
];

/// The config reference as `docs/operating.md` shows it: one heading and table per
/// section, from ``#### `[listen]` `` to the end of the last table.
pub fn reference() -> String {
    let mut out = String::new();
    for (i, s) in SECTIONS.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("#### `{}`\n\n", s.heading));
        if !s.before.is_empty() {
            out.push_str(s.before);
            out.push_str("\n\n");
        }
        out.push_str("| key | default | example | meaning |\n|---|---|---|---|\n");
        for k in s.keys {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                k.key, k.default, k.example, k.meaning
            ));
        }
        if !s.after.is_empty() {
            out.push('\n');
            out.push_str(s.after);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {

    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;
    use crate::config::parse;

    /// `docs/operating.md`, from this crate's directory.
    fn guide_path() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operating.md")
    }

    /// The rendered part of the page: from the first section heading to the next `## `.
    fn rendered_part(page: &str) -> Option<(usize, usize)> {
        let start = page.find("#### `[listen]`")?;
        let end = start + page[start..].find("\n## ")? + 1;
        Some((start, end))
    }

    #[test]
    fn the_reference_in_the_operator_guide_is_the_rendered_table() {
        let path = guide_path();
        let page = std::fs::read_to_string(&path).unwrap();
        let (start, end) = rendered_part(&page).expect("the config reference in docs/operating.md");
        let want = format!("{}\n", reference());
        if std::env::var_os("REGENERATE_DOCS").is_some() {
            let page = format!("{}{want}{}", &page[..start], &page[end..]);
            std::fs::write(&path, page).unwrap();
            return;
        }
        assert!(
            page[start..end] == want,
            "docs/operating.md's config reference differs from policy/src/config/keys.rs; \
             change the table and run REGENERATE_DOCS=1 cargo test -p policy config::keys\n\
             --- rendered ---\n{want}"
        );
    }

    /// The keys serde names for a section, read from its unknown-field error (the one list
    /// of a `deny_unknown_fields` struct's fields the parser exposes).
    fn accepted(probe: &str) -> BTreeSet<String> {
        let err = parse(probe, "probe.toml").unwrap_err().to_string();
        let list = err
            .split("expected one of ")
            .nth(1)
            .or_else(|| err.split("expected ").nth(1))
            .unwrap_or_else(|| panic!("no field list in: {err}"));
        list.lines()
            .next()
            .unwrap_or_default()
            .replace(" or ", ", ")
            .split(", ")
            .map(|f| f.trim().trim_matches('`').to_owned())
            .collect()
    }

    #[test]
    fn the_table_lists_exactly_the_keys_the_parser_accepts() {
        let probes = [
            ("[listen]", "[listen]\nzz_unknown = 1\n"),
            ("[resolver]", "[resolver]\nzz_unknown = 1\n"),
            ("[upstream]", "[upstream]\nzz_unknown = 1\n"),
            ("[tls]", "[tls]\nzz_unknown = 1\n"),
            ("[timeouts]", "[timeouts]\nzz_unknown = 1\n"),
            ("[limits]", "[limits]\nzz_unknown = 1\n"),
            ("[log]", "[log]\nzz_unknown = 1\n"),
            ("[telemetry]", "[telemetry]\nzz_unknown = 1\n"),
            ("[global]", "[global]\nzz_unknown = 1\n"),
            ("[registry]", "[registry]\nzz_unknown = 1\n"),
            (
                "[[authority]]",
                "[[authority]]\nname = \"a\"\nzz_unknown = 1\n",
            ),
            (
                "[[authority.request_rule]]",
                "[[authority]]\nname = \"a\"\n[[authority.request_rule]]\nzz_unknown = 1\n",
            ),
            (
                "[[authority.credential]]",
                "[[authority]]\nname = \"a\"\n[[authority.credential]]\nzz_unknown = 1\n",
            ),
        ];
        let headings: Vec<&str> = SECTIONS.iter().map(|s| s.heading).collect();
        let probed: Vec<&str> = probes.iter().map(|(h, _)| *h).collect();
        assert_eq!(
            headings, probed,
            "every section of the table is probed, in order"
        );
        for (heading, probe) in probes {
            let section = SECTIONS.iter().find(|s| s.heading == heading).unwrap();
            let listed: BTreeSet<String> = section.keys.iter().map(|k| k.key.to_owned()).collect();
            assert_eq!(listed, accepted(probe), "{heading}");
        }
        // Every top-level table has its section.
        let tops = accepted("[zz_not_a_section]\n");
        for top in tops {
            let heading = if top == "authority" {
                "[[authority]]".to_owned()
            } else {
                format!("[{top}]")
            };
            assert!(
                headings.contains(&heading.as_str()),
                "{heading} has no section"
            );
        }
    }

    #[test]
    fn checked_defaults_are_what_an_empty_config_yields() {
        let empty = parse("", "empty.toml").unwrap();
        let mut checked = 0;
        for section in SECTIONS {
            for key in section.keys {
                let Some(check) = key.check else { continue };
                let shown =
                    key.default.split('`').nth(1).unwrap_or_else(|| {
                        panic!("{}: no code span in {:?}", key.key, key.default)
                    });
                assert_eq!(check(&empty), shown, "{} {}", section.heading, key.key);
                checked += 1;
            }
        }
        assert!(checked >= 23, "{checked} defaults checked");
    }
}
