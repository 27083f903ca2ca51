//! Finding the git repositories nested in a writable root (design section 12: their
//! code-running metadata is protected like the root's own).
//!
//! Every start reads every directory of every writable root, so this is the part of the
//! shim's start that grows with the root: each directory costs one `openat`, one `fstat`
//! and its `getdents64` calls into one reused 32 KiB buffer, and no entry costs a `stat`
//! where the file system gives its type. (A second thread sharing the directories did not
//! make it faster on two cores: the kernel's reading of the directories dominates.) It
//! never follows a symlink, never crosses into another file system, and does not search
//! `.git`, `node_modules` or the contents of a directory tagged with a `CACHEDIR.TAG`
//! (build output such as `target/`; <https://bford.info/cachedir/>).

use std::ffi::OsStr;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RawDir};

/// Directory names never searched for nested repositories (generated, huge, or a repo's
/// own internals).
const PRUNE: &[&[u8]] = &[b".git", b"node_modules"];

/// The name that marks a repository.
const GIT: &[u8] = b".git";

/// The name that tags a cache directory, whose contents are not searched.
const CACHEDIR_TAG: &[u8] = b"CACHEDIR.TAG";

/// The `getdents64` buffer, in bytes (glibc's `readdir` reads as much).
const BUFFER: usize = 32 * 1024;

/// Push onto `out` the directories strictly under `root` (canonical) that hold a `.git`
/// (a directory, or a file as in worktrees and submodules), sorted. Directories that
/// cannot be read are skipped, as the sandbox (same uid, fewer rights) cannot write
/// there either.
pub(super) fn find_repositories(root: &Path, out: &mut Vec<PathBuf>) {
    let Ok(meta) = std::fs::metadata(root) else {
        return;
    };
    let walk = Walk {
        root,
        dev: meta.dev(),
    };
    let mut buffer = vec![MaybeUninit::uninit(); BUFFER];
    let mut found = Vec::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        let listing = walk.read(&dir, &mut buffer);
        pending.extend(listing.subdirs);
        if listing.repository {
            found.push(dir);
        }
    }
    found.sort();
    out.extend(found);
}

/// One walk of a root.
struct Walk<'a> {
    /// The writable root.
    root: &'a Path,
    /// Its file system: the walk does not cross into another.
    dev: u64,
}

/// What reading one directory found.
#[derive(Default)]
struct Listing {
    /// Its subdirectories to search.
    subdirs: Vec<PathBuf>,
    /// Whether it holds a `.git`.
    repository: bool,
}

impl Walk<'_> {
    /// Read one directory (not following a symlink to it, not on another file system).
    fn read(&self, dir: &Path, buffer: &mut [MaybeUninit<u8>]) -> Listing {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let Ok(fd) = rustix::fs::open(dir, flags, Mode::empty()) else {
            return Listing::default();
        };
        if rustix::fs::fstat(&fd).map_or(true, |st| st.st_dev != self.dev) {
            return Listing::default();
        }
        let mut listing = Listing::default();
        let mut tagged = false;
        let mut entries = RawDir::new(&fd, buffer);
        while let Some(Ok(entry)) = entries.next() {
            let name = entry.file_name().to_bytes();
            if name == GIT {
                listing.repository = dir != self.root;
            }
            if name == CACHEDIR_TAG {
                tagged = true;
            }
            if name == b"." || name == b".." || PRUNE.contains(&name) {
                continue;
            }
            let is_dir = match entry.file_type() {
                FileType::Directory => true,
                // The file system does not say (`DT_UNKNOWN`): ask it, without following.
                FileType::Unknown => {
                    rustix::fs::statat(&fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
                }
                _ => false,
            };
            if is_dir {
                listing.subdirs.push(dir.join(OsStr::from_bytes(name)));
            }
        }
        // A cache directory: its own `.git` still counts, its contents are not searched.
        if tagged && dir != self.root {
            listing.subdirs.clear();
        }
        listing
    }
}

#[cfg(test)]
mod tests {
    // Unit tests of `repos`.

    use super::*;
    use crate::testing::TempDir;

    fn found(root: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        find_repositories(root, &mut out);
        out
    }

    #[test]
    fn nested_repositories_are_found_in_a_wide_tree_and_none_twice() {
        let t = TempDir::new("fs-repos-wide");
        let w = &t.0;
        std::fs::create_dir_all(w.join(".git")).unwrap(); // the root's own: not listed
        let mut expected = Vec::new();
        // Many directories, repositories at several depths, one with a
        // `.git` file (a worktree or submodule).
        for d in 0..40 {
            let dir = w.join(format!("d{d}/sub/deeper"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..5 {
                std::fs::write(dir.join(format!("f{f}")), "").unwrap();
            }
            if d % 7 == 0 {
                std::fs::create_dir_all(dir.join(".git/hooks")).unwrap();
                expected.push(dir);
            }
        }
        std::fs::create_dir_all(w.join("d3/sub")).unwrap();
        std::fs::write(w.join("d3/sub/.git"), "gitdir: ../../.git/worktrees/x\n").unwrap();
        expected.push(w.join("d3/sub"));
        // A repository inside a repository.
        std::fs::create_dir_all(w.join("d0/sub/deeper/vendor/lib/.git")).unwrap();
        expected.push(w.join("d0/sub/deeper/vendor/lib"));
        expected.sort();
        assert_eq!(found(w), expected);
    }

    #[test]
    fn links_git_internals_node_modules_and_cache_contents_are_not_searched() {
        let t = TempDir::new("fs-repos-pruned");
        let w = t.0.join("root");
        let elsewhere = t.0.join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("repo/.git")).unwrap();
        std::fs::create_dir_all(&w).unwrap();
        std::os::unix::fs::symlink(&elsewhere, w.join("link")).unwrap();
        std::fs::create_dir_all(w.join("node_modules/pkg/.git")).unwrap();
        std::fs::create_dir_all(w.join(".git/modules/m/.git")).unwrap();
        std::fs::create_dir_all(w.join("target/debug/build/x/.git")).unwrap();
        std::fs::write(
            w.join("target/CACHEDIR.TAG"),
            "Signature: 8a477f597d28d172789f06886806bc55\n",
        )
        .unwrap();
        // A tagged directory that is itself a repository still counts.
        std::fs::create_dir_all(w.join("cache/.git")).unwrap();
        std::fs::write(w.join("cache/CACHEDIR.TAG"), "").unwrap();
        std::fs::create_dir_all(w.join("cache/inner/.git")).unwrap();
        assert_eq!(found(&w), vec![w.join("cache")]);
    }

    #[test]
    fn a_root_that_is_missing_or_a_file_has_none() {
        let t = TempDir::new("fs-repos-none");
        assert!(found(&t.0.join("missing")).is_empty());
        std::fs::write(t.0.join("file"), "").unwrap();
        assert!(found(&t.0.join("file")).is_empty());
        assert!(found(&t.0).is_empty());
    }
}
