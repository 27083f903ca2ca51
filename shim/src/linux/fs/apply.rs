//! Carrying out the filesystem plan in the inner init, inside the new mount namespace,
//! with the new mount API (`open_tree`, `move_mount`, `mount_setattr`, `fsopen`):
//!
//! 1. detached copies of every writable root and re-opened read path are taken from the
//!    pristine tree;
//! 2. the whole tree is made read-only, nosuid and nodev (one recursive `mount_setattr`);
//! 3. fresh read-only `/proc` and `/sys`, and a private `/dev` holding only `null`, `zero`,
//!    `full`, `random`, `urandom`, `tty`, a new `devpts` and a private `shm`; the private
//!    temporary directory at `/tmp` and `/var/tmp` ([`super::tmp`]);
//! 4. the operations, shallowest first: writable roots (the rw copies), read masks (empty
//!    read-only tmpfs directories or mode-0 files), re-opened reads, the `.git` pin (a
//!    mount point cannot be renamed) and read-only binds of each protected path.
//!
//! It decides nothing (the plan did) and never leaves the host's mount table changed:
//! everything happens after `MS_PRIVATE` in a namespace that dies with the sandbox. Any
//! step that fails aborts the run; none is skipped.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::MsFlags;
use nix::sys::stat::Mode;

use super::plan::{FsPlan, MountOp, OpKind, depth};
use crate::error::{Error, Result};
use crate::linux::sys;

fn c_path(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::Usage(format!("path {} contains a NUL byte", p.display())))
}

fn step<T>(what: impl FnOnce() -> String, r: std::result::Result<T, Errno>) -> Result<T> {
    r.map_err(|e| Error::sys(what(), e))
}

/// Carry out `plan` in the current (new, private) mount namespace. Must run with
/// `CAP_SYS_ADMIN` in the namespace's owning user namespace. `copies` are the plan's
/// [`detached_copies`] when the outer shim made them (idmapped writable roots); `None`
/// makes them here.
///
/// # Errors
/// [`Error::MissingFeature`] when the kernel lacks the new mount API (Linux 5.12), and
/// [`Error::Sys`] naming the step for any other failure; the caller then aborts the run.
pub(crate) fn apply(plan: &FsPlan, copies: Option<Vec<Option<OwnedFd>>>) -> Result<()> {
    step(
        || "make / private in the sandbox's mount namespace".into(),
        nix::mount::mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        ),
    )?;

    // 1. Pristine copies, before anything is made read-only (made by the outer shim
    // when the writable roots are idmapped).
    let clones = match copies {
        Some(c) => c,
        None => detached_copies(plan, None)?,
    };
    let mut devices = Vec::new();
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        let host = PathBuf::from("/dev").join(name);
        let fd = step(
            || format!("copy {}", host.display()),
            sys::open_tree(None, &c_path(&host)?, sys::OPEN_TREE_CLONE),
        )?;
        devices.push((name, fd));
    }

    // 2. Everything read-only.
    step(
        || "make every mount read-only (mount_setattr, Linux 5.12)".into(),
        sys::mount_setattr_path(
            c"/",
            true,
            sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
            0,
        ),
    )?;

    // 3. /proc for the new PID namespace, /sys for the new network namespace, private /dev.
    mount_proc_and_sys()?;
    build_dev(devices)?;
    if let Some(tmp) = &plan.tmp {
        super::tmp::mount(tmp)?;
    }

    // 4. The plan.
    let scratch = mask_scratch()?;
    // (path, scratch-relative directory) of each directory mask applied so far.
    let mut masks: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut applied: Vec<&MountOp> = Vec::new();
    for (i, (op, clone)) in plan.ops.iter().zip(clones).enumerate() {
        make_parent_mount_point(plan, op, (&applied, &masks), &scratch)?;
        let target = c_path(&op.path)?;
        match op.kind {
            OpKind::Writable | OpKind::Readable => {
                let fd = clone.ok_or_else(|| Error::Usage("missing clone".into()))?;
                step(
                    || describe(op),
                    sys::move_mount(fd.as_fd(), None, &target, 0),
                )?;
            }
            OpKind::Mask => {
                let rel = attach_mask(plan, (i, op), &scratch, &target)?;
                masks.extend(rel.map(|rel| (op.path.clone(), rel)));
            }
            OpKind::Pin | OpKind::Protect => attach_protected(op, &scratch, &target)?,
        }
        applied.push(op);
    }
    Ok(())
}

/// `op` as a failed step names it.
fn describe(op: &MountOp) -> String {
    format!("{:?} {}", op.kind, op.path.display())
}

/// A new read-only `/proc` for the new PID namespace and `/sys` for the new network
/// namespace (nosuid, nodev, noexec).
fn mount_proc_and_sys() -> Result<()> {
    let pseudo = sys::MOUNT_ATTR_RDONLY
        | sys::MOUNT_ATTR_NOSUID
        | sys::MOUNT_ATTR_NODEV
        | sys::MOUNT_ATTR_NOEXEC;
    for (fs, on) in [("proc", c"/proc"), ("sysfs", c"/sys")] {
        let fd = step(
            || format!("mount a new {fs}"),
            sys::new_fs_mount(fs, &[], pseudo),
        )?;
        step(
            || format!("attach {fs} on {}", on.to_string_lossy()),
            sys::move_mount(fd.as_fd(), None, on, 0),
        )?;
    }
    Ok(())
}

/// The masks' small tmpfs (detached; mode 0111), holding the empty unreadable file
/// [`MASK_FILE`] that file masks show.
fn mask_scratch() -> Result<OwnedFd> {
    tmpfs_with_file(
        ["0111", "64k", "4096"],
        (MASK_FILE, Mode::empty(), ""),
        (
            || "create the mask tmpfs".into(),
            || "create the mask file".into(),
        ),
    )
}

/// A detached tmpfs (nosuid, nodev, noexec; its `mode`, `size` and `nr_inodes` options
/// given in that order) holding one new file `name` of `file_mode` that holds `content`.
/// `what` names the failed step in an error: the first the tmpfs, the second the file.
fn tmpfs_with_file(
    [mode, size, nr_inodes]: [&str; 3],
    (name, file_mode, content): (&CStr, Mode, &str),
    (what_fs, what_file): (impl FnOnce() -> String, impl Fn() -> String + Copy),
) -> Result<OwnedFd> {
    let fs = step(
        what_fs,
        sys::new_fs_mount(
            "tmpfs",
            &[
                ("mode", Some(mode)),
                ("size", Some(size)),
                ("nr_inodes", Some(nr_inodes)),
            ],
            sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV | sys::MOUNT_ATTR_NOEXEC,
        ),
    )?;
    let f = step(
        what_file,
        nix::fcntl::openat(
            fs.as_fd(),
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            file_mode,
        ),
    )?;
    let mut written = 0;
    while written < content.len() {
        written += step(
            what_file,
            nix::unistd::write(&f, &content.as_bytes()[written..]),
        )?;
    }
    drop(f);
    Ok(fs)
}

/// The empty mode-0 file of the mask tmpfs.
const MASK_FILE: &CStr = c"empty";

/// Makes `op`'s mount point where the tree above it does not hold one: inside the
/// tmpfs of a directory mask (the deepest op of those `applied` above it, with the
/// `masks` applied so far), or in the private temporary directory for a path of the
/// host's `/tmp`.
fn make_parent_mount_point(
    plan: &FsPlan,
    op: &MountOp,
    (applied, masks): (&[&MountOp], &[(PathBuf, PathBuf)]),
    scratch: &OwnedFd,
) -> Result<()> {
    // If the deepest op above this path is a directory mask, the mount point must be
    // made inside the mask's tmpfs first.
    let parent_op = applied
        .iter()
        .rev()
        .filter(|a| op.path.starts_with(&a.path) && a.path != op.path)
        .max_by_key(|a| depth(&a.path));
    if let Some(parent) = parent_op
        && parent.kind == OpKind::Mask
        && let Some((mpath, mrel)) = masks.iter().find(|(m, _)| *m == parent.path)
    {
        let rel = op
            .path
            .strip_prefix(mpath)
            .map_err(|_| Error::Usage("mask bookkeeping".into()))?;
        make_mount_point(scratch, &mrel.join(rel), op.is_dir)?;
    } else if parent_op.is_none()
        && let Some(tmp) = &plan.tmp
        && tmp.holds(&op.path)
        && !tmp.dirs.contains(&op.path)
    {
        // A path of the host's /tmp that the run names: its mount point is made in
        // the private temporary directory that hides the host's.
        super::tmp::make_mount_point(&op.path, op.is_dir)?;
    }
    Ok(())
}

/// Mask `op` (the `i`th of `plan`) at `target`: a read-only copy of an empty directory of
/// the `scratch` tmpfs (mode 0111 when other operations lie beneath it, else 0), or of
/// its empty file. The directory's path in `scratch`, for a directory mask.
fn attach_mask(
    plan: &FsPlan,
    (i, op): (usize, &MountOp),
    scratch: &OwnedFd,
    target: &CStr,
) -> Result<Option<PathBuf>> {
    let what = || describe(op);
    let dir = if op.is_dir {
        let rel = PathBuf::from(format!("m{i}"));
        let has_children = plan
            .ops
            .iter()
            .any(|o| o.path != op.path && o.path.starts_with(&op.path));
        let mode = if has_children { 0o111 } else { 0 };
        step(
            what,
            nix::sys::stat::mkdirat(scratch.as_fd(), &rel, Mode::from_bits_truncate(mode)),
        )?;
        Some(rel)
    } else {
        None
    };
    let src = dir.clone().unwrap_or_else(|| PathBuf::from("empty"));
    let fd = step(
        what,
        sys::open_tree(Some(scratch.as_fd()), &c_path(&src)?, sys::OPEN_TREE_CLONE),
    )?;
    step(
        what,
        sys::mount_setattr_fd(fd.as_fd(), false, sys::MOUNT_ATTR_RDONLY, 0),
    )?;
    step(what, sys::move_mount(fd.as_fd(), None, target, 0))?;
    Ok(dir)
}

/// Pin or protect `op` at `target`: a bind of the path onto itself (read-only for a
/// protected path), so that it can be neither renamed nor replaced.
fn attach_protected(op: &MountOp, scratch: &OwnedFd, target: &CStr) -> Result<()> {
    let what = || describe(op);
    let is_link = std::fs::symlink_metadata(&op.path).is_ok_and(|m| m.file_type().is_symlink());
    let fd = if is_link {
        // The link itself becomes the mount point (move_mount does not follow
        // it), so it can be neither replaced nor re-pointed. It shows a
        // read-only copy of its target as seen now (masks included) when that
        // is a file, else the empty unreadable file.
        match std::fs::canonicalize(&op.path).ok().filter(|t| t.is_file()) {
            Some(t) => step(
                what,
                sys::open_tree(None, &c_path(&t)?, sys::OPEN_TREE_CLONE),
            )?,
            None => step(
                what,
                sys::open_tree(Some(scratch.as_fd()), MASK_FILE, sys::OPEN_TREE_CLONE),
            )?,
        }
    } else {
        step(
            what,
            sys::open_tree(None, target, sys::OPEN_TREE_CLONE | sys::AT_RECURSIVE),
        )?
    };
    if op.kind == OpKind::Protect {
        step(
            what,
            sys::mount_setattr_fd(fd.as_fd(), true, sys::MOUNT_ATTR_RDONLY, 0),
        )?;
    }
    step(what, sys::move_mount(fd.as_fd(), None, target, 0))
}

/// The detached copies of the plan's writable roots and re-opened reads, one per
/// operation in order (`None` for the other kinds), taken from the tree as it is now:
/// nosuid, nodev, private (no mount event propagates in or out), the re-opened reads
/// read-only, and with `idmap` the writable roots and the read grants
/// ([`FsPlan::read_grants`]) idmapped through that user namespace (`MOUNT_ATTR_IDMAP`: a
/// file owned by the caller on disk is the command's own, and what the command makes is
/// the caller's on disk). Each path is resolved without
/// following a symbolic link: the plan resolved it already, and a link that appeared
/// since is refused, not followed.
///
/// # Errors
/// [`Error::MissingFeature`] when the kernel lacks the new mount API, or when `idmap` is
/// given and the filesystem of a writable root or a read grant (or the kernel, or this
/// process's privilege) cannot be idmapped; [`Error::Sys`] naming the path for any other
/// failure.
pub(crate) fn detached_copies(
    plan: &FsPlan,
    idmap: Option<BorrowedFd<'_>>,
) -> Result<Vec<Option<OwnedFd>>> {
    use nix::fcntl::{OpenHow, ResolveFlag};
    let mut out = Vec::with_capacity(plan.ops.len());
    for op in &plan.ops {
        let (set, idmap) = match op.kind {
            OpKind::Writable => (0, idmap),
            OpKind::Readable => (
                sys::MOUNT_ATTR_RDONLY,
                idmap.filter(|_| plan.read_grants.contains(&op.path)),
            ),
            _ => {
                out.push(None);
                continue;
            }
        };
        let what = || format!("copy mount tree {}", op.path.display());
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
        let at = step(
            what,
            nix::fcntl::openat2(nix::fcntl::AT_FDCWD, &op.path, how),
        )?;
        let fd = match sys::open_tree(
            Some(at.as_fd()),
            c"",
            sys::OPEN_TREE_CLONE | sys::AT_RECURSIVE | sys::AT_EMPTY_PATH,
        ) {
            Err(Errno::ENOSYS) => {
                return Err(Error::MissingFeature {
                    feature: "new mount API (open_tree, move_mount, mount_setattr; Linux 5.12)",
                    detail: "open_tree returned ENOSYS".into(),
                    hint: "run on a newer kernel",
                });
            }
            r => step(what, r)?,
        };
        let restricted = sys::mount_setattr_tree(
            fd.as_fd(),
            set | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
            idmap,
        );
        match restricted {
            Err(e) if idmap.is_some() && op.kind == OpKind::Writable => {
                return Err(Error::MissingFeature {
                    feature: "an idmapped mount of each writable root (mount_setattr MOUNT_ATTR_IDMAP, Linux 5.12; the filesystem must support it: ext4, xfs, btrfs, tmpfs and others do, NFS does not), so that root's command can run as an unprivileged uid",
                    detail: format!("{}: {e}", op.path.display()),
                    hint: "put the writable roots on a filesystem that supports idmapped mounts, run the shim as root of the initial user namespace, or pass --allow-degraded same-uid to run the command as root without capabilities (it can then read every file root owns that is not masked)",
                });
            }
            Err(e) if idmap.is_some() => {
                return Err(Error::MissingFeature {
                    feature: "an idmapped read-only mount of each --allow-read path (mount_setattr MOUNT_ATTR_IDMAP, Linux 5.12; the filesystem must support it: ext4, xfs, btrfs, tmpfs and others do, NFS, proc and sysfs do not), so that root's command, an unprivileged uid, can read it",
                    detail: format!("--allow-read {}: {e}", op.path.display()),
                    hint: "drop that --allow-read (what others may read needs none), name a path on a filesystem that supports idmapped mounts, or pass --allow-degraded same-uid to run the command as root without capabilities (it can then read every file root owns that is not masked)",
                });
            }
            r => step(|| format!("restrict copy of {}", op.path.display()), r)?,
        }
        out.push(Some(fd));
    }
    Ok(out)
}

/// Show `content` at `path`, read-only: a file of a small private tmpfs mounted over it
/// (the path itself, not a symlink's target, becomes the mount point). A missing `path`
/// is left alone. Called after [`apply`], in the sandbox's mount namespace.
///
/// # Errors
/// [`Error::Sys`] naming the step that failed.
pub(crate) fn cover_file(path: &Path, content: &str) -> Result<()> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    let what = || format!("cover {}", path.display());
    let name = c"file";
    let fs = tmpfs_with_file(
        ["0755", "16k", "4"],
        (name, Mode::from_bits_truncate(0o644), content),
        (what, what),
    )?;
    let file = step(
        what,
        sys::open_tree(Some(fs.as_fd()), name, sys::OPEN_TREE_CLONE),
    )?;
    step(
        what,
        sys::mount_setattr_fd(file.as_fd(), false, sys::MOUNT_ATTR_RDONLY, 0),
    )?;
    step(what, sys::move_mount(file.as_fd(), None, &c_path(path)?, 0))
}

/// Create the directories (mode 0111: traversable, not listable) and the final file or
/// directory at `rel` inside the scratch tmpfs.
fn make_mount_point(scratch: &OwnedFd, rel: &Path, is_dir: bool) -> Result<()> {
    let mut cur = PathBuf::new();
    let comps: Vec<_> = rel.components().collect();
    for (n, c) in comps.iter().enumerate() {
        cur.push(c);
        let last = n + 1 == comps.len();
        let r = if last && !is_dir {
            nix::fcntl::openat(
                scratch.as_fd(),
                &cur,
                OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map(drop)
        } else {
            nix::sys::stat::mkdirat(scratch.as_fd(), &cur, Mode::from_bits_truncate(0o111))
        };
        match r {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => {
                return Err(Error::sys(
                    format!("mount point {} in a read mask", cur.display()),
                    e,
                ));
            }
        }
    }
    Ok(())
}

/// Replace `/dev` with a private tmpfs holding copies of the harmless device nodes, a
/// new `devpts` instance and a private `shm`; the tmpfs itself ends read-only.
fn build_dev(devices: Vec<(&str, OwnedFd)>) -> Result<()> {
    let dev = step(
        || "create /dev tmpfs".into(),
        sys::new_fs_mount(
            "tmpfs",
            &[
                ("mode", Some("0755")),
                ("size", Some("64k")),
                ("nr_inodes", Some("64")),
            ],
            sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
        ),
    )?;
    for (name, _) in &devices {
        step(
            || format!("/dev/{name} mount point"),
            nix::fcntl::openat(
                dev.as_fd(),
                *name,
                OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o666),
            )
            .map(drop),
        )?;
    }
    for d in ["pts", "shm"] {
        step(
            || format!("/dev/{d}"),
            nix::sys::stat::mkdirat(dev.as_fd(), d, Mode::from_bits_truncate(0o755)),
        )?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        step(
            || format!("/dev/{link}"),
            nix::unistd::symlinkat(target, dev.as_fd(), link),
        )?;
    }
    step(
        || "attach tmpfs on /dev".into(),
        sys::move_mount(dev.as_fd(), None, c"/dev", 0),
    )?;
    for (name, fd) in &devices {
        let target = c_path(&Path::new("/dev").join(name))?;
        step(
            || format!("attach /dev/{name}"),
            sys::move_mount(fd.as_fd(), None, &target, 0),
        )?;
    }
    let pts = step(
        || "mount a new devpts".into(),
        sys::new_fs_mount(
            "devpts",
            &[
                ("newinstance", None),
                ("ptmxmode", Some("0666")),
                ("mode", Some("0620")),
            ],
            sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
        ),
    )?;
    step(
        || "attach devpts on /dev/pts".into(),
        sys::move_mount(pts.as_fd(), None, c"/dev/pts", 0),
    )?;
    let shm = step(
        || "create /dev/shm tmpfs".into(),
        sys::new_fs_mount(
            "tmpfs",
            &[("mode", Some("1777")), ("size", Some("64m"))],
            sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV | sys::MOUNT_ATTR_NOEXEC,
        ),
    )?;
    step(
        || "attach tmpfs on /dev/shm".into(),
        sys::move_mount(shm.as_fd(), None, c"/dev/shm", 0),
    )?;
    step(
        || "make /dev read-only".into(),
        sys::mount_setattr_fd(dev.as_fd(), false, sys::MOUNT_ATTR_RDONLY, 0),
    )?;
    Ok(())
}
