//! One request inside a terminated tunnel (h1 and h2 alike), as named steps:
//! [`Asking`] (who asks, under the tunnel's authority now, and what), [`tunnel_rules`]
//! (the tunnel host, a protocol switch it may ask for), [`judge()`] (the judgement every
//! request gets, `crate::request::judge`: the authority still live, the request rules,
//! the credentials; a request-rule miss of an authority that asks is [`held()`] for the
//! host's answer first, design section 20), [`upstream_request`] (the connection that carries it, a switch's plan,
//! the rebuilt request), the decision line, then [`send()`] (`crate::request::send`) and
//! the answer. Every refusal writes this request's decision line and answers with the
//! JSON denial.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use policy::config::Authority;
use policy::{Reason, Target};

use super::h2_resets::{OnReset, Refusal};
use super::upgrade::{self, Plan, Switch, SwitchError};
use super::{Env, MAX_STREAMS, Upstream};
use crate::conn::held;
use crate::conn::record::{self, Allowed};
use crate::conn::{Ctx, RequestLine, TargetLabel};
use crate::denial::{Cause, Denial};
use crate::redact::logged_path;
use crate::request::authority::check_authority;
use crate::request::judge::{self, Asked, Judged, Leg};
use crate::request::rebuild::rebuild;
use crate::request::response::{self, Body, deny_response};
use crate::request::send::{self, Sent, relayed_parts};
use crate::shared::Shared;
use crate::vocab::Protocol;

/// Judges and forwards one request; the answer is the origin's, or the JSON denial.
pub(super) async fn handle(req: Request<Incoming>, env: &Env) -> Response<Body> {
    let switch = requested_switch(&req);
    let mut asking = Asking::of(&req, &switch, env);
    let (mut parts, body) = req.into_parts();
    let switch = match tunnel_rules(&mut parts, switch, env) {
        Ok(switch) => switch,
        Err(denial) => {
            drain_later(body);
            return asking.refuse(env, &denial);
        }
    };
    let judged = match judge(&mut parts, switch.as_ref(), &asking, env) {
        Ok(judged) => judged,
        Err(miss) => match held(&mut parts, switch.as_ref(), &asking, miss, env).await {
            Ok((via, judged)) => {
                asking = via;
                judged
            }
            Err(answer) => {
                drain_later(body);
                return answer;
            }
        },
    };
    let Judged::Allowed {
        decision,
        credential,
    } = judged;
    let req = Request::from_parts(parts, body);
    let (upstream, plan, upstream_req) = match upstream_request(req, switch.as_ref(), env).await {
        Ok(prepared) => prepared,
        Err(denial) => return asking.refuse(env, &denial),
    };
    let allow = Allowed {
        rule: decision.as_ref().and_then(|d| d.rule.as_deref()),
        pin: env.pin,
        route: env.shared.route_label(env.route),
    };
    let id = env.lines.allowed(
        &env.shared,
        &asking.ctx,
        &env.label,
        &asking.request,
        allow,
        credential,
    );
    send(upstream_req, upstream, plan, &asking, id, env).await
}

/// The most of a refused request's body read after its answer.
const DRAIN_BYTES: usize = 64 * 1024;
/// How long a refused request's body is read after its answer.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads the body of a refused request after its answer is sent (at most [`DRAIN_BYTES`]
/// for [`DRAIN_TIME`]), instead of dropping it: a body dropped while the client is still
/// sending it resets an HTTP/2 stream (`RST_STREAM`), and a client such as curl then
/// reports a framing error instead of the 403 it was sent. Past the bounds it is dropped.
/// The task lives no longer than the stream, which the connection's stream limit bounds.
fn drain_later(body: Incoming) {
    if hyper::body::Body::is_end_stream(&body) {
        return;
    }
    tokio::spawn(async move {
        let mut body = http_body_util::Limited::new(body, DRAIN_BYTES);
        let read = async { while let Some(Ok(_)) = body.frame().await {} };
        let _ = tokio::time::timeout(DRAIN_TIME, read).await;
    });
}

/// The protocol switch a request asks for (`Upgrade`, or HTTP/2 extended CONNECT), or why
/// it cannot have one.
fn requested_switch(req: &Request<Incoming>) -> Result<Option<Switch>, SwitchError> {
    let protocol = req
        .extensions()
        .get::<hyper::ext::Protocol>()
        .map(|p| p.as_str().as_bytes().to_vec());
    upgrade::requested(
        req.method(),
        req.headers(),
        req.version(),
        protocol.as_deref(),
    )
}

/// Who asks what: the authority the tunnel stands under now (a reload that kept the
/// tunnel moved it to the new grant), its context, and the request line logged for it.
struct Asking {
    authority: Arc<Authority>,
    ctx: Ctx,
    request: RequestLine,
}

impl Asking {
    fn of(
        req: &Request<Incoming>,
        switch: &Result<Option<Switch>, SwitchError>,
        env: &Env,
    ) -> Self {
        let method = match switch {
            Ok(Some(s)) => s.judged_method(req.method()),
            _ => req.method().as_str(),
        };
        let authority = env.standing.authority();
        Self {
            ctx: env.ctx.attributed(&authority),
            authority,
            request: RequestLine {
                method: method.to_owned(),
                path: logged_path(req.uri()),
            },
        }
    }

    fn name(&self) -> &str {
        self.authority.grant.name()
    }

    /// Writes `denial` as this request's decision line and answers with it.
    fn refuse(&self, env: &Env, denial: &Denial) -> Response<Body> {
        record::tls_request(
            &env.shared,
            &self.ctx,
            &env.label,
            &self.request,
            Err(denial),
            Vec::new(),
        );
        deny_response(Some(self.name()), &env.label, denial)
    }
}

/// The tunnel's own rules for one request: it must be for the tunnel host (else `421`)
/// and may ask only for a switch the tunnel can carry. Returns the switch.
///
/// # Errors
/// The denial to log and answer.
fn tunnel_rules(
    parts: &mut http::request::Parts,
    switch: Result<Option<Switch>, SwitchError>,
    env: &Env,
) -> Result<Option<Switch>, Denial> {
    check_authority(&parts.uri, &parts.headers, &env.target, &env.matched).map_err(|detail| {
        Denial::new(
            Reason::SniMismatch,
            detail.to_string(),
            format!(
                "this tunnel is to {}: send requests for other hosts through a tunnel to that host",
                env.target
            ),
        )
        .with_cause(Cause::Misdirected)
    })?;
    switch.map_err(|detail| {
        Denial::new(
            Reason::DeniedByRule,
            detail.to_string(),
            "inside a terminated tunnel Upgrade: websocket (or an HTTP/2 extended CONNECT for it) is relayed, and tokens a request rule lists in upgrade; send the request without Upgrade",
        )
    })
}

/// The judgement every request gets (`crate::request::judge`), under `asking`'s
/// authority: still live, the grant's request rules, the credentials (their secrets put
/// into `parts`).
///
/// # Errors
/// The denial (not logged yet).
fn judge(
    parts: &mut http::request::Parts,
    switch: Option<&Switch>,
    asking: &Asking,
    env: &Env,
) -> Result<Judged, Denial> {
    let asked = Asked {
        method: &asking.request.method,
        uri: &parts.uri,
        upgrade: switch.map(|s| &s.token),
    };
    judge::judge(
        &env.shared.authorities,
        &asking.authority,
        &env.target,
        Leg::Terminated,
        asked,
        &mut parts.headers,
    )
}

/// A request the grant's request rules refused (`denied_by_rule`), when the tunnel's
/// authority asks the host (design section 20): held for the answer (`crate::conn::held`,
/// its records `protocol: "tls"` with the method and path); on `allow_via`, judged again
/// under that authority, which must allow the tunnel host and whose request rules must
/// allow the request, and carried on attributed to it. Any other refusal is logged and
/// answered as it is.
///
/// # Errors
/// The answer to send, its denial on record.
async fn held(
    parts: &mut http::request::Parts,
    switch: Option<&Switch>,
    asking: &Asking,
    miss: Denial,
    env: &Env,
) -> Result<(Asking, Judged), Response<Body>> {
    let ask = match held::askable_request(&asking.ctx, &asking.authority) {
        Some(ask) if miss.reason == Reason::DeniedByRule => ask,
        _ => return Err(asking.refuse(env, &miss)),
    };
    let ctx = Ctx {
        request: Some(asking.request.clone()),
        ..asking.ctx.clone()
    };
    let id = env.shared.next_id();
    let watch = held::Watch::Dropped;
    let via = held::hold(
        &env.shared,
        &ctx,
        Protocol::Tls,
        &env.target,
        id,
        miss,
        ask,
        watch,
    )
    .await
    .map_err(|denial| deny_response(Some(asking.name()), &env.label, &denial))?;
    let Some(authority) = via.authority.clone() else {
        // `hold` attributes what it hands back; never unattributed.
        return Err(asking.refuse(env, &crate::conn::identify::revoked(asking.name())));
    };
    let via = Asking {
        authority,
        ctx: via,
        request: asking.request.clone(),
    };
    let host = via.authority.grant.decide(&env.target);
    if !host.is_allow() {
        return Err(via.refuse(env, &Denial::from(host)));
    }
    match judge(parts, switch, &via, env) {
        Ok(judged) => Ok((via, judged)),
        Err(denial) => Err(via.refuse(env, &denial)),
    }
}

/// A switch's plan on the upstream connection, with the client's side of the upgrade.
type Planned<'s> = Option<(&'s Switch, Plan, OnUpgrade)>;

/// The upstream connection that carries the request, a switch's plan on it, and the
/// request rebuilt for it.
///
/// # Errors
/// The denial: no upstream connection (why), an HTTP/1.1 upstream taken over by a switch,
/// a switch the upstream cannot carry, a request that cannot be rebuilt.
async fn upstream_request<'e, 's>(
    mut req: Request<Incoming>,
    switch: Option<&'s Switch>,
    env: &'e Env,
) -> Result<(&'e Upstream, Planned<'s>, Request<Incoming>), Denial> {
    let upstream = env.upstream.as_ref().map_err(|detail| {
        Denial::new(
            Reason::UpstreamFailure,
            detail.to_string(),
            "the upstream's certificate must verify against the system trust store or [tls] extra_ca_files, for the host name itself",
        )
    })?;
    if matches!(upstream, Upstream::H1(_)) && env.upgrading.load(Ordering::SeqCst) {
        return Err(Denial::new(
            Reason::UpstreamFailure,
            format!(
                "{}: the tunnel's HTTP/1.1 upstream connection carries a switched protocol now",
                env.target
            ),
            "send further requests on a new connection",
        ));
    }
    let plan = match switch {
        None => None,
        Some(s) => match upgrade::plan(s, upstream.carrier().await) {
            Ok(p) => Some((s, p, hyper::upgrade::on(&mut req))),
            Err(detail) => {
                return Err(Denial::new(
                    Reason::UpstreamFailure,
                    format!("{}: {detail}", env.target),
                    "open a new tunnel and use HTTP/1.1 for the WebSocket, or ask the origin's operator to enable extended CONNECT",
                ));
            }
        },
    };
    let rebuilt = rebuild(req, &env.origin, upstream.version()).map_err(|detail| {
        Denial::new(
            Reason::MalformedTarget,
            detail.to_string(),
            "send a well-formed request",
        )
    })?;
    let rebuilt = match &plan {
        Some((s, p, _)) => {
            let (mut parts, body) = rebuilt.into_parts();
            upgrade::prepare(&mut parts, s, p);
            Request::from_parts(parts, body)
        }
        None => rebuilt,
    };
    Ok((upstream, plan, rebuilt))
}

/// Sends the allowed request (its decision line `id` is written) and answers with the
/// origin's response: a switch the origin accepted is relayed; a `HEAD` answer has no body.
async fn send(
    upstream_req: Request<Incoming>,
    upstream: &Upstream,
    plan: Planned<'_>,
    asking: &Asking,
    id: u64,
    env: &Env,
) -> Response<Body> {
    let name = asking.name();
    let head = asking.request.method == "HEAD";
    let takes_h1 = plan.is_some() && matches!(upstream, Upstream::H1(_));
    if takes_h1 {
        env.upgrading.store(true, Ordering::SeqCst);
    }
    let on_misuse = || {
        let (shared, ctx) = (Arc::clone(&env.shared), asking.ctx.clone());
        let (label, request) = (env.label.clone(), asking.request.clone());
        move |denial: &Denial| {
            record::tls_request(&shared, &ctx, &label, &request, Err(denial), Vec::new());
        }
    };
    let sent = send::send(
        upstream_req,
        &asking.authority,
        &env.target,
        on_misuse,
        |r| upstream.send(r),
    )
    .await;
    let mut resp = match sent {
        Sent::Answer(Ok(resp)) => resp,
        Sent::Misuse(denial) => {
            env.upgrading.store(false, Ordering::SeqCst);
            return deny_response(Some(name), &env.label, &denial);
        }
        // A line of its own, after the request's allowing one.
        Sent::ClientFault(denial) => {
            env.upgrading.store(false, Ordering::SeqCst);
            return asking.refuse(env, &denial);
        }
        Sent::Answer(Err(e)) => {
            if takes_h1 {
                env.upgrading.store(false, Ordering::SeqCst);
            }
            let denial = Denial::new(
                Reason::UpstreamFailure,
                format!("{}: upstream request failed: {e}", env.target),
                "the destination closed the connection or sent an invalid response",
            );
            return deny_response(Some(name), &env.label, &denial);
        }
    };
    let upstream_upgrade = plan.as_ref().map(|_| hyper::upgrade::on(&mut resp));
    let (mut parts, body) = resp.into_parts();
    relayed_parts(&mut parts);
    if let (Some((switch, plan, client)), Some(upstream_upgrade)) = (plan, upstream_upgrade) {
        match upgrade::switched(&mut parts, switch, &plan) {
            Ok(true) => {
                let facts = upgrade::Upgraded {
                    shared: Arc::clone(&env.shared),
                    ctx: asking.ctx.clone(),
                    label: env.label.clone(),
                    request: asking.request.clone(),
                    id,
                    token: switch.token.clone(),
                    pin: env.pin,
                    route: env.shared.route_label(env.route).to_owned(),
                };
                env.relays.spawn(upgrade::relay(
                    client,
                    upstream_upgrade,
                    facts,
                    env.closing.clone(),
                ));
                drop(body);
                return Response::from_parts(parts, empty_body());
            }
            Ok(false) => {}
            Err(detail) => {
                let denial = Denial::new(
                    Reason::UpstreamFailure,
                    format!("{}: {detail}", env.target),
                    "the origin must answer the upgrade as RFC 6455 section 4.2.2 says",
                );
                return deny_response(Some(name), &env.label, &denial);
            }
        }
        if takes_h1 {
            env.upgrading.store(false, Ordering::SeqCst);
        }
    }
    if head {
        // A HEAD response has no body, whatever its Content-Length says; passing the
        // upstream body on would make the HTTP/2 server reset the stream.
        drop(body);
        return Response::from_parts(parts, empty_body());
    }
    Response::from_parts(parts, body.boxed())
}

/// Writes the decision line of an HTTP/1.1 request head hyper refused itself (answered
/// with a bare `400`, or `431` over `[limits] request_head_bytes`): a head after the
/// first, which [`super::head`] judged. Any other end of the connection writes nothing.
pub(super) fn refused_head(e: &(dyn std::error::Error + Send + Sync + 'static), env: &Env) {
    let Some(e) = e.downcast_ref::<hyper::Error>() else {
        return;
    };
    let Some(denial) = response::refused_head(e, env.shared.limits.request_head_bytes) else {
        return;
    };
    let ctx = env.ctx.attributed(&env.standing.authority());
    record::deny(&env.shared, &ctx, Protocol::Tls, &env.label, denial);
}

/// Writes the decision line of each HTTP/2 request the HTTP/2 layer refused before it
/// reached [`handle`] (`super::h2_resets`): no method or path can be logged.
pub(super) fn refused_h2(
    shared: &Arc<Shared>,
    ctx: &Ctx,
    label: &TargetLabel,
    target: &Target,
) -> OnReset {
    let (shared, ctx, label, target) = (
        Arc::clone(shared),
        ctx.clone(),
        label.clone(),
        target.clone(),
    );
    Box::new(move |refusal| {
        let denial = match refusal {
            Refusal::Malformed(stream) => Denial::new(
                Reason::MalformedTarget,
                format!(
                    "HTTP/2 stream {stream} in the tunnel to {target} was a malformed request (RFC 9113 section 8.1.1: e.g. an :authority or :path that is not URI syntax, or a body that does not match its content-length); it was reset with PROTOCOL_ERROR before it could be judged, and nothing more of it was forwarded"
                ),
                format!("send well-formed requests whose :authority is {target}"),
            ),
            Refusal::TooLarge(stream) => Denial::new(
                Reason::BadRequest,
                format!(
                    "HTTP/2 stream {stream} in the tunnel to {target}: its header list is larger than [limits] request_head_bytes ({} bytes, the SETTINGS_MAX_HEADER_LIST_SIZE the mediator announced); it was answered 431 before it could be judged",
                    shared.limits.request_head_bytes
                ),
                "send a smaller header list, or ask the operator to raise [limits] request_head_bytes",
            ),
            Refusal::Refused(stream) => Denial::new(
                Reason::RateLimited,
                format!(
                    "HTTP/2 stream {stream} in the tunnel to {target} was refused with REFUSED_STREAM: the connection already had {MAX_STREAMS} streams open (the SETTINGS_MAX_CONCURRENT_STREAMS the mediator announced); nothing of it was processed"
                ),
                "keep fewer streams open at once on one connection, or retry the request when one ends",
            ),
        };
        record::deny(&shared, &ctx, Protocol::Tls, &label, denial);
    })
}

fn empty_body() -> Body {
    http_body_util::Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}
