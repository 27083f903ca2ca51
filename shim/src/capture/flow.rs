//! One captured TCP connection (design section 15): name its destination (the host a
//! synthetic address stands for, or the literal address), ask the authority's channel
//! with `CONNECT host:port` marked `X-Mediator-Capture: 1`, and then either let the
//! child's connection complete and carry its bytes (half-closes passed on both ways), or
//! reset it at once with the mediator's denial recorded.
//!
//! It never decides anything itself: the mediator decides, vets, pins, routes and logs,
//! exactly as for a proxy-aware client. Its only refusals are for addresses of the
//! synthetic range that no name was given (nothing to ask for) and for a channel that
//! cannot be reached.

use std::future::poll_fn;
use std::io::ErrorKind;
use std::net::{IpAddr, Shutdown};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use smoltcp::socket::tcp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::addrs::Addresses;
use super::dns::Stub;
use super::drops::{Drops, Kind};
use super::names::Names;
use super::stack::{Conn, NewFlow, Shared};
use crate::control::{Binding, Bound};
use crate::relay::{Sniff, inspect_reply};
use crate::report::{ChannelFailure, Denials};

/// How long the channel may take to answer a CONNECT (the mediator's own DNS and connect
/// timeouts are shorter).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of a CONNECT answer read (the head and a denial's JSON body).
const MAX_ANSWER: usize = 16 * 1024;
/// The DNS-over-TCP stub's idle limit.
const DNS_IDLE: Duration = Duration::from_secs(10);

/// How a captured connection reaches its authority's channel: the one the binding names
/// when the connection is made (a rebind moves new connections only).
pub(crate) enum Dial {
    /// A running mediator's per-authority Unix socket.
    Socket(Arc<Binding>),
    /// The embedded mediator, which marks the connection itself.
    Embedded {
        /// The mediator (started by the first connection that needs it).
        mediator: Arc<crate::embedded::Lazy>,
        /// Its runtime (its connections run there).
        handle: tokio::runtime::Handle,
        /// Its authority new connections go to.
        binding: Arc<Binding>,
    },
}

impl Dial {
    /// Capture's way to the embedded mediator `e` (its connections are marked
    /// `capture: true`).
    pub(crate) fn embedded(e: &crate::embedded::Embedded) -> Self {
        let (mediator, handle, binding) = e.reach();
        Self::Embedded {
            mediator,
            handle,
            binding,
        }
    }

    /// The channel as the user named it: the socket's path, or `embedded`.
    fn name(&self) -> String {
        match self {
            Self::Socket(binding) => binding.current().name(),
            Self::Embedded { .. } => "embedded".to_owned(),
        }
    }

    async fn open(&self) -> std::io::Result<UnixStream> {
        let binding = match self {
            Self::Socket(b) | Self::Embedded { binding: b, .. } => b,
        };
        match (self, binding.current()) {
            (Self::Socket(_), Bound::Socket(path)) => {
                // The run's labels first (design section 20), then the marked CONNECT.
                let mut s = UnixStream::connect(path).await?;
                s.write_all(binding.header()).await?;
                Ok(s)
            }
            (
                Self::Embedded {
                    mediator, handle, ..
                },
                Bound::Embedded { authority, .. },
            ) => {
                let running = match mediator.started() {
                    Some(running) => Some(Arc::clone(running)),
                    None => {
                        // The first connection starts it, on its own runtime, whatever
                        // runtime this flow runs on.
                        let mediator = Arc::clone(mediator);
                        handle
                            .spawn(async move { mediator.get().await })
                            .await
                            .ok()
                            .flatten()
                    }
                }
                .ok_or_else(|| std::io::Error::other("the embedded mediator did not start"))?;
                let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
                ours.set_nonblocking(true)?;
                theirs.set_nonblocking(true)?;
                {
                    let _in_mediator = handle.enter();
                    let theirs = UnixStream::from_std(theirs)?;
                    if !running.serve_captured(theirs, &authority, binding.labels()) {
                        return Err(std::io::Error::other("the embedded authority is gone"));
                    }
                }
                UnixStream::from_std(ours)
            }
            _ => Err(std::io::Error::other(
                "the channel is bound to another kind of channel than this run serves",
            )),
        }
    }
}

/// What every flow of a run shares.
pub(crate) struct Flows {
    pub(crate) shared: Arc<Shared>,
    pub(crate) addrs: Addresses,
    pub(crate) names: Arc<Names>,
    pub(crate) drops: Arc<Drops>,
    pub(crate) stub: Arc<Stub>,
    pub(crate) dial: Dial,
    pub(crate) denials: Arc<Denials>,
    /// Where the mediator's denials read in its answers go (socket mode; the embedded
    /// mediator's tap records them itself): said before the child's connection is
    /// refused.
    pub(crate) answers: Option<crate::feed::Answers>,
    /// Notes the program behind each tunnel (see [`crate::rejected`]).
    pub(crate) trust: crate::rejected::Trust,
    /// Captured TCP connections asked for on the channel.
    pub(crate) connections: AtomicU64,
    /// Of those, the ones refused (denied, or the channel failed).
    pub(crate) refused: AtomicU64,
    /// Connections that could not reach the channel.
    pub(crate) channel_errors: AtomicU64,
}

/// Where a flow goes.
enum Destination {
    /// A host for the mediator, as `CONNECT` names it (`name:port`, `1.2.3.4:port`,
    /// `[v6]:port`).
    Mediator(String),
    /// The stub resolver over TCP.
    Dns,
    /// An address of the synthetic range with no name: nothing to ask for.
    Unmapped,
}

fn destination(flows: &Flows, flow: NewFlow) -> Destination {
    let ip = flow.dst.ip();
    let port = flow.dst.port();
    if let Some(i) = flows.addrs.index_of(ip) {
        return match flows.names.host(i) {
            Some(host) => Destination::Mediator(format!("{host}:{port}")),
            None => Destination::Unmapped,
        };
    }
    if flows.addrs.is_dns(ip) && port == 53 {
        return Destination::Dns;
    }
    if flows.addrs.is_ours(ip) {
        return Destination::Unmapped;
    }
    Destination::Mediator(match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    })
}

/// Serve one new connection until it ends.
pub(crate) async fn run(flows: Arc<Flows>, flow: NewFlow) {
    let destination = destination(&flows, flow);
    let (upstream, early) = match &destination {
        Destination::Unmapped => {
            flows.shared.refuse(flow);
            flows.drops.count(
                Kind::UnmappedTcp,
                6,
                flow.dst.ip(),
                Some(flow.dst.port()),
                None,
            );
            return;
        }
        Destination::Dns => {
            let Ok((ours, theirs)) = UnixStream::pair() else {
                flows.shared.refuse(flow);
                return;
            };
            tokio::spawn(dns_over_tcp(theirs, Arc::clone(&flows.stub)));
            (ours, Vec::new())
        }
        Destination::Mediator(target) => {
            flows.connections.fetch_add(1, Ordering::Relaxed);
            match ask(&flows, target).await {
                Ok(pair) => pair,
                Err(refusal) => {
                    flows.refused.fetch_add(1, Ordering::Relaxed);
                    match refusal {
                        // An SSH client is told why, in words `ssh` prints.
                        Some(denial) if flow.dst.port() == SSH_PORT => {
                            tell_ssh_client(&flows, flow, &denial).await;
                        }
                        _ => flows.shared.refuse(flow),
                    }
                    return;
                }
            }
        }
    };
    let Some(conn) = flows.shared.accept(flow) else {
        return;
    };
    if let Destination::Mediator(target) = &destination {
        // The child's socket, inside, is its address on the TUN -> where it connects.
        let (trust, target) = (flows.trust.clone(), target.clone());
        tokio::task::spawn_blocking(move || {
            if let Some((host, port)) = split_target(&target) {
                trust.opened(host, port, flow.src, flow.dst);
            }
        });
    }
    relay(conn, upstream, early).await;
}

/// `name:port`, `1.2.3.4:port` or `[v6]:port` as its host and port.
fn split_target(target: &str) -> Option<(&str, u16)> {
    let (host, port) = target.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host, port.parse().ok()?))
}

/// The port an SSH client of a denied flow is answered on (design section 18).
const SSH_PORT: u16 = 22;

/// How long a denied SSH client may keep its connection open after its answer.
const SSH_LINGER: Duration = Duration::from_secs(10);

/// Completes the denied flow of an SSH client and sends it the identification line and
/// an `SSH_MSG_DISCONNECT` carrying the operator's reason (or the hint), then ends it.
async fn tell_ssh_client(flows: &Flows, flow: NewFlow, denial: &crate::report::Denial) {
    let text = denial
        .message
        .clone()
        .or_else(|| denial.hint.clone())
        .or_else(|| denial.detail.clone())
        .unwrap_or_default();
    let host = denial.host.as_deref().unwrap_or("this host");
    let reason = denial.reason.as_deref().unwrap_or("denied");
    let text = format!("egress to {host} port 22 denied ({reason}): {text}");
    let Some(conn) = flows.shared.accept(flow) else {
        return;
    };
    let Ok((ours, theirs)) = UnixStream::pair() else {
        conn.abort();
        return;
    };
    // The other end answers nothing more: it sends end of stream at once and reads what
    // the client says until the client ends or the linger is over.
    let mut theirs = theirs;
    tokio::spawn(async move {
        let _ = theirs.shutdown().await;
        let mut sink = [0u8; 4096];
        let _ = tokio::time::timeout(SSH_LINGER, async {
            while matches!(theirs.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
    });
    relay(conn, ours, super::ssh::disconnect(&text)).await;
}

/// `CONNECT target` on a new channel connection: the connection and any bytes that came
/// after the success reply, or the refusal: the denial (recorded when the run records
/// them), or `None` when the channel failed.
async fn ask(
    flows: &Flows,
    target: &str,
) -> Result<(UnixStream, Vec<u8>), Option<crate::report::Denial>> {
    let failed = |error: String| {
        flows.channel_errors.fetch_add(1, Ordering::Relaxed);
        flows.denials.channel_failed(
            &flows.dial.name(),
            ChannelFailure {
                via: "capture",
                target: Some(target.to_owned()),
                error,
            },
        );
    };
    let mut up = match flows.dial.open().await {
        Ok(up) => up,
        Err(e) => {
            failed(e.to_string());
            return Err(None);
        }
    };
    let request =
        format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nX-Mediator-Capture: 1\r\n\r\n");
    let answer = tokio::time::timeout(ANSWER_TIMEOUT, async {
        up.write_all(request.as_bytes()).await?;
        read_answer(&mut up).await
    })
    .await;
    let (status_ok, buf, head_len) = match answer {
        Ok(Ok(a)) => a,
        Ok(Err(e)) if e.kind() == ErrorKind::UnexpectedEof => {
            failed("it closed the connection without an answer".to_owned());
            return Err(None);
        }
        Ok(Err(e)) => {
            failed(e.to_string());
            return Err(None);
        }
        Err(_) => {
            failed(format!("no answer within {} s", ANSWER_TIMEOUT.as_secs()));
            return Err(None);
        }
    };
    if status_ok {
        return Ok((up, buf[head_len..].to_vec()));
    }
    let Sniff::Denied(mut d) = inspect_reply(&buf) else {
        return Err(None);
    };
    d.protocol = "connect";
    if let Some(answers) = flows.answers.clone() {
        // It may ask the admin API (blocking), and must be said before the refusal.
        let said = d.clone();
        let _ = tokio::task::spawn_blocking(move || answers.denied(said)).await;
    }
    Err(Some(d))
}

/// Read a CONNECT answer: whether it is a 2xx, the bytes read, and the head's length. A
/// refusal's body (the JSON denial) is read as far as its Content-Length says.
async fn read_answer(up: &mut UnixStream) -> std::io::Result<(bool, Vec<u8>, usize)> {
    let mut buf = Vec::with_capacity(1024);
    let head_len = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() >= MAX_ANSWER || up.read_buf(&mut buf).await? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
    };
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let _ = resp.parse(&buf[..head_len]);
    let code = resp.code.unwrap_or(0);
    if (200..300).contains(&code) {
        return Ok((true, buf, head_len));
    }
    let length = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        })
        .unwrap_or(0)
        .min(MAX_ANSWER);
    while buf.len() < head_len + length {
        if up.read_buf(&mut buf).await? == 0 {
            break;
        }
    }
    Ok((false, buf, head_len))
}

/// The DNS-over-TCP stub (RFC 1035 section 4.2.2: each message after a two-byte length).
async fn dns_over_tcp(mut s: UnixStream, stub: Arc<Stub>) {
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(DNS_IDLE, s.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if s.read_exact(&mut msg).await.is_err() {
            return;
        }
        let Some(reply) = stub.answer(&msg) else {
            return;
        };
        let Ok(n) = u16::try_from(reply.len()) else {
            return;
        };
        let mut out = n.to_be_bytes().to_vec();
        out.extend_from_slice(&reply);
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// How one direction of the relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Its sender finished (FIN or EOF), passed on.
    Finished,
    /// An error or a reset: the whole connection is reset.
    Broken,
}

/// Carry bytes both ways until both directions end; a break resets the child.
async fn relay(conn: Conn, up: UnixStream, early: Vec<u8>) {
    let mut early = Early {
        bytes: early,
        sent: 0,
    };
    let upward = poll_fn(|cx| child_to_channel(&conn, &up, cx));
    let downward = poll_fn(|cx| channel_to_child(&conn, &up, &mut early, cx));
    let (a, b) = tokio::join!(upward, downward);
    if a == End::Broken || b == End::Broken {
        conn.abort();
    }
}

fn handshaking(s: &tcp::Socket<'_>) -> bool {
    matches!(s.state(), tcp::State::Listen | tcp::State::SynReceived)
}

/// The child's bytes to the channel; the child's FIN becomes a write shutdown.
fn child_to_channel(conn: &Conn, up: &UnixStream, cx: &mut Context<'_>) -> Poll<End> {
    loop {
        let step = conn.poll_with(cx, |s, cx| {
            if handshaking(s) {
                s.register_recv_waker(cx.waker());
                return Poll::Pending;
            }
            if s.can_recv() {
                match up.poll_write_ready(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(_)) => return Poll::Ready(Some(End::Broken)),
                    Poll::Ready(Ok(())) => {}
                }
                let moved = s.recv(|data| match up.try_write(data) {
                    Ok(n) => (n, true),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => (0, true),
                    Err(_) => (0, false),
                });
                return Poll::Ready(match moved {
                    Ok(true) => None,
                    _ => Some(End::Broken),
                });
            }
            if !s.may_recv() {
                return Poll::Ready(Some(if s.state() == tcp::State::Closed {
                    End::Broken
                } else {
                    End::Finished
                }));
            }
            s.register_recv_waker(cx.waker());
            Poll::Pending
        });
        match step {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => {}
            Poll::Ready(Some(end)) => {
                let _ = socket2::SockRef::from(up).shutdown(Shutdown::Write);
                return Poll::Ready(end);
            }
        }
    }
}

/// The bytes read from the channel together with its success reply: the first the child
/// gets, once its handshake is complete (a socket still in SYN-RECEIVED takes none).
struct Early {
    bytes: Vec<u8>,
    /// How many of them the socket has taken.
    sent: usize,
}

/// The channel's bytes to the child (first the [`Early`] ones); its EOF becomes the
/// child's FIN.
fn channel_to_child(
    conn: &Conn,
    up: &UnixStream,
    early: &mut Early,
    cx: &mut Context<'_>,
) -> Poll<End> {
    loop {
        let step = conn.poll_with(cx, |s, cx| {
            if handshaking(s) {
                s.register_send_waker(cx.waker());
                return Poll::Pending;
            }
            if !s.may_send() {
                return Poll::Ready(Some(if s.state() == tcp::State::Closed {
                    End::Broken
                } else {
                    End::Finished
                }));
            }
            if !s.can_send() {
                s.register_send_waker(cx.waker());
                return Poll::Pending;
            }
            if early.sent < early.bytes.len() {
                return Poll::Ready(match s.send_slice(&early.bytes[early.sent..]) {
                    Ok(n) => {
                        early.sent += n;
                        None
                    }
                    Err(_) => Some(End::Broken),
                });
            }
            match up.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => return Poll::Ready(Some(End::Broken)),
                Poll::Ready(Ok(())) => {}
            }
            let moved = s.send(|buf| match up.try_read(buf) {
                Ok(0) => (0, Some(End::Finished)),
                Ok(n) => (n, None),
                Err(e) if e.kind() == ErrorKind::WouldBlock => (0, None),
                Err(_) => (0, Some(End::Broken)),
            });
            Poll::Ready(match moved {
                Ok(None) => None,
                Ok(Some(End::Finished)) => {
                    s.close();
                    Some(End::Finished)
                }
                Ok(Some(End::Broken)) | Err(_) => Some(End::Broken),
            })
        });
        match step {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => {}
            Poll::Ready(Some(end)) => return Poll::Ready(end),
        }
    }
}
