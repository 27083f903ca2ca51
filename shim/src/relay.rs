//! The channel binding, host side: accept on the sandbox's loopback listener (whose fd the
//! inner stage handed out) and carry each connection to the authority's Unix socket.
//!
//! The relay never interprets what it carries, except to notice the mediator's denial
//! replies in the first response of each connection for `--report` (an HTTP response with
//! `X-Mediator-Decision: deny; ...` and its JSON body, or a SOCKS5 failure reply). Capture
//! reads its CONNECT answers with the same [`inspect_reply`]. Each connection starts with
//! the run's labels (a PROXY protocol v2 header, `Binding::header`), written before
//! anything the command sends.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::control::{Binding, Bound};
use crate::report::{ChannelFailure, Denial, Denials};

/// What the relay counted during the run.
#[derive(Debug)]
pub(crate) struct RelayStats {
    /// Connections accepted from the sandbox.
    pub(crate) connections: AtomicU64,
    /// Connections that could not reach the mediator socket.
    pub(crate) channel_errors: AtomicU64,
    /// Denials seen in mediator replies (the run's one list).
    pub(crate) denials: Arc<Denials>,
    /// Record them (`false` when the mediator's admin API is the source, see
    /// [`crate::feed`]).
    pub(crate) record: bool,
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
    let up = std::thread::Builder::new()
        .name("relay-up".into())
        .spawn(move || {
            let _ = std::io::copy(&mut c_read, &mut u_write);
            let _ = u_write.shutdown(Shutdown::Write);
        });
    let mut u_read = upstream;
    let mut c_write = client;
    // Down: sniff the first reply, then plain copy.
    let mut sniff = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut sniffing = true;
    loop {
        let n = match u_read.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if c_write.write_all(&buf[..n]).is_err() {
            break;
        }
        if sniffing {
            sniff.extend_from_slice(&buf[..n]);
            match inspect_reply(&sniff) {
                Sniff::NeedMore if sniff.len() < 16 * 1024 => {}
                Sniff::Denied(d) => {
                    if stats.record {
                        stats.denials.push(d);
                    }
                    sniffing = false;
                }
                _ => sniffing = false,
            }
            if !sniffing {
                sniff = Vec::new();
            }
        }
    }
    if sniffing
        && let Sniff::Denied(d) = inspect_reply_final(&sniff)
        && stats.record
    {
        stats.denials.push(d);
    }
    let _ = c_write.shutdown(Shutdown::Write);
    if let Ok(h) = up {
        let _ = h.join();
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
mod tests {
    use super::*;

    #[test]
    fn http_denial_is_parsed_from_header_and_body() {
        let body = r#"{"error":"egress_denied","authority":"a","host":"evil.example","port":443,"reason":"not_in_allowlist","detail":"no rule","hint":"add evil.example:443"}"#;
        let reply = format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nX-Mediator-Decision: deny; reason=not_in_allowlist\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let Sniff::Denied(d) = inspect_reply(reply.as_bytes()) else {
            panic!()
        };
        assert_eq!(d.status, 403);
        assert_eq!(d.reason.as_deref(), Some("not_in_allowlist"));
        assert_eq!(d.host.as_deref(), Some("evil.example"));
        assert_eq!(d.port, Some(443));
        assert_eq!(d.hint.as_deref(), Some("add evil.example:443"));
        // Split across reads: needs more until the body is complete.
        assert_eq!(
            inspect_reply(&reply.as_bytes()[..reply.len() - 5]),
            Sniff::NeedMore
        );
    }

    #[test]
    fn allowed_connect_and_origin_headers_are_not_denials() {
        assert_eq!(
            inspect_reply(b"HTTP/1.1 200 Connection established\r\n\r\n"),
            Sniff::NotDenied
        );
        assert_eq!(
            inspect_reply(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"),
            Sniff::NotDenied
        );
        assert_eq!(inspect_reply(b"\x16\x03\x01"), Sniff::NotDenied);
    }

    #[test]
    fn socks5_not_allowed_reply_is_a_denial() {
        assert!(matches!(
            inspect_reply(&[5, 0, 5, 2, 0, 1, 0, 0, 0, 0, 0, 0]),
            Sniff::Denied(_)
        ));
        assert_eq!(inspect_reply(&[5, 0, 5, 0, 0, 1]), Sniff::NotDenied);
        let Sniff::Denied(d) = inspect_reply(&[5, 0, 5, 4, 0, 1]) else {
            panic!("REP 0x04 is a failure");
        };
        assert_eq!(d.status, 4);
        assert!(d.detail.unwrap().contains("host unreachable"));
        assert_eq!(inspect_reply(&[5, 0]), Sniff::NeedMore);
    }
}
