//! HTTP CONNECT (RFC 9110 section 9.3.6, authority-form only: RFC 9112 section 3.2.3).
//!
//! A connection that opens with CONNECT is served without hyper ([`connect_fast`]): the
//! head was parsed by the preflight, the reply is one fixed line, and the stream that
//! follows is the tunnel, so the raw socket (not an upgraded hyper connection) goes to the
//! relay. A denial is answered by hyper, as any other response, so the connection stays
//! usable. A CONNECT later on a keep-alive connection ([`connect`]) is served through
//! hyper's upgrade.

use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use policy::config::Authority;
use policy::{Reason, Target, parse_authority_form};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::credentials::authority_of;
use crate::conn::establish::{Connected, establish};
use crate::conn::{Ctx, TargetLabel, tunnel};
use crate::denial::Denial;
use crate::relay::RelayOutcome;
use crate::request::response::{Body, deny_response, empty, raw_label, refuse};
use crate::shared::Shared;
use crate::vocab::{CloseReason, Protocol};

/// The success reply to CONNECT: any 2xx; no body follows.
const CONNECT_OK: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n";

/// How [`connect_fast`] ended.
pub(crate) enum Fast {
    /// The `200` is sent: run this tunnel (boxed: the other variants are small).
    Allowed(Box<Connected>, Target),
    /// Denied: this response answers the request (the decision is logged).
    Denied(Response<Body>),
    /// The client went away before the `200` could be written (the close record says so).
    ReplyFailed,
}

/// Decides a connection's first request, a CONNECT to `target` (as sent), and on allow
/// writes the `200`.
pub(crate) async fn connect_fast<S: AsyncWrite + Unpin>(
    io: &mut S,
    shared: &Arc<Shared>,
    ctx: &Ctx,
    target: &str,
    proxy_authorization: Vec<HeaderValue>,
) -> Fast {
    // The preflight checked that the target parses as a URI.
    let uri = target.parse::<Uri>().unwrap_or_default();
    let mut headers = HeaderMap::new();
    for v in proxy_authorization {
        headers.append(header::PROXY_AUTHORIZATION, v);
    }
    let authority = match authority_of(shared, ctx, &headers) {
        Ok(a) => a,
        Err(denial) => {
            return Fast::Denied(refuse(
                shared,
                ctx,
                Protocol::Connect,
                &raw_label(&uri),
                denial,
            ));
        }
    };
    let ctx = ctx.attributed(&authority);
    match decide(&uri, shared, &ctx, &authority).await {
        Ok((connected, target)) => {
            if io.write_all(CONNECT_OK).await.is_err() {
                connected
                    .opened
                    .finish(RelayOutcome::ended(CloseReason::ClientClosed));
                return Fast::ReplyFailed;
            }
            Fast::Allowed(Box::new(connected), target)
        }
        Err(resp) => Fast::Denied(resp),
    }
}

/// A CONNECT on a connection that hyper serves (one that began with another request).
pub(crate) async fn connect(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    ctx: Ctx,
    authority: Arc<Authority>,
) -> Response<Body> {
    let (connected, target) = match decide(req.uri(), &shared, &ctx, &authority).await {
        Ok(pair) => pair,
        Err(resp) => return resp,
    };
    let on_upgrade = hyper::upgrade::on(req);
    // The tunnel outlives the HTTP connection task: it counts as live on its own, so a
    // graceful shutdown drains it.
    let guard = shared.enter();
    tokio::spawn(async move {
        let _guard = guard;
        match on_upgrade.await {
            Ok(upgraded) => {
                tunnel::run(
                    TokioIo::new(upgraded),
                    Vec::new(),
                    connected,
                    &target,
                    shared,
                )
                .await;
            }
            Err(e) => {
                tracing::debug!("CONNECT upgrade failed: {e}");
                connected
                    .opened
                    .finish(RelayOutcome::ended(CloseReason::Error));
            }
        }
    });
    Response::new(empty())
}

/// The decision on a CONNECT to `uri` for `authority`: the upstream connection, or the
/// deny response (the decision is logged either way).
async fn decide(
    uri: &Uri,
    shared: &Arc<Shared>,
    ctx: &Ctx,
    authority: &Authority,
) -> Result<(Connected, Target), Response<Body>> {
    let target = match uri.authority() {
        Some(a) if uri.scheme().is_none() && uri.path_and_query().is_none() => {
            parse_authority_form(a.as_str())
        }
        _ => {
            let denial = Denial::new(
                Reason::MalformedTarget,
                "CONNECT needs an authority-form target (host:port)",
                "send CONNECT host:port HTTP/1.1",
            );
            return Err(refuse(
                shared,
                ctx,
                Protocol::Connect,
                &raw_label(uri),
                denial,
            ));
        }
    };
    let target = match target {
        Ok(t) => t,
        Err(e) => {
            return Err(refuse(
                shared,
                ctx,
                Protocol::Connect,
                &raw_label(uri),
                super::malformed(&e),
            ));
        }
    };
    match establish(shared, ctx, Protocol::Connect, &target).await {
        Ok(c) => Ok((c, target)),
        Err(denial) => Err(deny_response(
            Some(authority.grant.name()),
            &TargetLabel::from(&target),
            &denial,
        )),
    }
}
