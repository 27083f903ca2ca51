//! The filesystem plan: from the settings' paths (canonicalised in the host's view) and
//! the mandatory deny set ([`super::protect`]), the list of mount operations the inner
//! init carries out ([`super::apply`](mod@super::apply)), shallowest first.
//!
//! It runs in the outer shim and never mounts anything; the only host-visible effect is
//! the placeholders that [`super::protect`] creates. Ordering ([`order`]) is pure.

use std::path::{Component, Path, PathBuf};

use super::protect::{self, Guard, Placeholder, Protected, Protections};
use super::quarantine::Watch;
use crate::error::{Error, Result};

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

impl From<Protected> for MountOp {
    fn from(p: Protected) -> Self {
        Self {
            path: p.path,
            kind: match p.guard {
                Guard::Pin => OpKind::Pin,
                Guard::ReadOnly => OpKind::Protect,
            },
            is_dir: p.is_dir,
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
    /// Protected paths that did not exist at start and got no placeholder: one appearing
    /// during the run is tampering and is renamed aside at exit
    /// ([`super::quarantine::quarantine`]).
    pub(crate) watch: Vec<Watch>,
    /// The private temporary directory ([`super::tmp`]), if the run has one.
    pub(crate) tmp: Option<PrivateTmp>,
    /// Canonical `--allow-read` paths shown to a command that is a stranger on the host
    /// (root's, see `stranger` in [`plan()`]) as read-only copies idmapped like the
    /// writable roots: it reads them as the caller would.
    pub(crate) read_grants: Vec<PathBuf>,
}

/// The private temporary directory, as planned ([`super::tmp`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PrivateTmp {
    /// The tmpfs `size=` bound (`50%`, `2g`).
    pub(crate) size: String,
    /// Where it is shown (canonical host paths of existing directories).
    pub(crate) dirs: Vec<PathBuf>,
}

impl PrivateTmp {
    /// Whether `path` (canonical) is at or beneath one of its directories.
    pub(crate) fn holds(&self, path: &Path) -> bool {
        self.dirs.iter().any(|d| path.starts_with(d))
    }
}

/// How many names `p` has below `/`.
pub(super) fn depth(p: &Path) -> usize {
    p.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count()
}

/// The `kind` op at `p` canonicalised (a directory's if it is one); `None` when `p` does
/// not exist and `missing_ok`. `what` names the setting in errors.
fn canonical(
    what: &'static str,
    p: &Path,
    missing_ok: bool,
    kind: OpKind,
) -> Result<Option<MountOp>> {
    match std::fs::canonicalize(p) {
        Ok(path) => {
            let is_dir = std::fs::metadata(&path)
                .map_err(|source| Error::Path {
                    what,
                    path: p.to_owned(),
                    source,
                })?
                .is_dir();
            Ok(Some(MountOp { path, kind, is_dir }))
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
/// directories above them. `stranger`: the command is not the caller on the host (root's
/// command runs as an unprivileged uid), so a directory on the way to an operation's path
/// that others may not enter is masked, the mask holding the way through
/// ([`mask_unsearchable_ancestors`]), and an `--allow-read` path outside the writable
/// roots that others may not read as it is ([`closed_to_others`]: `/root/.cargo` beneath
/// `/root`, mode 0700) is a read-only copy idmapped like them ([`FsPlan::read_grants`]):
/// the command reads it as the caller would. What others may read stays as it is (an
/// `--allow-read /etc` does not show `/etc/shadow`).
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
    (home, stranger): (Option<&Path>, bool),
    plan: &mut FsPlan,
) -> Result<()> {
    let mut ops = Vec::new();
    for p in allow_write {
        let Some(op) = canonical("--allow-write", p, false, OpKind::Writable)? else {
            continue;
        };
        if op.path == Path::new("/") {
            return Err(Error::Usage("--allow-write / would make the whole filesystem writable; name the directories instead".into()));
        }
        if !plan.writable_roots.contains(&op.path) {
            plan.writable_roots.push(op.path.clone());
            ops.push(op);
        }
    }
    for p in deny_read {
        if let Some(op) = canonical("--deny-read", p, true, OpKind::Mask)? {
            if op.path == Path::new("/") {
                return Err(Error::Usage(
                    "--deny-read / would hide the whole filesystem, including the command".into(),
                ));
            }
            ops.push(op);
        }
    }
    for p in allow_read {
        if let Some(op) = canonical("--allow-read", p, true, OpKind::Readable)? {
            let c = &op.path;
            // Re-opening only matters beneath a mask; elsewhere everything is readable to
            // the caller, and to a stranger what others may read; what they may not is
            // shown through the idmapped copy (a writable root is idmapped already).
            let masked = ops
                .iter()
                .any(|o| o.kind == OpKind::Mask && c.starts_with(&o.path));
            let granted = stranger
                && !plan.writable_roots.iter().any(|r| c.starts_with(r))
                && closed_to_others(c, op.is_dir);
            if granted && !plan.read_grants.contains(c) {
                plan.read_grants.push(c.clone());
            }
            if masked || granted {
                ops.push(op);
            }
        }
    }
    for p in read_only {
        ops.extend(canonical("shim-prepared path", p, false, OpKind::Readable)?);
    }
    let mut protections = Protections::default();
    let protected = protect::protect_roots(&plan.writable_roots, home, &mut protections);
    // The placeholders are the caller's to remove, even when protection failed half-way.
    plan.placeholders.append(&mut protections.placeholders);
    plan.watch.append(&mut protections.watch);
    protected?;
    ops.extend(protections.paths.into_iter().map(MountOp::from));
    if stranger {
        let reachable: Vec<PathBuf> = plan
            .writable_roots
            .iter()
            .chain(&plan.read_grants)
            .cloned()
            .collect();
        mask_unsearchable_ancestors(&mut ops, &reachable);
    }
    plan.ops = order(ops);
    Ok(())
}

/// Whether a user that owns no file and is in no group (root's command on the host) may
/// not read `path` (canonical) as it is: a directory on the way lets others not in (no
/// `x`), or `path` itself does not let them read it (`r`, and `x` for a directory). What
/// cannot be looked at counts as closed.
fn closed_to_others(path: &Path, is_dir: bool) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode());
    let needs = if is_dir { 0o005 } else { 0o004 };
    path.ancestors().skip(1).any(|d| mode(d) & 0o001 == 0) || mode(path) & needs != needs
}

/// Masks each directory that the command, on the host a stranger to every file (its uid
/// and gid own none, it has no other group), may not enter (no `x` bit for others) and
/// that lies on the way to the path of an operation, outside `roots` (the writable roots
/// and the read grants, idmapped: the command enters them as the caller would) and the
/// masks: the mask (searchable, not listable) holds the mount points on the way, and
/// hides nothing the command could have reached. Without it, root's command could not
/// reach a writable root under `/root` (mode 0700), and init, which builds the view
/// under the command's uid, could not reach a `--deny-read` path there to mask it.
fn mask_unsearchable_ancestors(ops: &mut Vec<MountOp>, roots: &[PathBuf]) {
    use std::os::unix::fs::PermissionsExt;
    let targets: Vec<PathBuf> = ops.iter().map(|o| o.path.clone()).collect();
    for target in targets {
        let mut on_the_way: Vec<&Path> = target.ancestors().skip(1).collect();
        on_the_way.reverse();
        for dir in on_the_way {
            if dir == Path::new("/") || roots.iter().any(|r| dir.starts_with(r)) {
                continue;
            }
            let masked = ops
                .iter()
                .any(|o| o.kind == OpKind::Mask && dir.starts_with(&o.path));
            if masked {
                break;
            }
            let closed = std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 == 0);
            if closed {
                ops.push(MountOp {
                    path: dir.to_owned(),
                    kind: OpKind::Mask,
                    is_dir: true,
                });
                break;
            }
        }
    }
}

/// The order in which `ops` must be applied: shallowest first; at equal depth, kinds in
/// [`OpKind`] order (so a mask covers a writable root at the same path, and protection is
/// applied last); the same path and kind only once (the first listed wins).
pub(super) fn order(mut ops: Vec<MountOp>) -> Vec<MountOp> {
    ops.sort_by(|a, b| {
        depth(&a.path)
            .cmp(&depth(&b.path))
            .then(a.kind.cmp(&b.kind))
            .then(a.path.cmp(&b.path))
    });
    ops.dedup_by(|a, b| a.path == b.path && a.kind == b.kind);
    ops
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
