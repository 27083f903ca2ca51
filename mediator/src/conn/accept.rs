//! One accept loop for every listener: the per-authority Unix sockets, the shared TCP
//! listener (design section 5), and the admin API on TCP or its own Unix socket.
//!
//! A channel connection is identified here by where it arrived: a Unix socket *is* its
//! authority (the peer's pid/uid/gid are read with `SO_PEERCRED` and logged); on the TCP
//! listener the authority is named later by a credential. Each connection runs in a task
//! of its own, counted live until it ends, and starts in [`crate::front::dispatch`].

use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use policy::Reason;

use super::{Ctx, TargetLabel, record};
use crate::authorities::Live;
use crate::decision_log::Peer;
use crate::denial::Denial;
use crate::limits::{Attributed, Door};
use crate::serving::Load;
use crate::shared::{ActiveGuard, Shared};
use crate::vocab::LimitKind;
use crate::vocab::Protocol;

/// How long the loop waits after a failed `accept` (e.g. `EMFILE`) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A listening socket: TCP or Unix.
pub(crate) trait Listener: Send + Sync + 'static {
    /// The accepted stream.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + Movable + 'static;
    /// Accepts one connection.
    fn accept_one(&self) -> impl Future<Output = io::Result<(Self::Io, Peer)>> + Send;
}

/// A stream that can move to another serving thread ([`crate::serving`]): taken off the
/// accepting runtime's reactor as a plain socket and registered with the other one's.
pub(crate) trait Movable: Sized {
    /// The socket between the two runtimes.
    type Std: Send + 'static;
    /// Deregisters the stream from this runtime.
    fn into_std(self) -> io::Result<Self::Std>;
    /// Registers the socket with the current runtime.
    fn from_std(std: Self::Std) -> io::Result<Self>;
}

impl Movable for TcpStream {
    type Std = std::net::TcpStream;

    fn into_std(self) -> io::Result<Self::Std> {
        Self::into_std(self)
    }

    fn from_std(std: Self::Std) -> io::Result<Self> {
        Self::from_std(std)
    }
}

impl Movable for UnixStream {
    type Std = std::os::unix::net::UnixStream;

    fn into_std(self) -> io::Result<Self::Std> {
        Self::into_std(self)
    }

    fn from_std(std: Self::Std) -> io::Result<Self> {
        Self::from_std(std)
    }
}

impl Listener for TcpListener {
    type Io = TcpStream;

    async fn accept_one(&self) -> io::Result<(TcpStream, Peer)> {
        // `poll_accept` keeps its waker in the socket's own slot: the wait takes no room
        // in the accept loop's future (this task is the listener's only acceptor).
        let (stream, addr) = std::future::poll_fn(|cx| self.poll_accept(cx)).await?;
        // Small request heads and replies: never wait for Nagle.
        let _ = stream.set_nodelay(true);
        Ok((stream, Peer::Tcp(addr)))
    }
}

impl Listener for UnixListener {
    type Io = UnixStream;

    async fn accept_one(&self) -> io::Result<(UnixStream, Peer)> {
        loop {
            // As for TCP: the waker waits in the socket's slot, not in this future.
            let (stream, _) = std::future::poll_fn(|cx| self.poll_accept(cx)).await?;
            match stream.peer_cred() {
                Ok(cred) => {
                    let peer = Peer::Unix {
                        pid: cred.pid(),
                        uid: cred.uid(),
                        gid: cred.gid(),
                    };
                    return Ok((stream, peer));
                }
                // Who is asking must be logged: a connection without it is closed.
                Err(e) => tracing::warn!("SO_PEERCRED failed: {e}; closing the connection"),
            }
        }
    }
}

/// Accepts on `listener` until `stop` is cancelled (the listener is then dropped, so
/// closed), handing each connection to `serve` with what `room` gave. Before each accept,
/// `room` is awaited (a full mediator stops accepting rather than run out of
/// descriptors). `what` names the listener in warnings.
pub(crate) async fn accept_loop<L, F, R, T>(
    listener: L,
    stop: CancellationToken,
    what: impl std::fmt::Display,
    mut room: impl FnMut() -> R,
    mut serve: F,
) where
    L: Listener,
    F: FnMut(L::Io, Peer, T),
    R: Future<Output = T>,
{
    loop {
        let place = tokio::select! {
            place = room() => place,
            () = stop.cancelled() => return,
        };
        let accepted = tokio::select! {
            a = listener.accept_one() => a,
            () = stop.cancelled() => return,
        };
        match accepted {
            Ok((io, peer)) => serve(io, peer, place),
            Err(e) => {
                tracing::warn!("accept on {what} failed: {e}");
                // Rare: the timer lives on the heap, not in every listener's future.
                tokio::select! {
                    () = Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)) => {}
                    () = stop.cancelled() => return,
                }
            }
        }
    }
}

/// Waits for room for one more connection from `door` (counting `limit="global"` once an
/// episode).
async fn room(shared: &Shared, door: Door) {
    shared
        .limiter
        .room(door, || shared.metrics.limited(None, LimitKind::Global))
        .await;
}

/// Serves an authority's Unix socket until it is revoked or the mediator drains: each
/// connection is that authority's, counted against its limits at once.
///
/// One such future waits on every authority's socket, all its life: thousands of
/// authorities mean thousands of them, so it is kept small: it is the accept loop itself
/// (no enclosing future holding its arguments twice), the rare wait for room is boxed, and
/// its name for warnings is the authority, not a copied string.
pub(crate) fn serve_authority(
    listener: UnixListener,
    live: Arc<Live>,
    shared: Arc<Shared>,
) -> impl Future<Output = ()> + Send + 'static {
    let stop = live.stop_signal();
    let (for_room, shared_for_room) = (Arc::clone(&live), Arc::clone(&shared));
    let room = move || {
        // Nearly always there is room at once: only a wait lives on the heap.
        let wait = (!shared_for_room.limiter.has_room(Door::Channel)
            || !for_room.counts.refusals_ok())
        .then(|| {
            let (live, shared) = (Arc::clone(&for_room), Arc::clone(&shared_for_room));
            Box::pin(async move {
                room(&shared, Door::Channel).await;
                // Its own over-limit connections being answered: only its socket waits.
                live.counts.refusals_room().await;
            })
        });
        async move {
            if let Some(wait) = wait {
                wait.await;
            }
        }
    };
    let what = SocketOf(Arc::clone(&live));
    accept_loop(listener, stop, what, room, move |io, peer, ()| {
        let ctx = attributed_ctx(&shared, &live, peer);
        serve_placed(&shared, io, ctx);
    })
}

/// An authority's socket, named in warnings.
struct SocketOf(Arc<Live>);

impl std::fmt::Display for SocketOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the socket of {}", self.0.name())
    }
}

/// The context of a connection that arrived on `live`'s own channel (its socket, or
/// in-process), counted against the authority's limits (a refusal is answered by the
/// front-end).
pub(crate) fn attributed_ctx(shared: &Shared, live: &Live, peer: Peer) -> Ctx {
    let conn = shared.next_id();
    let admission = shared
        .limiter
        .admit(conn, Door::Channel, &CancellationToken::new(), || {});
    if let Attributed::Refused { kind, .. } = admission.attribute(&live.counts, live.name()) {
        shared.metrics.limited(Some(live.name()), kind);
    }
    Ctx::new(conn, peer, Some(Arc::clone(&live.authority)), admission)
}

/// Serves the shared TCP listener until the mediator drains: each connection starts
/// unidentified (sheddable when the pool is full); its credential names its authority.
pub(crate) async fn serve_tcp(listener: TcpListener, shared: Arc<Shared>) {
    let stop = shared.signals.draining.clone();
    let room = || room(&shared, Door::Tcp);
    accept_loop(listener, stop, "the TCP listener", room, |io, peer, ()| {
        let conn = shared.next_id();
        let shed = CancellationToken::new();
        let admission = shared.limiter.admit(conn, Door::Tcp, &shed, || {
            shared.metrics.limited(None, LimitKind::Unidentified);
        });
        serve_placed(&shared, io, Ctx::new(conn, peer, None, admission));
    })
    .await;
}

/// Serves a connection accepted on this thread where [`Serving::place`] says: in a task
/// on this thread, or moved to a less loaded serving thread.
///
/// [`Serving::place`]: crate::serving::Serving::place
fn serve_placed<S>(shared: &Arc<Shared>, io: S, ctx: Ctx)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + Movable + 'static,
{
    let placed = shared.serving.place();
    let guard = shared.enter();
    let Some(there) = placed.elsewhere else {
        tokio::spawn(serve_conn(
            Arc::clone(shared),
            io,
            ctx,
            guard,
            Some(placed.load),
        ));
        return;
    };
    let io = match io.into_std() {
        Ok(io) => io,
        Err(e) => {
            tracing::warn!("cannot move connection {} to another thread: {e}", ctx.conn);
            return;
        }
    };
    let shared = Arc::clone(shared);
    there.spawn(async move {
        match S::from_std(io) {
            Ok(io) => serve_conn(shared, io, ctx, guard, Some(placed.load)).await,
            Err(e) => tracing::warn!("cannot serve connection {} here: {e}", ctx.conn),
        }
    });
}

/// Runs one client connection in a task of its own, counted live while it runs. The task
/// ends when the connection does, or at once when it is shed from the unidentified pool.
/// A panic ends this connection only: it is caught here and logged (the connection's
/// owners, unwound, still write their records).
pub(crate) fn spawn_conn<S>(shared: &Arc<Shared>, io: S, ctx: Ctx)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let guard = shared.enter();
    tokio::spawn(serve_conn(Arc::clone(shared), io, ctx, guard, None));
}

/// The task of one client connection (see [`spawn_conn`]); `guard` counts it live, `load`
/// on its serving thread.
async fn serve_conn<S>(shared: Arc<Shared>, io: S, ctx: Ctx, guard: ActiveGuard, load: Option<Load>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    {
        let _counted = (guard, load);
        let conn = ctx.conn;
        let shed = ctx.admission.shed_signal().clone();
        // Only a connection that has not named its authority yet can be shed: what its
        // decision line needs then.
        let unidentified = ctx
            .authority
            .is_none()
            .then(|| (ctx.clone(), Arc::clone(&shared)));
        let serving = AssertUnwindSafe(crate::front::dispatch(io, shared, ctx)).catch_unwind();
        tokio::select! {
            outcome = serving => {
                if let Err(panic) = outcome {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".to_owned());
                    tracing::error!(
                        "connection {conn} panicked and was closed ({what}); other connections are unaffected"
                    );
                }
            }
            () = shed.cancelled() => {
                tracing::debug!("connection {conn} shed from the unidentified pool");
                if let Some((ctx, shared)) = unidentified {
                    record_shed(&shared, &ctx);
                }
            }
        }
    }
}

/// The decision line of a connection shed from the unidentified pool: `rate_limited`,
/// no authority or host (none was read), protocol `http` (the TCP listener's; a SOCKS5
/// client shed mid-handshake is logged the same way).
fn record_shed(shared: &Shared, ctx: &Ctx) {
    let cap = shared.limiter.in_force().unidentified_connections;
    let denial = Denial::new(
        Reason::RateLimited,
        format!(
            "connection {} was shed from the unidentified pool (unidentified_connections = {cap}, full) to admit a newer one: it had not sent a complete, authenticated request head yet",
            ctx.conn
        ),
        "send the request head (with its credential) as soon as the connection opens",
    );
    record::deny(shared, ctx, Protocol::Http, &TargetLabel::default(), denial);
}

#[cfg(test)]
mod tests {
    #![allow(unreachable_code, clippy::diverging_sub_expression)]
    use super::*;
    use crate::rewind::Rewind;

    /// The size of the future `make` would return, without calling it.
    fn future_size<F, Fut>(_make: F) -> usize
    where
        F: FnOnce() -> Fut,
    {
        size_of::<Fut>()
    }

    /// Every connection's task holds its `dispatch` future for its whole life, and tokio
    /// copies it when the task is created and finished: a buffer or a large sub-future
    /// kept inline (a 4 KiB read buffer, hyper's connection, the resolver) costs every
    /// idle tunnel its size in memory and every connection that many bytes copied. This
    /// was 11.7 KiB (user-space instructions per CONNECT tunnel fell by about 60%
    /// once it was cut); keep large parts boxed or on the heap.
    #[test]
    fn per_connection_futures_stay_small() {
        let unix = future_size(|| {
            crate::front::dispatch::<UnixStream>(unreachable!(), unreachable!(), unreachable!())
        });
        let tcp = future_size(|| {
            crate::front::dispatch::<TcpStream>(unreachable!(), unreachable!(), unreachable!())
        });
        let relay = future_size(|| {
            crate::relay::relay::<Rewind<TcpStream>>(
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
            )
        });
        // One per authority for its whole life (thousands on a node): 680 bytes before
        // the accept's waker moved to the socket's slot and the wait for room to the heap.
        let listener =
            future_size(|| serve_authority(unreachable!(), unreachable!(), unreachable!()));
        assert!(
            listener <= 448,
            "serve_authority future is {listener} bytes"
        );
        assert!(unix <= 5 * 1024, "dispatch (unix) future is {unix} bytes");
        assert!(tcp <= 5 * 1024, "dispatch (tcp) future is {tcp} bytes");
        assert!(relay <= 2 * 1024, "relay future is {relay} bytes");
    }
}
