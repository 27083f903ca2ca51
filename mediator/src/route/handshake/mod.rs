//! Handshakes with a parent proxy over an open stream (TCP, or TLS to an HTTPS parent):
//! HTTP/1.1 `CONNECT` (RFC 9110 section 9.3.6, here; its answer head in `answer.rs`) and
//! SOCKS5 `CONNECT` (RFC 1928, username/password per RFC 1929: `socks5.rs`). The
//! Negotiate steps (RFC 4559) are driven by the router with [`send_connect`] and
//! [`Answer`].
//!
//! Everything written to a parent is built here from canonical values only: the target is
//! a vetted [`IpAddr`] or a [`CanonicalHost`] (which cannot hold CR, LF, NUL or space), the
//! port a `u16`, and the credentials come from the configuration, validated at load. A
//! final check refuses to send a request line or header holding a control character, so
//! no client-supplied byte can ever split a line. Nothing here resolves a name.

use std::net::IpAddr;

use base64::Engine as _;
use policy::CanonicalHost;
use policy::upstream::Credentials;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::stream::UpstreamStream;

mod answer;
mod socks5;

pub(crate) use answer::{Answer, AnswerError, BodyLength, negotiate_in, offered_in};
pub(crate) use socks5::socks5_connect;

/// Largest parent response head read (status line and headers).
const MAX_HEAD: usize = 16 * 1024;

/// Largest refusal body read to keep a connection for the next authentication step.
const MAX_DISCARD: u64 = 64 * 1024;

/// What a CONNECT names: the vetted address (pinning through the parent) or the canonical
/// host (the parent resolves it).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dest<'a> {
    /// A vetted address.
    Ip(IpAddr),
    /// The canonical host name (or IP literal).
    Host(&'a CanonicalHost),
}

impl Dest<'_> {
    /// Authority-form `host:port` (IPv6 bracketed).
    pub(crate) fn authority(&self, port: u16) -> String {
        match self {
            Self::Ip(IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
            Self::Ip(ip) => format!("{ip}:{port}"),
            Self::Host(h) => format!("{}:{port}", h.to_uri_host()),
        }
    }
}

/// How a handshake with a parent failed.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    /// The connection broke, or the parent sent something that is not its protocol,
    /// before it answered: a connection-level failure (the next route may be tried).
    Broken(String),
    /// The parent answered and refused. `next_addr` is true when the refusal is about
    /// reaching the destination (HTTP 502/503/504, SOCKS5 REP 3..=6), so another vetted
    /// address may be named.
    Refused {
        /// Human detail, with the parent's status (a demand for credentials says so).
        detail: String,
        /// Another vetted address may succeed.
        next_addr: bool,
    },
}

/// The `Proxy-Authorization` value for `creds` (RFC 7617).
pub(crate) fn basic(creds: &Credentials) -> String {
    let raw = format!("{}:{}", creds.user(), creds.password());
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

/// True when `s` can be written into a request line or header value: printable ASCII and
/// spaces only (our inputs are canonical; this is the last line of defence).
fn line_safe(s: &str) -> bool {
    s.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// Sends `CONNECT dest HTTP/1.1` (with `Proxy-Authorization: authorization` when given)
/// and reads the parent's answer head. Nothing past the head is read: on a 2xx the stream
/// is a tunnel to the destination.
///
/// # Errors
/// [`HandshakeError::Broken`] when the connection fails before a complete answer, or the
/// answer is not HTTP.
pub(crate) async fn send_connect(
    stream: &mut UpstreamStream,
    dest: Dest<'_>,
    port: u16,
    authorization: Option<&str>,
    parent: &str,
) -> Result<Answer, HandshakeError> {
    let authority = dest.authority(port);
    let mut req = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(value) = authorization {
        req.push_str(&format!("Proxy-Authorization: {value}\r\n"));
    }
    req.push_str("\r\n");
    if !req.trim_end_matches("\r\n").split("\r\n").all(line_safe) {
        return Err(HandshakeError::Broken(
            "refusing to send a CONNECT line with control characters".into(),
        ));
    }
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| HandshakeError::Broken(format!("{parent}: write failed: {e}")))?;
    let head = read_head(stream)
        .await
        .map_err(|e| HandshakeError::Broken(format!("{parent}: {e}")))?;
    Answer::parse(&head).map_err(|e| HandshakeError::Broken(format!("{parent}: {e} to CONNECT")))
}

/// `CONNECT` with Basic credentials (or none): on a 2xx the stream is a tunnel to the
/// destination; nothing past the head has been read.
///
/// # Errors
/// [`HandshakeError`]: `Broken` when the connection fails before a complete answer,
/// `Refused` for a non-2xx answer.
pub(crate) async fn http_connect(
    stream: &mut UpstreamStream,
    dest: Dest<'_>,
    port: u16,
    creds: Option<&Credentials>,
    parent: &str,
) -> Result<(), HandshakeError> {
    let authorization = creds.map(basic);
    let answer = send_connect(stream, dest, port, authorization.as_deref(), parent).await?;
    if (200..300).contains(&answer.status) {
        return Ok(());
    }
    Err(answer.refusal(&dest.authority(port), creds.is_some(), parent))
}

/// Reads and drops `n` body bytes of a refusal (at most [`MAX_DISCARD`]).
///
/// # Errors
/// A larger body, or the connection failed.
pub(crate) async fn discard(stream: &mut UpstreamStream, n: u64) -> Result<(), AnswerError> {
    if n > MAX_DISCARD {
        return Err(AnswerError::BodyTooLarge(n));
    }
    let mut left = n;
    let mut buf = [0u8; 4096];
    while left > 0 {
        let want = usize::try_from(left.min(4096)).unwrap_or(4096);
        let got = stream
            .read(&mut buf[..want])
            .await
            .map_err(AnswerError::Read)?;
        if got == 0 {
            return Err(AnswerError::ClosedInBody);
        }
        left -= got as u64;
    }
    Ok(())
}

/// Reads bytes up to and including the blank line ending a response head, never past it
/// (so tunnelled bytes stay unread): on TCP it peeks, then consumes exactly what is
/// needed; inside TLS (no peek) it reads one byte at a time from the decrypted buffer.
async fn read_head(stream: &mut UpstreamStream) -> Result<Vec<u8>, AnswerError> {
    match stream {
        UpstreamStream::Plain(tcp) => read_head_tcp(tcp).await,
        UpstreamStream::Tls(tls) => read_head_bytewise(tls.as_mut()).await,
    }
}

async fn read_head_bytewise<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Vec<u8>, AnswerError> {
    let mut head: Vec<u8> = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = stream
            .read(&mut byte)
            .await
            .map_err(|e| AnswerError::ReadTls(crate::tls::words::handshake_error(&e)))?;
        if n == 0 {
            return Err(AnswerError::ClosedBeforeAnswer);
        }
        head.push(byte[0]);
        if head.len() > MAX_HEAD {
            return Err(AnswerError::HeadTooLarge);
        }
    }
    Ok(head)
}

async fn read_head_tcp(stream: &mut TcpStream) -> Result<Vec<u8>, AnswerError> {
    let mut head: Vec<u8> = Vec::with_capacity(256);
    let mut buf = [0u8; 2048];
    loop {
        let n = stream.peek(&mut buf).await.map_err(AnswerError::Read)?;
        if n == 0 {
            return Err(AnswerError::ClosedBeforeAnswer);
        }
        // Where would the terminator end, counting the bytes already consumed?
        let old = head.len();
        let mut joined = head.clone();
        joined.extend_from_slice(&buf[..n]);
        let end = joined
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|i| i + 4);
        let take = match end {
            Some(end) => end - old,
            None => n,
        };
        let mut chunk = vec![0u8; take];
        stream
            .read_exact(&mut chunk)
            .await
            .map_err(AnswerError::Read)?;
        head.extend_from_slice(&chunk);
        if end.is_some() {
            return Ok(head);
        }
        if head.len() > MAX_HEAD {
            return Err(AnswerError::HeadTooLarge);
        }
    }
}

#[cfg(test)]
mod tests;
