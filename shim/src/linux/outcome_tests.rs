//! The predictions against this process's own view of a scratch directory (no walls: each
//! verdict is what the kernel answers there, checked against the real call).

use std::os::unix::fs::symlink;

use super::*;
use crate::testing::TempDir;

/// A scratch directory for the test `tag`: `dir/sub`, `empty`, `file` and `link` (to
/// `file`).
fn scratch(tag: &str) -> TempDir {
    let t = TempDir::new(&format!("outcome-{tag}"));
    std::fs::create_dir_all(t.0.join("dir/sub")).unwrap();
    std::fs::create_dir_all(t.0.join("empty")).unwrap();
    std::fs::write(t.0.join("file"), "x").unwrap();
    symlink(t.0.join("file"), t.0.join("link")).unwrap();
    t
}

fn call(kind: Kind, n: usize) -> Call {
    Call {
        kind,
        empty: vec![false; n],
        empty_ok: false,
    }
}

fn me() -> TaskView {
    TaskView::open(std::process::id()).unwrap()
}

#[test]
fn mkdir_of_what_exists_and_in_what_is_missing_fail_on_their_own() {
    let s = scratch("mkdir");
    let v = me();
    let mkdir = |p: &Path| v.verdict(&call(Kind::MakeNew, 1), &[p.to_owned()]);
    assert_eq!(mkdir(&s.0.join("dir")), Verdict::Own(Errno::EEXIST));
    assert_eq!(mkdir(&s.0.join("link")), Verdict::Own(Errno::EEXIST));
    assert_eq!(mkdir(Path::new("/")), Verdict::Own(Errno::EEXIST));
    assert_eq!(mkdir(&s.0.join("missing/new")), Verdict::Own(Errno::ENOENT));
    assert_eq!(mkdir(&s.0.join("file/new")), Verdict::Own(Errno::ENOTDIR));
    assert_eq!(mkdir(&s.0.join("new")), Verdict::Walls);
    // The real calls agree.
    assert_eq!(
        std::fs::create_dir(s.0.join("dir"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EEXIST)
    );
    assert_eq!(
        std::fs::create_dir(s.0.join("file/new"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOTDIR)
    );
}

#[test]
fn an_empty_path_is_enoent_unless_it_names_the_descriptor() {
    let s = scratch("empty");
    let v = me();
    let mut c = call(Kind::Unlink, 1);
    c.empty = vec![true];
    assert_eq!(
        v.verdict(&c, std::slice::from_ref(&s.0)),
        Verdict::Own(Errno::ENOENT)
    );
    let mut c = call(Kind::Chmod { follow: true }, 1);
    c.empty = vec![true];
    c.empty_ok = true;
    assert_eq!(v.verdict(&c, &[s.0.join("file")]), Verdict::Walls);
    let c = call(Kind::Symlink { target_empty: true }, 1);
    assert_eq!(
        v.verdict(&c, &[s.0.join("new")]),
        Verdict::Own(Errno::ENOENT)
    );
}

#[test]
fn unlink_reaches_the_walls_whatever_is_there() {
    // The mount's write access comes before the name is looked up: a missing name in a
    // read-only directory answers EROFS, not the ENOENT a caller takes for "gone".
    let s = scratch("unlink");
    let v = me();
    for p in ["missing", "dir", "file", "link"] {
        assert_eq!(
            v.verdict(&call(Kind::Unlink, 1), &[s.0.join(p)]),
            Verdict::Walls,
            "{p}"
        );
    }
    assert_eq!(
        v.verdict(&call(Kind::Unlink, 1), &[s.0.join("missing/x")]),
        Verdict::Own(Errno::ENOENT)
    );
}

#[test]
fn open_is_decided_by_what_is_there() {
    let s = scratch("open");
    let v = me();
    let open = |p: &str, flags: i32| {
        v.verdict(
            &call(
                Kind::Open {
                    flags: flags as u64,
                },
                1,
            ),
            &[s.0.join(p)],
        )
    };
    assert_eq!(open("missing", libc::O_WRONLY), Verdict::Own(Errno::ENOENT));
    assert_eq!(
        open("missing", libc::O_WRONLY | libc::O_CREAT),
        Verdict::Walls
    );
    assert_eq!(
        open("file", libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL),
        Verdict::Own(Errno::EEXIST)
    );
    assert_eq!(
        open("file", libc::O_RDONLY | libc::O_CREAT),
        Verdict::Harmless
    );
    assert_eq!(open("file", libc::O_WRONLY | libc::O_CREAT), Verdict::Walls);
    assert_eq!(open("dir", libc::O_WRONLY), Verdict::Own(Errno::EISDIR));
    assert_eq!(
        open("link", libc::O_WRONLY | libc::O_NOFOLLOW),
        Verdict::Own(Errno::ELOOP)
    );
    assert_eq!(open("link", libc::O_WRONLY), Verdict::Walls);
}

#[test]
fn a_file_whose_mode_refuses_the_task_is_its_own_eacces() {
    use std::os::unix::fs::PermissionsExt;
    let s = scratch("mode");
    let v = me();
    let ro = s.0.join("ro");
    std::fs::write(&ro, "x").unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    let c = Creds::of(std::process::id()).unwrap();
    let open = v.verdict(
        &call(
            Kind::Open {
                flags: libc::O_WRONLY as u64,
            },
            1,
        ),
        std::slice::from_ref(&ro),
    );
    // The test may run with capabilities (as root): then nothing is predicted.
    if c.capable {
        assert_eq!(open, Verdict::Walls);
    } else {
        assert_eq!(open, Verdict::Own(Errno::EACCES));
    }
    let f = v.stat(&ro, true).unwrap();
    let mine = Creds {
        capable: false,
        ..c
    };
    assert!(mine.refused(f, 2));
    assert!(!mine.refused(f, 4));
    let other = Creds {
        fsuid: f.uid + 1,
        fsgid: f.gid + 1,
        groups: vec![f.gid],
        capable: false,
    };
    assert!(other.refused(f, 2), "the group's bits");
}

#[test]
fn rename_across_mounts_is_exdev_and_link_needs_its_source() {
    let s = scratch("rename");
    let v = me();
    let two = |kind: Kind, from: &Path, to: &Path| {
        v.verdict(&call(kind, 2), &[from.to_owned(), to.to_owned()])
    };
    let rename = Kind::Rename { flags: 0 };
    let (file, dir) = (s.0.join("file"), s.0.join("dir"));
    // Within one mount the walls answer, whatever is there.
    assert_eq!(
        two(rename, &s.0.join("missing"), &s.0.join("x")),
        Verdict::Walls
    );
    assert_eq!(two(rename, &file, &dir), Verdict::Walls);
    // /proc is another mount.
    assert_eq!(
        two(rename, &file, Path::new("/proc/x")),
        Verdict::Own(Errno::EXDEV)
    );
    let link = Kind::Link { follow: false };
    assert_eq!(
        two(link, &s.0.join("missing"), &s.0.join("x")),
        Verdict::Own(Errno::ENOENT)
    );
    assert_eq!(
        two(link, &file, &s.0.join("link")),
        Verdict::Own(Errno::EEXIST)
    );
    // The mount's write access comes before the check across mounts.
    assert_eq!(two(link, &file, Path::new("/proc/x")), Verdict::Walls);
    assert_eq!(two(link, &file, &s.0.join("x")), Verdict::Walls);
}

#[test]
fn the_view_resolves_links_as_the_operation_does() {
    let s = scratch("resolve");
    let v = me();
    symlink(s.0.join("dir"), s.0.join("dirlink")).unwrap();
    for (op, path, resolved) in [
        (FsOp::OpenWrite, "link", "file"),
        (FsOp::Unlink, "link", "link"),
        (FsOp::Create, "dirlink/new", "dir/new"),
        (FsOp::Create, "missing/new", "missing/new"),
    ] {
        assert_eq!(
            v.resolved(op, &s.0.join(path)),
            s.0.join(resolved),
            "{op:?} {path}"
        );
    }
    assert!(v.exists(&s.0.join("link")));
    assert!(!v.exists(&s.0.join("missing")));
}
