//! The parts of a comparison that are more than a list of patterns: credentials (a secret
//! and the hosts it goes to), request rules (which narrow what a terminated host allows:
//! a rule gained can narrow, a rule lost can widen) and the channel (who may act as the
//! authority).

use super::change::{Change, Direction, RiskClass};
use super::{ChannelView, CredentialView};
use crate::grant::{RequestRule, path_has_prefix};
use crate::pattern::HostPattern;

/// One side's credentials: their parsed hosts, and their views (same order).
pub(super) type Credentials<'a> = (&'a [HostPattern], &'a [CredentialView]);

/// Credentials: one whose host and header no credential of the other side covers is a
/// secret gained or lost; a covered one read from another source is a different secret.
pub(super) fn credentials(old: Credentials<'_>, new: Credentials<'_>, out: &mut Vec<Change>) {
    let was: Vec<_> = old.0.iter().zip(old.1).collect();
    let now: Vec<_> = new.0.iter().zip(new.1).collect();
    for (np, nv) in &now {
        let covering: Vec<_> = was
            .iter()
            .filter(|(op, ov)| ov.header == nv.header && op.covers(np))
            .map(|(_, ov)| *ov)
            .collect();
        let from = nv
            .source
            .as_ref()
            .map_or_else(String::new, |s| format!(" (from {s})"));
        if covering.is_empty() {
            out.push(Change::new(
                RiskClass::Credential,
                Direction::Widened,
                &nv.host,
                format!(
                    "the mediator now adds a secret{from} in header {} to requests to {:?}",
                    nv.header, nv.host
                ),
            ));
        } else if let Some(source) = &nv.source
            && covering
                .iter()
                .all(|ov| ov.source.as_ref().is_some_and(|s| s != source))
        {
            let before: Vec<&str> = covering
                .iter()
                .filter_map(|ov| ov.source.as_deref())
                .collect();
            out.push(Change::new(
                RiskClass::Credential,
                Direction::Widened,
                &nv.host,
                format!(
                    "a different secret goes in header {} to {:?}: {source}, was {} (it may grant more)",
                    nv.header,
                    nv.host,
                    before.join(", ")
                ),
            ));
        }
    }
    for (op, ov) in &was {
        if !now
            .iter()
            .any(|(np, nv)| nv.header == ov.header && np.covers(op))
        {
            out.push(Change::new(
                RiskClass::Credential,
                Direction::Narrowed,
                &ov.host,
                format!(
                    "the mediator no longer adds the secret in header {} to requests to {:?}",
                    ov.header, ov.host
                ),
            ));
        }
    }
}

/// Whether `outer` allows every request `inner` allows, on every host `inner` names.
fn rule_covers(outer: &RequestRule, inner: &RequestRule) -> bool {
    let methods = outer.methods.is_empty()
        || (!inner.methods.is_empty() && inner.methods.iter().all(|m| outer.methods.contains(m)));
    let paths = outer.path_prefixes.is_empty()
        || (!inner.path_prefixes.is_empty()
            && inner
                .path_prefixes
                .iter()
                .all(|p| outer.path_prefixes.iter().any(|q| path_has_prefix(p, q))));
    let headers = outer.headers.iter().all(|h| inner.headers.contains(h));
    let query = match (&outer.query, &inner.query) {
        (None, _) => true,
        (Some(o), Some(i)) => i.is_subset(o),
        (Some(_), None) => false,
    };
    outer.host.covers(&inner.host)
        && methods
        && paths
        && headers
        && query
        && inner.upgrade.is_subset(&outer.upgrade)
}

/// Request rules. A host no rule names is not narrowed, so a rule for a host no rule
/// named before narrows, and the last rule of a host removed widens it to every request;
/// between rules of one host, a rule the other side does not cover allows more (gained)
/// or less (lost). A rule that overlaps the other side's only in part is reported as a
/// widening when gained (the safe side).
pub(super) fn request_rules(was: &[RequestRule], now: &[RequestRule], out: &mut Vec<Change>) {
    for n in now {
        if was.iter().any(|o| rule_covers(o, n)) {
            continue;
        }
        let entry = format!("request_rule {}", n.host.source);
        let overlapping: Vec<&RequestRule> =
            was.iter().filter(|o| o.host.overlaps(&n.host)).collect();
        out.push(if overlapping.is_empty() {
            Change::new(
                RiskClass::RequestRule,
                Direction::Narrowed,
                entry,
                format!(
                    "requests to {:?} are now narrowed by a request rule: {} only",
                    n.host.source,
                    n.describe()
                ),
            )
        } else {
            Change::new(
                RiskClass::RequestRule,
                Direction::Widened,
                entry,
                format!(
                    "a request rule for {:?} now allows {}{}",
                    n.host.source,
                    n.describe(),
                    what_is_new(n, &overlapping)
                ),
            )
        });
    }
    for o in was {
        if now.iter().any(|n| rule_covers(n, o)) {
            continue;
        }
        let entry = format!("request_rule {}", o.host.source);
        let overlapping = now.iter().any(|n| n.host.overlaps(&o.host));
        out.push(if overlapping {
            Change::new(
                RiskClass::RequestRule,
                Direction::Narrowed,
                entry,
                format!(
                    "the request rules for {:?} no longer allow all of {}",
                    o.host.source,
                    o.describe()
                ),
            )
        } else {
            Change::new(
                RiskClass::RequestRule,
                Direction::Widened,
                entry,
                format!(
                    "requests to {:?} are no longer narrowed by a request rule: every method and path (it allowed {} only)",
                    o.host.source,
                    o.describe()
                ),
            )
        });
    }
}

/// ` (new: method DELETE; path /admin)`: what `rule` allows that none of `before` did.
fn what_is_new(rule: &RequestRule, before: &[&RequestRule]) -> String {
    let mut parts = Vec::new();
    if !before.iter().any(|o| o.methods.is_empty()) {
        if rule.methods.is_empty() {
            parts.push("every method".to_owned());
        } else {
            let new: Vec<&str> = rule
                .methods
                .iter()
                .filter(|m| !before.iter().any(|o| o.methods.contains(*m)))
                .map(String::as_str)
                .collect();
            if !new.is_empty() {
                parts.push(format!("method {}", new.join("|")));
            }
        }
    }
    if !before.iter().any(|o| o.path_prefixes.is_empty()) {
        if rule.path_prefixes.is_empty() {
            parts.push("every path".to_owned());
        } else {
            let new: Vec<&str> = rule
                .path_prefixes
                .iter()
                .filter(|p| {
                    !before
                        .iter()
                        .any(|o| o.path_prefixes.iter().any(|q| path_has_prefix(p, q)))
                })
                .map(String::as_str)
                .collect();
            if !new.is_empty() {
                parts.push(format!("path {}", new.join(" ")));
            }
        }
    }
    if parts.is_empty() {
        " (new: fewer required headers, or more query names or upgrades)".to_owned()
    } else {
        format!(" (new: {})", parts.join("; "))
    }
}

/// The channel: a token gained, the socket opened to more users, the replicas that serve
/// it (`node`).
pub(super) fn channel(old: &ChannelView, new: &ChannelView, out: &mut Vec<Change>) {
    let mut push = |direction, entry: &str, detail: String| {
        out.push(Change::new(RiskClass::Channel, direction, entry, detail));
    };
    match (&old.token_id, &new.token_id) {
        (None, Some(t)) => push(
            Direction::Widened,
            "token_sha256",
            format!("a token (id {t}) now lets a client on the TCP listener act as the authority"),
        ),
        (Some(t), None) => push(
            Direction::Narrowed,
            "token_sha256",
            format!(
                "the token (id {t}) is gone: the authority is no longer reachable on the TCP listener"
            ),
        ),
        (Some(a), Some(b)) if a != b => push(
            Direction::Changed,
            "token_sha256",
            format!("token replaced (id {a} -> {b}): the old one stops working"),
        ),
        _ => {}
    }
    // The widest valid mode stands in for one that does not parse (a view from elsewhere).
    let mode = |m: &str| crate::config::parse_mode(m).unwrap_or(0o770);
    let (was, now) = (mode(&old.socket_mode), mode(&new.socket_mode));
    if was != now {
        let direction = if now & !was != 0 {
            Direction::Widened
        } else {
            Direction::Narrowed
        };
        push(
            direction,
            "socket_mode",
            format!(
                "socket_mode {} -> {}: {}",
                old.socket_mode,
                new.socket_mode,
                if direction == Direction::Widened {
                    "more local users may connect to the authority's socket"
                } else {
                    "fewer local users may connect to the authority's socket"
                }
            ),
        );
    }
    if old.node != new.node {
        let fleet = |n: &str| n == crate::config::FLEET;
        let (direction, what) = match (fleet(&old.node), fleet(&new.node)) {
            (false, true) => (
                Direction::Widened,
                "its socket and token now exist on every replica",
            ),
            (true, false) => (
                Direction::Narrowed,
                "its socket and token now exist on that node's replica only",
            ),
            _ => (
                Direction::Changed,
                "its socket and token move to another node's replica",
            ),
        };
        push(
            direction,
            "node",
            format!("node {:?} -> {:?}: {what}", old.node, new.node),
        );
    }
    let who = |c: &ChannelView| format!("uid {:?}, gid {:?}", c.socket_uid, c.socket_gid);
    if (old.socket_uid, old.socket_gid) != (new.socket_uid, new.socket_gid) {
        push(
            Direction::Widened,
            "socket_uid",
            format!(
                "the socket's owner changed ({} -> {}): other local users may connect",
                who(old),
                who(new)
            ),
        );
    }
}
