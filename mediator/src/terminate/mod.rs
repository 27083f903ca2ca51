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
//!
//! The tunnel, top to bottom ([`terminate`]): the leaf, the client's handshake
//! (`client.rs`), the upstream connection (`upstream.rs`: a new one, or an idle one of the
//! same authority to the same place, `crate::reuse`), serving the requests
//! (`request.rs`, each as named steps: who asks, the tunnel's rules, the credentials, the
//! upstream request, the answer; the steps and the message helpers it shares with
//! absolute-form forwarding are `crate::request`), the
//! protocol switches (`upgrade.rs`) and the HTTP/2 requests the HTTP/2 layer refuses
//! itself (`h2_resets.rs`); then the upstream connection goes back to the pool for the
//! next tunnel, if it is still sound.

mod client;
pub(crate) mod h2_resets;
mod head;
mod request;
pub(crate) mod upgrade;
mod upstream;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use policy::{Reason, Target};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use crate::conn::establish::Connected;
use crate::conn::record;
use crate::conn::standing::Standing;
use crate::conn::tunnel_line::TunnelLines;
use crate::conn::{Ctx, TargetLabel};
use crate::counting::reporting;
use crate::denial::Denial;
use crate::relay::{PROGRESS_EVERY, RelayOutcome, Sock, hung_up, reset_fd_on_close, socket_of};
use crate::request::authority::Matched;
use crate::request::preflight::MIN_BUF;
use crate::request::rebuild::Origin;
use crate::reuse::Ticket;
use crate::rewind::Rewind;
use crate::shared::Shared;
use crate::tap::Tapped;
use crate::tls::TlsState;
use crate::vocab::CloseReason;
use h2_resets::ResetWatch;
use upstream::{Opened as UpstreamOpened, Rest, Upstream};

/// The streams one client HTTP/2 connection may have open at once
/// (`SETTINGS_MAX_CONCURRENT_STREAMS`, RFC 9113 section 6.5.2; hyper's default); a stream
/// over it is refused with `REFUSED_STREAM`, and logged.
const MAX_STREAMS: u32 = 200;

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
        stream: leg,
        opened,
        closing,
        standing,
        ..
    } = connected;
    let ctx = opened.ctx().clone();
    let (tls, leaf) = match leaf(&shared, target) {
        Ok(found) => found,
        Err(denial) => {
            record::deny(&shared, &ctx, opened.protocol(), &label, denial);
            opened.finish(RelayOutcome::ended(CloseReason::Error));
            return;
        }
    };
    // A cut resets the client's TCP socket (`crate::relay`): a second descriptor reaches
    // it under TLS, and the reset comes when both are closed, as this function returns.
    let reset = socket_of(&client).and_then(Sock::reset_handle);
    let client = client::Leg::new(client, prefix);
    let bytes = client.bytes();
    let client_tls = match client.accept(&tls, leaf, target, &shared).await {
        Ok(stream) => stream,
        Err(refused) => return client::ended(&shared, opened, &bytes, refused, target),
    };

    // Upstream leg: TLS over the tunnel's pinned (and routed) stream, SNI = the host, or
    // an idle connection of the pool. A client that speaks HTTP/1.1 gets an HTTP/1.1
    // upstream, so that an upgrade of its connection upgrades the upstream one with it.
    let client_h2 = client_tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let facts = (opened.facts().pin, opened.facts().route);
    let link = upstream::open(leg, facts, target, &shared, &tls, client_h2).await;
    let upstream_gone = link.gone.clone();
    let env = Arc::new(Env {
        shared: Arc::clone(&shared),
        ctx: ctx.clone(),
        standing,
        target: target.clone(),
        origin: Origin::of(target),
        matched: Matched::default(),
        label: label.clone(),
        pin: link.pin,
        route: link.route,
        upstream: link.http,
        kept: Kept {
            rest: link.rest,
            ticket: link.ticket,
            gone: link.gone,
        },
        closing: closing.clone(),
        upgrading: link.upgrading,
        relays: Relays::default(),
        answered: AtomicU64::new(0),
        lines: TunnelLines::default(),
    });
    // HTTP/1.1: the first head is judged as the proxy's own first head is.
    let client_tls = if client_h2 {
        Rewind::new(Vec::new(), client_tls)
    } else {
        match head::first(client_tls, &env).await {
            Ok(replayed) => replayed,
            Err(reason) => {
                drop(env);
                opened.finish(bytes.outcome(reason));
                return;
            }
        }
    };
    let client_tls = Tapped::new(
        client_tls,
        ResetWatch::new(client_h2.then(|| request::refused_h2(&shared, &ctx, &label, target))),
    );
    // Its bytes reach the metrics while it is open (every PROGRESS_EVERY), as a plain
    // tunnel's do.
    let reason = reporting(
        served(client_tls, &env, reset.as_ref(), &upstream_gone, client_h2),
        PROGRESS_EVERY,
        || bytes.moved(),
        |up, down| opened.progress(up, down),
    )
    .await;
    give_back(env);
    opened.finish(bytes.outcome(reason));
}

/// Gives the tunnel's upstream connection back to the pool for the next tunnel of its
/// authority to the same place (`crate::reuse`), however the client's side ended: the pool
/// keeps it only if it is alive (an HTTP/1.1 connection whose answer was cut off is not
/// idle, one that switched protocols never is) and the authority is still live (a cut by
/// revocation or shutdown keeps nothing). HTTP/2 requests still finishing may hold the
/// tunnel's state: their connection's sender is a handle, given back as a copy; an
/// HTTP/1.1 connection still held that way is dropped (closed).
fn give_back(env: Arc<Env>) {
    let link = match Arc::try_unwrap(env) {
        Ok(env) => (
            env.shared,
            UpstreamOpened {
                http: env.upstream,
                rest: env.kept.rest,
                ticket: env.kept.ticket,
                gone: env.kept.gone,
                upgrading: env.upgrading,
                pin: env.pin,
                route: env.route,
            },
        ),
        Err(env) => {
            let Ok(Upstream::H2(sender, extended)) = &env.upstream else {
                return;
            };
            let opened = UpstreamOpened {
                http: Ok(Upstream::H2(sender.clone(), Arc::clone(extended))),
                rest: env.kept.rest.clone(),
                ticket: env.kept.ticket.clone(),
                gone: env.kept.gone.clone(),
                upgrading: Arc::clone(&env.upgrading),
                pin: env.pin,
                route: env.route,
            };
            (Arc::clone(&env.shared), opened)
        }
    };
    let (shared, opened) = link;
    if let Some((conn, ticket)) = opened.into_conn() {
        shared.reuse.give(&ticket, conn);
    }
}

/// Serves the client's requests (`serve`), then waits for the relays of switched
/// requests; returns how the tunnel ended.
async fn served<S>(
    client_tls: S,
    env: &Arc<Env>,
    reset: Option<&std::os::fd::OwnedFd>,
    upstream_gone: &CancellationToken,
    client_h2: bool,
) -> CloseReason
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let served = serve(client_tls, Arc::clone(env), reset, upstream_gone).await;
    // Switched streams end with the tunnel (or before): an HTTP/1.1 upgrade took the
    // connection over, so the tunnel ends as its relay ended; HTTP/2 streams end with
    // their connection.
    let mut relays = env.relays.take();
    let mut reason = served;
    while let Some(ended) = relays.join_next().await {
        let outcome = ended.map_or(CloseReason::Error, |o| o.close_reason);
        if let (true, Some(fd)) = (outcome.is_cut(), reset) {
            let _ = reset_fd_on_close(fd);
        }
        if !client_h2 {
            reason = outcome;
        }
    }
    reason
}

/// The CA and the leaf for exactly the tunnel host.
///
/// # Errors
/// The denial to log: the mediator has no CA, or it cannot issue for this name.
fn leaf(shared: &Shared, target: &Target) -> Result<(Arc<TlsState>, Arc<CertifiedKey>), Denial> {
    let Some(tls) = shared.tls.clone() else {
        return Err(Denial::new(
            Reason::UpstreamFailure,
            format!("TLS termination is configured for {target} but the mediator has no CA"),
            "configure [tls] ca_dir and restart the mediator",
        ));
    };
    let leaf = certs::LeafName::parse(&target.host.as_text())
        .and_then(|name| tls.leaves.get(&name))
        .map_err(|e| {
            Denial::new(
                Reason::UpstreamFailure,
                format!("cannot issue a certificate for {}: {e}", target.host),
                "check the mediator's CA ([tls] ca_dir)",
            )
        })?;
    Ok((tls, leaf))
}

/// Serves the requests of the client's connection until it ends, the tunnel is cut, or
/// the upstream connection ends; returns how it ended.
async fn serve<S>(
    client_tls: S,
    env: Arc<Env>,
    reset: Option<&std::os::fd::OwnedFd>,
    upstream_gone: &CancellationToken,
) -> CloseReason
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (timeouts, limits) = (env.shared.timeouts, env.shared.limits);
    let (closing, target) = (env.closing.clone(), env.target.clone());
    let conn_env = Arc::clone(&env);
    let svc = service_fn(move |req| {
        let env = Arc::clone(&env);
        async move {
            let answer = request::handle(req, &env).await;
            env.answered.fetch_add(1, Ordering::Relaxed);
            Ok::<_, Infallible>(answer)
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.request_head)
        .max_buf_size(limits.request_head_bytes.max(MIN_BUF))
        .keep_alive(true);
    // WebSockets over HTTP/2 (RFC 8441): SETTINGS_ENABLE_CONNECT_PROTOCOL = 1. The header
    // list (SETTINGS_MAX_HEADER_LIST_SIZE, RFC 9113 section 6.5.2) is bounded by
    // `[limits] request_head_bytes` as HTTP/1.1 heads are, not by hyper's 16 KiB default
    // (the key is at most 1 MiB, so it fits a u32; the fallback is never taken).
    let header_list = u32::try_from(limits.request_head_bytes).unwrap_or(u32::MAX);
    builder
        .http2()
        .enable_connect_protocol()
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(header_list);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(client_tls), svc);
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => match res {
            Ok(()) => CloseReason::ClientClosed,
            Err(e) => {
                tracing::debug!("terminated tunnel to {target}: {e}");
                request::refused_head(&*e, &conn_env);
                // A client that resets its connection after it was answered has closed it
                // (as in a plain tunnel, `crate::relay`); anything else is an error.
                let answered = conn_env.answered.load(Ordering::Relaxed) > 0;
                if answered && client_hung_up(&*e) {
                    CloseReason::ClientClosed
                } else {
                    CloseReason::Error
                }
            }
        },
        () = closing.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), conn.as_mut()).await;
            if let Some(fd) = reset {
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
    }
}

/// What every request of one terminated tunnel needs.
struct Env {
    shared: Arc<Shared>,
    ctx: Ctx,
    /// The authority the tunnel runs under (a reload may move it to a successor).
    standing: Arc<Standing>,
    target: Target,
    /// The target as the rebuilt requests name it.
    origin: Origin,
    /// A `Host`/`:authority` value found to name the target.
    matched: Matched,
    label: TargetLabel,
    pin: std::net::SocketAddr,
    route: crate::route::Route,
    /// The upstream HTTP connection, or why there is none (the detail of every 502).
    upstream: Result<Upstream, upstream::UpstreamError>,
    /// What the pool needs besides the sender to keep the connection after the tunnel.
    kept: Kept,
    /// The tunnel's cut (revocation, shutdown): ends an upgraded request's relay too.
    closing: CancellationToken,
    /// Set while a switch is under way on the upstream HTTP/1.1 connection (or took it
    /// over), whose end then does not end the tunnel.
    upgrading: Arc<AtomicBool>,
    /// The relays of switched requests (one for HTTP/1.1, streams for HTTP/2).
    relays: Relays,
    /// Requests answered so far.
    answered: AtomicU64,
    /// The constant part of the requests' allow lines, serialised once.
    lines: TunnelLines,
}

/// Whether the error that ended the client's HTTP connection is the client gone: a reset,
/// or a write that found it closed (somewhere in its chain of sources).
fn client_hung_up(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && hung_up(io.kind())
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The rest of a tunnel's upstream connection, for the pool.
struct Kept {
    rest: Option<Rest>,
    ticket: Option<Ticket>,
    gone: CancellationToken,
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
