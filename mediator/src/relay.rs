//! Byte relay between a client and an upstream connection.
//!
//! Both directions run concurrently in one task with one buffer each (no per-chunk
//! allocation; a buffer starts small and grows only while reads fill it); each direction ends on its own (EOF is passed on as a write shutdown, so
//! half-closed connections work); a tunnel with no bytes in either direction for the idle
//! timeout is closed; a shutdown signal closes it at once. Byte counts survive errors, so
//! the close record is always accurate.

use std::any::Any;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};
use std::time::Duration;

use nix::fcntl::{OFlag, SpliceFFlags, splice};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::rewind::Rewind;
use crate::route::UpstreamStream;
use crate::vocab::CloseReason;

/// First buffer size per direction: a chatty tunnel never needs more.
const BUF_START: usize = 2 * 1024;
/// Largest buffer per direction: a read that fills the buffer grows it (x4) up to this,
/// so bulk transfers make few, large system calls.
const BUF_MAX: usize = 64 * 1024;

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
) -> RelayOutcome
where
    C: AsyncRead + AsyncWrite + Unpin + 'static,
{
    match upstream {
        UpstreamStream::Plain(mut tcp) => {
            let mut outcome = match socket_of(&client) {
                Some(sock) => {
                    let mut outcome = relay_sockets(sock, Sock::Tcp(&tcp), idle, closing).await;
                    if outcome.close_reason.is_cut() {
                        outcome.down -= sock.reset_on_close().min(outcome.down);
                    }
                    outcome
                }
                None => relay_streams(client, &mut tcp, idle, closing).await,
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
            let mut outcome = relay_streams(client, tls, idle, closing).await;
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
        () = idle_watch(&state, idle, None) => CloseReason::IdleTimeout,
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
) -> RelayOutcome {
    let state = State::new();
    let reason = tokio::select! {
        both = async {
            tokio::try_join!(
                pump_sockets(client, upstream, &state.up, &state, CloseReason::ClientClosed),
                pump_sockets(upstream, client, &state.down, &state, CloseReason::UpstreamClosed),
            )
        } => state.reason(both),
        () = idle_watch(&state, idle, Some((client, upstream))) => CloseReason::IdleTimeout,
        () = closing.cancelled() => CloseReason::Shutdown,
    };
    state.outcome(reason)
}

/// A plain socket under a stream: what [`relay_sockets`] can move bytes between.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sock<'a> {
    /// A TCP connection.
    Tcp(&'a TcpStream),
    /// A Unix stream connection.
    Unix(&'a UnixStream),
}

/// [`Sock::reset_on_close`] through a handle from [`Sock::reset_handle`]: the reset comes
/// when the last descriptor of the socket closes.
/// Returns the bytes the reset drops (not yet sent).
pub(crate) fn reset_fd_on_close(fd: &OwnedFd) -> u64 {
    let dropped = unsent(fd.as_fd());
    if let Err(e) = socket2::SockRef::from(fd).set_linger(Some(Duration::ZERO)) {
        tracing::debug!("SO_LINGER 0: {e}");
        return 0;
    }
    dropped
}

/// The plain socket under `stream`: a [`TcpStream`] or [`UnixStream`], bare or wrapped in a
/// [`Rewind`] whose replayed bytes are all consumed. `None` for anything else (TLS, an
/// upgraded hyper connection, an in-process pipe), which is relayed through buffers.
pub(crate) fn socket_of<S: 'static>(stream: &S) -> Option<Sock<'_>> {
    let any = stream as &dyn Any;
    if let Some(s) = any.downcast_ref::<TcpStream>() {
        return Some(Sock::Tcp(s));
    }
    if let Some(s) = any.downcast_ref::<UnixStream>() {
        return Some(Sock::Unix(s));
    }
    if let Some(r) = any.downcast_ref::<Rewind<TcpStream>>() {
        return r.bare().map(Sock::Tcp);
    }
    if let Some(r) = any.downcast_ref::<Rewind<UnixStream>>() {
        return r.bare().map(Sock::Unix);
    }
    None
}

impl Sock<'_> {
    /// Makes the coming close of a TCP socket a reset (`SO_LINGER` 0: RST, unsent bytes
    /// dropped), so that the peer sees a cut as an error, never as the other side's end.
    /// Returns the bytes the reset drops (those not yet sent), which the close record
    /// must not count as delivered. A Unix stream socket has no reset; it is
    /// closed as it is (0).
    pub(crate) fn reset_on_close(self) -> u64 {
        let Self::Tcp(s) = self else {
            return 0;
        };
        let dropped = unsent(s.as_fd());
        if let Err(e) = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO)) {
            tracing::debug!("SO_LINGER 0: {e}");
            return 0;
        }
        dropped
    }

    /// A second descriptor of a TCP socket, for [`reset_fd_on_close`] once the socket
    /// itself is out of reach (wrapped in TLS, say). `None` for a Unix socket, or when the
    /// descriptor cannot be duplicated.
    pub(crate) fn reset_handle(self) -> Option<OwnedFd> {
        match self {
            Self::Tcp(s) => s.as_fd().try_clone_to_owned().ok(),
            Self::Unix(_) => None,
        }
    }

    async fn ready(self, interest: Interest) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.ready(interest).await.map(drop),
            Self::Unix(s) => s.ready(interest).await.map(drop),
        }
    }

    /// Runs `f` (a non-blocking system call on this socket); `WouldBlock` clears the
    /// readiness `interest` so that the next [`Self::ready`] waits.
    fn try_io<R>(self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        match self {
            Self::Tcp(s) => s.try_io(interest, f),
            Self::Unix(s) => s.try_io(interest, f),
        }
    }

    /// Reads what is there into `buf`. A read that does not fill `buf` has drained the
    /// socket, so it clears the readiness as tokio's own `poll_read` does: the next
    /// [`Self::ready`] waits for more bytes (or the end, which stays ready once seen)
    /// instead of costing a `recv(2)` that answers `EAGAIN`.
    fn read_some(self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len();
        let mut short = 0;
        let read = self.try_io(Interest::READABLE, || {
            let n = nix::sys::socket::recv(
                self.fd().as_raw_fd(),
                buf,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            )
            .map_err(io::Error::from)?;
            if n > 0 && n < want {
                short = n;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match read {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && short > 0 => Ok(short),
            r => r,
        }
    }

    fn try_write(self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.try_write(buf),
            Self::Unix(s) => s.try_write(buf),
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Tcp(s) => s.as_fd(),
            Self::Unix(s) => s.as_fd(),
        }
    }

    /// Half-close: no more bytes will be written (`shutdown(SHUT_WR)`).
    fn shutdown_write(self) -> io::Result<()> {
        socket2::SockRef::from(&self.fd()).shutdown(std::net::Shutdown::Write)
    }
}

/// What both directions of one relay share. Atomics only because the future must be
/// `Send`; both directions run in the same task.
struct State {
    origin: Instant,
    /// Milliseconds since `origin` when the last byte moved.
    last: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
    first_end: OnceLock<CloseReason>,
}

impl State {
    fn new() -> Self {
        Self {
            origin: Instant::now(),
            last: AtomicU64::new(0),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            first_end: OnceLock::new(),
        }
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
    /// The close reason once both directions have ended.
    /// The close reason once both directions have ended, or one failed (a reset or a
    /// failed write ends the whole tunnel at once: the other side may never speak again).
    fn reason(&self, ended: io::Result<((), ())>) -> CloseReason {
        match ended {
            Ok(_) => self
                .first_end
                .get()
                .copied()
                .unwrap_or(CloseReason::ClientClosed),
            Err(_) => CloseReason::Error,
        }
    }

    fn outcome(&self, close_reason: CloseReason) -> RelayOutcome {
        RelayOutcome {
            up: self.up.load(Ordering::Relaxed),
            down: self.down.load(Ordering::Relaxed),
            close_reason,
        }
    }
}

/// Resolves once no byte has moved for `idle`. For a socket relay (`socks`), bytes still
/// leaving our send queues count as movement: a slow reader drains them while we have
/// nothing new to write, and must not be cut off as idle; a reader that takes nothing is.
async fn idle_watch(state: &State, idle: Duration, socks: Option<(Sock<'_>, Sock<'_>)>) {
    let queued = |(a, b): (Sock<'_>, Sock<'_>)| send_queue(a.fd()) + send_queue(b.fd());
    // A tunnel starts with (next to) nothing queued: counting from zero spares every
    // tunnel two ioctls at its start; a queue that was full from the start only gets one
    // more idle period.
    let mut last_queued = socks.map(|_| 0);
    loop {
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
        tokio::time::sleep_until(deadline).await;
    }
}

nix::ioctl_read_bad!(
    /// `SIOCOUTQ` (= `TIOCOUTQ`, socket(7)/tcp(7)/unix(7)): bytes in a socket's send queue.
    siocoutq,
    libc::TIOCOUTQ,
    libc::c_int
);

nix::ioctl_read_bad!(
    /// `SIOCOUTQNSD` (tcp(7)): bytes in a TCP socket's send queue not yet sent.
    siocoutqnsd,
    libc::SIOCOUTQNSD,
    libc::c_int
);

/// Bytes written to a TCP socket that were not yet sent (0 if the kernel will not say):
/// what a reset drops. Bytes sent but not yet acknowledged still reach the peer before
/// the reset.
fn unsent(fd: BorrowedFd<'_>) -> u64 {
    let mut queued: libc::c_int = 0;
    // SAFETY: `fd` is a live socket (borrowed for the call) and `queued` is a valid,
    // writable c_int, which is all SIOCOUTQNSD writes.
    let ok = unsafe { siocoutqnsd(fd.as_raw_fd(), &mut queued) }.is_ok();
    if ok {
        u64::try_from(queued).unwrap_or(0)
    } else {
        0
    }
}

/// Bytes written to the socket that its peer has not yet taken (0 if the kernel will not
/// say).
fn send_queue(fd: BorrowedFd<'_>) -> u64 {
    let mut queued: libc::c_int = 0;
    // SAFETY: `fd` is a live socket (borrowed for the call) and `queued` is a valid,
    // writable c_int, which is all SIOCOUTQ writes.
    let ok = unsafe { siocoutq(fd.as_raw_fd(), &mut queued) }.is_ok();
    if ok {
        u64::try_from(queued).unwrap_or(0)
    } else {
        0
    }
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
    let mut buf = vec![0u8; BUF_START];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            let _ = state.first_end.set(end_name);
            // Pass the half-close on; the other direction keeps going.
            let _ = w.shutdown().await;
            return Ok(());
        }
        w.write_all(&buf[..n]).await?;
        state.moved(count, n);
        if n == buf.len() && buf.len() < BUF_MAX {
            // Data arrives faster than we read it: grow once the bytes are sent.
            buf = vec![0u8; (buf.len() * 4).min(BUF_MAX)];
        }
    }
}

/// One direction between two sockets: copy through a growing buffer, then splice once a
/// read fills the largest buffer. A kernel that refuses the splice keeps the copy.
async fn pump_sockets(
    from: Sock<'_>,
    to: Sock<'_>,
    count: &AtomicU64,
    state: &State,
    end_name: CloseReason,
) -> io::Result<()> {
    // The buffer exists only while bytes flow: it is allocated when the socket is readable
    // and freed when a read finds it drained, so an idle tunnel holds no buffer at all.
    // `size` remembers how large the traffic made it (it grows while reads fill it).
    let mut buf: Vec<u8> = Vec::new();
    let mut size = BUF_START;
    let mut pipe: Option<Pipe> = None;
    // `spliced`: bytes have gone through the pipe; `refused`: splice is not for us.
    let (mut spliced, mut refused) = (false, false);
    loop {
        if let Some(p) = &pipe {
            match splice_once(from, to, p, count, state).await {
                Ok(Spliced::Moved { trickled }) => {
                    spliced = true;
                    if trickled {
                        // The reader takes bytes in driblets: each splice into its socket
                        // moves a few bytes and wakes us again, where a buffered write
                        // waits for a third of the send buffer. The bottleneck is the
                        // reader, so splicing gains nothing: copy from now on.
                        pipe = None;
                        refused = true;
                    }
                }
                // splice(2) moved nothing although the socket was readable (or at its
                // end). It never moves past TCP urgent data (the "mark"), which only a
                // read passes (the urgent byte is dropped, as by a plain read): read once
                // through a buffer. A 0 here is the real end of the stream.
                Ok(Spliced::Nothing) => {
                    // Boxed: rare, and every tunnel task would carry it inline.
                    if Box::pin(drain_by_reading(from, to, count, state)).await? {
                        break;
                    }
                }
                // Nothing is in the pipe yet: copying loses no byte.
                Err(e) if !spliced && e.kind() == io::ErrorKind::Unsupported => {
                    pipe = None;
                    refused = true;
                }
                Err(e) => return Err(e),
            }
            continue;
        }
        from.ready(Interest::READABLE).await?;
        if buf.len() != size {
            buf = vec![0u8; size];
        }
        let n = match from.read_some(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                buf = Vec::new(); // drained: idle until the next readiness
                continue;
            }
            Err(e) => return Err(e),
        };
        write_all(to, &buf[..n], count, state).await?;
        if n < size {
            buf = Vec::new(); // a short read drained the socket: idle without a buffer
        } else if size < BUF_MAX {
            size = (size * 4).min(BUF_MAX);
        } else if !refused {
            // A bulk transfer: move to splice; the buffer is no longer needed.
            match Pipe::new() {
                Some(p) => {
                    pipe = Some(p);
                    buf = Vec::new();
                }
                None => refused = true, // out of descriptors or pipe quota: keep copying
            }
        }
    }
    // Pass the half-close on; the other direction keeps going. When it has ended already,
    // the relay is over and both sockets close now, which sends the FIN anyway.
    if state.first_end.set(end_name).is_ok() {
        let _ = to.shutdown_write();
    }
    Ok(())
}

/// Reads `from` dry with plain `recv(2)` calls and writes what comes to `to`; true at the
/// end of the stream. Used when splice(2) moved nothing although `from` was readable: it
/// stops at TCP urgent data (the "mark"), which a read passes (dropping the urgent byte,
/// as any plain read does). The reads bypass tokio's readiness (which splice's EAGAIN has
/// just cleared), and go on until EAGAIN, so that waiting for the next readiness edge
/// cannot miss bytes already queued.
async fn drain_by_reading(
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
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes all of `bytes`, counting each write as it lands (a relay cancelled mid-write
/// still reports exactly what was delivered).
async fn write_all(
    to: Sock<'_>,
    mut bytes: &[u8],
    count: &AtomicU64,
    state: &State,
) -> io::Result<()> {
    while !bytes.is_empty() {
        to.ready(Interest::WRITABLE).await?;
        match to.try_write(bytes) {
            Ok(n) => {
                bytes = &bytes[n..];
                state.moved(count, n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A pipe used as the kernel-side buffer of one spliced direction (non-blocking ends).
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// The pipe's capacity: the most one splice into it may move.
    chunk: usize,
    /// Its place in [`PIPE_BUDGET`], given back on drop.
    _budget: PipeBudget,
}

/// Pipes (descriptor pairs) spliced tunnels may hold at once, process-wide (descriptors
/// are a process-wide resource): beyond it a direction keeps copying, so bulk transfers
/// can never take the descriptors that accepts and upstream connects need. Set at start
/// from the open-files limit ([`set_pipe_budget`]).
static PIPE_BUDGET: AtomicIsize = AtomicIsize::new(1024);

/// Sets how many pipes spliced tunnels may hold at once.
pub(crate) fn set_pipe_budget(pipes: u32) {
    PIPE_BUDGET.store(
        isize::try_from(pipes).unwrap_or(isize::MAX),
        Ordering::Release,
    );
}

/// One place in [`PIPE_BUDGET`].
struct PipeBudget;

impl PipeBudget {
    fn take() -> Option<Self> {
        if PIPE_BUDGET.fetch_sub(1, Ordering::AcqRel) > 0 {
            Some(Self)
        } else {
            PIPE_BUDGET.fetch_add(1, Ordering::AcqRel);
            None
        }
    }
}

impl Drop for PipeBudget {
    fn drop(&mut self) {
        PIPE_BUDGET.fetch_add(1, Ordering::AcqRel);
    }
}

/// Capacity asked for each pipe, and so the most bytes one `splice(2)` moves (and the most
/// kernel memory a stalled direction holds in it; pages are taken only while bytes sit in
/// the pipe).
const PIPE_SIZE: usize = 256 * 1024;

/// A pipe smaller than this is not worth it: the copy path moves 64 KiB per call. The
/// kernel hands out 8 KiB pipes once a user exceeds `/proc/sys/fs/pipe-user-pages-soft`.
const PIPE_MIN: usize = 64 * 1024;

/// Splices needed to empty one chunk out of the pipe beyond which the reader counts as
/// slow (a fast reader takes a chunk in one to three).
const TRICKLE_CALLS: usize = 16;

/// The most bytes one splice moves towards a Unix socket.
const UNIX_CHUNK: usize = 64 * 1024;

impl Pipe {
    /// A pipe of [`PIPE_SIZE`] (or at least [`PIPE_MIN`]); `None` when the system cannot
    /// give one (descriptors, pipe quota), and the direction keeps copying.
    fn new() -> Option<Self> {
        let budget = PipeBudget::take()?;
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).ok()?;
        let size = i32::try_from(PIPE_SIZE).unwrap_or(i32::MAX);
        let capacity = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(size))
            .or_else(|_| nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_GETPIPE_SZ))
            .ok()?;
        let chunk = usize::try_from(capacity).ok()?;
        (chunk >= PIPE_MIN).then_some(Self {
            read,
            write,
            chunk,
            _budget: budget,
        })
    }
}

/// What one [`splice_once`] did.
enum Spliced {
    /// Bytes went from `from` through the pipe to `to` (counted as they landed);
    /// `trickled`: `to` took them in many small pieces (a slow reader).
    Moved {
        /// More than [`TRICKLE_CALLS`] splices were needed to empty the pipe.
        trickled: bool,
    },
    /// Nothing moved: `from` was at its end, at TCP urgent data, or had no bytes after all.
    Nothing,
}

/// Moves one chunk: waits until `from` is readable, splices its bytes into the (empty)
/// pipe, then splices the pipe empty into `to`, counting each part as it lands.
async fn splice_once(
    from: Sock<'_>,
    to: Sock<'_>,
    pipe: &Pipe,
    count: &AtomicU64,
    state: &State,
) -> io::Result<Spliced> {
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    // A Unix socket takes a spliced chunk as a train of small buffers: large chunks stall
    // its reader (measured: 1 MiB halves the rate that 64 KiB reaches); TCP prefers large.
    let want = match to {
        Sock::Unix(_) => pipe.chunk.min(UNIX_CHUNK),
        Sock::Tcp(_) => pipe.chunk,
    };
    from.ready(Interest::READABLE).await?;
    // The pipe is empty here, so EAGAIN means the socket has no bytes for splice.
    let n = match from.try_io(Interest::READABLE, || {
        splice(from.fd(), None, &pipe.write, None, want, flags).map_err(io::Error::from)
    }) {
        Ok(0) => return Ok(Spliced::Nothing),
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Spliced::Nothing),
        // This pair of sockets cannot be spliced: the caller copies instead.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
            return Err(io::Error::new(io::ErrorKind::Unsupported, e));
        }
        Err(e) => return Err(e),
    };
    let mut left = n;
    let mut calls = 0usize;
    while left > 0 {
        to.ready(Interest::WRITABLE).await?;
        // The pipe holds `left` bytes, so EAGAIN can only mean the socket is full.
        match to.try_io(Interest::WRITABLE, || {
            splice(&pipe.read, None, to.fd(), None, left, flags).map_err(io::Error::from)
        }) {
            Ok(m) => {
                left -= m;
                calls += 1;
                state.moved(count, m);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Spliced::Moved {
        trickled: calls > TRICKLE_CALLS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tokio::io::duplex;

    #[tokio::test]
    async fn half_close_each_direction_ends_on_its_own() {
        let (client, mut client_peer) = duplex(64);
        let (upstream, mut upstream_peer) = duplex(64);
        let rx = CancellationToken::new();
        let task = tokio::spawn(relay_streams(client, upstream, Duration::from_secs(60), rx));

        client_peer.write_all(b"request").await.unwrap();
        client_peer.shutdown().await.unwrap(); // client half-closes
        let mut got = Vec::new();
        upstream_peer.read_to_end(&mut got).await.unwrap(); // EOF passed on
        assert_eq!(got, b"request");
        // The other direction still works after the client's half-close.
        upstream_peer.write_all(b"response!").await.unwrap();
        upstream_peer.shutdown().await.unwrap();
        let mut back = Vec::new();
        client_peer.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"response!");

        let out = task.await.unwrap();
        assert_eq!(
            (out.up, out.down, out.close_reason),
            (7, 9, CloseReason::ClientClosed)
        );
    }

    #[tokio::test]
    async fn bulk_transfer_grows_the_buffer_and_keeps_every_byte_in_order() {
        let (client, mut client_peer) = duplex(256 * 1024);
        let (upstream, mut upstream_peer) = duplex(256 * 1024);
        let rx = CancellationToken::new();
        let task = tokio::spawn(relay_streams(client, upstream, Duration::from_secs(60), rx));
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            client_peer.write_all(&sent).await.unwrap();
            client_peer.shutdown().await.unwrap();
            client_peer
        });
        let mut got = Vec::new();
        upstream_peer.read_to_end(&mut got).await.unwrap();
        assert!(got == data, "bytes differ");
        drop(upstream_peer);
        let _client_peer = writer.await.unwrap();
        let out = task.await.unwrap();
        assert_eq!(out.up, 3_000_000);
    }

    /// A connected pair of loopback TCP sockets.
    async fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
        (a.unwrap(), b.unwrap().0)
    }

    /// Bulk bytes both ways between a Unix-socket client and a TCP upstream: the relay
    /// moves from copying to splice(2) mid-stream and must keep every byte in order, pass
    /// each half-close on, and count exactly.
    #[tokio::test]
    async fn socket_relay_splices_bulk_transfers_both_ways_without_losing_a_byte() {
        let (client, mut client_peer) = UnixStream::pair().unwrap();
        let (upstream, mut upstream_peer) = tcp_pair().await;
        let rx = CancellationToken::new();
        let task = tokio::spawn(async move {
            // The client arrives as the listener hands it over: behind a consumed Rewind.
            let mut client = Rewind::new(Bytes::from_static(b"C"), client);
            let mut first = [0u8; 1];
            client.read_exact(&mut first).await.unwrap();
            assert!(
                socket_of(&client).is_some(),
                "a consumed Rewind is a plain socket"
            );
            relay(
                client,
                UpstreamStream::Plain(upstream),
                Duration::from_secs(60),
                rx,
            )
            .await
        });
        let up: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
        let down: Vec<u8> = (0..7_000_000u32).map(|i| (i % 241) as u8).collect();
        let (up_sent, down_sent) = (up.clone(), down.clone());
        let (mut cr, mut cw) = client_peer.split();
        let (mut ur, mut uw) = upstream_peer.split();
        let client_side = async {
            let send = async {
                cw.write_all(&up_sent).await.unwrap();
                cw.shutdown().await.unwrap();
            };
            let mut got = Vec::new();
            let recv = cr.read_to_end(&mut got);
            let ((), r) = tokio::join!(send, recv);
            r.unwrap();
            got
        };
        let upstream_side = async {
            let send = async {
                uw.write_all(&down_sent).await.unwrap();
                uw.shutdown().await.unwrap();
            };
            let mut got = Vec::new();
            let recv = ur.read_to_end(&mut got);
            let ((), r) = tokio::join!(send, recv);
            r.unwrap();
            got
        };
        let (client_got, upstream_got) = tokio::join!(client_side, upstream_side);
        assert!(upstream_got == up, "client -> upstream bytes differ");
        assert!(client_got == down, "upstream -> client bytes differ");
        let out = task.await.unwrap();
        assert_eq!((out.up, out.down), (5_000_000, 7_000_000));
        assert_ne!(out.close_reason, CloseReason::Error);
    }

    /// TCP urgent data (MSG_OOB) in the middle of a spliced stream: splice(2) stops at the
    /// urgent mark, so the relay must read past it. Every ordinary byte arrives (the
    /// urgent byte is dropped, as a plain read drops it) and is counted.
    #[tokio::test]
    async fn urgent_data_does_not_cut_a_spliced_stream_short() {
        let (client, client_peer) = tcp_pair().await;
        let (upstream, mut upstream_peer) = tcp_pair().await;
        let rx = CancellationToken::new();
        let task = tokio::spawn(relay(
            client,
            UpstreamStream::Plain(upstream),
            Duration::from_secs(60),
            rx,
        ));
        let before: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        let after: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 239) as u8).collect();
        let mut expected = before.clone();
        expected.extend_from_slice(&after);
        let writer = tokio::spawn(async move {
            let mut peer = client_peer;
            peer.write_all(&before).await.unwrap();
            socket2::SockRef::from(&peer)
                .send_out_of_band(b"!")
                .unwrap();
            peer.write_all(&after).await.unwrap();
            peer.shutdown().await.unwrap();
            peer
        });
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), upstream_peer.read_to_end(&mut got))
            .await
            .expect("the stream stalled at the urgent mark")
            .unwrap();
        assert_eq!(got.len(), expected.len(), "bytes lost at the urgent mark");
        assert!(got == expected, "bytes differ");
        drop(upstream_peer);
        drop(writer.await.unwrap());
        let out = task.await.unwrap();
        assert_eq!(out.up, expected.len() as u64);
    }

    /// A client that resets while the upstream is silent ends the tunnel at once (not
    /// after the idle timeout), with reason `error`.
    #[tokio::test]
    async fn a_reset_on_one_side_ends_the_whole_tunnel() {
        let (client, client_peer) = tcp_pair().await;
        let (upstream, _upstream_peer) = tcp_pair().await;
        let rx = CancellationToken::new();
        let task = tokio::spawn(relay(
            client,
            UpstreamStream::Plain(upstream),
            Duration::from_secs(600),
            rx,
        ));
        // SO_LINGER 0: close sends a reset.
        socket2::SockRef::from(&client_peer)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(client_peer);
        let out = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the tunnel outlived the reset")
            .unwrap();
        assert_eq!(out.close_reason, CloseReason::Error);
    }

    /// A relay stopped mid-transfer (shutdown) reports exactly the bytes the client got.
    #[tokio::test]
    async fn counts_are_exact_when_a_bulk_transfer_is_cut_off() {
        let (client, mut client_peer) = tcp_pair().await;
        let (upstream, mut upstream_peer) = tcp_pair().await;
        let tx = CancellationToken::new();
        let rx = tx.clone();
        let task = tokio::spawn(relay(
            client,
            UpstreamStream::Plain(upstream),
            Duration::from_secs(60),
            rx,
        ));
        let feeder = tokio::spawn(async move {
            let chunk = vec![7u8; 1 << 20];
            // Until the relay goes away.
            while upstream_peer.write_all(&chunk).await.is_ok() {}
        });
        // Read slowly so that chunks are part-written when the relay is stopped.
        let mut got = 0u64;
        let mut buf = vec![0u8; 16 * 1024];
        while got < 24 << 20 {
            got += client_peer.read(&mut buf).await.unwrap() as u64;
        }
        tx.cancel();
        let out = task.await.unwrap();
        assert_eq!(out.close_reason, CloseReason::Shutdown);
        loop {
            match client_peer.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n as u64,
            }
        }
        assert_eq!(out.down, got, "close record vs bytes the client received");
        feeder.abort();
    }

    /// A reader slower than the idle timeout's worth of socket buffer is still a live
    /// tunnel: bytes leaving the send queue count as activity. A reader that stops is cut.
    #[tokio::test]
    async fn a_slow_reader_is_not_idle_but_a_stopped_one_is() {
        // The reader's window is small, so its reads show as window updates; our side's
        // send buffer is large, so it reports writable only after a long drain: without
        // watching the send queue, the relay would see no activity for seconds.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let reader = tokio::net::TcpSocket::new_v4().unwrap();
        reader.set_recv_buffer_size(32 * 1024).unwrap();
        let (client_peer, accepted) =
            tokio::join!(reader.connect(l.local_addr().unwrap()), l.accept());
        let mut client_peer = client_peer.unwrap();
        let client = accepted.unwrap().0;
        socket2::SockRef::from(&client)
            .set_send_buffer_size(4 << 20)
            .unwrap();
        let (upstream, mut upstream_peer) = tcp_pair().await;
        let rx = CancellationToken::new();
        let idle = Duration::from_millis(1000);
        let task = tokio::spawn(relay(client, UpstreamStream::Plain(upstream), idle, rx));
        let feeder = tokio::spawn(async move {
            let chunk = vec![1u8; 1 << 20];
            for _ in 0..64 {
                if upstream_peer.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            upstream_peer
        });
        // Let the buffers fill, then read a little every 100 ms for 3 s (5 idle periods):
        // the relay writes nothing new in that time, only the queue drains.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut buf = vec![0u8; 8 * 1024];
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            client_peer.read_exact(&mut buf).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(
                !task.is_finished(),
                "a slowly read tunnel was closed as idle"
            );
        }
        // Stop reading: the tunnel is idle now.
        let out = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("a stopped reader kept the tunnel open")
            .unwrap();
        assert_eq!(out.close_reason, CloseReason::IdleTimeout);
        feeder.abort();
    }

    /// A tunnel whose replayed bytes are not yet read is not a plain socket: relaying it
    /// by file descriptor would skip them.
    #[tokio::test]
    async fn an_unconsumed_rewind_is_relayed_through_buffers() {
        let (a, _b) = UnixStream::pair().unwrap();
        let r = Rewind::new(Bytes::from_static(b"early"), a);
        assert!(socket_of(&r).is_none());
        let (c, _d) = duplex(8);
        assert!(socket_of(&c).is_none());
    }

    #[tokio::test]
    async fn socket_relay_passes_a_half_close_and_ends_on_idle() {
        let (client, mut client_peer) = UnixStream::pair().unwrap();
        let (upstream, mut upstream_peer) = tcp_pair().await;
        let rx = CancellationToken::new();
        let task = tokio::spawn(async move {
            relay(
                client,
                UpstreamStream::Plain(upstream),
                Duration::from_millis(300),
                rx,
            )
            .await
        });
        client_peer.write_all(b"request").await.unwrap();
        client_peer.shutdown().await.unwrap();
        let mut got = Vec::new();
        upstream_peer.read_to_end(&mut got).await.unwrap(); // EOF passed on
        assert_eq!(got, b"request");
        upstream_peer.write_all(b"late answer").await.unwrap();
        let mut back = [0u8; 11];
        client_peer.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"late answer");
        // The upstream never closes: the idle timeout ends the tunnel.
        let out = task.await.unwrap();
        assert_eq!(
            (out.up, out.down, out.close_reason),
            (7, 11, CloseReason::IdleTimeout)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_tunnel_is_closed_after_the_idle_timeout() {
        let (client, mut client_peer) = duplex(64);
        let (upstream, _upstream_peer) = duplex(64);
        let rx = CancellationToken::new();
        let task = tokio::spawn(relay_streams(client, upstream, Duration::from_secs(30), rx));
        client_peer.write_all(b"x").await.unwrap();
        let out = task.await.unwrap();
        assert_eq!((out.up, out.close_reason), (1, CloseReason::IdleTimeout));
    }

    #[tokio::test]
    async fn shutdown_signal_closes_a_live_tunnel() {
        let (client, _c) = duplex(64);
        let (upstream, _u) = duplex(64);
        let tx = CancellationToken::new();
        let rx = tx.clone();
        let task = tokio::spawn(relay_streams(
            client,
            upstream,
            Duration::from_secs(300),
            rx,
        ));
        tx.cancel();
        assert_eq!(task.await.unwrap().close_reason, CloseReason::Shutdown);
    }
}
