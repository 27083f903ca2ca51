//! The Linux backend ([`Linux`], the shim's only [`Backend`]): namespaces, filesystem
//! view, Landlock, seccomp, capabilities, and the two processes that make a run.
//!
//! ```text
//! shim (host namespaces)              relay threads: sandbox loopback listener -> Unix socket
//!                                     capture thread: smoltcp on the sandbox's TUN device
//!  `- init  (PID 1 of new user, mount, PID, IPC, network namespaces; makes the TUN device
//!      |     and its routes; no capabilities after setup; reaps, forwards signals; its
//!      |     death kills the namespace)
//!      `- COMMAND (new session, caps dropped, no_new_privs, Landlock, seccomp)
//! ```
//!
//! The outer shim never enters the sandbox; the sandbox never sees the Unix socket.

mod capture;
mod fs;
mod handoff;
mod ids;
mod init;
mod janitor;
mod landlock;
mod notify;
mod peer;
mod seccomp;
#[allow(unsafe_code)] // every system-call wrapper of the shim; each block has a SAFETY comment
mod sys;

use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::socket::{AddressFamily, SockFlag, SockType};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

pub(crate) use fs::Placeholder;

use crate::ca::TrustFiles;
use crate::cli::Degradation;
use crate::error::{Error, Result};
use crate::report::warn_tampering;
use crate::sandbox::{Backend, CaptureJob, EXIT_SHIM_FAILURE, Handoff, Job, Outcome};

/// Signals the shim and the inner init forward to the command.
const FORWARDED: &[Signal] = &[
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

fn forwarded_and_chld() -> SigSet {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(*s);
    }
    set.add(Signal::SIGCHLD);
    set
}

/// Everything the inner stage needs, prepared by the outer shim before `clone`.
struct InnerPlan {
    fs: fs::FsPlan,
    filters: seccomp::Filters,
    landlock: bool,
    /// Who the command is inside and on the host.
    identity: ids::Identity,
    cwd: PathBuf,
    program: CString,
    args: Vec<CString>,
    env: Vec<(OsString, OsString)>,
    ca: Option<crate::env::CaFiles>,
    capture: Option<CaptureJob>,
    handoff: OwnedFd,
    /// `--violations`/`--report`: the notification filter and the socket its listener
    /// goes back to the outer shim on.
    notify: Option<NotifyHalf>,
    /// `--pass-fd` and `--listen-fd`: kept open into the command.
    handover: crate::handover::Handover,
}

/// The Linux backend (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Linux;

impl Backend for Linux {
    /// Placeholders created for missing protected paths, and the job's CA files, are
    /// removed before returning, and by a janitor process if the shim itself is killed.
    /// Errors that happen inside the sandbox after `clone` are printed there and yield
    /// [`EXIT_SHIM_FAILURE`] (or [`crate::sandbox::EXIT_CANNOT_EXECUTE`],
    /// [`crate::sandbox::EXIT_NOT_FOUND`] for `execve`).
    fn probe_fd(&self, fd: std::os::fd::RawFd) -> Option<bool> {
        sys::probe_fd(fd)
    }

    fn command_uid(&self, allow_degraded: &[Degradation]) -> u32 {
        ids::Identity::of_caller(allow_degraded).outside().uid
    }

    fn program_of(&self) -> Option<crate::sandbox::ProgramOf> {
        Some(peer::program_of)
    }

    fn run(&self, job: &Job<'_>, serve: impl FnOnce(Handoff) -> Result<()>) -> Result<Outcome> {
        if job.capture.is_some() {
            sys::large_allocations_by_mmap();
        }
        let identity = ids::Identity::of_caller(job.allow_degraded);
        if identity.is_mapped()
            && let Some(t) = job.trust
        {
            // A stranger's command must be able to enter it (its files are mode 0444).
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(t.dir(), std::fs::Permissions::from_mode(0o711))
                .map_err(|e| Error::io(format!("open {} to the command", t.dir().display()), e))?;
        }
        let mut plan = fs::FsPlan::default();
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .and_then(|h| std::fs::canonicalize(h).ok());
        let read_only: Vec<PathBuf> = job.trust.iter().map(|t| t.dir().to_owned()).collect();
        let planned = fs::plan(
            job.allow_write,
            job.deny_read,
            job.allow_read,
            &read_only,
            (home.as_deref(), identity.is_mapped()),
            &mut plan,
        );
        let placeholders = plan.placeholders.clone();
        let watch = plan.watch.clone();
        let cleanup = || {
            warn_tampering(&fs::quarantine(&watch));
            placeholders.iter().rev().for_each(Placeholder::remove);
            job.trust.iter().for_each(|t| t.remove());
        };
        let janitor = match &planned {
            Ok(()) if !placeholders.is_empty() || !watch.is_empty() || job.trust.is_some() => {
                match janitor::spawn_janitor(&placeholders, &watch, job.trust) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        cleanup();
                        return Err(e);
                    }
                }
            }
            _ => None,
        };
        let ca = job.trust.map(TrustFiles::files);
        let result = planned.and_then(|()| run_planned(job, (plan, identity), ca, serve));
        cleanup();
        if let Some(w) = janitor {
            // Tell the janitor the placeholders are handled: a later run may already have
            // created new ones at the same paths (and inode numbers get reused).
            let _ = nix::unistd::write(&w, b"d");
        }
        result
    }
}

fn run_planned(
    job: &Job<'_>,
    (fs_plan, identity): (fs::FsPlan, ids::Identity),
    ca: Option<crate::env::CaFiles>,
    serve: impl FnOnce(Handoff) -> Result<()>,
) -> Result<Outcome> {
    let watch = fs_plan.watch.clone();
    let filters = seccomp::build(job.allow_unix_sockets)?;
    let (notify_outer, notify_inner) = violation_channel(job, &fs_plan)?;
    let (program, args) = command_cstrings(job.command)?;
    let cwd = std::env::current_dir().map_err(|e| Error::io("current directory", e))?;
    if identity.is_mapped() {
        ids::check_working_directory(&cwd, &fs_plan.writable_roots)?;
    }
    let (outer, inner) = nix::sys::socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| Error::sys("socketpair for the listener hand-off", e))?;

    // Signals are blocked from here on, in this process and (inherited) in init; both
    // take them with sigwait. Blocking before clone leaves no window in which a signal
    // would kill the shim with its setup half done.
    let mask = forwarded_and_chld();
    mask.thread_block()
        .map_err(|e| Error::sys("block signals", e))?;

    let mut inner_plan = Some(InnerPlan {
        fs: fs_plan,
        filters,
        landlock: !job.degraded(Degradation::Landlock),
        identity,
        cwd,
        program,
        args,
        env: inherited_env(job),
        ca,
        capture: job.capture,
        handoff: inner,
        notify: notify_inner,
        handover: job.handover.clone(),
    });
    let keep_fds = kept_fds(inner_plan.as_ref());
    let flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWNET;
    let init = sys::clone_into_namespaces(
        flags,
        Box::new(|| {
            // Only the first call matters: the callback runs once, in the child.
            let code = match inner_plan.take() {
                Some(p) => {
                    let _ = sys::close_fds_except(&keep_fds);
                    init::inner_main(p)
                }
                None => EXIT_SHIM_FAILURE,
            };
            sys::exit_now(code)
        }),
    );
    let init = match init {
        Ok(pid) => pid,
        Err(e @ (Errno::EPERM | Errno::ENOSPC | Errno::EINVAL | Errno::EUSERS)) => {
            return Err(Error::MissingFeature {
                feature: "user namespaces (with mount, PID, IPC and network namespaces)",
                detail: format!("clone failed: {e}"),
                hint: "allow unprivileged user namespaces (kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0, no AppArmor userns restriction) or run as root",
            });
        }
        Err(e) => return Err(Error::sys("clone into new namespaces", e)),
    };
    // Root's command: init waits for its maps and the idmapped writable roots.
    let mapped = match inner_plan.as_ref() {
        Some(p) if identity.is_mapped() => {
            ids::map_from_outside(init, identity, &p.fs, outer.as_fd())
        }
        _ => Ok(()),
    };
    drop(inner_plan);
    if let Err(e) = mapped.and_then(|()| start_supervisor(notify_outer, job)) {
        let _ = nix::sys::signal::kill(init, Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(init, None);
        return Err(e);
    }

    // The listener, bound inside the sandbox's network namespace, arrives first (with the
    // TUN device when capture is on). If init fails before handing it over, it prints
    // why, and its status says how it ended.
    let mut payload = [0u8; 1024];
    let received = sys::recv_fds(outer.as_fd(), &mut payload);
    if let Ok(Some((fds, n))) = received
        && let Err(e) = handoff::handoff_of(fds, &payload[..n]).and_then(serve)
    {
        // The command may already run: stop the whole sandbox.
        let _ = nix::sys::signal::kill(init, Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(init, None);
        return Err(e);
    }

    let exit_status = supervise(init, &mask);
    // Held until now: init takes a hang-up on it for the shim's death (ids.rs).
    drop(outer);
    // The sandbox is gone: nothing can create the watched paths any more.
    let tampering = fs::quarantine(&watch);
    warn_tampering(&tampering);
    Ok(Outcome {
        exit_status,
        tampering,
        runs_as: identity.outside(),
    })
}

/// The caller's environment as the command inherits it: a credential's variable holds
/// its placeholder, whatever the caller's value was, and no credential's `secret_env` is
/// inherited.
fn inherited_env(job: &Job<'_>) -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter(|(k, _)| {
            !job.child_env.iter().any(|(n, _)| k == n.as_str())
                && !job.hidden_env.iter().any(|n| k == n.as_str())
        })
        .chain(
            job.child_env
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        )
        .collect()
}

/// The command's half of the violation channel: the notification filter it installs,
/// and the socket its listener goes back to the outer shim on.
type NotifyHalf = (Vec<libc::sock_filter>, OwnedFd);

/// Filesystem violations (`--violations`, `--report`): hands the walls as planned to the
/// reporter, and makes the channel the command's notification listener comes back on
/// (the outer end, and the filter with the inner end). `(None, None)` when not asked.
fn violation_channel(
    job: &Job<'_>,
    fs_plan: &fs::FsPlan,
) -> Result<(Option<OwnedFd>, Option<NotifyHalf>)> {
    let Some(v) = &job.violations else {
        return Ok((None, None));
    };
    v.observe_with(walls_of(fs_plan));
    v.unobservable(
        &[crate::violations::FsOp::Read],
        "reads of --deny-read paths are not observed: masked paths read as empty files and directories (watching every open would slow every read)",
    );
    let (outer, inner) = nix::sys::socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| Error::sys("socketpair for the violation listener", e))?;
    Ok((Some(outer), Some((notify::program()?, inner))))
}

/// The descriptors init keeps: the handoff socket, the violation filter's, and those
/// handed over to the command. Every other one is closed in init (and so in the command).
fn kept_fds(plan: Option<&InnerPlan>) -> Vec<i32> {
    plan.iter()
        .flat_map(|p| {
            std::iter::once(p.handoff.as_raw_fd())
                .chain(p.notify.as_ref().map(|(_, fd)| fd.as_raw_fd()))
                .chain(p.handover.kept())
        })
        .collect()
}

/// Starts the thread that serves the command's violation notifications, when asked.
fn start_supervisor(outer: Option<OwnedFd>, job: &Job<'_>) -> Result<()> {
    let (Some(outer), Some(v)) = (outer, &job.violations) else {
        return Ok(());
    };
    let v = std::sync::Arc::clone(v);
    std::thread::Builder::new()
        .name("violations".into())
        .spawn(move || notify::supervise(outer, v))
        .map(drop)
        .map_err(|e| Error::io("start the violations thread", e))
}

/// The walls the plan builds, for judging violations: the writable roots (and `/dev`),
/// the masks, the re-opened reads and the mandatory deny set, by canonical path.
fn walls_of(plan: &fs::FsPlan) -> crate::violations::Walls {
    use crate::violations::Wall;
    let mut entries: Vec<(PathBuf, Wall)> = plan
        .ops
        .iter()
        .map(|op| {
            let wall = match op.kind {
                fs::OpKind::Writable => Wall::Writable,
                fs::OpKind::Readable => Wall::ReadOnly,
                fs::OpKind::Mask => Wall::Masked,
                fs::OpKind::Pin => Wall::Pinned,
                fs::OpKind::Protect => Wall::Protected,
            };
            (op.path.clone(), wall)
        })
        .collect();
    entries.extend(plan.watch.iter().map(|w| (w.path(), Wall::Watched)));
    entries.push((PathBuf::from("/dev"), Wall::Writable));
    crate::violations::Walls::new(entries)
}

fn command_cstrings(command: &[OsString]) -> Result<(CString, Vec<CString>)> {
    let to_c = |s: &OsString| {
        CString::new(s.as_bytes())
            .map_err(|_| Error::Usage("the command contains a NUL byte".into()))
    };
    let args = command.iter().map(to_c).collect::<Result<Vec<_>>>()?;
    let program = args
        .first()
        .cloned()
        .ok_or_else(|| Error::Usage("no command".into()))?;
    Ok((program, args))
}

/// Forward signals to init until it exits; return its status the shell way.
fn supervise(init: Pid, mask: &SigSet) -> i32 {
    loop {
        match nix::sys::wait::waitpid(init, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => return EXIT_SHIM_FAILURE,
        }
        match mask.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            Ok(sig) => {
                let _ = nix::sys::signal::kill(init, sig);
            }
        }
    }
}
