//! What the command may no longer do: no capability in any set, `no_new_privs`, and the
//! seccomp filter (AF_UNIX sockets, namespaces, mounts, io_uring, `clone3`, foreign
//! syscall ABIs), with the probe and with the real tools.

use crate::support::{Fixture, expect};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        umount_of_a_mask_and_remount_rw_fail_and_no_capabilities_remain,
        socket_af_unix_fails_eperm_while_socketpair_works,
        unshare_user_and_io_uring_fail,
        clone3_is_enosys_and_x32_syscalls_kill,
    ]
}

/// Run a real tool in the sandbox; it must fail.
fn tool_fails(fx: &Fixture, command: &[&str]) -> TestResult {
    let out = fx.shim(&[], command).output().unwrap();
    if out.status.success() {
        return Err(format!("{} succeeded", command.join(" ")));
    }
    Ok(())
}

fn umount_of_a_mask_and_remount_rw_fail_and_no_capabilities_remain() -> TestResult {
    let fx = Fixture::new("caps");
    let secret = fx.path("secret");
    std::fs::write(&secret, "x").unwrap();
    let flags = args!["--deny-read", &secret];
    let caps = fx.probe(&flags, &args!["capeff"])?;
    for want in [
        "CapInh:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "CapAmb:\t0000000000000000",
        "NoNewPrivs:\t1",
    ] {
        if !caps.contains(want) {
            return Err(format!("{want:?} not in {caps:?}"));
        }
    }
    fx.check(&flags, &args!["umount", &secret], "err:EPERM")?;
    fx.check(&flags, &args!["remount-rw"], "err:EPERM")?;
    // And with the real tools (as root inside when the suite runs as root).
    tool_fails(&fx, &["mount", "-o", "remount,rw", "/"])
}

fn socket_af_unix_fails_eperm_while_socketpair_works() -> TestResult {
    let fx = Fixture::new("unix");
    fx.check(&[], &args!["socket-unix"], "err:EPERM")?;
    fx.check(&[], &args!["socketpair"], "ok")?;
    fx.check(&[], &args!["connect-unix", &fx.socket], "err:EPERM")?;
    fx.check(&args!["--allow-unix-sockets"], &args!["socket-unix"], "ok")
}

fn unshare_user_and_io_uring_fail() -> TestResult {
    let fx = Fixture::new("unshare");
    fx.check(&[], &args!["unshare-user"], "err:EPERM")?;
    fx.check(&[], &args!["io-uring"], "err:EPERM")?;
    tool_fails(&fx, &["unshare", "-U", "true"])
}

fn clone3_is_enosys_and_x32_syscalls_kill() -> TestResult {
    let fx = Fixture::new("clone3");
    fx.check(&[], &args!["clone3"], "err:ENOSYS")?;
    let out = fx
        .probe_command(&[], &args!["x32-getpid"])
        .output()
        .unwrap();
    // SIGSYS (31) from SECCOMP_RET_KILL_PROCESS.
    expect(
        "x32 syscall",
        &format!("{:?}", out.status.code()),
        "Some(159)",
    )
}
