//! `mediator health`: one `GET /healthz` (or `/readyz`) on the admin API, for a container
//! `HEALTHCHECK` or a probe where no HTTP client is installed (the image has no shell and
//! no curl). It speaks just enough HTTP/1.1 for the mediator's own admin API: one request
//! with `Connection: close`, an answer of at most [`MAX_ANSWER`] bytes, a deadline for the
//! whole exchange.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::Error;

/// Largest answer read, in bytes (the admin API's health answers are a few bytes).
pub const MAX_ANSWER: usize = 16 * 1024;

/// Where the admin API listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAddr {
    /// `[listen] admin`, a loopback `ip:port`.
    Tcp(SocketAddr),
    /// `[listen] admin_socket`, a Unix socket path.
    Unix(PathBuf),
}

impl AdminAddr {
    /// Parses `--admin`: a path (starting with `/` or `.`, or written `unix:PATH`) is the
    /// admin socket, anything else `host:port` (`127.0.0.1:9901`, `[::1]:9901`,
    /// `localhost:9901`).
    ///
    /// # Errors
    /// [`Error::Io`] (`InvalidInput`) when `host:port` does not resolve to an address.
    pub fn parse(s: &str) -> Result<Self, Error> {
        if let Some(path) = s.strip_prefix("unix:") {
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        if s.starts_with('/') || s.starts_with('.') {
            return Ok(Self::Unix(PathBuf::from(s)));
        }
        let addr = s
            .to_socket_addrs()
            .map_err(|e| {
                invalid(format!(
                    "--admin {s:?}: give ip:port or a socket path ({e})"
                ))
            })?
            .next()
            .ok_or_else(|| invalid(format!("--admin {s:?}: no address")))?;
        Ok(Self::Tcp(addr))
    }
}

impl std::fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(a) => write!(f, "{a}"),
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Which endpoint to ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `/healthz`: 200 while the process serves (a liveness check).
    Health,
    /// `/readyz`: 200 while it accepts new connections, 503 while shutting down or at
    /// `max_connections` (a readiness check).
    Ready,
}

impl Probe {
    /// The admin API path.
    pub fn path(self) -> &'static str {
        match self {
            Self::Health => "/healthz",
            Self::Ready => "/readyz",
        }
    }
}

/// The admin API's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status code.
    pub status: u16,
    /// The body, trimmed (`ok`, `ready`, `shutting down`, ...).
    pub body: String,
}

/// Sends `GET <probe path>` to `addr` and reads the answer, all within `timeout`.
///
/// # Errors
/// [`Error::Io`]: the connection failed, the deadline passed, or the answer is not an
/// HTTP/1.x response within [`MAX_ANSWER`] bytes.
pub fn probe(addr: &AdminAddr, probe: Probe, timeout: Duration) -> Result<Answer, Error> {
    let (status, body) = get(addr, probe.path(), None, timeout, MAX_ANSWER)?;
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&body).trim().to_owned(),
    })
}

/// Sends `GET path` to the admin API at `addr` (with `Authorization: Bearer <token>` when
/// `token` is given) and reads the whole answer, at most `max` bytes, all within
/// `timeout`. Returns the status and the body (`mediator health`, and `mediator diff
/// --admin` and `mediator test --admin`, which read `/v1/authorities`).
///
/// # Errors
/// [`Error::Io`]: the connection failed, the deadline passed, the token is not a header
/// value, or the answer is not an HTTP/1.x response within `max` bytes.
pub(crate) fn get(
    addr: &AdminAddr,
    path: &str,
    token: Option<&str>,
    timeout: Duration,
    max: usize,
) -> Result<(u16, Vec<u8>), Error> {
    let deadline = Instant::now() + timeout;
    let auth = match token {
        Some(t) if !t.is_empty() && t.bytes().all(|b| (0x21..0x7f).contains(&b)) => {
            format!("Authorization: Bearer {t}\r\n")
        }
        Some(_) => {
            return Err(invalid(
                "the admin token must be visible ASCII without spaces".to_owned(),
            ));
        }
        None => String::new(),
    };
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: mediator\r\nUser-Agent: mediator\r\n{auth}Connection: close\r\n\r\n"
    );
    let raw = match addr {
        AdminAddr::Tcp(a) => {
            let s = TcpStream::connect_timeout(a, timeout)?;
            exchange(s, &request, deadline, max)?
        }
        AdminAddr::Unix(p) => {
            let s = UnixStream::connect(p)?;
            exchange(s, &request, deadline, max)?
        }
    };
    let (status, head) = parse_head(&raw)?;
    Ok((status, raw[head..].to_vec()))
}

/// The socket operations [`exchange`] needs from a TCP or a Unix stream.
trait Deadlined: Read + Write {
    fn set_timeouts(&self, t: Duration) -> io::Result<()>;
}

impl Deadlined for TcpStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

impl Deadlined for UnixStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

fn left(deadline: Instant) -> io::Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no complete answer in time",
        ))
    } else {
        Ok(d)
    }
}

/// Writes `request`, then reads until the server closes (it was asked to) or `max` bytes.
fn exchange<S: Deadlined>(
    mut s: S,
    request: &str,
    deadline: Instant,
    max: usize,
) -> io::Result<Vec<u8>> {
    s.set_timeouts(left(deadline)?)?;
    s.write_all(request.as_bytes())?;
    let mut out = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        s.set_timeouts(left(deadline)?)?;
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
        if out.len() > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("answer longer than {max} bytes"),
            ));
        }
    }
}

/// The status and the length of the head of an answer.
fn parse_head(raw: &[u8]) -> Result<(u16, usize), Error> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return Err(Error::Io(invalid_data("the answer ended inside its head")));
        }
        Err(e) => {
            return Err(Error::Io(invalid_data(format!("not an HTTP answer: {e}"))));
        }
    };
    let status = resp
        .code
        .ok_or_else(|| Error::Io(invalid_data("no status code")))?;
    Ok((status, head))
}

fn invalid(msg: String) -> Error {
    Error::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

fn invalid_data(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_addresses() {
        assert_eq!(
            AdminAddr::parse("127.0.0.1:9901").unwrap(),
            AdminAddr::Tcp("127.0.0.1:9901".parse().unwrap())
        );
        assert_eq!(
            AdminAddr::parse("[::1]:9901").unwrap(),
            AdminAddr::Tcp("[::1]:9901".parse().unwrap())
        );
        assert_eq!(
            AdminAddr::parse("/run/m/admin.sock").unwrap(),
            AdminAddr::Unix("/run/m/admin.sock".into())
        );
        assert_eq!(
            AdminAddr::parse("unix:admin.sock").unwrap(),
            AdminAddr::Unix("admin.sock".into())
        );
        assert!(AdminAddr::parse("no-port").is_err());
    }

    fn parse_answer(raw: &[u8]) -> Result<Answer, Error> {
        let (status, head) = parse_head(raw)?;
        Ok(Answer {
            status,
            body: String::from_utf8_lossy(&raw[head..]).trim().to_owned(),
        })
    }

    #[test]
    fn answers() {
        let a = parse_answer(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 14\r\n\r\nshutting down\n",
        )
        .unwrap();
        assert_eq!((a.status, a.body.as_str()), (503, "shutting down"));
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\nContent-").is_err());
        assert!(parse_answer(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
    }

    #[test]
    fn a_real_exchange_over_loopback() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"GET /readyz HTTP/1.1\r\n"));
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nready\n")
                .unwrap();
        });
        let a = probe(&AdminAddr::Tcp(addr), Probe::Ready, Duration::from_secs(5)).unwrap();
        assert_eq!((a.status, a.body.as_str()), (200, "ready"));
        server.join().unwrap();
    }
}
