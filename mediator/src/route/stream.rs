//! The stream a route yields: a plain TCP connection (direct, or through an HTTP or SOCKS5
//! parent) or TLS to an HTTPS parent with the tunnel inside it. The relay splices plain
//! sockets (`crate::relay`) and copies anything else, so the plain case stays a bare
//! [`TcpStream`].

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// An upstream connection.
#[derive(Debug)]
pub(crate) enum UpstreamStream {
    /// A TCP connection: to the destination, or a tunnel through a plain parent.
    Plain(TcpStream),
    /// TLS to an HTTPS parent; the bytes inside are the tunnel (or absolute-form requests).
    /// Boxed: the TLS state is large and most connections are plain.
    Tls(Box<TlsStream<TcpStream>>),
}

impl UpstreamStream {
    /// The TCP connection under the stream.
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Tls(s) => s.get_ref().0,
        }
    }

    /// The local address of the TCP connection (SOCKS5 BND.ADDR).
    ///
    /// # Errors
    /// The socket's error.
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().local_addr()
    }

    /// Waits until the upstream has something to read: bytes on the socket, or (TLS)
    /// plaintext already decrypted and buffered. Through TLS, a record that carries no
    /// application data (a late session ticket) also counts: the parent's records before
    /// its answer to CONNECT were consumed with that answer, so this is rare.
    ///
    /// # Errors
    /// The socket's error.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        match self {
            Self::Plain(s) => s.readable().await,
            Self::Tls(s) => {
                let (tcp, tls) = s.get_ref();
                if tls.wants_read() {
                    tcp.readable().await
                } else {
                    Ok(())
                }
            }
        }
    }
}

impl From<TcpStream> for UpstreamStream {
    fn from(s: TcpStream) -> Self {
        Self::Plain(s)
    }
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }
}
