//! seccomp user notifications: the listener, one notification, and the answers.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

/// Installs `prog` as a seccomp filter of the calling thread whose
/// `SECCOMP_RET_USER_NOTIF` matches are sent to a supervisor, and returns the listener
/// descriptor (`SECCOMP_FILTER_FLAG_NEW_LISTENER`, Linux 5.0). `no_new_privs` must be set.
pub(crate) fn seccomp_notify_listener(prog: &[libc::sock_filter]) -> Result<OwnedFd, Errno> {
    let len = u16::try_from(prog.len()).map_err(|_| Errno::E2BIG)?;
    let fprog = libc::sock_fprog {
        len,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies the
    // program and does not keep the pointer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &raw const fprog,
        )
    };
    if rc < 0 {
        return Err(Errno::last());
    }
    let fd = RawFd::try_from(rc).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel just installed `fd` in our table for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One seccomp user notification (`SECCOMP_IOCTL_NOTIF_RECV`); blocks until one comes.
pub(crate) fn seccomp_notif_recv(listener: BorrowedFd<'_>) -> Result<libc::seccomp_notif, Errno> {
    // SAFETY: an all-zero `seccomp_notif` is valid (integers only), and the kernel
    // requires the buffer zeroed.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes one `seccomp_notif` into `n`, which it is sized for.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &raw mut n,
        )
    };
    if rc < 0 { Err(Errno::last()) } else { Ok(n) }
}

/// Whether notification `id` is still pending (its task alive and waiting): checked after
/// reading the task's memory, so that what was read belongs to that task.
pub(crate) fn seccomp_notif_valid(listener: BorrowedFd<'_>, id: u64) -> bool {
    // SAFETY: the ioctl reads one `u64` from `id`.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &raw const id,
        )
    };
    rc == 0
}

/// Lets the system call of notification `id` go on as if no filter had matched
/// (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`, Linux 5.5): the kernel then decides it.
pub(crate) fn seccomp_notif_continue(listener: BorrowedFd<'_>, id: u64) -> Result<(), Errno> {
    let resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: 0,
        flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
    };
    // SAFETY: the ioctl reads one `seccomp_notif_resp` from `resp`.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &raw const resp,
        )
    };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// Asks the kernel to wake the supervisor and the notifying task synchronously, on the
/// same CPU (`SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP`, Linux 6.6): a notification then costs
/// a switch between two tasks rather than two cross-CPU wake-ups. Older kernels refuse
/// it (`EINVAL`), which only makes notifications slower.
pub(crate) fn seccomp_notif_sync_wake_up(listener: BorrowedFd<'_>) -> Result<(), Errno> {
    /// `SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP` from `<linux/seccomp.h>`.
    const SYNC_WAKE_UP: u64 = 1;
    // SAFETY: the ioctl takes its `u64` flags by value.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SET_FLAGS,
            SYNC_WAKE_UP,
        )
    };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}
