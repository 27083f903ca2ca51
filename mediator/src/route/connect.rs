//! The direct connect to a pinned address: Happy Eyeballs (RFC 8305) over the vetted
//! addresses only, staggered, under one deadline. It never resolves a name: it is handed
//! addresses that `Grant::vet` passed.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use policy::Pin;
use tokio::net::TcpStream;

/// Delay before racing the next vetted address (RFC 8305 section 5 recommends 250 ms).
pub(super) const STAGGER: Duration = Duration::from_millis(250);

/// Why an upstream connect failed.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    /// Every vetted address refused the connection (RST).
    Refused(io::Error),
    /// The deadline passed before any address answered.
    Timeout,
    /// Unreachable network or host, or another I/O error.
    Other(io::Error),
}

impl std::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(e) => write!(f, "connection refused: {e}"),
            Self::Timeout => f.write_str("connect timeout"),
            Self::Other(e) => write!(f, "connect failed: {e}"),
        }
    }
}

/// Connects to `port` at one of the pinned addresses. Returns the stream, the address it
/// reached (the pin to record) and the time it took.
///
/// # Errors
/// [`ConnectFailure`] for the last failure seen, or a timeout.
pub(crate) async fn connect_pinned(
    pin: &Pin,
    port: u16,
    timeout: Duration,
) -> (Result<(TcpStream, SocketAddr), ConnectFailure>, Duration) {
    let addrs: Vec<SocketAddr> = pin
        .addrs()
        .iter()
        .map(|ip| SocketAddr::new(*ip, port))
        .collect();
    connect_addrs(&addrs, timeout).await
}

/// Happy Eyeballs over `addrs` (in order, [`STAGGER`] apart) under one deadline. The
/// attempts run inside this future (no task each): a connection that is established by
/// the time `connect(2)` returns (loopback, the same host) is taken at once, without a
/// turn of the event loop or a timer.
pub(super) async fn connect_addrs(
    addrs: &[SocketAddr],
    timeout: Duration,
) -> (Result<(TcpStream, SocketAddr), ConnectFailure>, Duration) {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pending = addrs.iter().copied();
    let mut attempts = FuturesUnordered::new();
    let mut last_err: Option<io::Error> = None;
    let attempt = |addr: SocketAddr| async move { (addr, connect_one(addr).await) };
    let result = loop {
        if attempts.is_empty() {
            match pending.next() {
                Some(addr) => attempts.push(attempt(addr)),
                None => break Err(classify(last_err)),
            }
        }
        // Biased: an attempt that completes at once is taken before any timer is armed.
        tokio::select! {
            biased;
            Some((addr, r)) = attempts.next() => match r {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    break Ok((stream, addr));
                }
                Err(e) => last_err = Some(e),
            },
            () = tokio::time::sleep_until(deadline) => break Err(ConnectFailure::Timeout),
            () = tokio::time::sleep(STAGGER), if pending.len() > 0 => {
                if let Some(addr) = pending.next() {
                    attempts.push(attempt(addr));
                }
            }
        }
    };
    (result, start.elapsed())
}

/// One TCP connect to `addr`. A non-blocking `connect(2)` answers `EINPROGRESS` even when
/// the handshake is already over (loopback); a peer address then shows the connection
/// established, and it is returned without waiting. Otherwise the socket waits to become
/// writable and its pending error (`SO_ERROR`) decides, as `TcpStream::connect` does.
pub(super) async fn connect_one(addr: SocketAddr) -> io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking().cloexec(),
        Some(socket2::Protocol::TCP),
    )?;
    let done = match socket.connect(&addr.into()) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => socket.peer_addr().is_ok(),
        Err(e) => return Err(e),
    };
    let stream = TcpStream::from_std(socket.into())?;
    if !done {
        stream.writable().await?;
        if let Some(e) = stream.take_error()? {
            return Err(e);
        }
    }
    Ok(stream)
}

pub(super) fn classify(err: Option<io::Error>) -> ConnectFailure {
    match err {
        Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => ConnectFailure::Refused(e),
        Some(e) => ConnectFailure::Other(e),
        None => ConnectFailure::Other(io::Error::other("no vetted address")),
    }
}
