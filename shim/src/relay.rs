//! The channel binding, host side: accept on the sandbox's loopback listener (whose fd the
//! inner stage handed out) and carry each connection to the authority's Unix socket.
//!
//! The relay never interprets what it carries, except the mediator's first answer on each
//! connection ([`Watch`]): an HTTP response with `X-Mediator-Decision: deny; ...` and its
//! JSON body, or a SOCKS5 failure reply. That answer is held until it is known, and a
//! denial is said on stderr ([`Answers`]) before the client gets the answer, so the line
//! comes before the client's own error. Capture reads its CONNECT answers with the same
//! [`inspect_reply`]. Each connection starts with the run's labels (a PROXY protocol v2
//! header, `Binding::header`), written before anything the command sends.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::control::{Binding, Bound};
use crate::feed::Answers;
use crate::report::{ChannelFailure, Denial, Denials};

/// What the relay counted during the run.
pub(crate) struct RelayStats {
    /// Connections accepted from the sandbox.
    pub(crate) connections: AtomicU64,
    /// Connections that could not reach the mediator socket.
    pub(crate) channel_errors: AtomicU64,
    /// The run's one list (its channel failures).
    pub(crate) denials: Arc<Denials>,
    /// Where a denial read in an answer goes.
    pub(crate) answers: Answers,
    /// Notes the program behind each tunnel (see [`crate::rejected`]).
    pub(crate) trust: crate::rejected::Trust,
}

/// Accept forever, one pair of threads per connection.
pub(crate) fn serve(listener: TcpListener, binding: Arc<Binding>, stats: Arc<RelayStats>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        stats.connections.fetch_add(1, Ordering::Relaxed);
        // The channel as it is now: a rebind moves new connections only.
        let Bound::Socket(socket) = binding.current() else {
            continue;
        };
        let (stats, binding) = (Arc::clone(&stats), Arc::clone(&binding));
        let _ = std::thread::Builder::new()
            .name("relay".into())
            .spawn(move || relay_one(conn, &socket, binding.header(), &stats));
    }
}

/// Most bytes of the client's first ones kept (its SOCKS5 request names the target).
const CLIENT_HEAD: usize = 1024;

fn relay_one(client: TcpStream, socket: &std::path::Path, labels: &[u8], stats: &RelayStats) {
    // The run's labels go first, from outside the sandbox (design section 20): whatever
    // the command sends comes after them, so it cannot set its own.
    let upstream = match UnixStream::connect(socket).and_then(|mut u| {
        u.write_all(labels)?;
        Ok(u)
    }) {
        Ok(u) => u,
        Err(e) => {
            stats.channel_errors.fetch_add(1, Ordering::Relaxed);
            stats.denials.channel_failed(
                &socket.display().to_string(),
                ChannelFailure {
                    via: "proxy",
                    target: None,
                    error: e.to_string(),
                },
            );
            return;
        }
    };
    let (Ok(mut c_read), Ok(mut u_write)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let head = Arc::new(Mutex::new(Vec::new()));
    let up = {
        let head = Arc::clone(&head);
        std::thread::Builder::new()
            .name("relay-up".into())
            .spawn(move || {
                carry_up(&mut c_read, &mut u_write, &head);
                let _ = u_write.shutdown(Shutdown::Write);
            })
    };
    let mut u_read = upstream;
    let mut c_write = client;
    // Down: the first answer is held until it is known, its denial said first.
    let mut watch = Watch::default();
    let mut buf = vec![0u8; 16 * 1024];
    let mut opened = false;
    loop {
        let n = match u_read.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if watch.done {
            // The answer is known: plain copy from now on.
            if c_write.write_all(&buf[..n]).is_err() {
                break;
            }
            continue;
        }
        let (pass, denied) = watch.take(&buf[..n]);
        let tunnel = watch.done && denied.is_none() && !std::mem::replace(&mut opened, true);
        if let Some(d) = denied {
            stats.answers.denied(with_target(d, &head));
        }
        if c_write.write_all(&pass).is_err() {
            break;
        }
        if tunnel {
            note_program(&c_write, &head, &stats.trust);
        }
    }
    let (pass, denied) = watch.end();
    if let Some(d) = denied {
        stats.answers.denied(with_target(d, &head));
    }
    let _ = c_write.write_all(&pass);
    let _ = c_write.shutdown(Shutdown::Write);
    if let Ok(h) = up {
        let _ = h.join();
    }
}

/// The client's bytes to the mediator; the first [`CLIENT_HEAD`] are kept in `head`
/// before they are passed on (so that they are there when the answer comes).
fn carry_up(from: &mut TcpStream, to: &mut UnixStream, head: &Mutex<Vec<u8>>) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut kept = 0;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if kept < CLIENT_HEAD {
            let room = (CLIENT_HEAD - kept).min(n);
            head.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(&buf[..room]);
            kept += room;
        }
        if to.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// The client's tunnel is open (its CONNECT or SOCKS5 request was answered, not
/// denied): notes the program behind it, for the line a refusal of the mediator's
/// certificate gets. The connection's socket, inside, is the client's address -> the
/// listener's.
fn note_program(client: &TcpStream, head: &Mutex<Vec<u8>>, trust: &crate::rejected::Trust) {
    let head = head.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let target = match head.first() {
        Some(0x05) => socks_target(&head),
        _ => connect_target(&head),
    };
    if let (Some((host, port)), Ok(peer), Ok(local)) =
        (target, client.peer_addr(), client.local_addr())
    {
        trust.opened(&host, port, peer, local);
    }
}

/// The target of a `CONNECT host:port HTTP/1.1` request line.
fn connect_target(head: &[u8]) -> Option<(String, u16)> {
    let line = head.split(|&b| b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let target = line.strip_prefix("CONNECT ")?.split(' ').next()?;
    let (host, port) = target.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_owned(), port.parse().ok()?))
}

/// `d` with the destination its client asked for, when the answer named none (a SOCKS5
/// reply): read from the client's request.
fn with_target(mut d: Denial, head: &Mutex<Vec<u8>>) -> Denial {
    let head = head.lock().unwrap_or_else(PoisonError::into_inner);
    if d.host.is_none()
        && let Some((host, port)) = socks_target(&head)
    {
        d.host = Some(host);
        d.port = Some(port);
    }
    // An HTTP answer to a CONNECT: the decision's protocol is `connect`, as the
    // mediator's records say.
    if d.protocol == "http" && head.starts_with(b"CONNECT ") {
        d.protocol = "connect";
    }
    d
}

/// The target of a SOCKS5 `CONNECT` (RFC 1928 section 4) after the method selection
/// (`05 n methods...`) in a client's first bytes: a name (`ATYP` 3), an IPv4 or an IPv6
/// address, and the port.
fn socks_target(b: &[u8]) -> Option<(String, u16)> {
    let methods = usize::from(*b.get(1)?);
    let req = b.get(2 + methods..)?;
    if req.first() != Some(&0x05) || req.get(1) != Some(&0x01) {
        return None;
    }
    let (host, rest) = match req.get(3)? {
        0x01 => {
            let a: [u8; 4] = req.get(4..8)?.try_into().ok()?;
            (std::net::Ipv4Addr::from(a).to_string(), req.get(8..)?)
        }
        0x03 => {
            let len = usize::from(*req.get(4)?);
            let name = std::str::from_utf8(req.get(5..5 + len)?).ok()?;
            (name.to_owned(), req.get(5 + len..)?)
        }
        0x04 => {
            let a: [u8; 16] = req.get(4..20)?.try_into().ok()?;
            (std::net::Ipv6Addr::from(a).to_string(), req.get(20..)?)
        }
        _ => return None,
    };
    let port = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?);
    Some((host, port))
}

/// The mediator's first answer on one connection, held until it is known to be a denial
/// or not: an HTTP response head (and a denial's JSON body), or, for SOCKS5, the reply
/// after the method selection (which is passed on at once: the client answers it before
/// the reply can come). Then everything passes.
#[derive(Debug, Default)]
struct Watch {
    /// Bytes of the answer held so far.
    held: Vec<u8>,
    /// Of those, how many were passed on already (a SOCKS5 method selection).
    passed: usize,
    /// The answer is known: everything passes.
    done: bool,
}

/// Most bytes of an answer held before it is passed on undecided.
const HOLD_MAX: usize = 16 * 1024;

impl Watch {
    /// Takes `bytes` read from the mediator: what may go to the client now, and the
    /// denial the answer turned out to be (to say before those bytes go).
    fn take(&mut self, bytes: &[u8]) -> (Vec<u8>, Option<Denial>) {
        if self.done {
            return (bytes.to_vec(), None);
        }
        self.held.extend_from_slice(bytes);
        let decided = match self.held.first() {
            Some(0x05) => self.socks(),
            _ => match inspect_reply(&self.held) {
                Sniff::NeedMore if self.held.len() < HOLD_MAX => None,
                Sniff::Denied(d) => Some(Some(d)),
                Sniff::NeedMore | Sniff::NotDenied => Some(None),
            },
        };
        match decided {
            Some(denial) => (self.release(), denial),
            None => {
                // A SOCKS5 method selection passes before the reply is known.
                let early = if self.held.first() == Some(&0x05) {
                    self.held.len().min(2)
                } else {
                    0
                };
                let pass = self.held[self.passed..early.max(self.passed)].to_vec();
                self.passed = early.max(self.passed);
                (pass, None)
            }
        }
    }

    /// The SOCKS5 answer so far: `None` while the reply is incomplete; else the denial,
    /// if its REP is a failure. Only the method "no authentication" (0x00) is read: the
    /// channel is the authority, so a client has no credentials to send.
    fn socks(&self) -> Option<Option<Denial>> {
        match self.held.get(1) {
            None => None,
            Some(0x00) => match inspect_reply(&self.held) {
                Sniff::NeedMore => None,
                Sniff::Denied(d) => Some(Some(d)),
                Sniff::NotDenied => Some(None),
            },
            Some(_) => Some(None),
        }
    }

    /// Everything held and not yet passed; from now on everything passes.
    fn release(&mut self) -> Vec<u8> {
        self.done = true;
        let rest = self.held.split_off(self.passed);
        self.held = Vec::new();
        rest
    }

    /// The mediator ended the connection: what is still held, and the denial a short
    /// answer still makes.
    fn end(&mut self) -> (Vec<u8>, Option<Denial>) {
        if self.done {
            return (Vec::new(), None);
        }
        let denied = match inspect_reply_final(&self.held) {
            Sniff::Denied(d) => Some(d),
            _ => None,
        };
        (self.release(), denied)
    }
}

/// What the first bytes of a mediator reply say.
#[derive(Debug, PartialEq)]
pub(crate) enum Sniff {
    /// Not enough bytes yet.
    NeedMore,
    /// A success reply, or not a reply of the mediator's.
    NotDenied,
    /// A denial, as far as the reply tells.
    Denied(Denial),
}

/// The meaning of a SOCKS5 reply code (RFC 1928 section 6), for a failure.
fn socks_meaning(rep: u8) -> Option<&'static str> {
    Some(match rep {
        0x01 => "general SOCKS server failure",
        0x02 => "connection not allowed by ruleset",
        0x03 => "network unreachable",
        0x04 => "host unreachable",
        0x05 => "connection refused",
        0x06 => "TTL expired",
        0x07 => "command not supported",
        0x08 => "address type not supported",
        _ => return None,
    })
}

/// Look at the first bytes the mediator sent on a connection.
pub(crate) fn inspect_reply(b: &[u8]) -> Sniff {
    if b.first() == Some(&0x05) {
        // SOCKS5: method selection (2 bytes), then the reply: VER REP RSV ATYP ...
        if b.len() < 4 {
            return Sniff::NeedMore;
        }
        let rep = b[3];
        return match socks_meaning(rep) {
            None => Sniff::NotDenied,
            // REP carries no reason: say what it means and where the reason is.
            Some(meaning) => Sniff::Denied(Denial {
                protocol: "socks5",
                status: u16::from(rep),
                reason: None,
                host: None,
                port: None,
                detail: Some(format!(
                    "SOCKS5 REP 0x{rep:02x} ({meaning}); a SOCKS5 reply carries no reason: the mediator's decision log has it"
                )),
                hint: None,
                message: None,
            }),
        };
    }
    if !b.starts_with(b"HTTP/1.") {
        return if b.len() < 7 && b"HTTP/1.".starts_with(b) {
            Sniff::NeedMore
        } else {
            Sniff::NotDenied
        };
    }
    let Some(head_end) = b.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Sniff::NeedMore;
    };
    let head = String::from_utf8_lossy(&b[..head_end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .unwrap_or(0);
    let mut decision = None;
    let mut length = None;
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("x-mediator-decision") {
                decision = Some(v.trim().to_owned());
            } else if k.trim().eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<usize>().ok();
            }
        }
    }
    let Some(decision) = decision else {
        return Sniff::NotDenied;
    };
    if !decision.starts_with("deny") {
        return Sniff::NotDenied;
    }
    let body = &b[head_end + 4..];
    if let Some(len) = length
        && body.len() < len
    {
        return Sniff::NeedMore;
    }
    let reason = decision
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("reason="))
        .next()
        .map(str::to_owned);
    let json: serde_json::Value =
        serde_json::from_slice(&body[..length.unwrap_or(body.len()).min(body.len())])
            .unwrap_or_default();
    let s = |k: &str| json.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    Sniff::Denied(Denial {
        protocol: "http",
        status,
        reason: reason.or_else(|| s("reason")),
        host: s("host"),
        port: json
            .get("port")
            .and_then(|p| p.as_u64())
            .and_then(|p| u16::try_from(p).ok()),
        detail: s("detail"),
        hint: s("hint"),
        message: s("message"),
    })
}

/// At EOF, a reply whose body was shorter than announced still counts.
fn inspect_reply_final(b: &[u8]) -> Sniff {
    match inspect_reply(b) {
        Sniff::NeedMore => {
            let mut padded = b.to_vec();
            if !padded.windows(4).any(|w| w == b"\r\n\r\n") {
                padded.extend_from_slice(b"\r\n\r\n");
            }
            match inspect_reply(&strip_length(&padded)) {
                Sniff::Denied(d) => Sniff::Denied(d),
                _ => Sniff::NotDenied,
            }
        }
        other => other,
    }
}

fn strip_length(b: &[u8]) -> Vec<u8> {
    let Some(end) = b.windows(4).position(|w| w == b"\r\n\r\n") else {
        return b.to_vec();
    };
    let head = String::from_utf8_lossy(&b[..end]);
    let kept: Vec<&str> = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("content-length:"))
        .collect();
    let mut out = kept.join("\r\n").into_bytes();
    out.extend_from_slice(&b[end..]);
    out
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
