//! A stream whose bytes pass through unchanged while a [`Tap`] is told what passed: the
//! byte counts (`crate::counting`), the HTTP/2 refusals the mediator writes
//! (`crate::terminate::h2_resets`), the end of a switched stream (`terminate/upgrade.rs`).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a [`Tapped`] stream tells of its reads, writes and flushes as they complete; each
/// gets the inner stream's result and gives back the one its caller sees (by default the
/// same). A shutdown is passed through untold.
pub(crate) trait Tap {
    /// A read ended with `polled`, having put `read` in the caller's buffer.
    fn read(&mut self, read: &[u8], polled: io::Result<()>) -> io::Result<()> {
        let _ = read;
        polled
    }

    /// A write of `bufs` ended with `polled` (the bytes taken, from the start of `bufs`).
    fn write(&mut self, bufs: &[IoSlice<'_>], polled: io::Result<usize>) -> io::Result<usize> {
        let _ = bufs;
        polled
    }

    /// A flush ended with `polled`.
    fn flush(&mut self, polled: io::Result<()>) -> io::Result<()> {
        polled
    }
}

/// `inner`, its completed reads, writes and flushes told to `tap`.
#[derive(Debug)]
pub(crate) struct Tapped<S, T> {
    inner: S,
    tap: T,
}

impl<S, T> Tapped<S, T> {
    /// `inner`, told to `tap`.
    pub(crate) fn new(inner: S, tap: T) -> Self {
        Self { inner, tap }
    }

    /// The tap.
    pub(crate) fn tap(&self) -> &T {
        &self.tap
    }
}

impl<S: AsyncRead + Unpin, T: Tap + Unpin> AsyncRead for Tapped<S, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        polled.map(|r| this.tap.read(&buf.filled()[before..], r))
    }
}

impl<S: AsyncWrite + Unpin, T: Tap + Unpin> AsyncWrite for Tapped<S, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        polled.map(|r| this.tap.write(&[IoSlice::new(buf)], r))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        polled.map(|r| this.tap.write(bufs, r))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        polled.map(|r| this.tap.flush(r))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
