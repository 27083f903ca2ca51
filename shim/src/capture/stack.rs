//! The user-space TCP/IP stack on the sandbox's TUN device (design section 15): smoltcp
//! (an `Interface` in AnyIP mode, so it answers for every destination) fed with the IP
//! packets the sandbox sends, and one loop that moves packets between the TUN and the
//! stack. TCP is smoltcp's; this file only routes packets to it:
//!
//! - a TCP SYN of a new connection is held back and announced as a [`NewFlow`]; the flow
//!   (see `super::flow`) asks the mediator first, then [`Shared::accept`] gives the SYN to a
//!   fresh socket (the child's `connect` completes) or [`Shared::refuse`] gives it to no
//!   socket, so smoltcp answers RST (the child's `connect` fails at once);
//! - UDP to port 53 (any address) is answered by the stub resolver as it is read, its
//!   reply written back to the TUN in the same turn of the loop (no socket buffer to
//!   overflow in a burst); a datagram the stub cannot answer is dropped and counted; every
//!   other UDP datagram, ICMP and every other protocol is dropped and counted (nothing
//!   leaves the namespace).
//!
//! Bounded: at most [`MAX_FLOWS`] TCP connections at once (more are refused with RST),
//! at most [`TX_QUEUE`] packets waiting for the TUN, at most [`READ_BATCH`] DNS replies
//! per turn, fixed socket buffers; the sandbox's kernel queues at most [`TUN_QUEUE`]
//! packets for the TUN before it drops (a burst that the loop has not read yet).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{
    HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpProtocol, IpRepr, Ipv4Packet, Ipv6Packet,
    TcpPacket, UdpPacket, UdpRepr,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, mpsc};

use super::addrs::Addresses;
use super::dns::Stub;
use super::drops::{Drops, Kind};
use super::names::Names;

/// The TUN device's MTU (bytes); the sandbox's interface is set to the same.
pub(crate) const MTU: usize = 65_535;
/// Most TCP connections (held SYNs and open sockets) at once.
pub(crate) const MAX_FLOWS: usize = 4096;
/// Most packets queued for the TUN device; smoltcp waits (and TCP retransmits) past it.
const TX_QUEUE: usize = 1024;
/// The TUN device's transmit queue in the sandbox (packets): how many the sandbox may
/// send before the loop reads them (a burst of DNS queries), past which its kernel drops.
pub(crate) const TUN_QUEUE: u32 = 8192;
/// Each TCP socket's receive and send buffer (bytes).
const TCP_BUFFER: usize = 256 * 1024;
/// How long smoltcp keeps retransmitting to a silent peer before it gives up.
const TCP_TIMEOUT: Duration = Duration::from_secs(120);
/// Most packet buffers kept for reuse (at most this many MTUs of memory).
const SPARE: usize = 32;
/// Most IP packets read from the TUN per turn of the loop.
const READ_BATCH: usize = 256;

/// A new TCP connection from the sandbox, its SYN held back until it is decided.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewFlow {
    /// The sandbox's end (its address on the TUN and its port).
    pub(crate) src: SocketAddr,
    /// Where it connects to.
    pub(crate) dst: SocketAddr,
}

/// Packets between the TUN loop and smoltcp.
#[derive(Default)]
struct Queues {
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
    /// Buffers of packets already written to the TUN, for the next ones: a fresh buffer
    /// per segment of up to 64 KiB costs page faults and zeroing on every packet.
    spare: Vec<Vec<u8>>,
}

impl Queues {
    /// Keeps the buffers of written packets (at most [`SPARE`]) for new ones.
    fn recycle(&mut self, written: &mut Vec<Vec<u8>>) {
        let room = SPARE.saturating_sub(self.spare.len());
        self.spare.extend(written.drain(..).take(room));
        written.clear();
    }
}

struct Rx(Vec<u8>);
struct Tx<'a>(&'a mut VecDeque<Vec<u8>>, &'a mut Vec<Vec<u8>>);

impl RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = self.1.pop().unwrap_or_default();
        buf.clear();
        buf.resize(len, 0);
        let r = f(&mut buf);
        self.0.push_back(buf);
        r
    }
}

impl Device for Queues {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _: Instant) -> Option<(Rx, Tx<'_>)> {
        if self.tx.len() >= TX_QUEUE {
            return None;
        }
        let frame = self.rx.pop_front()?;
        Some((Rx(frame), Tx(&mut self.tx, &mut self.spare)))
    }

    fn transmit(&mut self, _: Instant) -> Option<Tx<'_>> {
        if self.tx.len() < TX_QUEUE {
            Some(Tx(&mut self.tx, &mut self.spare))
        } else {
            None
        }
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = MTU;
        caps
    }
}

/// The stack's state, behind one lock that the loop and the flows take briefly.
pub(crate) struct State {
    iface: Interface,
    queues: Queues,
    sockets: SocketSet<'static>,
    /// Held SYNs of the connections being decided.
    pending: HashMap<(SocketAddr, SocketAddr), Vec<u8>>,
    /// Held SYNs plus sockets a flow still owns.
    flows: usize,
    /// Sockets whose flow ended, removed once closed.
    orphans: Vec<SocketHandle>,
}

/// What the loop and the flows share.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Wakes the loop: a flow read or queued data, or closed its socket.
    wake: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Give the held SYN of `flow` to a new socket, which answers it: the child's connect
    /// completes. `None` (and the SYN refused) if the child gave up meanwhile.
    pub(crate) fn accept(self: &Arc<Self>, flow: NewFlow) -> Option<Conn> {
        let mut st = self.lock();
        let syn = st.pending.remove(&(flow.src, flow.dst))?;
        let mut socket = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; TCP_BUFFER]),
            tcp::SocketBuffer::new(vec![0u8; TCP_BUFFER]),
        );
        socket.set_timeout(Some(TCP_TIMEOUT));
        socket.set_nagle_enabled(false);
        if socket.listen(IpEndpoint::from(flow.dst)).is_err() {
            st.flows -= 1;
            return None;
        }
        let handle = st.sockets.add(socket);
        st.queues.rx.push_back(syn);
        // Poll now, under the same lock: no other socket listens on this endpoint while
        // the SYN is taken, so it cannot go to another connection's socket.
        st.poll();
        let taken = st.sockets.get::<tcp::Socket<'_>>(handle).remote_endpoint()
            == Some(IpEndpoint::from(flow.src));
        if !taken {
            st.sockets.remove(handle);
            st.flows -= 1;
            return None;
        }
        drop(st);
        self.wake.notify_one();
        Some(Conn {
            shared: Arc::clone(self),
            handle,
        })
    }

    /// Give the held SYN of `flow` to no socket: smoltcp answers RST, and the child's
    /// connect fails at once.
    pub(crate) fn refuse(&self, flow: NewFlow) {
        let mut st = self.lock();
        if let Some(syn) = st.pending.remove(&(flow.src, flow.dst)) {
            st.queues.rx.push_back(syn);
            st.flows -= 1;
        }
        drop(st);
        self.wake.notify_one();
    }
}

impl State {
    fn poll(&mut self) {
        let now = Instant::now();
        let _ = self.iface.poll(now, &mut self.queues, &mut self.sockets);
    }

    /// Remove the sockets of ended flows once smoltcp is done with them.
    fn reap(&mut self) {
        let sockets = &mut self.sockets;
        self.orphans.retain(|&h| {
            let done = matches!(
                sockets.get::<tcp::Socket<'_>>(h).state(),
                tcp::State::Closed | tcp::State::TimeWait
            );
            if done {
                sockets.remove(h);
            }
            !done
        });
    }
}

/// One accepted TCP connection's socket, owned by its flow. Dropping it closes nothing by
/// itself (the flow closes or aborts the socket first); the socket is removed once
/// smoltcp has finished with it.
pub(crate) struct Conn {
    shared: Arc<Shared>,
    handle: SocketHandle,
}

impl Conn {
    /// Run `f` on the socket, then wake the loop (the socket may have something to send).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut tcp::Socket<'static>) -> R) -> R {
        let mut st = self.shared.lock();
        let r = f(st.sockets.get_mut::<tcp::Socket<'static>>(self.handle));
        drop(st);
        self.shared.wake.notify_one();
        r
    }

    /// [`Self::with`] for a `poll_*` function: `f` registers `cx`'s waker on the socket
    /// when it returns `Pending`.
    pub(crate) fn poll_with<R>(
        &self,
        cx: &mut Context<'_>,
        f: impl FnOnce(&mut tcp::Socket<'static>, &mut Context<'_>) -> Poll<R>,
    ) -> Poll<R> {
        self.with(|s| f(s, cx))
    }

    /// RST now (the child's connection is reset).
    pub(crate) fn abort(&self) {
        self.with(tcp::Socket::abort);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.orphans.push(self.handle);
        st.flows -= 1;
        drop(st);
        self.shared.wake.notify_one();
    }
}

/// What the loop needs besides the TUN.
pub(crate) struct Parts {
    /// This run's addresses (the stack's own, for its interface).
    pub(crate) addrs: Addresses,
    /// The stub resolver (UDP port 53, any address).
    pub(crate) stub: Arc<Stub>,
    /// Synthetic names, to label drops.
    pub(crate) names: Arc<Names>,
    /// Where drops are counted.
    pub(crate) drops: Arc<Drops>,
    /// Told when the sandbox has ended: what it sent is read to the end, then the loop
    /// returns (the TUN's open descriptor keeps its namespace, and the queue, alive).
    pub(crate) ended: Arc<Notify>,
}

/// Build the stack; the returned receiver yields each new TCP connection (bounded by
/// [`MAX_FLOWS`]).
pub(crate) fn build(
    addrs: Addresses,
) -> (Arc<Shared>, mpsc::Receiver<NewFlow>, mpsc::Sender<NewFlow>) {
    let mut queues = Queues::default();
    let mut config = Config::new(HardwareAddress::Ip);
    config.random_seed = u64::from(std::process::id())
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let mut iface = Interface::new(config, &mut queues, Instant::now());
    iface.update_ip_addrs(|ips| {
        // The stub's addresses, with prefixes that cover the sandbox's own: replies to the
        // sandbox are on-link. With AnyIP the interface answers for every destination.
        let _ = ips.push(IpCidr::new(IpAddress::Ipv4(addrs.dns_v4()), 15));
        let _ = ips.push(IpCidr::new(IpAddress::Ipv6(addrs.dns_v6()), 48));
    });
    let _ = iface.routes_mut().add_default_ipv4_route(addrs.dns_v4());
    let _ = iface.routes_mut().add_default_ipv6_route(addrs.dns_v6());
    iface.set_any_ip(true);
    let sockets = SocketSet::new(Vec::new());
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            iface,
            queues,
            sockets,
            pending: HashMap::new(),
            flows: 0,
            orphans: Vec::new(),
        }),
        wake: Notify::new(),
    });
    let (tx, rx) = mpsc::channel(MAX_FLOWS);
    (shared, rx, tx)
}

/// Move packets between the TUN device `tun` and the stack until the TUN closes (the
/// sandbox's network namespace is gone) or fails, or, once `parts.ended` is told, until
/// what the sandbox sent has been read (its last datagrams are counted as drops too).
pub(crate) async fn run(
    shared: Arc<Shared>,
    tun: OwnedFd,
    flows: mpsc::Sender<NewFlow>,
    parts: Parts,
) -> std::io::Result<()> {
    nix::fcntl::fcntl(
        &tun,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .map_err(std::io::Error::from)?;
    let tun = register(tun)?;
    let mut buf = vec![0u8; MTU + 64];
    let mut replies = Vec::with_capacity(READ_BATCH);
    // The packets for the sandbox, written each turn; their buffers go back to the stack.
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut ended = false;
    loop {
        // 1. What the sandbox sent; DNS answered at once.
        let mut closed = false;
        // Whether the TUN was read empty: only then can the loop wait for its readiness
        // (cleared below), else what is left would wait for the next packet or timer.
        let mut drained = false;
        for _ in 0..READ_BATCH {
            match nix::unistd::read(tun.get_ref(), &mut buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => ingress(&shared, &buf[..n], &flows, &parts, &mut replies),
                Err(nix::errno::Errno::EAGAIN) => {
                    drained = true;
                    break;
                }
                Err(nix::errno::Errno::EINTR) => {}
                // The namespace is gone (EBADFD, EIO): nothing more will come.
                Err(e) => return Err(e.into()),
            }
        }
        if closed || (ended && drained) {
            return Ok(());
        }
        for r in replies.drain(..) {
            if nix::unistd::write(&tun, &r.frame).is_err() {
                count(&parts, Kind::Dns, IpProtocol::Udp, r.to, Some(53));
            }
        }
        // 2. smoltcp's turn.
        let delay = {
            let mut st = shared.lock();
            st.queues.recycle(&mut frames);
            st.poll();
            st.reap();
            frames.extend(st.queues.tx.drain(..));
            let State { iface, sockets, .. } = &mut *st;
            iface.poll_delay(Instant::now(), sockets)
        };
        // 3. To the sandbox. A full TUN queue drops the packet; TCP sends it again.
        for f in &frames {
            let _ = nix::unistd::write(&tun, f);
        }
        // 4. Until something happens.
        let delay = delay.map_or(std::time::Duration::from_secs(1), |d| {
            std::time::Duration::from_micros(d.total_micros())
        });
        if delay.is_zero() || !drained {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            r = tun.readable() => {
                let mut guard = r?;
                // Readiness is re-armed here; the reads above stop at EAGAIN.
                guard.clear_ready();
            }
            () = shared.wake.notified() => {}
            () = parts.ended.notified() => ended = true,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// The TUN descriptor in the runtime's reactor.
#[allow(unsafe_code)] // tokio's registration is `unsafe` only because it cannot see ownership
fn register(tun: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: `tun` is moved into the AsyncFd, which owns it until it is dropped; an
    // OwnedFd's descriptor stays open and never changes while it is owned.
    unsafe { AsyncFd::register(tun) }.map_err(std::io::Error::from)
}

/// A DNS reply to write to the TUN.
struct Reply {
    frame: Vec<u8>,
    /// The address the query went to (for the drop count, should the write fail).
    to: IpAddr,
}

/// One IP packet from the sandbox; a DNS query's reply goes to `replies`.
fn ingress(
    shared: &Shared,
    frame: &[u8],
    flows: &mpsc::Sender<NewFlow>,
    parts: &Parts,
    replies: &mut Vec<Reply>,
) {
    let Some(p) = Parsed::of(frame) else { return };
    match p.protocol {
        IpProtocol::Tcp => {
            let Ok(tcp) = TcpPacket::new_checked(p.payload) else {
                return;
            };
            let src = SocketAddr::new(p.src, tcp.src_port());
            let dst = SocketAddr::new(p.dst, tcp.dst_port());
            let mut st = shared.lock();
            if tcp.syn() && !tcp.ack() {
                if st.pending.contains_key(&(src, dst)) {
                    return; // a retransmitted SYN while the first one is being decided
                }
                let open = st.sockets.iter().any(|(_, s)| match s {
                    smoltcp::socket::Socket::Tcp(t) => {
                        t.remote_endpoint() == Some(IpEndpoint::from(src))
                            && t.local_endpoint() == Some(IpEndpoint::from(dst))
                    }
                    _ => false,
                });
                if !open {
                    let flow = NewFlow { src, dst };
                    if st.flows < MAX_FLOWS && flows.try_send(flow).is_ok() {
                        st.flows += 1;
                        st.pending.insert((src, dst), frame.to_vec());
                        return;
                    }
                    // Too many at once: no socket takes it, so smoltcp resets it.
                }
            }
            st.queues.rx.push_back(frame.to_vec());
        }
        IpProtocol::Udp => {
            let Ok(udp) = UdpPacket::new_checked(p.payload) else {
                return;
            };
            if udp.dst_port() == 53 {
                match dns_reply(&p, &udp, &parts.stub) {
                    Some(frame) => replies.push(Reply { frame, to: p.dst }),
                    None => count(parts, Kind::Dns, p.protocol, p.dst, Some(53)),
                }
            } else {
                count(parts, Kind::Udp, p.protocol, p.dst, Some(udp.dst_port()));
            }
        }
        IpProtocol::Icmp => count(parts, Kind::Icmp, p.protocol, p.dst, None),
        IpProtocol::Icmpv6 => {
            // Neighbour discovery and multicast listener messages are the kernel's own
            // link chatter on the TUN, not the command's traffic.
            let link = matches!(p.payload.first(), Some(130..=137 | 143));
            if !link {
                count(parts, Kind::Icmp, p.protocol, p.dst, None);
            }
        }
        // IPv6 hop-by-hop options carry MLD reports; the rest is another protocol.
        IpProtocol::HopByHop => {}
        other => count(parts, Kind::Other, other, p.dst, None),
    }
}

fn count(parts: &Parts, kind: Kind, protocol: IpProtocol, dst: IpAddr, port: Option<u16>) {
    let host = parts.addrs.index_of(dst).and_then(|i| parts.names.host(i));
    parts.drops.count(kind, u8::from(protocol), dst, port, host);
}

/// The stub's answer to the DNS query in `udp` as an IP packet back to its sender, from
/// the address the query went to; `None` when the checksum is wrong, the message is not a
/// query, or the reply would not fit the MTU.
fn dns_reply(p: &Parsed<'_>, udp: &UdpPacket<&[u8]>, stub: &Stub) -> Option<Vec<u8>> {
    let (src, dst) = (IpAddress::from(p.src), IpAddress::from(p.dst));
    // RFC 768: a zero checksum over IPv4 means none was computed.
    let unchecked = p.src.is_ipv4() && udp.checksum() == 0;
    if !unchecked && !udp.verify_checksum(&src, &dst) {
        return None;
    }
    let reply = stub.answer(udp.payload())?;
    let caps = ChecksumCapabilities::default();
    let repr = UdpRepr {
        src_port: udp.dst_port(),
        dst_port: udp.src_port(),
    };
    let udp_len = repr.header_len() + reply.len();
    // From the address the query went to, in the query's IP version.
    if p.src.is_ipv4() != p.dst.is_ipv4() {
        return None;
    }
    let ip = IpRepr::new(dst, src, IpProtocol::Udp, udp_len, 64);
    let header = ip.header_len();
    let mut frame = vec![0u8; ip.buffer_len()];
    ip.emit(&mut frame, &caps);
    if frame.len() > MTU {
        return None;
    }
    let mut out = UdpPacket::new_unchecked(&mut frame[header..]);
    repr.emit(
        &mut out,
        &dst,
        &src,
        reply.len(),
        |b| b.copy_from_slice(&reply),
        &caps,
    );
    Some(frame)
}

/// The parts of an IP packet the loop looks at.
struct Parsed<'a> {
    protocol: IpProtocol,
    src: IpAddr,
    dst: IpAddr,
    payload: &'a [u8],
}

impl<'a> Parsed<'a> {
    fn of(frame: &'a [u8]) -> Option<Self> {
        match frame.first()? >> 4 {
            4 => {
                let p = Ipv4Packet::new_checked(frame).ok()?;
                let header = usize::from(p.header_len());
                let total = usize::from(p.total_len()).min(frame.len());
                Some(Self {
                    protocol: p.next_header(),
                    src: IpAddr::V4(p.src_addr()),
                    dst: IpAddr::V4(p.dst_addr()),
                    payload: frame.get(header..total)?,
                })
            }
            6 => {
                let p = Ipv6Packet::new_checked(frame).ok()?;
                let end = (40 + usize::from(p.payload_len())).min(frame.len());
                Some(Self {
                    protocol: p.next_header(),
                    src: IpAddr::V6(p.src_addr()),
                    dst: IpAddr::V6(p.dst_addr()),
                    payload: frame.get(40..end)?,
                })
            }
            _ => None,
        }
    }
}
