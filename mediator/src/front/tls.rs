//! TLS termination (design section 9), one tunnel: accept the client's TLS with a leaf for
//! exactly the tunnel host (the one SNI rule applies), open TLS to the tunnel's pinned
//! upstream stream (verified against the system store plus `[tls] extra_ca_files`), serve
//! every request inside with hyper (h1 and h2), judge each (`Host`/`:authority` must be the
//! tunnel host, else `421`; the request rules), and write one `tls` decision line per
//! request. The tunnel's [`Opened`](crate::conn::close::Opened) writes its close record.
//!
//! It must never present a certificate for any name but the tunnel host, forward a request
//! for another host, skip upstream verification, or connect anywhere but the tunnel's own
//! upstream stream (so the route is the tunnel's route).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::conn::standing::Standing;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri, Version};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use policy::{Reason, Target, canonicalize_host, check_sni, parse_authority_form};
use rustls::pki_types::ServerName;
use rustls::server::{Acceptor, ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Mutex;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

use crate::conn::establish::Connected;
use crate::conn::identify::revoked;
use crate::conn::record::{self, Allowed};
use crate::conn::{Ctx, RequestLine, TargetLabel};
use crate::counting::Counting;
use crate::credential::{CheckedBody, TrailerVerdict};
use crate::denial::{Cause, Denial};
use crate::front::h2_resets::{OnReset, ResetWatch};
use crate::front::http::response::{Body, DECISION_HEADER, deny_response};
use crate::front::http::rewrite::{host_value, strip_hop_by_hop};
use crate::front::upgrade;
use crate::redact::{escape_raw, logged_path};
use crate::relay::{RelayOutcome, Sock, reset_fd_on_close, socket_of};
use crate::rewind::Rewind;
use crate::shared::Shared;
use crate::tls::{ALPN, TlsState};
use crate::vocab::{CloseReason, Protocol};

/// Runs one terminated tunnel to completion; its [`Connected::opened`] writes the close
/// record. `prefix` holds the client bytes the SNI gate already read (the start of the
/// ClientHello); they are replayed into the TLS acceptor. Each request inside is logged
/// with protocol `tls`.
pub(crate) async fn terminate<C>(
    client: C,
    prefix: Vec<u8>,
    connected: Connected,
    target: &Target,
    shared: Arc<Shared>,
) where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let label = TargetLabel::from(target);
    let Connected {
        stream: upstream_tcp,
        opened,
        closing,
        standing,
        ..
    } = connected;
    let ctx = opened.ctx().clone();
    let protocol = opened.protocol();
    let ended = |reason: CloseReason, (up, down): (u64, u64)| RelayOutcome {
        up,
        down,
        close_reason: reason,
    };
    let deny = |denial: Denial| {
        record::deny(&shared, &ctx, protocol, &label, denial);
    };
    let Some(tls) = shared.tls.clone() else {
        deny(Denial::new(
            Reason::UpstreamFailure,
            format!("TLS termination is configured for {target} but the mediator has no CA"),
            "configure [tls] ca_dir and restart the mediator",
        ));
        opened.finish(RelayOutcome::ended(CloseReason::Error));
        return;
    };
    let leaf = match certs::LeafName::parse(&target.host.as_text())
        .and_then(|name| tls.leaves.get(&name))
    {
        Ok(leaf) => leaf,
        Err(e) => {
            deny(Denial::new(
                Reason::UpstreamFailure,
                format!("cannot issue a certificate for {}: {e}", target.host),
                "check the mediator's CA ([tls] ca_dir)",
            ));
            opened.finish(RelayOutcome::ended(CloseReason::Error));
            return;
        }
    };

    // A cut resets the client's TCP socket (`crate::relay`): a second descriptor reaches
    // it under TLS, and the reset comes when both are closed, as this function returns.
    let reset = socket_of(&client).and_then(Sock::reset_handle);
    // Client leg. Counting sees "written" as bytes to the client (down) and "read" as bytes
    // from it (up).
    let counting = Counting::new(Rewind::new(prefix, client));
    let counters = counting.counters();
    let bytes = || {
        let (written, read) = counters.get();
        (read, written)
    };
    let start = match tokio::time::timeout(
        shared.timeouts.request_head,
        LazyConfigAcceptor::new(Acceptor::default(), counting),
    )
    .await
    {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => {
            tracing::debug!("terminated tunnel to {target}: client hello: {e}");
            opened.finish(ended(CloseReason::Error, bytes()));
            return;
        }
        Err(_) => {
            opened.finish(ended(CloseReason::IdleTimeout, bytes()));
            return;
        }
    };
    // The one SNI rule, as the tunnel's gate applies it.
    let hello = start.client_hello();
    let names: Vec<&str> = hello.server_name().into_iter().collect();
    if let Err(why) = check_sni(&names, target) {
        deny(Denial::sni_mismatch(why.to_string(), target).with_cause(Cause::AfterReply));
        opened.finish(ended(CloseReason::SniMismatch, bytes()));
        return;
    }
    let config = match server_config(&tls, leaf) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("TLS server configuration: {e}");
            opened.finish(ended(CloseReason::Error, bytes()));
            return;
        }
    };
    let client_tls = match tokio::time::timeout(
        shared.timeouts.request_head,
        start.into_stream(config),
    )
    .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            // Typically the client does not trust our CA: say so where an operator looks.
            tracing::info!(
                "terminated tunnel to {target}: client TLS handshake failed (does the client trust the mediator CA?): {e}"
            );
            opened.finish(ended(CloseReason::Error, bytes()));
            return;
        }
        Err(_) => {
            opened.finish(ended(CloseReason::IdleTimeout, bytes()));
            return;
        }
    };

    // Upstream leg: TLS over the tunnel's pinned (and routed) stream, SNI = the host. A
    // client that speaks HTTP/1.1 gets an HTTP/1.1 upstream, so that an upgrade of its
    // connection upgrades the upstream one with it.
    let upstream_gone = CancellationToken::new();
    let upgrading = Arc::new(AtomicBool::new(false));
    let client_h2 = client_tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let upstream = match connect_upstream(&tls, upstream_tcp, target, &shared, client_h2).await {
        Ok(stream) => {
            start_upstream_http(stream, upstream_gone.clone(), Arc::clone(&upgrading)).await
        }
        Err(detail) => {
            tracing::info!("terminated tunnel to {target}: {detail}");
            Err(detail)
        }
    };

    let env = Arc::new(Env {
        shared: Arc::clone(&shared),
        ctx: ctx.clone(),
        standing,
        target: target.clone(),
        label: label.clone(),
        pin: opened.facts().pin,
        route: opened.facts().route,
        upstream,
        closing: closing.clone(),
        upgrading,
        relays: Relays::default(),
    });
    let kept = Arc::clone(&env);
    let svc = service_fn(move |req| {
        let env = Arc::clone(&env);
        async move { Ok::<_, Infallible>(handle(req, &env).await) }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(shared.timeouts.request_head)
        .keep_alive(true);
    // WebSockets over HTTP/2 (RFC 8441): SETTINGS_ENABLE_CONNECT_PROTOCOL = 1. The header
    // list (SETTINGS_MAX_HEADER_LIST_SIZE, RFC 9113 section 6.5.2) is bounded by
    // `[limits] request_head_bytes` as HTTP/1.1 heads are, not by hyper's 16 KiB default
    // (the key is at most 1 MiB, so it fits a u32; the fallback is never taken).
    let header_list = u32::try_from(shared.limits.request_head_bytes).unwrap_or(u32::MAX);
    builder
        .http2()
        .enable_connect_protocol()
        .max_header_list_size(header_list);
    let client_tls = ResetWatch::new(
        client_tls,
        client_h2.then(|| malformed_h2(&shared, &ctx, &label, target)),
    );
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(client_tls), svc);
    tokio::pin!(conn);
    let reason = tokio::select! {
        res = conn.as_mut() => match res {
            Ok(()) => CloseReason::ClientClosed,
            Err(e) => {
                tracing::debug!("terminated tunnel to {target}: {e}");
                CloseReason::Error
            }
        },
        () = closing.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), conn.as_mut()).await;
            if let Some(fd) = &reset {
                // What it drops was counted as sent; the record of a terminated tunnel
                // counts TLS bytes, so the difference is approximate and ignored here.
                let _ = reset_fd_on_close(fd);
            }
            CloseReason::Shutdown
        }
        () = upstream_gone.cancelled() => {
            // The upstream connection ended: finish what is in flight, then close, so the
            // client opens a new tunnel rather than getting errors.
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                _ = conn.as_mut() => {}
                () = closing.cancelled() => {}
            }
            CloseReason::UpstreamClosed
        }
    };
    // Switched streams end with the tunnel (or before): an HTTP/1.1 upgrade took the
    // connection over, so the tunnel ends as its relay ended; HTTP/2 streams end with
    // their connection.
    let mut relays = kept.relays.take();
    let mut reason = reason;
    while let Some(ended) = relays.join_next().await {
        let outcome = ended.map_or(CloseReason::Error, |o| o.close_reason);
        if let (true, Some(fd)) = (outcome.is_cut(), &reset) {
            let _ = reset_fd_on_close(fd);
        }
        if !client_h2 {
            reason = outcome;
        }
    }
    drop(kept);
    opened.finish(ended(reason, bytes()));
}

/// What every request of one terminated tunnel needs.
struct Env {
    shared: Arc<Shared>,
    ctx: Ctx,
    /// The authority the tunnel runs under (a reload may move it to a successor).
    standing: Arc<Standing>,
    target: Target,
    label: TargetLabel,
    pin: std::net::SocketAddr,
    route: crate::route::Route,
    /// The upstream HTTP connection, or why there is none (the detail of every 502).
    upstream: Result<Upstream, String>,
    /// The tunnel's cut (revocation, shutdown): ends an upgraded request's relay too.
    closing: CancellationToken,
    /// Set while a switch is under way on the upstream HTTP/1.1 connection (or took it
    /// over), whose end then does not end the tunnel.
    upgrading: Arc<AtomicBool>,
    /// The relays of switched requests (one for HTTP/1.1, streams for HTTP/2).
    relays: Relays,
}

/// The relays of a tunnel's switched requests. Finished ones are reaped as new ones
/// come, so it holds at most the live ones: one on an HTTP/1.1 connection (an upgrade
/// takes it over), on HTTP/2 no more than the server's concurrent streams (hyper's
/// default, 200), since each relay holds its stream open.
#[derive(Default)]
struct Relays(std::sync::Mutex<tokio::task::JoinSet<RelayOutcome>>);

impl Relays {
    fn lock(&self) -> std::sync::MutexGuard<'_, tokio::task::JoinSet<RelayOutcome>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn spawn(&self, relay: impl Future<Output = RelayOutcome> + Send + 'static) {
        let mut set = self.lock();
        while set.try_join_next().is_some() {}
        set.spawn(relay);
    }

    fn take(&self) -> tokio::task::JoinSet<RelayOutcome> {
        std::mem::take(&mut *self.lock())
    }
}

/// How long an extended CONNECT waits for an HTTP/2 origin's SETTINGS to say whether it
/// accepts extended CONNECT (they come right after its TLS handshake; this is the bound
/// for a slow one).
const SETTINGS_WAIT: std::time::Duration = std::time::Duration::from_millis(500);
/// How often the setting is read again meanwhile.
const SETTINGS_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// The upstream HTTP connection of one tunnel. HTTP/1.1 carries one request at a time, so
/// its sender is behind a lock held only until the request is handed over.
enum Upstream {
    H1(Mutex<hyper::client::conn::http1::SendRequest<CheckedBody>>),
    /// The sender, and whether the origin's SETTINGS accept extended CONNECT so far.
    H2(
        hyper::client::conn::http2::SendRequest<CheckedBody>,
        Arc<dyn Fn() -> bool + Send + Sync>,
    ),
}

impl Upstream {
    fn version(&self) -> Version {
        match self {
            Self::H1(_) => Version::HTTP_11,
            Self::H2(..) => Version::HTTP_2,
        }
    }

    /// What the connection can carry of a protocol switch. An HTTP/2 origin's SETTINGS
    /// (with SETTINGS_ENABLE_CONNECT_PROTOCOL) may still be on their way when the first
    /// request comes, and nothing signals their arrival: the setting is read again every
    /// [`SETTINGS_POLL`] for at most [`SETTINGS_WAIT`], while the connection is open.
    async fn carrier(&self) -> upgrade::Carrier {
        match self {
            Self::H1(_) => upgrade::Carrier::H1,
            Self::H2(sender, extended_connect) => {
                let deadline = tokio::time::Instant::now() + SETTINGS_WAIT;
                loop {
                    let on = extended_connect();
                    if on || sender.is_closed() || tokio::time::Instant::now() >= deadline {
                        return upgrade::Carrier::H2 {
                            extended_connect: on,
                        };
                    }
                    tokio::time::sleep(SETTINGS_POLL).await;
                }
            }
        }
    }

    async fn send(&self, req: Request<CheckedBody>) -> hyper::Result<Response<Incoming>> {
        match self {
            Self::H1(sender) => {
                let response = {
                    let mut sender = sender.lock().await;
                    sender.ready().await?;
                    sender.send_request(req)
                };
                response.await
            }
            Self::H2(sender, _) => {
                let mut sender = sender.clone();
                sender.ready().await?;
                sender.send_request(req).await
            }
        }
    }
}

/// Serves exactly one certificate: the leaf for the tunnel host.
#[derive(Debug)]
struct OneLeaf(Arc<CertifiedKey>);

impl ResolvesServerCert for OneLeaf {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }
}

fn server_config(
    tls: &TlsState,
    leaf: Arc<CertifiedKey>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::clone(&tls.provider))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(OneLeaf(leaf)));
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

async fn connect_upstream(
    tls: &TlsState,
    tcp: crate::route::UpstreamStream,
    target: &Target,
    shared: &Shared,
    client_h2: bool,
) -> Result<tokio_rustls::client::TlsStream<crate::route::UpstreamStream>, String> {
    let name = ServerName::try_from(target.host.as_text())
        .map_err(|e| format!("{} is not a TLS server name: {e}", target.host))?;
    let config = if client_h2 {
        &tls.upstream
    } else {
        &tls.upstream_h1
    };
    let connector = TlsConnector::from(Arc::clone(config));
    match tokio::time::timeout(shared.timeouts.connect, connector.connect(name, tcp)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!(
            "TLS to {target} failed: {}",
            crate::tls::words::handshake_error(&e)
        )),
        Err(_) => Err(format!("TLS to {target} timed out")),
    }
}

/// Starts the upstream HTTP connection in the protocol the upstream chose by ALPN. `gone`
/// is cancelled when it ends, unless it ended in an upgrade (`upgrading` set).
async fn start_upstream_http(
    stream: tokio_rustls::client::TlsStream<crate::route::UpstreamStream>,
    gone: CancellationToken,
    upgrading: Arc<AtomicBool>,
) -> Result<Upstream, String> {
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(stream);
    if h2 {
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| format!("HTTP/2 handshake with the upstream failed: {e}"))?;
        // The connection is shared with the question whether the origin's SETTINGS accept
        // extended CONNECT (RFC 8441 section 3), which only it can answer.
        let conn = Arc::new(std::sync::Mutex::new(Box::pin(conn)));
        let polled = Arc::clone(&conn);
        tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| {
                polled
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .as_mut()
                    .poll(cx)
            })
            .await;
            gone.cancel();
        });
        let extended_connect = move || {
            conn.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_extended_connect_protocol_enabled()
        };
        Ok(Upstream::H2(sender, Arc::new(extended_connect)))
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| format!("HTTP/1.1 handshake with the upstream failed: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
            if !upgrading.load(Ordering::SeqCst) {
                gone.cancel();
            }
        });
        Ok(Upstream::H1(Mutex::new(sender)))
    }
}

/// Judges and forwards one request (h1 and h2 alike): the tunnel host, a protocol switch
/// it asks for (`crate::front::upgrade`), the request rules, then the authority's
/// credentials (`crate::credential::apply`: its secrets added, a misplaced placeholder
/// refused).
async fn handle(mut req: Request<Incoming>, env: &Env) -> Response<Body> {
    let protocol = req
        .extensions()
        .get::<hyper::ext::Protocol>()
        .map(|p| p.as_str().as_bytes().to_vec());
    let switch = upgrade::requested(
        req.method(),
        req.headers(),
        req.version(),
        protocol.as_deref(),
    );
    let method = match &switch {
        Ok(Some(s)) => s.judged_method(req.method()),
        _ => req.method().as_str(),
    };
    let request = RequestLine {
        method: method.to_owned(),
        path: logged_path(req.uri()),
    };
    // The tunnel's authority now: a reload that kept the tunnel moved it to the new grant.
    let authority = env.standing.authority();
    let ctx = env.ctx.attributed(&authority);
    let name = authority.grant.name();
    let refuse = |denial: Denial| {
        record::tls_request(
            &env.shared,
            &ctx,
            &env.label,
            &request,
            Err(&denial),
            Vec::new(),
        );
        deny_response(Some(name), &env.label, &denial)
    };

    // A revoked authority (or one whose reload judged the tunnel no longer allowed) takes
    // no new decision, even on a tunnel that stays open until the revoke grace ends (as
    // `establish` refuses new ones).
    if !env.shared.authorities.is_live(&authority) {
        return refuse(revoked(name));
    }
    if let Err(detail) = check_authority(&req, &env.target) {
        return refuse(
            Denial::new(
                Reason::SniMismatch,
                detail,
                format!(
                    "this tunnel is to {}: send requests for other hosts through a tunnel to that host",
                    env.target
                ),
            )
            .with_cause(Cause::Misdirected),
        );
    }
    let switch = match switch {
        Ok(s) => s,
        Err(detail) => {
            return refuse(Denial::new(
                Reason::DeniedByRule,
                detail,
                "inside a terminated tunnel Upgrade: websocket (or an HTTP/2 extended CONNECT for it) is relayed, and tokens a request rule lists in upgrade; send the request without Upgrade",
            ));
        }
    };
    // Scoped: the header view is not kept across an await.
    let decision = {
        let headers = crate::credential::Headers(req.headers());
        let facts = policy::RequestFacts::new(&request.method, req.uri().path())
            .with_query(req.uri().query())
            .with_headers(&headers)
            .with_upgrade(switch.as_ref().map(|s| &s.token));
        authority.grant.decide_request(&env.target, &facts)
    };
    if !decision.is_allow() {
        return refuse(Denial::from(decision));
    }
    let uri = req.uri().clone();
    let credential =
        match crate::credential::apply(&authority, &env.target, &uri, req.headers_mut()) {
            Ok(used) => used,
            Err(denial) => return refuse(denial),
        };
    let upstream = match &env.upstream {
        Ok(u) => u,
        Err(detail) => {
            return refuse(Denial::new(
                Reason::UpstreamFailure,
                detail.clone(),
                "the upstream's certificate must verify against the system trust store or [tls] extra_ca_files, for the host name itself",
            ));
        }
    };
    if matches!(upstream, Upstream::H1(_)) && env.upgrading.load(Ordering::SeqCst) {
        return refuse(Denial::new(
            Reason::UpstreamFailure,
            format!(
                "{}: the tunnel's HTTP/1.1 upstream connection carries a switched protocol now",
                env.target
            ),
            "send further requests on a new connection",
        ));
    }
    let plan = match &switch {
        None => None,
        Some(s) => match upgrade::plan(s, upstream.carrier().await) {
            Ok(p) => Some((s, p, hyper::upgrade::on(&mut req))),
            Err(detail) => {
                return refuse(Denial::new(
                    Reason::UpstreamFailure,
                    format!("{}: {detail}", env.target),
                    "open a new tunnel and use HTTP/1.1 for the WebSocket, or ask the origin's operator to enable extended CONNECT",
                ));
            }
        },
    };
    let upstream_req = match rebuild(req, &env.target, upstream.version()) {
        Ok(r) => match &plan {
            Some((s, p, _)) => {
                let (mut parts, body) = r.into_parts();
                upgrade::prepare(&mut parts, s, p);
                Request::from_parts(parts, body)
            }
            None => r,
        },
        Err(detail) => {
            return refuse(Denial::new(
                Reason::MalformedTarget,
                detail,
                "send a well-formed request",
            ));
        }
    };
    let allow = Allowed {
        rule: decision.rule.as_deref(),
        pin: env.pin,
        route: env.shared.route_label(env.route),
    };
    let id = record::tls_request(
        &env.shared,
        &ctx,
        &env.label,
        &request,
        Ok(allow),
        credential,
    );
    let head = request.method == "HEAD";
    let takes_h1 = plan.is_some() && matches!(upstream, Upstream::H1(_));
    if takes_h1 {
        env.upgrading.store(true, Ordering::SeqCst);
    }
    let (upstream_req, trailers) = check_trailers(upstream_req, &authority, env, &ctx, &request);
    let answer = upstream.send(upstream_req).await;
    // A trailer that carried a placeholder cut the request (already logged): say why.
    if let Some(denial) = trailers.denial() {
        env.upgrading.store(false, Ordering::SeqCst);
        return deny_response(Some(name), &env.label, denial);
    }
    match answer {
        Ok(mut resp) => {
            let upstream_upgrade = plan.as_ref().map(|_| hyper::upgrade::on(&mut resp));
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.remove(DECISION_HEADER);
            if let (Some((switch, plan, client)), Some(upstream_upgrade)) = (plan, upstream_upgrade)
            {
                match upgrade::switched(&mut parts, switch, &plan) {
                    Ok(true) => {
                        let facts = upgrade::Upgraded {
                            shared: Arc::clone(&env.shared),
                            ctx: ctx.clone(),
                            label: env.label.clone(),
                            request: request.clone(),
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
                // A HEAD response has no body, whatever its Content-Length says; passing
                // the upstream body on would make the HTTP/2 server reset the stream.
                drop(body);
                return Response::from_parts(parts, empty_body());
            }
            Response::from_parts(parts, body.boxed())
        }
        Err(e) => {
            if takes_h1 {
                env.upgrading.store(false, Ordering::SeqCst);
            }
            let denial = Denial::new(
                Reason::UpstreamFailure,
                format!("{}: upstream request failed: {e}", env.target),
                "the destination closed the connection or sent an invalid response",
            );
            deny_response(Some(name), &env.label, &denial)
        }
    }
}

/// The decision line of an HTTP/2 request the HTTP/2 layer reset as malformed before it
/// reached [`handle`] (`crate::front::h2_resets`): no method or path can be logged.
fn malformed_h2(shared: &Arc<Shared>, ctx: &Ctx, label: &TargetLabel, target: &Target) -> OnReset {
    let (shared, ctx, label, target) = (
        Arc::clone(shared),
        ctx.clone(),
        label.clone(),
        target.clone(),
    );
    Box::new(move |stream| {
        let denial = Denial::new(
            Reason::MalformedTarget,
            format!(
                "HTTP/2 stream {stream} in the tunnel to {target} was a malformed request (RFC 9113 section 8.1.1: e.g. an :authority or :path that is not URI syntax, or a body that does not match its content-length); it was reset with PROTOCOL_ERROR before it could be judged, and nothing more of it was forwarded"
            ),
            format!("send well-formed requests whose :authority is {target}"),
        );
        record::deny(&shared, &ctx, Protocol::Tls, &label, denial);
    })
}

/// `req` with its trailer fields checked for the authority's placeholders; a refused one
/// is logged as this request's `credential_misuse` line.
fn check_trailers(
    req: Request<Incoming>,
    authority: &Arc<policy::config::Authority>,
    env: &Env,
    ctx: &Ctx,
    request: &RequestLine,
) -> (Request<CheckedBody>, TrailerVerdict) {
    let (shared, ctx, label, request) = (
        Arc::clone(&env.shared),
        ctx.clone(),
        env.label.clone(),
        request.clone(),
    );
    let (parts, body) = req.into_parts();
    let (body, verdict) = CheckedBody::new(body, authority, &env.target, move |denial| {
        record::tls_request(&shared, &ctx, &label, &request, Err(denial), Vec::new());
    });
    (Request::from_parts(parts, body), verdict)
}

fn empty_body() -> Body {
    http_body_util::Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// Every request's `Host` and `:authority` (or absolute-form authority) must name the
/// tunnel host and port (RFC 9110 sections 7.2 and 7.4: else `421`). At least one must be
/// present; more than one `Host` header is refused.
fn check_authority(req: &Request<Incoming>, target: &Target) -> Result<(), String> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host header".into());
    }
    let uri_authority = req.uri().authority().map(|a| a.as_str().to_owned());
    let host = match host {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| "the Host header is not ASCII".to_owned())?
                .to_owned(),
        ),
        None => None,
    };
    if host.is_none() && uri_authority.is_none() {
        return Err("the request names no host (no Host header, no :authority)".into());
    }
    for value in [uri_authority, host].into_iter().flatten() {
        authority_matches(&value, target)?;
    }
    Ok(())
}

/// Whether `value` (`host`, `host:port`, `[v6]:port`) is the tunnel target. A missing port
/// means 443, the default port of `https` (RFC 9110 section 4.2.2); a port that is there
/// must be one (`host:`, `host:https`, `host:65536` are malformed, never port 443), as in
/// a CONNECT target.
fn authority_matches(value: &str, target: &Target) -> Result<(), String> {
    let shown = || escape_raw(value.as_bytes());
    let malformed = || {
        format!(
            "the request names {}, which is not a host with an optional port (RFC 9110 section 7.2), in a tunnel to {target}",
            shown()
        )
    };
    if value.contains('@') {
        return Err(malformed());
    }
    let authority: http::uri::Authority = value.parse().map_err(|_| malformed())?;
    let host = authority.host();
    let named = if authority.as_str() == host {
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        canonicalize_host(host).map(|host| Target { host, port: 443 })
    } else {
        parse_authority_form(authority.as_str())
    };
    match named {
        Ok(named) if named == *target => Ok(()),
        Ok(_) => Err(format!(
            "the request is for {}, but this tunnel is to {target}",
            shown()
        )),
        Err(_) => Err(malformed()),
    }
}

/// The upstream request: hop-by-hop headers removed (keeping `TE: trailers` for HTTP/2,
/// which gRPC needs), the target rebuilt from canonical values: origin-form with a `Host`
/// header for HTTP/1.1, an absolute URI (hence `:authority`) without `Host` for HTTP/2.
fn rebuild(
    req: Request<Incoming>,
    target: &Target,
    version: Version,
) -> Result<Request<Incoming>, String> {
    let (mut parts, body) = req.into_parts();
    let te_trailers = parts
        .headers
        .get(header::TE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    let authority = host_value(target, 443);
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    parts.version = version;
    if version == Version::HTTP_2 {
        parts.uri = format!("https://{authority}{path}")
            .parse::<Uri>()
            .map_err(|e| format!("bad request target: {e}"))?;
        if te_trailers {
            parts
                .headers
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
    } else {
        parts.uri = path
            .parse::<Uri>()
            .map_err(|e| format!("bad request target: {e}"))?;
        let host = HeaderValue::from_str(&authority).map_err(|e| format!("bad host: {e}"))?;
        parts.headers.insert(header::HOST, host);
    }
    remove_h2_forbidden(&mut parts.headers);
    Ok(Request::from_parts(parts, body))
}

/// Connection-specific headers that HTTP/2 forbids (RFC 9113 section 8.2.2) and that
/// `strip_hop_by_hop` may not know by name.
fn remove_h2_forbidden(headers: &mut HeaderMap) {
    headers.remove(HeaderName::from_static("proxy-connection"));
}
