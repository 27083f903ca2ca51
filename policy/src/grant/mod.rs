//! Grants (design section 4): what one authority may reach, frozen when built. A grant
//! decides on a canonical [`Target`] ([`Grant::decide`]) and then vets the addresses the
//! caller resolved for it ([`Grant::vet`]), producing the [`Pin`]: the only addresses a
//! connection may be made to.
//!
//! A grant never changes after it is built and never resolves a name itself: the caller
//! resolves once, and the addresses it vets are the ones it must connect to.
//!
//! Here: the spec, building a grant and the host decision; `index.rs` the lookup index of
//! its entries; `vet.rs` the address vetting and the [`Pin`]; `rules.rs` the request rules.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::decision::{Decision, Reason};
use crate::error::{PatternError, PolicyError, ValueError};
use crate::host::Target;
use crate::pattern::{HostPattern, PatternUse, parse_entry};

/// The unvalidated description of a grant, as written in configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantSpec {
    /// The authority's name: 1..=64 bytes of ASCII letters, digits, `-` and `_`.
    pub name: String,
    /// Allow entries, host patterns (design section 4.1): `example.com` (that name only),
    /// `*.example.com` (every name under it, not the apex), IP literals and CIDRs
    /// (`192.0.2.7`, `2001:db8::/32`; they match IP-literal destinations only), each with an
    /// optional port (`example.com:443`, `[2001:db8::1]:443`, `10.0.0.0/8:22`). Rejected:
    /// `*`, a wildcard over a public suffix or a single label (`*.com`, `*.co.uk`,
    /// `*.internal`), a wildcard anywhere but as the whole first label, userinfo, paths.
    pub allow: Vec<String>,
    /// Deny entries: the same syntax, plus `*` (every host) and `*:port` (every host on
    /// that port), each with the operator's reason if any. Deny beats allow.
    pub deny: Vec<DenyEntry>,
    /// The operator's words for a host outside the grant (`not_in_allowlist`,
    /// `port_not_allowed`), carried as the decision's `message` (design section 18).
    pub default_deny_reason: Option<String>,
    /// Exceptions to the address check (design section 4.2): CIDRs without host bits
    /// (`10.1.0.0/16`) or single addresses (`127.0.0.1`). Never `/0`, and never a range
    /// holding `0.0.0.0/8` or `::` (connecting there reaches this host's listeners).
    pub allow_private: Vec<String>,
    /// Require the TLS ClientHello's SNI to equal the CONNECT host on port 443.
    pub sni_check: bool,
    /// Host patterns (as in `allow`) whose TLS is terminated (design section 9).
    pub tls_terminate: Vec<String>,
    /// Per-request rules inside terminated tunnels (`[[authority.request_rule]]`).
    pub request_rules: Vec<RequestRuleSpec>,
    /// Who can widen this grant: decides what a denial's hint tells an agent to ask for.
    pub advice: Advice,
}

/// One deny entry (design sections 4.1 and 18): a host pattern, written as a plain string
/// or as a table `{ host = "*.pastebin.com", reason = "paste sites are off limits" }`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DenyEntry {
    /// The host pattern (the deny syntax of [`GrantSpec::deny`]).
    pub host: String,
    /// The operator's reason, given to whoever is denied as the decision's `message`:
    /// printable ASCII, at most 400 bytes ([`crate::check_operator_reason`]).
    pub reason: Option<String>,
}

impl From<&str> for DenyEntry {
    fn from(host: &str) -> Self {
        Self {
            host: host.to_owned(),
            reason: None,
        }
    }
}

impl From<String> for DenyEntry {
    fn from(host: String) -> Self {
        Self { host, reason: None }
    }
}

/// Who can widen a grant, so that a denial's `hint` names the change that would make the
/// request work in the terms of whoever makes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Advice {
    /// An operator, in the configuration: hints name the grant's lists (`add "h:443" to the
    /// allow list of authority "a"`).
    #[default]
    Operator,
    /// Whoever runs the shim in embedded mode, whose grant is its flags: hints name the
    /// flags (`add --allow h:443 to the shim command`).
    ShimFlags,
}

/// One authority's immutable grant. Built only by [`Grant::new`] from a validated spec.
#[derive(Debug)]
pub struct Grant {
    name: String,
    allow: Vec<HostPattern>,
    deny: Vec<HostPattern>,
    /// The operator's reason of each `deny` entry, by the same index.
    deny_reasons: Vec<Option<String>>,
    default_deny_reason: Option<String>,
    allow_private: Vec<IpNet>,
    sni_check: bool,
    tls_terminate: Vec<HostPattern>,
    request_rules: Vec<RequestRule>,
    /// Index into `deny` of the first global deny entry.
    global_deny_from: usize,
    advice: Advice,
    allow_index: RuleIndex,
    deny_index: RuleIndex,
}

/// One problem found while building a grant: which field, which entry of it (0 for
/// `name`), and the full message (`invalid allow entry "*.com": ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntryError {
    pub(crate) field: GrantField,
    pub(crate) index: usize,
    pub(crate) message: String,
}

/// The field of a grant an [`EntryError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantField {
    Name,
    Allow,
    Deny,
    /// `[global] deny`, whose entries every grant holds after its own.
    GlobalDeny,
    DefaultDenyReason,
    AllowPrivate,
    TlsTerminate,
    RequestRule,
}

impl GrantField {
    /// The key as written in the configuration (`global deny` for `[global] deny`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Name => "name",
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::GlobalDeny => "global deny",
            Self::DefaultDenyReason => "default_deny_reason",
            Self::AllowPrivate => "allow_private",
            Self::TlsTerminate => "tls_terminate",
            Self::RequestRule => "request_rule",
        }
    }
}

/// Checks an authority name: 1..=64 bytes of ASCII letters, digits, `-` and `_`.
///
/// # Errors
/// [`ValueError::NameEmpty`], [`ValueError::NameLong`] or the first character that is not
/// allowed.
pub fn check_authority_name(name: &str) -> Result<(), ValueError> {
    if name.is_empty() {
        return Err(ValueError::NameEmpty);
    }
    if name.len() > 64 {
        return Err(ValueError::NameLong(name.to_owned()));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(ValueError::NameChar(name.to_owned(), c));
    }
    Ok(())
}

/// The list of a grant an entry belongs to (for [`check_entry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// An `allow` entry (a host pattern, design section 4.1).
    Allow,
    /// A `deny` entry (a host pattern; `*` and `*:port` too).
    Deny,
    /// An `allow_private` entry (a CIDR without host bits, or one address).
    AllowPrivate,
}

/// Checks one grant entry alone, exactly as [`Grant::new`] would, for callers that take
/// entries one by one (the shim's `--allow`, `--deny`, `--allow-private` flags).
///
/// # Errors
/// What is wrong with the entry and, where possible, what to write instead (the entry
/// itself is not repeated).
pub fn check_entry(kind: EntryKind, entry: &str) -> Result<(), PatternError> {
    match kind {
        EntryKind::Allow => parse_entry(entry, PatternUse::Allow).map(drop),
        EntryKind::Deny => parse_entry(entry, PatternUse::Deny).map(drop),
        EntryKind::AllowPrivate => allow_private_net(entry).map(drop),
    }
}

/// Parses one `allow_private` entry: a CIDR without host bits, or a single address.
pub(crate) fn parse_allow_private(entry: &str) -> Result<IpNet, PolicyError> {
    allow_private_net(entry).map_err(|why| PolicyError::Pattern {
        field: "allow_private",
        entry: entry.to_owned(),
        why,
    })
}

/// [`parse_allow_private`] with only the reason as error.
fn allow_private_net(entry: &str) -> Result<IpNet, PatternError> {
    let err = |why: PatternError| why;
    let net = if entry.contains('/') {
        let net: IpNet = entry
            .parse()
            .map_err(|_| err(PatternError::PrivateNotCidr))?;
        if net.trunc() != net {
            return Err(err(PatternError::HostBits(net.trunc())));
        }
        net
    } else {
        let ip: IpAddr = entry
            .parse()
            .map_err(|_| err(PatternError::PrivateNotAddress))?;
        IpNet::from(ip)
    };
    if net.prefix_len() == 0 {
        return Err(err(PatternError::PrivateEverything));
    }
    // Connecting to an unspecified address reaches this host's own listeners (Linux treats
    // 0.0.0.0 and :: as "this host"), so no exception may cover them.
    let this_host = match net {
        IpNet::V4(n) => n.network().octets()[0] == 0,
        IpNet::V6(n) => {
            n.contains(&std::net::Ipv6Addr::UNSPECIFIED)
                || n.contains(&std::net::Ipv4Addr::UNSPECIFIED.to_ipv6_mapped())
        }
    };
    if this_host {
        return Err(err(PatternError::PrivateThisHost));
    }
    Ok(net)
}

/// Checks the operator reasons of a grant's deny entries, its global ones and its
/// `default_deny_reason`; returns each deny entry's reason by the grant's deny index
/// (its own entries, then the global ones).
fn check_reasons(
    own: &[DenyEntry],
    global: &[DenyEntry],
    default: Option<&String>,
    errors: &mut Vec<EntryError>,
) -> Vec<Option<String>> {
    let mut check = |field: GrantField, index: usize, text: &str, what: &str| {
        if let Err(why) = crate::decision::check_operator_reason(text) {
            errors.push(EntryError {
                field,
                index,
                message: format!("invalid {what}: {why}"),
            });
        }
    };
    if let Some(text) = default {
        check(
            GrantField::DefaultDenyReason,
            0,
            text,
            "default_deny_reason",
        );
    }
    let mut out = Vec::with_capacity(own.len() + global.len());
    for (field, entries) in [(GrantField::Deny, own), (GrantField::GlobalDeny, global)] {
        for (index, e) in entries.iter().enumerate() {
            if let Some(text) = &e.reason {
                let what = format!("reason of {} entry {:?}", field.as_str(), e.host);
                check(field, index, text, &what);
            }
            out.push(e.reason.clone());
        }
    }
    out
}

impl Grant {
    /// Validates `spec` and freezes it. `global_deny` entries are applied as if they were
    /// part of the grant's deny list (reported with their own source in `rule`).
    ///
    /// # Errors
    /// [`PolicyError::Config`] listing every bad entry (not just the first), each naming
    /// the field and the entry.
    pub fn new(spec: &GrantSpec, global_deny: &[DenyEntry]) -> Result<Self, PolicyError> {
        Self::build(spec, global_deny)
            .map_err(|errors| PolicyError::Config(errors.into_iter().map(|e| e.message).collect()))
    }

    /// [`Grant::new`] with each problem tied to its field and entry index, so that the
    /// config loader can give file locations. Global deny entries are reported with the
    /// field `"global deny"` and their index in `global_deny`.
    pub(crate) fn build(
        spec: &GrantSpec,
        global_deny: &[DenyEntry],
    ) -> Result<Self, Vec<EntryError>> {
        let mut errors = Vec::new();
        if let Err(message) = check_authority_name(&spec.name) {
            errors.push(EntryError {
                field: GrantField::Name,
                index: 0,
                message: message.to_string(),
            });
        }
        let mut patterns = |field: GrantField, entries: &[String], usage: PatternUse| {
            let mut out = Vec::with_capacity(entries.len());
            for (index, entry) in entries.iter().enumerate() {
                match HostPattern::parse(field.as_str(), entry, usage) {
                    Ok(p) => out.push(p),
                    Err(e) => errors.push(EntryError {
                        field,
                        index,
                        message: e.to_string(),
                    }),
                }
            }
            out
        };
        let hosts = |entries: &[DenyEntry]| -> Vec<String> {
            entries.iter().map(|e| e.host.clone()).collect()
        };
        let allow = patterns(GrantField::Allow, &spec.allow, PatternUse::Allow);
        let mut deny = patterns(GrantField::Deny, &hosts(&spec.deny), PatternUse::Deny);
        let global_deny_from = deny.len();
        deny.extend(patterns(
            GrantField::GlobalDeny,
            &hosts(global_deny),
            PatternUse::Deny,
        ));
        let tls_terminate = patterns(
            GrantField::TlsTerminate,
            &spec.tls_terminate,
            PatternUse::Allow,
        );
        let request_rules = build_request_rules(&spec.request_rules, &tls_terminate, &mut errors);
        let deny_reasons = check_reasons(
            &spec.deny,
            global_deny,
            spec.default_deny_reason.as_ref(),
            &mut errors,
        );
        let mut allow_private = Vec::with_capacity(spec.allow_private.len());
        for (index, entry) in spec.allow_private.iter().enumerate() {
            match parse_allow_private(entry) {
                Ok(net) => allow_private.push(net),
                Err(e) => errors.push(EntryError {
                    field: GrantField::AllowPrivate,
                    index,
                    message: e.to_string(),
                }),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Self {
            name: spec.name.clone(),
            allow_index: RuleIndex::build(&allow),
            deny_index: RuleIndex::build(&deny),
            allow,
            deny,
            deny_reasons,
            default_deny_reason: spec.default_deny_reason.clone(),
            allow_private,
            sni_check: spec.sni_check,
            tls_terminate,
            request_rules,
            global_deny_from,
            advice: spec.advice,
        })
    }

    /// The authority's name (1..=64 bytes of ASCII letters, digits, `-` and `_`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether SNI must match the CONNECT host (design section 6).
    pub fn sni_check(&self) -> bool {
        self.sni_check
    }

    /// The name-level decision for `target`: deny rules first (`denied_by_rule`), then allow
    /// rules (`allowed`, or `port_not_allowed` when a host matches only on another port, or
    /// `not_in_allowlist`). For an IP-literal target the literal is also classified as by
    /// [`Grant::vet`]. The returned decision names the rule and carries a `hint`.
    ///
    /// When several entries match, the first one written wins (grant deny entries before
    /// global ones). Lookups are hashed, so the cost does not grow with the number of exact
    /// and wildcard entries.
    pub fn decide(&self, target: &Target) -> Decision {
        let name = &self.name;
        // Quoting with plain `"` rather than `{:?}` is safe here: canonical hosts, validated
        // authority names and parsed rule sources hold no quotes or control characters.
        if let Some(i) = self.deny_index.lookup(&self.deny, target).full {
            let rule = &self.deny[i].source;
            let (detail, hint) = if i >= self.global_deny_from {
                (
                    format!("{target} matches entry \"{rule}\" of the global deny list"),
                    "the global deny list applies to every authority; no grant can allow this destination"
                        .to_owned(),
                )
            } else {
                (
                    match self.advice {
                        Advice::Operator => format!(
                            "{target} matches deny entry \"{rule}\" of authority \"{name}\""
                        ),
                        Advice::ShimFlags => format!("{target} matches the shim's --deny {rule}"),
                    },
                    match self.advice {
                        Advice::Operator => format!(
                            "the grant of authority \"{name}\" denies this destination; an operator would have to replace the authority without deny entry \"{rule}\""
                        ),
                        Advice::ShimFlags => format!(
                            "the shim command denies this destination: remove --deny {rule} from it"
                        ),
                    },
                )
            };
            return Decision::deny(Reason::DeniedByRule, detail, hint)
                .with_rule(rule.clone())
                .with_message(self.deny_reasons.get(i).and_then(Option::as_ref));
        }

        let found = self.allow_index.lookup(&self.allow, target);
        let Some(i) = found.full else {
            let entry = format!("{}:{}", target.host.to_uri_host(), target.port);
            let hint = match self.advice {
                Advice::Operator => {
                    format!("add \"{entry}\" to the allow list of authority \"{name}\"")
                }
                Advice::ShimFlags => format!("add --allow {entry} to the shim command"),
            };
            let Some(first) = found.host_only else {
                let detail = match self.advice {
                    Advice::Operator => format!(
                        "{} is not in the allow list of authority \"{name}\"",
                        target.host
                    ),
                    Advice::ShimFlags => {
                        format!("{} is not allowed by the shim's --allow flags", target.host)
                    }
                };
                return Decision::deny(Reason::NotInAllowlist, detail, hint)
                    .with_message(self.default_deny_reason.as_ref());
            };
            let mut on_other_ports: Vec<usize> = Vec::new();
            self.allow_index
                .for_each_match(&self.allow, &target.host, |i| on_other_ports.push(i));
            on_other_ports.sort_unstable();
            let rules: Vec<String> = on_other_ports
                .iter()
                .map(|&i| format!("\"{}\"", self.allow[i].source))
                .collect();
            return Decision::deny(
                Reason::PortNotAllowed,
                match self.advice {
                    Advice::Operator => format!(
                        "{} matches allow entries {} of authority \"{name}\", but not on port {}",
                        target.host,
                        rules.join(", "),
                        target.port
                    ),
                    Advice::ShimFlags => format!(
                        "{} matches the shim's --allow {}, but not on port {}",
                        target.host,
                        rules.join(", "),
                        target.port
                    ),
                },
                hint,
            )
            .with_rule(self.allow[first].source.clone())
            .with_message(self.default_deny_reason.as_ref());
        };

        if let Some(ip) = target.host.ip()
            && let Err(denied) = self.vet(target, &[ip], &OwnAddrs::default())
        {
            return denied;
        }
        Decision::allow(self.allow[i].source.clone())
    }

    /// For each allow entry that a deny entry (the grant's or `[global] deny`) refuses
    /// whole: its index and that deny entry as written.
    pub(crate) fn shadowed_allows(&self) -> Vec<(usize, &str)> {
        self.allow
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                self.deny
                    .iter()
                    .find(|d| d.covers(a))
                    .map(|d| (i, d.source.as_str()))
            })
            .collect()
    }

    /// Whether some allow entry can match a target that `pattern` matches (approximately:
    /// one covers the other).
    pub(crate) fn reaches(&self, pattern: &HostPattern) -> bool {
        self.allow
            .iter()
            .any(|a| a.covers(pattern) || pattern.covers(a))
    }

    /// The host patterns of the request rules, by 0-based index.
    pub(crate) fn request_rule_hosts(&self) -> impl Iterator<Item = (usize, &HostPattern)> {
        self.request_rules.iter().map(|r| (r.position - 1, &r.host))
    }

    /// Whether every target `pattern` can match is terminated (covered by a
    /// `tls_terminate` pattern).
    pub(crate) fn terminates_pattern(&self, pattern: &HostPattern) -> bool {
        self.tls_terminate.iter().any(|t| t.covers(pattern))
    }

    /// Whether the grant terminates TLS for any host (`tls_terminate` is not empty).
    pub fn terminates_any(&self) -> bool {
        !self.tls_terminate.is_empty()
    }

    /// Whether `target` matches a `tls_terminate` pattern.
    pub fn terminates_tls(&self, target: &Target) -> bool {
        self.tls_terminate.iter().any(|p| p.matches(target))
    }

    /// The allow entries exactly as written, in grant order (for diagnostics and the admin
    /// API).
    pub fn allow_entries(&self) -> impl Iterator<Item = &str> {
        self.allow.iter().map(|p| p.source.as_str())
    }

    /// The deny entries exactly as written: the grant's own first, then the global deny
    /// list's.
    pub fn deny_entries(&self) -> impl Iterator<Item = &str> {
        self.deny.iter().map(|p| p.source.as_str())
    }

    /// The `allow_private` exceptions as networks (a single address is a `/32` or `/128`).
    pub fn allow_private(&self) -> &[IpNet] {
        &self.allow_private
    }

    /// The allow entries, parsed (for `crate::review`).
    pub(crate) fn allow_patterns(&self) -> &[HostPattern] {
        &self.allow
    }

    /// Every deny entry, parsed: the grant's own, then the global ones.
    pub(crate) fn deny_patterns(&self) -> &[HostPattern] {
        &self.deny
    }

    /// The grant's own deny entries (not `[global] deny`), each with its operator reason.
    pub(crate) fn own_deny(&self) -> impl Iterator<Item = (&HostPattern, Option<&str>)> {
        self.deny_with_reasons().take(self.global_deny_from)
    }

    /// The `[global] deny` entries folded into the grant, each with its operator reason.
    pub(crate) fn global_deny(&self) -> impl Iterator<Item = (&HostPattern, Option<&str>)> {
        self.deny_with_reasons().skip(self.global_deny_from)
    }

    fn deny_with_reasons(&self) -> impl Iterator<Item = (&HostPattern, Option<&str>)> {
        self.deny
            .iter()
            .enumerate()
            .map(|(i, p)| (p, self.deny_reasons.get(i).and_then(|r| r.as_deref())))
    }

    /// The `tls_terminate` patterns, parsed.
    pub(crate) fn tls_patterns(&self) -> &[HostPattern] {
        &self.tls_terminate
    }

    /// The operator's words for a host outside the grant, if any.
    pub(crate) fn default_deny_reason(&self) -> Option<&str> {
        self.default_deny_reason.as_deref()
    }
}

mod index;
mod rules;
mod vet;

use index::RuleIndex;
pub use rules::RequestRuleSpec;
use rules::build_request_rules;
pub(crate) use rules::{RequestRule, path_has_prefix};
pub use vet::{OwnAddrs, Pin};

#[cfg(test)]
mod tests;
