//! The sandbox's side of transparent capture (design section 15): a TUN device in the
//! sandbox's network namespace, configured over rtnetlink as the default route for IPv4
//! and IPv6. Its descriptor goes to the outer shim's user-space stack.
//!
//! The work is split so that little of it is on the way to the command's start: init
//! only opens, in the new namespaces, what the device is made through ([`open`]:
//! `/dev/net/tun`, before the mount view hides `/dev`, and an rtnetlink socket, which
//! belongs to the namespace it was made in) and hands both out; the outer shim, which
//! holds every capability over the user namespace it created, makes and configures the
//! device through them ([`create`]) while init builds the mount view, and tells init when
//! the command may start.
//!
//! It never touches another namespace and runs no program: the namespace (and the device
//! with it) dies with the sandbox.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};

use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
use rtnetlink::packet_route::link::{AfSpecInet6, AfSpecUnspec, In6AddrGenMode, LinkAttribute};

use crate::capture::{Addresses, MTU, TUN_QUEUE};
use crate::error::{Error, Result};
use crate::linux::sys;

/// The TUN device's name inside the sandbox.
pub(crate) const DEVICE: &str = "tun0";

/// Why capture cannot be set up, for the message the user sees.
fn failed(step: &str, detail: impl std::fmt::Display) -> Error {
    Error::Capture(format!("{step}: {detail}"))
}

/// What init opened in the sandbox's network namespace for the device to be made
/// through: `/dev/net/tun`, and an rtnetlink socket of that namespace.
pub(crate) struct Opened {
    /// `/dev/net/tun`, not yet attached to a device.
    pub(crate) tun: OwnedFd,
    /// An unbound `NETLINK_ROUTE` socket.
    pub(crate) netlink: OwnedFd,
}

/// In init: opens `/dev/net/tun` and an rtnetlink socket in this network namespace.
///
/// # Errors
/// [`Error::Capture`] naming the step that failed and what the kernel said.
pub(crate) fn open() -> Result<Opened> {
    use std::os::unix::fs::OpenOptionsExt;
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| {
            let hint = match e.kind() {
                std::io::ErrorKind::PermissionDenied => {
                    " (the device node is not usable by this user; most distributions make it mode 0666)"
                }
                std::io::ErrorKind::NotFound => " (no TUN support: load the tun module)",
                _ => "",
            };
            failed("create a TUN device through /dev/net/tun", format!("{e}{hint}"))
        })?;
    let netlink = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Netlink,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        nix::sys::socket::SockProtocol::NetlinkRoute,
    )
    .map_err(|e| failed("open an rtnetlink socket", e))?;
    Ok(Opened {
        tun: tun.into(),
        netlink,
    })
}

/// In the outer shim: makes the TUN device through what init [`open`]ed, and makes it the
/// default route; returns its descriptor.
///
/// # Errors
/// [`Error::Capture`] naming the step that failed (an ioctl, an rtnetlink request) and
/// what the kernel said.
pub(crate) fn create(opened: Opened, addrs: &Addresses) -> Result<OwnedFd> {
    let Opened { tun, netlink } = opened;
    // Persistent: closing the last descriptor then leaves the device to the namespace's
    // own teardown (asynchronous) instead of unregistering it on the spot, which costs
    // the shim about 20 ms at exit. The device cannot outlive the namespace, which dies
    // with the sandbox.
    sys::tun_attach(tun.as_fd(), DEVICE)
        .map_err(|e| failed("create a TUN device through /dev/net/tun", e))?;
    let index =
        sys::if_index(netlink.as_fd(), DEVICE).map_err(|e| failed("find the TUN device", e))?;
    let mut socket = sys::rtnetlink_socket(netlink);
    if let Err(e) = configure(&mut socket, index, addrs) {
        // The kernel goes on with the requests after one it refuses: a device left up
        // with some of its routes would take the command's packets with nothing reading
        // them. Removed, a connection fails at once (no route).
        remove(&socket, index);
        return Err(e);
    }
    Ok(tun)
}

/// No link-local address; up, MTU, transmit queue; the sandbox's own addresses, and the
/// two default routes: one datagram carrying the six rtnetlink requests (the kernel
/// handles them in order and acknowledges each, RFC 3549 section 2.3.2.2), then the six
/// acknowledgements. A blocking socket: no runtime to build on the way to the command's
/// start.
fn configure(socket: &mut rtnetlink::sys::Socket, index: u32, addrs: &Addresses) -> Result<()> {
    let steps = requests(index, addrs);
    let mut datagram = Vec::new();
    for (seq, (_, message)) in (1u32..).zip(steps.iter()) {
        let mut request = NetlinkMessage::from(message.clone());
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        request.header.sequence_number = seq;
        request.finalize();
        let at = datagram.len();
        datagram.resize(at + request.buffer_len(), 0);
        request.serialize(&mut datagram[at..]);
    }
    socket
        .bind_auto()
        .map_err(|e| failed("bind an rtnetlink socket", e))?;
    let kernel = rtnetlink::sys::SocketAddr::new(0, 0);
    socket
        .send_to(&datagram, &kernel, 0)
        .map_err(|e| failed("send the rtnetlink requests", e))?;
    acknowledged(socket, &steps)
}

/// Deletes the device `index` (`RTM_DELLINK`), its addresses and routes with it; best
/// effort, for a device whose configuration failed. The kernel handles the request
/// within the send.
fn remove(socket: &rtnetlink::sys::Socket, index: u32) {
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::DelLink(
        rtnetlink::LinkUnspec::new_with_index(index).build(),
    ));
    request.header.flags = NLM_F_REQUEST;
    request.finalize();
    let mut datagram = vec![0; request.buffer_len()];
    request.serialize(&mut datagram);
    let _ = socket.send_to(&datagram, &rtnetlink::sys::SocketAddr::new(0, 0), 0);
}

/// The requests, each with the step it is named by when the kernel refuses it.
fn requests(index: u32, addrs: &Addresses) -> Vec<(String, RouteNetlinkMessage)> {
    // No link-local address (IPv6 address generation off, before the device is up): the
    // kernel would otherwise send a router solicitation from it at once, a packet on the
    // device that starts the capture stack in every run (see `crate::capture`), and the
    // point-to-point device needs none.
    let no_link_local =
        LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(vec![AfSpecInet6::AddrGenMode(
            In6AddrGenMode::None,
        )])]);
    let mut steps: Vec<(String, RouteNetlinkMessage)> = vec![(
        "turn IPv6 address generation off on the TUN device".to_owned(),
        RouteNetlinkMessage::SetLink(
            rtnetlink::LinkUnspec::new_with_index(index)
                .append_extra_attribute(no_link_local)
                .build(),
        ),
    )];
    steps.push((
        "bring the TUN device up".to_owned(),
        RouteNetlinkMessage::SetLink(
            rtnetlink::LinkUnspec::new_with_index(index)
                .mtu(MTU as u32)
                .txqueuelen(TUN_QUEUE)
                .up()
                .build(),
        ),
    ));
    let v4 = addrs.tun_v4();
    let v6 = addrs.tun_v6();
    for (ip, mut address) in [
        (
            IpAddr::V4(v4),
            rtnetlink::AddressMessageBuilder::<Ipv4Addr>::new()
                .index(index)
                .address(v4, 32)
                .build(),
        ),
        (
            IpAddr::V6(v6),
            rtnetlink::AddressMessageBuilder::<Ipv6Addr>::new()
                .index(index)
                .address(v6, 128)
                .build(),
        ),
    ] {
        // No duplicate-address detection: the address would stay tentative (unusable)
        // for a second, and nothing else is on this link.
        address
            .attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
        let prefix = address.header.prefix_len;
        steps.push((
            format!("add address {ip}/{prefix}"),
            RouteNetlinkMessage::NewAddress(address),
        ));
    }
    steps.push((
        "add the IPv4 default route".to_owned(),
        RouteNetlinkMessage::NewRoute(
            rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new()
                .output_interface(index)
                .build(),
        ),
    ));
    steps.push((
        "add the IPv6 default route".to_owned(),
        RouteNetlinkMessage::NewRoute(
            rtnetlink::RouteMessageBuilder::<Ipv6Addr>::new()
                .output_interface(index)
                .build(),
        ),
    ));

    steps
}

/// Reads an acknowledgement for each of `steps`; the first refusal is the error.
fn acknowledged(
    socket: &rtnetlink::sys::Socket,
    steps: &[(String, RouteNetlinkMessage)],
) -> Result<()> {
    let mut acknowledged = 0;
    while acknowledged < steps.len() {
        let (reply, _) = socket
            .recv_from_full()
            .map_err(|e| failed("read the rtnetlink acknowledgements", e))?;
        acknowledged += acknowledgements(&reply, steps)?;
    }
    Ok(())
}

/// The acknowledgements in one reply datagram (a run of netlink messages, each 4-byte
/// aligned: `NLMSG_ALIGN`), or the first refusal among them, named by the step its
/// sequence number points at (sequence numbers count the steps from 1).
fn acknowledgements(reply: &[u8], steps: &[(String, RouteNetlinkMessage)]) -> Result<usize> {
    let mut acknowledged = 0;
    let mut rest = reply;
    while !rest.is_empty() {
        let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest)
            .map_err(|e| failed("read the rtnetlink acknowledgements", e))?;
        let length = usize::try_from(message.header.length).unwrap_or(usize::MAX);
        if length == 0 {
            break;
        }
        if let NetlinkPayload::Error(ack) = message.payload {
            let step = usize::try_from(message.header.sequence_number)
                .ok()
                .and_then(|seq| steps.get(seq.wrapping_sub(1)))
                .map_or("an rtnetlink request", |(what, _)| what.as_str());
            if let Some(code) = ack.code {
                return Err(failed(step, std::io::Error::from_raw_os_error(-code.get())));
            }
            acknowledged += 1;
        }
        rest = rest.get(length.next_multiple_of(4)..).unwrap_or_default();
    }
    Ok(acknowledged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_core::{ErrorMessage, NetlinkHeader};

    fn reply(answers: &[(u32, i32)]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(seq, code) in answers {
            let mut error = ErrorMessage::default();
            error.code = std::num::NonZeroI32::new(code);
            error.header = vec![0; 16];
            let mut m = NetlinkMessage::<RouteNetlinkMessage>::new(
                NetlinkHeader::default(),
                NetlinkPayload::Error(error),
            );
            m.header.sequence_number = seq;
            m.finalize();
            let at = out.len();
            out.resize(at + m.buffer_len().next_multiple_of(4), 0);
            m.serialize(&mut out[at..]);
        }
        out
    }

    fn steps() -> Vec<(String, RouteNetlinkMessage)> {
        requests(7, &Addresses::generate())
    }

    #[test]
    fn acknowledgements_are_counted() {
        let steps = steps();
        assert_eq!(
            acknowledgements(&reply(&[(1, 0), (2, 0)]), &steps).unwrap(),
            2
        );
        assert_eq!(acknowledgements(&[], &steps).unwrap(), 0);
    }

    #[test]
    fn a_refusal_is_named_by_its_step() {
        let steps = steps();
        let e = acknowledgements(&reply(&[(1, 0), (2, 0), (3, -libc::EEXIST)]), &steps)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("{}: ", steps[2].0)) && e.contains("File exists"),
            "{e}"
        );
        let e = acknowledgements(&reply(&[(99, -libc::EPERM)]), &steps)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("an rtnetlink request: ") && e.contains("not permitted"),
            "{e}"
        );
    }

    #[test]
    fn a_truncated_reply_is_an_error_not_an_acknowledgement() {
        let r = reply(&[(1, 0)]);
        assert!(acknowledgements(&r[..r.len() - 4], &steps()).is_err());
    }
}
