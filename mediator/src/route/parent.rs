//! Handshakes with a parent proxy over an open stream (TCP, or TLS to an HTTPS parent):
//! HTTP/1.1 `CONNECT` (RFC 9110 section 9.3.6) and SOCKS5 `CONNECT` (RFC 1928,
//! username/password per RFC 1929). The Negotiate steps (RFC 4559) are driven by the
//! router with [`send_connect`] and [`Answer`].
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
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::stream::UpstreamStream;

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

/// Why a parent's answer could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AnswerError {
    /// The connection failed.
    #[error("read failed: {0}")]
    Read(std::io::Error),
    /// The TLS connection to an HTTPS parent failed, in words.
    #[error("read failed: {0}")]
    ReadTls(String),
    /// The parent closed before its answer was complete.
    #[error("connection closed before the answer")]
    ClosedBeforeAnswer,
    /// The parent closed in the body of a refusal.
    #[error("connection closed in the answer body")]
    ClosedInBody,
    /// The head is larger than [`MAX_HEAD`].
    #[error("answer head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// A refusal's body is larger than [`MAX_DISCARD`].
    #[error("a {0}-byte answer body (more than {MAX_DISCARD})")]
    BodyTooLarge(u64),
    /// The head ends before its blank line.
    #[error("an incomplete answer head")]
    Incomplete,
    /// Not HTTP/1.x.
    #[error("not an HTTP answer ({0})")]
    NotHttp(httparse::Error),
    /// No status code.
    #[error("an answer head without a status")]
    NoStatus,
}

/// A parent's answer head to `CONNECT`, parsed once with `httparse` (RFC 9112 sections 4
/// and 5): its status, version and header fields (never the body). A field value that is
/// not UTF-8 (legal obs-text) is kept, lossily, and hides no other field.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The status code.
    pub(crate) status: u16,
    /// The minor version: `HTTP/1.0` or `HTTP/1.1`.
    minor: u8,
    /// The reason phrase, printable ASCII only, at most 64 bytes (it goes into logs).
    reason: String,
    /// The header fields, `(name, value)`.
    fields: Vec<(String, String)>,
}

/// `value` with each obsolete line folding (a line break followed by spaces or tabs,
/// RFC 9112 section 5.2) replaced by one space.
fn unfold(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(i) = rest.find(['\r', '\n']) {
        out.push_str(&rest[..i]);
        out.push(' ');
        rest = rest[i..].trim_start_matches(['\r', '\n', ' ', '\t']);
    }
    out.push_str(rest);
    out
}

/// The most header fields an answer head may have (it is at most [`MAX_HEAD`] bytes).
const MAX_FIELDS: usize = 128;

/// How the body of a parent's non-2xx answer is delimited (RFC 9112 section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyLength {
    /// `Content-Length: n` and the connection stays open: read `n` bytes and reuse it.
    Known(u64),
    /// Chunked, delimited by the close, or `Connection: close`: open a new connection.
    Unusable,
}

impl Answer {
    /// Parses a complete answer head. An obsolete line folding is replaced by a space, as
    /// RFC 9112 section 5.2 tells a recipient of a response to do.
    ///
    /// # Errors
    /// The head is not an HTTP/1.x status line and fields, in `httparse`'s words.
    pub(crate) fn parse(head: &[u8]) -> Result<Self, AnswerError> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut response = httparse::Response::new(&mut headers);
        let parsed = httparse::ParserConfig::default()
            .allow_obsolete_multiline_headers_in_responses(true)
            .parse_response(&mut response, head);
        match parsed {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => return Err(AnswerError::Incomplete),
            Err(e) => return Err(AnswerError::NotHttp(e)),
        }
        let (Some(status), Some(minor)) = (response.code, response.version) else {
            return Err(AnswerError::NoStatus);
        };
        // The reason phrase may be obs-text, which httparse leaves out: read it from the
        // line itself.
        let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
        let reason = String::from_utf8_lossy(line)
            .splitn(3, ' ')
            .nth(2)
            .unwrap_or_default()
            .chars()
            .filter(|c| c.is_ascii_graphic() || *c == ' ')
            .take(64)
            .collect();
        let fields = response
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_owned(),
                    ows_trim(&unfold(&String::from_utf8_lossy(h.value))).to_owned(),
                )
            })
            .collect();
        Ok(Self {
            status,
            minor,
            reason,
            fields,
        })
    }

    /// The header fields, `(name, value)` with the value trimmed.
    fn fields(&self) -> impl Iterator<Item = (&str, &str)> {
        self.fields.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// `Some(token)` when a `Proxy-Authenticate` field offers `Negotiate` (RFC 4559
    /// section 4): the token is empty for a bare offer.
    pub(crate) fn negotiate(&self) -> Option<&str> {
        negotiate_in(self.challenges())
    }

    /// The authentication schemes the parent offered (`Proxy-Authenticate`), for messages.
    pub(crate) fn offered(&self) -> String {
        offered_in(self.challenges())
    }

    /// The `Proxy-Authenticate` values.
    fn challenges(&self) -> impl Iterator<Item = &str> {
        self.fields()
            .filter(|(n, _)| n.eq_ignore_ascii_case("proxy-authenticate"))
            .map(|(_, v)| v)
    }

    /// How the answer's body is delimited.
    pub(crate) fn body(&self) -> BodyLength {
        let mut length = None;
        for (name, value) in self.fields() {
            if name.eq_ignore_ascii_case("transfer-encoding")
                || (name.eq_ignore_ascii_case("connection")
                    && value
                        .split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case("close")))
            {
                return BodyLength::Unusable;
            }
            if name.eq_ignore_ascii_case("content-length") {
                match (length, value.parse::<u64>()) {
                    (None, Ok(n)) => length = Some(n),
                    (Some(a), Ok(b)) if a == b => {}
                    _ => return BodyLength::Unusable,
                }
            }
        }
        if self.minor == 0 {
            return BodyLength::Unusable;
        }
        length.map_or(BodyLength::Unusable, BodyLength::Known)
    }

    /// The refusal this non-2xx answer means for `CONNECT authority`.
    pub(crate) fn refusal(&self, authority: &str, basic: bool, parent: &str) -> HandshakeError {
        let status = self.status;
        let detail = if status == 407 {
            format!(
                "parent {parent} answered 407 Proxy Authentication Required{} (it offers {}): {}",
                if basic {
                    " (the configured credentials were refused)"
                } else {
                    ""
                },
                self.offered(),
                "configure the parent's credentials (userinfo or parent_credentials_file) or parent_auth"
            )
        } else {
            format!(
                "parent {parent} answered {status} {} to CONNECT {authority}",
                self.reason
            )
        };
        HandshakeError::Refused {
            detail,
            next_addr: matches!(status, 502..=504),
        }
    }
}

/// `Some(token)` when one of the `Proxy-Authenticate` values `challenges` offers
/// `Negotiate` (RFC 4559 section 4): the token is empty for a bare offer.
pub(crate) fn negotiate_in<'a>(challenges: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    challenges.map(ows_trim).find_map(|v| {
        let (scheme, rest) = v.split_once(' ').unwrap_or((v, ""));
        scheme
            .eq_ignore_ascii_case("negotiate")
            .then_some(ows_trim(rest))
    })
}

/// `s` without the optional whitespace of RFC 9110 section 5.6.3 (spaces and tabs) at
/// either end: never other control or Unicode whitespace, which belongs to the value.
pub(crate) fn ows_trim(s: &str) -> &str {
    s.trim_matches([' ', '\t'])
}

/// The schemes of the `Proxy-Authenticate` values `challenges`, for messages: a scheme
/// that is an RFC 9110 token as it is, anything else quoted with its control characters
/// escaped (so that `Nego\0tiate` never reads as `Negotiate`); at most 32 characters each.
pub(crate) fn offered_in<'a>(challenges: impl Iterator<Item = &'a str>) -> String {
    let schemes: Vec<String> = challenges
        .map(str::trim)
        .filter_map(|v| v.split([' ', ',']).next())
        .filter(|s| !s.is_empty())
        .map(|s| {
            let cut: String = s.chars().take(32).collect();
            if cut.chars().all(is_tchar) {
                cut
            } else {
                format!("\"{}\"", cut.escape_default())
            }
        })
        .collect();
    if schemes.is_empty() {
        "no scheme".to_owned()
    } else {
        schemes.join(", ")
    }
}

/// RFC 9110 section 5.6.2 `tchar`.
fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
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

/// RFC 1928 constants.
const VER: u8 = 0x05;
const METHOD_NONE: u8 = 0x00;
const METHOD_USERPASS: u8 = 0x02;
const METHOD_NO_ACCEPTABLE: u8 = 0xFF;
const ATYP_IPV4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_IPV6: u8 = 0x04;

/// SOCKS5 `CONNECT` through a parent (RFC 1928), with RFC 1929 username/password when
/// credentials are configured. On success the stream is a tunnel to the destination.
///
/// # Errors
/// [`HandshakeError`]: `Broken` when the connection fails or the parent does not speak
/// SOCKS5; `Refused` for an authentication failure or a non-zero `REP`.
#[expect(
    clippy::too_many_lines,
    reason = "the RFC 1928/1929 client handshake in wire order"
)]
pub(crate) async fn socks5_connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    dest: Dest<'_>,
    port: u16,
    creds: Option<&Credentials>,
    parent: &str,
) -> Result<(), HandshakeError> {
    let broken = |e: std::io::Error| HandshakeError::Broken(format!("{parent}: {e}"));
    let greeting: &[u8] = if creds.is_some() {
        &[VER, 2, METHOD_NONE, METHOD_USERPASS]
    } else {
        &[VER, 1, METHOD_NONE]
    };
    stream.write_all(greeting).await.map_err(broken)?;
    let mut choice = [0u8; 2];
    stream.read_exact(&mut choice).await.map_err(broken)?;
    if choice[0] != VER {
        return Err(HandshakeError::Broken(format!(
            "{parent}: not a SOCKS5 server"
        )));
    }
    match (choice[1], creds) {
        (METHOD_NONE, _) => {}
        (METHOD_USERPASS, Some(c)) => {
            let (user, pass) = (c.user().as_bytes(), c.password().as_bytes());
            // Lengths are 1..=255 / 0..=255, checked when the credentials were built.
            let (Ok(ulen), Ok(plen)) = (u8::try_from(user.len()), u8::try_from(pass.len())) else {
                return Err(HandshakeError::Broken(
                    "credentials too long for SOCKS5".into(),
                ));
            };
            let mut msg = vec![0x01, ulen];
            msg.extend_from_slice(user);
            msg.push(plen);
            msg.extend_from_slice(pass);
            stream.write_all(&msg).await.map_err(broken)?;
            let mut status = [0u8; 2];
            stream.read_exact(&mut status).await.map_err(broken)?;
            if status[1] != 0 {
                return Err(HandshakeError::Refused {
                    detail: format!(
                        "parent {parent} rejected the configured SOCKS5 credentials (RFC 1929 status {})",
                        status[1]
                    ),
                    next_addr: false,
                });
            }
        }
        (METHOD_USERPASS | METHOD_NO_ACCEPTABLE, None) => {
            return Err(HandshakeError::Refused {
                detail: format!(
                    "parent {parent} requires SOCKS5 authentication: configure the parent's credentials"
                ),
                next_addr: false,
            });
        }
        (m, _) => {
            return Err(HandshakeError::Refused {
                detail: format!("parent {parent} chose no acceptable SOCKS5 method ({m:#04x})"),
                next_addr: false,
            });
        }
    }
    let mut req = vec![VER, 0x01, 0x00];
    match dest {
        Dest::Ip(IpAddr::V4(v4)) => {
            req.push(ATYP_IPV4);
            req.extend_from_slice(&v4.octets());
        }
        Dest::Ip(IpAddr::V6(v6)) => {
            req.push(ATYP_IPV6);
            req.extend_from_slice(&v6.octets());
        }
        Dest::Host(h) => match (h.ip(), h.name()) {
            (Some(IpAddr::V4(v4)), _) => {
                req.push(ATYP_IPV4);
                req.extend_from_slice(&v4.octets());
            }
            (Some(IpAddr::V6(v6)), _) => {
                req.push(ATYP_IPV6);
                req.extend_from_slice(&v6.octets());
            }
            (None, Some(name)) => {
                // A canonical name is at most 253 bytes.
                let Ok(len) = u8::try_from(name.len()) else {
                    return Err(HandshakeError::Broken("name too long for SOCKS5".into()));
                };
                req.push(ATYP_DOMAIN);
                req.push(len);
                req.extend_from_slice(name.as_bytes());
            }
            (None, None) => return Err(HandshakeError::Broken("empty host".into())),
        },
    }
    req.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&req).await.map_err(broken)?;
    let mut head = [0u8; 4];
    stream.read_exact(&mut head).await.map_err(broken)?;
    if head[0] != VER {
        return Err(HandshakeError::Broken(format!(
            "{parent}: not a SOCKS5 reply"
        )));
    }
    let rest = match head[3] {
        ATYP_IPV4 => 4 + 2,
        ATYP_IPV6 => 16 + 2,
        ATYP_DOMAIN => {
            let mut len = [0u8; 1];
            stream.read_exact(&mut len).await.map_err(broken)?;
            usize::from(len[0]) + 2
        }
        _ => {
            return Err(HandshakeError::Broken(format!(
                "{parent}: bad SOCKS5 reply address type"
            )));
        }
    };
    let mut bound = vec![0u8; rest];
    stream.read_exact(&mut bound).await.map_err(broken)?;
    if head[1] != 0 {
        let what = match head[1] {
            0x01 => "general failure",
            0x02 => "not allowed by ruleset",
            0x03 => "network unreachable",
            0x04 => "host unreachable",
            0x05 => "connection refused",
            0x06 => "TTL expired",
            0x07 => "command not supported",
            0x08 => "address type not supported",
            _ => "unknown error",
        };
        return Err(HandshakeError::Refused {
            detail: format!(
                "parent {parent} answered SOCKS5 REP {:#04x} ({what}) for {}",
                head[1],
                dest.authority(port)
            ),
            next_addr: matches!(head[1], 0x03..=0x06),
        });
    }
    Ok(())
}

#[cfg(test)]
#[path = "parent_tests.rs"]
mod tests;
