//! Who the command is on the host (design section 12; the command never runs as the
//! host uid that owns the mediator's files).
//!
//! - An unprivileged caller ([`Identity::Same`]): the sandbox maps the caller's uid and
//!   gid to themselves, as a user namespace lets any user do (init writes its own maps).
//! - Root ([`Identity::Mapped`]): the command is uid and gid 0 inside, and
//!   [`COMMAND_UID`]/[`COMMAND_GID`] outside, ids that own no file on the host, with no
//!   supplementary group: root's files (a `0600` secret, the CA's key) are out of its
//!   reach, and its capabilities are gone as before. The outer shim writes init's maps
//!   (mapping another uid needs `CAP_SETUID` in the parent namespace) and makes the
//!   writable roots' copies idmapped through the sandbox's user namespace, so that they
//!   stay writable and what the command makes there is root's on disk (and so the
//!   `--allow-read` paths the command could not read as they are, read-only); init
//!   receives the copies and takes the mapped ids before it builds the rest of the view.
//!
//! `--allow-degraded same-uid` keeps root's command as uid 0 (the way before). Where the
//! kernel, a writable root's filesystem or the shim's own privilege (root of a user
//! namespace that does not map [`COMMAND_UID`]) cannot do it, the run is refused with
//! [`Error::MissingFeature`] naming that flag.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Pid, Uid};

use super::fs::{self, FsPlan, OpKind};
use super::sys;
use crate::cli::Degradation;
use crate::error::{Error, Result};
use crate::report::RunsAs;

/// The host uid root's command runs as. From the range systemd's list of uid ranges
/// leaves unused (`0x70000000` to `0x7FFDFFFF`): no distribution's system or regular
/// users, systemd's dynamic users, its container ranges, the shadow tools' default
/// sub-id ranges (`/etc/subuid` from 100000) nor SSSD's default id mapping (up to
/// 2000200000) hand it out; below 2^31 for tools that read a uid as signed. Every run
/// shares it: it owns nothing on disk (what the command makes in a writable root is
/// root's through the idmapped mount, and everywhere else is read-only or dies with the
/// sandbox), and runs see each other's processes in no namespace.
pub(crate) const COMMAND_UID: u32 = 2_100_000_000;

/// The host gid root's command runs as (see [`COMMAND_UID`]).
pub(crate) const COMMAND_GID: u32 = 2_100_000_000;

/// Who the command is, inside and on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Identity {
    /// The caller's own uid and gid, inside and on the host.
    Same {
        /// The caller's uid.
        uid: u32,
        /// The caller's gid.
        gid: u32,
    },
    /// The caller's uid and gid inside (root's: 0), [`COMMAND_UID`] and [`COMMAND_GID`]
    /// on the host; the writable roots are idmapped.
    Mapped {
        /// The caller's uid (the command's inside).
        uid: u32,
        /// The caller's gid (the command's inside).
        gid: u32,
    },
}

impl Identity {
    /// The command's identity for this caller: mapped when the shim runs as root, unless
    /// the user gave that up (`--allow-degraded same-uid`).
    pub(crate) fn of_caller(allow_degraded: &[Degradation]) -> Self {
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        if uid == 0 && !allow_degraded.contains(&Degradation::SameUid) {
            Self::Mapped { uid, gid }
        } else {
            Self::Same { uid, gid }
        }
    }

    /// Whether the command is a stranger on the host (not the caller).
    pub(crate) fn is_mapped(self) -> bool {
        matches!(self, Self::Mapped { .. })
    }

    /// The uid and gid on the host.
    pub(crate) fn outside(self) -> RunsAs {
        match self {
            Self::Same { uid, gid } => RunsAs { uid, gid },
            Self::Mapped { .. } => RunsAs {
                uid: COMMAND_UID,
                gid: COMMAND_GID,
            },
        }
    }

    /// Lets a stranger's command enter `dir`, a directory the shim made for it (the CA
    /// files, mode 0444): mode 0711 when the identity is mapped.
    ///
    /// # Errors
    /// [`Error::Io`] when its mode cannot be changed.
    pub(crate) fn open_to_command(self, dir: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if !self.is_mapped() {
            return Ok(());
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| Error::io(format!("open {} to the command", dir.display()), e))
    }

    /// The uid and gid inside (the caller's).
    fn inside(self) -> (u32, u32) {
        match self {
            Self::Same { uid, gid } | Self::Mapped { uid, gid } => (uid, gid),
        }
    }

    /// The `uid_map` and `gid_map` lines: one id each, inside to outside.
    fn maps(self) -> (String, String) {
        let (inside_uid, inside_gid) = self.inside();
        let out = self.outside();
        (
            format!("{inside_uid} {} 1\n", out.uid),
            format!("{inside_gid} {} 1\n", out.gid),
        )
    }
}

/// Root's command (a stranger on the host) must be able to enter the working directory
/// `cwd`: it is inside a writable root or an `--allow-read` path of `plan` (idmapped,
/// and the way there is kept open, see [`fs::plan`]), or it and every directory above it
/// let others in (`x`).
///
/// # Errors
/// [`Error::Usage`] naming the first directory that does not, and what to do.
pub(crate) fn check_working_directory(cwd: &Path, plan: &FsPlan) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut reachable = plan.writable_roots.iter().chain(&plan.read_grants);
    if reachable.any(|r| cwd.starts_with(r)) {
        return Ok(());
    }
    let mut on_the_way: Vec<&Path> = cwd.ancestors().collect();
    on_the_way.reverse();
    for dir in on_the_way {
        let mode = std::fs::metadata(dir).map_or(0o777, |m| m.permissions().mode());
        if mode & 0o001 == 0 {
            return Err(Error::Usage(format!(
                "the working directory {} is closed to the command: root's command runs as uid {COMMAND_UID} on the host, and {} (mode {:o}) lets no other user in; start the shim in a directory others may enter, make it a writable root (--allow-write) or readable (--allow-read), or pass --allow-degraded same-uid",
                cwd.display(),
                dir.display(),
                mode & 0o7777
            )));
        }
    }
    Ok(())
}

/// The line said when root's command cannot run its program because the program lies
/// beneath a directory others may not enter (rustup's `cargo` in `/root/.cargo/bin`,
/// pyenv's shims, nvm's `node`; `/root` is mode 0700): the `--allow-read` that shows it
/// ([`fs::plan`]), naming the directory just beneath the closed one, and for rustup's
/// proxies (a `rustup` beside the program) rustup's home too. `program` is found as
/// `execvp` finds it, from `cwd`: by its path, or on the `PATH` of `env`, where the first
/// candidate beneath a closed directory counts. `None` when there is none, or the way is
/// open already (a writable root, an `--allow-read` of `plan`).
pub(crate) fn closed_program_hint(
    program: &OsStr,
    env: &[(OsString, OsString)],
    cwd: &Path,
    plan: &FsPlan,
) -> Option<String> {
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_os_str())
            .filter(|v| !v.is_empty())
    };
    let candidates: Vec<PathBuf> = if program.as_bytes().contains(&b'/') {
        vec![cwd.join(program)]
    } else {
        // glibc's search path when PATH is unset.
        let path = var("PATH").unwrap_or_else(|| OsStr::new("/bin:/usr/bin"));
        std::env::split_paths(path)
            .map(|d| cwd.join(d).join(program))
            .collect()
    };
    let (found, closed, top) = candidates
        .iter()
        .filter_map(|c| std::fs::canonicalize(c).ok())
        .find_map(|c| beneath_closed(&c, plan).map(|(closed, top)| (c, closed, top)))?;
    let mut reads = vec![top];
    if found.parent().is_some_and(|d| d.join("rustup").is_file()) {
        let home = var("RUSTUP_HOME")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| Path::new(h).join(".rustup")));
        if let Some((_, top)) = home
            .and_then(|h| std::fs::canonicalize(h).ok())
            .and_then(|h| beneath_closed(&h, plan))
            && !reads.contains(&top)
        {
            reads.push(top);
        }
    }
    let flags: Vec<String> = reads
        .iter()
        .map(|r| format!("--allow-read {}", r.display()))
        .collect();
    Some(format!(
        "hint: {} is beneath {}, which root's command (uid {COMMAND_UID} on the host) may not enter: add {}",
        program.to_string_lossy(),
        closed.display(),
        flags.join(" ")
    ))
}

/// The first directory on the way to `path` (canonical) that others may not enter, and
/// the path just beneath it on the way; `None` when there is none before a writable root
/// or read grant of `plan` (idmapped: the way through is open).
fn beneath_closed(path: &Path, plan: &FsPlan) -> Option<(PathBuf, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let mut on_the_way: Vec<&Path> = path.ancestors().skip(1).collect();
    on_the_way.reverse();
    for (i, dir) in on_the_way.iter().enumerate() {
        let mut open = plan.writable_roots.iter().chain(&plan.read_grants);
        if open.any(|r| dir.starts_with(r)) {
            return None;
        }
        if std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 == 0) {
            let top = on_the_way.get(i + 1).copied().unwrap_or(path);
            return Some((dir.to_path_buf(), top.to_path_buf()));
        }
    }
    None
}

fn write_file(path: &str, content: &str) -> Result<()> {
    std::fs::write(path, content).map_err(|e| Error::io(format!("write {path}"), e))
}

/// In init, first: the caller's own ids ([`map_self`]), or (root) the maps the outer
/// shim writes, the idmapped copies it hands over ([`receive_copies`], returned for
/// [`fs::apply`]) and then the mapped ids ([`become_mapped`]). `outer` is the hand-off
/// socket.
///
/// # Errors
/// Those of the three.
pub(crate) fn settle_inside(
    id: Identity,
    outer: BorrowedFd<'_>,
    plan: &FsPlan,
) -> Result<Option<Vec<Option<OwnedFd>>>> {
    if id.is_mapped() {
        let copies = receive_copies(outer, plan)?;
        become_mapped(id, outer)?;
        Ok(Some(copies))
    } else {
        map_self(id)?;
        Ok(None)
    }
}

/// In init ([`Identity::Same`]): maps its own uid and gid to themselves, with
/// `setgroups` denied (what an unprivileged process may do).
///
/// # Errors
/// [`Error::Io`] naming the file that could not be written.
fn map_self(id: Identity) -> Result<()> {
    let (uid_map, gid_map) = id.maps();
    write_file("/proc/self/setgroups", "deny")?;
    write_file("/proc/self/uid_map", &uid_map)?;
    write_file("/proc/self/gid_map", &gid_map)
}

/// In the outer shim ([`Identity::Mapped`]), while init waits: writes init's maps, makes
/// the plan's detached copies with the writable roots idmapped through init's user
/// namespace, and sends them to init over `to_init` (see [`receive_copies`]).
///
/// # Errors
/// [`Error::MissingFeature`] when the maps cannot be written or a writable root cannot be
/// idmapped (the hint names `--allow-degraded same-uid`); the errors of
/// [`fs::detached_copies`]; [`Error::Sys`] when the copies cannot be sent.
pub(crate) fn map_from_outside(
    init: Pid,
    id: Identity,
    plan: &FsPlan,
    to_init: BorrowedFd<'_>,
) -> Result<()> {
    let (uid_map, gid_map) = id.maps();
    for (file, map) in [("uid_map", &uid_map), ("gid_map", &gid_map)] {
        let path = format!("/proc/{init}/{file}");
        std::fs::write(&path, map).map_err(|e| Error::MissingFeature {
            feature: "an unprivileged uid for root's command (uid 2100000000 outside the sandbox: root of the initial user namespace, or of one that maps it)",
            detail: format!("write {path}: {e}"),
            hint: "run the shim as root of the initial user namespace, or pass --allow-degraded same-uid to run the command as root without capabilities (it can then read every file root owns that is not masked)",
        })?;
    }
    let userns = std::fs::File::open(format!("/proc/{init}/ns/user"))
        .map_err(|e| Error::io("open the sandbox's user namespace", e))?;
    let copies = fs::detached_copies(plan, Some(userns.as_fd()))?;
    drop(userns);
    let fds: Vec<BorrowedFd<'_>> = copies.iter().flatten().map(AsFd::as_fd).collect();
    let total = u32::try_from(fds.len()).map_err(|_| Error::Usage("too many mounts".into()))?;
    let mut chunks: Vec<&[BorrowedFd<'_>]> = fds.chunks(sys::FDS_PER_MESSAGE).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    for chunk in chunks {
        sys::send_fds(to_init, chunk, &total.to_be_bytes())
            .map_err(|e| Error::sys("hand the writable roots to the sandbox", e))?;
    }
    Ok(())
}

/// In init ([`Identity::Mapped`]): receives what [`map_from_outside`] sent, placed as
/// [`fs::apply`] takes them (one entry per operation of `plan`).
///
/// # Errors
/// [`Error::Sys`] when the outer shim is gone or the messages do not match the plan.
fn receive_copies(from_outer: BorrowedFd<'_>, plan: &FsPlan) -> Result<Vec<Option<OwnedFd>>> {
    let bad = |e| Error::sys("receive the writable roots from the shim", e);
    let mut received = Vec::new();
    let mut total = None;
    while total.is_none_or(|t| received.len() < t) {
        let mut payload = [0u8; 4];
        let (fds, n) = sys::recv_fds(from_outer, &mut payload)
            .map_err(bad)?
            .ok_or_else(|| bad(nix::errno::Errno::EPIPE))?;
        if n != payload.len() {
            return Err(bad(nix::errno::Errno::EPROTO));
        }
        total = Some(u32::from_be_bytes(payload) as usize);
        received.extend(fds);
    }
    let mut received = received.into_iter();
    let copies: Vec<Option<OwnedFd>> = plan
        .ops
        .iter()
        .map(|op| match op.kind {
            OpKind::Writable | OpKind::Readable => received.next(),
            _ => None,
        })
        .collect();
    let wanted = plan
        .ops
        .iter()
        .filter(|op| matches!(op.kind, OpKind::Writable | OpKind::Readable))
        .count();
    if copies.iter().flatten().count() != wanted || received.next().is_some() {
        return Err(bad(nix::errno::Errno::EPROTO));
    }
    Ok(copies)
}

/// In init ([`Identity::Mapped`]), once the outer shim wrote the maps: drops the
/// supplementary groups it inherited from root, and takes the mapped ids (the caller's
/// inside, [`COMMAND_UID`] and [`COMMAND_GID`] outside); its capabilities in the
/// sandbox's namespaces stay (it becomes the namespace's root). The change of ids clears
/// the parent-death signal, so it is set again, and `outer` (the hand-off socket, which
/// the outer shim holds until the run ends) tells whether the shim died meanwhile.
///
/// # Errors
/// [`Error::Sys`] naming the call that failed, or when the shim is gone.
fn become_mapped(id: Identity, outer: BorrowedFd<'_>) -> Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    let (uid, gid) = id.inside();
    nix::unistd::setgroups(&[]).map_err(|e| Error::sys("drop supplementary groups", e))?;
    let gid = Gid::from_raw(gid);
    nix::unistd::setresgid(gid, gid, gid).map_err(|e| Error::sys("take the mapped gid", e))?;
    let uid = Uid::from_raw(uid);
    nix::unistd::setresuid(uid, uid, uid).map_err(|e| Error::sys("take the mapped uid", e))?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| Error::sys("PR_SET_PDEATHSIG", e))?;
    let mut fds = [PollFd::new(outer, PollFlags::empty())];
    let hung_up = nix::poll::poll(&mut fds, PollTimeout::ZERO)
        .map_err(|e| Error::sys("poll the hand-off socket", e))?
        > 0
        && fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR));
    if hung_up {
        return Err(Error::sys("the shim is gone", nix::errno::Errno::EPIPE));
    }
    Ok(())
}
