//! Filesystem violations (design section 18): each refused write of the confined tree is
//! one JSON line, live, on `--violations PATH|fd:N`, with the path resolved against the
//! command's working directory or directory descriptor, the rule that refused it and a
//! hint; the report counts them; observing never makes a refused write succeed.

use std::path::Path;

use serde_json::Value;

use crate::support::{Fixture, expect, read_json, stdout, succeeded, wait_until};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        refused_writes_are_reported_live_with_path_rule_and_hint,
        violations_go_to_a_descriptor_the_command_never_holds,
        the_report_counts_them_and_names_what_is_not_observed,
        the_supervisor_rests_once_the_sandbox_is_gone,
        a_command_flooding_the_walls_cannot_flood_the_stream,
        a_reader_that_does_not_read_never_holds_the_command,
        a_file_name_that_is_not_utf8_is_reported_not_fatal,
        mkdir_of_what_exists_is_no_violation,
        an_empty_path_is_no_violation,
        a_missing_path_or_parent_is_no_violation,
        a_parent_that_is_a_file_is_no_violation,
        a_rename_across_mounts_is_reported_by_its_copy,
        o_creat_of_an_existing_file_read_only_is_no_violation,
        o_trunc_on_the_read_only_tree_is_the_walls,
        the_private_tmp_is_no_violation,
    ]
}

/// The `fs_denied` records of a `--violations` file.
fn records(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{l:?}: {e}")))
        .collect()
}

/// The record for `path`, with what it must say.
fn has(records: &[Value], op: &str, path: &Path, rule: &str) -> TestResult {
    let want = path.display().to_string();
    let found = records
        .iter()
        .find(|r| r["type"] == "fs_denied" && r["path"] == want.as_str() && r["op"] == op);
    let Some(r) = found else {
        return Err(format!("no {op} record for {want}: {records:#?}"));
    };
    expect(
        &format!("rule of {op} {want}"),
        r["rule"].as_str().unwrap_or(""),
        rule,
    )?;
    let hint = r["hint"].as_str().unwrap_or_default();
    if !hint.contains(&want) {
        return Err(format!("the hint does not name the path: {r}"));
    }
    if r["pid"].as_u64().is_none() || r["exe"].as_str().is_none_or(str::is_empty) {
        return Err(format!("no pid or exe: {r}"));
    }
    if humantime::parse_rfc3339(r["ts"].as_str().unwrap_or_default()).is_err() {
        return Err(format!("no RFC 3339 ts: {r}"));
    }
    Ok(())
}

fn refused_writes_are_reported_live_with_path_rule_and_hint() -> TestResult {
    let fx = Fixture::new("violations");
    let w = fx.mkdir("work");
    std::fs::write(w.join(".bashrc"), "original\n").unwrap();
    std::fs::create_dir_all(w.join("sub")).unwrap();
    let out_dir = fx.mkdir("outside");
    std::fs::write(out_dir.join("file"), "x").unwrap();
    // Its mode lets the command write it (root's command is not its owner on the host):
    // only the walls refuse.
    std::fs::set_permissions(
        out_dir.join("file"),
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let log = fx.path("v.jsonl");
    let script = format!(
        "cd {w}; \
         echo x > ../outside/new 2>/dev/null; \
         echo y >> .bashrc 2>/dev/null; \
         mkdir {o}/dir 2>/dev/null; \
         mv sub {o}/moved 2>/dev/null; \
         ln -s /x {o}/link 2>/dev/null; \
         chmod 600 {o}/file 2>/dev/null; \
         truncate -s 0 {o}/file 2>/dev/null; \
         rm -f {o}/file 2>/dev/null; \
         echo ok > {w}/allowed; \
         cat {o}/file",
        w = w.display(),
        o = out_dir.display()
    );
    let out = fx
        .shim(
            &args!["--allow-write", &w, "--violations", &log],
            &["sh", "-c", &script],
        )
        .output()
        .unwrap();
    // Observing decided nothing: every write outside failed, the file is intact.
    let out = succeeded(out)?;
    expect(
        "the outside file",
        &String::from_utf8_lossy(&out.stdout),
        "x",
    )?;
    expect(
        ".bashrc",
        &std::fs::read_to_string(w.join(".bashrc")).unwrap(),
        "original\n",
    )?;
    if out_dir.join("new").exists() || out_dir.join("dir").exists() {
        return Err("a refused write landed".into());
    }
    let r = records(&log)?;
    has(&r, "create", &out_dir.join("new"), "outside_write_roots")?;
    has(&r, "open_write", &w.join(".bashrc"), "mandatory_deny")?;
    has(&r, "mkdir", &out_dir.join("dir"), "outside_write_roots")?;
    // A rename out of the root crosses mounts (EXDEV): mv then removes the target
    // first, and that is what the walls refuse.
    has(&r, "unlink", &out_dir.join("moved"), "outside_write_roots")?;
    has(&r, "symlink", &out_dir.join("link"), "outside_write_roots")?;
    has(&r, "chmod", &out_dir.join("file"), "outside_write_roots")?;
    // `truncate` opens the file for writing (then ftruncate on the descriptor).
    has(
        &r,
        "open_write",
        &out_dir.join("file"),
        "outside_write_roots",
    )?;
    has(&r, "unlink", &out_dir.join("file"), "outside_write_roots")?;
    // An allowed write is no violation.
    let allowed = w.join("allowed").display().to_string();
    if r.iter().any(|v| v["path"] == allowed.as_str()) {
        return Err(format!("the allowed write was reported: {r:#?}"));
    }
    // What cannot be seen is said once.
    let unobserved: Vec<&Value> = r.iter().filter(|v| v["type"] == "fs_unobserved").collect();
    if unobserved.len() != 1 || unobserved[0]["ops"] != serde_json::json!(["read"]) {
        return Err(format!("fs_unobserved: {unobserved:?}"));
    }
    // And the hint says where to write instead.
    let new = r
        .iter()
        .find(|v| v["op"] == "create")
        .and_then(|v| v["hint"].as_str())
        .unwrap_or_default();
    if !new.contains(&format!("write under {}", w.display())) || !new.contains("--allow-write") {
        return Err(format!("hint: {new}"));
    }
    Ok(())
}

fn violations_go_to_a_descriptor_the_command_never_holds() -> TestResult {
    let fx = Fixture::new("violations-fd");
    let w = fx.mkdir("work");
    let log = fx.path("fd.jsonl");
    let shim = Path::new(crate::support::SHIM);
    // The caller opens descriptor 3; the command tries to write it too.
    let line = format!(
        "exec 3>>{log} && {shim} --mediator-socket {sock} --allow-write {w} --violations fd:3 -- sh -c 'touch /etc/shim-fd-test 2>/dev/null; echo leak >&3 && echo wrote-fd3 || echo no-fd3'",
        log = log.display(),
        shim = shim.display(),
        sock = fx.socket.display(),
        w = w.display()
    );
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&line)
        .current_dir(&fx.dir.0)
        .output()
        .unwrap();
    let out = succeeded(out)?;
    expect(
        "the command's fd 3",
        String::from_utf8_lossy(&out.stdout).trim(),
        "no-fd3",
    )?;
    let r = records(&log)?;
    has(
        &r,
        "create",
        Path::new("/etc/shim-fd-test"),
        "outside_write_roots",
    )?;
    if std::fs::read_to_string(&log).unwrap().contains("leak") {
        return Err("the command wrote the violations descriptor".into());
    }
    Ok(())
}

fn the_report_counts_them_and_names_what_is_not_observed() -> TestResult {
    let fx = Fixture::new("violations-report");
    let w = fx.mkdir("work");
    let report = fx.path("report.json");
    let script = "for i in 1 2 3; do touch /etc/shim-r-$i 2>/dev/null; done; touch /etc/shim-r-1 2>/dev/null; true";
    succeeded(
        fx.shim(
            &args![
                "--allow-write",
                &w,
                "--report-file",
                &report,
                "--quiet-denials"
            ],
            &["sh", "-c", script],
        )
        .output()
        .unwrap(),
    )?;
    let v = read_json(&report)?;
    let fs = &v["filesystem"];
    expect("observed", &fs["observed"].to_string(), "true")?;
    expect("denied", &fs["denied"].to_string(), "4")?;
    expect(
        "by_rule",
        &fs["by_rule"].to_string(),
        r#"{"outside_write_roots":4}"#,
    )?;
    let paths = fs["paths"].as_array().cloned().unwrap_or_default();
    expect("distinct paths", &paths.len().to_string(), "3")?;
    let first = &paths[0];
    expect(
        "first path",
        first["path"].as_str().unwrap_or(""),
        "/etc/shim-r-1",
    )?;
    expect("its count", &first["count"].to_string(), "2")?;
    let unobserved = fs["unobserved"].to_string();
    if !unobserved.contains("read") {
        return Err(format!("unobserved: {unobserved}"));
    }
    Ok(())
}

/// 2,000 refused writes in a tight loop: the stream writes its burst (1,000 lines) and
/// then at most 100 a second, says what it held back in `fs_suppressed` lines, and the
/// report still counts every refusal.
fn a_command_flooding_the_walls_cannot_flood_the_stream() -> TestResult {
    let fx = Fixture::new("violations-flood");
    let w = fx.mkdir("work");
    let (log, report) = (fx.path("v.jsonl"), fx.path("report.json"));
    let script = "i=0; while [ $i -lt 2000 ]; do echo > /etc/shim-flood-$i; i=$((i+1)); done 2>/dev/null; true";
    succeeded(
        fx.shim(
            &args![
                "--allow-write",
                &w,
                "--violations",
                &log,
                "--report-file",
                &report,
                "--quiet-denials"
            ],
            &["sh", "-c", script],
        )
        .output()
        .unwrap(),
    )?;
    let fs = read_json(&report)?["filesystem"].clone();
    expect("denied", &fs["denied"].to_string(), "2000")?;
    let held = fs["stream_suppressed"].as_u64().unwrap_or(0);
    let lines = records(&log)?;
    let denied = lines.iter().filter(|r| r["type"] == "fs_denied").count() as u64;
    let said: u64 = lines
        .iter()
        .filter(|r| r["type"] == "fs_suppressed")
        .map(|r| r["count"].as_u64().unwrap_or(0))
        .sum();
    // The loop takes far less than the 10 s that would refill the second thousand.
    if held == 0 || denied + held != 2000 || said != held {
        return Err(format!(
            "written {denied}, held back {held} (report), said held back {said}"
        ));
    }
    Ok(())
}

/// `--violations` to a FIFO whose reader reads only once the shim has exited (as an
/// agent host that collects the pipe after the step does): the pipe fills, and the
/// command's further refused writes go on instead of waiting for the supervisor's write.
/// What the pipe holds is whole lines; the report counts every refusal and what the
/// stream held back.
fn a_reader_that_does_not_read_never_holds_the_command() -> TestResult {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let fx = Fixture::new("violations-full-pipe");
    let w = fx.mkdir("work");
    let (fifo, report) = (fx.path("v.fifo"), fx.path("report.json"));
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).map_err(|e| e.to_string())?;
    // The read end, open (so the shim's open for writing finds a reader) and not read.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .map_err(|e| e.to_string())?;
    let script = "i=0; while [ $i -lt 2000 ]; do echo > /etc/shim-pipe-$i; i=$((i+1)); done 2>/dev/null; echo done";
    let mut child = fx
        .shim(
            &args![
                "--allow-write",
                &w,
                "--violations",
                &fifo,
                "--report-file",
                &report,
                "--quiet-denials"
            ],
            &["sh", "-c", script],
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A hang detector, not a speed goal: the run takes well under a second.
    let pid = child.id();
    if !wait_until(
        || {
            !Path::new(&format!("/proc/{pid}")).exists()
                || child.try_wait().ok().flatten().is_some()
        },
        60,
    ) {
        let _ = child.kill();
        let _ = child.wait();
        return Err("the command was held by a reader that does not read".into());
    }
    let out = succeeded(child.wait_with_output().unwrap())?;
    expect(
        "stdout",
        String::from_utf8_lossy(&out.stdout).trim(),
        "done",
    )?;
    let mut text = String::new();
    let _ = reader.read_to_string(&mut text);
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{l:?}: {e}")))
        .collect::<Result<_, _>>()?;
    let written = lines.iter().filter(|r| r["type"] == "fs_denied").count() as u64;
    let fs = read_json(&report)?["filesystem"].clone();
    expect("denied", &fs["denied"].to_string(), "2000")?;
    let held = fs["stream_suppressed"].as_u64().unwrap_or(0);
    if written == 0 || held == 0 || written + held != 2000 {
        return Err(format!("written {written}, held back {held}"));
    }
    Ok(())
}

/// A file name is any bytes: one that is not UTF-8, refused outside the write roots, is
/// a line (the name with U+FFFD, and its bytes in `path_hex`) and a report entry; it used
/// to drop the line and crash the shim when it wrote the report.
fn a_file_name_that_is_not_utf8_is_reported_not_fatal() -> TestResult {
    let fx = Fixture::new("violations-bytes");
    let w = fx.mkdir("work");
    let (log, report) = (fx.path("v.jsonl"), fx.path("report.json"));
    let script = r#"touch "$(printf '/etc/shim-\377')" 2>/dev/null; true"#;
    succeeded(
        fx.shim(
            &args![
                "--allow-write",
                &w,
                "--violations",
                &log,
                "--report-file",
                &report,
                "--quiet-denials"
            ],
            &["sh", "-c", script],
        )
        .output()
        .unwrap(),
    )?;
    let r = records(&log)?;
    has(
        &r,
        "create",
        Path::new("/etc/shim-\u{fffd}"),
        "outside_write_roots",
    )?;
    let hex = r.iter().find_map(|l| l["path_hex"].as_str()).unwrap_or("");
    expect("path_hex", hex, "2f6574632f7368696d2dff")?;
    let fs = read_json(&report)?["filesystem"].clone();
    expect(
        "report path",
        fs["paths"][0]["path"].as_str().unwrap_or(""),
        "/etc/shim-\u{fffd}",
    )?;
    Ok(())
}

/// CPU time used so far by every thread of `pid`, in milliseconds (`/proc/PID/stat`
/// fields 14 and 15, in clock ticks).
fn cpu_ms(pid: u32) -> Result<u64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    let after_name = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let fields: Vec<u64> = after_name
        .split(' ')
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse().ok())
        .collect();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|hz| u64::try_from(hz).ok())
        .filter(|hz| *hz > 0)
        .ok_or("no CLK_TCK")?;
    match fields[..] {
        [utime, stime] => Ok((utime + stime) * 1000 / hz),
        _ => Err(format!("unreadable /proc/{pid}/stat: {stat}")),
    }
}

/// Once every task of the sandbox has exited, the supervisor's receive fails at once;
/// its thread ends then instead of spinning on it (it did, a core at 100% until the shim
/// exited). The shim is held after the run at its report, a FIFO nobody reads yet, and
/// its CPU time is read over half a second there.
fn the_supervisor_rests_once_the_sandbox_is_gone() -> TestResult {
    let fx = Fixture::new("violations-rest");
    let w = fx.mkdir("work");
    let log = fx.path("v.jsonl");
    let fifo = fx.path("report.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).map_err(|e| e.to_string())?;
    let mut child = fx
        .shim(
            &args![
                "--allow-write",
                &w,
                "--violations",
                &log,
                "--report-file",
                &fifo,
                "--quiet-denials"
            ],
            &["sh", "-c", "touch /etc/shim-rest 2>/dev/null; true"],
        )
        .spawn()
        .unwrap();
    let pid = child.id();
    // Opening a FIFO to write waits for a reader in `wait_for_partner`.
    let held = wait_until(
        || {
            std::fs::read_to_string(format!("/proc/{pid}/wchan"))
                .is_ok_and(|w| w.trim() == "wait_for_partner")
        },
        30,
    );
    let used = if held {
        cpu_ms(pid).and_then(|before| {
            std::thread::sleep(std::time::Duration::from_millis(500));
            Ok(cpu_ms(pid)? - before)
        })
    } else {
        Err("the shim never reached its report".to_owned())
    };
    // Read the report, which lets the shim end.
    let report = std::fs::read_to_string(&fifo).unwrap_or_default();
    let status = child.wait().unwrap();
    let used = used?;
    if used > 100 {
        return Err(format!(
            "the shim used {used} ms of CPU in 0.5 s after its sandbox was gone"
        ));
    }
    if !status.success() {
        return Err(format!("shim: {status}"));
    }
    let v: Value = serde_json::from_str(report.trim()).map_err(|e| format!("{report:?}: {e}"))?;
    expect("denied", &v["filesystem"]["denied"].to_string(), "1")?;
    has(
        &records(&log)?,
        "create",
        Path::new("/etc/shim-rest"),
        "outside_write_roots",
    )
}

/// Runs the Python `calls` (each `t(NAME, CALLABLE)`, printing `NAME ok` or `NAME ERRNO`,
/// what the caller saw) in a sandbox with the writable root `work/` (holding a file `f`)
/// and `--violations`; returns what it printed and the paths of its `fs_denied` records.
fn calls_and_records(tag: &str, calls: &str) -> Result<(String, Vec<String>), String> {
    let fx = Fixture::new(tag);
    let w = fx.mkdir("work");
    std::fs::write(w.join("f"), "x").unwrap();
    // Beside the root (read-only inside): a file whose mode lets the command write it
    // (mode 0666: root's command is not its owner on the host), and one mode 0444.
    let outside = fx.mkdir("outside");
    std::fs::write(outside.join("mine"), "x").unwrap();
    std::fs::set_permissions(
        outside.join("mine"),
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    std::fs::write(outside.join("ro"), "x").unwrap();
    std::fs::set_permissions(
        outside.join("ro"),
        std::os::unix::fs::PermissionsExt::from_mode(0o444),
    )
    .unwrap();
    let log = fx.path("v.jsonl");
    let script = format!(
        "import errno, os\nW = {w:?}\n\
         def t(name, f):\n    try:\n        f(); print(name, 'ok')\n    except OSError as e:\n        print(name, errno.errorcode[e.errno])\n\
         {calls}",
        w = w.display().to_string()
    );
    let out = fx
        .shim(
            &args!["--allow-write", &w, "--violations", &log, "--quiet-denials"],
            &["/usr/bin/python3", "-c", &script],
        )
        .output()
        .unwrap();
    let out = stdout(&succeeded(out)?);
    let scratch = format!("{}/", fx.dir.0.display());
    let paths = records(&log)?
        .iter()
        .filter(|r| r["type"] == "fs_denied")
        .map(|r| {
            let path = r["path"].as_str().unwrap_or("");
            let path = path.strip_prefix(scratch.as_str()).unwrap_or(path);
            format!("{} {path}", r["op"].as_str().unwrap_or(""))
        })
        .collect();
    Ok((out, paths))
}

/// Expect the caller to have seen `seen` and the walls to have refused only `refused`.
fn only_the_walls(tag: &str, calls: &str, seen: &str, refused: &[&str]) -> TestResult {
    let (out, records) = calls_and_records(tag, calls)?;
    expect("what the calls returned", &out, seen)?;
    if records != refused {
        return Err(format!(
            "fs_denied records: expected {refused:?}, got {records:?}"
        ));
    }
    Ok(())
}

/// `mkdir -p` makes every directory on the way: those that exist answer EEXIST before the
/// read-only mount is looked at, and only the new one is refused by the walls.
fn mkdir_of_what_exists_is_no_violation() -> TestResult {
    only_the_walls(
        "violations-eexist",
        "t('mkdir /usr', lambda: os.mkdir('/usr'))\n\
         t('mkdir /', lambda: os.mkdir('/'))\n\
         t('symlink /etc/passwd', lambda: os.symlink('x', '/etc/passwd'))\n\
         t('mknod /etc/passwd', lambda: os.mknod('/etc/passwd'))\n\
         t('link /etc/passwd', lambda: os.link('/etc/group', '/etc/passwd'))\n\
         t('open excl /etc/passwd', lambda: os.open('/etc/passwd', os.O_WRONLY | os.O_CREAT | os.O_EXCL))\n\
         t('mkdir /usr/shim-new', lambda: os.makedirs('/usr/shim-new'))",
        "mkdir /usr EEXIST\nmkdir / EEXIST\nsymlink /etc/passwd EEXIST\nmknod /etc/passwd EEXIST\n\
         link /etc/passwd EEXIST\nopen excl /etc/passwd EEXIST\nmkdir /usr/shim-new EROFS",
        &["mkdir /usr/shim-new"],
    )
}

/// An empty path is ENOENT before anything else (apt's `unlink("")`).
fn an_empty_path_is_no_violation() -> TestResult {
    only_the_walls(
        "violations-empty",
        "os.chdir('/etc')\n\
         t('unlink empty', lambda: os.unlink(''))\n\
         t('open empty', lambda: os.open('', os.O_WRONLY | os.O_CREAT))\n\
         t('mkdir empty', lambda: os.mkdir(''))\n\
         t('symlink to empty', lambda: os.symlink('', '/etc/shim-link'))",
        "unlink empty ENOENT\nopen empty ENOENT\nmkdir empty ENOENT\nsymlink to empty ENOENT",
        &[],
    )
}

/// What is not there cannot be changed or written into (ENOENT), before the walls are
/// asked. Removing or renaming asks the mount first: there the walls answer (EROFS),
/// and `mv`, which takes ENOENT for "already gone", would fail on that EROFS: reported.
fn a_missing_path_or_parent_is_no_violation() -> TestResult {
    only_the_walls(
        "violations-enoent",
        "t('chmod missing', lambda: os.chmod('/etc/shim-missing', 0o600))\n\
         t('truncate missing', lambda: os.truncate('/etc/shim-missing', 0))\n\
         t('open missing', lambda: os.open('/etc/shim-missing', os.O_WRONLY))\n\
         t('mkdir in missing', lambda: os.mkdir('/usr/shim-missing/x'))\n\
         t('link missing', lambda: os.link('/etc/shim-missing', '/etc/shim-other'))\n\
         t('unlink in missing', lambda: os.unlink('/usr/shim-missing/x'))\n\
         t('unlink missing', lambda: os.unlink('/etc/shim-missing'))",
        "chmod missing ENOENT\ntruncate missing ENOENT\nopen missing ENOENT\n\
         mkdir in missing ENOENT\nlink missing ENOENT\nunlink in missing ENOENT\n\
         unlink missing EROFS",
        &["unlink /etc/shim-missing"],
    )
}

fn a_parent_that_is_a_file_is_no_violation() -> TestResult {
    only_the_walls(
        "violations-enotdir",
        "t('create under a file', lambda: os.open('/etc/passwd/x', os.O_WRONLY | os.O_CREAT))\n\
         t('mkdir under a file', lambda: os.mkdir('/etc/passwd/x'))\n\
         t('unlink under a file', lambda: os.unlink('/etc/passwd/x'))",
        "create under a file ENOTDIR\nmkdir under a file ENOTDIR\nunlink under a file ENOTDIR",
        &[],
    )
}

/// A rename from a writable root into the read-only tree crosses mounts (EXDEV, the
/// same with any --allow-write); `mv` then removes the target first (EROFS), which is
/// what is reported, with the hint that would let it work.
fn a_rename_across_mounts_is_reported_by_its_copy() -> TestResult {
    only_the_walls(
        "violations-exdev",
        "t('rename out', lambda: os.rename(W + '/f', '/etc/shim-moved'))\n\
         import subprocess\n\
         print('mv', subprocess.run(['mv', W + '/f', '/etc/shim-moved'], stderr=subprocess.DEVNULL).returncode)",
        "rename out EXDEV\nmv 1",
        &["unlink /etc/shim-moved"],
    )
}

/// `O_CREAT` of a file that exists, opened for reading only, writes nothing: the kernel
/// lets it through the read-only mount. A file whose mode refuses the caller is EACCES
/// before the mount is asked (the caller, root inside, holds no capability).
fn o_creat_of_an_existing_file_read_only_is_no_violation() -> TestResult {
    only_the_walls(
        "violations-creat-read",
        "t('open creat read', lambda: os.close(os.open('outside/mine', os.O_RDONLY | os.O_CREAT)))\n\
         t('open creat write', lambda: os.open('outside/mine', os.O_WRONLY | os.O_CREAT))\n\
         t('open read-only mode', lambda: os.open('outside/ro', os.O_WRONLY))",
        "open creat read ok\nopen creat write EROFS\nopen read-only mode EACCES",
        &["open_write outside/mine"],
    )
}

/// `O_TRUNC` asks the mount for write access before the file's mode is checked
/// (`do_open`): a shell's `>` onto a file of the read-only tree is the walls' `EROFS`,
/// even where the mode would refuse it too, and is reported.
fn o_trunc_on_the_read_only_tree_is_the_walls() -> TestResult {
    only_the_walls(
        "violations-trunc",
        "t('open trunc read-only mode', lambda: os.open('outside/ro', os.O_WRONLY | os.O_TRUNC))\n\
         t('open creat trunc', lambda: os.open('outside/ro', os.O_WRONLY | os.O_CREAT | os.O_TRUNC))",
        "open trunc read-only mode EROFS\nopen creat trunc EROFS",
        &["open_write outside/ro", "open_write outside/ro"],
    )
}

/// The private temporary directory is writable: nothing there is refused.
fn the_private_tmp_is_no_violation() -> TestResult {
    only_the_walls(
        "violations-tmp",
        "t('mkdir /tmp/x', lambda: os.makedirs('/tmp/x/y'))\n\
         t('write /var/tmp', lambda: open('/var/tmp/f', 'w').write('x'))\n\
         t('rename in /tmp', lambda: os.rename('/tmp/x/y', '/tmp/z'))",
        "mkdir /tmp/x ok\nwrite /var/tmp ok\nrename in /tmp ok",
        &[],
    )
}
