//! Every `unsafe` block of the shim lives here: thin wrappers over the Linux system calls
//! that `nix` does not cover (the new mount API, `capset`, the capability `prctl`s,
//! `close_range`, `SIOCSIFFLAGS`) and over `clone`/`fork`.
//!
//! Each wrapper turns the raw return value into a `Result` and never keeps a pointer
//! beyond the call. Nothing here decides policy: callers in the sibling modules do.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::unistd::Pid;

mod mount;
mod seccomp;

pub(crate) use mount::*;
pub(crate) use seccomp::*;

fn cstr(s: &str) -> Result<CString, Errno> {
    CString::new(s).map_err(|_| Errno::EINVAL)
}

fn fd_result(rc: libc::c_long) -> Result<OwnedFd, Errno> {
    if rc < 0 {
        return Err(Errno::last());
    }
    let fd = RawFd::try_from(rc).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel just returned `fd` as a new descriptor owned by this process and
    // nothing else holds it yet, so `OwnedFd` becomes its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn unit_result(rc: libc::c_long) -> Result<(), Errno> {
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

fn dirfd_raw(dirfd: Option<BorrowedFd<'_>>) -> libc::c_long {
    libc::c_long::from(dirfd.map_or(libc::AT_FDCWD, |fd| fd.as_raw_fd()))
}

/// Spawn `cb` as a child process in new namespaces (`flags`), like `fork` but with the
/// namespaces created atomically. Returns the child's pid; `SIGCHLD` is its exit signal.
///
/// The caller must be single-threaded: the child starts as a copy of this process.
pub(crate) fn clone_into_namespaces(
    flags: CloneFlags,
    cb: Box<dyn FnMut() -> isize + '_>,
) -> Result<Pid, Errno> {
    // The child runs on its own copy of this buffer (no CLONE_VM), so dropping our copy
    // once `clone` returns cannot affect it. 1 MiB is plenty for the setup code, and
    // pages that are never touched cost nothing.
    let mut stack = vec![0u8; 1 << 20];
    // SAFETY: no CLONE_VM, so the child gets a private copy of the address space, just as
    // after `fork`; the caller guarantees no other thread exists (documented contract, and
    // `launch` clones before it starts any thread), so no lock can be held in the copy.
    unsafe { nix::sched::clone(cb, &mut stack, flags, Some(libc::SIGCHLD)) }
}

/// Plain `fork`, returning `None` in the child.
///
/// The caller must be single-threaded (inner init, janitor spawn), see the SAFETY note.
pub(crate) fn fork_process() -> Result<Option<Pid>, Errno> {
    // SAFETY: every caller runs in a single-threaded process (the inner init, or the outer
    // shim before it starts its relay threads), so the child cannot inherit a held lock.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Parent { child } => Ok(Some(child)),
        nix::unistd::ForkResult::Child => Ok(None),
    }
}

/// `_exit(2)`: leave immediately, without running destructors or flushing stdio buffers
/// (a forked child must not flush its parent's buffers twice).
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` has no preconditions and does not return.
    unsafe { libc::_exit(code) }
}

fn prctl(op: libc::c_int, a: libc::c_ulong, b: libc::c_ulong) -> Result<(), Errno> {
    // SAFETY: the prctl operations used here take integer arguments only.
    let rc = unsafe { libc::prctl(op, a, b, 0 as libc::c_ulong, 0 as libc::c_ulong) };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// Drop every capability from the bounding set, clear the ambient set, lock the
/// securebits so that uid 0 never regains capabilities on `execve`, and zero the
/// effective, permitted and inheritable sets. Needs `CAP_SETPCAP` for the first steps, so
/// it must run while the caller still holds its user-namespace capabilities.
pub(crate) fn drop_all_capabilities() -> Result<(), Errno> {
    for cap in 0..=63u64 {
        match prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0) {
            Ok(()) => {}
            Err(Errno::EINVAL) => break, // past the kernel's last capability
            Err(e) => return Err(e),
        }
    }
    prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        0,
    )?;
    // SECBIT_NOROOT | _LOCKED, NO_SETUID_FIXUP | _LOCKED, KEEP_CAPS_LOCKED,
    // NO_CAP_AMBIENT_RAISE | _LOCKED.
    prctl(libc::PR_SET_SECUREBITS, 0xEF, 0)?;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    }; // _LINUX_CAPABILITY_VERSION_3
    let data = [
        Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
        Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: header and the two-element data array are the v3 layout capset(2) expects
    // and live on our stack for the whole call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) };
    unit_result(rc)
}

/// Close every descriptor from `first` up, except those the kernel refuses.
pub(crate) fn close_fds_from(first: RawFd) -> Result<(), Errno> {
    let first = u32::try_from(first).map_err(|_| Errno::EINVAL)?;
    // SAFETY: close_range only closes descriptors; callers pass a floor above every fd
    // they still use (Rust objects owning fds below `first` stay valid).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) };
    unit_result(rc)
}

/// Bring the loopback interface up in the current network namespace (`ip link set lo up`).
pub(crate) fn loopback_up(sock: BorrowedFd<'_>) -> Result<(), Errno> {
    let mut req = ifreq_named("lo");
    // SAFETY: SIOCGIFFLAGS reads `ifr_name` and writes `ifr_ifru.ifru_flags` in our `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the union member `ifru_flags` was just written by the kernel.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads our fully initialised `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// An `ifreq` naming the interface `name` (at most `IFNAMSIZ - 1` bytes), the rest zero.
fn ifreq_named(name: &str) -> libc::ifreq {
    // SAFETY: `ifreq` is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let room = req.ifr_name.len() - 1;
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes().take(room)) {
        *dst = src as libc::c_char;
    }
    req
}

/// Make the TUN device `name` (layer 3, no packet-information header: `IFF_TUN |
/// IFF_NO_PI`) on `tun`, a descriptor of `/dev/net/tun`, and make it persistent
/// (`TUNSETIFF`, `TUNSETPERSIST`, `<linux/if_tun.h>`). The device is made in the network
/// namespace that opened `tun`; the caller needs `CAP_NET_ADMIN` over that namespace.
pub(crate) fn tun_attach(tun: BorrowedFd<'_>, name: &str) -> Result<(), Errno> {
    let mut req = ifreq_named(name);
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads our fully initialised `req` (and may write the name back).
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
        return Err(Errno::last());
    }
    // SAFETY: TUNSETPERSIST takes its flag by value.
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong) } < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// The index of interface `name` in the network namespace of the socket `sock`
/// (`SIOCGIFINDEX`): unlike `if_nametoindex`, not necessarily the caller's namespace.
pub(crate) fn if_index(sock: BorrowedFd<'_>, name: &str) -> Result<u32, Errno> {
    let mut req = ifreq_named(name);
    // SAFETY: SIOCGIFINDEX reads `ifr_name` and writes `ifr_ifru.ifru_ifindex` in `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFINDEX, &mut req) } < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the union member `ifru_ifindex` was just written by the kernel.
    u32::try_from(unsafe { req.ifr_ifru.ifru_ifindex }).map_err(|_| Errno::ENODEV)
}

/// `fd`, a `NETLINK_ROUTE` socket, as an rtnetlink socket (which then owns and closes it).
pub(crate) fn rtnetlink_socket(fd: OwnedFd) -> rtnetlink::sys::Socket {
    // SAFETY: `fd` is an open socket whose ownership moves into the `Socket`.
    unsafe { rtnetlink::sys::Socket::from_raw_fd(fd.into_raw_fd()) }
}

/// Send `fds` (at most [`FDS_PER_MESSAGE`], maybe none) and a small payload over a
/// connected Unix socket (SCM_RIGHTS).
pub(crate) fn send_fds(
    sock: BorrowedFd<'_>,
    fds: &[BorrowedFd<'_>],
    payload: &[u8],
) -> Result<(), Errno> {
    use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let iov = [std::io::IoSlice::new(payload)];
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
    sendmsg::<UnixAddr>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).map(drop)
}

/// Most descriptors one [`send_fds`] message carries (the kernel's `SCM_MAX_FD` is 253).
pub(crate) const FDS_PER_MESSAGE: usize = 250;

/// Receive the descriptors (at most [`FDS_PER_MESSAGE`]) and the payload sent by
/// [`send_fds`], in the order they were sent. `Ok(None)` on EOF (the peer exited
/// without sending).
pub(crate) fn recv_fds(
    sock: BorrowedFd<'_>,
    payload: &mut [u8],
) -> Result<Option<(Vec<OwnedFd>, usize)>, Errno> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, UnixAddr, recvmsg};
    let mut cmsg = nix::cmsg_space!([RawFd; FDS_PER_MESSAGE]);
    let mut iov = [std::io::IoSliceMut::new(payload)];
    let msg = recvmsg::<UnixAddr>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let n = msg.bytes;
    let mut received = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: SCM_RIGHTS just installed `fd` in our table; nobody else owns it.
                received.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if received.is_empty() && n == 0 {
        Ok(None)
    } else {
        Ok(Some((received, n)))
    }
}

/// Serve allocations of 64 KiB and more with their own `mmap` (glibc's `M_MMAP_THRESHOLD`,
/// fixed): capture's per-connection socket buffers (64 KiB each) then cost memory only
/// for the pages a connection has used, not their whole size from the start. A no-op
/// where the C library has no such knob.
pub(crate) fn large_allocations_by_mmap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's policy for later allocations; it
    // takes plain integers and touches no memory of ours.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 * 1024);
    }
}

/// Close every descriptor from 3 up except `keep`.
pub(crate) fn close_fds_except(keep: &[RawFd]) -> Result<(), Errno> {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|fd| *fd >= 3).collect();
    keep.sort_unstable();
    let mut from: RawFd = 3;
    for k in keep {
        if k > from {
            // SAFETY: closes only descriptors in [from, k-1], none of which the caller keeps.
            unit_result(unsafe {
                libc::syscall(libc::SYS_close_range, from as u32, (k - 1) as u32, 0)
            })?;
        }
        from = k + 1;
    }
    close_fds_from(from)
}

/// Reset every catchable signal to its default disposition (Rust ignores SIGPIPE; an
/// ignored signal would survive `execve` into the command).
pub(crate) fn reset_signal_dispositions() {
    use nix::sys::signal::{SigHandler, Signal};
    for sig in Signal::iterator() {
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: installing SIG_DFL runs no code of ours in signal context.
        let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) };
    }
}

/// Ignore `sig` (for the janitor, which must outlive terminal signals).
pub(crate) fn ignore_signal(sig: nix::sys::signal::Signal) {
    // SAFETY: installing SIG_IGN runs no code of ours in signal context.
    let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn) };
}

/// `dup2(fd, target)`: make descriptor number `target` refer to `fd`'s file.
pub(crate) fn dup_onto(fd: BorrowedFd<'_>, target: RawFd) -> Result<(), Errno> {
    // SAFETY: dup2 only changes the descriptor table; `target` is one of the standard
    // descriptors, which no Rust object in the janitor owns.
    let rc = unsafe { libc::dup2(fd.as_raw_fd(), target) };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// What descriptor `fd` of this process is: `None` when it is not open, else whether it
/// is a listening socket (`SO_ACCEPTCONN`).
pub(crate) fn probe_fd(fd: RawFd) -> Option<bool> {
    // SAFETY: F_GETFD only reads the descriptor's flags; a closed number fails (EBADF).
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    let mut on: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `on`, which is that size; a
    // descriptor that is not a socket fails (ENOTSOCK).
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&raw mut on).cast(),
            &raw mut len,
        )
    };
    Some(rc == 0 && on != 0)
}

/// Places the handed descriptors in the command's process, just before `execve`: each
/// `--pass-fd` stays under its number, without close-on-exec; the `--listen-fd` sockets
/// move to 3, 4, ... (each first copied above that range, so that no move overwrites a
/// socket still to be moved).
pub(crate) fn place_handover(pass: &[RawFd], listen: &[RawFd]) -> Result<(), Errno> {
    for fd in pass {
        // SAFETY: clears FD_CLOEXEC on a descriptor this process holds.
        unit_result(unsafe { libc::fcntl(*fd, libc::F_SETFD, 0) }.into())?;
    }
    let above = 3 + RawFd::try_from(listen.len()).map_err(|_| Errno::EMFILE)?;
    let mut moved = Vec::with_capacity(listen.len());
    for fd in listen {
        // SAFETY: duplicates a descriptor this process holds to the lowest free number
        // above the target range, close-on-exec.
        let high = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, above) };
        if high < 0 {
            return Err(Errno::last());
        }
        moved.push(high);
    }
    for (i, high) in moved.into_iter().enumerate() {
        let target = 3 + RawFd::try_from(i).map_err(|_| Errno::EMFILE)?;
        // SAFETY: dup2 makes `target` a copy of `high` (without close-on-exec), closing
        // what `target` was; `high` is ours and closed right after.
        let rc = unsafe { libc::dup2(high, target) };
        // SAFETY: `high` is the duplicate made above, not used after this.
        unsafe { libc::close(high) };
        if rc < 0 {
            return Err(Errno::last());
        }
    }
    Ok(())
}
