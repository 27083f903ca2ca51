//! The hand-off message from init to the outer shim: the sandbox's proxy listener, the TUN
//! device when capture is up, and a small payload saying which.

use std::net::TcpListener;
use std::os::fd::OwnedFd;

use nix::sys::socket::{AddressFamily, SockFlag, SockType};

use crate::error::{Error, Result};
use crate::sandbox::{CaptureState, Handoff};

/// A connected pair of Unix `SOCK_SEQPACKET` sockets, close-on-exec: what a descriptor
/// comes back to the outer shim over (the listener from init, the violation filter's
/// listener from the command). `what` names it in an error.
pub(super) fn socket_pair(what: &str) -> Result<(OwnedFd, OwnedFd)> {
    nix::sys::socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| Error::sys(format!("socketpair for {what}"), e))
}

/// What init handed over: `[listener, tun?]`, and the payload `port (2 bytes), capture
/// state (0 off, 1 up, 2 unavailable), why it is unavailable (UTF-8)`.
pub(super) fn handoff_of(fds: Vec<OwnedFd>, payload: &[u8]) -> Result<Handoff> {
    let bad = || Error::Usage("the sandbox's hand-off message is malformed".into());
    let mut fds = fds.into_iter();
    let listener = TcpListener::from(fds.next().ok_or_else(bad)?);
    let capture = match (payload.get(2), fds.next()) {
        (Some(1), Some(tun)) => CaptureState::Up(tun),
        (Some(2), None) => CaptureState::Unavailable(
            String::from_utf8_lossy(payload.get(3..).unwrap_or_default()).into_owned(),
        ),
        (Some(0), None) => CaptureState::Off,
        _ => return Err(bad()),
    };
    Ok(Handoff { listener, capture })
}

/// The payload of the hand-off (see [`handoff_of`]).
// `capture`'s `String` is the reason capture degraded, said once on stderr.
pub(super) fn handoff_payload(
    port: u16,
    capture: &std::result::Result<Option<OwnedFd>, String>,
) -> Vec<u8> {
    let mut p = port.to_be_bytes().to_vec();
    match capture {
        Ok(None) => p.push(0),
        Ok(Some(_)) => p.push(1),
        Err(why) => {
            p.push(2);
            // The receive buffer is 1 KiB.
            let mut end = why.len().min(1000);
            while !why.is_char_boundary(end) {
                end -= 1;
            }
            p.extend_from_slice(&why.as_bytes()[..end]);
        }
    }
    p
}
