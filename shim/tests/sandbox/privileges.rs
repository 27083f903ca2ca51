//! What the command may no longer do: no capability in any set, `no_new_privs`, and the
//! seccomp filter (AF_UNIX sockets, namespaces, mounts, io_uring, `clone3`, foreign
//! syscall ABIs, set-user-ID and set-group-ID bits), with the probe and with the real
//! tools.

use crate::support::{Fixture, expect};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        umount_of_a_mask_and_remount_rw_fail_and_no_capabilities_remain,
        socket_af_unix_fails_eperm_while_socketpair_works,
        unshare_user_and_io_uring_fail,
        clone3_is_enosys_and_x32_syscalls_kill,
        set_id_bits_are_refused,
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

/// A set-user-ID or set-group-ID bit is refused, whether set by `chmod` or in the mode of
/// a new file (`open` with `O_CREAT`, `O_TMPFILE`): what the command makes in a writable
/// root is the caller's on the host. Plain modes still work; nothing set-ID lands.
fn set_id_bits_are_refused() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new("setid");
    let w = fx.mkdir("work");
    let flags = args!["--allow-write", &w];
    fx.check(&flags, &args!["write", w.join("f")], "ok")?;
    for (probe, path, mode, want) in [
        ("chmod-mode", w.join("f"), "4755", "err:EPERM"),
        ("chmod-mode", w.join("f"), "2755", "err:EPERM"),
        ("chmod-mode", w.join("f"), "755", "ok"),
        ("create-mode", w.join("suid"), "4755", "err:EPERM"),
        ("create-mode", w.join("sgid"), "2755", "err:EPERM"),
        ("create-mode", w.join("plain"), "755", "ok"),
        ("tmpfile-mode", w.clone(), "4755", "err:EPERM"),
        ("chmod-mode", w.clone(), "2755", "err:EPERM"),
    ] {
        fx.check(&flags, &args![probe, &path, mode], want)?;
    }
    for e in std::fs::read_dir(&w).unwrap() {
        let e = e.unwrap();
        if e.metadata().unwrap().permissions().mode() & 0o6000 != 0 {
            return Err(format!("{} is set-ID on the host", e.path().display()));
        }
    }
    Ok(())
}
