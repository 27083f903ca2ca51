//! The new mount API (`open_tree`, `move_mount`, `mount_setattr`, `fsopen`/`fsmount`):
//! detached trees the filesystem view is built from, and their attributes.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;

use super::{cstr, dirfd_raw, fd_result, unit_result};

/// `open_tree(2)` flag: make a detached copy of the tree instead of an `O_PATH` handle.
pub(crate) const OPEN_TREE_CLONE: u32 = 1;
/// `open_tree(2)` / `mount_setattr(2)` flag: include every mount below the path.
pub(crate) const AT_RECURSIVE: u32 = 0x8000;
/// Operate on the fd itself (empty path).
pub(crate) const AT_EMPTY_PATH: u32 = 0x1000;
/// `move_mount(2)`: the source is the fd itself.
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
/// `mount_setattr(2)` attribute bits (`MOUNT_ATTR_*`).
pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// No set-user-ID / set-group-ID execution.
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
/// No device special files.
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;
/// No execution.
pub(crate) const MOUNT_ATTR_NOEXEC: u64 = 0x8;
/// An idmapped mount: ownership as the user namespace `userns_fd` maps it (Linux 5.12).
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const FSOPEN_CLOEXEC: u32 = 1;
const FSMOUNT_CLOEXEC: u32 = 1;
const FSCONFIG_SET_FLAG: u32 = 0;
const FSCONFIG_SET_STRING: u32 = 1;
const FSCONFIG_CMD_CREATE: u32 = 6;

/// `struct mount_attr` (`MOUNT_ATTR_SIZE_VER0`).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `open_tree(2)`: with [`OPEN_TREE_CLONE`] a detached copy of the mount at `path`
/// (relative to `dirfd`, or the cwd), which later calls may reshape and attach.
pub(crate) fn open_tree(
    dirfd: Option<BorrowedFd<'_>>,
    path: &CStr,
    flags: u32,
) -> Result<OwnedFd, Errno> {
    let flags = flags | libc::O_CLOEXEC as u32;
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call; the kernel
    // only reads it. The return value is checked by `fd_result`.
    let rc = unsafe { libc::syscall(libc::SYS_open_tree, dirfd_raw(dirfd), path.as_ptr(), flags) };
    fd_result(rc)
}

/// `move_mount(2)`: attach the detached (or attached) mount `from` at `to_path`.
/// `to_flags` may hold `MOVE_MOUNT_T_*` bits; 0 follows no trailing symlink on the target.
pub(crate) fn move_mount(
    from: BorrowedFd<'_>,
    to_dirfd: Option<BorrowedFd<'_>>,
    to_path: &CStr,
    to_flags: u32,
) -> Result<(), Errno> {
    let empty = c"";
    // SAFETY: both strings are valid and NUL-terminated for the duration of the call, the
    // descriptors are borrowed (open) for the duration of the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from.as_raw_fd(),
            empty.as_ptr(),
            dirfd_raw(to_dirfd),
            to_path.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | to_flags,
        )
    };
    unit_result(rc)
}

/// `mount_setattr(2)` on the mount that `fd` refers to (`recursive`: and everything below).
pub(crate) fn mount_setattr_fd(
    fd: BorrowedFd<'_>,
    recursive: bool,
    set: u64,
    clear: u64,
) -> Result<(), Errno> {
    mount_setattr_at(
        Some(fd),
        c"",
        AT_EMPTY_PATH | if recursive { AT_RECURSIVE } else { 0 },
        MountAttr {
            attr_set: set,
            attr_clr: clear,
            propagation: 0,
            userns_fd: 0,
        },
    )
}

/// `mount_setattr(2)` on the detached tree `fd` (every mount in it): sets `set`, makes
/// it private (no mount event propagates in or out), and with `idmap` maps its files'
/// owners through that user namespace (`MOUNT_ATTR_IDMAP`): a file whose owner is `N` on
/// disk shows as owned by whoever `N` stands for in it, and a file made through the
/// mount is owned by `N` on disk.
pub(crate) fn mount_setattr_tree(
    fd: BorrowedFd<'_>,
    set: u64,
    idmap: Option<BorrowedFd<'_>>,
) -> Result<(), Errno> {
    let userns_fd = match idmap {
        Some(ns) => u64::try_from(ns.as_raw_fd()).map_err(|_| Errno::EBADF)?,
        None => 0,
    };
    mount_setattr_at(
        Some(fd),
        c"",
        AT_EMPTY_PATH | AT_RECURSIVE,
        MountAttr {
            attr_set: set | if idmap.is_some() { MOUNT_ATTR_IDMAP } else { 0 },
            attr_clr: 0,
            propagation: libc::MS_PRIVATE,
            userns_fd,
        },
    )
}

/// `mount_setattr(2)` on the mount at `path`.
pub(crate) fn mount_setattr_path(
    path: &CStr,
    recursive: bool,
    set: u64,
    clear: u64,
) -> Result<(), Errno> {
    mount_setattr_at(
        None,
        path,
        if recursive { AT_RECURSIVE } else { 0 },
        MountAttr {
            attr_set: set,
            attr_clr: clear,
            propagation: 0,
            userns_fd: 0,
        },
    )
}

fn mount_setattr_at(
    dirfd: Option<BorrowedFd<'_>>,
    path: &CStr,
    flags: u32,
    attr: MountAttr,
) -> Result<(), Errno> {
    // SAFETY: `attr` is a properly laid out `struct mount_attr` living on our stack for the
    // whole call and its exact size is passed; `path` is a valid C string.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd_raw(dirfd),
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            size_of::<MountAttr>(),
        )
    };
    unit_result(rc)
}

/// Create a detached mount of a new `fstype` instance configured with `options`
/// (`("key", Some("value"))` for strings, `("key", None)` for flags), mounted with the
/// `MOUNT_ATTR_*` bits in `attrs`.
pub(crate) fn new_fs_mount(
    fstype: &str,
    options: &[(&str, Option<&str>)],
    attrs: u64,
) -> Result<OwnedFd, Errno> {
    let fstype = cstr(fstype)?;
    // SAFETY: `fstype` is a valid C string; the result is checked.
    let fsfd =
        fd_result(unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) })?;
    for (key, value) in options {
        let key = cstr(key)?;
        let value = value.map(cstr).transpose()?;
        let (cmd, vptr) = match &value {
            Some(v) => (FSCONFIG_SET_STRING, v.as_ptr()),
            None => (FSCONFIG_SET_FLAG, std::ptr::null()),
        };
        // SAFETY: `fsfd` is open; `key` and `value` are valid C strings (or NULL for a flag,
        // as fsconfig(2) requires) that outlive the call.
        unit_result(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fsfd.as_raw_fd(),
                cmd,
                key.as_ptr(),
                vptr,
                0,
            )
        })?;
    }
    // SAFETY: FSCONFIG_CMD_CREATE takes no key or value pointers.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fsfd.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_char>(),
            0,
        )
    })?;
    // SAFETY: `fsfd` is an open filesystem context; the result is checked.
    fd_result(unsafe { libc::syscall(libc::SYS_fsmount, fsfd.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) })
}
