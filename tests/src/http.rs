//! A deliberately small raw HTTP/1.1 client: the tests need to send requests that real
//! clients refuse to send (two `Host` headers, origin-form to a proxy, odd CONNECT
//! targets) and to talk over the per-authority Unix socket, which curl cannot use as an
//! HTTP proxy. Requests are written byte for byte as given; responses are parsed just
//! enough (status line, headers, body by `Content-Length`, chunked, or EOF).
//!
//! After a `2xx` answer to CONNECT the same [`HttpConn`] is the tunnel: keep using it
//! (its read buffer may already hold tunnelled bytes).

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine as _;
use serde_json::Value;
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf,
};
use tokio::net::{TcpStream, UnixStream};

/// Deadline for any single read of a response.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// Largest response head this client accepts.
const MAX_HEAD: usize = 256 * 1024;

/// `Basic base64(user:token)`, the value of a `Proxy-Authorization` header.
pub fn basic_auth(user: &str, token: &str) -> String {
    let raw = format!("{user}:{token}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

/// The header line `Proxy-Authorization: Basic ...\r\n` for `user` and `token`, to splice
/// into a raw request head.
pub fn proxy_authorization(user: &str, token: &str) -> String {
    format!("Proxy-Authorization: {}\r\n", basic_auth(user, token))
}

/// Sends `GET <path>` for `host` with `Connection: close` on a stream a test holds itself
/// (a SOCKS5 tunnel, say), reads to EOF (within [`IO_TIMEOUT`]) and half-closes, so the
/// tunnel ends and its close record is written. Returns the raw response.
///
/// # Errors
/// I/O failure or timeout.
pub async fn get_through<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    host: &str,
    path: &str,
) -> Result<String> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    io.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    tokio::time::timeout(IO_TIMEOUT, io.read_to_end(&mut out))
        .await
        .map_err(|_| anyhow!("no EOF within {IO_TIMEOUT:?}"))??;
    io.shutdown().await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A parsed HTTP response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Reason phrase.
    pub reason: String,
    /// Headers in arrival order, names as sent.
    pub headers: Vec<(String, String)>,
    /// The body (empty for a tunnel-establishing CONNECT answer).
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name` (case-insensitive), in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as (lossy) UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    ///
    /// # Errors
    /// When the body is not JSON (the error shows it).
    pub fn json(&self) -> Result<Value> {
        serde_json::from_slice(&self.body)
            .with_context(|| format!("response body is not JSON: {:?}", self.text()))
    }
}

/// Either kind of stream the mediator serves on.
#[derive(Debug)]
pub enum AnyStream {
    /// The shared TCP listener.
    Tcp(TcpStream),
    /// A per-authority Unix socket.
    Unix(UnixStream),
}

impl AsyncRead for AnyStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Self::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for AnyStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Self::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_flush(cx),
            Self::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Self::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// One client connection to the mediator (or through it, once tunnelled).
#[derive(Debug)]
pub struct HttpConn {
    io: BufReader<AnyStream>,
}

impl HttpConn {
    /// Connects to the mediator's shared TCP listener.
    ///
    /// # Errors
    /// Connect failure.
    pub async fn tcp(addr: SocketAddr) -> Result<Self> {
        anyhow::ensure!(
            addr.ip().is_loopback(),
            "tests only connect to loopback, not {addr}"
        );
        let s = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        Ok(Self {
            io: BufReader::new(AnyStream::Tcp(s)),
        })
    }

    /// Connects to a per-authority Unix socket.
    ///
    /// # Errors
    /// Connect failure.
    pub async fn unix(path: &Path) -> Result<Self> {
        let s = UnixStream::connect(path)
            .await
            .with_context(|| format!("connecting to {}", path.display()))?;
        Ok(Self {
            io: BufReader::new(AnyStream::Unix(s)),
        })
    }

    /// Writes `bytes` exactly as given.
    ///
    /// # Errors
    /// Write failure.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.io.get_mut().write_all(bytes).await?;
        self.io.get_mut().flush().await?;
        Ok(())
    }

    /// Half-closes the write side (the peer reads EOF).
    ///
    /// # Errors
    /// Shutdown failure.
    pub async fn shutdown_write(&mut self) -> Result<()> {
        self.io.get_mut().shutdown().await?;
        Ok(())
    }

    /// Sends a raw request and reads the response (body framed as the response says).
    ///
    /// # Errors
    /// I/O failure, timeout, or an unparseable response.
    pub async fn request(&mut self, raw: &[u8]) -> Result<HttpResponse> {
        self.send(raw).await?;
        self.read_response(false).await
    }

    /// Sends `GET <path>` with `Host: <host>` (and `Connection: close` when `close`) and
    /// reads the response: a request inside a tunnel, or to an origin-form server.
    ///
    /// # Errors
    /// As [`Self::request`].
    pub async fn get(&mut self, host: &str, path: &str, close: bool) -> Result<HttpResponse> {
        let connection = if close { "Connection: close\r\n" } else { "" };
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{connection}\r\n");
        self.request(req.as_bytes()).await
    }

    /// Sends `CONNECT target HTTP/1.1` (with `Proxy-Authorization` when `auth` is
    /// `Some((authority, token))`) and reads the answer. A `2xx` answer has no body and
    /// leaves this connection as the tunnel.
    ///
    /// # Errors
    /// As [`Self::request`].
    pub async fn connect(
        &mut self,
        target: &str,
        auth: Option<(&str, &str)>,
    ) -> Result<HttpResponse> {
        let mut req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some((user, token)) = auth {
            req.push_str(&proxy_authorization(user, token));
        }
        req.push_str("\r\n");
        self.send(req.as_bytes()).await?;
        self.read_response(true).await
    }

    /// Reads one response. With `connect_answer`, a `2xx` response is a tunnel answer and
    /// has no body whatever its headers say.
    ///
    /// # Errors
    /// I/O failure, EOF before a full head, timeout, or an unparseable head.
    pub async fn read_response(&mut self, connect_answer: bool) -> Result<HttpResponse> {
        tokio::time::timeout(IO_TIMEOUT, self.read_response_inner(connect_answer))
            .await
            .map_err(|_| anyhow!("no complete response within {IO_TIMEOUT:?}"))?
    }

    async fn read_response_inner(&mut self, connect_answer: bool) -> Result<HttpResponse> {
        let mut head_len = 0usize;
        let mut status_line = String::new();
        if self.io.read_line(&mut status_line).await? == 0 {
            bail!("connection closed before a response");
        }
        head_len += status_line.len();
        let status_line = status_line.trim_end();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        anyhow::ensure!(
            version.starts_with("HTTP/1."),
            "bad status line {status_line:?}"
        );
        let status: u16 = parts
            .next()
            .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?
            .parse()
            .with_context(|| format!("bad status in {status_line:?}"))?;
        let reason = parts.next().unwrap_or_default().to_owned();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if self.io.read_line(&mut line).await? == 0 {
                bail!("connection closed inside the response head");
            }
            head_len += line.len();
            anyhow::ensure!(head_len <= MAX_HEAD, "response head over {MAX_HEAD} bytes");
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                break;
            }
            let (n, v) = line
                .split_once(':')
                .ok_or_else(|| anyhow!("bad header line {line:?}"))?;
            headers.push((n.trim().to_owned(), v.trim().to_owned()));
        }
        let mut resp = HttpResponse {
            status,
            reason,
            headers,
            body: Vec::new(),
        };
        if (connect_answer && (200..300).contains(&status))
            || (100..200).contains(&status)
            || status == 204
            || status == 304
        {
            return Ok(resp);
        }
        let chunked = resp
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        if chunked {
            resp.body = self.read_chunked().await?;
        } else if let Some(len) = resp.header("content-length") {
            let len: usize = len.trim().parse().context("bad Content-Length")?;
            let mut body = vec![0u8; len];
            self.io.read_exact(&mut body).await?;
            resp.body = body;
        } else {
            self.io.read_to_end(&mut resp.body).await?;
        }
        Ok(resp)
    }

    async fn read_chunked(&mut self) -> Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let mut size_line = String::new();
            self.io.read_line(&mut size_line).await?;
            let size_hex = size_line.trim().split(';').next().unwrap_or_default();
            let size = usize::from_str_radix(size_hex, 16)
                .with_context(|| format!("bad chunk size {size_line:?}"))?;
            if size == 0 {
                // Trailers until the empty line.
                loop {
                    let mut t = String::new();
                    if self.io.read_line(&mut t).await? == 0 || t.trim().is_empty() {
                        return Ok(body);
                    }
                }
            }
            let start = body.len();
            body.resize(start + size, 0);
            self.io.read_exact(&mut body[start..]).await?;
            let mut crlf = [0u8; 2];
            self.io.read_exact(&mut crlf).await?;
        }
    }

    /// Reads until EOF (bounded by [`IO_TIMEOUT`]) and returns the bytes.
    ///
    /// # Errors
    /// I/O failure or timeout.
    pub async fn read_to_end(&mut self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        tokio::time::timeout(IO_TIMEOUT, self.io.read_to_end(&mut out))
            .await
            .map_err(|_| anyhow!("no EOF within {IO_TIMEOUT:?}"))??;
        Ok(out)
    }

    /// Whether the peer closes the connection (EOF or reset) within `timeout` without
    /// sending anything more.
    pub async fn closes_within(&mut self, timeout: Duration) -> bool {
        let mut buf = [0u8; 1];
        matches!(
            tokio::time::timeout(timeout, self.io.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    /// Whether the peer resets the connection (`ECONNRESET`, not an EOF) within
    /// `timeout` without sending anything more.
    pub async fn resets_within(&mut self, timeout: Duration) -> bool {
        let mut buf = [0u8; 1];
        matches!(
            tokio::time::timeout(timeout, self.io.read(&mut buf)).await,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset
        )
    }

    /// The underlying buffered stream, for tunnelled traffic.
    pub fn stream(&mut self) -> &mut BufReader<AnyStream> {
        &mut self.io
    }
}
