//! The protection that acts after the run: paths of the mandatory deny set that did not
//! exist at start and that the sandbox could create without a placeholder covering them
//! (a `.git/commondir`, and the shell startup files and per-user configs in a writable
//! root that is not the caller's home) are *watched*; whatever exists there once the
//! sandbox is gone was made by the command, and is renamed aside
//! (`<name>.shim-quarantine-<pid>`) before anything on the host can run it.
//!
//! It never follows a link the command could have made: the walk from the watched path's
//! root goes one name at a time without following symlinks, and a link found on the way
//! that was not there at start is itself what gets renamed aside. It never deletes
//! anything, and never touches a link the host had at start.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};

use crate::report::{TamperKind, Tampering};

/// A path watched for creation during the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Watch {
    /// The canonical directory the walk starts from: a writable root or a git directory,
    /// both mount points inside the sandbox, so the command could not move them.
    root: PathBuf,
    /// The names below `root`, in order (`["commondir"]`, `[".config", "git", "config"]`).
    names: Vec<OsString>,
    /// For each name but the last: the target text of the symlink that stood there at
    /// start, or `None` (a real directory, or nothing).
    links: Vec<Option<PathBuf>>,
    /// What a path created there would do, for the report.
    kind: TamperKind,
}

impl Watch {
    /// The watched path.
    pub(crate) fn path(&self) -> PathBuf {
        let mut p = self.root.clone();
        p.extend(&self.names);
        p
    }

    /// Watches `root/rel`, which does not exist now. `None` when it cannot come into
    /// existence (a name on the way is neither a directory, nor a link, nor missing) or
    /// `rel` is not a plain relative path.
    pub(crate) fn new(root: &Path, rel: &Path, kind: TamperKind) -> Option<Self> {
        let mut names = Vec::new();
        for c in rel.components() {
            match c {
                std::path::Component::Normal(n) => names.push(n.to_owned()),
                _ => return None,
            }
        }
        let (_, dirs) = names.split_last()?;
        let mut links = Vec::with_capacity(dirs.len());
        let mut at = root.to_owned();
        let mut missing = false;
        for d in dirs {
            at.push(d);
            if missing {
                links.push(None);
                continue;
            }
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    links.push(Some(std::fs::read_link(&at).ok()?));
                }
                Ok(m) if m.is_dir() => links.push(None),
                Ok(_) => return None,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    missing = true;
                    links.push(None);
                }
                Err(_) => return None,
            }
        }
        Some(Self {
            root: root.to_owned(),
            names,
            links,
            kind,
        })
    }

    /// Renames aside what now stands at the watched path, or the link made on the way to
    /// it. `None` when there is nothing new.
    fn quarantine(&self) -> Option<Tampering> {
        let mut dir = open_dir(None, self.root.as_os_str())?;
        let mut path = self.root.clone();
        let (last, dirs) = self.names.split_last()?;
        for (name, at_start) in dirs.iter().zip(&self.links) {
            path.push(name);
            let st = nix::sys::stat::fstatat(
                dir.as_fd(),
                name.as_os_str(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .ok()?;
            match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
                SFlag::S_IFDIR => dir = open_dir(Some(&dir), name)?,
                SFlag::S_IFLNK => {
                    let now = nix::fcntl::readlinkat(dir.as_fd(), name.as_os_str()).ok()?;
                    if at_start.as_deref() == Some(Path::new(&now)) {
                        return None; // the host's own link: what lies beyond is not ours
                    }
                    return rename_aside(&dir, name, path, self.kind);
                }
                _ => return None, // nothing can be created below a file
            }
        }
        path.push(last);
        nix::sys::stat::fstatat(dir.as_fd(), last.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()?;
        rename_aside(&dir, last, path, self.kind)
    }
}

/// `name` in `dir` (or the absolute path `name`), opened as a directory without following
/// a symlink.
fn open_dir(dir: Option<&OwnedFd>, name: &std::ffi::OsStr) -> Option<OwnedFd> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match dir {
        Some(d) => nix::fcntl::openat(d.as_fd(), name, flags, Mode::empty()).ok(),
        None => nix::fcntl::open(name, flags, Mode::empty()).ok(),
    }
}

/// Renames `name` in `dir` (which is `path`'s directory) to
/// `<name>.shim-quarantine-<pid>`.
fn rename_aside(
    dir: &OwnedFd,
    name: &OsString,
    path: PathBuf,
    kind: TamperKind,
) -> Option<Tampering> {
    let mut to = name.clone();
    to.push(format!(".shim-quarantine-{}", std::process::id()));
    match nix::fcntl::renameat(dir.as_fd(), name.as_os_str(), dir.as_fd(), to.as_os_str()) {
        Ok(()) => Some(Tampering {
            quarantined_as: path.with_file_name(&to),
            path,
            kind,
        }),
        Err(_) => None,
    }
}

/// Renames aside every watched path that now exists (it did not at start). Returns what
/// was moved. Safe to call more than once (a moved path no longer exists).
pub(crate) fn quarantine(watch: &[Watch]) -> Vec<Tampering> {
    watch.iter().filter_map(Watch::quarantine).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TempDir;

    #[test]
    fn a_new_path_is_moved_aside_once() {
        let t = TempDir::new("fs-quarantine");
        let watch: Vec<Watch> = ["commondir", "absent"]
            .iter()
            .map(|n| Watch::new(&t.0, Path::new(n), TamperKind::GitCommondir).unwrap())
            .collect();
        assert!(quarantine(&watch).is_empty());
        std::fs::write(t.0.join("commondir"), "/elsewhere\n").unwrap();
        let moved = quarantine(&watch);
        assert_eq!(moved.len(), 1);
        assert_eq!(moved[0].path, t.0.join("commondir"));
        assert!(!t.0.join("commondir").exists() && moved[0].quarantined_as.exists());
        assert!(quarantine(&watch).is_empty());
    }

    #[test]
    fn a_new_file_below_new_directories_is_moved_and_the_directories_stay() {
        let t = TempDir::new("fs-quarantine-deep");
        let rel = Path::new(".config/git/config");
        let watch = [Watch::new(&t.0, rel, TamperKind::DenySet).unwrap()];
        std::fs::create_dir_all(t.0.join(".config/git")).unwrap();
        std::fs::write(t.0.join(rel), "[core]\n").unwrap();
        let moved = quarantine(&watch);
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_eq!(moved[0].path, t.0.join(rel));
        assert!(!t.0.join(rel).exists() && t.0.join(".config/git").is_dir());
    }

    #[test]
    fn a_link_made_on_the_way_is_moved_and_its_target_untouched() {
        let t = TempDir::new("fs-quarantine-link");
        let elsewhere = t.tree("elsewhere", &[("git/config", "host's own\n")]);
        let root = t.tree("root", &[]);
        let watch =
            [Watch::new(&root, Path::new(".config/git/config"), TamperKind::DenySet).unwrap()];
        std::os::unix::fs::symlink(&elsewhere, root.join(".config")).unwrap();
        let moved = quarantine(&watch);
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_eq!(moved[0].path, root.join(".config"));
        assert!(std::fs::symlink_metadata(root.join(".config")).is_err());
        assert!(
            elsewhere.join("git/config").exists(),
            "the link's target is not touched"
        );
    }

    #[test]
    fn a_link_the_host_had_at_start_is_left_alone() {
        let t = TempDir::new("fs-quarantine-hostlink");
        let elsewhere = t.tree("elsewhere", &[]);
        let root = t.tree("root", &[]);
        std::os::unix::fs::symlink(&elsewhere, root.join(".config")).unwrap();
        let watch =
            [Watch::new(&root, Path::new(".config/git/config"), TamperKind::DenySet).unwrap()];
        std::fs::create_dir_all(elsewhere.join("git")).unwrap();
        std::fs::write(elsewhere.join("git/config"), "x").unwrap();
        assert!(quarantine(&watch).is_empty());
        assert!(root.join(".config").exists() && elsewhere.join("git/config").exists());
        // Re-pointed during the run: the new link is moved aside.
        std::fs::remove_file(root.join(".config")).unwrap();
        std::os::unix::fs::symlink(t.0.join("other"), root.join(".config")).unwrap();
        assert_eq!(quarantine(&watch)[0].path, root.join(".config"));
    }

    #[test]
    fn nothing_is_watched_below_a_file() {
        let t = TempDir::new("fs-quarantine-file");
        std::fs::write(t.0.join(".config"), "").unwrap();
        assert!(Watch::new(&t.0, Path::new(".config/git/config"), TamperKind::DenySet).is_none());
    }
}
