//! Byte relay between a client and an upstream connection.
//!
//! Both directions run concurrently in one task with one buffer each (no per-chunk
//! allocation; a buffer starts small and grows only while reads fill it); each direction ends on its own (EOF is passed on as a write shutdown, so
//! half-closed connections work); a tunnel with no bytes in either direction for the idle
//! timeout is closed; a shutdown signal closes it at once. Byte counts survive errors, so
//! the close record is always accurate.
//!
//! Here: the relay over any two streams (buffers) and its idle and shutdown watch;
//! `splice.rs` the zero-copy path between two plain sockets; `sock.rs` the sockets under
//! the streams and the send-queue ioctls (the crate's only `unsafe`); `tests.rs`.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

// The only `unsafe` of the crate: the two send-queue ioctls, each block SAFETY-commented.
#[allow(unsafe_code)]
mod sock;
mod splice;

use crate::route::UpstreamStream;
use crate::vocab::CloseReason;
use sock::send_queue;
pub(crate) use sock::{Sock, reset_fd_on_close, socket_of};
use splice::pump_sockets;
pub(crate) use splice::set_pipe_budget;

/// First buffer size per direction: a chatty tunnel never needs more.
pub(super) const BUF_START: usize = 2 * 1024;
/// Largest buffer per direction: a read that fills the buffer grows it (x4) up to this,
/// so bulk transfers make few, large system calls.
pub(super) const BUF_MAX: usize = 64 * 1024;

/// How a relay ended, and what crossed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RelayOutcome {
    /// Bytes client -> upstream.
    pub(crate) up: u64,
    /// Bytes upstream -> client.
    pub(crate) down: u64,
    /// Why it ended.
    pub(crate) close_reason: CloseReason,
}

impl RelayOutcome {
    /// A connection that ended before any byte was relayed, for `reason`.
    pub(crate) fn ended(close_reason: CloseReason) -> Self {
        Self {
            up: 0,
            down: 0,
            close_reason,
        }
    }
}

/// Relays until both directions have ended, the idle timeout passes, or `closing` turns
/// true. When `client` is a plain socket (see [`socket_of`]) and the upstream is plain TCP
/// the bytes move with [`relay_sockets`]; otherwise (TLS on either side) through buffers.
/// A tunnel the mediator cuts (idle, or `closing`) is reset on every TCP side it can
/// reach, never ended with a FIN the client could take for the origin's end of a
/// complete transfer; the close record then counts only the bytes that were sent.
pub(crate) async fn relay<C>(
    client: C,
    upstream: UpstreamStream,
    idle: Duration,
    closing: CancellationToken,
    progress: Progress<'_>,
) -> RelayOutcome
where
    C: AsyncRead + AsyncWrite + Unpin + 'static,
{
    match upstream {
        UpstreamStream::Plain(mut tcp) => {
            let mut outcome = match socket_of(&client) {
                Some(sock) => {
                    let mut outcome =
                        relay_sockets(sock, Sock::Tcp(&tcp), idle, closing, progress).await;
                    if outcome.close_reason.is_cut() {
                        outcome.down -= sock.reset_on_close().min(outcome.down);
                    }
                    outcome
                }
                None => relay_streams(client, &mut tcp, idle, closing, progress).await,
            };
            if outcome.close_reason.is_cut() {
                outcome.up -= Sock::Tcp(&tcp).reset_on_close().min(outcome.up);
            }
            outcome
        }
        UpstreamStream::Tls(tls) => {
            // The client's socket is reached through a second descriptor once the relay
            // has taken (and dropped) the stream; the reset comes when that one closes.
            let client_fd = socket_of(&client).and_then(Sock::reset_handle);
            let mut outcome = relay_streams(client, tls, idle, closing, progress).await;
            if let (true, Some(fd)) = (outcome.close_reason.is_cut(), &client_fd) {
                outcome.down -= reset_fd_on_close(fd).min(outcome.down);
            }
            outcome
        }
    }
}

/// Relays between two streams through one buffer per direction.
pub(crate) async fn relay_streams<C, U>(
    client: C,
    upstream: U,
    idle: Duration,
    closing: CancellationToken,
    progress: Progress<'_>,
) -> RelayOutcome
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let state = State::new();
    // The pumps are built inside the select (not bound first and moved in): each future
    // is then stored once in this one, which every tunnel task carries.
    let reason = tokio::select! {
        both = async {
            tokio::try_join!(
                pump(&mut cr, &mut uw, &state.up, &state, CloseReason::ClientClosed),
                pump(&mut ur, &mut cw, &state.down, &state, CloseReason::UpstreamClosed),
            )
        } => state.reason(both),
        () = idle_watch(&state, idle, None, progress) => CloseReason::IdleTimeout,
        () = closing.cancelled() => CloseReason::Shutdown,
    };
    state.outcome(reason)
}

/// Relays between two sockets without splitting them: each direction waits for readiness
/// on the shared socket. A direction starts by copying through a small buffer; once reads
/// fill the largest buffer (a bulk transfer) it moves to `splice(2)` through a pipe of its
/// own, so the bytes go socket -> pipe -> socket inside the kernel, never through our
/// memory. Idle and chatty tunnels never create a pipe.
pub(crate) async fn relay_sockets(
    client: Sock<'_>,
    upstream: Sock<'_>,
    idle: Duration,
    closing: CancellationToken,
    progress: Progress<'_>,
) -> RelayOutcome {
    let state = State::new().with_client(client.fd().as_raw_fd());
    let reason = tokio::select! {
        both = async {
            tokio::try_join!(
                pump_sockets(client, upstream, &state.up, &state, CloseReason::ClientClosed),
                pump_sockets(upstream, client, &state.down, &state, CloseReason::UpstreamClosed),
            )
        } => state.reason(both),
        () = idle_watch(&state, idle, Some((client, upstream)), progress) => CloseReason::IdleTimeout,
        () = closing.cancelled() => CloseReason::Shutdown,
    };
    state.outcome(reason)
}

/// Which end of a relay a failed read or write was on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// The client's connection.
    Client,
    /// The upstream connection.
    Upstream,
}

impl Side {
    /// The side a direction reads from: the client for the direction that ends as
    /// `client_closed` (client -> upstream), else the upstream.
    fn reading(end_name: CloseReason) -> Self {
        if end_name == CloseReason::ClientClosed {
            Self::Client
        } else {
            Self::Upstream
        }
    }

    fn other(self) -> Self {
        match self {
            Self::Client => Self::Upstream,
            Self::Upstream => Self::Client,
        }
    }
}

/// What both directions of one relay share. Atomics only because the future must be
/// `Send`; both directions run in the same task.
pub(super) struct State {
    origin: Instant,
    /// Milliseconds since `origin` when the last byte moved.
    last: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
    first_end: OnceLock<CloseReason>,
    /// The first read or write that failed: on which side, and how.
    failure: OnceLock<(Side, io::ErrorKind)>,
    /// The client's socket, when the relay is between sockets (so that a failure on a
    /// socket can be told to be the client's).
    client_fd: Option<std::os::fd::RawFd>,
}

impl State {
    fn new() -> Self {
        Self {
            origin: Instant::now(),
            last: AtomicU64::new(0),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            first_end: OnceLock::new(),
            failure: OnceLock::new(),
            client_fd: None,
        }
    }

    /// The same, for a relay whose client is the socket `fd`.
    fn with_client(mut self, fd: std::os::fd::RawFd) -> Self {
        self.client_fd = Some(fd);
        self
    }

    /// Notes that a read or write on `side` failed with `e` (the first failure is kept),
    /// and returns `e`.
    pub(super) fn failed(&self, side: Side, e: io::Error) -> io::Error {
        let _ = self.failure.set((side, e.kind()));
        e
    }

    /// [`Self::failed`] for a failure on the socket `on`.
    pub(super) fn failed_on(&self, on: Sock<'_>, e: io::Error) -> io::Error {
        let side = if Some(on.fd().as_raw_fd()) == self.client_fd {
            Side::Client
        } else {
            Side::Upstream
        };
        self.failed(side, e)
    }

    fn moved(&self, count: &AtomicU64, n: usize) {
        count.fetch_add(n as u64, Ordering::Relaxed);
        self.touch();
    }

    /// Records activity now (resets the idle clock).
    fn touch(&self) {
        let since = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(since, Ordering::Relaxed);
    }
}

impl State {
    /// The close reason once both directions have ended, or one failed (a reset or a
    /// failed write ends the whole tunnel at once: the other side may never speak again).
    ///
    /// A client that resets its connection (or is gone when written to) after the
    /// upstream answered has closed it: many clients end a finished exchange with a reset
    /// (a socket closed with unread bytes, such as a TLS session ticket, is reset by the
    /// kernel; `SO_LINGER` 0). Any other failure, and a client's reset before anything
    /// came back, is an `error`.
    fn reason(&self, ended: io::Result<((), ())>) -> CloseReason {
        match ended {
            Ok(_) => self
                .first_end
                .get()
                .copied()
                .unwrap_or(CloseReason::ClientClosed),
            Err(_) => match self.failure.get() {
                Some(&(Side::Client, kind)) if hung_up(kind) && self.answered() => {
                    CloseReason::ClientClosed
                }
                _ => CloseReason::Error,
            },
        }
    }

    /// The upstream sent the client something (what the client sent may have gone before
    /// the relay started, with the tunnel's first bytes).
    fn answered(&self) -> bool {
        self.down.load(Ordering::Relaxed) > 0
    }

    fn outcome(&self, close_reason: CloseReason) -> RelayOutcome {
        RelayOutcome {
            up: self.up.load(Ordering::Relaxed),
            down: self.down.load(Ordering::Relaxed),
            close_reason,
        }
    }
}

/// Told the bytes moved (up, down) since it was last told, every [`PROGRESS_EVERY`] while
/// a relay runs (`None`: nobody asks). The close still reports the totals.
pub(crate) type Progress<'a> = Option<&'a (dyn Fn(u64, u64) + Sync)>;

/// How often a running relay tells its [`Progress`].
pub(crate) const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Resolves once no byte has moved for `idle`. For a socket relay (`socks`), bytes still
/// leaving our send queues count as movement: a slow reader drains them while we have
/// nothing new to write, and must not be cut off as idle; a reader that takes nothing is.
///
/// It also tells `progress` what moved, every [`PROGRESS_EVERY`] (one timer for both, so
/// that every tunnel's future stays small).
async fn idle_watch(
    state: &State,
    idle: Duration,
    socks: Option<(Sock<'_>, Sock<'_>)>,
    progress: Progress<'_>,
) {
    let queued = |(a, b): (Sock<'_>, Sock<'_>)| send_queue(a.fd()) + send_queue(b.fd());
    // A tunnel starts with (next to) nothing queued: counting from zero spares every
    // tunnel two ioctls at its start; a queue that was full from the start only gets one
    // more idle period.
    let mut last_queued = socks.map(|_| 0);
    let mut told = (0, 0);
    let mut next_tell = state.origin + PROGRESS_EVERY;
    loop {
        if let Some(tell) = progress
            && Instant::now() >= next_tell
        {
            let now = (
                state.up.load(Ordering::Relaxed),
                state.down.load(Ordering::Relaxed),
            );
            if now != told {
                tell(now.0 - told.0, now.1 - told.1);
                told = now;
            }
            next_tell += PROGRESS_EVERY;
        }
        let last = Duration::from_millis(state.last.load(Ordering::Relaxed));
        let deadline = state.origin + last + idle;
        if Instant::now() >= deadline {
            let now_queued = socks.map(queued);
            if now_queued == last_queued {
                return;
            }
            last_queued = now_queued;
            state.touch();
            continue;
        }
        let wake = if progress.is_some() {
            deadline.min(next_tell)
        } else {
            deadline
        };
        tokio::time::sleep_until(wake).await;
    }
}

/// Whether a failed read or write means the peer is gone: it reset the connection, or
/// it closed it and a write found it so.
pub(crate) fn hung_up(kind: io::ErrorKind) -> bool {
    matches!(
        kind,
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
    )
}

async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    count: &AtomicU64,
    state: &State,
    end_name: CloseReason,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let from = Side::reading(end_name);
    let mut buf = vec![0u8; BUF_START];
    loop {
        let n = r.read(&mut buf).await.map_err(|e| state.failed(from, e))?;
        if n == 0 {
            let _ = state.first_end.set(end_name);
            // Pass the half-close on; the other direction keeps going.
            let _ = w.shutdown().await;
            return Ok(());
        }
        w.write_all(&buf[..n])
            .await
            .map_err(|e| state.failed(from.other(), e))?;
        state.moved(count, n);
        if n == buf.len() && buf.len() < BUF_MAX {
            // Data arrives faster than we read it: grow once the bytes are sent.
            buf = vec![0u8; (buf.len() * 4).min(BUF_MAX)];
        }
    }
}

/// Reads `from` dry with plain `recv(2)` calls and writes what comes to `to`; true at the
/// end of the stream. Used when splice(2) moved nothing although `from` was readable: it
/// stops at TCP urgent data (the "mark"), which a read passes (dropping the urgent byte,
/// as any plain read does). The reads bypass tokio's readiness (which splice's EAGAIN has
/// just cleared), and go on until EAGAIN, so that waiting for the next readiness edge
/// cannot miss bytes already queued.
pub(super) async fn drain_by_reading(
    from: Sock<'_>,
    to: Sock<'_>,
    count: &AtomicU64,
    state: &State,
) -> io::Result<bool> {
    let mut buf = vec![0u8; BUF_MAX];
    loop {
        let fd = from.fd().as_raw_fd();
        match nix::sys::socket::recv(fd, &mut buf, nix::sys::socket::MsgFlags::MSG_DONTWAIT) {
            Ok(0) => return Ok(true),
            Ok(n) => write_all(to, &buf[..n], count, state).await?,
            Err(nix::errno::Errno::EAGAIN) => return Ok(false),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(state.failed_on(from, e.into())),
        }
    }
}

/// Writes all of `bytes`, counting each write as it lands (a relay cancelled mid-write
/// still reports exactly what was delivered).
pub(super) async fn write_all(
    to: Sock<'_>,
    mut bytes: &[u8],
    count: &AtomicU64,
    state: &State,
) -> io::Result<()> {
    while !bytes.is_empty() {
        to.ready(Interest::WRITABLE)
            .await
            .map_err(|e| state.failed_on(to, e))?;
        match to.try_write(bytes) {
            Ok(n) => {
                bytes = &bytes[n..];
                state.moved(count, n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(state.failed_on(to, e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
