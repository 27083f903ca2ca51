//! The seccomp filter of the confined command.
//!
//! Default allow, with a deny list aimed at escaping the other layers: new AF_UNIX sockets
//! (host daemons; unless allowed), AF_VSOCK (the hypervisor), io_uring (a second syscall
//! path that seccomp cannot see), ptrace and cross-process memory access, every namespace
//! and mount system call, `clone` with namespace flags, kernel keyrings, BPF and perf,
//! and `TIOCSTI`/`TIOCLINUX` terminal injection; and setting a file's set-user-ID or
//! set-group-ID bit (a file the command makes in a writable root is the caller's on disk,
//! root's when root runs the shim: a set-user-ID copy of a shell there would be a way to
//! root for anyone on the host). `clone3` and `openat2` return `ENOSYS`, because their
//! flags (and `openat2`'s mode) sit in memory a filter cannot read; libc then falls back
//! to `clone` and `openat`. Any syscall from a foreign architecture (i386 `int 0x80`,
//! x32) kills the process.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::error::{Error, Result};

const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

/// The calls the command is always refused (`EPERM`): io_uring, tracing and other
/// processes' memory, new namespaces and mounts (the new mount API among them), kernel
/// keys, BPF, performance events, userfaultfd, kexec and kernel modules.
const ALWAYS_DENIED: [i64; 30] = [
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_kexec_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
];

fn target_arch() -> Result<TargetArch> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| Error::Seccomp(format!("unsupported architecture: {e}")))
}

/// A condition on an argument. `int` arguments (socket domain, ioctl request) are
/// compared on their low 32 bits only (`Dword`), as the kernel truncates them: comparing
/// 64 bits would let garbage in the upper half slip past the rule.
fn cond(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition> {
    SeccompCondition::new(arg, len, op, value).map_err(|e| Error::Seccomp(e.to_string()))
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule> {
    SeccompRule::new(conds).map_err(|e| Error::Seccomp(e.to_string()))
}

/// The program of a filter that fails the calls of `rules` with `errno` and allows the
/// rest.
fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    errno: i32,
    arch: TargetArch,
) -> Result<BpfProgram> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| Error::Seccomp(e.to_string()))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| Error::Seccomp(e.to_string()))
}

/// The rule that matches a call whose argument `arg` (its low 32 bits) is `value`.
fn arg_is(arg: u8, value: u64) -> Result<SeccompRule> {
    rule(vec![cond(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        value,
    )?])
}

/// The compiled filters, in installation order.
pub(crate) struct Filters(Vec<BpfProgram>);

/// Compile the filters. `allow_unix_sockets` lifts only the `socket(AF_UNIX)` rule.
///
/// # Errors
/// [`Error::Seccomp`] if the architecture is unsupported or compilation fails.
#[allow(clippy::unnecessary_cast)] // libc's `Ioctl` is not `u64` on every target
pub(crate) fn build(allow_unix_sockets: bool) -> Result<Filters> {
    let arch = target_arch()?;
    let mut eperm: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in ALWAYS_DENIED {
        eperm.insert(nr, Vec::new());
    }
    let mut socket_rules = vec![arg_is(0, libc::AF_VSOCK as u64)?];
    if !allow_unix_sockets {
        socket_rules.push(arg_is(0, libc::AF_UNIX as u64)?);
    }
    eperm.insert(libc::SYS_socket, socket_rules);
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|f| {
            rule(vec![cond(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(*f),
                *f,
            )?])
        })
        .collect::<Result<Vec<_>>>()?;
    eperm.insert(libc::SYS_clone, clone_rules);
    for (nr, rules) in setid_rules()? {
        eperm.insert(nr, rules);
    }
    eperm.insert(
        libc::SYS_ioctl,
        vec![
            arg_is(1, libc::TIOCSTI as u64)?,
            arg_is(1, libc::TIOCLINUX as u64)?,
        ],
    );
    let mut deny = compile(eperm, libc::EPERM, arch)?;
    let mut enosys = BTreeMap::new();
    enosys.insert(libc::SYS_clone3, Vec::new());
    enosys.insert(libc::SYS_openat2, Vec::new());
    let clone3 = compile(enosys, libc::ENOSYS, arch)?;
    prepend_x32_check(&mut deny);
    Ok(Filters(vec![deny, clone3]))
}

/// The rules that refuse a set-user-ID or set-group-ID bit: in the mode of the `chmod`
/// family, and in the mode of a call that creates a file (`open` and `openat` with
/// `O_CREAT` or `O_TMPFILE`, `creat`, `mknod`). Modes are `mode_t` (32 bits) and flags
/// `int`: compared on their low 32 bits.
fn setid_rules() -> Result<Vec<(i64, Vec<SeccompRule>)>> {
    const SET_ID: [u64; 2] = [libc::S_ISUID as u64, libc::S_ISGID as u64];
    let creating = [
        libc::O_CREAT as u64,
        (libc::O_TMPFILE & !libc::O_DIRECTORY) as u64,
    ];
    let bit = |arg: u8, b: u64| cond(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(b), b);
    let mode_only = |mode: u8| -> Result<Vec<SeccompRule>> {
        SET_ID.iter().map(|b| rule(vec![bit(mode, *b)?])).collect()
    };
    let created = |flags: u8, mode: u8| -> Result<Vec<SeccompRule>> {
        let mut rules = Vec::new();
        for c in creating {
            for b in SET_ID {
                rules.push(rule(vec![bit(flags, c)?, bit(mode, b)?])?);
            }
        }
        Ok(rules)
    };
    #[allow(unused_mut)] // the legacy calls exist on some architectures only
    let mut out = vec![
        (libc::SYS_fchmod, mode_only(1)?),
        (libc::SYS_fchmodat, mode_only(2)?),
        (libc::SYS_fchmodat2, mode_only(2)?),
        (libc::SYS_openat, created(2, 3)?),
        (libc::SYS_mknodat, mode_only(2)?),
    ];
    #[cfg(target_arch = "x86_64")]
    out.extend([
        (libc::SYS_chmod, mode_only(1)?),
        (libc::SYS_creat, mode_only(1)?),
        (libc::SYS_open, created(1, 2)?),
        (libc::SYS_mknod, mode_only(1)?),
    ]);
    Ok(out)
}

/// x32 system calls carry `AUDIT_ARCH_X86_64` too, so the architecture check that
/// seccompiler emits does not stop them; they are told apart by bit 30 of the number.
/// Kill on any of them before the rules run (the rules match exact x86_64 numbers).
#[cfg(target_arch = "x86_64")]
fn prepend_x32_check(prog: &mut BpfProgram) {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
    const BPF_RET_K: u16 = 0x06;
    let prologue = vec![
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        }, // seccomp_data.nr
        sock_filter {
            code: BPF_JMP_JGE_K,
            jt: 0,
            jf: 1,
            k: 0x4000_0000,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_KILL_PROCESS,
        },
    ];
    prog.splice(0..0, prologue);
}

#[cfg(not(target_arch = "x86_64"))]
fn prepend_x32_check(_prog: &mut BpfProgram) {}

impl Filters {
    /// Install the filters on the calling thread (sets `no_new_privs` first).
    ///
    /// # Errors
    /// [`Error::MissingFeature`] if the kernel has no seccomp filter support, else
    /// [`Error::Seccomp`].
    pub(crate) fn install(&self) -> Result<()> {
        for prog in &self.0 {
            seccompiler::apply_filter(prog).map_err(|e| match e {
                seccompiler::Error::Seccomp(io) if io.raw_os_error() == Some(libc::EINVAL) => {
                    Error::MissingFeature {
                        feature: "seccomp filters (CONFIG_SECCOMP_FILTER)",
                        detail: io.to_string(),
                        hint: "run on a kernel built with seccomp filter support",
                    }
                }
                e => Error::Seccomp(e.to_string()),
            })?;
        }
        Ok(())
    }
}
