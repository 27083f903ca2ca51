//! The run's lifecycle: the PID namespace shows only the sandbox, the whole tree dies
//! with the command and with the shim (even by SIGKILL, which also leaves no placeholder
//! or CA file behind), signals reach the command, exit statuses pass through, and the
//! run's own records (decision log, violations, report) exist from the start and are
//! the shim's alone, even in a write root.

use std::process::{Child, Stdio};

use nix::sys::signal::Signal;

use crate::support::{
    Fixture, SHIM, Scratch, entries, expect, host_has_process_with_arg, marker, signal, wait_until,
    write_ca,
};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        background_children_die_when_the_command_exits,
        background_children_placeholders_and_ca_files_go_when_the_shim_is_killed,
        proc_inside_shows_only_sandbox_processes,
        exit_status_passes_through_and_signals_become_128_plus_n,
        sigterm_to_the_shim_reaches_the_command,
        a_run_that_decides_nothing_still_leaves_its_decision_log,
        the_runs_own_records_in_a_write_root_are_kept_from_the_command,
    ]
}

fn background_children_die_when_the_command_exits() -> TestResult {
    let fx = Fixture::new("bg");
    let marker = marker(900_000, 50_000);
    fx.check(&[], &args!["spawn-and-exit", &marker], "ok")?;
    if !wait_until(|| !host_has_process_with_arg(&marker), 3) {
        return Err(format!("sleep {marker} survived the command"));
    }
    Ok(())
}

fn background_children_placeholders_and_ca_files_go_when_the_shim_is_killed() -> TestResult {
    let fx = Fixture::new("kill");
    let w = fx.mkdir("work");
    let tmp = fx.mkdir("tmp");
    let ca = fx.path("ca.pem");
    write_ca(&ca);
    let marker = marker(950_000, 40_000);
    let mut child: Child = fx
        .shim(
            &args!["--allow-write", &w, "--ca-cert", &ca],
            &["sh", "-c", &format!("sleep {marker} & sleep {marker}")],
        )
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    if !wait_until(|| host_has_process_with_arg(&marker), 5) {
        let _ = child.kill();
        return Err("the command did not start".into());
    }
    if !w.join(".mcp.json").exists() {
        return Err("expected a placeholder while running".into());
    }
    if entries(&tmp).len() != 1 {
        return Err(format!("expected the CA directory: {:?}", entries(&tmp)));
    }
    signal(&child, Signal::SIGKILL);
    let _ = child.wait();
    if !wait_until(|| !host_has_process_with_arg(&marker), 3) {
        return Err(format!("sleep {marker} survived SIGKILL of the shim"));
    }
    if !wait_until(|| entries(&w).is_empty(), 3) {
        return Err(format!("leftover files: {:?}", entries(&w)));
    }
    if !wait_until(|| entries(&tmp).is_empty(), 3) {
        return Err(format!("leftover CA files: {:?}", entries(&tmp)));
    }
    Ok(())
}

fn proc_inside_shows_only_sandbox_processes() -> TestResult {
    let fx = Fixture::new("ps");
    // init (1) and the probe (2).
    fx.check(&[], &args!["pids"], "[1, 2]")?;
    let out = fx.shim(&[], &["ps", "-e", "-o", "pid="]).output().unwrap();
    let pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if pids != ["1", "2"] {
        return Err(format!("ps shows {pids:?}"));
    }
    Ok(())
}

fn exit_status_passes_through_and_signals_become_128_plus_n() -> TestResult {
    let fx = Fixture::new("exit");
    let code = |command: &[&str]| {
        let out = fx.shim(&[], command).output().unwrap();
        format!("{:?}", out.status.code())
    };
    expect("exit 7", &code(&["sh", "-c", "exit 7"]), "Some(7)")?;
    expect(
        "killed by SIGKILL",
        &code(&["sh", "-c", "kill -KILL $$"]),
        "Some(137)",
    )?;
    expect(
        "command not found",
        &code(&["/nonexistent/cmd"]),
        "Some(127)",
    )
}

fn sigterm_to_the_shim_reaches_the_command() -> TestResult {
    let fx = Fixture::new("sigterm");
    let w = fx.mkdir("work");
    let script = format!(
        "trap 'exit 42' TERM; touch {}/started; while :; do sleep 0.05; done",
        w.display()
    );
    let mut child = fx
        .shim(&args!["--allow-write", &w], &["sh", "-c", &script])
        .spawn()
        .unwrap();
    if !wait_until(|| w.join("started").exists(), 5) {
        let _ = child.kill();
        return Err("did not start".into());
    }
    signal(&child, Signal::SIGTERM);
    let status = child.wait().unwrap();
    expect(
        "status after SIGTERM",
        &format!("{:?}", status.code()),
        "Some(42)",
    )
}

/// The embedded mediator starts with the first connection; the decision log's file is
/// there from the start all the same (empty, mode 0600, as the mediator makes it), so an
/// operator tailing it, or a run that decided nothing, finds it.
fn a_run_that_decides_nothing_still_leaves_its_decision_log() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("quietlog");
    let log = s.path("decisions.log");
    let out = std::process::Command::new(SHIM)
        .args(["--no-capture", "--allow", "x.test", "--decision-log"])
        .arg(&log)
        .args(["--", "true"])
        .current_dir(&s.0)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(format!(
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta = std::fs::metadata(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    if meta.len() != 0 || meta.permissions().mode() & 0o777 != 0o600 {
        return Err(format!(
            "{} bytes, mode {:o}",
            meta.len(),
            meta.permissions().mode() & 0o777
        ));
    }
    Ok(())
}

/// A decision log, violations file and report file inside the command's write root: the
/// command can neither write lines into them nor read them, and moving the report's
/// directory aside for a link to another place does not move the report there (it is
/// written through the descriptor opened before the command ran).
fn the_runs_own_records_in_a_write_root_are_kept_from_the_command() -> TestResult {
    let s = Scratch::new("ownrecords");
    let w = s.path("work");
    let victim = s.path("victim");
    std::fs::create_dir_all(w.join("out")).unwrap();
    std::fs::create_dir_all(&victim).unwrap();
    let (log, violations, report) = (w.join("d.log"), w.join("v.log"), w.join("out/r.json"));
    let script = format!(
        "for f in {log} {violations} {report}; do echo forged >> $f; cat $f; done; \
         mv {w}/out {w}/moved && ln -s {victim} {w}/out && echo swapped",
        log = log.display(),
        violations = violations.display(),
        report = report.display(),
        w = w.display(),
        victim = victim.display(),
    );
    let out = std::process::Command::new(SHIM)
        .args(["--no-capture", "--allow", "x.test", "--allow-write"])
        .arg(&w)
        .arg("--decision-log")
        .arg(&log)
        .arg("--violations")
        .arg(&violations)
        .arg("--report-file")
        .arg(&report)
        .args(["--", "sh", "-c", &script])
        .current_dir(&s.0)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || stdout.trim() != "swapped" {
        return Err(format!(
            "{:?}: stdout {stdout:?}, stderr {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    for p in [&log, &violations] {
        if text(p).contains("forged") {
            return Err(format!(
                "{} has a line from the command: {}",
                p.display(),
                text(p)
            ));
        }
    }
    let moved = w.join("moved/r.json");
    let report_text = text(&moved);
    if !report_text.starts_with("{\"report\":\"shim\"") || report_text.contains("forged") {
        return Err(format!("{}: {report_text:?}", moved.display()));
    }
    if victim.join("r.json").exists() {
        return Err("the report followed the link the command put in place".into());
    }
    // The command's tries are refused violations of the masked paths.
    if text(&violations).matches("\"rule\":\"deny_read\"").count() != 3 {
        return Err(format!(
            "expected 3 deny_read records: {}",
            text(&violations)
        ));
    }
    Ok(())
}
