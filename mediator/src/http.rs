//! The HTTP front-end (design section 6): CONNECT (authority-form only) and absolute-form
//! forwarding of plain `http://` requests, served with hyper.
//!
//! Forwarded requests are rebuilt from canonical values only: the request line carries the
//! origin-form path, `Host` is rebuilt from the URI (RFC 9112 section 3.2.2), hop-by-hop
//! headers (RFC 9110 section 7.6.1) and `Proxy-Authorization` are removed, and an upstream
//! `X-Mediator-Decision` header is stripped so an origin cannot forge a decision.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use policy::config::Authority;
use policy::{Reason, Target, canonicalize_host, parse_authority_form};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::counting::Counting;
use crate::listener::wait_true;
use crate::pipeline::{Ctx, Denial, Shared, TargetLabel, escape_raw, logged_path};
use crate::relay::RelayOutcome;

type Body = BoxBody<Bytes, hyper::Error>;

/// The header that carries a decision to the client (design section 6).
pub const DECISION_HEADER: &str = "x-mediator-decision";

/// hyper refuses buffers smaller than this.
const MIN_BUF: usize = 8192;

/// Serves HTTP/1.1 on one client connection until it closes. The first request head must
/// be complete by `deadline` (the connection's request-head timeout).
pub async fn serve<S>(mut io: S, shared: Arc<Shared>, ctx: Ctx, deadline: tokio::time::Instant)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let head = match preflight(&mut io, &shared, deadline).await {
        Preflight::Pass(head) => head,
        Preflight::Closed => return,
        Preflight::Reject {
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
            let name = identify(&shared, &ctx, &headers)
                .ok()
                .map(|a| a.grant.name().to_owned());
            let denial = Denial::new(
                Reason::MalformedTarget,
                detail,
                "send CONNECT host:port, or an absolute-form http:// URI, with a valid request line",
            );
            let denial = shared.deny_early(&ctx, name.as_deref(), protocol, &label, denial);
            let resp = deny_response(name.as_deref(), &label, &denial);
            let _ = write_raw_response(&mut io, resp).await;
            return;
        }
    };
    let (buf, connect) = match head {
        Head::Connect {
            buf,
            head_len,
            target,
            proxy_authorization,
        } => (buf, Some((head_len, target, proxy_authorization))),
        Head::Other(buf) => (buf, None),
    };
    let mut first = None;
    if let Some((head_len, target, proxy_authorization)) = connect {
        // A connection that opens with CONNECT is served without hyper: the reply is one
        // fixed line and the stream that follows is the tunnel, so the raw socket (not an
        // upgraded hyper connection) goes to the relay. A denial is answered by hyper
        // (below), as any other response, and the connection stays usable.
        match connect_fast(&mut io, &shared, &ctx, &target, proxy_authorization).await {
            Fast::Allowed(connected, target, ctx) => {
                let mut early = buf;
                early.drain(..head_len);
                // The head buffer must not outlive the head: a tunnel keeps only its
                // early bytes (usually none).
                early.shrink_to_fit();
                crate::tunnel::run(io, early, connected, &target, shared, &ctx, "connect").await;
                return;
            }
            Fast::ReplyFailed => return,
            // Shutting down: hyper would close without answering; answer and close.
            Fast::Denied(resp) if *shared.draining.borrow() => {
                let _ = write_raw_response(&mut io, resp).await;
                return;
            }
            Fast::Denied(resp) => first = Some(resp),
        }
    }
    // Boxed: hyper's connection future is large and a tunnel opened by the fast path
    // above should not carry it.
    Box::pin(serve_hyper(
        crate::rewind::Rewind::new(buf, io),
        shared,
        ctx,
        first,
    ))
    .await;
}

/// Serves the connection with hyper (keep-alive, absolute-form forwarding, CONNECT after
/// another request). `first`, when set, answers the first request.
async fn serve_hyper<S>(io: S, shared: Arc<Shared>, ctx: Ctx, first: Option<Response<Body>>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ctx = Arc::new(ctx);
    let pool: Arc<Mutex<Option<Pooled>>> = Arc::new(Mutex::new(None));
    let verified: Arc<Mutex<Option<Verified>>> = Arc::new(Mutex::new(None));
    // The response already decided for the first request (a fast-path CONNECT denial).
    let first = Arc::new(Mutex::new(first));
    let svc = {
        let shared = Arc::clone(&shared);
        service_fn(move |req| {
            let shared = Arc::clone(&shared);
            let ctx = Arc::clone(&ctx);
            let pool = Arc::clone(&pool);
            let verified = Arc::clone(&verified);
            let decided = first.lock().ok().and_then(|mut f| f.take());
            async move {
                if let Some(resp) = decided {
                    return Ok::<_, Infallible>(resp);
                }
                Ok::<_, Infallible>(handle(req, shared, ctx, pool, verified).await)
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
    let mut draining = shared.draining.clone();
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!("client connection ended: {e}");
            }
        }
        () = wait_true(&mut draining) => {
            // Finish the request in flight (up to the shutdown grace), then close.
            conn.as_mut().graceful_shutdown();
            let mut closing = shared.closing.clone();
            tokio::select! {
                _ = conn.as_mut() => {}
                () = wait_true(&mut closing) => {}
            }
        }
    }
}

/// The verdict on a connection's first request head, read before hyper sees it.
enum Preflight {
    /// Serve the request (these bytes, then the rest of the stream).
    Pass(Head),
    /// The request line cannot be parsed: answer the JSON 400 ourselves, since hyper
    /// would answer a bare 400 with no decision record.
    Reject {
        label: TargetLabel,
        detail: String,
        /// `connect` or `http`, for the log.
        protocol: &'static str,
        /// The credential, when the head parsed far enough to have one.
        proxy_authorization: Option<HeaderValue>,
    },
    /// The client went away or timed out before sending a head.
    Closed,
}

/// A first request head that parsed.
enum Head {
    /// `CONNECT`: served by [`connect_fast`].
    Connect {
        /// Every byte read so far: the head, then any early tunnel bytes.
        buf: Vec<u8>,
        /// Length of the head within `buf`.
        head_len: usize,
        /// The request target, as sent.
        target: String,
        /// Every `Proxy-Authorization` value.
        proxy_authorization: Vec<HeaderValue>,
    },
    /// Anything else (or a head hyper must judge, e.g. one too large): served by hyper.
    Other(Vec<u8>),
}

/// Reads the first request head (bounded by the request-head timeout and size limit) and
/// checks that its request line parses (RFC 9112 section 3) and its target is a URI. Heads
/// that are only too large, or have too many headers, pass to hyper, which answers 431.
async fn preflight<S: AsyncRead + Unpin>(
    io: &mut S,
    shared: &Shared,
    deadline: tokio::time::Instant,
) -> Preflight {
    let limit = shared.limits.request_head_bytes.max(MIN_BUF);
    let mut buf = Vec::with_capacity(1024);
    loop {
        buf = match judge(buf, limit) {
            Ok(verdict) => return verdict,
            Err(buf) => buf,
        };
        // Straight into `buf`: this future holds no buffer (nor httparse's header array,
        // see `judge`) of its own, because every connection's task carries it.
        buf.reserve(4096);
        match tokio::time::timeout_at(deadline, io.read_buf(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Preflight::Closed,
            Ok(Ok(_)) => {}
        }
    }
}

/// The verdict on the bytes read so far, or the bytes back when the head is incomplete.
fn judge(buf: Vec<u8>, limit: usize) -> Result<Preflight, Vec<u8>> {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(&buf) {
        Ok(httparse::Status::Complete(head_len)) => {
            let target = req.path.unwrap_or_default();
            if let Err(e) = target.parse::<Uri>() {
                let proxy_authorization = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("proxy-authorization"))
                    .and_then(|h| HeaderValue::from_bytes(h.value).ok());
                return Ok(Preflight::Reject {
                    label: TargetLabel {
                        host: Some(escape_raw(target.as_bytes())),
                        port: None,
                    },
                    detail: format!("the request target is not a valid URI: {e}"),
                    protocol: if req.method == Some("CONNECT") {
                        "connect"
                    } else {
                        "http"
                    },
                    proxy_authorization,
                });
            }
            // A head over the limit goes to hyper, which answers 431.
            if req.method == Some("CONNECT") && head_len <= limit {
                let target = target.to_owned();
                let proxy_authorization = req
                    .headers
                    .iter()
                    .filter(|h| h.name.eq_ignore_ascii_case("proxy-authorization"))
                    .filter_map(|h| HeaderValue::from_bytes(h.value).ok())
                    .collect();
                return Ok(Preflight::Pass(Head::Connect {
                    buf,
                    head_len,
                    target,
                    proxy_authorization,
                }));
            }
            return Ok(Preflight::Pass(Head::Other(buf)));
        }
        Ok(httparse::Status::Partial) => {}
        Err(httparse::Error::TooManyHeaders) => return Ok(Preflight::Pass(Head::Other(buf))),
        Err(e) => {
            let line_end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
            return Ok(Preflight::Reject {
                label: TargetLabel {
                    host: Some(escape_raw(&buf[..line_end.min(256)])),
                    port: None,
                },
                detail: format!("unparsable request head: {e}"),
                protocol: if buf.starts_with(b"CONNECT ") {
                    "connect"
                } else {
                    "http"
                },
                proxy_authorization: raw_proxy_authorization(&buf),
            });
        }
    }
    if buf.len() > limit {
        return Ok(Preflight::Pass(Head::Other(buf)));
    }
    Err(buf)
}

/// The `Proxy-Authorization` value of a head that httparse refused (its request line is
/// malformed, its header lines may still be fine), found line by line.
fn raw_proxy_authorization(head: &[u8]) -> Option<HeaderValue> {
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = line.split_at(colon);
        name.eq_ignore_ascii_case(b"proxy-authorization")
            .then(|| HeaderValue::from_bytes(value[1..].trim_ascii()).ok())
            .flatten()
    })
}

/// Writes a complete HTTP/1.1 response with a full body and `Connection: close`.
async fn write_raw_response<S: AsyncWrite + Unpin>(
    io: &mut S,
    resp: Response<Body>,
) -> std::io::Result<()> {
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        parts.status.as_u16(),
        parts.status.canonical_reason().unwrap_or("")
    )
    .into_bytes();
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out.extend_from_slice(&body);
    io.write_all(&out).await?;
    io.shutdown().await
}

/// A kept-alive upstream connection of one client connection. Never shared across client
/// connections, so never across authorities: an address vetted under one grant's
/// `allow_private` exceptions can never serve another authority.
struct Pooled {
    target: Target,
    /// Exactly the authority (grant object) it was opened for.
    authority: Arc<Authority>,
    sender: hyper::client::conn::http1::SendRequest<Incoming>,
    pin: std::net::SocketAddr,
    route: crate::route::Route,
    /// `Some` when the connection goes to an HTTP parent (absolute-form requests).
    forward: Option<crate::route::ForwardProxy>,
}

/// The credential last verified on a keep-alive TCP connection, and what it named.
struct Verified {
    /// The `Proxy-Authorization` value, exactly as sent.
    value: HeaderValue,
    /// The authority it proved, as it was then (reused only while that grant is live).
    authority: Arc<Authority>,
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    ctx: Arc<Ctx>,
    pool: Arc<Mutex<Option<Pooled>>>,
    verified: Arc<Mutex<Option<Verified>>>,
) -> Response<Body> {
    let protocol = if req.method() == Method::CONNECT {
        "connect"
    } else {
        "http"
    };
    let authority = match identify_again(&shared, &ctx, req.headers(), &verified) {
        Ok(a) => a,
        Err(denial) => {
            let label = raw_label(req.uri());
            let denial = shared.deny_early(&ctx, None, protocol, &label, denial);
            return deny_response(None, &label, &denial);
        }
    };
    let ctx = Ctx {
        authority: Some(Arc::clone(&authority)),
        ..(*ctx).clone()
    };
    if req.method() == Method::CONNECT {
        connect(req, shared, ctx, authority).await
    } else {
        forward(req, shared, ctx, authority, pool).await
    }
}

/// [`identify`], skipping the token hash when this connection already proved the very same
/// `Proxy-Authorization` value for an authority whose grant is still live (a keep-alive
/// client repeats it on every request). A different value, or a revoked or replaced
/// authority, is verified in full again.
fn identify_again(
    shared: &Shared,
    ctx: &Ctx,
    headers: &HeaderMap,
    verified: &Mutex<Option<Verified>>,
) -> Result<Arc<Authority>, Denial> {
    if ctx.authority.is_some() {
        return identify(shared, ctx, headers);
    }
    let mut values = headers.get_all(header::PROXY_AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return identify(shared, ctx, headers);
    };
    let mut cache = verified
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(v) = cache.as_ref() {
        if v.value == value && shared.authorities.is_live(&v.authority) {
            return Ok(Arc::clone(&v.authority));
        }
    }
    let result = identify(shared, ctx, headers);
    *cache = result.as_ref().ok().map(|a| Verified {
        value: value.clone(),
        authority: Arc::clone(a),
    });
    result
}

/// The authority bound to the channel, or named by `Proxy-Authorization: Basic` on the
/// shared TCP listener (RFC 9110 section 11.7.2, RFC 7617).
fn identify(shared: &Shared, ctx: &Ctx, headers: &HeaderMap) -> Result<Arc<Authority>, Denial> {
    if let Some(a) = &ctx.authority {
        return Ok(Arc::clone(a));
    }
    let missing = || {
        Denial::new(
            Reason::BadCredential,
            "this listener needs Proxy-Authorization: Basic base64(authority:token)",
            "send the authority name as proxy user and its token as password (curl --proxy-user NAME:TOKEN)",
        )
    };
    let mut values = headers.get_all(header::PROXY_AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(missing());
    };
    let value = value.as_bytes();
    let Some(encoded) = value
        .get(..6)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"basic "))
        .and_then(|_| value.get(6..))
    else {
        return Err(missing());
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim_ascii()) else {
        return Err(missing());
    };
    let Some(colon) = decoded.iter().position(|&b| b == b':') else {
        return Err(missing());
    };
    let Ok(name) = std::str::from_utf8(&decoded[..colon]) else {
        return Err(missing());
    };
    shared.authenticate(name, &decoded[colon + 1..])
}

/// How [`connect_fast`] ended.
enum Fast {
    /// The `200` is sent: run this tunnel (under the authority's context).
    Allowed(crate::pipeline::Connected, Target, Ctx),
    /// Denied: this response answers the request (the decision is logged).
    Denied(Response<Body>),
    /// The client went away before the `200` could be written.
    ReplyFailed,
}

/// The success reply to CONNECT (RFC 9110 section 9.3.6): any 2xx; no body follows.
const CONNECT_OK: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n";

/// Decides a connection's first request, a CONNECT, and on allow writes the `200`.
async fn connect_fast<S: AsyncWrite + Unpin>(
    io: &mut S,
    shared: &Arc<Shared>,
    ctx: &Ctx,
    target: &str,
    proxy_authorization: Vec<HeaderValue>,
) -> Fast {
    // preflight checked that the target parses as a URI.
    let uri = target.parse::<Uri>().unwrap_or_default();
    let mut headers = HeaderMap::new();
    for v in proxy_authorization {
        headers.append(header::PROXY_AUTHORIZATION, v);
    }
    let authority = match identify(shared, ctx, &headers) {
        Ok(a) => a,
        Err(denial) => {
            let label = raw_label(&uri);
            let denial = shared.deny_early(ctx, None, "connect", &label, denial);
            return Fast::Denied(deny_response(None, &label, &denial));
        }
    };
    let ctx = Ctx {
        authority: Some(Arc::clone(&authority)),
        ..ctx.clone()
    };
    match connect_decide(&uri, shared, &ctx, &authority).await {
        Ok((connected, target)) => {
            if io.write_all(CONNECT_OK).await.is_err() {
                let label = TargetLabel::from(&target);
                let outcome = RelayOutcome::ended("client_closed");
                shared.log_close(&ctx, "connect", &label, connected.opened, outcome);
                return Fast::ReplyFailed;
            }
            Fast::Allowed(connected, target, ctx)
        }
        Err(resp) => Fast::Denied(resp),
    }
}

/// A CONNECT on a connection that hyper serves (one that began with another request).
async fn connect(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    ctx: Ctx,
    authority: Arc<Authority>,
) -> Response<Body> {
    let (connected, target) = match connect_decide(req.uri(), &shared, &ctx, &authority).await {
        Ok(pair) => pair,
        Err(resp) => return resp,
    };
    let label = TargetLabel::from(&target);
    let on_upgrade = hyper::upgrade::on(req);
    // The tunnel outlives the HTTP connection task: it counts as live on its own, so a
    // graceful shutdown drains it and it still writes its close record.
    let guard = shared.enter();
    tokio::spawn(async move {
        let _guard = guard;
        match on_upgrade.await {
            Ok(upgraded) => {
                crate::tunnel::run(
                    TokioIo::new(upgraded),
                    Vec::new(),
                    connected,
                    &target,
                    shared,
                    &ctx,
                    "connect",
                )
                .await;
            }
            Err(e) => {
                tracing::debug!("CONNECT upgrade failed: {e}");
                let outcome = RelayOutcome::ended("error");
                shared.log_close(&ctx, "connect", &label, connected.opened, outcome);
            }
        }
    });
    Response::new(empty())
}

/// The decision on a CONNECT to `uri` for `authority`: the upstream connection, or the
/// deny response (the decision is logged either way).
async fn connect_decide(
    uri: &Uri,
    shared: &Arc<Shared>,
    ctx: &Ctx,
    authority: &Arc<Authority>,
) -> Result<(crate::pipeline::Connected, Target), Response<Body>> {
    let name = authority.grant.name();
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
            let label = raw_label(uri);
            let denial = shared.deny_early(ctx, Some(name), "connect", &label, denial);
            return Err(deny_response(Some(name), &label, &denial));
        }
    };
    let target = match target {
        Ok(t) => t,
        Err(e) => return Err(malformed(shared, ctx, name, "connect", raw_label(uri), &e)),
    };
    match shared
        .establish(ctx, &authority.grant, "connect", &target)
        .await
    {
        Ok(c) => Ok((c, target)),
        Err(denial) => {
            let label = TargetLabel::from(&target);
            Err(deny_response(Some(name), &label, &denial))
        }
    }
}

async fn forward(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    ctx: Ctx,
    authority: Arc<Authority>,
    pool: Arc<Mutex<Option<Pooled>>>,
) -> Response<Body> {
    let name = authority.grant.name();
    let uri = req.uri().clone();
    let bad = |detail: &str, hint: &str| {
        let label = raw_label(&uri);
        let denial = Denial::new(Reason::MalformedTarget, detail, hint);
        let denial = shared.deny_early(&ctx, Some(name), "http", &label, denial);
        deny_response(Some(name), &label, &denial)
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
    let Some(auth) = uri.authority() else {
        return bad(
            "absolute-form URI without a host",
            "send GET http://host/path",
        );
    };
    let target = if auth.as_str().contains('@') {
        Err(policy::PolicyError::Host {
            input: auth.as_str().to_owned(),
            why: "userinfo is not allowed in a proxy target".into(),
        })
    } else {
        // Only an authority that is exactly its host has no port (default 80); anything
        // after the host (`:`, `:65536`, `:80a`) must parse as a port or the target is
        // malformed, never silently port 80.
        if auth.as_str() == auth.host() {
            canonicalize_host(auth.host()).map(|host| Target { host, port: 80 })
        } else {
            parse_authority_form(auth.as_str())
        }
    };
    let target = match target {
        Ok(t) => t,
        Err(e) => return malformed(&shared, &ctx, name, "http", raw_label(&uri), &e),
    };
    let label = TargetLabel::from(&target);

    // Every request, a reused upstream connection's included: no decision under a revoked
    // or replaced authority (a Unix channel keeps the authority it was opened with).
    if !shared.authorities.is_live(&authority) {
        let denial = Denial::new(
            Reason::UnknownAuthority,
            format!(
                "authority \"{name}\" was revoked or replaced after this connection was opened"
            ),
            "open a new connection; if the authority was revoked, ask an operator",
        );
        let denial = shared.deny_early(&ctx, Some(name), "http", &label, denial);
        return deny_response(Some(name), &label, &denial);
    }
    // The request rules of a terminated host narrow its plain http:// requests too (else
    // `POST http://host/admin` would pass a GET-only rule), and these lines carry the
    // method and path like the `tls` lines of its tunnels. A host the grant does not allow
    // is left to `establish`, which denies it with the right reason.
    let conn_ctx = ctx.clone();
    let ctx = if authority.grant.terminates_tls(&target) {
        Ctx {
            request: Some((req.method().as_str().to_owned(), logged_path(&uri))),
            ..ctx.clone()
        }
    } else {
        ctx.clone()
    };
    if authority.grant.decide(&target).is_allow() {
        let decision = authority
            .grant
            .decide_request(&target, req.method().as_str(), uri.path());
        if !decision.is_allow() {
            let mut denial = Denial::new(decision.reason, decision.detail, decision.hint);
            denial.rule = decision.rule;
            let denial = shared.deny_early(&ctx, Some(name), "http", &label, denial);
            return deny_response(Some(name), &label, &denial);
        }
    }

    // Reuse this client connection's upstream connection when it goes to the same target
    // for the same (live) authority.
    let pooled = pool
        .lock()
        .ok()
        .and_then(|mut p| p.take())
        .filter(|p| p.target == target && Arc::ptr_eq(&p.authority, &authority));
    let pooled = match pooled {
        Some(mut p) => p.sender.ready().await.is_ok().then_some(p),
        None => None,
    };
    let (mut sender, pin, route, forward) = match pooled {
        Some(p) => {
            let decision = authority.grant.decide(&target);
            if !decision.is_allow() {
                // Grants are immutable, so this cannot happen; fail closed anyway.
                let denial = Denial::new(decision.reason, decision.detail, decision.hint);
                let denial = shared.deny_early(&ctx, Some(name), "http", &label, denial);
                return deny_response(Some(name), &label, &denial);
            }
            shared.log_reuse(
                &ctx,
                "http",
                &label,
                decision.rule.as_deref(),
                (p.pin, p.route),
            );
            (p.sender, p.pin, p.route, p.forward)
        }
        None => {
            let connected = match shared
                .establish(&ctx, &authority.grant, "http", &target)
                .await
            {
                Ok(c) => c,
                Err(denial) => return deny_response(Some(name), &label, &denial),
            };
            let forward = connected.forward_proxy.clone();
            let counting = Counting::new(connected.stream);
            let counters = counting.counters();
            let handshake =
                hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(counting)).await;
            let (sender, conn) = match handshake {
                Ok(pair) => pair,
                Err(e) => {
                    let denial = Denial::new(
                        Reason::UpstreamFailure,
                        format!("{target}: HTTP handshake failed: {e}"),
                        "the destination did not speak HTTP/1.1",
                    );
                    let outcome = RelayOutcome::ended("error");
                    shared.log_close(&conn_ctx, "http", &label, connected.opened, outcome);
                    return deny_response(Some(name), &label, &denial);
                }
            };
            let (shared2, ctx2, label2) = (Arc::clone(&shared), conn_ctx, label.clone());
            let opened = connected.opened;
            // Closes on revocation (after the grace) and on shutdown, like a tunnel.
            let mut closing = connected.closing.clone();
            let guard = shared.enter();
            tokio::spawn(async move {
                let _guard = guard;
                let reason = tokio::select! {
                    r = conn => if r.is_ok() { "upstream_closed" } else { "error" },
                    () = wait_true(&mut closing) => "shutdown",
                };
                let (up, down) = counters.get();
                let outcome = RelayOutcome {
                    up,
                    down,
                    close_reason: reason,
                };
                shared2.log_close(&ctx2, "http", &label2, opened, outcome);
            });
            (sender, opened.pin, opened.route, forward)
        }
    };

    let upstream_req = match rebuild_request(req, &target, forward.as_ref()) {
        Ok(r) => r,
        Err(detail) => return bad(&detail, "send a well-formed absolute-form request"),
    };
    match sender.send_request(upstream_req).await {
        // A 407 here is the HTTP parent refusing *our* configured credentials: never hand
        // it to the client as if it were the origin's answer (issue: a clear
        // upstream_failure with detail). The connection is not kept.
        Ok(resp)
            if forward.is_some() && resp.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED =>
        {
            let denial = Denial::new(
                Reason::UpstreamFailure,
                format!(
                    "the parent proxy ({}) refused the configured credentials (407)",
                    shared.route_label(route)
                ),
                "check the parent's user:password in [upstream] parents or parent_credentials_file",
            );
            let denial = shared.deny_early(&ctx, Some(name), "http", &label, denial);
            deny_response(Some(name), &label, &denial)
        }
        Ok(resp) => {
            if let Ok(mut p) = pool.lock() {
                *p = Some(Pooled {
                    target,
                    authority: Arc::clone(&authority),
                    sender,
                    pin,
                    route,
                    forward,
                });
            }
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.remove(DECISION_HEADER);
            Response::from_parts(parts, body.boxed())
        }
        Err(e) => {
            let denial = Denial::new(
                Reason::UpstreamFailure,
                format!("{target}: upstream request failed: {e}"),
                "the destination closed the connection or sent an invalid response",
            );
            deny_response(Some(name), &label, &denial)
        }
    }
}

/// Builds the upstream request from canonical values: origin-form target (absolute-form
/// `http://<canonical host[:port]><path>` when `forward` says the connection goes to an
/// HTTP parent), `Host` from the canonical target, hop-by-hop headers and the client's
/// `Proxy-Authorization` removed (a parent's comes from configuration only).
fn rebuild_request(
    req: Request<Incoming>,
    target: &Target,
    forward: Option<&crate::route::ForwardProxy>,
) -> Result<Request<Incoming>, String> {
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let host = if target.port == 80 {
        target.host.to_uri_host()
    } else {
        format!("{}:{}", target.host.to_uri_host(), target.port)
    };
    let request_target = match forward {
        Some(_) => format!("http://{host}{path}"),
        None => path,
    };
    parts.uri = request_target
        .parse::<Uri>()
        .map_err(|e| format!("bad request path: {e}"))?;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    let host = HeaderValue::from_str(&host).map_err(|e| format!("bad host: {e}"))?;
    parts.headers.insert(header::HOST, host);
    if let Some(auth) = forward.and_then(|f| f.authorization.as_deref()) {
        let value =
            HeaderValue::from_str(auth).map_err(|e| format!("bad parent credentials: {e}"))?;
        parts.headers.insert(header::PROXY_AUTHORIZATION, value);
    }
    Ok(Request::from_parts(parts, body))
}

/// Removes hop-by-hop headers (RFC 9110 section 7.6.1): those named in `Connection`, and
/// `Connection`, `Keep-Alive`, `Proxy-Connection`, `Proxy-Authenticate`,
/// `Proxy-Authorization`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none of these: one pass over the names decides (a removal
    // hashes each name, and there are nine of them).
    if !headers.keys().any(is_hop_by_hop_or_connection) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

/// Whether `name` is one of the fixed hop-by-hop fields [`strip_hop_by_hop`] removes.
fn is_hop_by_hop_or_connection(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::PROXY_AUTHENTICATE
        || name == header::PROXY_AUTHORIZATION
        || name == header::TE
        || name == header::TRAILER
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

fn malformed(
    shared: &Shared,
    ctx: &Ctx,
    name: &str,
    protocol: &'static str,
    label: TargetLabel,
    err: &policy::PolicyError,
) -> Response<Body> {
    let denial = Denial::new(
        Reason::MalformedTarget,
        err.to_string(),
        "use a canonical host: a DNS name or dotted-quad IPv4 / bracketed IPv6, with a port",
    );
    let denial = shared.deny_early(ctx, Some(name), protocol, &label, denial);
    deny_response(Some(name), &label, &denial)
}

/// The raw target of a request for logs, escaped.
fn raw_label(uri: &Uri) -> TargetLabel {
    match uri.authority() {
        Some(a) => TargetLabel {
            host: Some(escape_raw(a.host().as_bytes())),
            port: a.port_u16(),
        },
        None => TargetLabel {
            host: Some(escape_raw(uri.to_string().as_bytes())),
            port: None,
        },
    }
}

/// The JSON denial of design section 6.
pub fn deny_response(
    authority: Option<&str>,
    label: &TargetLabel,
    denial: &Denial,
) -> Response<Body> {
    let body = serde_json::json!({
        "error": "egress_denied",
        "authority": authority,
        "host": label.host,
        "port": label.port,
        "reason": denial.reason.as_str(),
        "detail": denial.detail,
        "hint": denial.hint,
    })
    .to_string();
    let status = StatusCode::from_u16(denial.status).unwrap_or(StatusCode::FORBIDDEN);
    let mut resp = Response::new(full(body.clone()));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    if let Ok(v) = HeaderValue::from_str(&format!("deny; reason={}", denial.reason.as_str())) {
        h.insert(DECISION_HEADER, v);
    }
    if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        h.insert(
            header::PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"mediator\""),
        );
    }
    resp
}

fn full(s: String) -> Body {
    Full::new(Bytes::from(s))
        .map_err(|never| match never {})
        .boxed()
}

fn empty() -> Body {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}
