//! The hand-off message from init to the outer shim: the sandbox's proxy listener, what
//! the TUN device is made through when capture is asked for, and a small payload saying
//! which; and the outer shim's answer that the command may start.

use std::net::TcpListener;
use std::os::fd::OwnedFd;

use nix::sys::socket::{AddressFamily, SockFlag, SockType};

use super::capture;
use crate::error::{Error, Result};
use crate::sandbox::CaptureState;

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

/// What init handed over, before the outer shim made the TUN device.
pub(super) struct Inbound {
    /// The sandbox's loopback proxy listener.
    pub(super) listener: TcpListener,
    /// Capture: what the device is to be made through, or why it cannot be.
    pub(super) capture: InboundCapture,
}

/// Capture as init handed it over.
pub(super) enum InboundCapture {
    /// Not asked for.
    Off,
    /// `/dev/net/tun` and an rtnetlink socket, opened in the sandbox's namespaces.
    Opened(capture::Opened),
    /// Asked for by default, but the kernel refused: why.
    Unavailable(String),
}

/// What init handed over: `[listener, tun?, netlink?]`, and the payload `port (2 bytes),
/// capture state (0 off, 1 opened, 2 unavailable), why it is unavailable (UTF-8)`.
pub(super) fn handoff_of(fds: Vec<OwnedFd>, payload: &[u8]) -> Result<Inbound> {
    let bad = || Error::Usage("the sandbox's hand-off message is malformed".into());
    let mut fds = fds.into_iter();
    let listener = TcpListener::from(fds.next().ok_or_else(bad)?);
    let capture = match (payload.get(2), fds.next(), fds.next()) {
        (Some(1), Some(tun), Some(netlink)) => {
            InboundCapture::Opened(capture::Opened { tun, netlink })
        }
        (Some(2), None, None) => InboundCapture::Unavailable(
            String::from_utf8_lossy(payload.get(3..).unwrap_or_default()).into_owned(),
        ),
        (Some(0), None, None) => InboundCapture::Off,
        _ => return Err(bad()),
    };
    Ok(Inbound { listener, capture })
}

/// The payload of the hand-off (see [`handoff_of`]).
// `capture`'s `String` is the reason capture degraded, said once on stderr.
pub(super) fn handoff_payload(
    port: u16,
    capture: &std::result::Result<Option<capture::Opened>, String>,
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

/// The outer shim's word to init that the command may start: capture up (`u`, the stub
/// resolver then covers `/etc/resolv.conf`) or not (`n`).
pub(super) const GO_CAPTURING: u8 = b'u';
/// See [`GO_CAPTURING`].
pub(super) const GO_WITHOUT_CAPTURE: u8 = b'n';
/// The outer shim's word to init that the command must not start (the outer shim said
/// why): init leaves with [`crate::sandbox::EXIT_SHIM_FAILURE`].
pub(super) const STOP: u8 = b'x';

/// Makes the TUN device through what init opened, when it did: the state `serve` gets.
/// A device that cannot be made stops the run when capture was asked for (`required`),
/// and otherwise leaves capture unavailable, with why.
///
/// # Errors
/// [`Error::Capture`] when `required` and the device cannot be made.
pub(super) fn make_device(
    inbound: InboundCapture,
    job: Option<&crate::sandbox::CaptureJob>,
) -> Result<CaptureState> {
    Ok(match (inbound, job) {
        (InboundCapture::Opened(opened), Some(job)) => match capture::create(opened, &job.addrs) {
            Ok(tun) => CaptureState::Up(tun),
            Err(e) if job.required => return Err(e),
            Err(Error::Capture(why)) => CaptureState::Unavailable(why),
            Err(e) => CaptureState::Unavailable(e.to_string()),
        },
        (InboundCapture::Unavailable(why), _) => CaptureState::Unavailable(why),
        (InboundCapture::Off | InboundCapture::Opened(_), _) => CaptureState::Off,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fds(n: usize) -> Vec<OwnedFd> {
        (0..n)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
            .collect()
    }

    #[test]
    fn capture_comes_as_init_said_it() {
        let opened = |p: &[u8], n| match handoff_of(fds(n), p).map(|i| i.capture) {
            Ok(InboundCapture::Opened(_)) => "opened",
            Ok(InboundCapture::Off) => "off",
            Ok(InboundCapture::Unavailable(why)) if why == "no tun" => "unavailable",
            Ok(InboundCapture::Unavailable(_)) => "unavailable, but why?",
            Err(_) => "malformed",
        };
        assert_eq!(opened(&[0, 80, 1], 3), "opened");
        assert_eq!(opened(&[0, 80, 0], 1), "off");
        assert_eq!(opened(b"\0\x50\x02no tun", 1), "unavailable");
        // The device is made through both descriptors, or not at all.
        assert_eq!(opened(&[0, 80, 1], 2), "malformed");
        assert_eq!(opened(&[0, 80, 0], 3), "malformed");
        assert_eq!(opened(&[0, 80], 1), "malformed");
        assert_eq!(opened(&[0, 80, 0], 0), "malformed");
    }

    #[test]
    fn the_payload_says_what_init_opened() {
        assert_eq!(handoff_payload(80, &Ok(None)), [0, 80, 0]);
        let why = "é".repeat(600);
        let p = handoff_payload(8080, &Err(why));
        assert_eq!(&p[..3], [0x1f, 0x90, 2]);
        // Cut at a character boundary, within the receive buffer.
        assert!(p.len() <= 1003 && std::str::from_utf8(&p[3..]).is_ok());
    }
}
