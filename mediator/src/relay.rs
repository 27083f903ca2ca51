//! Byte relay between a client and an upstream connection.
//!
//! Both directions run concurrently in one task with one buffer each (no per-chunk
//! allocation; a buffer starts small and grows only while reads fill it); each direction ends on its own (EOF is passed on as a write shutdown, so
//! half-closed connections work); a tunnel with no bytes in either direction for the idle
//! timeout is closed; a shutdown signal closes it at once. Byte counts survive errors, so
//! the close record is always accurate.

use std::any::Any;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::fcntl::{OFlag, SpliceFFlags, splice};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::rewind::Rewind;

/// First buffer size per direction: an idle or chatty tunnel never needs more.
const BUF_START: usize = 2 * 1024;
/// Largest buffer per direction: a read that fills the buffer grows it (x4) up to this,
/// so bulk transfers make few, large system calls.
const BUF_MAX: usize = 64 * 1024;

/// How a relay ended, and what crossed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayOutcome {
    /// Bytes client -> upstream.
    pub up: u64,
    /// Bytes upstream -> client.
    pub down: u64,
    /// `client_closed`, `upstream_closed`, `idle_timeout`, `error` or `shutdown`.
    pub close_reason: &'static str,
}

impl RelayOutcome {
    /// A connection that ended before any byte was relayed, for `reason`.
    pub fn ended(close_reason: &'static str) -> Self {
        Self {
            up: 0,
            down: 0,
            close_reason,
        }
    }
}

/// Relays until both directions have ended, the idle timeout passes, or `closing` turns
/// true. When `client` is a plain socket (see [`socket_of`]) the bytes move with
/// [`relay_sockets`]; otherwise through buffers.
pub async fn relay<C>(
    client: C,
    upstream: TcpStream,
    idle: Duration,
    closing: watch::Receiver<bool>,
) -> RelayOutcome
where
    C: AsyncRead + AsyncWrite + Unpin + 'static,
{
    match socket_of(&client) {
        Some(sock) => relay_sockets(sock, Sock::Tcp(&upstream), idle, closing).await,
        None => relay_streams(client, upstream, idle, closing).await,
    }
}

/// Relays between two streams through one buffer per direction.
pub async fn relay_streams<C, U>(
    client: C,
    upstream: U,
    idle: Duration,
    closing: watch::Receiver<bool>,
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
            tokio::join!(
                pump(&mut cr, &mut uw, &state.up, &state, "client_closed"),
                pump(&mut ur, &mut cw, &state.down, &state, "upstream_closed"),
            )
        } => state.reason(both),
        () = idle_watch(&state, idle) => "idle_timeout",
        () = closing_signal(closing) => "shutdown",
    };
    state.outcome(reason)
}

/// Relays between two sockets without splitting them: each direction waits for readiness
/// on the shared socket. A direction starts by copying through a small buffer; once reads
/// fill the largest buffer (a bulk transfer) it moves to `splice(2)` through a pipe of its
/// own, so the bytes go socket -> pipe -> socket inside the kernel, never through our
/// memory. Idle and chatty tunnels never create a pipe.
pub async fn relay_sockets(
    client: Sock<'_>,
    upstream: Sock<'_>,
    idle: Duration,
    closing: watch::Receiver<bool>,
) -> RelayOutcome {
    let state = State::new();
    let reason = tokio::select! {
        both = async {
            tokio::join!(
                pump_sockets(client, upstream, &state.up, &state, "client_closed"),
                pump_sockets(upstream, client, &state.down, &state, "upstream_closed"),
            )
        } => state.reason(both),
        () = idle_watch(&state, idle) => "idle_timeout",
        () = closing_signal(closing) => "shutdown",
    };
    state.outcome(reason)
}

/// A plain socket under a stream: what [`relay_sockets`] can move bytes between.
#[derive(Debug, Clone, Copy)]
pub enum Sock<'a> {
    /// A TCP connection.
    Tcp(&'a TcpStream),
    /// A Unix stream connection.
    Unix(&'a UnixStream),
}

/// The plain socket under `stream`: a [`TcpStream`] or [`UnixStream`], bare or wrapped in a
/// [`Rewind`] whose replayed bytes are all consumed. `None` for anything else (TLS, an
/// upgraded hyper connection, an in-process pipe), which is relayed through buffers.
pub fn socket_of<S: 'static>(stream: &S) -> Option<Sock<'_>> {
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

    fn try_read(self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.try_read(buf),
            Self::Unix(s) => s.try_read(buf),
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
    first_end: OnceLock<&'static str>,
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
        let since = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(since, Ordering::Relaxed);
    }
}

impl State {
    /// The close reason once both directions have ended.
    fn reason(&self, (a, b): (io::Result<()>, io::Result<()>)) -> &'static str {
        match (a, b) {
            (Ok(()), Ok(())) => self.first_end.get().copied().unwrap_or("client_closed"),
            _ => "error",
        }
    }

    fn outcome(&self, close_reason: &'static str) -> RelayOutcome {
        RelayOutcome {
            up: self.up.load(Ordering::Relaxed),
            down: self.down.load(Ordering::Relaxed),
            close_reason,
        }
    }
}

/// Resolves once no byte has moved for `idle`.
async fn idle_watch(state: &State, idle: Duration) {
    loop {
        let last = Duration::from_millis(state.last.load(Ordering::Relaxed));
        let deadline = state.origin + last + idle;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// Resolves once `closing` turns true; never if its sender is dropped first.
async fn closing_signal(mut closing: watch::Receiver<bool>) {
    if *closing.borrow() {
        return;
    }
    while closing.changed().await.is_ok() {
        if *closing.borrow() {
            return;
        }
    }
    std::future::pending::<()>().await;
}

async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    count: &AtomicU64,
    state: &State,
    end_name: &'static str,
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
    end_name: &'static str,
) -> io::Result<()> {
    let mut buf = vec![0u8; BUF_START];
    let mut pipe: Option<Pipe> = None;
    // `spliced`: bytes have gone through the pipe; `refused`: splice is not for us.
    let (mut spliced, mut refused) = (false, false);
    loop {
        if let Some(p) = &pipe {
            match splice_once(from, to, p).await {
                Ok(0) => break,
                Ok(n) => {
                    spliced = true;
                    state.moved(count, n);
                }
                // Nothing is in the pipe yet: copying loses no byte.
                Err(e) if !spliced && e.kind() == io::ErrorKind::Unsupported => {
                    pipe = None;
                    refused = true;
                    buf = vec![0u8; BUF_MAX];
                }
                Err(e) => return Err(e),
            }
            continue;
        }
        from.ready(Interest::READABLE).await?;
        let n = match from.try_read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        write_all(to, &buf[..n]).await?;
        state.moved(count, n);
        if n == buf.len() {
            if buf.len() < BUF_MAX {
                buf = vec![0u8; (buf.len() * 4).min(BUF_MAX)];
            } else if !refused {
                // A bulk transfer: move to splice; the buffer is no longer needed.
                match Pipe::new() {
                    Ok(p) => {
                        pipe = Some(p);
                        buf = Vec::new();
                    }
                    Err(_) => refused = true, // e.g. out of descriptors: keep copying
                }
            }
        }
    }
    let _ = state.first_end.set(end_name);
    // Pass the half-close on; the other direction keeps going.
    let _ = to.shutdown_write();
    Ok(())
}

async fn write_all(to: Sock<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        to.ready(Interest::WRITABLE).await?;
        match to.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
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
}

/// Capacity asked for each pipe, and so the most bytes one `splice(2)` moves. Pages are
/// taken only while bytes sit in the pipe. If the system refuses the size
/// (`/proc/sys/fs/pipe-max-size`, or the user's pipe quota), the pipe keeps its default.
const PIPE_SIZE: usize = 1 << 20;

/// The most bytes one splice moves towards a Unix socket.
const UNIX_CHUNK: usize = 64 * 1024;

impl Pipe {
    fn new() -> io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        let size = i32::try_from(PIPE_SIZE).unwrap_or(i32::MAX);
        let capacity = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(size))
            .or_else(|_| nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_GETPIPE_SZ))?;
        Ok(Self {
            read,
            write,
            chunk: usize::try_from(capacity).unwrap_or(4096).max(4096),
        })
    }
}

/// Moves one chunk: waits until `from` has bytes, splices them into the (empty) pipe, then
/// splices the pipe empty into `to`. Returns the bytes moved; 0 at end of stream.
async fn splice_once(from: Sock<'_>, to: Sock<'_>, pipe: &Pipe) -> io::Result<usize> {
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    // A Unix socket takes a spliced chunk as a train of small buffers: large chunks stall
    // its reader (measured: 1 MiB halves the rate that 64 KiB reaches); TCP prefers large.
    let want = match to {
        Sock::Unix(_) => pipe.chunk.min(UNIX_CHUNK),
        Sock::Tcp(_) => pipe.chunk,
    };
    let n = loop {
        from.ready(Interest::READABLE).await?;
        // The pipe is empty here, so EAGAIN can only mean the socket has no bytes.
        match from.try_io(Interest::READABLE, || {
            splice(from.fd(), None, &pipe.write, None, want, flags).map_err(io::Error::from)
        }) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // This pair of sockets cannot be spliced: the caller copies instead.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                return Err(io::Error::new(io::ErrorKind::Unsupported, e));
            }
            Err(e) => return Err(e),
        }
    };
    let mut left = n;
    while left > 0 {
        to.ready(Interest::WRITABLE).await?;
        // The pipe holds `left` bytes, so EAGAIN can only mean the socket is full.
        match to.try_io(Interest::WRITABLE, || {
            splice(&pipe.read, None, to.fd(), None, left, flags).map_err(io::Error::from)
        }) {
            Ok(m) => left -= m,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
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
        let (_tx, rx) = watch::channel(false);
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
            (7, 9, "client_closed")
        );
    }

    #[tokio::test]
    async fn bulk_transfer_grows_the_buffer_and_keeps_every_byte_in_order() {
        let (client, mut client_peer) = duplex(256 * 1024);
        let (upstream, mut upstream_peer) = duplex(256 * 1024);
        let (_tx, rx) = watch::channel(false);
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
        let (_tx, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            // The client arrives as the listener hands it over: behind a consumed Rewind.
            let mut client = Rewind::new(Bytes::from_static(b"C"), client);
            let mut first = [0u8; 1];
            client.read_exact(&mut first).await.unwrap();
            assert!(
                socket_of(&client).is_some(),
                "a consumed Rewind is a plain socket"
            );
            relay(client, upstream, Duration::from_secs(60), rx).await
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
        assert_ne!(out.close_reason, "error");
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
        let (_tx, rx) = watch::channel(false);
        let task =
            tokio::spawn(
                async move { relay(client, upstream, Duration::from_millis(300), rx).await },
            );
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
            (7, 11, "idle_timeout")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_tunnel_is_closed_after_the_idle_timeout() {
        let (client, mut client_peer) = duplex(64);
        let (upstream, _upstream_peer) = duplex(64);
        let (_tx, rx) = watch::channel(false);
        let task = tokio::spawn(relay_streams(client, upstream, Duration::from_secs(30), rx));
        client_peer.write_all(b"x").await.unwrap();
        let out = task.await.unwrap();
        assert_eq!((out.up, out.close_reason), (1, "idle_timeout"));
    }

    #[tokio::test]
    async fn shutdown_signal_closes_a_live_tunnel() {
        let (client, _c) = duplex(64);
        let (upstream, _u) = duplex(64);
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(relay_streams(
            client,
            upstream,
            Duration::from_secs(300),
            rx,
        ));
        tx.send(true).unwrap();
        assert_eq!(task.await.unwrap().close_reason, "shutdown");
    }
}
