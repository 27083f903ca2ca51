//! Inside: PID 1 of the new namespaces (init). It settles who the command is, brings
//! up loopback and hands the proxy listener (and the TUN device) to the outer shim,
//! applies the filesystem view, starts the command with the last layers (Landlock,
//! seccomp, no capabilities) and then only reaps and forwards signals.

use std::ffi::{CString, OsString};
use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::socket::{AddressFamily, SockFlag, SockType};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::{capture, fs, handoff, ids, landlock, notify, seccomp, sys};
use crate::error::{Error, Result};
use crate::sandbox::{CaptureJob, EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SHIM_FAILURE};

/// Signals the shim and the inner init forward to the command.
pub(super) const FORWARDED: &[Signal] = &[
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

pub(super) fn forwarded_and_chld() -> SigSet {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(*s);
    }
    set.add(Signal::SIGCHLD);
    set
}

/// Everything the inner stage needs, prepared by the outer shim before `clone`.
pub(super) struct InnerPlan {
    pub(super) fs: fs::FsPlan,
    pub(super) filters: seccomp::Filters,
    pub(super) landlock: bool,
    /// Who the command is inside and on the host.
    pub(super) identity: ids::Identity,
    pub(super) cwd: PathBuf,
    pub(super) program: CString,
    pub(super) args: Vec<CString>,
    pub(super) env: Vec<(OsString, OsString)>,
    pub(super) ca: Option<crate::env::CaFiles>,
    /// The temporary directory's and caches' variables, and what to make for them.
    pub(super) scratch: crate::caches::Scratch,
    pub(super) capture: Option<CaptureJob>,
    pub(super) handoff: OwnedFd,
    /// `--violations`/`--report`: the notification filter and the socket its listener
    /// goes back to the outer shim on.
    pub(super) notify: Option<notify::NotifyHalf>,
    /// `--pass-fd` and `--listen-fd`: kept open into the command.
    pub(super) handover: crate::handover::Handover,
    /// Said when the program cannot be executed: root's command cannot reach it
    /// ([`ids::closed_program_hint`]).
    pub(super) exec_hint: Option<String>,
}

/// The descriptors init keeps: the handoff socket, the violation filter's, and those
/// handed over to the command. Every other one is closed in init (and so in the command).
pub(super) fn kept_fds(plan: Option<&InnerPlan>) -> Vec<i32> {
    plan.iter()
        .flat_map(|p| {
            std::iter::once(p.handoff.as_raw_fd())
                .chain(p.notify.as_ref().map(|(_, fd)| fd.as_raw_fd()))
                .chain(p.handover.kept())
        })
        .collect()
}

pub(super) fn inner_main(plan: InnerPlan) -> i32 {
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

    let port = hand_over(&plan)?;

    fs::apply(&plan.fs, copies)?;
    // The outer shim makes the TUN device meanwhile; the command starts once it is done.
    let Some(capturing) = await_go(plan.handoff.as_fd())? else {
        return Ok(EXIT_SHIM_FAILURE);
    };
    drop(plan.handoff);
    if let (true, Some(c)) = (capturing, &plan.capture) {
        // The stub resolver, read-only like the rest of the tree.
        fs::cover_file(Path::new("/etc/resolv.conf"), &c.addrs.resolv_conf())?;
    }
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
        sys::exit_now(exec_failed(&e, plan.exec_hint.as_deref()))
    };

    // Only the command sends the listener; init's copy would keep the shim waiting.
    drop(notify);
    // Init keeps no privilege it does not need to reap and forward signals.
    sys::drop_all_capabilities().map_err(|e| Error::sys("drop init's capabilities", e))?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| Error::sys("no_new_privs", e))?;

    reap(child)
}

/// The outer shim's word that the command may start (see [`handoff::GO_CAPTURING`]):
/// whether capture is up; `None` when it must not start ([`handoff::STOP`]).
///
/// # Errors
/// [`Error::Sys`] when the shim ended (or said something else) before it.
fn await_go(handoff: BorrowedFd<'_>) -> Result<Option<bool>> {
    let mut word = [0u8; 1];
    match sys::recv_fds(handoff, &mut word) {
        Ok(Some((_, 1))) if word[0] == handoff::GO_CAPTURING => Ok(Some(true)),
        Ok(Some((_, 1))) if word[0] == handoff::GO_WITHOUT_CAPTURE => Ok(Some(false)),
        Ok(Some((_, 1))) if word[0] == handoff::STOP => Ok(None),
        Ok(_) => Err(Error::sys("wait for the shim", Errno::EPIPE)),
        Err(e) => Err(Error::sys("wait for the shim", e)),
    }
}

/// Loopback up, the proxy listener bound on it and handed to the outer shim over `plan`'s
/// handoff socket, with what the TUN device is made through when capture is on (the
/// outer shim makes it): the listener's port.
///
/// # Errors
/// As the steps fail; a capture that cannot be opened only when it was required (else
/// the outer shim is told why capture is off).
fn hand_over(plan: &InnerPlan) -> Result<u16> {
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
    // Capture: what the outer shim makes the TUN device through, opened while
    // /dev/net/tun is still visible. Asked for explicitly, a failure stops the run; by
    // default the outer shim says once that opaque clients have no network.
    let opened = match &plan.capture {
        None => Ok(None),
        Some(c) => match capture::open() {
            Ok(o) => Ok(Some(o)),
            Err(e) if c.required => return Err(e),
            Err(Error::Capture(why)) => Err(why),
            Err(e) => Err(e.to_string()),
        },
    };
    let payload = handoff::handoff_payload(port, &opened);
    let mut fds = vec![listener.as_fd()];
    if let Ok(Some(o)) = &opened {
        fds.extend([o.tun.as_fd(), o.netlink.as_fd()]);
    }
    sys::send_fds(plan.handoff.as_fd(), &fds, &payload)
        .map_err(|e| Error::sys("hand the listener to the shim", e))?;
    Ok(port)
}

/// Says why the command could not be started (with `hint` when it could not be
/// executed), and the exit status that tells it the shell way.
fn exec_failed(e: &Error, hint: Option<&str>) -> i32 {
    eprintln!("shim: {e}");
    if let (Error::Sys { op, .. }, Some(hint)) = (e, hint)
        && op.starts_with("execute")
    {
        eprintln!("shim: {hint}");
    }
    match e {
        Error::Sys {
            op,
            source: Errno::ENOENT,
        } if op.starts_with("execute") => EXIT_NOT_FOUND,
        Error::Sys { op, .. } if op.starts_with("execute") => EXIT_CANNOT_EXECUTE,
        _ => EXIT_SHIM_FAILURE,
    }
}

/// Reaps every process of the namespace and forwards signals to the command `child`
/// until it ends: its status the shell way.
fn reap(child: Pid) -> Result<i32> {
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
