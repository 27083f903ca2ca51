//! A stream with bytes already read from it put back in front: the listener's first-byte
//! sniff (SOCKS5 or HTTP) and the SNI gate's ClientHello (replayed into the TLS acceptor)
//! both read ahead, and the protocol code after them must see every byte.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner`, with `prefix` read first. Writes go straight to `inner`.
#[derive(Debug)]
pub(crate) struct Rewind<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    /// The inner stream, once every replayed byte has been read (`None` before).
    pub(crate) fn bare(&self) -> Option<&S> {
        self.prefix.is_empty().then_some(&self.inner)
    }

    /// Wraps `inner` so that reads return `prefix` before anything else.
    pub(crate) fn new(prefix: impl Into<Bytes>, inner: S) -> Self {
        Self {
            prefix: prefix.into(),
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() && buf.remaining() > 0 {
            let n = buf.remaining().min(self.prefix.len());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            if self.prefix.is_empty() {
                // Release the buffer now: the stream may live for hours as a tunnel.
                self.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn prefix_comes_first_then_the_stream_in_small_reads() {
        let (mut a, b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b"world")
            .await
            .unwrap();
        drop(a);
        let mut r = Rewind::new(&b"hello "[..], b);
        let mut two = [0u8; 2];
        r.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"he");
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"llo world");
    }
}
