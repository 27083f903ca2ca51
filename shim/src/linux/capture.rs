//! The sandbox's side of transparent capture (design section 15), run by the inner init
//! in the new network namespace while it still holds `CAP_NET_ADMIN` there: a TUN device
//! (through `/dev/net/tun`, before the mount view hides `/dev`), configured over rtnetlink
//! as the default route for IPv4 and IPv6. Its descriptor goes to the outer shim, whose
//! user-space stack serves it.
//!
//! It never touches another namespace and runs no program: the namespace (and the device
//! with it) dies with the sandbox.

use std::net::IpAddr;
use std::os::fd::OwnedFd;

use crate::capture::{Addresses, MTU, TUN_QUEUE};
use crate::error::{Error, Result};
use crate::linux::sys;

/// The TUN device's name inside the sandbox.
pub(crate) const DEVICE: &str = "tun0";

/// Why capture cannot be set up, for the message the user sees.
fn failed(step: &str, detail: impl std::fmt::Display) -> Error {
    Error::Capture(format!("{step}: {detail}"))
}

/// Create the TUN device and make it the default route; returns its descriptor.
///
/// # Errors
/// [`Error::Capture`] naming the step that failed (`open /dev/net/tun`, an rtnetlink
/// request) and what the kernel said.
pub(crate) fn create(addrs: &Addresses) -> Result<OwnedFd> {
    let mut config = tun::Configuration::default();
    // Layer 3, no packet-information header (the crate's Linux default).
    config.tun_name(DEVICE).layer(tun::Layer::L3);
    let mut device = tun::create(&config).map_err(|e| {
        let hint = match &e {
            tun::Error::Io(io) if io.kind() == std::io::ErrorKind::PermissionDenied => {
                " (the device node is not usable by this user; most distributions make it mode 0666)"
            }
            tun::Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound => {
                " (no TUN support: load the tun module)"
            }
            _ => "",
        };
        failed("create a TUN device through /dev/net/tun", format!("{e}{hint}"))
    })?;
    // Persistent: closing the last descriptor then leaves the device to the namespace's
    // own teardown (asynchronous) instead of unregistering it on the spot, which costs
    // the shim about 20 ms at exit. The device cannot outlive the namespace, which dies
    // with the sandbox.
    device
        .persist()
        .map_err(|e| failed("make the TUN device persistent", e))?;
    let fd = sys::own_fd(std::os::fd::IntoRawFd::into_raw_fd(device));
    let index =
        nix::net::if_::if_nametoindex(DEVICE).map_err(|e| failed("find the TUN device", e))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| failed("netlink runtime", e))?;
    runtime.block_on(configure(index, addrs))?;
    Ok(fd)
}

/// Up, MTU, transmit queue, the sandbox's own addresses, and the two default routes.
async fn configure(index: u32, addrs: &Addresses) -> Result<()> {
    let (connection, handle, _) =
        rtnetlink::new_connection().map_err(|e| failed("open an rtnetlink socket", e))?;
    let task = tokio::spawn(connection);
    let link = rtnetlink::LinkUnspec::new_with_index(index)
        .mtu(MTU as u32)
        .txqueuelen(TUN_QUEUE)
        .up()
        .build();
    handle
        .link()
        .set(link)
        .execute()
        .await
        .map_err(|e| failed("bring the TUN device up", e))?;
    for (ip, prefix) in [
        (IpAddr::V4(addrs.tun_v4()), 32),
        (IpAddr::V6(addrs.tun_v6()), 128),
    ] {
        let mut req = handle.address().add(index, ip, prefix);
        // No duplicate-address detection: the address would stay tentative (unusable)
        // for a second, and nothing else is on this link.
        req.message_mut().attributes.push(
            rtnetlink::packet_route::address::AddressAttribute::Flags(
                rtnetlink::packet_route::address::AddressFlags::Nodad,
            ),
        );
        req.execute()
            .await
            .map_err(|e| failed(&format!("add address {ip}/{prefix}"), e))?;
    }
    for (route, family) in [
        (
            rtnetlink::RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .output_interface(index)
                .build(),
            "IPv4",
        ),
        (
            rtnetlink::RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .output_interface(index)
                .build(),
            "IPv6",
        ),
    ] {
        handle
            .route()
            .add(route)
            .execute()
            .await
            .map_err(|e| failed(&format!("add the {family} default route"), e))?;
    }
    task.abort();
    Ok(())
}
