//! The sockets under a relay's streams: a plain TCP or Unix socket found behind a
//! stream (so the relay can splice), a reset on close, and the send-queue ioctls
//! (`SIOCOUTQ`, `SIOCOUTQNSD`) that tell a slow reader from a stopped one. The one file
//! of the crate with `unsafe`: the two ioctl calls, each with its SAFETY comment.

use std::any::Any;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use std::time::Duration;

use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

use crate::rewind::Rewind;

/// A plain socket under a stream: what [`relay_sockets`](super::relay_sockets) can move bytes between.
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

    pub(super) async fn ready(self, interest: Interest) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.ready(interest).await.map(drop),
            Self::Unix(s) => s.ready(interest).await.map(drop),
        }
    }

    /// Runs `f` (a non-blocking system call on this socket); `WouldBlock` clears the
    /// readiness `interest` so that the next [`Self::ready`] waits.
    pub(super) fn try_io<R>(
        self,
        interest: Interest,
        f: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R> {
        match self {
            Self::Tcp(s) => s.try_io(interest, f),
            Self::Unix(s) => s.try_io(interest, f),
        }
    }

    /// Reads what is there into `buf`. A read that does not fill `buf` has drained the
    /// socket, so it clears the readiness as tokio's own `poll_read` does: the next
    /// [`Self::ready`] waits for more bytes (or the end, which stays ready once seen)
    /// instead of costing a `recv(2)` that answers `EAGAIN`.
    pub(super) fn read_some(self, buf: &mut [u8]) -> io::Result<usize> {
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

    pub(super) fn try_write(self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.try_write(buf),
            Self::Unix(s) => s.try_write(buf),
        }
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Tcp(s) => s.as_fd(),
            Self::Unix(s) => s.as_fd(),
        }
    }

    /// Half-close: no more bytes will be written (`shutdown(SHUT_WR)`).
    pub(super) fn shutdown_write(self) -> io::Result<()> {
        socket2::SockRef::from(&self.fd()).shutdown(std::net::Shutdown::Write)
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
pub(super) fn unsent(fd: BorrowedFd<'_>) -> u64 {
    let mut queued: libc::c_int = 0;
    // SAFETY: `fd` is a live socket (borrowed for the call) and `queued` is a valid,
    // writable c_int, which is all SIOCOUTQNSD writes.
    let read = unsafe { siocoutqnsd(fd.as_raw_fd(), &mut queued) };
    read.map_or(0, |_| u64::try_from(queued).unwrap_or(0))
}

/// Bytes written to the socket that its peer has not yet taken (0 if the kernel will not
/// say).
pub(super) fn send_queue(fd: BorrowedFd<'_>) -> u64 {
    let mut queued: libc::c_int = 0;
    // SAFETY: `fd` is a live socket (borrowed for the call) and `queued` is a valid,
    // writable c_int, which is all SIOCOUTQ writes.
    let read = unsafe { siocoutq(fd.as_raw_fd(), &mut queued) };
    read.map_or(0, |_| u64::try_from(queued).unwrap_or(0))
}
