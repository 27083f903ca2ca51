//! The zero-copy relay between two plain sockets: `splice(2)` through a pipe per
//! direction, within a process-wide pipe budget (a pipe costs two descriptors); a
//! direction falls back to buffers when the kernel will not splice.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};

use nix::fcntl::{OFlag, SpliceFFlags, splice};
use tokio::io::Interest;

use super::sock::Sock;
use super::{BUF_MAX, BUF_START, State, drain_by_reading, write_all};
use crate::vocab::CloseReason;

/// One direction between two sockets: copy through a growing buffer, then splice once a
/// read fills the largest buffer. A kernel that refuses the splice keeps the copy.
pub(super) async fn pump_sockets(
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
        from.ready(Interest::READABLE)
            .await
            .map_err(|e| state.failed_on(from, e))?;
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
            Err(e) => return Err(state.failed_on(from, e)),
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

/// A pipe used as the kernel-side buffer of one spliced direction (non-blocking ends).
pub(super) struct Pipe {
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
pub(super) static PIPE_BUDGET: AtomicIsize = AtomicIsize::new(1024);

/// Sets how many pipes spliced tunnels may hold at once.
pub(crate) fn set_pipe_budget(pipes: u32) {
    PIPE_BUDGET.store(
        isize::try_from(pipes).unwrap_or(isize::MAX),
        Ordering::Release,
    );
}

/// One place in [`PIPE_BUDGET`].
pub(super) struct PipeBudget;

impl PipeBudget {
    pub(super) fn take() -> Option<Self> {
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
pub(super) const PIPE_SIZE: usize = 256 * 1024;

/// A pipe smaller than this is not worth it: the copy path moves 64 KiB per call. The
/// kernel hands out 8 KiB pipes once a user exceeds `/proc/sys/fs/pipe-user-pages-soft`.
pub(super) const PIPE_MIN: usize = 64 * 1024;

/// Splices needed to empty one chunk out of the pipe beyond which the reader counts as
/// slow (a fast reader takes a chunk in one to three).
pub(super) const TRICKLE_CALLS: usize = 16;

/// The most bytes one splice moves towards a Unix socket.
pub(super) const UNIX_CHUNK: usize = 64 * 1024;

impl Pipe {
    /// A pipe of [`PIPE_SIZE`] (or at least [`PIPE_MIN`]); `None` when the system cannot
    /// give one (descriptors, pipe quota), and the direction keeps copying.
    pub(super) fn new() -> Option<Self> {
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
pub(super) enum Spliced {
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
    from.ready(Interest::READABLE)
        .await
        .map_err(|e| state.failed_on(from, e))?;
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
        Err(e) => return Err(state.failed_on(from, e)),
    };
    let mut left = n;
    let mut calls = 0usize;
    while left > 0 {
        to.ready(Interest::WRITABLE)
            .await
            .map_err(|e| state.failed_on(to, e))?;
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
            Err(e) => return Err(state.failed_on(to, e)),
        }
    }
    Ok(Spliced::Moved {
        trickled: calls > TRICKLE_CALLS,
    })
}
