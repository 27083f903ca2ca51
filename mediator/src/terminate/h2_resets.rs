//! The malformed HTTP/2 requests of a terminated tunnel that never reach the mediator's
//! checks: the HTTP/2 layer (the `h2` crate under hyper) refuses a request whose
//! pseudo-headers are malformed (an `:authority` or `:path` that is not URI syntax, a
//! missing `:method`; RFC 9113 section 8.1.1) by resetting its stream with
//! `PROTOCOL_ERROR` before any service sees it, so nothing could answer `421` or log it.
//! [`ResetWatch`] reads the frame headers the mediator's own HTTP/2 server writes to the
//! client (RFC 9113 section 4.1) and reports every `RST_STREAM` (type `0x3`) with error
//! code `PROTOCOL_ERROR` (`0x1`, IANA "HTTP/2 Error Code" registry), so that the tunnel
//! logs a decision line for it. hyper itself never resets a server stream with that code
//! (it uses `INTERNAL_ERROR`, `CANCEL`, `NO_ERROR`), so each one is a malformed request.
//!
//! It reads only what the mediator writes, never the client's bytes, changes no byte, and
//! holds at most one frame header (9 bytes) and one error code (4 bytes) of state.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `RST_STREAM` (RFC 9113 section 6.4).
const RST_STREAM: u8 = 0x3;
/// `PROTOCOL_ERROR` (RFC 9113 section 7).
const PROTOCOL_ERROR: u32 = 0x1;
/// A frame header: length (24 bits), type, flags, stream identifier (31 bits).
const HEAD: usize = 9;

/// What is told of each reset stream: its identifier.
pub(crate) type OnReset = Box<dyn FnMut(u32) + Send>;

/// An I/O stream whose written HTTP/2 frames are watched for `RST_STREAM(PROTOCOL_ERROR)`;
/// `on_reset` is called with each such stream's identifier. Without a callback (an
/// HTTP/1.1 connection) it only passes bytes through.
pub(crate) struct ResetWatch<S> {
    inner: S,
    watch: Option<(FrameScan, OnReset)>,
}

impl<S> ResetWatch<S> {
    /// `inner`, watched when `on_reset` is given.
    pub(crate) fn new(inner: S, on_reset: Option<OnReset>) -> Self {
        Self {
            inner,
            watch: on_reset.map(|f| (FrameScan::default(), f)),
        }
    }

    fn saw(&mut self, bufs: &[IoSlice<'_>], mut written: usize) {
        let Some((scan, on_reset)) = &mut self.watch else {
            return;
        };
        for buf in bufs {
            if written == 0 {
                break;
            }
            let n = written.min(buf.len());
            scan.feed(&buf[..n], on_reset);
            written -= n;
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ResetWatch<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ResetWatch<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.saw(&[IoSlice::new(buf)], n);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            self.saw(bufs, n);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Where the watch is in the written frame sequence (the server's side of an HTTP/2
/// connection starts with a frame: its preface is a `SETTINGS` frame, RFC 9113 section
/// 3.4).
#[derive(Debug, Default)]
struct FrameScan {
    head: [u8; HEAD],
    /// Bytes of `head` seen; `HEAD` while in a payload.
    head_len: usize,
    /// Payload bytes of the current frame still to come.
    left: usize,
    /// The current frame is an `RST_STREAM`: its stream and the error code so far.
    reset: Option<(u32, [u8; 4], usize)>,
}

impl FrameScan {
    /// Reads `bytes`, the next written ones, calling `on_reset` for each completed
    /// `RST_STREAM(PROTOCOL_ERROR)`.
    fn feed(&mut self, mut bytes: &[u8], on_reset: &mut dyn FnMut(u32)) {
        while !bytes.is_empty() {
            if self.head_len < HEAD {
                let n = (HEAD - self.head_len).min(bytes.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
                self.head_len += n;
                bytes = &bytes[n..];
                if self.head_len == HEAD {
                    let h = self.head;
                    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    self.left = len;
                    self.reset = (h[3] == RST_STREAM && len == 4).then_some((stream, [0; 4], 0));
                    if len == 0 {
                        self.head_len = 0;
                    }
                }
                continue;
            }
            let n = self.left.min(bytes.len());
            if let Some((_, code, have)) = &mut self.reset {
                let take = n.min(4 - *have);
                code[*have..*have + take].copy_from_slice(&bytes[..take]);
                *have += take;
            }
            self.left -= n;
            bytes = &bytes[n..];
            if self.left == 0 {
                if let Some((stream, code, 4)) = self.reset.take()
                    && u32::from_be_bytes(code) == PROTOCOL_ERROR
                {
                    on_reset(stream);
                }
                self.head_len = 0;
            }
        }
    }
}

/// The streams of the completed `RST_STREAM(PROTOCOL_ERROR)` frames in `bytes`, fed to
/// one scan in writes of `step` bytes (at least one): what the fuzz target compares.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn resets_in(bytes: &[u8], step: usize) -> Vec<u32> {
    let mut scan = FrameScan::default();
    let mut found = Vec::new();
    for chunk in bytes.chunks(step.max(1)) {
        scan.feed(chunk, &mut |s| found.push(s));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn protocol_error_resets_are_found_however_the_writes_are_split() {
        let mut bytes = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]); // SETTINGS
        bytes.extend(frame(0x4, 0x1, 0, &[])); // SETTINGS ack, empty
        bytes.extend(frame(0x1, 0x4, 1, &[0x88])); // HEADERS :status 200
        bytes.extend(frame(0x0, 0x1, 1, &[0x03; 300])); // DATA, whose bytes look like resets
        bytes.extend(frame(RST_STREAM, 0, 3, &1u32.to_be_bytes())); // PROTOCOL_ERROR
        bytes.extend(frame(RST_STREAM, 0, 5, &8u32.to_be_bytes())); // CANCEL
        bytes.extend(frame(RST_STREAM, 0, 7, &1u32.to_be_bytes()));
        bytes.extend(frame(0x7, 0, 0, &[0, 0, 0, 7, 0, 0, 0, 1])); // GOAWAY, not a reset
        for step in [1, 2, 3, 4, 5, 9, 13, 64, bytes.len()] {
            let mut scan = FrameScan::default();
            let mut found = Vec::new();
            for chunk in bytes.chunks(step) {
                scan.feed(chunk, &mut |s| found.push(s));
            }
            assert_eq!(found, [3, 7], "writes of {step} bytes");
        }
    }

    #[test]
    fn vectored_writes_count_only_what_was_written() {
        let reset = frame(RST_STREAM, 0, 9, &1u32.to_be_bytes());
        let mut found = Vec::new();
        let mut watch = ResetWatch::new((), Some(Box::new(|_| {}) as OnReset));
        let (a, b) = reset.split_at(6);
        // The first write took 10 bytes of the two buffers; the rest follows.
        watch.saw(&[IoSlice::new(a), IoSlice::new(b)], 10);
        let Some((scan, _)) = &mut watch.watch else {
            panic!("watched");
        };
        scan.feed(&reset[10..], &mut |s| found.push(s));
        assert_eq!(found, [9]);
    }
}
