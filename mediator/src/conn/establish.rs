//! From a canonical target to an established upstream connection (design sections 4, 7
//! and 8), in this order: the grant's name decision (deny rules, allow rules, port) ->
//! one resolution -> vetting of every address (global or excepted by `allow_private`,
//! never the mediator's own listeners) -> the watchdog (asked only when everything else
//! allowed; it can only narrow) -> the route (after the decision: it chooses how to reach
//! the vetted addresses, never which) -> a connect to the pinned addresses only (or, for a
//! tunnel whose TLS is terminated, an idle upstream connection of the same authority to
//! the same target, pin and route: `crate::reuse`) -> one decision line, allow or deny.
//!
//! [`decide_name`] (a placeholder in the host name, then the grant's name decision) and
//! [`decide_and_vet`] (that, one resolution, vetting) are the parts `mediator explain`
//! shares with live traffic, so the two cannot answer differently. Nothing here
//! ever hands a name to a socket API, and no decision is taken under a grant that is not
//! live (a revoked or replaced authority's connections get `unknown_authority`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use policy::config::Authority;
use policy::{OwnAddrs, Pin, Reason, Target};
use tokio_util::sync::CancellationToken;

use super::close::{Facts, Opened};
use super::held::{self, Watch};
use super::identify::revoked;
use super::record::{self, Allowed, Timing};
use super::standing::{self, Standing, Subject};
use super::{Ctx, TargetLabel};
use crate::authorities::{Live, Origin};
use crate::denial::{Cause, Denial};
use crate::limits::Attributed;
use crate::resolve::{ResolveFailure, Resolver};
use crate::reuse::{self, Leg, Lookup};
use crate::route::{ConnectFailure, ForwardProxy, Route, RouteFailure, Via};
use crate::shared::Shared;
use crate::vocab::UpstreamErrorKind;
use crate::vocab::{Channel, Protocol};
use crate::watchdog;

/// An established upstream connection for an allowed decision.
#[derive(Debug)]
pub(crate) struct Connected {
    /// The upstream leg: a new stream (TCP, or TLS to an HTTPS parent), or for a
    /// terminated tunnel an idle upstream connection it reuses (`crate::reuse`).
    pub(crate) stream: Leg,
    /// The owner of its close record.
    pub(crate) opened: Opened,
    /// Cancelled when this connection must be cut: its authority was revoked (or judged
    /// it no longer allowed after a reload) and the revoke grace is over, or the shutdown
    /// grace is over.
    pub(crate) closing: CancellationToken,
    /// The authority it runs under (a reload may move it to a successor).
    pub(crate) standing: Arc<Standing>,
    /// `Some` when `stream` goes to an HTTP parent that takes absolute-form requests
    /// (plain HTTP routed through a parent): send them there, with this authorization.
    pub(crate) forward_proxy: Option<ForwardProxy>,
}

/// One resolution and how long it took.
#[derive(Debug)]
pub(crate) struct Resolution {
    /// The addresses, or why there are none.
    pub(crate) addrs: Result<Vec<IpAddr>, ResolveFailure>,
    /// Time spent.
    pub(crate) took: Duration,
}

/// An allowed target's vetted addresses and the grant entry that allowed it.
#[derive(Debug)]
pub(crate) struct Vetted {
    /// The addresses a connection may be made to, in order.
    pub(crate) pin: Pin,
    /// The allow entry that matched.
    pub(crate) rule: Option<String>,
}

/// What the shared decision steps found for one target.
#[derive(Debug)]
pub(crate) struct Vetting {
    /// The resolution, when the name decision allowed.
    pub(crate) resolved: Option<Resolution>,
    /// The pin, or the denial.
    pub(crate) outcome: Result<Vetted, Denial>,
}

/// The name decision that live traffic and `mediator explain` share, before any
/// resolution: a host name holding one of `authority`'s placeholders is refused
/// (`credential_misuse`, design section 14: it would carry the placeholder to DNS
/// resolvers and, as the SNI, to whoever answers), then the grant decides (deny rules,
/// allow rules, port).
///
/// # Errors
/// The [`Denial`] (not logged here).
pub(crate) fn decide_name(
    authority: &Authority,
    target: &Target,
) -> Result<Option<String>, Denial> {
    crate::credential::check_target(authority, target)?;
    let decision = authority.grant.decide(target);
    if decision.is_allow() {
        Ok(decision.rule)
    } else {
        Err(Denial::from(decision))
    }
}

/// The decision steps that live traffic and `mediator explain --resolve` share: the name
/// decision ([`decide_name`]), one resolution, then vetting of every address. Nothing is
/// connected to.
pub(crate) async fn decide_and_vet(
    resolver: &Resolver,
    own: &OwnAddrs,
    authority: &Authority,
    target: &Target,
) -> Vetting {
    let rule = match decide_name(authority, target) {
        Ok(rule) => rule,
        Err(denial) => {
            return Vetting {
                outcome: Err(denial),
                resolved: None,
            };
        }
    };
    let (addrs, took) = resolver.resolve(&target.host).await;
    let outcome = match &addrs {
        Err(failure) => Err(Denial::new(
            Reason::DnsFailure,
            format!("cannot resolve {}: {failure}", target.host),
            "check the host name; the mediator's resolver found no address for it",
        )
        .with_cause(match failure {
            ResolveFailure::Timeout => Cause::DnsTimeout,
            ResolveFailure::NoRecords | ResolveFailure::Other(_) => Cause::Policy,
        })
        .with_rule(rule)),
        Ok(addrs) => match authority.grant.vet(target, addrs, own) {
            Ok(pin) => Ok(Vetted { pin, rule }),
            Err(d) => Err(Denial::from(d)),
        },
    };
    Vetting {
        resolved: Some(Resolution { addrs, took }),
        outcome,
    }
}

/// Decides, resolves, vets, asks the authority's watchdog and connects, for the authority
/// `ctx` is attributed to; logs the decision line (allow or deny) and counts it. A grant
/// miss of an authority with `ask` is held for the host's answer first (`watch` says how
/// a client that leaves meanwhile is seen: `super::held`). A shutdown whose grace ends
/// meanwhile ends the attempt, still with its decision line.
///
/// # Errors
/// The [`Denial`], already logged.
pub(crate) async fn establish(
    shared: &Arc<Shared>,
    ctx: &Ctx,
    protocol: Protocol,
    target: &Target,
    watch: Watch<'_>,
) -> Result<Connected, Denial> {
    // Boxed: resolving and connecting take a large future (kilobytes) that is needed only
    // until the connection is up; inline, every connection's task would carry (and move)
    // it for its whole life.
    let establishing = Box::pin(steps(shared, ctx, protocol, target, watch));
    tokio::select! {
        result = establishing => result,
        () = shared.signals.closing.cancelled() => {
            let denial = Denial::new(
                Reason::UpstreamFailure,
                format!("{target}: the mediator shut down before the upstream connection was made"),
                "retry once the mediator is back",
            );
            Err(record::deny(shared, ctx, protocol, &TargetLabel::from(target), denial))
        }
    }
}

/// The steps of [`establish`] in their order (design section 3): the live authority,
/// the registry's standing, the authority's limits, the name decision (a miss held for
/// the host's answer when its authority asks, and on `allow_via` these steps again
/// under that authority), the resolution and the vetting, the watchdog, the route and
/// the connect, then the connection.
async fn steps(
    shared: &Arc<Shared>,
    ctx: &Ctx,
    protocol: Protocol,
    target: &Target,
    watch: Watch<'_>,
) -> Result<Connected, Denial> {
    let label = TargetLabel::from(target);
    let Some(live) = live_for(shared, ctx) else {
        let denial = revoked(ctx.authority_name().unwrap_or("-"));
        let id = shared.next_id();
        record::decision(
            shared,
            ctx,
            id,
            protocol,
            &label,
            Err(&denial),
            Timing::default(),
        );
        return Err(denial);
    };
    let ctx = &ctx.attributed(&live.authority);
    let authority = &live.authority;
    let id = shared.next_id();
    let log = |result: Result<Allowed<'_>, &Denial>, timing: Timing| {
        record::decision(shared, ctx, id, protocol, &label, result, timing);
    };
    let started = Instant::now();
    if let Err(denial) = vouched(shared, &live).and_then(|()| admitted(shared, ctx, &live)) {
        log(Err(&denial), Timing::default());
        return Err(denial);
    }
    // A host name holding one of the authority's placeholders is refused before it is
    // resolved (design section 14): the first step of `decide_and_vet`.
    let vetting = decide_and_vet(&shared.resolver, &shared.own, authority, target).await;
    let dns = vetting.resolved.as_ref().map(|r| {
        count_resolution(shared, target, r);
        r.took
    });
    let Vetted { pin, rule } = match vetting.outcome {
        Ok(v) => v,
        Err(denial) => {
            let refused = Refused { id, denial, dns };
            return missed(shared, ctx, protocol, target, refused, watch).await;
        }
    };
    if let Err(denial) =
        watchdog::consult(authority, protocol, target, shared.timeouts.watchdog).await
    {
        let denial = denial.with_rule(rule);
        log(Err(&denial), Timing { dns, connect: None });
        return Err(denial);
    }
    let (connected, took) = reach(shared, &live, protocol, target, &pin).await;
    let timing = Timing { dns, connect: took };
    let reached = match connected {
        Ok(reached) => reached,
        Err(failure) => {
            let denial = upstream_denial(shared, failure).with_rule(rule);
            log(Err(&denial), timing);
            return Err(denial);
        }
    };
    let allow = Allowed {
        rule: rule.as_deref(),
        pin: reached.pin,
        route: shared.route_label(reached.route),
    };
    shared
        .metrics
        .routed(authority.grant.name(), reached.route.kind());
    log(Ok(allow), timing);
    let facts = Facts {
        id,
        rule: rule.clone(),
        pin: reached.pin,
        started,
        route: reached.route,
        dns,
        connect: took,
    };
    Ok(connection(
        shared, ctx, protocol, target, live, reached, facts,
    ))
}

/// A refusal of the decision steps, before any connect.
struct Refused {
    /// The decision id.
    id: u64,
    denial: Denial,
    /// The resolution's time, if there was one.
    dns: Option<Duration>,
}

/// A refused request: logged and denied, unless its authority asks the host about this
/// miss (`super::held`); then the host's `allow_via` sends it through the steps again,
/// under that authority (once: an answer's judgement is never asked about).
///
/// # Errors
/// The [`Denial`], already logged.
async fn missed(
    shared: &Arc<Shared>,
    ctx: &Ctx,
    protocol: Protocol,
    target: &Target,
    refused: Refused,
    watch: Watch<'_>,
) -> Result<Connected, Denial> {
    let Refused { id, denial, dns } = refused;
    let ask = ctx
        .authority
        .as_deref()
        .and_then(|a| held::askable(ctx, a, target, &denial));
    if let Some(ask) = ask {
        let via = held::hold(shared, ctx, protocol, target, id, denial, ask, watch).await?;
        return Box::pin(steps(shared, &via, protocol, target, Watch::Dropped)).await;
    }
    let label = TargetLabel::from(target);
    let timing = Timing { dns, connect: None };
    record::decision(shared, ctx, id, protocol, &label, Err(&denial), timing);
    Err(denial)
}

/// What an allowed connection reached: its leg, the vetted address, the route, and
/// (plain HTTP through an HTTP parent) how to send there.
struct Reached {
    leg: Leg,
    pin: SocketAddr,
    route: Route,
    forward: Option<ForwardProxy>,
}

/// Reaches an allowed, vetted target: a tunnel whose TLS is terminated takes an idle
/// upstream connection of its authority's to the same place when one is alive
/// (`crate::reuse`: no connect, so no time), else it connects over the route (the time
/// it took).
async fn reach(
    shared: &Shared,
    live: &Live,
    protocol: Protocol,
    target: &Target,
    pin: &Pin,
) -> (Result<Reached, RouteFailure>, Option<Duration>) {
    let ticket =
        match reuse::lookup(&shared.reuse, &shared.router, live, protocol, target, pin).await {
            Lookup::Hit(lease) => {
                shared.metrics.reused_upstream();
                let (pin, route) = (lease.conn.addr, lease.conn.route);
                let leg = Leg::Reused(lease);
                let reached = Reached {
                    leg,
                    pin,
                    route,
                    forward: None,
                };
                return (Ok(reached), None);
            }
            Lookup::Miss(ticket) => Some(ticket),
            Lookup::Off => None,
        };
    let via = via_for(protocol);
    let (connected, took) = shared
        .router
        .connect(via, target, pin, shared.timeouts.connect)
        .await;
    shared.metrics.observe_connect(took);
    let reached = connected.map(|e| Reached {
        leg: Leg::Fresh(e.stream, ticket.map(|t| Box::new(t.routed(e.route)))),
        pin: e.pin,
        route: e.route,
        forward: e.forward,
    });
    (reached, Some(took))
}

/// How the router reaches the target: absolute-form requests may go to an HTTP parent as
/// they are; everything else is a tunnel.
fn via_for(protocol: Protocol) -> Via {
    if protocol.is_forwarding() {
        Via::Forward
    } else {
        Via::Tunnel
    }
}

/// The grant decided with must be the live authority's own (never another's). A
/// channel's connection accepted before a reload re-created its authority (same channel)
/// is decided under the successor; on the TCP listener the credential was just verified
/// against the entry it named, so a successor that a reload put in its place meanwhile
/// decides only if it takes the same token.
fn live_for(shared: &Shared, ctx: &Ctx) -> Option<Arc<Live>> {
    let a = ctx.authority.as_ref()?;
    match ctx.peer.channel() {
        Channel::Tcp => shared
            .authorities
            .current_of(a)
            .filter(|l| l.authority.token_sha256 == a.token_sha256),
        Channel::Unix | Channel::Embedded => shared.authorities.current_of(a),
    }
}

/// An authority from the registry is decided for only while this replica can vouch that
/// it still exists (design section 17): fail closed. Tunnels already open are not cut for
/// staleness alone.
///
/// # Errors
/// `registry_unavailable`.
fn vouched(shared: &Shared, live: &Live) -> Result<(), Denial> {
    if live.origin != Origin::Api || !shared.authorities.registry_stale() {
        return Ok(());
    }
    Err(Denial::new(
        Reason::RegistryUnavailable,
        format!(
            "authority \"{}\" comes from the registry, and this mediator cannot confirm its view of the registry is current",
            live.name()
        ),
        "retry shortly; authorities from the registry are served again once it answers",
    ))
}

/// The authority's limits (design section 13): a TCP connection is counted against them
/// from its first request; a channel's, from its accept (a refusal waits here).
///
/// # Errors
/// The limit's denial (counted in the metrics when it is new).
fn admitted(shared: &Shared, ctx: &Ctx, live: &Live) -> Result<(), Denial> {
    match ctx.admission.attribute(&live.counts, live.name()) {
        Attributed::Admitted => Ok(()),
        Attributed::Refused {
            kind,
            denial,
            fresh,
        } => {
            if fresh {
                shared.metrics.limited(Some(live.name()), kind);
            }
            Err(denial)
        }
    }
}

/// The allowed connection: its standing under `live` (judged again after a reload, cut
/// after a revocation) and the owner of its close record.
fn connection(
    shared: &Arc<Shared>,
    ctx: &Ctx,
    protocol: Protocol,
    target: &Target,
    live: Arc<Live>,
    reached: Reached,
    facts: Facts,
) -> Connected {
    let Reached {
        leg: stream,
        pin,
        route,
        forward,
    } = reached;
    let subject = Subject {
        ctx: ctx.clone(),
        protocol,
        target: target.clone(),
        pin,
        route,
    };
    let (standing, keeper) = standing::start(shared, live, subject);
    let label = TargetLabel::from(target);
    let opened = Opened::new(Arc::clone(shared), ctx.clone(), protocol, label, facts);
    Connected {
        stream,
        opened: opened.keeping(keeper),
        closing: standing.cut_signal(),
        standing,
        forward_proxy: forward,
    }
}

/// Counts a resolution in the DNS histogram (names only) and its failure by kind.
fn count_resolution(shared: &Shared, target: &Target, r: &Resolution) {
    if target.host.name().is_some() {
        shared.metrics.observe_dns(r.took);
    }
    if let Err(failure) = &r.addrs {
        shared.metrics.upstream_error(match failure {
            ResolveFailure::NoRecords => UpstreamErrorKind::DnsNoRecords,
            ResolveFailure::Timeout => UpstreamErrorKind::DnsTimeout,
            ResolveFailure::Other(_) => UpstreamErrorKind::DnsError,
        });
    }
}

/// The denial of a failed route, counted by kind.
fn upstream_denial(shared: &Shared, failure: RouteFailure) -> Denial {
    let (kind, cause) = match failure.connect {
        // The parent answered (407, 403, SOCKS5 REP) or the PAC gave no route.
        None => (UpstreamErrorKind::ConnectError, Cause::Policy),
        Some(ConnectFailure::Refused(_)) => {
            (UpstreamErrorKind::ConnectRefused, Cause::ConnectRefused)
        }
        Some(ConnectFailure::Timeout) => (UpstreamErrorKind::ConnectTimeout, Cause::ConnectTimeout),
        Some(ConnectFailure::Other(_)) => (UpstreamErrorKind::ConnectError, Cause::ConnectError),
    };
    shared.metrics.upstream_error(kind);
    let hint = if failure.connect.is_none() {
        // No connection failed: a parent answered with a refusal, or no route was planned.
        "a parent proxy on the route refused the request or no route was left (the detail names it and what it said); for a 407 check parent_credentials_file, parent_auth and the Kerberos credentials (kerberos_ccache, kerberos_keytab)"
    } else {
        "the destination (or the parent proxy on its route) did not accept the connection; check the host and port, and the [upstream] parents"
    };
    Denial::new(Reason::UpstreamFailure, failure.detail, hint).with_cause(cause)
}
