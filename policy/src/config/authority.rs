//! `[[authority]]` (design section 11): one table per authority, validated into an
//! [`Authority`] whose [`Grant`] is frozen. The same check serves the configuration file
//! and [`parse_authority`] (an authority created through the admin API), so both accept
//! exactly the same tables. Also here: the per-request rules (`[[authority.request_rule]]`),
//! the socket mode, the token hash and the watchdog URL check (the watchdog must run on
//! this host). This file never opens the socket or contacts the watchdog.

use crate::error::ValueError;
use std::collections::BTreeMap;
use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::credential::{self, Credential, CredentialSpec};
use super::raw::RawAuthority;
use super::registry::Placement;
use super::validate::{Ctx, MAX_CONNECTIONS, Validator, covers, parse_sha256};
use super::watchdog::WatchdogEndpoint;
use crate::grant::{DenyEntry, Grant, GrantField, GrantSpec, RequestRuleSpec};

/// One validated `[[authority]]`: its frozen grant and how its channel socket is made.
#[derive(Debug)]
pub struct Authority {
    /// The frozen grant (its name is the authority's name).
    pub grant: Grant,
    /// SHA-256 of the token, 32 bytes, when the authority may use the TCP listener.
    pub token_sha256: Option<[u8; 32]>,
    /// Mode of the Unix socket file (default `0o600`; never a bit for others).
    pub socket_mode: u32,
    /// Owner uid of the socket file (default: the mediator's).
    pub socket_uid: Option<u32>,
    /// Group gid of the socket file (default: the mediator's).
    pub socket_gid: Option<u32>,
    /// The watchdog that may narrow this authority's allowed decisions, if any.
    pub watchdog: Option<WatchdogEndpoint>,
    /// How much of the mediator this authority may hold (design section 13).
    pub limits: AuthorityLimits,
    /// Secrets the mediator adds for this authority (design section 14), in table order;
    /// their secrets are loaded by the caller ([`Credential::set_secret`]).
    pub credentials: Vec<Credential>,
    /// Where it is served (`node`): every replica, or one node's.
    pub node: Placement,
}

/// An authority's own limits (design section 13).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuthorityLimits {
    /// Open client connections of this authority (`max_connections`); `None`: the
    /// mediator's `[limits] authority_connections`.
    pub max_connections: Option<u32>,
    /// New connections per second (`connect_rate`), refilled continuously; 0: unlimited.
    pub connect_rate: u32,
    /// The token bucket's size (`connect_burst`): how many new connections may come at
    /// once; `connect_rate` when not given.
    pub connect_burst: u32,
}

/// One problem with an authority table given on its own (see [`parse_authority`]): the key
/// it concerns and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The key of the `[[authority]]` table (`"allow"`, `"token_sha256"`, an unknown key as
    /// written, ...), or `""` when the problem concerns the table as a whole.
    pub field: String,
    /// What is wrong, naming the entry where there is one.
    pub message: String,
}

/// Builds one authority from `text`, a TOML document whose top-level keys are the keys of
/// one `[[authority]]` table (the admin API turns its flat JSON body into this). It is
/// validated by the same code as an `[[authority]]` of a configuration file, and
/// `global_deny` (see [`Config::global_deny`](super::Config::global_deny)) is folded into
/// its grant.
///
/// # Errors
/// Every problem found, each tied to the key it concerns ([`FieldError::field`]).
pub fn parse_authority(
    text: &str,
    global_deny: &[DenyEntry],
) -> Result<Authority, Vec<FieldError>> {
    const ORIGIN: &str = "authority";
    // A leading newline keeps offset 0 (where whole-table problems are reported) outside
    // every key, so they are never pinned on the first key.
    let text = format!("\n{text}");
    let (root, syntax) = DeTable::parse_recoverable(&text);
    if !syntax.is_empty() {
        return Err(syntax
            .iter()
            .map(|e| FieldError {
                field: String::new(),
                message: e.message().to_owned(),
            })
            .collect());
    }
    let table = root.get_ref();
    let value = Spanned::new(0..text.len(), DeValue::Table(table.clone()));
    let label = label_of(value.get_ref(), "authority");
    let mut v = Validator::new(Ctx::new(&text, ORIGIN));
    let authority = v
        .table::<RawAuthority>(&label, &value)
        .and_then(|raw| match &raw.name {
            Some(_) => v.authority(&raw, &label, 0..1, global_deny),
            None => {
                v.error(Some(0..1), &label, "missing key \"name\"");
                None
            }
        });
    // Table order, as in `parse`.
    let errors = v.into_errors();
    match authority {
        Some(a) if errors.is_empty() => Ok(a),
        _ => Err(errors
            .iter()
            .map(|(offset, message)| {
                let at = *offset..offset.saturating_add(1);
                // The key whose key or value holds the offset; else (inside an array of
                // tables, `[[deny]]`, whose value span is its header only) the last key
                // written before it.
                let field = table
                    .iter()
                    .find(|(k, val)| covers(&k.span(), &at) || covers(&val.span(), &at))
                    .or_else(|| {
                        table
                            .iter()
                            .filter(|(k, _)| k.span().start <= *offset)
                            .max_by_key(|(k, _)| k.span().start)
                    })
                    .map(|(k, _)| k.get_ref().to_string())
                    .unwrap_or_default();
                FieldError {
                    field,
                    message: strip_location(message, ORIGIN, &label),
                }
            })
            .collect()),
    }
}

impl Validator<'_> {
    /// TLS termination issues leaves from the CA in `[tls] ca_dir`: without one, every
    /// non-empty `tls_terminate` is an error at its location.
    pub(super) fn terminate_needs_ca(&mut self, authorities: &Spanned<DeValue<'_>>) {
        let DeValue::Array(items) = authorities.get_ref() else {
            return;
        };
        for item in items {
            let Some(list) = item.get_ref().get("tls_terminate") else {
                continue;
            };
            if matches!(list.get_ref(), DeValue::Array(a) if !a.is_empty()) {
                let what = label_of(item.get_ref(), "authority");
                self.error(
                    Some(list.span()),
                    &what,
                    "tls_terminate needs the CA that issues the leaf certificates: set [tls] ca_dir (created on first start)",
                );
            }
        }
    }

    /// Validates the `[[authority]]` array: each table, and names unique across it.
    /// Returns the authorities that are valid (an invalid one is reported and skipped).
    pub(super) fn authorities(
        &mut self,
        value: &Spanned<DeValue<'_>>,
        global_deny: &[DenyEntry],
    ) -> Vec<Authority> {
        let DeValue::Array(items) = value.get_ref() else {
            self.error(
                Some(value.span()),
                "",
                "authority must be an array of tables: write each one as [[authority]]",
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut seen: BTreeMap<String, Range<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            // Name the authority in messages as early as possible, even before its table
            // deserializes cleanly.
            let what = label_of(item.get_ref(), &format!("authority[{}]", i + 1));
            let Some(raw) = self.table::<RawAuthority>(&what, item) else {
                continue;
            };
            let Some(name) = &raw.name else {
                self.error(Some(item.span()), &what, "missing key \"name\"");
                continue;
            };
            let label = format!("authority {:?}", name.get_ref());
            if let Some(first) = seen.get(name.get_ref()) {
                let first = self.at(Some(first.clone()));
                self.error(
                    Some(name.span()),
                    &label,
                    format!("duplicate name; first defined at {first}"),
                );
                continue;
            }
            seen.insert(name.get_ref().clone(), name.span());
            if let Some(a) = self.authority(&raw, &label, item.span(), global_deny) {
                out.push(a);
            }
        }
        out
    }

    /// Validates one authority table whose name is known to be present (`span`: where
    /// problems that no key explains are reported).
    fn authority(
        &mut self,
        raw: &RawAuthority,
        label: &str,
        span: Range<usize>,
        global_deny: &[DenyEntry],
    ) -> Option<Authority> {
        let spec = grant_spec(raw);
        let grant = match Grant::build(&spec, global_deny) {
            Ok(g) => Some(g),
            Err(errors) => {
                for e in errors {
                    let entry = |list: Option<&Vec<Spanned<String>>>| {
                        list.and_then(|l| l.get(e.index)).map(Spanned::span)
                    };
                    let at = match e.field {
                        GrantField::Name => raw.name.as_ref().map(Spanned::span),
                        GrantField::Allow => entry(raw.allow.as_ref()),
                        GrantField::Deny => raw
                            .deny
                            .as_ref()
                            .and_then(|l| l.get(e.index))
                            .map(Spanned::span),
                        GrantField::DefaultDenyReason => {
                            raw.default_deny_reason.as_ref().map(Spanned::span)
                        }
                        GrantField::AllowPrivate => entry(raw.allow_private.as_ref()),
                        GrantField::TlsTerminate => entry(raw.tls_terminate.as_ref()),
                        GrantField::RequestRule => raw
                            .request_rule
                            .as_ref()
                            .and_then(|rules| rules.get(e.index))
                            .map(Spanned::span),
                        // Located by the [global] table's own check.
                        GrantField::GlobalDeny => None,
                    };
                    self.error(at.or_else(|| Some(span.clone())), label, e.message);
                }
                None
            }
        };

        let token_sha256 = raw.token_sha256.as_ref().and_then(|t| match parse_sha256(t.get_ref()) {
            Some(bytes) => Some(bytes),
            None => {
                self.error(
                    Some(t.span()),
                    label,
                    "token_sha256 must be 64 hex digits (the SHA-256 of a non-empty token); omit the key if the authority does not use the TCP listener",
                );
                None
            }
        });

        let mut socket_mode = 0o600;
        if let Some(m) = &raw.socket_mode {
            match parse_mode(m.get_ref()) {
                Ok(mode) => socket_mode = mode,
                Err(why) => self.error(
                    Some(m.span()),
                    label,
                    format!("socket_mode {:?}: {why}", m.get_ref()),
                ),
            }
        }

        // An empty value means no watchdog.
        let watchdog = match raw.watchdog.as_ref().filter(|w| !w.get_ref().is_empty()) {
            None => None,
            Some(w) => match WatchdogEndpoint::parse(w.get_ref()) {
                Ok(e) => Some(e),
                Err(why) => {
                    self.error(Some(w.span()), label, why);
                    None
                }
            },
        };

        let limits = self.authority_limits(raw, label);
        let node = self.placement(raw, label);
        let grant = grant?;
        let credentials = self.credentials(raw, label, &grant);
        self.unreachable_policy(raw, label, &grant, &credentials);

        Some(Authority {
            grant,
            credentials,
            token_sha256,
            socket_mode,
            socket_uid: raw.socket_uid,
            socket_gid: raw.socket_gid,
            watchdog,
            limits,
            node,
        })
    }

    /// An authority's `node`: `"*"` when absent, or when it is not a node name (then
    /// reported with its location; the file does not load).
    fn placement(&mut self, raw: &RawAuthority, label: &str) -> Placement {
        let Some(n) = &raw.node else {
            return Placement::Fleet;
        };
        Placement::parse(n.get_ref()).unwrap_or_else(|why| {
            self.error(
                Some(n.span()),
                label,
                format!("node: {why}; or \"*\" for every replica"),
            );
            Placement::Fleet
        })
    }

    /// Warnings for policy of one authority that cannot do what it says.
    fn unreachable_policy(
        &mut self,
        raw: &RawAuthority,
        label: &str,
        grant: &Grant,
        credentials: &[Credential],
    ) {
        for (i, deny) in grant.shadowed_allows() {
            let entry = raw.allow.as_ref().and_then(|l| l.get(i));
            self.warn(
                entry.map(Spanned::span),
                label,
                format!(
                    "allow entry {:?} never allows anything: deny entry {deny:?} refuses every destination it matches",
                    entry.map(|e| e.get_ref().as_str()).unwrap_or_default()
                ),
            );
        }
        for (i, host) in grant.request_rule_hosts() {
            if !grant.reaches(host) {
                let span = raw
                    .request_rule
                    .as_ref()
                    .and_then(|r| r.get(i))
                    .map(Spanned::span);
                self.warn(
                    span,
                    label,
                    format!(
                        "request_rule[{}]: no allow entry reaches host {:?}, so the rule never applies",
                        i + 1,
                        host.source
                    ),
                );
            }
        }
        let spans: Vec<_> = raw.credential.iter().flatten().map(Spanned::span).collect();
        for (i, c) in credentials.iter().enumerate() {
            if !grant.reaches(c.pattern()) {
                self.warn(
                    spans.get(i).cloned(),
                    label,
                    format!(
                        "credential[{}]: no allow entry reaches host {:?}, so the secret is never used",
                        i + 1,
                        c.host()
                    ),
                );
            }
        }
    }

    /// Without `[listen] tcp`, a `token_sha256` is never asked for: a warning at each.
    pub(super) fn tokens_need_tcp(&mut self, authorities: &Spanned<DeValue<'_>>) {
        let DeValue::Array(items) = authorities.get_ref() else {
            return;
        };
        for item in items {
            let Some(token) = item.get_ref().get("token_sha256") else {
                continue;
            };
            let what = label_of(item.get_ref(), "authority");
            self.warn(
                Some(token.span()),
                &what,
                "token_sha256 is set but there is no TCP listener ([listen] tcp), so the token is never used",
            );
        }
    }

    /// `[[authority.credential]]` of one authority whose grant is valid.
    fn credentials(&mut self, raw: &RawAuthority, label: &str, grant: &Grant) -> Vec<Credential> {
        let mut out = Vec::new();
        let mut positions = Vec::new();
        for (i, item) in raw.credential.iter().flatten().enumerate() {
            let r = item.get_ref();
            let spec = CredentialSpec {
                host: r.host.clone(),
                header: r.header.clone(),
                secret_file: r.secret_file.clone(),
                secret_env: r.secret_env.clone(),
                format: r.format.clone(),
                placeholder: r.placeholder.clone(),
                child_env: r.child_env.clone(),
            };
            let location = format!(
                "{}: {label}: credential[{}]",
                self.at(Some(item.span())),
                i + 1
            );
            match credential::build(&spec, i + 1, location, |p| grant.terminates_pattern(p)) {
                Ok(c) => {
                    out.push(c);
                    positions.push((i + 1, item.span()));
                }
                Err(errors) => {
                    for e in errors {
                        self.error(Some(item.span()), label, e);
                    }
                }
            }
        }
        let numbered: Vec<(usize, &Credential)> =
            positions.iter().map(|(p, _)| *p).zip(out.iter()).collect();
        for (at, e) in credential::check_pairs(&numbered) {
            let span = positions
                .iter()
                .find(|(p, _)| *p == at)
                .map(|(_, s)| s.clone());
            self.error(span, label, e);
        }
        out
    }

    /// `max_connections`, `connect_rate` and `connect_burst` of one authority.
    fn authority_limits(&mut self, raw: &RawAuthority, label: &str) -> AuthorityLimits {
        /// New connections per second an authority may be given at most.
        const MAX_RATE: u32 = 100_000;
        let max_connections = self
            .count(
                &raw.max_connections,
                label,
                "max_connections",
                MAX_CONNECTIONS,
            )
            .filter(|&n| n > 0);
        let connect_rate = self
            .count(&raw.connect_rate, label, "connect_rate", MAX_RATE)
            .unwrap_or(0);
        let burst = self.count(&raw.connect_burst, label, "connect_burst", MAX_RATE);
        let connect_burst = match (burst, connect_rate) {
            (Some(0), _) => {
                self.error(
                    raw.connect_burst.as_ref().map(Spanned::span),
                    label,
                    "connect_burst = 0 would refuse every connection; give at least 1, or omit it (it defaults to connect_rate)",
                );
                0
            }
            (Some(_), 0) => {
                self.error(
                    raw.connect_burst.as_ref().map(Spanned::span),
                    label,
                    "connect_burst needs connect_rate (new connections per second) to be set",
                );
                0
            }
            (Some(b), _) => b,
            (None, rate) => rate,
        };
        AuthorityLimits {
            max_connections,
            connect_rate,
            connect_burst,
        }
    }
}

/// `[[authority.request_rule]]` as written; [`Grant::build`] validates them.
fn request_rule_specs(raw: &RawAuthority) -> Vec<RequestRuleSpec> {
    raw.request_rule
        .iter()
        .flatten()
        .map(|r| {
            let r = r.get_ref();
            RequestRuleSpec {
                host: r.host.clone().unwrap_or_default(),
                methods: r.methods.clone().unwrap_or_default(),
                path_prefixes: r.path_prefixes.clone().unwrap_or_default(),
                headers: r.headers.clone().unwrap_or_default().into_iter().collect(),
                query: r.query.clone(),
                upgrade: r.upgrade.clone().unwrap_or_default(),
            }
        })
        .collect()
}

/// The grant as the table writes it, before any check.
fn grant_spec(raw: &RawAuthority) -> GrantSpec {
    GrantSpec {
        name: raw
            .name
            .as_ref()
            .map(|n| n.get_ref().clone())
            .unwrap_or_default(),
        allow: strings(raw.allow.as_ref()),
        deny: raw
            .deny
            .iter()
            .flatten()
            .map(|d| d.get_ref().0.clone())
            .collect(),
        default_deny_reason: raw
            .default_deny_reason
            .as_ref()
            .map(|r| r.get_ref().clone()),
        allow_private: strings(raw.allow_private.as_ref()),
        sni_check: raw.sni_check.unwrap_or(true),
        tls_terminate: strings(raw.tls_terminate.as_ref()),
        request_rules: request_rule_specs(raw),
        advice: crate::grant::Advice::Operator,
    }
}

fn strings(list: Option<&Vec<Spanned<String>>>) -> Vec<String> {
    list.map(|l| l.iter().map(|s| s.get_ref().clone()).collect())
        .unwrap_or_default()
}

/// Removes the `ORIGIN[:LINE:COL]: ` and `LABEL: ` prefixes the validator puts on messages.
fn strip_location(message: &str, origin: &str, label: &str) -> String {
    let rest = message.strip_prefix(origin).unwrap_or(message);
    let rest = rest.trim_start_matches(|c: char| c == ':' || c.is_ascii_digit());
    let rest = rest.strip_prefix(' ').unwrap_or(rest);
    rest.strip_prefix(label)
        .and_then(|r| r.strip_prefix(": "))
        .unwrap_or(rest)
        .to_owned()
}

/// Parses a socket mode: 3 or 4 octal digits, no setuid/setgid/sticky bits, no bits for
/// "others".
pub(crate) fn parse_mode(s: &str) -> Result<u32, ValueError> {
    if !(3..=4).contains(&s.len()) || !s.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(ValueError::ModeDigits);
    }
    let mode = u32::from_str_radix(s, 8).map_err(|_| ValueError::ModeDigits)?;
    if mode > 0o777 {
        return Err(ValueError::ModeSpecial);
    }
    if mode & 0o007 != 0 {
        return Err(ValueError::ModeOthers);
    }
    Ok(mode)
}

/// How messages name an `[[authority]]` table: `authority "NAME"` as soon as its `name`
/// is a string, else `unnamed` (before its table has deserialized cleanly).
fn label_of(table: &DeValue<'_>, unnamed: &str) -> String {
    match table.get("name").and_then(|n| n.get_ref().as_str()) {
        Some(name) => format!("authority {name:?}"),
        None => unnamed.to_owned(),
    }
}
