//! The mandatory deny set (design section 12): which paths inside a writable root must
//! stay read-only because they make tools run code (shell startup files, `.gitconfig`,
//! `.git/config`, `.git/hooks`, IDE and MCP configs, `.ssh`, ...), for the root itself and
//! for every git repository found under it, existing or not, links or not.
//!
//! It reads the host's tree and, for protected paths that do not exist yet, creates empty
//! placeholders so that they can be covered (the caller removes them at exit), or, where
//! a placeholder would not do (a `.git/commondir`) or would litter a project (the shell
//! startup files in a writable root that is not the home directory), lists them to be
//! watched ([`super::quarantine`](mod@super::quarantine) moves aside whatever appeared
//! there by the end of the run). It never mounts anything (that is
//! [`super::apply`](mod@super::apply)) and never decides how its protections are ordered
//! among the other mount operations (that is [`super::plan`](mod@super::plan)).

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use super::quarantine::Watch;
use crate::error::{Error, Result};
use crate::report::TamperKind;

/// Shell startup files and per-user tool configs: protected in every writable root;
/// when missing, created as read-only placeholders in the caller's home directory, and
/// watched in every other writable root (one created there during the run is moved aside
/// at exit).
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
/// in the home root, watched when missing in another writable root): `~/.ssh` holds
/// `config`, `rc` and `authorized_keys`, which run code.
const HOME_DIRS: &[&str] = &[".ssh"];

/// How deep `.git/modules` is searched for submodule git directories (nested modules and
/// module names with slashes).
const MODULES_DEPTH: usize = 16;

/// Project-level files that configure tools which run code (git submodules, MCP servers).
const PROJECT_FILES: &[&str] = &[".gitmodules", ".mcp.json"];

/// Project-level IDE configuration directories (tasks and launch configs run code).
const PROJECT_DIRS: &[&str] = &[".vscode", ".idea"];

/// How a protected path is guarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// A mount point of itself, still writable inside, so that it cannot be renamed or
    /// removed (`.git`, and every directory between a writable root and a protected path).
    Pin,
    /// A read-only mount of itself: it can be neither changed, removed nor replaced.
    ReadOnly,
}

/// One protected path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Protected {
    /// Canonical absolute path (a symlink itself, not its target, where it is one).
    pub(crate) path: PathBuf,
    /// How it is guarded.
    pub(crate) guard: Guard,
    /// Whether it is a directory (else a file, or a link).
    pub(crate) is_dir: bool,
}

/// What protecting the writable roots found and did on the host.
#[derive(Debug, Clone, Default)]
pub(crate) struct Protections {
    /// The paths to guard, in the order found (the planner orders them).
    pub(crate) paths: Vec<Protected>,
    /// Placeholders created on the host; the caller must remove them at exit.
    pub(crate) placeholders: Vec<Placeholder>,
    /// Protected paths that did not exist at start and got no placeholder (`.git/commondir`;
    /// the per-user files in a writable root that is not the home directory): one appearing
    /// during the run is tampering and is renamed aside at exit
    /// ([`super::quarantine::quarantine`]).
    pub(crate) watch: Vec<Watch>,
}

/// Find the protections of every writable root in `writable` (canonical) that is a
/// directory, and of every repository under it. Placeholders are recorded in `out` as
/// they are created, so that the caller can remove them even when this fails half-way.
///
/// `home` is the caller's home directory (canonical): in the root that holds it, missing
/// per-user files get placeholders, and the home directory is protected like a root.
///
/// # Errors
/// [`Error::Path`] when a placeholder cannot be created for another reason than
/// permissions (the sandbox, with the same uid and fewer rights, could not create it
/// either, so that case is not an error).
pub(crate) fn protect_roots(
    writable: &[PathBuf],
    home: Option<&Path>,
    out: &mut Protections,
) -> Result<()> {
    for w in writable.iter().filter(|w| w.is_dir()) {
        let is_home = home.is_some_and(|h| h.starts_with(w));
        let mut repo_roots = vec![w.clone()];
        super::repos::find_repositories(w, &mut repo_roots);
        if is_home
            && let Some(h) = home
            && h != w
            && h.is_dir()
        {
            repo_roots.push(h.to_owned());
        }
        let mut p = Protector { writable, out };
        for root in &repo_roots {
            let home_here = is_home && home == Some(root.as_path());
            p.protect_root(root, home_here, root == w)?;
        }
    }
    Ok(())
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

/// The deepest writable root that holds `p`.
fn root_of<'a>(p: &Path, writable: &'a [PathBuf]) -> Option<&'a Path> {
    writable
        .iter()
        .filter(|w| p.starts_with(w))
        // The roots that hold `p` are prefixes of it: the deepest has the most components.
        .max_by_key(|w| w.components().count())
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

/// Collects the protections of the writable roots.
struct Protector<'a> {
    writable: &'a [PathBuf],
    out: &'a mut Protections,
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
            self.out.paths.push(Protected {
                path: d.to_owned(),
                guard: Guard::Pin,
                is_dir: true,
            });
            cur = d.parent();
        }
    }

    /// Protect `p` (read-only, not removable, parents pinned).
    fn push(&mut self, p: PathBuf, is_dir: bool) {
        self.pin_ancestors(&p);
        self.out.paths.push(Protected {
            path: p,
            guard: Guard::ReadOnly,
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
                Some(ph) => self.out.placeholders.push(ph),
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
        self.out.paths.push(Protected {
            path: gitdir.to_owned(),
            guard: Guard::Pin,
            is_dir: true,
        });
        self.pin_ancestors(gitdir);
        self.protect(gitdir.join("config"), false, true)?;
        self.protect(gitdir.join("config.worktree"), false, true)?;
        self.protect(gitdir.join("hooks"), true, true)?;
        let commondir = gitdir.join("commondir");
        if std::fs::symlink_metadata(&commondir).is_err() {
            // The git directory is pinned (a mount point): the walk starts there.
            self.out.watch.extend(Watch::new(
                gitdir,
                Path::new("commondir"),
                TamperKind::GitCommondir,
            ));
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
        for (name, is_dir) in HOME_FILES
            .iter()
            .map(|n| (n, false))
            .chain(HOME_DIRS.iter().map(|n| (n, true)))
        {
            self.protect(root.join(name), is_dir, home)?;
            if writable_root && !home {
                self.watch_missing(root, Path::new(name));
            }
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

    /// Watches `root/rel` (a per-user file of the mandatory deny set) if it is missing: as
    /// written, and, when a symlink on the way leads elsewhere into a writable root, where
    /// it leads (the command could create it through the link).
    fn watch_missing(&mut self, root: &Path, rel: &Path) {
        let path = root.join(rel);
        if std::fs::symlink_metadata(&path).is_ok() {
            return; // it exists: protected read-only by `protect`
        }
        self.out
            .watch
            .extend(Watch::new(root, rel, TamperKind::DenySet));
        let resolved = resolve_existing(&path);
        if resolved == path || std::fs::symlink_metadata(&resolved).is_ok() {
            return;
        }
        if let Some(w) = root_of(&resolved, self.writable)
            && let Ok(rest) = resolved.strip_prefix(w)
        {
            self.out
                .watch
                .extend(Watch::new(w, rest, TamperKind::DenySet));
        }
    }
}

/// `p` with its deepest existing ancestor canonicalised (symlinks resolved) and the
/// missing rest appended.
fn resolve_existing(p: &Path) -> PathBuf {
    let mut existing = p;
    let mut rest = Vec::new();
    while std::fs::symlink_metadata(existing).is_err() {
        let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
            return p.to_owned();
        };
        rest.push(name);
        existing = parent;
    }
    match std::fs::canonicalize(existing) {
        Ok(mut c) => {
            c.extend(rest.iter().rev());
            c
        }
        Err(_) => p.to_owned(),
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

#[cfg(test)]
#[path = "protect_tests.rs"]
mod tests;
