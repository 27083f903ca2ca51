//! Landlock: the second write layer. Every write access right the kernel knows (up to
//! ABI 5: write, truncate, create, remove, rename across directories, device ioctls) is
//! handled, and granted only beneath the writable roots and the sandbox's private `/dev`.
//! Reads are not handled here (the mount layer masks them).
//!
//! Beyond the mount layer it also covers what a read-only mount does not: named pipes and
//! device nodes outside the writable roots, and descriptors re-opened through
//! `/proc/self/fd` onto host mounts.

use std::path::PathBuf;

use landlock::{
    ABI, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, path_beneath_rules,
};

use crate::error::{Error, Result};

/// The highest ABI whose write rights we ask for; older kernels enforce a subset
/// (best effort above ABI 1, which is the floor: below it there is no Landlock).
const TARGET: ABI = ABI::V5;

/// Restrict the calling thread (and its future children) to writing beneath `roots` and
/// `/dev` only.
///
/// # Errors
/// [`Error::MissingFeature`] when the kernel has no Landlock (not built, or not in the
/// `lsm=` list): the caller may turn that into a warning only if the user passed
/// `--allow-degraded landlock`. [`Error::Landlock`] for other failures.
pub(crate) fn restrict_writes(roots: &[PathBuf]) -> Result<()> {
    let access = AccessFs::from_write(TARGET);
    let mut paths: Vec<PathBuf> = roots.to_vec();
    paths.push(PathBuf::from("/dev"));
    let status = Ruleset::default()
        .handle_access(access)
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules(&paths, access)))
        .and_then(|r| r.restrict_self())
        .map_err(|e| Error::Landlock(e.to_string()))?;
    match status.ruleset {
        RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(()),
        RulesetStatus::NotEnforced => Err(Error::MissingFeature {
            feature: "Landlock (Linux 5.13+, CONFIG_SECURITY_LANDLOCK, `landlock` in the lsm= list)",
            detail: "the kernel does not enforce Landlock rulesets".into(),
            hint: "enable Landlock, or pass --allow-degraded landlock to rely on the read-only mount layer alone (named pipes outside the writable roots then stay writable)",
        }),
    }
}
