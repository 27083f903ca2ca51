//! Whether a write-intent call that the walls refuse as named is refused *by the walls*:
//! the supervisor lets every call continue and never learns its result, so the kernel's
//! answer is predicted from the call and the tree as the calling task sees it (through
//! `/proc/<pid>/root`, with the task stopped in its call), checking what the kernel
//! checks before the walls, in its order (`fs/namei.c`, `fs/open.c`):
//!
//! - an empty name is `ENOENT` (apt's `unlink("")`), and so is a missing directory on
//!   the way (`ENOTDIR` when it is a file);
//! - `mkdir`, `mknod`, `symlink` and `link` of a name that exists are `EEXIST` (every
//!   `mkdir -p`), before the read-only mount is looked at;
//! - `open` of a missing file without `O_CREAT`, `chmod`, `truncate` and `link` of a
//!   missing file are `ENOENT`; writing a directory is `EISDIR`; `O_EXCL` of an existing
//!   file is `EEXIST`; an existing file whose mode refuses the task is `EACCES` (file
//!   permissions are checked before the mount when a file is opened), except with
//!   `O_TRUNC` on a read-only mount, which `do_open` asks of the mount first (`EROFS`:
//!   `sh -c 'echo > file'`);
//! - `O_CREAT` of an existing file opened for reading only writes nothing, and succeeds;
//! - `rename` across mounts is `EXDEV` (`mv` then copies, and what the copy tries is
//!   what the walls refuse).
//!
//! Everything else reaches the walls and gets their answer (`EROFS`, `EACCES`, `EBUSY`),
//! even where the call would also have failed without them: an `unlink` of a missing
//! file in a read-only directory answers `EROFS` (not the `ENOENT` a caller such as `mv`
//! takes for "already gone"), so it is reported. What cannot be looked at (a lookup that
//! fails otherwise, an ACL) counts as the walls': never quieter on doubt.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, StatxFlags};

use crate::violations::FsOp;

/// What a watched call does, beyond its operation and paths: what decides its own errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `open`, `openat`, `openat2`, `creat`, with these flags.
    Open {
        /// The `open` flags.
        flags: u64,
    },
    /// `mkdir`, `mknod`: a new name.
    MakeNew,
    /// `symlink`: a new name holding `target`.
    Symlink {
        /// The link's target is the empty string (`ENOENT`).
        target_empty: bool,
    },
    /// `unlink`, `rmdir` (`unlinkat`, with or without `AT_REMOVEDIR`).
    Unlink,
    /// `rename`, `renameat`, `renameat2` with these flags.
    Rename {
        /// `RENAME_*` flags.
        flags: u64,
    },
    /// `link`, `linkat`.
    Link {
        /// `AT_SYMLINK_FOLLOW`: the source is followed.
        follow: bool,
    },
    /// `chmod`, `fchmodat`, `fchmodat2`.
    Chmod {
        /// The last component is followed (not `AT_SYMLINK_NOFOLLOW`).
        follow: bool,
    },
    /// `truncate` by path.
    Truncate,
}

/// One watched call as read from the task: its kind, and for each of its paths (in the
/// order of the [`crate::violations::Attempt`]) whether the name it passed was empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    /// What it does.
    pub(crate) kind: Kind,
    /// Per path: the task passed an empty string.
    pub(crate) empty: Vec<bool>,
    /// `AT_EMPTY_PATH`: an empty path names the descriptor itself.
    pub(crate) empty_ok: bool,
}

/// What the kernel would make of a call the walls refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Refused by the walls (or it could not be told otherwise): a violation.
    Walls,
    /// It fails for a reason of its own, with this error, whatever the walls are.
    Own(Errno),
    /// It writes nothing, and succeeds (`O_CREAT` of an existing file, read only).
    Harmless,
}

/// The tree as one task of the sandbox sees it: its root, `/proc/<pid>/root`, opened
/// once; every lookup resolves beneath it (`RESOLVE_IN_ROOT`), absolute symbolic links
/// included, as the task's own lookups do.
#[derive(Debug)]
pub(crate) struct TaskView {
    pid: u32,
    root: OwnedFd,
}

/// What a lookup found.
#[derive(Debug, Clone, Copy)]
struct Found {
    mode: u32,
    uid: u32,
    gid: u32,
    mnt_id: u64,
}

impl Found {
    fn is(self, kind: u32) -> bool {
        self.mode & libc::S_IFMT == kind
    }

    fn is_dir(self) -> bool {
        self.is(libc::S_IFDIR)
    }
}

/// A task's file-system credentials, as the host numbers them (`/proc/<pid>/status`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Creds {
    fsuid: u32,
    fsgid: u32,
    groups: Vec<u32>,
    /// Whether it holds any effective capability (then its permissions are not predicted).
    capable: bool,
}

impl Creds {
    fn of(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::split_whitespace)
        };
        let fsuid = field("Uid:")?.nth(3)?.parse().ok()?;
        let fsgid = field("Gid:")?.nth(3)?.parse().ok()?;
        let groups = field("Groups:")?.filter_map(|g| g.parse().ok()).collect();
        let capable = field("CapEff:")?
            .next()
            .is_none_or(|c| u64::from_str_radix(c, 16) != Ok(0));
        Some(Self {
            fsuid,
            fsgid,
            groups,
            capable,
        })
    }

    /// Whether the mode bits of `f` refuse these credentials `want` (`2`: write).
    fn refused(&self, f: Found, want: u32) -> bool {
        let bits = if self.fsuid == f.uid {
            f.mode >> 6
        } else if self.fsgid == f.gid || self.groups.contains(&f.gid) {
            f.mode >> 3
        } else {
            f.mode
        };
        !self.capable && bits & want != want
    }
}

impl TaskView {
    /// The view of task `pid`; `None` when its root cannot be opened (it is gone).
    pub(crate) fn open(pid: u32) -> Option<Self> {
        let root = rustix::fs::open(
            format!("/proc/{pid}/root"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        Some(Self { pid, root })
    }

    /// `path` (absolute) opened as an `O_PATH` descriptor, following its last component
    /// when `follow`.
    fn lookup(&self, path: &Path, follow: bool) -> Result<OwnedFd, Errno> {
        let mut flags = OFlags::PATH | OFlags::CLOEXEC;
        if !follow {
            flags |= OFlags::NOFOLLOW;
        }
        rustix::fs::openat2(
            self.root.as_fd(),
            relative(path),
            flags,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| Errno::from_raw(e.raw_os_error()))
    }

    fn stat(&self, path: &Path, follow: bool) -> Result<Found, Errno> {
        let fd = self.lookup(path, follow)?;
        let st = rustix::fs::statx(
            fd.as_fd(),
            "",
            AtFlags::EMPTY_PATH,
            StatxFlags::TYPE
                | StatxFlags::MODE
                | StatxFlags::UID
                | StatxFlags::GID
                | StatxFlags::MNT_ID,
        )
        .map_err(|e| Errno::from_raw(e.raw_os_error()))?;
        Ok(Found {
            mode: u32::from(st.stx_mode),
            uid: st.stx_uid,
            gid: st.stx_gid,
            mnt_id: st.stx_mnt_id,
        })
    }

    /// Whether `path` lies on a read-only mount (`ST_RDONLY`); doubt counts as read-only,
    /// so that the call is the walls' (never quieter on doubt).
    fn read_only_mount(&self, path: &Path, follow: bool) -> bool {
        self.lookup(path, follow)
            .ok()
            .and_then(|fd| rustix::fs::fstatvfs(fd.as_fd()).ok())
            .is_none_or(|v| v.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
    }

    /// Whether the file at `path` (followed) has an access ACL, which the mode bits do
    /// not tell.
    fn has_acl(&self, path: &Path) -> bool {
        use std::os::fd::AsRawFd;
        let Ok(fd) = self.lookup(path, true) else {
            return true;
        };
        let mut none = [0u8; 0];
        match rustix::fs::getxattr(
            format!("/proc/self/fd/{}", fd.as_raw_fd()),
            "system.posix_acl_access",
            &mut none,
        ) {
            Err(e) => e != rustix::io::Errno::NODATA && e != rustix::io::Errno::NOTSUP,
            Ok(_) => true,
        }
    }

    /// Whether `path` exists, its last component not followed.
    pub(crate) fn exists(&self, path: &Path) -> bool {
        self.stat(path, false).is_ok()
    }

    /// `path` with its links resolved as `op` resolves them, in the task's view: the
    /// directory it is in always, the last component only for an operation that follows
    /// it. What does not exist keeps its missing components.
    pub(crate) fn resolved(&self, op: FsOp, path: &Path) -> PathBuf {
        if op.follows()
            && let Some(p) = self.lookup(path, true).ok().and_then(|fd| name_of(&fd))
        {
            return p;
        }
        match (path.parent(), path.file_name()) {
            (Some(dir), Some(name)) => self
                .lookup(dir, true)
                .ok()
                .and_then(|fd| name_of(&fd))
                .map_or_else(|| path.to_owned(), |d| d.join(name)),
            _ => path.to_owned(),
        }
    }

    /// What the kernel would make of `call` on `paths` (absolute, in the order of the
    /// attempt), which the walls refuse as named.
    pub(crate) fn verdict(&self, call: &Call, paths: &[PathBuf]) -> Verdict {
        // The names are copied in first, then the directories on the way are walked.
        if call.empty.iter().any(|e| *e) && !call.empty_ok
            || matches!(call.kind, Kind::Symlink { target_empty: true })
        {
            return Verdict::Own(Errno::ENOENT);
        }
        for path in paths {
            if let Some(dir) = path.parent() {
                match self.stat(dir, true) {
                    Err(e @ (Errno::ENOENT | Errno::ENOTDIR)) => return Verdict::Own(e),
                    Ok(f) if !f.is_dir() => return Verdict::Own(Errno::ENOTDIR),
                    _ => {}
                }
            }
        }
        let Some(first) = paths.first() else {
            return Verdict::Walls;
        };
        let missing = |follow: bool| match self.stat(first, follow) {
            Err(e @ (Errno::ENOENT | Errno::ENOTDIR)) => Some(e),
            _ => None,
        };
        match call.kind {
            Kind::Open { flags } => self.open_verdict(first, flags),
            // filename_create: an existing name before the mount's write access.
            Kind::MakeNew | Kind::Symlink { .. }
                if first == Path::new("/") || self.exists(first) =>
            {
                Verdict::Own(Errno::EEXIST)
            }
            Kind::Chmod { follow } => missing(follow).map_or(Verdict::Walls, Verdict::Own),
            Kind::Truncate => match self.stat(first, true) {
                Err(e @ (Errno::ENOENT | Errno::ENOTDIR)) => Verdict::Own(e),
                Ok(f) if f.is_dir() => Verdict::Own(Errno::EISDIR),
                _ => Verdict::Walls,
            },
            Kind::Rename { .. } => self.rename_verdict(paths),
            Kind::Link { follow } => self.link_verdict(paths, follow),
            Kind::MakeNew | Kind::Symlink { .. } | Kind::Unlink => Verdict::Walls,
        }
    }

    /// `open` (`do_open`): an existing name decides it, and its mode bits are checked
    /// before the mount's write access.
    fn open_verdict(&self, path: &Path, flags: u64) -> Verdict {
        let has = |f: i32| flags & u64::from(f as u32) != 0;
        let (creat, excl) = (has(libc::O_CREAT), has(libc::O_EXCL));
        let writes = has(libc::O_WRONLY) || has(libc::O_RDWR) || has(libc::O_TRUNC);
        let follow = !(has(libc::O_NOFOLLOW) || creat && excl);
        match self.stat(path, follow) {
            Err(Errno::ENOENT) if !creat => Verdict::Own(Errno::ENOENT),
            Err(_) => Verdict::Walls,
            Ok(_) if creat && excl => Verdict::Own(Errno::EEXIST),
            Ok(f) if f.is(libc::S_IFLNK) => Verdict::Own(Errno::ELOOP),
            Ok(f) if f.is_dir() => Verdict::Own(Errno::EISDIR),
            Ok(_) if !writes => Verdict::Harmless,
            Ok(f)
                if f.is(libc::S_IFREG)
                    && Creds::of(self.pid).is_some_and(|c| c.refused(f, 2))
                    && !self.has_acl(path)
                    && !(has(libc::O_TRUNC) && self.read_only_mount(path, follow)) =>
            {
                Verdict::Own(Errno::EACCES)
            }
            Ok(_) => Verdict::Walls,
        }
    }

    /// `rename` (`do_renameat2`): across mounts is `EXDEV`, before the mount's write
    /// access; what is (or is not) there is looked at after it.
    fn rename_verdict(&self, paths: &[PathBuf]) -> Verdict {
        let [from, to] = paths else {
            return Verdict::Walls;
        };
        let mount = |p: &Path| p.parent().and_then(|d| self.stat(d, true).ok());
        match (mount(from), mount(to)) {
            (Some(a), Some(b)) if a.mnt_id != b.mnt_id => Verdict::Own(Errno::EXDEV),
            _ => Verdict::Walls,
        }
    }

    /// `link` (`do_linkat`): the source is looked up first, then the new name must not
    /// exist; the mount's write access comes before the check across mounts.
    fn link_verdict(&self, paths: &[PathBuf], follow: bool) -> Verdict {
        let [from, to] = paths else {
            return Verdict::Walls;
        };
        match self.stat(from, follow) {
            Err(e @ (Errno::ENOENT | Errno::ENOTDIR)) => Verdict::Own(e),
            _ if self.exists(to) => Verdict::Own(Errno::EEXIST),
            _ => Verdict::Walls,
        }
    }
}

/// `path` (absolute) relative to the root it is resolved beneath (`/` is `.`).
fn relative(path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    if rel.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        rel.to_owned()
    }
}

/// The path an `O_PATH` descriptor names, as the kernel prints it for a mount of the
/// sandbox (from the sandbox's root).
fn name_of(fd: &OwnedFd) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    let link =
        rustix::fs::readlink(format!("/proc/self/fd/{}", fd.as_raw_fd()), Vec::new()).ok()?;
    let path = PathBuf::from(OsString::from_vec(link.into_bytes()));
    path.is_absolute().then_some(path)
}

#[cfg(test)]
#[path = "outcome_tests.rs"]
mod tests;
