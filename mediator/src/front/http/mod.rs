//! The HTTP front-end (design section 6): CONNECT (authority-form only) and absolute-form
//! forwarding of plain `http://` requests. One connection, read top to bottom:
//!
//! 1. the preflight (`crate::request::preflight`): the first head, read and judged before
//!    hyper sees it;
//! 2. [`credentials`]: on the TCP listener, `Proxy-Authorization: Basic` names the authority;
//! 3. [`connect`](mod@connect): a connection that opens with CONNECT is served without hyper;
//! 4. otherwise hyper serves the connection (keep-alive), and each request is a CONNECT
//!    ([`connect`](mod@connect)) or a forwarded request ([`forward`](mod@forward)), judged
//!    and sent by the steps of `crate::request`, as a terminated tunnel's requests are;
//! 5. every refusal is the JSON denial (`crate::request::response`).

pub(crate) mod connect;
pub(crate) mod credentials;
pub(crate) mod forward;

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use http::header::{self, HeaderMap};
use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use policy::Reason;
use tokio::io::{AsyncRead, AsyncWrite};

use self::connect::{Fast, connect_fast};
use self::credentials::{Verified, authority_of};
use self::forward::Pool;
use crate::conn::{Ctx, TargetLabel, record, tunnel};
use crate::denial::Denial;
use crate::request::preflight::{Head, MIN_BUF, Preflight, preflight};
use crate::request::response::{Body, raw_label, refuse, refused_head, write_raw_response};
use crate::rewind::Rewind;
use crate::shared::Shared;
use crate::vocab::Protocol;

/// Serves HTTP/1.1 on one client connection until it closes. The first request head must
/// be complete by `deadline` (the connection's request-head timeout).
pub(crate) async fn serve<S>(
    mut io: S,
    shared: Arc<Shared>,
    ctx: Ctx,
    deadline: tokio::time::Instant,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let head = match preflight(&mut io, shared.limits.request_head_bytes, deadline).await {
        Preflight::Pass(head) => head,
        Preflight::Closed => return,
        Preflight::Reject {
            reason,
            label,
            detail,
            protocol,
            proxy_authorization,
        } => {
            // Attribute the malformed request when its credential is valid (a Unix
            // channel is attributed already); an unverified name is never used.
            let mut headers = HeaderMap::new();
            if let Some(v) = proxy_authorization {
                headers.insert(header::PROXY_AUTHORIZATION, v);
            }
            let ctx = match authority_of(&shared, &ctx, &headers) {
                Ok(a) => ctx.attributed(&a),
                Err(_) => ctx,
            };
            let hint = if reason == Reason::BadRequest {
                "send an HTTP/1.1 request head with CRLF line ends, no folded header lines, and no Transfer-Encoding other than chunked"
            } else {
                "send CONNECT host:port, or an absolute-form http:// URI, with a valid request line"
            };
            let denial = Denial::new(reason, detail, hint);
            let resp = refuse(&shared, &ctx, protocol, &label, denial);
            let _ = write_raw_response(&mut io, resp).await;
            return;
        }
    };
    // The shim's mark on a CONNECT it made for a captured connection: the client's own
    // claim, logged as `capture`, never decided on.
    let ctx = match &head {
        Head::Connect { capture: true, .. } => ctx.captured(),
        _ => ctx,
    };
    let (buf, first) = match head {
        Head::Connect {
            mut buf,
            head_len,
            target,
            proxy_authorization,
            capture: _,
        } => match connect_fast(
            &mut io,
            &mut buf,
            &shared,
            &ctx,
            &target,
            proxy_authorization,
        )
        .await
        {
            Fast::Allowed(connected, target) => {
                // The head buffer must not outlive the head: a tunnel keeps only its
                // early bytes (usually none).
                buf.drain(..head_len);
                buf.shrink_to_fit();
                tunnel::run(io, buf, *connected, &target, shared).await;
                return;
            }
            Fast::ReplyFailed => return,
            // Shutting down: hyper would close without answering; answer and close.
            Fast::Denied(resp) if shared.signals.is_draining() => {
                let _ = write_raw_response(&mut io, resp).await;
                return;
            }
            Fast::Denied(resp) => (buf, Some(resp)),
        },
        Head::Other(buf) => (buf, None),
    };
    // Boxed: hyper's connection future is large and a tunnel opened by the fast path
    // above should not carry it.
    Box::pin(serve_hyper(Rewind::new(buf, io), shared, ctx, first)).await;
}

/// Serves the connection with hyper (keep-alive, absolute-form forwarding, CONNECT after
/// another request). `first`, when set, answers the first request (a fast-path CONNECT
/// denial).
async fn serve_hyper<S>(io: S, shared: Arc<Shared>, ctx: Ctx, first: Option<Response<Body>>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ctx = Arc::new(ctx);
    // For the line of a later head hyper refuses itself.
    let conn_ctx = Arc::clone(&ctx);
    let pool = Arc::new(Pool::default());
    // Dropped when this client connection ends: its upstream connection then closes as
    // `client_closed`.
    let _client = pool.client_guard();
    let verified = Arc::new(Verified::default());
    let first = Arc::new(Mutex::new(first));
    let svc = {
        let shared = Arc::clone(&shared);
        service_fn(move |req| {
            let shared = Arc::clone(&shared);
            let ctx = Arc::clone(&ctx);
            let pool = Arc::clone(&pool);
            let verified = Arc::clone(&verified);
            let decided = first.lock().unwrap_or_else(PoisonError::into_inner).take();
            async move {
                if let Some(resp) = decided {
                    return Ok::<_, Infallible>(resp);
                }
                Ok::<_, Infallible>(handle(req, shared, &ctx, pool, &verified).await)
            }
        })
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(shared.timeouts.request_head)
        .max_buf_size(shared.limits.request_head_bytes.max(MIN_BUF))
        .keep_alive(true);
    let conn = builder
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!("client connection ended: {e}");
                if let Some(denial) = refused_head(&e, shared.limits.request_head_bytes) {
                    let label = TargetLabel { host: None, port: None };
                    record::deny(&shared, &conn_ctx, Protocol::Http, &label, denial);
                }
            }
        }
        () = shared.signals.draining.cancelled() => {
            // Finish the request in flight (up to the shutdown grace), then close.
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                _ = conn.as_mut() => {}
                () = shared.signals.closing.cancelled() => {}
            }
        }
    }
}

/// One request on a hyper-served connection: identify (TCP), then CONNECT or forward.
async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    ctx: &Ctx,
    pool: Arc<Pool>,
    verified: &Verified,
) -> Response<Body> {
    let protocol = if req.method() == Method::CONNECT {
        Protocol::Connect
    } else {
        Protocol::Http
    };
    let authority = match verified.authority_of(&shared, ctx, req.headers()) {
        Ok(a) => a,
        Err(denial) => return refuse(&shared, ctx, protocol, &raw_label(req.uri()), denial),
    };
    let ctx = ctx.attributed(&authority);
    if protocol == Protocol::Connect {
        connect::connect(req, shared, ctx, authority).await
    } else {
        forward::forward(req, shared, ctx, authority, pool).await
    }
}

/// The `malformed_target` denial of a target the canonicaliser refused.
fn malformed(err: &policy::PolicyError) -> Denial {
    Denial::new(
        Reason::MalformedTarget,
        err.to_string(),
        "use a canonical host: a DNS name or dotted-quad IPv4 / bracketed IPv6, with a port",
    )
}
