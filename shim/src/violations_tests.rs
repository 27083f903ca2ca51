//! Judging attempts against the walls, the hints, and the report's bounds.

use std::path::{Path, PathBuf};

use super::*;

fn walls() -> Walls {
    Walls::new(vec![
        (PathBuf::from("/w"), Wall::Writable),
        (PathBuf::from("/w/.bashrc"), Wall::Protected),
        (PathBuf::from("/w/.git"), Wall::Pinned),
        (PathBuf::from("/w/.git/hooks"), Wall::Protected),
        (PathBuf::from("/w/secret"), Wall::Masked),
        (PathBuf::from("/w/ca"), Wall::ReadOnly),
        (PathBuf::from("/w/.zshrc"), Wall::Watched),
        (PathBuf::from("/dev"), Wall::Writable),
    ])
}

#[test]
fn each_wall_refuses_with_its_rule() {
    let w = walls();
    let j = |op, p: &str| w.judge(op, Path::new(p));
    assert_eq!(j(FsOp::Create, "/w/new"), None);
    assert_eq!(j(FsOp::Create, "/w/deep/er/new"), None);
    assert_eq!(j(FsOp::OpenWrite, "/dev/null"), None);
    assert_eq!(j(FsOp::Create, "/etc/x"), Some(FsRule::OutsideWriteRoots));
    assert_eq!(
        j(FsOp::Create, "/wx"),
        Some(FsRule::OutsideWriteRoots),
        "a sibling with the same prefix"
    );
    assert_eq!(
        j(FsOp::OpenWrite, "/w/.bashrc"),
        Some(FsRule::MandatoryDeny)
    );
    assert_eq!(
        j(FsOp::Create, "/w/.git/hooks/pre-commit"),
        Some(FsRule::MandatoryDeny)
    );
    assert_eq!(
        j(FsOp::Create, "/w/.git/objects/ab"),
        None,
        "inside the pinned .git"
    );
    assert_eq!(
        j(FsOp::Rename, "/w/.git"),
        Some(FsRule::MandatoryDeny),
        "the pin itself"
    );
    assert_eq!(j(FsOp::Unlink, "/w/.git"), Some(FsRule::MandatoryDeny));
    assert_eq!(j(FsOp::Create, "/w/secret/x"), Some(FsRule::DenyRead));
    assert_eq!(
        j(FsOp::Create, "/w/ca/x.pem"),
        Some(FsRule::OutsideWriteRoots)
    );
    assert_eq!(j(FsOp::Create, "/w/.zshrc"), Some(FsRule::MandatoryDeny));
    // A descriptor the task holds is not a place in the tree.
    assert_eq!(j(FsOp::OpenWrite, "/proc/self/fd/1"), None);
    assert_eq!(j(FsOp::OpenWrite, "/proc/123/fd/4"), None);
    assert_eq!(
        j(FsOp::OpenWrite, "/proc/sys/kernel/x"),
        Some(FsRule::OutsideWriteRoots)
    );
}

#[test]
fn hints_say_what_to_do() {
    let w = walls();
    let h = w.hint(FsRule::OutsideWriteRoots, Path::new("/etc/x"));
    assert_eq!(
        h,
        "/etc/x is outside the write roots; write under /w or ask for --allow-write /etc"
    );
    let none = Walls::new(Vec::new()).hint(FsRule::OutsideWriteRoots, Path::new("/x"));
    assert!(
        none.contains("has none") && none.contains("--allow-write /x"),
        "{none}"
    );
    assert!(
        w.hint(FsRule::MandatoryDeny, Path::new("/w/.bashrc"))
            .contains("read-only in every sandbox")
    );
    assert!(
        w.hint(FsRule::MandatoryDeny, Path::new("/w/.zshrc"))
            .contains("moved aside when the run ends")
    );
    assert!(
        w.hint(FsRule::DenyRead, Path::new("/w/secret/x"))
            .contains("--deny-read")
    );
}

#[test]
fn paths_are_normalised_lexically() {
    assert_eq!(normalise(Path::new("/a/./b/../c")), Path::new("/a/c"));
    assert_eq!(normalise(Path::new("/../../x")), Path::new("/x"));
    assert_eq!(normalise(Path::new("/")), Path::new("/"));
}

#[test]
fn the_report_keeps_the_first_distinct_paths_and_counts_all() {
    let v = Violations::new(None, false);
    v.observe_with(walls());
    for i in 0..MAX_PATHS + 20 {
        let a = Attempt {
            pid: 1,
            op: FsOp::Create,
            paths: vec![PathBuf::from(format!("/etc/f{i}"))],
        };
        v.observe(a.clone(), String::new);
        if i == 0 {
            v.observe(a, String::new);
        }
    }
    v.observe(
        Attempt {
            pid: 1,
            op: FsOp::Create,
            paths: vec![PathBuf::from("/w/ok")],
        },
        || unreachable!("an allowed write asks for nothing"),
    );
    let s = v.summary();
    assert_eq!(s["denied"], MAX_PATHS as u64 + 21);
    assert_eq!(s["paths"].as_array().unwrap().len(), MAX_PATHS);
    assert_eq!(s["paths"][0]["count"], 2);
    assert_eq!(s["by_op"]["create"], MAX_PATHS as u64 + 21);
    assert_eq!(s["observed"], true);
}

#[test]
fn a_bad_descriptor_spec_is_a_usage_error() {
    assert!(matches!(Sink::open("fd:x"), Err(Error::Usage(_))));
    assert!(matches!(Sink::open("fd:0"), Err(Error::Usage(_))));
    assert!(Sink::open("fd:987654").is_err());
}

#[test]
fn beneath_holds_at_component_boundaries_only() {
    let b = |p: &str, d: &str| beneath(Path::new(p), Path::new(d));
    assert!(b("/w", "/w") && b("/w/x", "/w") && b("/w/x/y", "/w/x"));
    assert!(b("/anything", "/") && b("/", "/"));
    assert!(!b("/wx", "/w") && !b("/w/.bashrc2", "/w/.bashrc") && !b("/", "/w"));
    assert!(!b("/w", "/w/x"));
}
