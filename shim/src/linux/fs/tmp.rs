//! The private temporary directory: one tmpfs for the run, bounded in size, shown at
//! `/tmp` and at `/var/tmp` (one bound for both, and for the tools' caches kept there),
//! writable by the command, and gone with the sandbox's mount namespace.
//!
//! Planned in the outer shim ([`plan`]): a temporary directory at or beneath a writable
//! root, a `--deny-read` path or (root's command) an `--allow-read` path keeps what those
//! say (the host's `/tmp` with `--allow-write /tmp`). The host's own `/tmp` is hidden
//! inside, except what the run names: the working directory, the directory of a program
//! named by its path and the `--allow-read` paths (shown read-only, as before, when no
//! writable root holds them) and the paths of the plan (writable roots, masks, read
//! grants, the CA files), whose mount points are made inside the tmpfs
//! ([`make_mount_point`]). Mounted in the inner init
//! ([`mount`]), after the tree is made read-only and before the plan's operations.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::{FchmodatFlags, Mode};

use super::plan::{FsPlan, MountOp, OpKind, PrivateTmp};
use crate::error::{Error, Result};
use crate::linux::sys;

/// The temporary directories a run gets, where the host has them.
pub(crate) const TMP_DIRS: &[&str] = &["/tmp", "/var/tmp"];

/// Plan the private temporary directory of bound `size` into `plan` (made by
/// [`super::plan()`]): the directories that get it, and the paths of `keep` (the working
/// directory, the directory of a program named by its path, the `--allow-read` paths)
/// kept visible, read-only, when they are in one of them and no writable root, mask or
/// read grant covers them.
pub(crate) fn plan(size: &str, keep: &[PathBuf], plan: &mut FsPlan) {
    let covered = |p: &Path| {
        plan.ops
            .iter()
            .any(|o| matches!(o.kind, OpKind::Writable | OpKind::Mask) && p.starts_with(&o.path))
            || plan.read_grants.iter().any(|g| p.starts_with(g))
    };
    let dirs: Vec<PathBuf> = TMP_DIRS
        .iter()
        .filter_map(|d| std::fs::canonicalize(d).ok())
        .filter(|d| d.is_dir() && !covered(d))
        .fold(Vec::new(), |mut v, d| {
            if !v.contains(&d) {
                v.push(d);
            }
            v
        });
    if dirs.is_empty() {
        return;
    }
    let tmp = PrivateTmp {
        size: size.to_owned(),
        dirs,
    };
    let mut ops = std::mem::take(&mut plan.ops);
    for path in keep.iter().filter_map(|d| std::fs::canonicalize(d).ok()) {
        let kept = |o: &MountOp| o.kind == OpKind::Readable && path.starts_with(&o.path);
        if tmp.holds(&path)
            && !tmp.dirs.contains(&path)
            && !ops.iter().any(|o| {
                kept(o)
                    || (matches!(o.kind, OpKind::Writable | OpKind::Mask)
                        && path.starts_with(&o.path))
            })
        {
            let is_dir = path.is_dir();
            ops.push(MountOp {
                path,
                kind: OpKind::Readable,
                is_dir,
            });
        }
    }
    plan.ops = super::plan::order(ops);
    plan.tmp = Some(tmp);
}

/// Mount the private temporary directory: one tmpfs (nosuid, nodev), a directory in it
/// (mode 1777) for each of `tmp.dirs`, each attached there.
///
/// # Errors
/// [`Error::Sys`] naming the step that failed; the caller aborts the run.
pub(crate) fn mount(tmp: &PrivateTmp) -> Result<()> {
    let fs = sys::new_fs_mount(
        "tmpfs",
        &[("mode", Some("0755")), ("size", Some(&tmp.size))],
        sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
    )
    .map_err(|e| {
        Error::sys(
            format!(
                "create the private temporary directory (tmpfs, size={})",
                tmp.size
            ),
            e,
        )
    })?;
    for (i, dir) in tmp.dirs.iter().enumerate() {
        let what = || format!("the private temporary directory at {}", dir.display());
        let name = PathBuf::from(format!("d{i}"));
        let sticky = Mode::from_bits_truncate(0o1777);
        nix::sys::stat::mkdirat(fs.as_fd(), &name, sticky).map_err(|e| Error::sys(what(), e))?;
        // The umask took the bits others need.
        nix::sys::stat::fchmodat(fs.as_fd(), &name, sticky, FchmodatFlags::NoFollowSymlink)
            .map_err(|e| Error::sys(what(), e))?;
        let name = CString::new(name.as_os_str().as_bytes())
            .map_err(|_| Error::Usage("tmp name".into()))?;
        let clone = sys::open_tree(Some(fs.as_fd()), &name, sys::OPEN_TREE_CLONE)
            .map_err(|e| Error::sys(what(), e))?;
        let target = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| Error::Usage(format!("path {} contains a NUL byte", dir.display())))?;
        sys::move_mount(clone.as_fd(), None, &target, 0).map_err(|e| Error::sys(what(), e))?;
    }
    Ok(())
}

/// Make `path` (a directory when `is_dir`, else an empty file), and the directories above
/// it, inside the private temporary directory: the mount point of a plan operation there.
///
/// # Errors
/// [`Error::Sys`] when it cannot be made.
pub(crate) fn make_mount_point(path: &Path, is_dir: bool) -> Result<()> {
    let dir = if is_dir { Some(path) } else { path.parent() };
    let made = dir.map_or(Ok(()), std::fs::create_dir_all).and_then(|()| {
        if is_dir {
            Ok(())
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map(drop)
        }
    });
    made.map_err(|e| {
        Error::io(
            format!(
                "mount point {} in the private temporary directory",
                path.display()
            ),
            e,
        )
    })
}
