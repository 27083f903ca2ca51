//! The sandbox's filesystem view, built in its own mount namespace.
//!
//! Two halves. [`plan`] runs in the outer shim, in the host's view: it canonicalises the
//! configured paths, finds the mandatory deny set inside every writable root (including
//! nested repositories) and lists the mount operations, shallowest first. [`apply`] runs in
//! the inner init, inside the new mount namespace, and carries them out with the new mount
//! API (`open_tree`, `move_mount`, `mount_setattr`, `fsopen`):
//!
//! 1. detached copies of every writable root and re-opened read path are taken from the
//!    pristine tree;
//! 2. the whole tree is made read-only, nosuid and nodev (one recursive `mount_setattr`);
//! 3. fresh read-only `/proc` and `/sys`, and a private `/dev` holding only `null`, `zero`,
//!    `full`, `random`, `urandom`, `tty`, a new `devpts` and a private `shm`;
//! 4. the operations, shallowest first: writable roots (the rw copies), read masks (empty
//!    read-only tmpfs directories or mode-0 files), re-opened reads, the `.git` pin (a
//!    mount point cannot be renamed) and read-only binds of each protected path.
//!
//! It must never leave the host's mount table changed: everything happens after
//! `MS_PRIVATE` in a namespace that dies with the sandbox. The only host-visible effect is
//! the placeholders (empty files or directories) created for protected paths that do not
//! exist yet, which the outer shim (or its janitor, if the shim is killed) removes.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::MsFlags;
use nix::sys::stat::Mode;

use super::sys;
use crate::error::{Error, Result};
use crate::report::Tampering;

/// Shell startup files and per-user tool configs: protected in every writable root, and
/// created (as read-only placeholders) when missing in a writable root that is, or
/// contains, the caller's home directory.
const HOME_FILES: &[&str] = &[
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".gitconfig",
    ".ripgreprc",
    ".bash_aliases",
    ".config/git/config",
    ".config/git/attributes",
];

/// Per-user directories protected whole (read-only, or a read-only placeholder when missing
/// in the home root): `~/.ssh` holds `config`, `rc` and `authorized_keys`, which run code.
const HOME_DIRS: &[&str] = &[".ssh"];

/// How deep `.git/modules` is searched for submodule git directories (nested modules and
/// module names with slashes).
const MODULES_DEPTH: usize = 16;

/// Project-level files that configure tools which run code (git submodules, MCP servers).
const PROJECT_FILES: &[&str] = &[".gitmodules", ".mcp.json"];

/// Project-level IDE configuration directories (tasks and launch configs run code).
const PROJECT_DIRS: &[&str] = &[".vscode", ".idea"];

/// Directory names never searched for nested repositories (generated, huge, or a repo's
/// own internals).
const PRUNE: &[&str] = &[".git", "node_modules"];

/// What a mount operation does to its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum OpKind {
    /// Attach a read-write copy of the pristine tree (an `--allow-write` root).
    Writable,
    /// Attach a read-only copy of the pristine tree (an `--allow-read` under a mask).
    Readable,
    /// Cover with an empty, unreadable, read-only file or directory (`--deny-read`).
    Mask,
    /// Bind the current view onto itself, read-write, so the path is a mount point that
    /// cannot be renamed or removed (`.git`).
    Pin,
    /// Bind the current view onto itself read-only (the mandatory deny set).
    Protect,
}

/// One step of the filesystem plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountOp {
    /// Canonical absolute path.
    pub(crate) path: PathBuf,
    /// What to do there.
    pub(crate) kind: OpKind,
    /// Whether the path is a directory (else a file).
    pub(crate) is_dir: bool,
}

/// A protected path that did not exist and was created empty on the host so that it can
/// be covered read-only; removed at exit if still the same empty object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placeholder {
    /// Where it was created.
    pub(crate) path: PathBuf,
    /// Directory (else regular file).
    pub(crate) is_dir: bool,
    /// Its device, to recognise it at cleanup.
    pub(crate) dev: u64,
    /// Its inode, to recognise it at cleanup.
    pub(crate) ino: u64,
}

impl Placeholder {
    /// Remove the placeholder if it is still the empty object the shim created.
    pub(crate) fn remove(&self) {
        let Ok(meta) = std::fs::symlink_metadata(&self.path) else {
            return;
        };
        if meta.dev() != self.dev || meta.ino() != self.ino {
            return;
        }
        if self.is_dir {
            let _ = std::fs::remove_dir(&self.path); // fails, as it should, if not empty
        } else if meta.is_file() && meta.len() == 0 {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The filesystem part of the sandbox, ready to apply.
#[derive(Debug, Clone, Default)]
pub(crate) struct FsPlan {
    /// Mount operations, in the order they must be applied.
    pub(crate) ops: Vec<MountOp>,
    /// Canonical writable roots (also the Landlock write rules).
    pub(crate) writable_roots: Vec<PathBuf>,
    /// Placeholders created on the host; the caller must remove them at exit.
    pub(crate) placeholders: Vec<Placeholder>,
    /// `.git/commondir` paths that did not exist at start: one appearing during the run is
    /// tampering and is renamed aside at exit ([`quarantine`]).
    pub(crate) watch: Vec<PathBuf>,
}

/// Rename aside every watched path that now exists (it did not at start). Returns what was
/// moved. Safe to call more than once (a moved path no longer exists).
pub(crate) fn quarantine(watch: &[PathBuf]) -> Vec<Tampering> {
    let mut out = Vec::new();
    for p in watch {
        if std::fs::symlink_metadata(p).is_err() {
            continue;
        }
        let mut to = p.as_os_str().to_owned();
        to.push(format!(".shim-quarantine-{}", std::process::id()));
        let to = PathBuf::from(to);
        if std::fs::rename(p, &to).is_ok() {
            out.push(Tampering {
                path: p.clone(),
                quarantined_as: to,
            });
        }
    }
    out
}

fn depth(p: &Path) -> usize {
    p.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count()
}

fn canonical(what: &'static str, p: &Path, missing_ok: bool) -> Result<Option<(PathBuf, bool)>> {
    match std::fs::canonicalize(p) {
        Ok(c) => {
            let is_dir = std::fs::metadata(&c)
                .map_err(|source| Error::Path {
                    what,
                    path: p.to_owned(),
                    source,
                })?
                .is_dir();
            Ok(Some((c, is_dir)))
        }
        Err(e) if missing_ok && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Path {
            what,
            path: p.to_owned(),
            source,
        }),
    }
}

/// Build the plan. Creates placeholders on the host for missing protected paths (listed in
/// the result even if a later step fails, so the caller can always clean up).
///
/// `home` is the caller's home directory (for the home-only placeholders). `read_only`
/// are paths the shim itself prepared for the command (the CA directory): they are shown
/// read-only from the host's tree whatever `allow_write` and `deny_read` say about the
/// directories above them.
///
/// # Errors
/// [`Error::Path`] when an `--allow-write` root does not exist or any configured path
/// cannot be resolved for another reason than not existing; [`Error::Usage`] for
/// `--allow-write /`.
pub(crate) fn plan(
    allow_write: &[PathBuf],
    deny_read: &[PathBuf],
    allow_read: &[PathBuf],
    read_only: &[PathBuf],
    home: Option<&Path>,
    plan: &mut FsPlan,
) -> Result<()> {
    let mut ops = Vec::new();
    for p in allow_write {
        let Some((c, is_dir)) = canonical("--allow-write", p, false)? else {
            continue;
        };
        if c == Path::new("/") {
            return Err(Error::Usage("--allow-write / would make the whole filesystem writable; name the directories instead".into()));
        }
        if !plan.writable_roots.contains(&c) {
            plan.writable_roots.push(c.clone());
            ops.push(MountOp {
                path: c,
                kind: OpKind::Writable,
                is_dir,
            });
        }
    }
    for p in deny_read {
        if let Some((c, is_dir)) = canonical("--deny-read", p, true)? {
            if c == Path::new("/") {
                return Err(Error::Usage(
                    "--deny-read / would hide the whole filesystem, including the command".into(),
                ));
            }
            ops.push(MountOp {
                path: c,
                kind: OpKind::Mask,
                is_dir,
            });
        }
    }
    for p in allow_read {
        if let Some((c, is_dir)) = canonical("--allow-read", p, true)? {
            // Re-opening only matters beneath a mask; elsewhere everything is readable.
            if ops
                .iter()
                .any(|o| o.kind == OpKind::Mask && c.starts_with(&o.path))
            {
                ops.push(MountOp {
                    path: c,
                    kind: OpKind::Readable,
                    is_dir,
                });
            }
        }
    }
    for p in read_only {
        if let Some((c, is_dir)) = canonical("shim-prepared path", p, false)? {
            ops.push(MountOp {
                path: c,
                kind: OpKind::Readable,
                is_dir,
            });
        }
    }
    let roots = plan.writable_roots.clone();
    for w in roots.iter().filter(|w| w.is_dir()) {
        let is_home = home.is_some_and(|h| h.starts_with(w));
        let mut repo_roots = vec![w.clone()];
        find_repositories(w, &mut repo_roots);
        if is_home {
            if let Some(h) = home {
                if h != w && h.is_dir() {
                    repo_roots.push(h.to_owned());
                }
            }
        }
        let mut p = Protector {
            writable: &roots,
            ops: &mut ops,
            plan,
        };
        for root in &repo_roots {
            let home_here = is_home && home == Some(root.as_path());
            p.protect_root(root, home_here, root == w)?;
        }
    }
    // Shallowest first; at equal depth, kinds in `OpKind` order (so a mask covers a
    // writable root at the same path, and protection is applied last).
    ops.sort_by(|a, b| {
        depth(&a.path)
            .cmp(&depth(&b.path))
            .then(a.kind.cmp(&b.kind))
            .then(a.path.cmp(&b.path))
    });
    ops.dedup_by(|a, b| a.path == b.path && a.kind == b.kind);
    plan.ops = ops;
    Ok(())
}

/// The deepest writable root that holds `p`.
fn root_of<'a>(p: &Path, writable: &'a [PathBuf]) -> Option<&'a Path> {
    writable
        .iter()
        .filter(|w| p.starts_with(w))
        .max_by_key(|w| depth(w))
        .map(PathBuf::as_path)
}

/// `p` with its parent directory canonicalised (symlinks above it resolved), so that the
/// directories above it are real directories that can be pinned.
fn canonical_parent(p: &Path) -> PathBuf {
    match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)
            .map(|c| c.join(name))
            .unwrap_or_else(|_| p.to_owned()),
        _ => p.to_owned(),
    }
}

/// Collects the protection ops of the writable roots.
struct Protector<'a> {
    writable: &'a [PathBuf],
    ops: &'a mut Vec<MountOp>,
    plan: &'a mut FsPlan,
}

impl Protector<'_> {
    /// Make every directory strictly between `p`'s writable root and `p` a mount point:
    /// a mount point cannot be renamed (EBUSY), so the protected path cannot be moved
    /// aside together with a parent and replaced.
    fn pin_ancestors(&mut self, p: &Path) {
        let Some(w) = root_of(p, self.writable) else {
            return;
        };
        let mut cur = p.parent();
        while let Some(d) = cur {
            if d == w || !d.starts_with(w) {
                break;
            }
            self.ops.push(MountOp {
                path: d.to_owned(),
                kind: OpKind::Pin,
                is_dir: true,
            });
            cur = d.parent();
        }
    }

    /// Protect `p` (read-only, not removable, parents pinned).
    fn push(&mut self, p: PathBuf, is_dir: bool) {
        self.pin_ancestors(&p);
        self.ops.push(MountOp {
            path: p,
            kind: OpKind::Protect,
            is_dir,
        });
    }

    /// Create `p` and its missing parents (below a writable root) as placeholders.
    /// `false` when that is not possible (a parent is not a directory, or not writable).
    fn create(&mut self, p: &Path, is_dir: bool) -> Result<bool> {
        let Some(w) = root_of(p, self.writable) else {
            return Ok(false);
        };
        let mut missing = Vec::new();
        let mut cur = Some(p);
        while let Some(d) = cur {
            if d == w {
                break;
            }
            match std::fs::symlink_metadata(d) {
                Ok(m) if m.is_dir() && d != p => break,
                Ok(_) => return Ok(false),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(d),
                Err(_) => return Ok(false),
            }
            cur = d.parent();
        }
        for (n, d) in missing.iter().rev().enumerate() {
            let last = n + 1 == missing.len();
            match create_placeholder(d, !last || is_dir)? {
                Some(ph) => self.plan.placeholders.push(ph),
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Protect one path of the mandatory deny set, existing or not, link or not.
    fn protect(&mut self, path: PathBuf, is_dir: bool, create: bool) -> Result<()> {
        let path = canonical_parent(&path);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                // Pin the link itself (covered by an empty read-only file, so it can be
                // neither followed nor replaced) and its target if that is writable.
                self.push(path.clone(), false);
                if let Ok(target) = std::fs::canonicalize(&path) {
                    if root_of(&target, self.writable).is_some() {
                        let d = target.is_dir();
                        self.push(target, d);
                    }
                } else if let Some(target) = dangling_target(&path) {
                    // A dangling link: its target is created as a read-only placeholder
                    // (with its missing parents), so the command cannot create it.
                    if self.create(&target, is_dir)? {
                        self.push(target, is_dir);
                    }
                }
            }
            Ok(meta) => self.push(path, meta.is_dir()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                if self.create(&path, is_dir)? {
                    self.push(path, is_dir);
                }
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// Protect a git directory's code-running metadata: `config`, `config.worktree`,
    /// `hooks/`, the admin files of its worktrees, and the same for every submodule git
    /// directory under `modules/` (recursively). Records a missing `commondir`.
    fn protect_gitdir(&mut self, gitdir: &Path, level: usize) -> Result<()> {
        self.ops.push(MountOp {
            path: gitdir.to_owned(),
            kind: OpKind::Pin,
            is_dir: true,
        });
        self.pin_ancestors(gitdir);
        self.protect(gitdir.join("config"), false, true)?;
        self.protect(gitdir.join("config.worktree"), false, true)?;
        self.protect(gitdir.join("hooks"), true, true)?;
        let commondir = gitdir.join("commondir");
        if std::fs::symlink_metadata(&commondir).is_err() {
            self.plan.watch.push(commondir);
        } else {
            self.protect(commondir, false, false)?;
        }
        for wt in subdirs(&gitdir.join("worktrees")) {
            self.protect(wt.join("config.worktree"), false, true)?;
            for name in ["commondir", "gitdir", "config"] {
                self.protect(wt.join(name), false, false)?;
            }
        }
        self.protect_modules(&gitdir.join("modules"), level)
    }

    /// Submodule git directories below `dir` (a `modules` directory, or a level of a
    /// module name with slashes).
    fn protect_modules(&mut self, dir: &Path, level: usize) -> Result<()> {
        if level >= MODULES_DEPTH {
            return Ok(());
        }
        for d in subdirs(dir) {
            if d.join("HEAD").is_file() {
                self.protect_gitdir(&d, level + 1)?;
            } else {
                self.protect_modules(&d, level + 1)?;
            }
        }
        Ok(())
    }

    /// Push the protection ops for one root (a writable root or a repository in one).
    /// `home`: the root is the caller's home (missing per-user files get placeholders);
    /// `writable_root`: it is a writable root itself (a missing `.git` gets one).
    fn protect_root(&mut self, root: &Path, home: bool, writable_root: bool) -> Result<()> {
        for name in HOME_FILES {
            self.protect(root.join(name), false, home)?;
        }
        for name in HOME_DIRS {
            self.protect(root.join(name), true, home)?;
        }
        for name in PROJECT_FILES {
            self.protect(root.join(name), false, true)?;
        }
        for name in PROJECT_DIRS {
            self.protect(root.join(name), true, true)?;
        }
        let git = root.join(".git");
        match std::fs::symlink_metadata(&git) {
            Ok(m) if m.is_dir() => self.protect_gitdir(&git, 0)?,
            // A `.git` file (worktree, submodule) points at the real git dir: pin it read-only.
            Ok(_) => self.protect(git, false, false)?,
            // No repository in a writable root: an empty read-only `.git` placeholder, so
            // that `git init` there fails (a repository created during the run would run
            // its config's commands in the host's next `git` there).
            Err(_) if writable_root => self.protect(git, true, true)?,
            Err(_) => {}
        }
        Ok(())
    }
}

/// The real directories in `dir` (not following symlinks); none if it is missing.
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// Where a dangling symlink points: its existing part canonicalised, the missing rest
/// appended. `None` when that rest climbs (`..`) or passes through another dangling link.
fn dangling_target(link: &Path) -> Option<PathBuf> {
    let target = link.parent()?.join(std::fs::read_link(link).ok()?);
    let comps: Vec<Component<'_>> = target.components().collect();
    let mut existing = PathBuf::new();
    let mut n = 0;
    while n < comps.len() {
        let next = existing.join(comps[n]);
        if std::fs::symlink_metadata(&next).is_err() {
            break;
        }
        existing = next;
        n += 1;
    }
    let mut out = std::fs::canonicalize(&existing).ok()?;
    if n == comps.len() {
        return None; // the last component exists: a link to a dangling link
    }
    for c in &comps[n..] {
        match c {
            Component::Normal(x) => out.push(x),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

/// Create an empty placeholder; `None` if the directory is not writable by the caller
/// (then the sandbox, with the same uid and fewer rights, cannot create it either).
fn create_placeholder(path: &Path, is_dir: bool) -> Result<Option<Placeholder>> {
    let made = if is_dir {
        std::fs::create_dir(path)
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map(drop)
    };
    match made {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EACCES | libc::EPERM | libc::EROFS)
            ) =>
        {
            return Ok(None);
        }
        Err(source) => {
            return Err(Error::Path {
                what: "creating a placeholder for protected path",
                path: path.to_owned(),
                source,
            });
        }
    }
    let meta = std::fs::symlink_metadata(path).map_err(|source| Error::Path {
        what: "placeholder",
        path: path.to_owned(),
        source,
    })?;
    Ok(Some(Placeholder {
        path: path.to_owned(),
        is_dir,
        dev: meta.dev(),
        ino: meta.ino(),
    }))
}

/// Directories under `root` that hold a `.git` (nested repositories), not following
/// symlinks, not crossing into other filesystems, not entering `.git`, `node_modules` or
/// directories tagged `CACHEDIR.TAG` (build output such as `target/`).
fn find_repositories(root: &Path, out: &mut Vec<PathBuf>) {
    let Ok(root_meta) = std::fs::metadata(root) else {
        return;
    };
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(ft) = entry.file_type() else { continue };
            let name = entry.file_name();
            if name == ".git" {
                if dir != root {
                    out.push(dir.clone());
                }
                continue;
            }
            if !ft.is_dir() || PRUNE.iter().any(|p| name == *p) {
                continue;
            }
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != root_meta.dev() || path.join("CACHEDIR.TAG").exists() {
                continue;
            }
            stack.push(path);
        }
    }
}

fn c_path(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::Usage(format!("path {} contains a NUL byte", p.display())))
}

fn step<T>(what: impl FnOnce() -> String, r: std::result::Result<T, Errno>) -> Result<T> {
    r.map_err(|e| Error::sys(what(), e))
}

/// Carry out `plan` in the current (new, private) mount namespace. Must run with
/// `CAP_SYS_ADMIN` in the namespace's owning user namespace.
///
/// # Errors
/// [`Error::MissingFeature`] when the kernel lacks the new mount API (Linux 5.12), and
/// [`Error::Sys`] naming the step for any other failure; the caller then aborts the run.
pub(crate) fn apply(plan: &FsPlan) -> Result<()> {
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

    // 1. Pristine copies, before anything is made read-only.
    let mut clones: Vec<Option<OwnedFd>> = Vec::with_capacity(plan.ops.len());
    for op in &plan.ops {
        let fd = match op.kind {
            OpKind::Writable | OpKind::Readable => {
                let p = c_path(&op.path)?;
                let fd = match sys::open_tree(None, &p, sys::OPEN_TREE_CLONE | sys::AT_RECURSIVE) {
                    Err(Errno::ENOSYS) => {
                        return Err(Error::MissingFeature {
                            feature: "new mount API (open_tree, move_mount, mount_setattr; Linux 5.12)",
                            detail: "open_tree returned ENOSYS".into(),
                            hint: "run on a newer kernel",
                        });
                    }
                    r => step(|| format!("copy mount tree {}", op.path.display()), r)?,
                };
                let set = if op.kind == OpKind::Readable {
                    sys::MOUNT_ATTR_RDONLY
                } else {
                    0
                } | sys::MOUNT_ATTR_NOSUID
                    | sys::MOUNT_ATTR_NODEV;
                step(
                    || format!("restrict copy of {}", op.path.display()),
                    sys::mount_setattr_fd(fd.as_fd(), true, set, 0),
                )?;
                Some(fd)
            }
            _ => None,
        };
        clones.push(fd);
    }
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
    let pseudo = sys::MOUNT_ATTR_RDONLY
        | sys::MOUNT_ATTR_NOSUID
        | sys::MOUNT_ATTR_NODEV
        | sys::MOUNT_ATTR_NOEXEC;
    let proc_fd = step(
        || "mount a new proc".into(),
        sys::new_fs_mount("proc", &[], pseudo),
    )?;
    step(
        || "attach proc on /proc".into(),
        sys::move_mount(proc_fd.as_fd(), None, c"/proc", 0),
    )?;
    let sys_fd = step(
        || "mount a new sysfs".into(),
        sys::new_fs_mount("sysfs", &[], pseudo),
    )?;
    step(
        || "attach sysfs on /sys".into(),
        sys::move_mount(sys_fd.as_fd(), None, c"/sys", 0),
    )?;
    build_dev(devices)?;

    // 4. The plan.
    let scratch = step(
        || "create the mask tmpfs".into(),
        sys::new_fs_mount(
            "tmpfs",
            &[
                ("mode", Some("0111")),
                ("size", Some("64k")),
                ("nr_inodes", Some("4096")),
            ],
            sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV | sys::MOUNT_ATTR_NOEXEC,
        ),
    )?;
    let empty = c"empty";
    let f = step(
        || "create the mask file".into(),
        nix::fcntl::openat(
            scratch.as_fd(),
            empty,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ),
    )?;
    drop(f);
    // (path, scratch-relative directory) of each directory mask applied so far.
    let mut masks: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut applied: Vec<&MountOp> = Vec::new();
    for (i, (op, clone)) in plan.ops.iter().zip(clones).enumerate() {
        // If the deepest op above this path is a directory mask, the mount point must be
        // made inside the mask's tmpfs first.
        let parent_op = applied
            .iter()
            .rev()
            .filter(|a| op.path.starts_with(&a.path) && a.path != op.path)
            .max_by_key(|a| depth(&a.path));
        if let Some(parent) = parent_op {
            if parent.kind == OpKind::Mask {
                if let Some((mpath, mrel)) = masks.iter().find(|(m, _)| *m == parent.path) {
                    let rel = op
                        .path
                        .strip_prefix(mpath)
                        .map_err(|_| Error::Usage("mask bookkeeping".into()))?;
                    make_mount_point(&scratch, &mrel.join(rel), op.is_dir)?;
                }
            }
        }
        let target = c_path(&op.path)?;
        let what = || format!("{:?} {}", op.kind, op.path.display());
        match op.kind {
            OpKind::Writable | OpKind::Readable => {
                let fd = clone.ok_or_else(|| Error::Usage("missing clone".into()))?;
                step(what, sys::move_mount(fd.as_fd(), None, &target, 0))?;
            }
            OpKind::Mask => {
                let src = if op.is_dir {
                    let rel = PathBuf::from(format!("m{i}"));
                    let has_children = plan
                        .ops
                        .iter()
                        .any(|o| o.path != op.path && o.path.starts_with(&op.path));
                    let mode = if has_children { 0o111 } else { 0 };
                    step(
                        what,
                        nix::sys::stat::mkdirat(
                            scratch.as_fd(),
                            &rel,
                            Mode::from_bits_truncate(mode),
                        ),
                    )?;
                    masks.push((op.path.clone(), rel.clone()));
                    rel
                } else {
                    PathBuf::from("empty")
                };
                let fd = step(
                    what,
                    sys::open_tree(Some(scratch.as_fd()), &c_path(&src)?, sys::OPEN_TREE_CLONE),
                )?;
                step(
                    what,
                    sys::mount_setattr_fd(fd.as_fd(), false, sys::MOUNT_ATTR_RDONLY, 0),
                )?;
                step(what, sys::move_mount(fd.as_fd(), None, &target, 0))?;
            }
            OpKind::Pin | OpKind::Protect => {
                let is_link =
                    std::fs::symlink_metadata(&op.path).is_ok_and(|m| m.file_type().is_symlink());
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
                            sys::open_tree(Some(scratch.as_fd()), empty, sys::OPEN_TREE_CLONE),
                        )?,
                    }
                } else {
                    step(
                        what,
                        sys::open_tree(None, &target, sys::OPEN_TREE_CLONE | sys::AT_RECURSIVE),
                    )?
                };
                if op.kind == OpKind::Protect {
                    step(
                        what,
                        sys::mount_setattr_fd(fd.as_fd(), true, sys::MOUNT_ATTR_RDONLY, 0),
                    )?;
                }
                step(what, sys::move_mount(fd.as_fd(), None, &target, 0))?;
            }
        }
        applied.push(op);
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!("shim-fs-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Self(std::fs::canonicalize(&p).unwrap())
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn plan_orders_ops_shallowest_first_and_pins_git() {
        let t = TempDir::new("order");
        let w = t.0.join("w");
        std::fs::create_dir_all(w.join(".git/hooks")).unwrap();
        std::fs::write(w.join(".git/config"), "").unwrap();
        std::fs::create_dir_all(w.join("sub/inner/.git")).unwrap();
        std::fs::create_dir_all(w.join("target/x/.git")).unwrap();
        std::fs::write(w.join("target/CACHEDIR.TAG"), "").unwrap();
        let mut plan = FsPlan::default();
        super::plan(
            std::slice::from_ref(&w),
            &[w.join("secret"), t.0.join("missing")],
            &[],
            &[],
            None,
            &mut plan,
        )
        .unwrap();
        let depths: Vec<usize> = plan.ops.iter().map(|o| depth(&o.path)).collect();
        assert!(depths.windows(2).all(|d| d[0] <= d[1]), "{:?}", plan.ops);
        assert_eq!(
            plan.ops[0],
            MountOp {
                path: w.clone(),
                kind: OpKind::Writable,
                is_dir: true
            }
        );
        assert!(plan.ops.contains(&MountOp {
            path: w.join(".git"),
            kind: OpKind::Pin,
            is_dir: true
        }));
        assert!(plan.ops.contains(&MountOp {
            path: w.join(".git/hooks"),
            kind: OpKind::Protect,
            is_dir: true
        }));
        assert!(
            plan.ops.contains(&MountOp {
                path: w.join("sub/inner/.git"),
                kind: OpKind::Pin,
                is_dir: true
            }),
            "nested repo"
        );
        assert!(
            !plan
                .ops
                .iter()
                .any(|o| o.path.starts_with(w.join("target"))),
            "CACHEDIR.TAG pruned"
        );
        // Missing project files got placeholders; home files did not (not a home dir).
        assert!(
            plan.placeholders
                .iter()
                .any(|p| p.path == w.join(".mcp.json"))
        );
        assert!(
            !plan
                .placeholders
                .iter()
                .any(|p| p.path == w.join(".bashrc"))
        );
        for p in &plan.placeholders {
            p.remove();
            assert!(!p.path.exists(), "{}", p.path.display());
        }
    }

    #[test]
    fn allow_write_root_is_refused() {
        let mut plan = FsPlan::default();
        assert!(matches!(
            super::plan(&["/".into()], &[], &[], &[], None, &mut plan),
            Err(Error::Usage(_))
        ));
    }

    #[test]
    fn missing_allow_write_is_an_error_missing_deny_is_not() {
        let mut plan = FsPlan::default();
        assert!(matches!(
            super::plan(
                &["/nonexistent-shim-test".into()],
                &[],
                &[],
                &[],
                None,
                &mut plan
            ),
            Err(Error::Path { .. })
        ));
        let mut plan = FsPlan::default();
        super::plan(
            &[],
            &["/nonexistent-shim-test".into()],
            &[],
            &[],
            None,
            &mut plan,
        )
        .unwrap();
        assert!(plan.ops.is_empty());
    }
}
