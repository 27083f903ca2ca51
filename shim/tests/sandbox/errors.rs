//! Runs the shim refuses, before anything starts: exit status 125 and one message that
//! names what is wrong in the user's own terms (the flag, the value, the file).

use std::process::{Command, Output};

use crate::support::{SHIM, Scratch};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        missing_mediator_socket_is_a_clear_error,
        a_missing_allow_write_path_is_reported_once,
        an_authority_the_config_lacks_is_named_with_the_ones_it_has,
        a_bad_allow_value_is_named_with_its_flag,
        an_embedded_decision_log_that_cannot_be_opened_is_named,
        a_report_file_that_is_a_directory_is_refused_before_the_run,
    ]
}

/// `shim ARGS -- true`, which must be refused: its stderr.
fn refused(args: &[&str]) -> Result<String, String> {
    let out: Output = Command::new(SHIM)
        .args(args)
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.code() != Some(125) {
        return Err(format!("{:?} {err}", out.status));
    }
    Ok(err)
}

fn missing_mediator_socket_is_a_clear_error() -> TestResult {
    let err = refused(&["--mediator-socket", "/nonexistent/x.sock"])?;
    // Names the socket and says what makes it: a running mediator.
    if !err.contains("/nonexistent/x.sock") || !err.contains("is it running") {
        return Err(err);
    }
    Ok(())
}

fn a_missing_allow_write_path_is_reported_once() -> TestResult {
    let err = refused(&[
        "--allow",
        "x.test",
        "--allow-write",
        "/nonexistent-shim-dir",
    ])?;
    if err.matches("os error 2").count() != 1 {
        return Err(err);
    }
    Ok(())
}

fn an_authority_the_config_lacks_is_named_with_the_ones_it_has() -> TestResult {
    let s = Scratch::new("zed");
    let cfg = s.path("mediator.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nsocket_dir = {:?}\n[[authority]]\nname = \"agent-a\"\n\
             [[authority]]\nname = \"agent-b\"\n",
            s.path("sockets")
        ),
    )
    .unwrap();
    let err = refused(&["--config", cfg.to_str().unwrap(), "--authority", "zed"])?;
    let want = format!(
        "shim: authority \"zed\" is not in {} (its authorities: agent-a, agent-b), and no \
         socket {} exists, as one added through the admin API would have\n",
        cfg.display(),
        s.path("sockets/zed.sock").display()
    );
    if err != want {
        return Err(format!("expected {want:?}, got {err:?}"));
    }
    Ok(())
}

fn a_bad_allow_value_is_named_with_its_flag() -> TestResult {
    let err = refused(&["--allow", "ok.example", "--allow", "*.com"])?;
    // The flag and the value the user typed, not a position in a TOML document.
    if !err.starts_with("shim: --allow '*.com': ") || err.lines().count() != 1 {
        return Err(err);
    }
    if err.contains("embedded grant") || err.contains(":2:") {
        return Err(err);
    }
    Ok(())
}

/// The embedded mediator starts with the sandbox's first connection, but what would stop
/// its start (here the decision log) is checked before: `true`, which opens none, is
/// still refused.
fn an_embedded_decision_log_that_cannot_be_opened_is_named() -> TestResult {
    let err = refused(&[
        "--no-capture",
        "--allow",
        "x.test",
        "--decision-log",
        "/nonexistent-shim-dir/decisions.log",
    ])?;
    if !err.contains("cannot open decision log /nonexistent-shim-dir/decisions.log") {
        return Err(err);
    }
    Ok(())
}

/// The report file is opened before the command runs: one that cannot be a file is
/// refused then, not after the command ran.
fn a_report_file_that_is_a_directory_is_refused_before_the_run() -> TestResult {
    let s = Scratch::new("reportdir");
    let err = refused(&[
        "--no-capture",
        "--allow",
        "x.test",
        "--report-file",
        s.0.to_str().unwrap(),
    ])?;
    if !err.contains(&format!("--report-file {}: is a directory", s.0.display())) {
        return Err(err);
    }
    Ok(())
}
