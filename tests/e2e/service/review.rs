//! `mediator diff` and `mediator test` (design section 21) as a reviewer runs them: the
//! project's own example policy against its expectations file (what CI runs), a widened
//! and a narrowed copy of it, a running mediator's authorities as OLD (`--admin`, its
//! token from `MEDIATOR_ADMIN_TOKEN`), and the bad inputs that exit 2 with one clear
//! message.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::harness::Case;
use e2e::{Fixture, agent_a_spec, case, sha256_hex};
use serde_json::{Value, json};

use crate::support::{bin, mediator};

/// The examples directory of the repository.
fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// Runs the binary with `args` (and `env`), to completion.
async fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Output> {
    let mut cmd = tokio::process::Command::new(bin());
    cmd.args(args)
        .env_remove("MEDIATOR_ADMIN_TOKEN")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .context("the command did not finish in 30 s")?
        .context("spawning mediator")
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What CI runs: the example policy holds every expectation of its expectations file.
async fn the_example_policy_holds_its_expectations() -> Result<()> {
    let (conf, expect) = (
        examples().join("mediator.toml"),
        examples().join("mediator.test.toml"),
    );
    let out = run(
        &[
            "test",
            "--config",
            &conf.to_string_lossy(),
            &expect.to_string_lossy(),
        ],
        &[],
    )
    .await?;
    let text = stdout(&out);
    ensure!(
        code(&out) == 0,
        "exit {}: {text}{}",
        code(&out),
        stderr(&out)
    );
    ensure!(text.contains(" passed, 0 failed"), "{text}");
    ensure!(!text.contains("FAIL"), "{text}");
    // A failing expectation fails the run, and says what was decided and why.
    let dir = tempfile::tempdir()?;
    let wrong = dir.path().join("wrong.toml");
    std::fs::write(
        &wrong,
        "[[expect]]\nauthority = \"agent-a\"\ntarget = \"https://gist.githubusercontent.com/\"\ndecision = \"allow\"\n",
    )?;
    let out = run(
        &[
            "test",
            "--config",
            &conf.to_string_lossy(),
            &wrong.to_string_lossy(),
        ],
        &[],
    )
    .await?;
    let text = stdout(&out);
    ensure!(code(&out) == 1, "exit {}: {text}", code(&out));
    ensure!(
        text.contains("FAIL")
            && text.contains("decided:  deny denied_by_rule")
            && text.contains("0 passed, 1 failed"),
        "{text}"
    );
    Ok(())
}

/// The example, widened three ways in a copy: `diff` names each widening and exits 3; a
/// narrowed copy exits 1; a reordered one 0.
async fn diff_tells_widening_from_narrowing_and_rewriting() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let old = examples().join("mediator.toml");
    let text = std::fs::read_to_string(&old)?;
    let allow = r#"allow = ["origin.test", "api.github.com:443", "*.githubusercontent.com:443"]"#;
    ensure!(text.contains(allow), "the example's agent-a moved");
    let copy = |name: &str, from: &str, to: &str| -> Result<String> {
        let p = dir.path().join(name);
        ensure!(text.contains(from), "{from}");
        std::fs::write(&p, text.replace(from, to))?;
        Ok(p.to_string_lossy().into_owned())
    };
    let wider = copy(
        "wider.toml",
        allow,
        r#"allow = ["origin.test", "api.github.com", "*.githubusercontent.com:443", "*.github.com:443"]"#,
    )?;
    let wider = {
        let t = std::fs::read_to_string(&wider)?.replace(
            r#"allow_private = ["127.0.0.1/32"]"#,
            r#"allow_private = ["127.0.0.1/32", "10.0.0.0/8"]"#,
        );
        std::fs::write(&wider, t)?;
        wider
    };
    let old = old.to_string_lossy();
    let out = run(&["diff", &old, &wider], &[]).await?;
    let t = stdout(&out);
    ensure!(code(&out) == 3, "exit {}: {t}{}", code(&out), stderr(&out));
    for want in [
        "authority \"agent-a\" (changed)",
        "+ widened  port",
        "+ widened  host            *.github.com:443",
        "+ widened  allow_private   10.0.0.0/8",
        "WIDENED (exit 3)",
    ] {
        ensure!(t.contains(want), "no {want:?} in:\n{t}");
    }
    let out = run(&["diff", "--json", &old, &wider], &[]).await?;
    let v: Value = serde_json::from_slice(&out.stdout)?;
    ensure!(v["outcome"] == "widened" && v["exit"] == 3, "{v:#}");
    let narrower = copy(
        "narrower.toml",
        allow,
        r#"allow = ["origin.test", "api.github.com:443"]"#,
    )?;
    let out = run(&["diff", &old, &narrower], &[]).await?;
    ensure!(code(&out) == 1, "exit {}: {}", code(&out), stdout(&out));
    let same = copy(
        "reordered.toml",
        allow,
        r#"allow = ["*.githubusercontent.com:443", "API.GitHub.com:443", "origin.test", "raw.githubusercontent.com:443"]"#,
    )?;
    let out = run(&["diff", &old, &same], &[]).await?;
    ensure!(code(&out) == 0, "exit {}: {}", code(&out), stdout(&out));
    Ok(())
}

/// `--admin`: OLD is what a running mediator serves; its API authorities are kept by a
/// reload, so never reported removed; without the token it is one line and exit 2.
async fn diff_and_test_against_a_running_mediator() -> Result<()> {
    let token = "review-admin-token";
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .listen_line(&format!("admin_token_sha256 = \"{}\"", sha256_hex(token)))
            .authority(agent_a_spec()),
    )
    .await?;
    let m = &fx.mediator;
    let body = json!({"name": "task-1", "allow": ["x.test"]}).to_string();
    let resp = m
        .admin("POST", "/v1/authorities", Some(&body), Some(token))
        .await?;
    ensure!(resp.status == 201, "{}", resp.text());
    let url = format!("http://{}", m.admin_addr()?);
    let file = m.config_path().to_string_lossy().into_owned();
    let env = [("MEDIATOR_ADMIN_TOKEN", token)];
    let out = run(&["diff", "--admin", &url, &file], &env).await?;
    let t = stdout(&out);
    ensure!(code(&out) == 0, "exit {}: {t}{}", code(&out), stderr(&out));
    ensure!(
        t.contains("(task-1) is kept by a reload") && !t.contains("removed"),
        "{t}"
    );
    // The file widened: agent-a's allow_private grows.
    let dir = tempfile::tempdir()?;
    let wider = dir.path().join("wider.toml");
    let text = std::fs::read_to_string(m.config_path())?;
    std::fs::write(
        &wider,
        text.replace("\"127.0.0.0/8\"", "\"127.0.0.0/8\", \"10.0.0.0/8\""),
    )?;
    let out = run(&["diff", "--admin", &url, &wider.to_string_lossy()], &env).await?;
    ensure!(code(&out) == 3, "exit {}: {}", code(&out), stdout(&out));
    // Without the token: one line, exit 2.
    let out = run(&["diff", "--admin", &url, &file], &[]).await?;
    let e = stderr(&out);
    ensure!(code(&out) == 2, "exit {}: {e}", code(&out));
    ensure!(
        e.trim().lines().count() == 1 && e.contains("MEDIATOR_ADMIN_TOKEN"),
        "{e}"
    );
    // `test --admin`: judged by the grants it serves, API authorities included.
    let expect = dir.path().join("expect.toml");
    std::fs::write(
        &expect,
        "hosts = { \"x.test\" = [\"192.0.2.10\"] }\n[[expect]]\nauthority = \"task-1\"\ntarget = \"http://x.test/\"\ndecision = \"deny\"\nreason = \"special_address\"\n[[expect]]\nauthority = \"agent-a\"\ntarget = \"x.test:443\"\ndecision = \"deny\"\nreason = \"not_in_allowlist\"\n",
    )?;
    let out = run(&["test", "--admin", &url, &expect.to_string_lossy()], &env).await?;
    let t = stdout(&out);
    ensure!(code(&out) == 0, "exit {}: {t}{}", code(&out), stderr(&out));
    ensure!(t.contains("2 passed, 0 failed"), "{t}");
    Ok(())
}

/// Bad input exits 2: a configuration that does not validate (with its location, as
/// `check` says it), an expectations file with an unknown key (named), an admin API
/// that cannot be reached (one line).
async fn bad_input_is_named_and_exits_2() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[authority]]\nname = \"a\"\nallow = [\"*.com\"]\n")?;
    let good = examples().join("mediator.toml");
    let (bad_s, good_s) = (bad.to_string_lossy(), good.to_string_lossy());
    let out = run(&["diff", &good_s, &bad_s], &[]).await?;
    let e = stderr(&out);
    ensure!(code(&out) == 2, "exit {}: {e}", code(&out));
    ensure!(
        e.contains(&format!("{bad_s}:3:10:")) && e.contains("*.com"),
        "{e}"
    );
    let expect = examples().join("mediator.test.toml");
    let out = run(
        &["test", "--config", &bad_s, &expect.to_string_lossy()],
        &[],
    )
    .await?;
    ensure!(
        code(&out) == 2 && stderr(&out).contains(&format!("{bad_s}:3:10:")),
        "{}",
        stderr(&out)
    );
    let unknown = dir.path().join("unknown.toml");
    std::fs::write(
        &unknown,
        "[[expect]]\nauthority = \"agent-a\"\ntarget = \"x.test\"\ndecision = \"deny\"\nverdict = \"deny\"\n",
    )?;
    let out = run(
        &["test", "--config", &good_s, &unknown.to_string_lossy()],
        &[],
    )
    .await?;
    let e = stderr(&out);
    ensure!(
        code(&out) == 2 && e.contains("unknown field `verdict`"),
        "{e}"
    );
    // A port nothing listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let out = run(
        &["diff", "--admin", &format!("127.0.0.1:{port}"), &good_s],
        &[],
    )
    .await?;
    let e = stderr(&out);
    ensure!(
        code(&out) == 2
            && e.trim().lines().count() == 1
            && e.contains("cannot reach the admin API"),
        "{e}"
    );
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(the_example_policy_holds_its_expectations),
        case!(diff_tells_widening_from_narrowing_and_rewriting),
        case!(diff_and_test_against_a_running_mediator),
        case!(bad_input_is_named_and_exits_2),
    ]
}
