//! Build script shared by the `mediator` and `shim` packages: puts the git revision the
//! binary is built from in `GIT_REVISION` (and its first 12 characters in
//! `GIT_REVISION_SHORT`), for `--version` and the image labels.
//!
//! The revision is the environment's `GIT_REVISION` when set (an image build whose
//! context has no `.git`), else `git rev-parse HEAD` of the checkout, else `unknown`.
//! Cargo reruns this script when HEAD or the branch it names moves.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=GIT_REVISION");
    let revision = match std::env::var("GIT_REVISION") {
        Ok(r) if !r.trim().is_empty() => r.trim().to_owned(),
        _ => {
            // Rerun when HEAD moves: the HEAD file (a branch switch), the branch's ref
            // (a commit) and packed-refs (a ref that was packed). A branch that is only
            // in packed-refs (a fresh clone) has no ref file yet: watch the directory its
            // first commit will create the file in.
            for path in ["HEAD", "packed-refs"]
                .into_iter()
                .map(str::to_owned)
                .chain(git(&["symbolic-ref", "-q", "HEAD"]))
            {
                if let Some(p) = git(&["rev-parse", "--git-path", &path]) {
                    let mut p = PathBuf::from(p);
                    while !p.exists() {
                        if !p.pop() || p.as_os_str().is_empty() {
                            break;
                        }
                    }
                    if p.exists() {
                        println!("cargo:rerun-if-changed={}", p.display());
                    }
                }
            }
            git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    let short: String = revision.chars().take(12).collect();
    println!("cargo:rustc-env=GIT_REVISION={revision}");
    println!("cargo:rustc-env=GIT_REVISION_SHORT={short}");
}
