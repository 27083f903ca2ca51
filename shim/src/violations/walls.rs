//! The walls: what the backend built each path of the sandbox's view as, and which of
//! them refuses an attempted operation (the `rule` of a record) with its hint.

use std::path::{Component, Path, PathBuf};

use serde::Serialize;

/// A filesystem operation (the `op` of a record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FsOp {
    /// An open for writing (or truncating) of an existing file.
    OpenWrite,
    /// A new file (an open with `O_CREAT`, `creat`, `mknod`).
    Create,
    /// A removal (`unlink`, `rmdir`).
    Unlink,
    /// A rename (either end).
    Rename,
    /// A new directory.
    Mkdir,
    /// A hard link (either end).
    Link,
    /// A new symbolic link.
    Symlink,
    /// A mode change.
    Chmod,
    /// A truncation by path.
    Truncate,
    /// A read of a `--deny-read` path.
    Read,
}

impl FsOp {
    /// Every write operation.
    pub(crate) const WRITES: [Self; 9] = [
        Self::OpenWrite,
        Self::Create,
        Self::Unlink,
        Self::Rename,
        Self::Mkdir,
        Self::Link,
        Self::Symlink,
        Self::Chmod,
        Self::Truncate,
    ];

    /// The record's string.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::OpenWrite => "open_write",
            Self::Create => "create",
            Self::Unlink => "unlink",
            Self::Rename => "rename",
            Self::Mkdir => "mkdir",
            Self::Link => "link",
            Self::Symlink => "symlink",
            Self::Chmod => "chmod",
            Self::Truncate => "truncate",
            Self::Read => "read",
        }
    }

    /// Whether the operation follows a symbolic link in its last component.
    pub(crate) fn follows(self) -> bool {
        matches!(
            self,
            Self::OpenWrite | Self::Chmod | Self::Truncate | Self::Read
        )
    }
}

/// Which wall refused it (the `rule` of a record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FsRule {
    /// Not beneath any writable root.
    OutsideWriteRoots,
    /// In the mandatory deny set (files that make tools run code), even in a write root.
    MandatoryDeny,
    /// Beneath a `--deny-read` path.
    DenyRead,
}

impl FsRule {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::OutsideWriteRoots => "outside_write_roots",
            Self::MandatoryDeny => "mandatory_deny",
            Self::DenyRead => "deny_read",
        }
    }
}

/// What a path of the sandbox's view is, as the backend built it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wall {
    /// A writable root (and the sandbox's private `/dev`).
    Writable,
    /// Shown read-only (a path re-opened for reading, the CA files).
    ReadOnly,
    /// Masked (`--deny-read`, the authority sockets' directory, `--control`, the run's own
    /// decision log, violations file and report file).
    Masked,
    /// Read-only: the mandatory deny set.
    Protected,
    /// Writable inside, but the path itself cannot be removed or renamed (`.git`).
    Pinned,
    /// In the mandatory deny set but missing at start, with no placeholder (a shell
    /// startup file in a root that is not the home directory): what the command puts
    /// there is moved aside when the run ends.
    Watched,
}

/// The walls, by canonical host path.
#[derive(Debug, Clone, Default)]
pub(crate) struct Walls {
    entries: Vec<(PathBuf, Wall)>,
    roots: Vec<PathBuf>,
}

impl Walls {
    /// Walls from `(path, wall)` entries (canonical paths).
    pub(crate) fn new(entries: Vec<(PathBuf, Wall)>) -> Self {
        let roots = entries
            .iter()
            .filter(|(p, w)| *w == Wall::Writable && p != Path::new("/dev"))
            .map(|(p, _)| p.clone())
            .collect();
        Self { entries, roots }
    }

    /// The rule that refuses `op` on `path` (absolute, lexically normalised), if any,
    /// with the path's links resolved by `seen` as the kernel resolves them for the
    /// command.
    pub(crate) fn judge(&self, op: FsOp, path: &Path, seen: &dyn Seen) -> Option<FsRule> {
        // The path as named first (no system call: this runs for every write of the
        // command); a refusal is confirmed with its links resolved as the kernel resolves
        // them, so a link into a write root is not blamed. A link inside a write root that
        // leads out of it is refused by the kernel without a record (docs/shim.md).
        self.judge_named(op, path)?;
        self.judge_named(op, &seen.resolved(op, path))
    }

    /// The rule that refuses `op` on `path` as named (no link resolved, no system call).
    pub(super) fn judge_named(&self, op: FsOp, path: &Path) -> Option<FsRule> {
        if is_descriptor_link(path) {
            return None;
        }
        // Every entry that holds `path` is a prefix of it: the longest is the deepest.
        let deepest = self
            .entries
            .iter()
            .filter(|(p, _)| beneath(path, p))
            .max_by_key(|(p, _)| p.as_os_str().len());
        match deepest {
            Some((p, Wall::Pinned)) => (p == path && matches!(op, FsOp::Unlink | FsOp::Rename))
                .then_some(FsRule::MandatoryDeny),
            Some((_, Wall::Writable)) => None,
            Some((_, Wall::Protected | Wall::Watched)) => Some(FsRule::MandatoryDeny),
            Some((_, Wall::Masked)) => Some(FsRule::DenyRead),
            Some((_, Wall::ReadOnly)) | None => Some(FsRule::OutsideWriteRoots),
        }
    }

    /// What to do about a refusal, in words an agent can follow.
    pub(crate) fn hint(&self, rule: FsRule, path: &Path) -> String {
        match rule {
            FsRule::OutsideWriteRoots => {
                let ask = path
                    .parent()
                    .filter(|p| *p != Path::new("/"))
                    .unwrap_or(path)
                    .display();
                if self.roots.is_empty() {
                    format!(
                        "{} is outside the write roots (this sandbox has none); ask for --allow-write {ask}",
                        path.display()
                    )
                } else {
                    let roots: Vec<String> =
                        self.roots.iter().map(|r| r.display().to_string()).collect();
                    format!(
                        "{} is outside the write roots; write under {} or ask for --allow-write {ask}",
                        path.display(),
                        roots.join(", ")
                    )
                }
            }
            FsRule::MandatoryDeny if self.watched(path) => format!(
                "{} is in the mandatory deny set (files that make shells and tools run code): what is written there is moved aside when the run ends; leave it alone",
                path.display()
            ),
            FsRule::MandatoryDeny => format!(
                "{} is in the mandatory deny set (files that make shells and tools run code) and is read-only in every sandbox; leave it as it is",
                path.display()
            ),
            FsRule::DenyRead => format!(
                "{} is hidden from this sandbox (a --deny-read path, or one the shim keeps from the command: the mediator's sockets, the run's own logs and report): it can be neither read nor written",
                path.display()
            ),
        }
    }
}

impl Walls {
    /// Whether `path` is at or beneath a watched path.
    pub(super) fn watched(&self, path: &Path) -> bool {
        self.entries
            .iter()
            .any(|(p, w)| *w == Wall::Watched && beneath(path, p))
    }
}

/// Whether `path` is `dir` or beneath it, both absolute and normalised (no `.`, `..`,
/// repeated or trailing `/`). Compares bytes: this runs for every wall and every
/// write-intent call of the command, and `Path::starts_with` splits both into components.
pub(super) fn beneath(path: &Path, dir: &Path) -> bool {
    let (path, dir) = (
        path.as_os_str().as_encoded_bytes(),
        dir.as_os_str().as_encoded_bytes(),
    );
    path.starts_with(dir)
        && (path.len() == dir.len() || dir.ends_with(b"/") || path.get(dir.len()) == Some(&b'/'))
}

/// `/proc/<pid>/fd/<n>` (and `self`, `thread-self`): a descriptor the task holds, not a
/// place in the tree.
fn is_descriptor_link(path: &Path) -> bool {
    let mut c = path.components().filter_map(|c| match c {
        Component::Normal(s) => Some(s),
        _ => None,
    });
    c.next().is_some_and(|s| s == "proc") && c.nth(1).is_some_and(|s| s == "fd")
}

/// What the backend can tell about an attempt the walls refuse as named, looked at in
/// the command's own view of the tree.
pub(crate) trait Seen {
    /// `path` with its symbolic links resolved as `op` resolves them: the directory it is
    /// in always, the last component only for an operation that follows it. A path that
    /// does not exist (yet) keeps its missing components.
    fn resolved(&self, op: FsOp, path: &Path) -> PathBuf;
    /// Whether the attempt on `paths` fails for a reason of its own (`EEXIST`, `ENOENT`,
    /// `ENOTDIR`, ...) or writes nothing, whatever the walls are: then it is no violation.
    fn not_the_walls(&self, paths: &[PathBuf]) -> bool;
    /// Whether `path` exists (its last component not followed).
    fn exists(&self, path: &Path) -> bool;
    /// The executable of the task that tried it.
    fn exe(&self) -> String;
}

/// The host's view, for a backend that cannot look at the command's: links resolved on
/// the host, every refused attempt taken as the walls'.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostView {
    /// The executable to report.
    pub(crate) exe: String,
}

impl Seen for HostView {
    fn resolved(&self, op: FsOp, path: &Path) -> PathBuf {
        host_resolved(op, path)
    }

    fn not_the_walls(&self, _: &[PathBuf]) -> bool {
        false
    }

    fn exists(&self, path: &Path) -> bool {
        std::fs::symlink_metadata(path).is_ok()
    }

    fn exe(&self) -> String {
        self.exe.clone()
    }
}

/// `path` with its symbolic links resolved on the host, as [`Seen::resolved`] says.
fn host_resolved(op: FsOp, path: &Path) -> PathBuf {
    if op.follows()
        && let Ok(c) = std::fs::canonicalize(path)
    {
        return c;
    }
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or_else(|_| path.to_owned()),
        _ => path.to_owned(),
    }
}

/// `path` with `.` and `..` taken out lexically (`..` at `/` stays at `/`).
pub(crate) fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}
