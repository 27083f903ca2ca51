//! The filesystem view: read masks and re-opened reads, write roots, and what stays
//! read-only inside them; nothing written outside them lands on the host.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::support::{Fixture, expect};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        symlink_in_allowed_dir_to_denied_file_cannot_be_read,
        deny_read_masks_and_allow_read_reopens_beneath,
        writing_outside_allow_write_roots_fails_and_dev_null_works,
        read_only_file_in_writable_dir_stays_read_only,
    ]
}

fn symlink_in_allowed_dir_to_denied_file_cannot_be_read() -> TestResult {
    let fx = Fixture::new("symlink");
    let w = fx.mkdir("work");
    let (secret, secrets) = (fx.path("secret"), fx.mkdir("secrets-dir"));
    std::fs::write(&secret, "token").unwrap();
    std::fs::write(secrets.join("key"), "token").unwrap();
    std::os::unix::fs::symlink(&secret, w.join("link")).unwrap();
    std::os::unix::fs::symlink(&secrets, w.join("dirlink")).unwrap();
    let flags = args![
        "--allow-write",
        &w,
        "--deny-read",
        &secret,
        "--deny-read",
        &secrets,
    ];
    for (op, p) in [
        ("read", w.join("link")),        // via a symlink
        ("read", secret),                // the denied file
        ("read", w.join("dirlink/key")), // in a denied directory, via a symlink
        ("write", secrets.join("new")),  // in a denied directory
    ] {
        fx.check(&flags, &args![op, p], "err:EACCES")?;
    }
    Ok(())
}

fn deny_read_masks_and_allow_read_reopens_beneath() -> TestResult {
    let fx = Fixture::new("reopen");
    std::fs::create_dir_all(fx.path("home/.ssh")).unwrap();
    std::fs::create_dir_all(fx.path("home/project")).unwrap();
    std::fs::write(fx.path("home/.ssh/id"), "key").unwrap();
    std::fs::write(fx.path("home/project/readme"), "hello").unwrap();
    let flags = args![
        "--deny-read",
        fx.path("home"),
        "--allow-read",
        fx.path("home/project"),
        "--deny-read",
        fx.path("does-not-exist"),
    ];
    // Inside the mask only the re-opened path exists.
    fx.check(
        &flags,
        &args!["read", fx.path("home/.ssh/id")],
        "err:ENOENT",
    )?;
    fx.check(&flags, &args!["read", fx.path("home/project/readme")], "ok")?;
    fx.check(
        &flags,
        &args!["write", fx.path("home/project/readme")],
        "err:EROFS",
    )
}

fn writing_outside_allow_write_roots_fails_and_dev_null_works() -> TestResult {
    let fx = Fixture::new("outside");
    let w = fx.mkdir("work");
    let flags = args!["--allow-write", &w];
    let outside = fx.path("outside");
    let tmp = Path::new("/tmp/shim-e2e-should-not-exist");
    let inside = w.join("ok");
    for (p, want) in [
        (outside.as_path(), "err:EROFS"), // beside the root
        (Path::new("/usr/shim-e2e-should-not-exist"), "err:EROFS"),
        (tmp, "ok"), // the private temporary directory
        (Path::new("/dev/null"), "ok"),
        (inside.as_path(), "ok"),
    ] {
        fx.check(&flags, &args!["write", p], want)?;
    }
    // Without it, the host's /tmp is read-only like the rest.
    let mut no_tmp = Vec::from(flags);
    no_tmp.extend(args!["--no-tmp"]);
    fx.check(&no_tmp, &args!["write", tmp], "err:EROFS")?;
    if outside.exists() || tmp.exists() {
        return Err("a write outside the roots landed".into());
    }
    Ok(())
}

fn read_only_file_in_writable_dir_stays_read_only() -> TestResult {
    let fx = Fixture::new("rofile");
    let w = fx.mkdir("work");
    std::fs::write(w.join("ro"), "keep").unwrap();
    std::fs::set_permissions(w.join("ro"), std::fs::Permissions::from_mode(0o444)).unwrap();
    fx.check(
        &args!["--allow-write", &w],
        &args!["append", w.join("ro")],
        "err:EACCES",
    )?;
    expect(
        "content",
        &std::fs::read_to_string(w.join("ro")).unwrap(),
        "keep",
    )
}
