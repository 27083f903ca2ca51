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
mod janitor;
mod landlock;
mod notify;
mod outcome;
mod peer;
mod seccomp;
#[allow(unsafe_code)] // every system-call wrapper of the shim; each block has a SAFETY comment
mod sys;

use std::ffi::{CString, OsString};
use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

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
use crate::sandbox::{
    Backend, CaptureJob, EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SHIM_FAILURE, Handoff, Job,
    Outcome,
};

/// Signals the shim and the inner init forward to the command.
#[rustfmt::skip]
const FORWARDED: &[Signal] = &[
    Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGUSR1,
    Signal::SIGUSR2, Signal::SIGWINCH,
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
    /// The temporary directory's and caches' variables, and what to make for them.
    scratch: crate::caches::Scratch,
    capture: Option<CaptureJob>,
    handoff: OwnedFd,
    /// `--violations`/`--report`: the notification filter and the socket its listener
    /// goes back to the outer shim on.
    notify: Option<notify::NotifyHalf>,
    /// `--pass-fd` and `--listen-fd`: kept open into the command.
    handover: crate::handover::Handover,
    /// Said when the program cannot be executed: root's command cannot reach it
    /// ([`ids::closed_program_hint`]).
    exec_hint: Option<String>,
}

/// The Linux backend (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Linux;

impl Backend for Linux {
    /// Placeholders created for missing protected paths, and the job's CA files, are
    /// removed before returning, and by a janitor process if the shim itself is killed.
    /// Errors that happen inside the sandbox after `clone` are printed there and yield
    /// [`EXIT_SHIM_FAILURE`] (or [`EXIT_CANNOT_EXECUTE`], [`EXIT_NOT_FOUND`] for `execve`).
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
        let result =
            planned.and_then(|()| run_planned(job, (plan, identity), (cwd, home), ca, serve));
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
        env,
        ca,
        scratch,
        capture: job.capture,
        handoff: inner,
        notify: notify_inner,
        handover: job.handover.clone(),
        exec_hint,
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
                    inner_main(p)
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
    if let Err(e) = mapped.and_then(|()| notify::start_supervisor(notify_outer, job)) {
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

// ---------------------------------------------------------------------------------------
// Inside: PID 1 of the new namespaces.

fn inner_main(plan: InnerPlan) -> i32 {
    match inner_setup_and_run(plan) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("shim: {e}");
            EXIT_SHIM_FAILURE
        }
    }
}

fn inner_setup_and_run(mut plan: InnerPlan) -> Result<i32> {
    // If the shim dies, so does init, and with it every process in the PID namespace.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| Error::sys("PR_SET_PDEATHSIG", e))?;
    nix::unistd::setsid().map_err(|e| Error::sys("setsid", e))?;

    let copies = ids::settle_inside(plan.identity, plan.handoff.as_fd(), &plan.fs)?;

    // Loopback up, the proxy listener bound on it and handed to the outer shim.
    let probe = nix::sys::socket::socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| Error::sys("socket for loopback setup", e))?;
    sys::loopback_up(probe.as_fd()).map_err(|e| Error::sys("bring up lo", e))?;
    drop(probe);
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| Error::io("bind 127.0.0.1:0 in the sandbox", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("listener address", e))?
        .port();
    // Capture: the TUN device, while /dev/net/tun is still visible and init still holds
    // CAP_NET_ADMIN in this namespace. Asked for explicitly, a failure stops the run;
    // by default the outer shim says once that opaque clients have no network.
    let tun = match &plan.capture {
        None => Ok(None),
        Some(c) => match capture::create(&c.addrs) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) if c.required => return Err(e),
            Err(Error::Capture(why)) => Err(why),
            Err(e) => Err(e.to_string()),
        },
    };
    let payload = handoff::handoff_payload(port, &tun);
    let mut fds = vec![listener.as_fd()];
    if let Ok(Some(t)) = &tun {
        fds.push(t.as_fd());
    }
    sys::send_fds(plan.handoff.as_fd(), &fds, &payload)
        .map_err(|e| Error::sys("hand the listener to the shim", e))?;
    drop(fds);
    drop(listener);
    drop(plan.handoff);

    fs::apply(&plan.fs, copies)?;
    if let (Ok(Some(_)), Some(c)) = (&tun, &plan.capture) {
        // The stub resolver, read-only like the rest of the tree.
        fs::cover_file(Path::new("/etc/resolv.conf"), &c.addrs.resolv_conf())?;
    }
    drop(tun);
    plan.scratch.prepare();

    let env = crate::env::command_env(plan.env, port, plan.ca.as_ref(), &plan.scratch.vars);
    let env = env_cstrings(env);

    // Init's memory (the caller's whole environment among it) is never the command's to
    // read: not dumpable before the command exists (its execve makes it dumpable again).
    nix::sys::prctl::set_dumpable(false).map_err(|e| Error::sys("PR_SET_DUMPABLE", e))?;

    // The command. Landlock lets it write beneath the writable roots and the private
    // temporary directory.
    let notify = plan.notify.take();
    let mut roots = plan.fs.writable_roots.clone();
    roots.extend(plan.fs.tmp.iter().flat_map(|t| t.dirs.iter().cloned()));
    let Some(child) = sys::fork_process().map_err(|e| Error::sys("fork the command", e))? else {
        let Err(e) = exec_command(
            &plan.cwd,
            (plan.landlock, &roots),
            &plan.filters,
            (notify.as_ref(), &plan.handover),
            (&plan.program, &plan.args, &env),
        );
        eprintln!("shim: {e}");
        if let (Error::Sys { op, .. }, Some(hint)) = (&e, &plan.exec_hint)
            && op.starts_with("execute")
        {
            eprintln!("shim: {hint}");
        }
        let code = match &e {
            Error::Sys {
                op,
                source: Errno::ENOENT,
            } if op.starts_with("execute") => EXIT_NOT_FOUND,
            Error::Sys { op, .. } if op.starts_with("execute") => EXIT_CANNOT_EXECUTE,
            _ => EXIT_SHIM_FAILURE,
        };
        sys::exit_now(code)
    };

    // Only the command sends the listener; init's copy would keep the shim waiting.
    drop(notify);
    // Init keeps no privilege it does not need to reap and forward signals.
    sys::drop_all_capabilities().map_err(|e| Error::sys("drop init's capabilities", e))?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| Error::sys("no_new_privs", e))?;

    let mask = forwarded_and_chld();
    loop {
        loop {
            match nix::sys::wait::waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == child => return Ok(code),
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => {
                    return Ok(128 + sig as i32);
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => return Err(Error::sys("waitpid", e)),
            }
        }
        match mask.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            Ok(sig) => {
                let _ = nix::sys::signal::kill(child, sig);
            }
        }
    }
}

/// `NAME=VALUE` strings for `execve` (a pair with a NUL byte is left out).
fn env_cstrings(env: Vec<(OsString, OsString)>) -> Vec<CString> {
    env.into_iter()
        .filter_map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).ok()
        })
        .collect()
}

/// In the command's process: the last layers, then `execve`. Returns only on failure.
/// `landlock` is whether to use it and the writable roots; `fds` the violation filter's
/// half and the descriptors handed over; `command` the program, its arguments and its
/// environment.
fn exec_command(
    cwd: &Path,
    (use_landlock, roots): (bool, &[PathBuf]),
    filters: &seccomp::Filters,
    (notify, handover): (Option<&notify::NotifyHalf>, &crate::handover::Handover),
    (program, args, env): (&CString, &[CString], &[CString]),
) -> Result<std::convert::Infallible> {
    SigSet::empty()
        .thread_set_mask()
        .map_err(|e| Error::sys("unblock signals", e))?;
    sys::reset_signal_dispositions();
    // Re-resolve the working directory through the new mounts (the inherited one still
    // points into the tree as it was before the writable copies were attached).
    nix::unistd::chdir(cwd).map_err(|e| {
        Error::sys(
            format!(
                "working directory {} is not visible in the sandbox",
                cwd.display()
            ),
            e,
        )
    })?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| Error::sys("no_new_privs", e))?;
    if use_landlock {
        landlock::restrict_writes(roots)?;
    }
    sys::drop_all_capabilities().map_err(|e| Error::sys("drop capabilities", e))?;
    if let Some((prog, to_shim)) = notify {
        notify::install(prog, to_shim.as_fd());
    }
    // After the listener went to the shim: the listening sockets may take its number.
    sys::place_handover(&handover.pass, &handover.listen)
        .map_err(|e| Error::sys("hand over --pass-fd/--listen-fd", e))?;
    let mut with_listen = Vec::new();
    let env = if handover.listen.is_empty() {
        env
    } else {
        // sd_listen_fds(3): LISTEN_PID is this process, which execve keeps.
        with_listen.extend_from_slice(env);
        for kv in [
            format!("LISTEN_FDS={}", handover.listen.len()),
            format!("LISTEN_PID={}", nix::unistd::getpid()),
        ] {
            with_listen
                .push(CString::new(kv).map_err(|_| Error::sys("LISTEN_FDS", Errno::EINVAL))?);
        }
        &with_listen
    };
    filters.install()?;
    let e = nix::unistd::execvpe(program, args, env)
        .err()
        .unwrap_or(Errno::EINVAL);
    Err(Error::sys(
        format!("execute {}", program.to_string_lossy()),
        e,
    ))
}
