//! Routing and upstream connection (design section 8). This build routes `DIRECT` only:
//! it connects to the pinned addresses, never to a name, trying the vetted addresses in
//! resolver order with a short stagger (Happy Eyeballs, RFC 8305, limited to the vetted
//! set) under one overall connect deadline.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use policy::Pin;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// Delay before racing the next vetted address (RFC 8305 section 5 recommends 250 ms).
const STAGGER: Duration = Duration::from_millis(250);

/// The route a connection took; `"direct"` in this build.
pub const DIRECT: &str = "direct";

/// Why an upstream connect failed.
#[derive(Debug)]
pub enum ConnectFailure {
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
pub async fn connect_pinned(
    pin: &Pin,
    port: u16,
    timeout: Duration,
) -> (Result<(TcpStream, SocketAddr), ConnectFailure>, Duration) {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pending = pin.addrs().iter().map(|ip| SocketAddr::new(*ip, port));
    let mut set = JoinSet::new();
    let mut last_err: Option<io::Error> = None;
    let spawn = |set: &mut JoinSet<_>, addr: SocketAddr| {
        set.spawn(async move { (addr, TcpStream::connect(addr).await) });
    };
    if let Some(first) = pending.next() {
        spawn(&mut set, first);
    }
    let result = loop {
        if set.is_empty() {
            match pending.next() {
                Some(addr) => spawn(&mut set, addr),
                None => break Err(classify(last_err)),
            }
        }
        tokio::select! {
            joined = set.join_next() => match joined {
                Some(Ok((addr, Ok(stream)))) => {
                    let _ = stream.set_nodelay(true);
                    break Ok((stream, addr));
                }
                Some(Ok((_, Err(e)))) => last_err = Some(e),
                Some(Err(join)) => last_err = Some(io::Error::other(join.to_string())),
                None => {}
            },
            () = tokio::time::sleep(STAGGER), if pending.len() > 0 => {
                if let Some(addr) = pending.next() {
                    spawn(&mut set, addr);
                }
            }
            () = tokio::time::sleep_until(deadline) => break Err(ConnectFailure::Timeout),
        }
    };
    set.abort_all();
    (result, start.elapsed())
}

fn classify(err: Option<io::Error>) -> ConnectFailure {
    match err {
        Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => ConnectFailure::Refused(e),
        Some(e) => ConnectFailure::Other(e),
        None => ConnectFailure::Other(io::Error::other("no vetted address")),
    }
}
