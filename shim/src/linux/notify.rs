//! Filesystem violations observed with seccomp user notifications (design section 18):
//! a filter on the write-intent system calls only (`openat`/`openat2` with a write,
//! create or truncate flag, `mkdirat`, `mknodat`, `unlinkat`, `renameat2`, `linkat`,
//! `symlinkat`, `fchmodat`, `truncate`, and their older forms) sends each call to a
//! supervisor thread of the outer shim, which reads the path from the caller's memory,
//! resolves it against the caller's working directory or directory descriptor, hands it
//! to [`crate::violations`] to judge against the walls, and lets the call continue
//! (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`): the kernel (mounts, Landlock) decides it as if
//! there were no filter.
//!
//! It observes and never decides: whatever the supervisor reads or concludes, every call
//! continues, so a bug here (or a child that rewrites its path between our read and the
//! kernel's) can make a report wrong, never widen access.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::unistd::Pid;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::outcome::{Call, Kind, TaskView, Verdict};
use super::sys;
use super::{fs, handoff};
use crate::error::{Error, Result};
use crate::sandbox::Job;
use crate::violations::{Attempt, FsOp, HostView, Seen, Violations};

/// The marker action the filter is compiled with, replaced by `SECCOMP_RET_USER_NOTIF`.
const MARKER: u32 = 0x5eed;

/// Longest path read from a caller (`PATH_MAX`).
const PATH_MAX: usize = 4096;

/// What a watched system call's arguments are: where its paths are, and what it does.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// `(dirfd, path, flags)`: `openat`.
    OpenAt,
    /// `(path, flags)`: `open`.
    Open,
    /// `(path)`: `creat`.
    Creat,
    /// `(dirfd, path, how)`: `openat2` (flags read from `struct open_how`).
    OpenAt2,
    /// `(dirfd, path, ...)` doing `op`.
    At(FsOp),
    /// `(path, ...)` doing `op`.
    Plain(FsOp),
    /// `(olddirfd, old, newdirfd, new)`: `renameat`, `renameat2`, `linkat`.
    TwoAt(FsOp),
    /// `(old, new)`: `rename`, `link`.
    TwoPlain(FsOp),
    /// `(target, newdirfd, linkpath)`: `symlinkat`.
    SymlinkAt,
    /// `(target, linkpath)`: `symlink`.
    Symlink,
    /// `(dirfd, path, flags)`: `unlinkat`.
    UnlinkAt,
    /// `(path)`: `rmdir`.
    Rmdir,
}

/// The watched system calls of this architecture.
fn watched() -> Vec<(i64, Shape)> {
    let mut v = vec![
        (libc::SYS_openat, Shape::OpenAt),
        (libc::SYS_openat2, Shape::OpenAt2),
        (libc::SYS_mkdirat, Shape::At(FsOp::Mkdir)),
        (libc::SYS_mknodat, Shape::At(FsOp::Create)),
        (libc::SYS_unlinkat, Shape::UnlinkAt),
        (libc::SYS_renameat2, Shape::TwoAt(FsOp::Rename)),
        (libc::SYS_linkat, Shape::TwoAt(FsOp::Link)),
        (libc::SYS_symlinkat, Shape::SymlinkAt),
        (libc::SYS_fchmodat, Shape::At(FsOp::Chmod)),
        (libc::SYS_truncate, Shape::Plain(FsOp::Truncate)),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        (libc::SYS_open, Shape::Open),
        (libc::SYS_creat, Shape::Creat),
        (libc::SYS_mkdir, Shape::Plain(FsOp::Mkdir)),
        (libc::SYS_mknod, Shape::Plain(FsOp::Create)),
        (libc::SYS_unlink, Shape::Plain(FsOp::Unlink)),
        (libc::SYS_rmdir, Shape::Rmdir),
        (libc::SYS_rename, Shape::TwoPlain(FsOp::Rename)),
        (libc::SYS_renameat, Shape::TwoAt(FsOp::Rename)),
        (libc::SYS_link, Shape::TwoPlain(FsOp::Link)),
        (libc::SYS_symlink, Shape::Symlink),
        (libc::SYS_chmod, Shape::Plain(FsOp::Chmod)),
    ]);
    #[cfg(target_arch = "aarch64")]
    v.push((libc::SYS_renameat, Shape::TwoAt(FsOp::Rename)));
    v.push((i64::from(FCHMODAT2), Shape::At(FsOp::Chmod)));
    v
}

/// `open` flags that write: a call without any of them only reads.
const WRITE_FLAGS: [u64; 4] = [
    libc::O_WRONLY as u64,
    libc::O_RDWR as u64,
    libc::O_CREAT as u64,
    libc::O_TRUNC as u64,
];

/// The notification filter, as a BPF program: every watched call notifies (`open` and
/// `openat` only with a write flag), everything else is allowed.
///
/// # Errors
/// [`Error::Seccomp`] when it cannot be compiled for this architecture.
pub(crate) fn program() -> Result<Vec<libc::sock_filter>> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| Error::Seccomp(format!("unsupported architecture: {e}")))?;
    let flag_rules = |arg: u8| -> Result<Vec<SeccompRule>> {
        WRITE_FLAGS
            .iter()
            .map(|f| {
                let c = SeccompCondition::new(
                    arg,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::MaskedEq(*f),
                    *f,
                )
                .map_err(|e| Error::Seccomp(e.to_string()))?;
                SeccompRule::new(vec![c]).map_err(|e| Error::Seccomp(e.to_string()))
            })
            .collect()
    };
    let mut rules = std::collections::BTreeMap::new();
    for (nr, shape) in watched() {
        let r = match shape {
            Shape::OpenAt => flag_rules(2)?,
            Shape::Open => flag_rules(1)?,
            _ => Vec::new(),
        };
        rules.insert(nr, r);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Trace(MARKER),
        arch,
    )
    .map_err(|e| Error::Seccomp(e.to_string()))?;
    let prog: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| Error::Seccomp(e.to_string()))?;
    const BPF_RET_K: u16 = 0x06;
    let marker = libc::SECCOMP_RET_TRACE | MARKER;
    Ok(prog
        .into_iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: if i.code == BPF_RET_K && i.k == marker {
                libc::SECCOMP_RET_USER_NOTIF
            } else {
                i.k
            },
        })
        .collect())
}

/// In the command's process, before `execve`: installs the notification filter and sends
/// its listener to the outer shim over `to_shim`. A kernel without user notifications
/// is told to the shim (payload `u`) and the run goes on unobserved.
pub(crate) fn install(prog: &[libc::sock_filter], to_shim: BorrowedFd<'_>) {
    match sys::seccomp_notify_listener(prog) {
        Ok(listener) => {
            let _ = sys::send_fds(to_shim, &[listener.as_fd()], b"n");
        }
        Err(e) => {
            let _ = sys::send_fds(to_shim, &[], format!("u{e}").as_bytes());
        }
    }
}

/// In the outer shim: receives the listener from the command's process and serves its
/// notifications until every task of the sandbox is gone. Runs on its own thread.
pub(crate) fn supervise(from_command: OwnedFd, violations: Arc<Violations>) {
    let mut payload = [0u8; 256];
    let received = sys::recv_fds(from_command.as_fd(), &mut payload);
    drop(from_command);
    let listener = match received {
        Ok(Some((mut fds, n))) if payload.first() == Some(&b'n') && !fds.is_empty() => {
            let _ = n;
            fds.remove(0)
        }
        Ok(Some((_, n))) => {
            let why = String::from_utf8_lossy(payload.get(1..n).unwrap_or_default()).into_owned();
            violations.unobservable(
                &FsOp::WRITES,
                &format!("this kernel has no seccomp user notifications for them ({why}; Linux 5.5 or later)"),
            );
            return;
        }
        // The command never got that far (it failed to start).
        Ok(None) | Err(_) => return,
    };
    let table = watched();
    let _ = sys::seccomp_notif_sync_wake_up(listener.as_fd());
    // A bare blocking receive (no poll before it: one wake-up per call of the command).
    loop {
        let n = match sys::seccomp_notif_recv(listener.as_fd()) {
            Ok(n) => n,
            // Every task of the sandbox is gone: the receive fails at once from now on
            // (ENOENT, and the listener polls as hung up), so the thread ends.
            Err(Errno::ENOENT) if orphaned(listener.as_fd()) => return,
            // The task died before we took it (ENOENT), or a signal: next.
            Err(Errno::ENOENT | Errno::EINTR) => continue,
            Err(_) => return,
        };
        let attempt = table
            .iter()
            .find(|(nr, _)| *nr == i64::from(n.data.nr))
            .and_then(|(_, shape)| read_attempt(&n, *shape));
        // Judged before the call goes on: the path read is the one the task named, and
        // the tree is as the task, stopped in its call, will find it. A refusal's id is
        // checked before the task's view is looked at, so that a recycled pid is not
        // blamed (one `ioctl` that an allowed call, the common case, does without).
        if let Some((a, call)) = attempt
            && violations.refuses(&a)
            && sys::seccomp_notif_valid(listener.as_fd(), n.id)
        {
            let seen = TaskSeen {
                pid: n.pid,
                view: TaskView::open(n.pid),
                call,
            };
            violations.observe(a, &seen);
        }
        if let Err(e) = sys::seccomp_notif_continue(listener.as_fd(), n.id)
            && e != Errno::ENOENT
        {
            return;
        }
    }
}

/// The command's half of the violation channel: the notification filter it installs,
/// and the socket its listener goes back to the outer shim on.
pub(crate) type NotifyHalf = (Vec<libc::sock_filter>, OwnedFd);

/// Filesystem violations (`--violations`, `--report`): hands the walls as planned to the
/// reporter, and makes the channel the command's notification listener comes back on
/// (the outer end, and the filter with the inner end). `(None, None)` when not asked.
pub(crate) fn channel(
    job: &Job<'_>,
    fs_plan: &fs::FsPlan,
) -> Result<(Option<OwnedFd>, Option<NotifyHalf>)> {
    let Some(v) = &job.violations else {
        return Ok((None, None));
    };
    v.observe_with(walls_of(fs_plan));
    v.unobservable(
        &[FsOp::Read],
        "reads of --deny-read paths are not observed: masked paths read as empty files and directories (watching every open would slow every read)",
    );
    let (outer, inner) = handoff::socket_pair("the violation listener")?;
    Ok((Some(outer), Some((program()?, inner))))
}

/// Starts the thread that serves the command's violation notifications, when asked.
pub(crate) fn start_supervisor(outer: Option<OwnedFd>, job: &Job<'_>) -> Result<()> {
    let (Some(outer), Some(v)) = (outer, &job.violations) else {
        return Ok(());
    };
    let v = Arc::clone(v);
    std::thread::Builder::new()
        .name("violations".into())
        .spawn(move || supervise(outer, v))
        .map(drop)
        .map_err(|e| Error::io("start the violations thread", e))
}

/// The walls the plan builds, for judging violations: the writable roots (and `/dev`),
/// the masks, the re-opened reads and the mandatory deny set, by canonical path.
fn walls_of(plan: &fs::FsPlan) -> crate::violations::Walls {
    use crate::violations::Wall;
    let mut entries: Vec<(PathBuf, Wall)> = plan
        .ops
        .iter()
        .map(|op| {
            let wall = match op.kind {
                fs::OpKind::Writable => Wall::Writable,
                fs::OpKind::Readable => Wall::ReadOnly,
                fs::OpKind::Mask => Wall::Masked,
                fs::OpKind::Pin => Wall::Pinned,
                fs::OpKind::Protect => Wall::Protected,
            };
            (op.path.clone(), wall)
        })
        .collect();
    entries.extend(plan.watch.iter().map(|w| (w.path(), Wall::Watched)));
    entries.push((PathBuf::from("/dev"), Wall::Writable));
    entries.extend(
        plan.tmp
            .iter()
            .flat_map(|t| t.dirs.iter().map(|d| (d.clone(), Wall::Writable))),
    );
    crate::violations::Walls::new(entries)
}

/// Whether the filter behind `listener` has no task left (the kernel polls it as hung
/// up then; kernels before 5.8 do not say, and keep the thread receiving).
fn orphaned(listener: BorrowedFd<'_>) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(&listener, PollFlags::IN)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&now))
        .is_ok_and(|_| fds[0].revents().contains(PollFlags::HUP))
}

/// What the supervisor sees of one refused attempt: the task's own view of the tree
/// ([`TaskView`], the host's where it cannot be opened) and the call's details.
struct TaskSeen {
    pid: u32,
    view: Option<TaskView>,
    call: Call,
}

impl Seen for TaskSeen {
    fn resolved(&self, op: FsOp, path: &Path) -> PathBuf {
        match &self.view {
            Some(v) => v.resolved(op, path),
            None => HostView::default().resolved(op, path),
        }
    }

    fn not_the_walls(&self, paths: &[PathBuf]) -> bool {
        self.view
            .as_ref()
            .is_some_and(|v| v.verdict(&self.call, paths) != Verdict::Walls)
    }

    fn exists(&self, path: &Path) -> bool {
        match &self.view {
            Some(v) => v.exists(path),
            None => HostView::default().exists(path),
        }
    }

    fn exe(&self) -> String {
        exe_of(self.pid)
    }
}

/// `AT_EMPTY_PATH`, `AT_SYMLINK_FOLLOW`, `AT_SYMLINK_NOFOLLOW`, `AT_REMOVEDIR` as the raw
/// flag argument holds them.
fn at_flag(flags: u64, flag: i32) -> bool {
    flags & u64::from(flag as u32) != 0
}

/// What a notification asks, with its paths made absolute, and the details that decide
/// its own errors; `None` for an `open` that only reads, or a path that cannot be read.
fn read_attempt(n: &libc::seccomp_notif, shape: Shape) -> Option<(Attempt, Call)> {
    let pid = Pid::from_raw(i32::try_from(n.pid).ok()?);
    let (op, kind) = call_kind(pid, i64::from(n.data.nr), &n.data.args, shape)?;
    let a = n.data.args;
    let at = |dirfd: u64, ptr: u64| -> Option<(PathBuf, bool)> {
        let path = read_path(pid, ptr)?;
        let empty = path.as_os_str().is_empty();
        Some((absolute(pid, dirfd_of(dirfd), path), empty))
    };
    let plain = |ptr: u64| at(AT_FDCWD, ptr);
    let paths = match shape {
        Shape::OpenAt | Shape::OpenAt2 | Shape::At(_) | Shape::UnlinkAt => {
            vec![at(a[0], a[1])?]
        }
        Shape::Open | Shape::Creat | Shape::Plain(_) | Shape::Rmdir => vec![plain(a[0])?],
        Shape::TwoAt(_) => vec![at(a[0], a[1])?, at(a[2], a[3])?],
        Shape::TwoPlain(_) => vec![plain(a[0])?, plain(a[1])?],
        Shape::SymlinkAt => vec![at(a[1], a[2])?],
        Shape::Symlink => vec![plain(a[1])?],
    };
    let empty_ok = match shape {
        Shape::TwoAt(FsOp::Link) => at_flag(a[4], libc::AT_EMPTY_PATH),
        Shape::At(FsOp::Chmod) => n.data.nr == FCHMODAT2 && at_flag(a[3], libc::AT_EMPTY_PATH),
        _ => false,
    };
    let (paths, empty): (Vec<PathBuf>, Vec<bool>) = paths.into_iter().unzip();
    Some((
        Attempt {
            pid: n.pid,
            op,
            paths,
        },
        Call {
            kind,
            empty,
            empty_ok,
        },
    ))
}

/// `fchmodat2` (Linux 6.6), the same number on every architecture.
const FCHMODAT2: i32 = 452;

/// The operation of a call of `shape` (system call `nr`, arguments `a`) and what decides
/// its own errors; `None` for an `open` that only reads.
fn call_kind(pid: Pid, nr: i64, a: &[u64; 6], shape: Shape) -> Option<(FsOp, Kind)> {
    let open = |flags: u64| {
        let kind = Kind::Open { flags };
        if flags & libc::O_CREAT as u64 != 0 {
            Some((FsOp::Create, kind))
        } else if flags & (libc::O_WRONLY | libc::O_RDWR | libc::O_TRUNC) as u64 != 0 {
            Some((FsOp::OpenWrite, kind))
        } else {
            None
        }
    };
    let symlink = || Kind::Symlink {
        target_empty: read_path(pid, a[0]).is_some_and(|t| t.as_os_str().is_empty()),
    };
    Some(match shape {
        Shape::OpenAt => open(a[2])?,
        Shape::Open => open(a[1])?,
        Shape::Creat => open((libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC) as u64)?,
        Shape::OpenAt2 => open(read_u64(pid, a[2])?)?,
        // fchmodat2 has flags; fchmodat always follows.
        Shape::At(FsOp::Chmod) => (
            FsOp::Chmod,
            Kind::Chmod {
                follow: nr != i64::from(FCHMODAT2) || !at_flag(a[3], libc::AT_SYMLINK_NOFOLLOW),
            },
        ),
        Shape::Plain(FsOp::Chmod) => (FsOp::Chmod, Kind::Chmod { follow: true }),
        Shape::Plain(FsOp::Truncate) => (FsOp::Truncate, Kind::Truncate),
        Shape::Plain(FsOp::Unlink) | Shape::Rmdir | Shape::UnlinkAt => (FsOp::Unlink, Kind::Unlink),
        Shape::At(op) | Shape::Plain(op) => (op, Kind::MakeNew),
        Shape::TwoAt(FsOp::Link) => (
            FsOp::Link,
            Kind::Link {
                follow: at_flag(a[4], libc::AT_SYMLINK_FOLLOW),
            },
        ),
        Shape::TwoPlain(FsOp::Link) => (FsOp::Link, Kind::Link { follow: false }),
        Shape::TwoAt(op) if nr == libc::SYS_renameat2 => (op, Kind::Rename { flags: a[4] }),
        Shape::TwoAt(op) | Shape::TwoPlain(op) => (op, Kind::Rename { flags: 0 }),
        Shape::SymlinkAt | Shape::Symlink => (FsOp::Symlink, symlink()),
    })
}

/// `AT_FDCWD` as the raw argument.
const AT_FDCWD: u64 = libc::AT_FDCWD as u32 as u64;

/// The directory a `*at` call's `dirfd` names: `None` for `AT_FDCWD`.
fn dirfd_of(raw: u64) -> Option<i32> {
    let fd = raw as u32 as i32;
    (fd != libc::AT_FDCWD).then_some(fd)
}

/// `path` made absolute against the task's working directory (`dirfd` `None`) or the
/// directory its descriptor names, lexically normalised (`.` and `..`).
fn absolute(pid: Pid, dirfd: Option<i32>, path: PathBuf) -> PathBuf {
    if path.is_absolute() {
        return crate::violations::normalise(&path);
    }
    let base = match dirfd {
        None => std::fs::read_link(format!("/proc/{pid}/cwd")),
        Some(fd) => std::fs::read_link(format!("/proc/{pid}/fd/{fd}")),
    }
    .unwrap_or_else(|_| PathBuf::from("/"));
    crate::violations::normalise(&base.join(path))
}

/// A NUL-terminated path from the task's memory, read page by page (a path may end just
/// before an unmapped page).
fn read_path(pid: Pid, addr: u64) -> Option<PathBuf> {
    let mut out = Vec::new();
    let mut at = addr;
    // One page at most per read, into one buffer on the stack (this runs for every
    // write-intent call of the command).
    let mut page = [0u8; 4096];
    while out.len() < PATH_MAX {
        let page_left = 4096 - (at % 4096) as usize;
        let want = page_left.min(PATH_MAX - out.len());
        let buf = &mut page[..want];
        let got = read_mem(pid, at, buf)?;
        if got == 0 {
            return None;
        }
        if let Some(end) = buf[..got].iter().position(|b| *b == 0) {
            out.extend_from_slice(&buf[..end]);
            return Some(PathBuf::from(OsString::from_vec(out)));
        }
        out.extend_from_slice(&buf[..got]);
        at += got as u64;
    }
    None
}

fn read_u64(pid: Pid, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    (read_mem(pid, addr, &mut b)? == 8).then(|| u64::from_ne_bytes(b))
}

fn read_mem(pid: Pid, addr: u64, buf: &mut [u8]) -> Option<usize> {
    use nix::sys::uio::{RemoteIoVec, process_vm_readv};
    let remote = [RemoteIoVec {
        base: usize::try_from(addr).ok()?,
        len: buf.len(),
    }];
    let mut local = [std::io::IoSliceMut::new(buf)];
    process_vm_readv(pid, &mut local, &remote).ok()
}

/// The executable of `pid`, as the host names it.
fn exe_of(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}
