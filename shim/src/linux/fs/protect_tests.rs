//! Unit tests of `protect`.

use super::*;
use crate::testing::TempDir;

fn guarded(out: &Protections, path: &Path, guard: Guard) -> bool {
    out.paths.iter().any(|p| p.path == path && p.guard == guard)
}

#[test]
fn links_are_guarded_with_their_targets_and_a_dangling_target_gets_a_placeholder() {
    let t = TempDir::new("fs-links");
    let w = t.tree("home", &[("dotfiles/bashrc", "")]);
    std::os::unix::fs::symlink("dotfiles/bashrc", w.join(".bashrc")).unwrap();
    std::os::unix::fs::symlink("missing/vscode", w.join(".vscode")).unwrap();
    let mut out = Protections::default();
    protect_roots(std::slice::from_ref(&w), Some(&w), &mut out).unwrap();
    // The link itself, its target, and the directory between root and target.
    assert!(guarded(&out, &w.join(".bashrc"), Guard::ReadOnly));
    assert!(guarded(&out, &w.join("dotfiles/bashrc"), Guard::ReadOnly));
    assert!(guarded(&out, &w.join("dotfiles"), Guard::Pin));
    // A dangling link's target is created (with its parent) so it can be covered.
    assert!(guarded(&out, &w.join(".vscode"), Guard::ReadOnly));
    assert!(guarded(&out, &w.join("missing/vscode"), Guard::ReadOnly));
    assert!(w.join("missing/vscode").is_dir());
    // In the home root, missing per-user files get placeholders; no repository: `.git`.
    for p in [".profile", ".ssh", ".git"] {
        assert!(
            out.placeholders.iter().any(|ph| ph.path == w.join(p)),
            "{p}"
        );
    }
    for ph in out.placeholders.iter().rev() {
        ph.remove();
    }
    assert!(!w.join("missing").exists() && !w.join(".profile").exists());
    assert!(w.join("dotfiles/bashrc").exists());
}

#[test]
fn outside_home_missing_per_user_files_are_watched_not_created() {
    let t = TempDir::new("fs-watched");
    let w = t.0.join("project");
    std::fs::create_dir_all(w.join("dotfiles/config")).unwrap();
    std::os::unix::fs::symlink("dotfiles/config", w.join(".config")).unwrap();
    std::fs::write(w.join(".bashrc"), "").unwrap();
    let mut out = Protections::default();
    protect_roots(std::slice::from_ref(&w), None, &mut out).unwrap();
    let watched: Vec<String> = out.watch.iter().map(|x| format!("{x:?}")).collect();
    let is_watched = |rel: &str| {
        out.watch
            .iter()
            .any(|x| *x == Watch::new(&w, Path::new(rel), TamperKind::DenySet).unwrap())
    };
    for rel in [
        ".zshrc",
        ".bash_profile",
        ".gitconfig",
        ".ssh",
        ".config/git/config",
    ] {
        assert!(is_watched(rel), "{rel}: {watched:?}");
        assert!(
            !out.placeholders.iter().any(|p| p.path == w.join(rel)),
            "{rel}"
        );
    }
    // Where the link leads, too; an existing file is protected instead.
    assert!(is_watched("dotfiles/config/git/config"), "{watched:?}");
    assert!(!is_watched(".bashrc"));
    assert!(guarded(&out, &w.join(".bashrc"), Guard::ReadOnly));
    for ph in out.placeholders.iter().rev() {
        ph.remove();
    }
}

#[test]
fn a_placeholder_that_was_written_to_stays() {
    let t = TempDir::new("fs-placeholder");
    let ph = create_placeholder(&t.0.join(".mcp.json"), false)
        .unwrap()
        .unwrap();
    std::fs::write(&ph.path, "user content").unwrap();
    ph.remove();
    assert!(ph.path.exists());
}
