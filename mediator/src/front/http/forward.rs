//! Absolute-form forwarding of plain `http://` requests (design section 6, RFC 9112
//! section 3.2.2): each request is judged by the steps every request takes
//! (`crate::request`), a reused upstream connection's included, then rebuilt from
//! canonical values (`crate::request::rewrite`) and sent upstream. What is this file's
//! own: the scheme and `Host` checks, and the kept upstream connection.
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
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use policy::config::Authority;
use policy::{Reason, Target, canonicalize_host, parse_authority_form};
use tokio_util::sync::CancellationToken;

use crate::conn::close::Opened;
use crate::conn::establish::{Connected, establish};
use crate::conn::held::Watch;
use crate::conn::record::{self, Allowed};
use crate::conn::{Ctx, RequestLine, TargetLabel};
use crate::counting::{Counters, reporting};
use crate::credential::CheckedBody;
use crate::denial::{Cause, Denial};
use crate::redact::logged_path;
use crate::relay::{PROGRESS_EVERY, RelayOutcome};
use crate::request::judge::{Asked, Leg, judge};
use crate::request::response::{Body, deny_response, raw_label, refuse};
use crate::request::rewrite::{RewriteError, forward_request};
use crate::request::send::{Sent, relayed, send};
use crate::route::{ForwardProxy, Route};
use crate::shared::Shared;
use crate::tap::Tapped;
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

/// Judges and forwards one absolute-form request of `ctx`'s authority: the target (what
/// only absolute-form has: the scheme, one `Host`), the judgement every request gets
/// (`crate::request::judge`), the upstream connection (kept or new), the request
/// rebuilt and sent, the answer.
pub(crate) async fn forward(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    ctx: Ctx,
    authority: Arc<Authority>,
    pool: Arc<Pool>,
) -> Response<Body> {
    let raw = raw_label(req.uri());
    let target = match absolute_target(&req) {
        Ok(t) => t,
        Err(denial) => return refuse(&shared, &ctx, Protocol::Http, &raw, denial),
    };
    let label = TargetLabel::from(&target);
    let ctx = with_request_line(ctx, &authority, &target, &req);
    let refused =
        |label: &TargetLabel, denial| refuse(&shared, &ctx, Protocol::Http, label, denial);
    let (mut parts, body) = req.into_parts();
    let asked = Asked {
        method: parts.method.as_str(),
        uri: &parts.uri,
        upgrade: None,
    };
    let judged = judge(
        &shared.authorities,
        &authority,
        &target,
        Leg::Plain,
        asked,
        &mut parts.headers,
    );
    if let Err(denial) = judged {
        return refused(&label, denial);
    }
    let wanted = Wanted {
        shared: &shared,
        ctx: &ctx,
        authority: &authority,
        target: &target,
        label: &label,
        pool: &pool,
    };
    let mut upstream = match upstream_for(wanted).await {
        Ok(upstream) => upstream,
        Err(resp) => return resp,
    };
    let upstream_req = match forward_request(
        Request::from_parts(parts, body),
        &target,
        upstream.forward.as_ref(),
    ) {
        Ok(r) => r,
        Err(detail) => return refused(&raw, rewrite_failed(&detail)),
    };
    let on_misuse = || {
        let (shared, ctx, label) = (Arc::clone(&shared), ctx.clone(), label.clone());
        move |denial: &Denial| {
            record::deny(&shared, &ctx, Protocol::Http, &label, denial.clone());
        }
    };
    let idle = shared.timeouts.idle_tunnel;
    let sent = send(upstream_req, &authority, &target, on_misuse, |r| {
        awaited(upstream.sender.send_request(r), &upstream.counters, idle)
    })
    .await;
    match sent {
        Sent::Misuse(denial) => deny_response(Some(authority.grant.name()), &label, &denial),
        Sent::ClientFault(denial) => refused(&label, denial),
        Sent::Answer(None) => refused(&label, silent(&target, upstream.forward.as_ref(), idle)),
        Sent::Answer(Some(answer)) => match answered(answer, upstream, &pool, &target).await {
            Ok(resp) => resp,
            Err(denial) => refused(&label, denial),
        },
    }
}

/// The target of an absolute-form request: an `http://` URI (else the hint says what to
/// send instead), with a host, and at most one `Host` header.
///
/// # Errors
/// `malformed_target`.
fn absolute_target<B>(req: &Request<B>) -> Result<Target, Denial> {
    let bad = |detail: &str, hint: &str| Err(Denial::new(Reason::MalformedTarget, detail, hint));
    let uri = req.uri();
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
    target_of(uri).map_err(|e| super::malformed(&e))
}

/// `ctx` for a request to `target`: a terminated host's plain `http://` lines carry the
/// method and path, like the `tls` lines of its tunnels.
fn with_request_line<B>(ctx: Ctx, authority: &Authority, target: &Target, req: &Request<B>) -> Ctx {
    if !authority.grant.terminates_tls(target) {
        return ctx;
    }
    Ctx {
        request: Some(RequestLine {
            method: req.method().as_str().to_owned(),
            path: logged_path(req.uri()),
        }),
        ..ctx
    }
}

/// What a judged request wants an upstream connection for: its client connection's
/// facts and pool, the authority it runs under, its target.
#[derive(Clone, Copy)]
struct Wanted<'a> {
    shared: &'a Arc<Shared>,
    ctx: &'a Ctx,
    authority: &'a Arc<Authority>,
    target: &'a Target,
    label: &'a TargetLabel,
    pool: &'a Pool,
}

impl Wanted<'_> {
    /// The refusal of the request with `denial`, logged.
    fn refuse(self, denial: Denial) -> Response<Body> {
        refuse(self.shared, self.ctx, Protocol::Http, self.label, denial)
    }

    /// The refusal of the request because its new upstream connection `opened` broke
    /// (`upstream_failure`, `detail` after the target): the connection's close record
    /// says `error`.
    fn broken(self, opened: Opened, detail: std::fmt::Arguments<'_>, hint: &str) -> Response<Body> {
        opened.finish(RelayOutcome::ended(CloseReason::Error));
        let target = self.target;
        self.refuse(Denial::new(
            Reason::UpstreamFailure,
            format!("{target}: {detail}"),
            hint,
        ))
    }
}

/// The upstream connection for `wanted`: this client connection's kept one when it
/// goes to the same target for the same (live) authority and is ready (the reuse logged
/// with the host's decision), else a new one (decided and logged by `establish`).
///
/// # Errors
/// The answer to send instead: the denial, already logged.
async fn upstream_for(wanted: Wanted<'_>) -> Result<Pooled, Response<Body>> {
    let (authority, target) = (wanted.authority, wanted.target);
    let kept = wanted
        .pool
        .kept
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .filter(|p| p.target == *target && Arc::ptr_eq(&p.authority, authority));
    let kept = match kept {
        Some(mut p) => p.sender.ready().await.is_ok().then_some(p),
        None => None,
    };
    let Some(kept) = kept else {
        return open(wanted).await;
    };
    let decision = authority.grant.decide(target);
    if !decision.is_allow() {
        // Grants are immutable, so this cannot happen; fail closed anyway.
        return Err(wanted.refuse(Denial::from(decision)));
    }
    let allow = Allowed {
        rule: decision.rule.as_deref(),
        pin: kept.pin,
        route: wanted.shared.route_label(kept.route),
    };
    record::reuse(
        wanted.shared,
        wanted.ctx,
        Protocol::Http,
        wanted.label,
        allow,
    );
    Ok(kept)
}

/// The denial of a request the rewrite could not rebuild.
fn rewrite_failed(detail: &RewriteError) -> Denial {
    Denial::new(
        Reason::MalformedTarget,
        detail.to_string(),
        "send a well-formed absolute-form request",
    )
}

/// The denial of an upstream that accepted the request and went silent for `idle`.
fn silent(target: &Target, parent: Option<&ForwardProxy>, idle: std::time::Duration) -> Denial {
    let from = match parent {
        Some(parent) => parent.to_string(),
        None => "the destination".to_owned(),
    };
    Denial::new(
        Reason::UpstreamFailure,
        format!(
            "{target}: {from} sent nothing for {}s (timeouts.idle_tunnel) while the answer was awaited",
            idle.as_secs()
        ),
        "the upstream accepted the request but does not answer; check it, or raise [timeouts] idle_tunnel",
    )
    .with_cause(Cause::ResponseTimeout)
}

/// The upstream's answer for the client; the connection is kept for the next request.
/// A `407` from an HTTP parent refuses *our* configured credentials: never handed to the
/// client as if it were the origin's answer (and the connection is not kept); a parent's
/// answer must prove it is the Kerberos service the route names.
///
/// # Errors
/// The denial (`upstream_failure`) to log and answer.
async fn answered(
    answer: hyper::Result<Response<Incoming>>,
    upstream: Pooled,
    pool: &Pool,
    target: &Target,
) -> Result<Response<Body>, Denial> {
    let resp = answer.map_err(|e| match &upstream.forward {
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
    })?;
    if let Some(parent) = &upstream.forward {
        let offers: Vec<String> = resp
            .headers()
            .get_all(header::PROXY_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
            .collect();
        if resp.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
            let (detail, hint) = parent.refusal(offers.iter().map(String::as_str));
            return Err(Denial::new(Reason::UpstreamFailure, detail, hint));
        }
        parent
            .verify(offers.iter().map(String::as_str))
            .await
            .map_err(|detail| {
                Denial::new(
                    Reason::UpstreamFailure,
                    detail,
                    "the parent's answer did not prove it is the Kerberos service; check its keytab and the name in [upstream]",
                )
            })?;
    }
    *pool.kept.lock().unwrap_or_else(PoisonError::into_inner) = Some(upstream);
    Ok(relayed(resp))
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

/// A new upstream HTTP/1.1 connection for `wanted` (decided and logged by `establish`),
/// whose close record is written when it ends: the origin closed, an error, or its
/// authority's closing signal (revoke grace or shutdown grace over).
async fn open(wanted: Wanted<'_>) -> Result<Pooled, Response<Body>> {
    let Wanted {
        shared,
        ctx,
        authority,
        target,
        label,
        pool,
    } = wanted;
    let Connected {
        stream,
        opened,
        closing,
        forward_proxy,
        ..
    } = match establish(shared, ctx, Protocol::Http, target, Watch::Dropped).await {
        Ok(c) => c,
        Err(denial) => return Err(deny_response(ctx.authority_name(), label, &denial)),
    };
    // Only a terminated tunnel is ever given a reused upstream connection, never this.
    let Some(stream) = stream.into_stream() else {
        return Err(wanted.broken(
            opened,
            format_args!("no upstream stream"),
            "retry the request",
        ));
    };
    let counting = Tapped::new(stream, Counters::default());
    let counters = counting.counters();
    let watched = counters.clone();
    let (sender, conn) =
        match hyper::client::conn::http1::handshake::<_, CheckedBody>(TokioIo::new(counting)).await
        {
            Ok(pair) => pair,
            Err(e) => {
                return Err(wanted.broken(
                    opened,
                    format_args!("HTTP handshake failed: {e}"),
                    "the destination did not speak HTTP/1.1",
                ));
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
