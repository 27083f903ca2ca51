//! The judgement of one change of an authority: two [`Reach`]es, each validated into a
//! [`Grant`] again, compared list by list with the pattern code of live traffic. Every
//! difference is one [`Change`]: its [`RiskClass`], whether it widens or narrows what the
//! authority may reach (or changes something else: an operator's words, a token), the
//! entry as written, and a sentence for the reviewer.
//!
//! An entry that the other side covers is no change (an exact host under an existing
//! wildcard, an equivalent spelling, a reordering); an allow entry that a deny entry
//! refuses whole reaches nothing and is no change either. Request rules and credentials
//! are judged in `rules.rs`, the words of a change are `change.rs`'s.

use ipnet::IpNet;

use super::change::{Change, Direction, RiskClass};
use super::{LimitsView, Reach};
use crate::error::PolicyError;
use crate::grant::{DenyEntry, Grant};
use crate::pattern::{HostPattern, PatternKind, PatternUse};

/// One side of a comparison: the view, its grant built again, its credentials' hosts.
struct Subject<'a> {
    reach: &'a Reach,
    grant: Grant,
    credentials: Vec<HostPattern>,
}

impl<'a> Subject<'a> {
    fn build(reach: &'a Reach, global_deny: &[DenyEntry]) -> Result<Self, PolicyError> {
        let grant = reach.grant(global_deny)?;
        let credentials = reach
            .credentials
            .iter()
            .map(|c| HostPattern::parse("credential", &c.host, PatternUse::Allow))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            reach,
            grant,
            credentials,
        })
    }
}

/// An authority that may reach nothing: the other side of one added or removed.
fn nothing(name: &str) -> Reach {
    Reach {
        name: name.to_owned(),
        allow: Vec::new(),
        deny: Vec::new(),
        default_deny_reason: None,
        allow_private: Vec::new(),
        sni_check: true,
        tls_terminate: Vec::new(),
        request_rules: Vec::new(),
        credentials: Vec::new(),
        watchdog: None,
        limits: LimitsView::default(),
        channel: super::ChannelView::default(),
    }
}

/// The changes from `old` to `new`, each side a reach with the `[global] deny` list it
/// is judged under (deny entries refuse what they cover, whichever list holds them).
/// `None` on one side: the authority is added (only what it widens is listed: every
/// host, range, terminated host, credential and channel it has) or removed (only what it
/// narrows). Changes of the global list itself are [`compare_global`]'s.
///
/// # Errors
/// [`PolicyError`] when a side does not validate (a view read from elsewhere).
pub fn compare(
    old: Option<(&Reach, &[DenyEntry])>,
    new: Option<(&Reach, &[DenyEntry])>,
) -> Result<Vec<Change>, PolicyError> {
    let name = old.or(new).map(|(r, _)| r.name.clone()).unwrap_or_default();
    let empty = nothing(&name);
    let (o, n) = match (old, new) {
        (Some(o), Some(n)) => (o, n),
        (Some(o), None) => (o, (&empty, o.1)),
        (None, Some(n)) => ((&empty, n.1), n),
        (None, None) => return Ok(Vec::new()),
    };
    let old_side = Subject::build(o.0, o.1)?;
    let new_side = Subject::build(n.0, n.1)?;
    let mut out = Vec::new();
    allow(&old_side, &new_side, &mut out);
    deny(&old_side, &new_side, &mut out);
    allow_private(
        old_side.grant.allow_private(),
        new_side.grant.allow_private(),
        &mut out,
    );
    tls_terminate(&old_side, &new_side, &mut out);
    super::rules::credentials(
        (&old_side.credentials, &old_side.reach.credentials),
        (&new_side.credentials, &new_side.reach.credentials),
        &mut out,
    );
    super::rules::request_rules(
        old_side.grant.request_rules(),
        new_side.grant.request_rules(),
        &mut out,
    );
    settings(o.0, n.0, &mut out);
    let keep = match (old, new) {
        (None, _) => Some(Direction::Widened),
        (_, None) => Some(Direction::Narrowed),
        _ => None,
    };
    out.retain(|c| keep.is_none_or(|d| c.direction == d));
    Ok(out)
}

/// The changes of the `[global] deny` list, which every authority's grant holds: an
/// entry removed widens every authority that reaches it, one added narrows.
///
/// # Errors
/// [`PolicyError`] when an entry does not parse.
pub fn compare_global(old: &[DenyEntry], new: &[DenyEntry]) -> Result<Vec<Change>, PolicyError> {
    let parse = |list: &[DenyEntry]| -> Result<Vec<(HostPattern, Option<String>)>, PolicyError> {
        list.iter()
            .map(|e| {
                HostPattern::parse("global deny", &e.host, PatternUse::Deny)
                    .map(|p| (p, e.reason.clone()))
            })
            .collect()
    };
    let (old, new) = (parse(old)?, parse(new)?);
    let mut out = Vec::new();
    for (o, reason) in &old {
        match new.iter().find(|(n, _)| n.covers(o) && o.covers(n)) {
            Some((_, r)) if r != reason => {
                out.push(reason_change(&format!("[global] deny {o}"), reason, r));
            }
            Some(_) => {}
            None if new.iter().any(|(n, _)| n.covers(o)) => {}
            None => out.push(Change::new(
                RiskClass::Global,
                Direction::Widened,
                &o.source,
                format!("[global] deny entry {:?} removed: every authority whose allow list reaches it may now connect there", o.source),
            )),
        }
    }
    for (n, _) in &new {
        if !old.iter().any(|(o, _)| o.covers(n)) {
            out.push(Change::new(
                RiskClass::Global,
                Direction::Narrowed,
                &n.source,
                format!(
                    "[global] deny entry {:?} added: refused for every authority",
                    n.source
                ),
            ));
        }
    }
    Ok(out)
}

/// Allow entries: one the other side does not cover, and no deny entry of its own side
/// refuses whole, is a host (or port) gained or lost.
fn allow(old: &Subject<'_>, new: &Subject<'_>, out: &mut Vec<Change>) {
    let (was, now) = (old.grant.allow_patterns(), new.grant.allow_patterns());
    for n in now {
        if was.iter().any(|o| o.covers(n)) || new.grant.deny_patterns().iter().any(|d| d.covers(n))
        {
            continue;
        }
        out.push(allow_change(n, was, Direction::Widened));
    }
    for o in was {
        if now.iter().any(|n| n.covers(o)) || old.grant.deny_patterns().iter().any(|d| d.covers(o))
        {
            continue;
        }
        out.push(allow_change(o, now, Direction::Narrowed));
    }
}

/// How `port` reads in a sentence.
fn port_words(port: Option<u16>) -> String {
    port.map_or_else(|| "every port".to_owned(), |p| format!("port {p}"))
}

/// The change of one allow entry present on one side only (`other`: the other side's
/// list): a port when the other side allows the same hosts on other ports, else a host.
fn allow_change(entry: &HostPattern, other: &[HostPattern], direction: Direction) -> Change {
    let hosts = entry.any_port();
    let same: Vec<&HostPattern> = other
        .iter()
        .filter(|o| o.any_port().covers(&hosts))
        .collect();
    let host_words = match &entry.kind {
        PatternKind::Suffix(s) => format!("every name under {s}"),
        PatternKind::Net(net) => format!("the addresses of {net} (IP-literal destinations)"),
        PatternKind::Exact(h) => h.to_string(),
        PatternKind::Any => "every host".to_owned(),
    };
    if !same.is_empty() {
        let ports: Vec<String> = same.iter().map(|o| port_words(o.port)).collect();
        let detail = match direction {
            Direction::Widened => format!(
                "{host_words} is now allowed on {} (it was allowed on {} only)",
                port_words(entry.port),
                ports.join(", ")
            ),
            _ => format!(
                "{host_words} is no longer allowed on {} (still on {})",
                port_words(entry.port),
                ports.join(", ")
            ),
        };
        return Change::new(RiskClass::Port, direction, &entry.source, detail);
    }
    // What the other side allowed inside this entry: a wildcard grown from (or shrunk
    // to) a narrower wildcard or some of its names.
    let narrower: Vec<&str> = other
        .iter()
        .filter(|o| hosts.covers(&o.any_port()))
        .map(|o| o.source.as_str())
        .collect();
    let wider = if matches!(entry.kind, PatternKind::Suffix(_)) {
        "wider wildcard"
    } else {
        "wider range"
    };
    let detail = match (direction, narrower.is_empty()) {
        (Direction::Widened, false) => format!(
            "{wider}: {host_words} on {} is now allowed (the allow list had only {})",
            port_words(entry.port),
            narrower.join(", ")
        ),
        (Direction::Widened, true) => {
            format!("new reach: {host_words} on {}", port_words(entry.port))
        }
        (_, false) => format!(
            "narrowed: {host_words} is no longer allowed, only {}",
            narrower.join(", ")
        ),
        (_, true) => format!(
            "{host_words} on {} is no longer allowed",
            port_words(entry.port)
        ),
    };
    Change::new(RiskClass::Host, direction, &entry.source, detail)
}

/// The authority's own deny entries and the operator's reasons.
fn deny(old: &Subject<'_>, new: &Subject<'_>, out: &mut Vec<Change>) {
    let reaches =
        |s: &Subject<'_>, p: &HostPattern| s.grant.allow_patterns().iter().any(|a| a.overlaps(p));
    let now: Vec<(&HostPattern, Option<&str>)> = new.grant.own_deny().collect();
    for (o, reason) in old.grant.own_deny() {
        match now.iter().find(|(n, _)| n.covers(o) && o.covers(n)) {
            Some((_, r)) if *r != reason => out.push(reason_change(
                &format!("deny {o}"),
                &reason.map(str::to_owned),
                &r.map(str::to_owned),
            )),
            Some(_) => {}
            None if new.grant.deny_patterns().iter().any(|n| n.covers(o)) => {}
            None => {
                let said = reason.map_or_else(String::new, |r| {
                    format!(" (with its operator reason {r:?})")
                });
                out.push(if reaches(new, o) {
                    Change::new(
                        RiskClass::Deny,
                        Direction::Widened,
                        &o.source,
                        format!("deny entry {:?} removed{said}: the allow list reaches what it refused", o.source),
                    )
                } else {
                    Change::new(
                        RiskClass::Deny,
                        Direction::Changed,
                        &o.source,
                        format!("deny entry {:?} removed{said}; no allow entry reaches it, so nothing new is reachable", o.source),
                    )
                });
            }
        }
    }
    for (n, _) in &now {
        if old.grant.deny_patterns().iter().any(|o| o.covers(n)) {
            continue;
        }
        let direction = if reaches(new, n) {
            Direction::Narrowed
        } else {
            Direction::Changed
        };
        out.push(Change::new(
            RiskClass::Deny,
            direction,
            &n.source,
            format!("deny entry {:?} added", n.source),
        ));
    }
    let (was, is) = (
        old.grant.default_deny_reason(),
        new.grant.default_deny_reason(),
    );
    if was != is {
        out.push(reason_change(
            "default_deny_reason",
            &was.map(str::to_owned),
            &is.map(str::to_owned),
        ));
    }
}

/// An operator's words changed (never reach).
fn reason_change(entry: &str, old: &Option<String>, new: &Option<String>) -> Change {
    let detail = match (old, new) {
        (Some(o), None) => format!(
            "operator reason of {entry} removed (was {o:?}): whoever is denied is no longer told why"
        ),
        (None, Some(n)) => format!("operator reason of {entry} added: {n:?}"),
        (Some(o), Some(n)) => format!("operator reason of {entry} changed from {o:?} to {n:?}"),
        (None, None) => format!("operator reason of {entry} unchanged"),
    };
    Change::new(RiskClass::OperatorReason, Direction::Changed, entry, detail)
}

/// `allow_private`: an exception the other side does not hold.
fn allow_private(was: &[IpNet], now: &[IpNet], out: &mut Vec<Change>) {
    for n in now {
        if !was.iter().any(|o| o.contains(n)) {
            out.push(Change::new(
                RiskClass::AllowPrivate,
                Direction::Widened,
                n.to_string(),
                format!("allow_private {n} added: allowed names may now connect to these addresses, which the address check refuses otherwise"),
            ));
        }
    }
    for o in was {
        if !now.iter().any(|n| n.contains(o)) {
            out.push(Change::new(
                RiskClass::AllowPrivate,
                Direction::Narrowed,
                o.to_string(),
                format!("allow_private {o} removed"),
            ));
        }
    }
}

/// `tls_terminate`: hosts whose requests the mediator reads.
fn tls_terminate(old: &Subject<'_>, new: &Subject<'_>, out: &mut Vec<Change>) {
    let (was, now) = (old.grant.tls_patterns(), new.grant.tls_patterns());
    for n in now {
        if !was.iter().any(|o| o.covers(n)) {
            out.push(Change::new(
                RiskClass::TlsTerminate,
                Direction::Widened,
                &n.source,
                format!("TLS to {:?} is now terminated: the mediator reads these requests (request rules and credentials act on them), and clients must trust its CA", n.source),
            ));
        }
    }
    for o in was {
        if !now.iter().any(|n| n.covers(o)) {
            out.push(Change::new(
                RiskClass::TlsTerminate,
                Direction::Narrowed,
                &o.source,
                format!("TLS to {:?} is no longer terminated", o.source),
            ));
        }
    }
}

/// `sni_check`, the watchdog, the limits and the channel.
fn settings(old: &Reach, new: &Reach, out: &mut Vec<Change>) {
    match (old.sni_check, new.sni_check) {
        (true, false) => out.push(Change::new(
            RiskClass::SniCheck,
            Direction::Widened,
            "sni_check",
            "sni_check turned off: a tunnel to port 443 no longer has to name its host in the TLS ClientHello (domain fronting passes)",
        )),
        (false, true) => out.push(Change::new(
            RiskClass::SniCheck,
            Direction::Narrowed,
            "sni_check",
            "sni_check turned on",
        )),
        _ => {}
    }
    match (&old.watchdog, &new.watchdog) {
        (Some(o), None) => out.push(Change::new(
            RiskClass::Watchdog,
            Direction::Widened,
            o,
            format!("watchdog {o} removed: allowed decisions are no longer narrowed by it"),
        )),
        (None, Some(n)) => out.push(Change::new(
            RiskClass::Watchdog,
            Direction::Narrowed,
            n,
            format!("watchdog {n} added: it may narrow allowed decisions"),
        )),
        (Some(o), Some(n)) if o != n => out.push(Change::new(
            RiskClass::Watchdog,
            Direction::Widened,
            n,
            format!("watchdog replaced ({o} -> {n}): another hook narrows decisions, which may allow more"),
        )),
        _ => {}
    }
    limits(&old.limits, &new.limits, out);
    super::rules::channel(&old.channel, &new.channel, out);
}

/// The authority's own limits: raised or removed widens, lowered narrows.
fn limits(old: &LimitsView, new: &LimitsView, out: &mut Vec<Change>) {
    let mut push = |direction, entry: &str, detail: String| {
        out.push(Change::new(RiskClass::Limits, direction, entry, detail));
    };
    match (old.max_connections, new.max_connections) {
        (Some(a), Some(b)) if a != b => push(
            if b > a {
                Direction::Widened
            } else {
                Direction::Narrowed
            },
            "max_connections",
            format!("max_connections {a} -> {b}"),
        ),
        (None, Some(b)) => push(
            Direction::Changed,
            "max_connections",
            format!(
                "max_connections set to {b} (was the mediator's [limits] authority_connections)"
            ),
        ),
        (Some(a), None) => push(
            Direction::Changed,
            "max_connections",
            format!(
                "max_connections {a} removed: the mediator's [limits] authority_connections applies"
            ),
        ),
        _ => {}
    }
    match (old.connect_rate, new.connect_rate) {
        (a, b) if a == b => {
            if a > 0 && old.connect_burst != new.connect_burst {
                let (x, y) = (old.connect_burst, new.connect_burst);
                push(
                    if y > x {
                        Direction::Widened
                    } else {
                        Direction::Narrowed
                    },
                    "connect_burst",
                    format!("connect_burst {x} -> {y}"),
                );
            }
        }
        (a, 0) => push(
            Direction::Widened,
            "connect_rate",
            format!("connect_rate {a}/s removed: new connections are not rate-limited"),
        ),
        (0, b) => push(
            Direction::Narrowed,
            "connect_rate",
            format!("connect_rate set to {b}/s"),
        ),
        (a, b) => push(
            if b > a {
                Direction::Widened
            } else {
                Direction::Narrowed
            },
            "connect_rate",
            format!("connect_rate {a}/s -> {b}/s"),
        ),
    }
}
