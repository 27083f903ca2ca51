//! Judging attempts against the walls, the hints, and the report's bounds.

use std::path::{Path, PathBuf};

use super::sink::{STREAM_BURST, STREAM_RATE, Stream};
use super::tally::MAX_PATHS;
use super::walls::beneath;
use super::*;
use crate::error::Error;

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

/// Violations judged against [`walls`] and written to a fresh file of this test process
/// for the test `name`: the file's path, and the violations.
fn written_to_a_file(name: &str) -> (PathBuf, Violations) {
    let path = std::env::temp_dir().join(format!("shim-stream-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let v = Violations::new(Some(Sink::open(path.to_str().unwrap()).unwrap()), false);
    v.observe_with(walls());
    (path, v)
}

/// The JSON lines of the file at `path`, which is removed.
fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::remove_file(path).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn each_wall_refuses_with_its_rule() {
    let w = walls();
    let j = |op, p: &str| w.judge(op, Path::new(p), &HostView::default());
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
        v.observe(a.clone(), &HostView::default());
        if i == 0 {
            v.observe(a, &HostView::default());
        }
    }
    v.observe(
        Attempt {
            pid: 1,
            op: FsOp::Create,
            paths: vec![PathBuf::from("/w/ok")],
        },
        &Untouched,
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

#[test]
fn the_stream_is_bounded_and_says_what_it_held_back() {
    let path = std::env::temp_dir().join(format!("shim-stream-test-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut stream = Stream::new(Sink::open(path.to_str().unwrap()).unwrap());
    let start = Instant::now();
    let burst = STREAM_BURST as usize;
    // A burst is written whole; what comes faster than the rate after it is held back.
    let written = (0..burst + 50)
        .filter(|i| stream.offer(&format!("{{\"n\":{i}}}"), "t0", start))
        .count();
    assert_eq!(written, burst);
    // A second later the rate has refilled: the held-back count comes first, then the line.
    let later = start + std::time::Duration::from_secs(1);
    assert!(stream.offer("{\"n\":\"late\"}", "t1", later));
    // Held back again at the same instant once the refill is spent, then said at exit.
    let refill = STREAM_RATE as usize - 1;
    assert_eq!(
        (0..refill + 3)
            .filter(|_| stream.offer("{\"n\":\"x\"}", "t2", later))
            .count(),
        refill
    );
    stream.flush_held("t3");
    let lines = json_lines(&path);
    assert_eq!(lines.len(), burst + 1 + 1 + refill + 1);
    let held = &lines[burst];
    assert_eq!(held["type"], "fs_suppressed");
    assert_eq!(held["count"], 50);
    assert_eq!(held["since"], "t0");
    assert_eq!(held["ts"], "t1");
    assert_eq!(lines[burst + 1]["n"], "late");
    let last = lines.last().unwrap();
    assert_eq!(
        (last["count"].as_u64(), last["ts"].as_str()),
        (Some(3), Some("t3"))
    );
    // Nothing held back: no line.
    let mut quiet = Stream::new(Sink::open("fd:2").unwrap());
    quiet.flush_held("t");
    assert_eq!(quiet.held, 0);
}

#[test]
fn the_report_counts_what_the_stream_held_back() {
    let (path, v) = written_to_a_file("report");
    let n = STREAM_BURST as u64 + 1_000;
    for i in 0..n {
        let a = Attempt {
            pid: 1,
            op: FsOp::Create,
            paths: vec![PathBuf::from(format!("/etc/f{}", i % 3))],
        };
        v.observe(a, &HostView::default());
    }
    v.finish();
    let s = v.summary();
    let lines = json_lines(&path);
    assert_eq!(s["denied"], n);
    // Some of the last thousand were held back: the rate refills only 100 a second, and
    // the loop takes far less than the 10 s it would need to refill them all.
    let held = s["stream_suppressed"].as_u64().unwrap();
    assert!((1..=1_000).contains(&held), "{held}");
    let said: u64 = lines
        .iter()
        .filter(|l| l["type"] == "fs_suppressed")
        .map(|l| l["count"].as_u64().unwrap())
        .sum();
    assert_eq!(said, held);
    let denied = lines.iter().filter(|l| l["type"] == "fs_denied").count();
    assert_eq!(denied as u64, n - held);
}

#[test]
fn a_path_that_is_not_utf8_is_written_and_reported() {
    use std::os::unix::ffi::OsStrExt;
    let (path, v) = written_to_a_file("utf8");
    let name = PathBuf::from(std::ffi::OsStr::from_bytes(b"/etc/a\xffb"));
    v.observe(
        Attempt {
            pid: 1,
            op: FsOp::Create,
            paths: vec![name],
        },
        &HostView::default(),
    );
    let s = v.summary();
    let lines = json_lines(&path);
    assert_eq!(lines.len(), 1);
    let line = &lines[0];
    assert_eq!(line["path"], "/etc/a\u{fffd}b");
    assert_eq!(line["path_hex"], "2f6574632f61ff62");
    assert_eq!(s["paths"][0]["path"], "/etc/a\u{fffd}b");
    // A UTF-8 path carries no `path_hex`.
    let plain = FsDenied {
        kind: "fs_denied",
        ts: String::new(),
        pid: 1,
        exe: String::new(),
        op: FsOp::Create,
        path: PathBuf::from("/etc/x"),
        path_hex: None,
        rule: FsRule::OutsideWriteRoots,
        hint: String::new(),
    };
    assert!(
        serde_json::to_value(&plain)
            .unwrap()
            .get("path_hex")
            .is_none()
    );
}

#[test]
fn the_live_line_keeps_a_hostile_name_on_one_line() {
    use crate::report::on_one_line;
    assert_eq!(
        on_one_line("/etc/a\u{1b}]0;x\u{7}b\nshim: fake"),
        "/etc/a\\u{1b}]0;x\\u{7}b\\u{a}shim: fake"
    );
    assert_eq!(on_one_line("/w/ünïcode ok"), "/w/ünïcode ok");
}

/// A view an allowed write never looks at.
struct Untouched;

impl Seen for Untouched {
    fn resolved(&self, _: FsOp, _: &Path) -> PathBuf {
        unreachable!("an allowed write asks for nothing")
    }
    fn not_the_walls(&self, _: &[PathBuf]) -> bool {
        unreachable!("an allowed write asks for nothing")
    }
    fn exists(&self, _: &Path) -> bool {
        unreachable!("an allowed write asks for nothing")
    }
    fn exe(&self) -> String {
        unreachable!("an allowed write asks for nothing")
    }
}

/// A view in which every call fails for a reason of its own (as `mkdir` of a directory
/// that exists does).
struct FailsAnyway;

impl Seen for FailsAnyway {
    fn resolved(&self, _: FsOp, path: &Path) -> PathBuf {
        path.to_owned()
    }
    fn not_the_walls(&self, _: &[PathBuf]) -> bool {
        true
    }
    fn exists(&self, _: &Path) -> bool {
        true
    }
    fn exe(&self) -> String {
        "/bin/mkdir".into()
    }
}

#[test]
fn a_call_that_fails_anyway_is_no_violation_unless_a_mask_hides_why() {
    let v = Violations::new(None, false);
    v.observe_with(walls());
    for path in ["/etc", "/w/.bashrc", "/w/secret/x"] {
        v.observe(
            Attempt {
                pid: 1,
                op: FsOp::Mkdir,
                paths: vec![PathBuf::from(path)],
            },
            &FailsAnyway,
        );
    }
    let s = v.summary();
    assert_eq!(s["denied"], 1, "{s}");
    assert_eq!(s["paths"][0]["path"], "/w/secret/x");
    assert_eq!(s["paths"][0]["rule"], "deny_read");
}
