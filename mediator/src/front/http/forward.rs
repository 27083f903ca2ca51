//! Absolute-form forwarding of plain `http://` requests (design section 6, RFC 9112
//! section 3.2.2): each request is decided (a reused upstream connection's included), then
//! rebuilt from canonical values ([`super::rewrite`]) and sent upstream.
//!
//! One upstream connection is kept per client connection and reused for the same target
//! and the same (live) authority. It is never shared across client connections, so never
//! across authorities: an address vetted under one grant's `allow_private` exceptions can
//! never serve another authority. `https://` and other schemes, origin-form requests, and
//! more than one `Host` are refused with the JSON 400.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use http::header;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use policy::config::Authority;
use policy::{Reason, Target, canonicalize_host, parse_authority_form};
use tokio_util::sync::CancellationToken;

use super::response::{Body, DECISION_HEADER, deny_response, raw_label, refuse};
use super::rewrite::{forward_request, strip_hop_by_hop};
use crate::conn::establish::{Connected, establish};
use crate::conn::identify::revoked;
use crate::conn::record::{self, Allowed};
use crate::conn::{Ctx, RequestLine, TargetLabel};
use crate::counting::{Counters, Counting, reporting};
use crate::credential::CheckedBody;
use crate::denial::{Cause, Denial};
use crate::redact::logged_path;
use crate::relay::{PROGRESS_EVERY, RelayOutcome};
use crate::route::{ForwardProxy, Route};
use crate::shared::Shared;
use crate::vocab::{CloseReason, Protocol};

/// A kept-alive upstream connection of one client connection.
pub(crate) struct Pooled {
    target: Target,
    /// Exactly the authority (grant object) it was opened for.
    authority: Arc<Authority>,
    sender: hyper::client::conn::http1::SendRequest<CheckedBody>,
    pin: SocketAddr,
    route: Route,
    /// `Some` when the connection goes to an HTTP parent (absolute-form requests).
    forward: Option<ForwardProxy>,
    /// The connection's byte counts, to tell a silent upstream from a slow one.
    counters: Counters,
}

/// The upstream connection a client connection keeps, if any, and the signal that the
/// client connection has ended (so an upstream connection closed because of it is logged
/// `client_closed`, not `upstream_closed`).
#[derive(Default)]
pub(crate) struct Pool {
    kept: Mutex<Option<Pooled>>,
    client_gone: CancellationToken,
}

impl Pool {
    /// A guard that says the client connection has ended when it is dropped (held by the
    /// task serving the client connection).
    pub(crate) fn client_guard(&self) -> tokio_util::sync::DropGuard {
        self.client_gone.clone().drop_guard()
    }
}

/// Decides and forwards one absolute-form request of `ctx`'s authority.
#[expect(
    clippy::too_many_lines,
    reason = "one forwarded request from decision to answer, read top to bottom"
)]
pub(crate) async fn forward(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    ctx: Ctx,
    authority: Arc<Authority>,
    pool: Arc<Pool>,
) -> Response<Body> {
    let name = authority.grant.name();
    let uri = req.uri().clone();
    let bad = |detail: &str, hint: &str| {
        let denial = Denial::new(Reason::MalformedTarget, detail, hint);
        refuse(&shared, &ctx, Protocol::Http, &raw_label(&uri), denial)
    };
    match uri.scheme_str() {
        Some("http") => {}
        Some(_) => {
            return bad(
                "only http:// URIs are forwarded in absolute-form",
                "use CONNECT host:443 (HTTPS_PROXY) for https",
            );
        }
        None => {
            return bad(
                "origin-form request sent to a proxy",
                "send absolute-form (GET http://host/path HTTP/1.1) or CONNECT",
            );
        }
    }
    if req.headers().get_all(header::HOST).iter().count() > 1 {
        return bad("more than one Host header", "send exactly one Host header");
    }
    if uri.authority().is_none() {
        return bad(
            "absolute-form URI without a host",
            "send GET http://host/path",
        );
    }
    let target = match target_of(&uri) {
        Ok(t) => t,
        Err(e) => {
            return refuse(
                &shared,
                &ctx,
                Protocol::Http,
                &raw_label(&uri),
                super::malformed(&e),
            );
        }
    };
    let label = TargetLabel::from(&target);

    // Every request, a reused upstream connection's included: no decision under a revoked
    // or replaced authority (a Unix channel keeps the authority it was opened with).
    if !shared.authorities.is_live(&authority) {
        return refuse(&shared, &ctx, Protocol::Http, &label, revoked(name));
    }
    // A placeholder of the authority's credentials never goes out in clear text.
    if let Err(denial) = crate::credential::check_plain(&authority, &target, &uri, req.headers()) {
        return refuse(&shared, &ctx, Protocol::Http, &label, denial);
    }
    // The request rules of a terminated host narrow its plain http:// requests too (else
    // `POST http://host/admin` would pass a GET-only rule), and these lines carry the
    // method and path like the `tls` lines of its tunnels. A host the grant does not allow
    // is left to `establish`, which denies it with the right reason.
    let request_ctx = if authority.grant.terminates_tls(&target) {
        Ctx {
            request: Some(RequestLine {
                method: req.method().as_str().to_owned(),
                path: logged_path(&uri),
            }),
            ..ctx.clone()
        }
    } else {
        ctx.clone()
    };
    let ctx = request_ctx;
    if authority.grant.decide(&target).is_allow() {
        // Scoped: the header view is not kept across an await.
        let decision = {
            let headers = crate::credential::Headers(req.headers());
            let facts = policy::RequestFacts::new(req.method().as_str(), uri.path())
                .with_query(uri.query())
                .with_headers(&headers);
            authority.grant.decide_request(&target, &facts)
        };
        if !decision.is_allow() {
            return refuse(
                &shared,
                &ctx,
                Protocol::Http,
                &label,
                Denial::from(decision),
            );
        }
    }

    // Reuse this client connection's upstream connection when it goes to the same target
    // for the same (live) authority.
    let pooled = pool
        .kept
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .filter(|p| p.target == target && Arc::ptr_eq(&p.authority, &authority));
    let pooled = match pooled {
        Some(mut p) => p.sender.ready().await.is_ok().then_some(p),
        None => None,
    };
    let mut upstream = match pooled {
        Some(p) => {
            let decision = authority.grant.decide(&target);
            if !decision.is_allow() {
                // Grants are immutable, so this cannot happen; fail closed anyway.
                return refuse(
                    &shared,
                    &ctx,
                    Protocol::Http,
                    &label,
                    Denial::from(decision),
                );
            }
            let allow = Allowed {
                rule: decision.rule.as_deref(),
                pin: p.pin,
                route: shared.route_label(p.route),
            };
            record::reuse(&shared, &ctx, Protocol::Http, &label, allow);
            p
        }
        None => match open(&shared, &ctx, &authority, &target, &label, &pool).await {
            Ok(opened) => opened,
            Err(resp) => return resp,
        },
    };

    let upstream_req = match forward_request(req, &target, upstream.forward.as_ref()) {
        Ok(r) => r,
        Err(detail) => {
            return bad(
                &detail.to_string(),
                "send a well-formed absolute-form request",
            );
        }
    };
    // Its trailer fields, after the body, may carry no placeholder either.
    let (parts, body) = upstream_req.into_parts();
    let (body, trailers) = {
        let (shared, ctx, label) = (Arc::clone(&shared), ctx.clone(), label.clone());
        CheckedBody::new(body, &authority, &target, move |denial| {
            record::deny(&shared, &ctx, Protocol::Http, &label, denial.clone());
        })
    };
    let upstream_req = Request::from_parts(parts, body);
    let challenges = |resp: &Response<Incoming>| {
        resp.headers()
            .get_all(header::PROXY_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let idle = shared.timeouts.idle_tunnel;
    let Some(answer) = awaited(
        upstream.sender.send_request(upstream_req),
        &upstream.counters,
        idle,
    )
    .await
    else {
        if let Some(denial) = trailers.denial() {
            return deny_response(Some(name), &label, denial);
        }
        let from = match &upstream.forward {
            Some(parent) => parent.to_string(),
            None => "the destination".to_owned(),
        };
        let denial = Denial::new(
            Reason::UpstreamFailure,
            format!(
                "{target}: {from} sent nothing for {}s (timeouts.idle_tunnel) while the answer was awaited",
                idle.as_secs()
            ),
            "the upstream accepted the request but does not answer; check it, or raise [timeouts] idle_tunnel",
        )
        .with_cause(Cause::ResponseTimeout);
        return refuse(&shared, &ctx, Protocol::Http, &label, denial);
    };
    // A trailer that carried a placeholder cut the request (already logged): say why.
    if let Some(denial) = trailers.denial() {
        return deny_response(Some(name), &label, denial);
    }
    // The client's body failed (not valid chunked coding, cut short): its fault, not the
    // upstream's; and an answer to the part of it that got through is not the answer to
    // the request the client sent.
    if let Some(fault) = trailers.client_fault() {
        return refuse(
            &shared,
            &ctx,
            Protocol::Http,
            &label,
            Denial::bad_body(fault),
        );
    }
    match answer {
        // A 407 here is the HTTP parent refusing *our* configured credentials: never hand
        // it to the client as if it were the origin's answer. The connection is not kept.
        Ok(resp) if resp.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED => {
            if let Some(parent) = &upstream.forward {
                let offers = challenges(&resp);
                let (detail, hint) = parent.refusal(offers.iter().map(String::as_str));
                let denial = Denial::new(Reason::UpstreamFailure, detail, hint);
                return refuse(&shared, &ctx, Protocol::Http, &label, denial);
            }
            relay_response(resp, upstream, &pool)
        }
        Ok(resp) => {
            if let Some(parent) = &upstream.forward {
                let offers = challenges(&resp);
                if let Err(detail) = parent.verify(offers.iter().map(String::as_str)).await {
                    let denial = Denial::new(
                        Reason::UpstreamFailure,
                        detail,
                        "the parent's answer did not prove it is the Kerberos service; check its keytab and the name in [upstream]",
                    );
                    return refuse(&shared, &ctx, Protocol::Http, &label, denial);
                }
            }
            relay_response(resp, upstream, &pool)
        }
        Err(e) => {
            let denial = match &upstream.forward {
                Some(parent) => Denial::new(
                    Reason::UpstreamFailure,
                    format!("{target}: {}", parent.broken(&e)),
                    "the parent proxy closed the connection or sent an invalid response",
                ),
                None => Denial::new(
                    Reason::UpstreamFailure,
                    format!("{target}: upstream request failed: {e}"),
                    "the destination closed the connection or sent an invalid response",
                ),
            };
            refuse(&shared, &ctx, Protocol::Http, &label, denial)
        }
    }
}

/// The output of `request`, or `None` when the upstream connection moved no byte in
/// either direction for `idle` before it completed (looked at every quarter of `idle`,
/// so a silence is noticed within 1.25 `idle`). A slow upload or a slow answer that keeps
/// moving is never cut.
async fn awaited<F: Future>(
    request: F,
    counters: &Counters,
    idle: std::time::Duration,
) -> Option<F::Output> {
    tokio::pin!(request);
    let mut seen = counters.get();
    let mut moved = tokio::time::Instant::now();
    loop {
        tokio::select! {
            out = &mut request => return Some(out),
            () = tokio::time::sleep(idle / 4) => {
                let now = counters.get();
                if now != seen {
                    seen = now;
                    moved = tokio::time::Instant::now();
                } else if moved.elapsed() >= idle {
                    return None;
                }
            }
        }
    }
}

/// Hands the upstream answer to the client and keeps the connection for the next request.
fn relay_response(resp: Response<Incoming>, upstream: Pooled, pool: &Pool) -> Response<Body> {
    *pool.kept.lock().unwrap_or_else(PoisonError::into_inner) = Some(upstream);
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(DECISION_HEADER);
    Response::from_parts(parts, body.boxed())
}

/// The target of an absolute-form `http://` URI. Only an authority that is exactly its
/// host has no port (default 80); anything after the host (`:`, `:65536`, `:80a`) must
/// parse as a port or the target is malformed, never silently port 80.
pub(crate) fn target_of(uri: &Uri) -> Result<Target, policy::PolicyError> {
    let Some(auth) = uri.authority() else {
        return Err(policy::PolicyError::Host {
            input: uri.to_string(),
            why: policy::HostError::UriWithoutHost,
        });
    };
    if auth.as_str().contains('@') {
        return Err(policy::PolicyError::Host {
            input: auth.as_str().to_owned(),
            why: policy::HostError::UriUserinfo,
        });
    }
    if auth.as_str() == auth.host() {
        canonicalize_host(auth.host()).map(|host| Target { host, port: 80 })
    } else {
        parse_authority_form(auth.as_str())
    }
}

/// A new upstream HTTP/1.1 connection for `target` (decided and logged by `establish`),
/// whose close record is written when it ends: the origin closed, an error, or its
/// authority's closing signal (revoke grace or shutdown grace over).
async fn open(
    shared: &Arc<Shared>,
    ctx: &Ctx,
    authority: &Arc<Authority>,
    target: &Target,
    label: &TargetLabel,
    pool: &Pool,
) -> Result<Pooled, Response<Body>> {
    let Connected {
        stream,
        opened,
        closing,
        forward_proxy,
        ..
    } = match establish(shared, ctx, Protocol::Http, target).await {
        Ok(c) => c,
        Err(denial) => return Err(deny_response(ctx.authority_name(), label, &denial)),
    };
    let counting = Counting::new(stream);
    let counters = counting.counters();
    let watched = counters.clone();
    let (sender, conn) =
        match hyper::client::conn::http1::handshake::<_, CheckedBody>(TokioIo::new(counting)).await
        {
            Ok(pair) => pair,
            Err(e) => {
                opened.finish(RelayOutcome::ended(CloseReason::Error));
                let denial = Denial::new(
                    Reason::UpstreamFailure,
                    format!("{target}: HTTP handshake failed: {e}"),
                    "the destination did not speak HTTP/1.1",
                );
                return Err(refuse(shared, ctx, Protocol::Http, label, denial));
            }
        };
    let (pin, route) = (opened.facts().pin, opened.facts().route);
    let guard = shared.enter();
    let client_gone = pool.client_gone.clone();
    tokio::spawn(async move {
        let _guard = guard;
        let ended = async {
            tokio::select! {
                r = conn => match r {
                    // The client connection ended and dropped its sender.
                    Ok(()) if client_gone.is_cancelled() => CloseReason::ClientClosed,
                    Ok(()) => CloseReason::UpstreamClosed,
                    Err(_) => CloseReason::Error,
                },
                () = closing.cancelled() => CloseReason::Shutdown,
            }
        };
        // Its bytes reach the metrics while it is open, as a tunnel's do.
        let close_reason = reporting(
            ended,
            PROGRESS_EVERY,
            || counters.get(),
            |up, down| opened.progress(up, down),
        )
        .await;
        let (up, down) = counters.get();
        opened.finish(RelayOutcome {
            up,
            down,
            close_reason,
        });
    });
    Ok(Pooled {
        target: target.clone(),
        authority: Arc::clone(authority),
        sender,
        pin,
        route,
        forward: forward_proxy,
        counters: watched,
    })
}
