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
mod outcome;
mod peer;
mod seccomp;
#[allow(unsafe_code)] // every system-call wrapper of the shim; each block has a SAFETY comment
mod sys;

use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

pub(crate) use fs::Placeholder;
use init::{InnerPlan, forwarded_and_chld, inner_main, kept_fds};

use crate::ca::TrustFiles;
use crate::cli::Degradation;
use crate::error::{Error, Result};
use crate::report::warn_tampering;
use crate::sandbox::{Backend, CaptureState, EXIT_SHIM_FAILURE, Handoff, Job, Outcome};

/// The Linux backend (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Linux;

impl Backend for Linux {
    /// Placeholders created for missing protected paths, and the job's CA files, are
    /// removed before returning, and by a janitor process if the shim itself is killed.
    /// Errors that happen inside the sandbox after `clone` are printed there and yield
    /// [`EXIT_SHIM_FAILURE`] (or
    /// [`EXIT_CANNOT_EXECUTE`](crate::sandbox::EXIT_CANNOT_EXECUTE),
    /// [`EXIT_NOT_FOUND`](crate::sandbox::EXIT_NOT_FOUND) for `execve`).
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
        if let Some(t) = job.trust {
            identity.open_to_command(t.dir())?;
        }
        let mut plan = fs::FsPlan::default();
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .and_then(|h| std::fs::canonicalize(h).ok());
        let read_only: Vec<PathBuf> = job.trust.iter().map(|t| t.dir().to_owned()).collect();
        let cwd = std::env::current_dir().map_err(|e| Error::io("current directory", e))?;
        let planned = fs::plan(
            job.allow_write,
            job.deny_read,
            job.allow_read,
            &read_only,
            (home.as_deref(), identity.is_mapped()),
            &mut plan,
        )
        .map(|()| {
            if let Some(size) = job.tmp {
                let keep = visible_paths(&cwd, job.command, job.allow_read);
                fs::tmp::plan(size.as_str(), &keep, &mut plan);
            }
        });
        let placeholders = plan.placeholders.clone();
        let watch = plan.watch.clone();
        // `quarantined`: a run that ended has moved aside (and reported) what the
        // sandbox made at the watched paths (`run_planned`); otherwise it is done here.
        let cleanup = |quarantined: bool| {
            if !quarantined {
                warn_tampering(&fs::quarantine(&watch));
            }
            placeholders.iter().rev().for_each(Placeholder::remove);
            job.trust.iter().for_each(|t| t.remove());
        };
        let janitor = match &planned {
            Ok(()) if !placeholders.is_empty() || !watch.is_empty() || job.trust.is_some() => {
                match janitor::spawn_janitor(&placeholders, &watch, job.trust) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        cleanup(false);
                        return Err(e);
                    }
                }
            }
            _ => None,
        };
        let ca = job.trust.map(TrustFiles::files);
        let result =
            planned.and_then(|()| run_planned(job, (plan, identity), (cwd, home), ca, serve));
        cleanup(result.is_ok());
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
    (cwd, home): (PathBuf, Option<PathBuf>),
    ca: Option<crate::env::CaFiles>,
    serve: impl FnOnce(Handoff) -> Result<()>,
) -> Result<Outcome> {
    let watch = fs_plan.watch.clone();
    let filters = seccomp::build(job.allow_unix_sockets)?;
    let (notify_outer, notify_inner) = notify::channel(job, &fs_plan)?;
    let (program, args) = command_cstrings(job.command)?;
    if identity.is_mapped() {
        ids::check_working_directory(&cwd, &fs_plan)?;
    }
    let (env, scratch) = inherited_env(job, &fs_plan, home.as_deref(), ca.as_ref());
    let exec_hint = match job.command.first() {
        Some(p) if identity.is_mapped() => ids::closed_program_hint(p, &env, &cwd, &fs_plan),
        _ => None,
    };
    let (outer, inner) = handoff::socket_pair("the listener hand-off")?;

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
        env,
        ca,
        scratch,
        capture: job.capture,
        handoff: inner,
        notify: notify_inner,
        handover: job.handover.clone(),
        exec_hint,
    });
    let init = clone_init(&mut inner_plan)?;
    // Root's command: init waits for its maps and the idmapped writable roots.
    let mapped = match inner_plan.as_ref() {
        Some(p) if identity.is_mapped() => {
            ids::map_from_outside(init, identity, &p.fs, outer.as_fd())
        }
        _ => Ok(()),
    };
    drop(inner_plan);
    if let Err(e) = mapped.and_then(|()| notify::start_supervisor(notify_outer, job)) {
        kill_init(init);
        return Err(e);
    }

    // The listener, bound inside the sandbox's network namespace, arrives first (with
    // what the TUN device is made through when capture is on). If init fails before
    // handing it over, it prints why, and its status says how it ended.
    let mut payload = [0u8; 1024];
    let received = sys::recv_fds(outer.as_fd(), &mut payload);
    if let Ok(Some((fds, n))) = received
        && let Err(e) = start_serving((fds, &payload[..n]), job, outer.as_fd(), serve)
    {
        // The command may already run: stop the whole sandbox.
        kill_init(init);
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

/// What follows init's hand-off (`fds` and `payload`): the TUN device made (while init
/// builds the mount view), init told over `to_init` that the command may start, then what
/// the sandbox was handed served. A device that `--capture` requires and that cannot be
/// made stops init before the command (said here); either way the run then ends with
/// init's status, as when init fails itself.
fn start_serving(
    (fds, payload): (Vec<OwnedFd>, &[u8]),
    job: &Job<'_>,
    to_init: BorrowedFd<'_>,
    serve: impl FnOnce(Handoff) -> Result<()>,
) -> Result<()> {
    let inbound = handoff::handoff_of(fds, payload)?;
    let capture = match handoff::make_device(inbound.capture, job.capture.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            // As when init cannot open the device: said once, the command never starts,
            // and the run ends with init's status (and its report).
            eprintln!("shim: {e}");
            let _ = sys::send_fds(to_init, &[], &[handoff::STOP]);
            return Ok(());
        }
    };
    let go = match capture {
        CaptureState::Up(_) => handoff::GO_CAPTURING,
        CaptureState::Off | CaptureState::Unavailable(_) => handoff::GO_WITHOUT_CAPTURE,
    };
    if sys::send_fds(to_init, &[], &[go]).is_err() {
        // Init is gone before the command started (it said why): its status ends the run.
        return Ok(());
    }
    serve(Handoff {
        listener: inbound.listener,
        capture,
    })
}

/// Starts init in new user, mount, PID, IPC and network namespaces; it takes `plan` (and
/// closes every other descriptor) and runs [`inner_main`].
fn clone_init(plan: &mut Option<InnerPlan>) -> Result<Pid> {
    let keep_fds = kept_fds(plan.as_ref());
    let flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWNET;
    let init = sys::clone_into_namespaces(
        flags,
        Box::new(|| {
            // Only the first call matters: the callback runs once, in the child.
            let code = match plan.take() {
                Some(p) => {
                    let _ = sys::close_fds_except(&keep_fds);
                    inner_main(p)
                }
                None => EXIT_SHIM_FAILURE,
            };
            sys::exit_now(code)
        }),
    );
    match init {
        Ok(pid) => Ok(pid),
        Err(e @ (Errno::EPERM | Errno::ENOSPC | Errno::EINVAL | Errno::EUSERS)) => {
            Err(Error::MissingFeature {
                feature: "user namespaces (with mount, PID, IPC and network namespaces)",
                detail: format!("clone failed: {e}"),
                hint: "allow unprivileged user namespaces (kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0, no AppArmor userns restriction) or run as root",
            })
        }
        Err(e) => Err(Error::sys("clone into new namespaces", e)),
    }
}

/// Stops the whole sandbox: kills init (and with it every process of its namespace) and
/// reaps it.
fn kill_init(init: Pid) {
    let _ = nix::sys::signal::kill(init, Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(init, None);
}

/// The environment the command inherits (a credential's variable holds its placeholder,
/// whatever the caller's value was, and no credential's `secret_env` is inherited), and
/// the temporary directory's and caches' variables for it.
fn inherited_env(
    job: &Job<'_>,
    fs_plan: &fs::FsPlan,
    home: Option<&Path>,
    ca: Option<&crate::env::CaFiles>,
) -> (Vec<(OsString, OsString)>, crate::caches::Scratch) {
    let env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            !job.child_env.iter().any(|(n, _)| k == n.as_str())
                && !job.hidden_env.iter().any(|n| k == n.as_str())
        })
        .chain(
            job.child_env
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        )
        .collect();
    let tmp = fs_plan.tmp.as_ref().and_then(|t| t.dirs.first());
    let places = crate::caches::Places {
        tmp: tmp.map(PathBuf::as_path),
        cache: job.cache,
        home,
    };
    let scratch = crate::caches::plan(&env, places, |p| writable(fs_plan, p), ca);
    (env, scratch)
}

/// The paths the command needs to see even where the private temporary directory
/// hides the host's: the working directory, the directory of the program when it is
/// named by its path (`/tmp/build/tool`, `./tool`), and the `--allow-read` paths.
fn visible_paths(cwd: &Path, command: &[OsString], allow_read: &[PathBuf]) -> Vec<PathBuf> {
    let program = command
        .first()
        .map(Path::new)
        .filter(|p| p.as_os_str().as_bytes().contains(&b'/'))
        .and_then(|p| cwd.join(p).parent().map(Path::to_owned));
    std::iter::once(cwd.to_owned())
        .chain(program)
        .chain(allow_read.iter().map(|p| cwd.join(p)))
        .collect()
}

/// Whether `path` (absolute) is beneath a writable root of `plan` (not the private
/// temporary directory, which starts empty): a caller's cache variable naming it is kept.
fn writable(plan: &fs::FsPlan, path: &Path) -> bool {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| crate::violations::normalise(path));
    path.is_absolute() && plan.writable_roots.iter().any(|r| path.starts_with(r))
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
