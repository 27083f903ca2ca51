//! `mediator explain`: what the mediator would decide for one authority and one target,
//! computed by the same steps as live traffic (`conn::establish::decide_and_vet`: the
//! name decision: a placeholder in the host name, then the grant; with `--resolve`, one
//! resolution with the configured resolver and vetting of every address). Without
//! `--resolve` nothing is resolved and the answer says so. It never connects to the
//! destination, and the watchdog (which can only narrow an allow) is not asked.

use std::net::IpAddr;

use policy::config::Config;
use policy::{
    AddrClass, OwnAddrs, Reason, Target, Verdict, canonicalize_host, classify, parse_authority_form,
};
use serde::Serialize;

use crate::conn::establish::{Vetted, decide_and_vet, decide_name};
use crate::error::Error;
use crate::resolve::Resolver;

/// The detail of a name allowed without `--resolve`: resolution and vetting were not done.
const NOT_RESOLVED: &str = "name decision only: not resolved and no address vetted (pass --resolve to resolve it with the configured resolver and vet every address, as live traffic does; live traffic denies it if any address is not public)";

/// The port assumed when the target names none (HTTPS, the common CONNECT case).
pub const DEFAULT_PORT: u16 = 443;

/// One resolved address and how it was judged.
#[derive(Debug, Clone, Serialize)]
pub struct AddressInfo {
    /// The address.
    pub ip: String,
    /// `global`, `private`, `special` or `embedded`.
    pub class: &'static str,
    /// The registry block (or the embedding) it falls in; empty for global addresses.
    pub block: String,
    /// Whether an `allow_private` entry of the grant exempts it.
    pub excepted: bool,
}

/// The explanation of one decision.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// The authority.
    pub authority: String,
    /// The target as given.
    pub input: String,
    /// The canonical host (absent when the target is malformed).
    pub host: Option<String>,
    /// The port.
    pub port: Option<u16>,
    /// Allow or deny.
    #[serde(serialize_with = "crate::vocab::serialize_verdict")]
    pub decision: Verdict,
    /// Reason (design section 4.3).
    #[serde(serialize_with = "crate::vocab::serialize_reason")]
    pub reason: Reason,
    /// The grant entry that decided, if any.
    pub rule: Option<String>,
    /// Human detail.
    pub detail: String,
    /// What would make it work (denials).
    pub hint: String,
    /// Whether the name was resolved (and its addresses vetted); `false` without
    /// `--resolve` (the decision is then the name decision alone) or when the name
    /// decision denied.
    pub resolved: bool,
    /// Each resolved address, with its class.
    pub addresses: Vec<AddressInfo>,
    /// The vetted addresses a connection would be made to (in order), when allowed.
    pub pin: Vec<String>,
    /// The authority's watchdog, which live traffic would also ask (explain does not).
    pub watchdog: Option<String>,
}

/// Explains the decision for `authority` and `target` (`host[:port]`, IPv6 bracketed)
/// under `config`; with `resolve`, resolves the name and vets its addresses as live
/// traffic would (without, the answer is the grant's name decision alone and says so).
///
/// # Errors
/// [`Error::Control`] when the authority does not exist; [`Error::Resolver`] when the
/// resolver cannot be configured.
pub async fn explain(
    config: &Config,
    authority: &str,
    target: &str,
    resolve: bool,
) -> Result<Explanation, Error> {
    let resolver = if resolve {
        Some(Resolver::new(
            &config.resolver.nameservers,
            config.resolver.hosts.clone(),
            config.timeouts.dns,
        )?)
    } else {
        None
    };
    explain_with(config, authority, target, resolver.as_ref()).await
}

/// [`explain`] with the resolver given: with one, the name is resolved by it and every
/// address vetted, as live traffic does (`mediator test` gives one that answers from its
/// expectations' `hosts` alone); without, the name decision alone.
///
/// # Errors
/// [`Error::Control`] when the authority does not exist.
pub async fn explain_with(
    config: &Config,
    authority: &str,
    target: &str,
    resolver: Option<&Resolver>,
) -> Result<Explanation, Error> {
    let Some(auth) = config
        .authorities
        .iter()
        .find(|a| a.grant.name() == authority)
    else {
        let names: Vec<&str> = config.authorities.iter().map(|a| a.grant.name()).collect();
        return Err(Error::control(format!(
            "no authority {authority:?} in the configuration (it has: {})",
            names.join(", ")
        )));
    };
    let grant = &auth.grant;
    let mut out = Explanation {
        authority: authority.to_owned(),
        input: target.to_owned(),
        host: None,
        port: None,
        decision: Verdict::Deny,
        reason: Reason::MalformedTarget,
        rule: None,
        detail: String::new(),
        hint: String::new(),
        resolved: false,
        addresses: Vec::new(),
        pin: Vec::new(),
        watchdog: auth.watchdog.as_ref().map(ToString::to_string),
    };
    let parsed = parse_target(target);
    let target = match parsed {
        Ok(t) => t,
        Err(e) => {
            out.detail = e.to_string();
            out.hint = "give the target as HOST[:PORT]: a DNS name, a dotted-quad IPv4 address or a bracketed IPv6 address; the port defaults to 443".into();
            return Ok(out);
        }
    };
    out.host = Some(target.host.as_text());
    out.port = Some(target.port);
    let own = OwnAddrs(
        config
            .listen
            .tcp
            .iter()
            .chain(config.listen.admin.iter())
            .copied()
            .collect(),
    );
    if let Some(resolver) = resolver {
        let vetting = decide_and_vet(resolver, &own, auth, &target).await;
        if let Some(resolution) = &vetting.resolved {
            out.resolved = true;
            if let Ok(addrs) = &resolution.addrs {
                out.addresses = addrs.iter().map(|ip| address_info(grant, *ip)).collect();
            }
        }
        match vetting.outcome {
            Ok(Vetted { pin, rule }) => {
                out.decision = Verdict::Allow;
                out.reason = Reason::Allowed;
                out.rule = rule;
                out.pin = pin.addrs().iter().map(ToString::to_string).collect();
            }
            Err(denial) => out.denied(denial),
        }
    } else {
        // The first step of the same pipeline: the placeholder check and the grant's name
        // decision (which also classifies an IP-literal target). Nothing is resolved.
        match decide_name(auth, &target) {
            Ok(rule) => {
                out.decision = Verdict::Allow;
                out.reason = Reason::Allowed;
                out.rule = rule;
                if target.host.ip().is_none() {
                    out.detail = NOT_RESOLVED.into();
                }
            }
            Err(denial) => out.denied(denial),
        }
    }
    if out.reason == Reason::Allowed && target.host.ip().is_some() {
        let ip = target.host.ip().into_iter();
        out.addresses = ip.map(|ip| address_info(grant, ip)).collect();
    }
    Ok(out)
}

impl Explanation {
    /// The answer is `denial`.
    fn denied(&mut self, denial: crate::denial::Denial) {
        self.reason = denial.reason;
        self.rule = denial.rule;
        self.detail = denial.detail;
        self.hint = denial.hint;
    }
}

/// `host:port`, or a bare host (IPv6 bracketed or not) with [`DEFAULT_PORT`].
pub(crate) fn parse_target(s: &str) -> Result<Target, policy::PolicyError> {
    match parse_authority_form(s) {
        Ok(t) => Ok(t),
        Err(e) => {
            let bare = s
                .strip_prefix('[')
                .and_then(|r| r.strip_suffix(']'))
                .unwrap_or(s);
            let looks_bare = !s.contains(':') || s.parse::<IpAddr>().is_ok() || bare != s;
            if looks_bare {
                canonicalize_host(bare).map(|host| Target {
                    host,
                    port: DEFAULT_PORT,
                })
            } else {
                Err(e)
            }
        }
    }
}

fn address_info(grant: &policy::Grant, ip: IpAddr) -> AddressInfo {
    let excepted = grant.allow_private().iter().any(|n| n.contains(&ip));
    let (class, block) = match classify(ip) {
        AddrClass::Global => ("global", String::new()),
        AddrClass::Private(b) => ("private", b.to_owned()),
        AddrClass::Special(b) => ("special", b.to_owned()),
        AddrClass::Embedded { kind, embedded, .. } => {
            ("embedded", format!("{kind}, embeds {embedded}"))
        }
    };
    AddressInfo {
        ip: ip.to_string(),
        class,
        block,
        excepted,
    }
}

/// The explanation as text, one `key: value` per line.
pub fn render_text(e: &Explanation) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let dash = |v: Option<&str>| v.map_or_else(|| "-".to_owned(), str::to_owned);
    let _ = writeln!(s, "authority: {}", e.authority);
    let _ = writeln!(
        s,
        "target:    {} (canonical host {}, port {})",
        e.input,
        dash(e.host.as_deref()),
        e.port.map_or_else(|| "-".into(), |p| p.to_string())
    );
    let _ = writeln!(s, "decision:  {}", e.decision.as_str());
    let _ = writeln!(s, "reason:    {}", e.reason);
    let _ = writeln!(s, "rule:      {}", dash(e.rule.as_deref()));
    if !e.detail.is_empty() {
        let _ = writeln!(s, "detail:    {}", e.detail);
    }
    if !e.hint.is_empty() {
        let _ = writeln!(s, "hint:      {}", e.hint);
    }
    for a in &e.addresses {
        let mut line = format!("address:   {} {}", a.ip, a.class);
        if !a.block.is_empty() {
            let _ = write!(line, " ({})", a.block);
        }
        if a.excepted {
            line.push_str(", excepted by allow_private");
        }
        let _ = writeln!(s, "{line}");
    }
    if !e.pin.is_empty() {
        let _ = writeln!(s, "pin:       {}", e.pin.join(", "));
    }
    if let Some(w) = &e.watchdog {
        let _ = writeln!(
            s,
            "watchdog:  {w} (asked by live traffic for allowed decisions; not by explain)"
        );
    }
    s
}
