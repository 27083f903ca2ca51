//! Unit tests of `repos`.

use super::*;
use crate::testing::TempDir;

fn found(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    find_repositories(root, &mut out);
    out
}

#[test]
fn nested_repositories_are_found_in_a_wide_tree_and_none_twice() {
    let t = TempDir::new("fs-repos-wide");
    let w = &t.0;
    std::fs::create_dir_all(w.join(".git")).unwrap(); // the root's own: not listed
    let mut expected = Vec::new();
    // Many directories, repositories at several depths, one with a
    // `.git` file (a worktree or submodule).
    for d in 0..40 {
        let dir = w.join(format!("d{d}/sub/deeper"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..5 {
            std::fs::write(dir.join(format!("f{f}")), "").unwrap();
        }
        if d % 7 == 0 {
            std::fs::create_dir_all(dir.join(".git/hooks")).unwrap();
            expected.push(dir);
        }
    }
    std::fs::create_dir_all(w.join("d3/sub")).unwrap();
    std::fs::write(w.join("d3/sub/.git"), "gitdir: ../../.git/worktrees/x\n").unwrap();
    expected.push(w.join("d3/sub"));
    // A repository inside a repository.
    std::fs::create_dir_all(w.join("d0/sub/deeper/vendor/lib/.git")).unwrap();
    expected.push(w.join("d0/sub/deeper/vendor/lib"));
    expected.sort();
    assert_eq!(found(w), expected);
}

#[test]
fn links_git_internals_node_modules_and_cache_contents_are_not_searched() {
    let t = TempDir::new("fs-repos-pruned");
    let w = t.0.join("root");
    let elsewhere = t.0.join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("repo/.git")).unwrap();
    std::fs::create_dir_all(&w).unwrap();
    std::os::unix::fs::symlink(&elsewhere, w.join("link")).unwrap();
    std::fs::create_dir_all(w.join("node_modules/pkg/.git")).unwrap();
    std::fs::create_dir_all(w.join(".git/modules/m/.git")).unwrap();
    std::fs::create_dir_all(w.join("target/debug/build/x/.git")).unwrap();
    std::fs::write(
        w.join("target/CACHEDIR.TAG"),
        "Signature: 8a477f597d28d172789f06886806bc55\n",
    )
    .unwrap();
    // A tagged directory that is itself a repository still counts.
    std::fs::create_dir_all(w.join("cache/.git")).unwrap();
    std::fs::write(w.join("cache/CACHEDIR.TAG"), "").unwrap();
    std::fs::create_dir_all(w.join("cache/inner/.git")).unwrap();
    assert_eq!(found(&w), vec![w.join("cache")]);
}

#[test]
fn a_root_that_is_missing_or_a_file_has_none() {
    let t = TempDir::new("fs-repos-none");
    assert!(found(&t.0.join("missing")).is_empty());
    std::fs::write(t.0.join("file"), "").unwrap();
    assert!(found(&t.0.join("file")).is_empty());
    assert!(found(&t.0).is_empty());
}
