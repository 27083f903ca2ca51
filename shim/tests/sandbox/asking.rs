//! Asking the host and invocations the host can name (design section 20). Embedded mode
//! with `--control`: a grant miss is held while the host, holding the control socket
//! open, is asked (`{"ask": ...}` lines); its `allow_via` (a grant made on the spot)
//! lets the same client call through, attributed to the new authority, a `deny` answers
//! the client with its words, and with no connection open a miss stands at once. Every
//! record and the report carry the run's invocation id and `--tag`s, which the command
//! can neither forge nor remove: in socket mode the shim's PROXY v2 header comes first on
//! the authority's socket, in embedded mode the labels never travel on the command's
//! bytes at all.
//!
//! Network rule: the origin and the stand-in mediator are on the host's 127.0.0.1; the
//! command reaches them only through the shim's proxy listener inside its namespace.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::capture::{http_origin, stand_in};
use crate::support::{SHIM, Scratch, expect, read_json, shim_waiting};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        embedded_control_asks_and_an_allow_via_grant_lets_the_same_call_through,
        a_deny_answer_and_a_miss_with_nobody_to_ask,
        socket_mode_labels_every_connection_and_the_command_cannot_forge_them,
        embedded_labels_cannot_be_forged_by_the_command,
        the_manuals_host_loop_answers_on_the_control_socket,
    ]
}

/// Embedded mode's flags with `--control`, a decision log and a report in `s`.
fn embedded_flags(s: &Scratch, tag: &str) -> Vec<String> {
    [
        "--no-capture",
        "--allow",
        "none.test",
        "--allow-private",
        "127.0.0.1",
        "--resolve",
        "origin.test=127.0.0.1",
        "--tag",
        tag,
        "--control",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([
        s.path("control.sock").display().to_string(),
        "--decision-log".into(),
        s.path("decisions.log").display().to_string(),
        "--report-file".into(),
        s.path("report.json").display().to_string(),
    ])
    .collect()
}

/// The script: waits for the word, then one curl (its body and CONNECT status).
fn one_call(port: u16) -> String {
    format!("read go <&5\ncurl -s -p -w '\\n%{{http_connect}}\\n' -m 20 http://origin.test:{port}/")
}

/// A connection to the control socket, held open (the host's).
struct Host {
    out: UnixStream,
    lines: BufReader<UnixStream>,
}

impl Host {
    /// Connects once the shim has made the socket, and waits until the shim serves this
    /// connection (an empty command is answered): from then on it gets every question.
    fn connect(path: &Path) -> Result<Self, String> {
        if !crate::support::wait_until(|| path.exists(), 10) {
            return Err(format!("no control socket at {}", path.display()));
        }
        let out = UnixStream::connect(path).map_err(|e| format!("control socket: {e}"))?;
        out.set_read_timeout(Some(Duration::from_secs(20)))
            .map_err(|e| e.to_string())?;
        let lines = BufReader::new(out.try_clone().map_err(|e| e.to_string())?);
        let mut host = Self { out, lines };
        let served = host.send("{}")?;
        if served["ok"] != false {
            return Err(format!("an empty command must be refused: {served}"));
        }
        Ok(host)
    }

    fn next(&mut self) -> Result<serde_json::Value, String> {
        let mut line = String::new();
        self.lines
            .read_line(&mut line)
            .map_err(|e| format!("control socket: {e}"))?;
        serde_json::from_str(&line).map_err(|e| format!("{line:?}: {e}"))
    }

    fn send(&mut self, line: &str) -> Result<serde_json::Value, String> {
        writeln!(self.out, "{line}").map_err(|e| e.to_string())?;
        self.next()
    }
}

fn decisions(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn embedded_control_asks_and_an_allow_via_grant_lets_the_same_call_through() -> TestResult {
    let s = Scratch::new("ask-allow");
    let port = http_origin();
    let (child, mut go) = shim_waiting(&embedded_flags(&s, "tool=call_7"), &one_call(port));
    let mut host = Host::connect(&s.path("control.sock"))?;
    let started = Instant::now();
    writeln!(go, "go").map_err(|e| e.to_string())?;
    let q = host.next()?;
    let seen = started.elapsed();
    println!("the question reached the host {seen:?} after the command was let go");
    let q = &q["ask"];
    for (k, want) in [
        ("authority", "\"shim\""),
        ("host", "\"origin.test\""),
        ("reason", "\"not_in_allowlist\""),
        ("tags", r#"{"tool":"call_7"}"#),
    ] {
        expect(k, &q[k].to_string(), want)?;
    }
    let invocation = q["invocation"].as_str().unwrap_or_default().to_owned();
    if !invocation.starts_with("inv-") {
        return Err(format!("no invocation on the question: {q}"));
    }
    let id = q["id"].as_str().unwrap_or_default();
    let bad = host.send(&format!(
        r#"{{"answer":"{id}","allow_via":{{"allow":["*.com"]}}}}"#
    ))?;
    if bad["ok"] != false || !bad["error"].to_string().contains("*.com") {
        return Err(format!("a bad grant must be refused naming it: {bad}"));
    }
    let a = host.send(&format!(
        r#"{{"answer":"{id}","allow_via":{{"allow":["origin.test:{port}"],"allow_private":["127.0.0.1"]}}}}"#
    ))?;
    if a["ok"] != true || a["via"] != "answer-1" {
        return Err(format!("answer refused: {a}"));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    expect(
        "the same call",
        &String::from_utf8_lossy(&out.stdout),
        "hi\n200\n",
    )?;
    let lines = decisions(&s.path("decisions.log"));
    let allowed = lines
        .iter()
        .find(|l| l["event"] == "decision" && l["decision"] == "allow")
        .ok_or_else(|| format!("no allow line: {lines:?}"))?;
    expect(
        "allowed under",
        &format!(
            "{} {} {} {}",
            allowed["authority"],
            allowed["asked"]["from"],
            allowed["asked"]["outcome"],
            allowed["tags"]
        ),
        r#""answer-1" "shim" "allow_via" {"tool":"call_7"}"#,
    )?;
    expect(
        "invocation",
        &allowed["invocation"].to_string(),
        &format!("{invocation:?}"),
    )?;
    let r = read_json(&s.path("report.json"))?;
    expect(
        "report",
        &format!(
            "{} {} {} {}",
            r["invocation"], r["tags"], r["asks"][0]["outcome"], r["asks"][0]["authority"]
        ),
        &format!(r#""{invocation}" {{"tool":"call_7"}} "allow_via" "answer-1""#),
    )
}

fn a_deny_answer_and_a_miss_with_nobody_to_ask() -> TestResult {
    let s = Scratch::new("ask-deny");
    let port = http_origin();
    let script = format!(
        "{}\nread again <&5\ncurl -s -p -o /dev/null -w '%{{http_connect}}\\n' -m 20 http://origin.test:{port}/",
        one_call(port)
    );
    let (child, mut go) = shim_waiting(&embedded_flags(&s, "tool=call_8"), &script);
    let mut host = Host::connect(&s.path("control.sock"))?;
    writeln!(go, "go").map_err(|e| e.to_string())?;
    let q = host.next()?;
    let id = q["ask"]["id"].as_str().unwrap_or_default().to_owned();
    let a = host.send(&format!(r#"{{"answer":"{id}","deny":"not in this task"}}"#))?;
    if a["ok"] != true {
        return Err(format!("answer refused: {a}"));
    }
    let again = host.send(&format!(r#"{{"answer":"{id}","deny":""}}"#))?;
    if !again["error"].to_string().contains("ended already") {
        return Err(format!("a second answer must be refused: {again}"));
    }
    // The host goes away: the next miss has nobody to ask, and stands at once (had the
    // shim not seen the close yet, the question's write to it fails, and the same).
    drop(host);
    let started = Instant::now();
    writeln!(go, "again").map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if started.elapsed() > Duration::from_secs(10) {
        return Err(format!("the unasked miss waited {:?}", started.elapsed()));
    }
    // curl -p prints no body of a refused CONNECT: the words are in the records.
    expect(
        "statuses",
        &String::from_utf8_lossy(&out.stdout),
        "\n403\n403\n",
    )?;
    let lines = decisions(&s.path("decisions.log"));
    let outcomes: Vec<String> = lines
        .iter()
        .filter(|l| l["event"] == "decision")
        .map(|l| format!("{}/{}/{}", l["reason"], l["asked"]["outcome"], l["message"]))
        .collect();
    expect(
        "outcomes",
        &outcomes.join(" "),
        r#""ask_denied"/"deny"/"not in this task" "not_in_allowlist"/"no_host"/null"#,
    )
}

fn socket_mode_labels_every_connection_and_the_command_cannot_forge_them() -> TestResult {
    let s = Scratch::new("labels-sock");
    let port = http_origin();
    let (socket, heads) = stand_in(&s.0, format!("origin.test:{port}"), port);
    let out = Command::new(SHIM)
        .args(["--no-capture", "--mediator-socket"])
        .arg(&socket)
        .args(["--tag", "tool=t1", "--tag", "step=2", "--"])
        .arg(crate::support::me())
        .args([
            "probe",
            "forge-labels-via-proxy",
            &format!("origin.test:{port}"),
        ])
        .output()
        .map_err(|e| e.to_string())?;
    let answered = String::from_utf8_lossy(&out.stdout);
    let heads = heads.lock().unwrap().clone();
    let [head] = heads.as_slice() else {
        return Err(format!("one connection expected: {heads:?} ({answered})"));
    };
    let labels = head
        .lines()
        .find_map(|l| l.strip_prefix("PROXY "))
        .ok_or_else(|| format!("no labels: {head:?}"))?;
    if !labels.starts_with("0xe0=inv-")
        || !labels.contains("0xe1=step=2")
        || !labels.contains("0xe1=tool=t1")
        || labels.contains("forged")
    {
        return Err(format!("the shim's labels, and only them: {labels:?}"));
    }
    // The command's own header reached the mediator as the start of its request (a
    // malformed one), never as labels.
    expect("answered", &answered, "HTTP/1.1 403 Forbidden\n")
}

fn embedded_labels_cannot_be_forged_by_the_command() -> TestResult {
    let s = Scratch::new("labels-emb");
    let log = s.path("decisions.log");
    let out = Command::new(SHIM)
        .args(["--no-capture", "--allow", "origin.test", "--tag", "tool=t2"])
        .arg("--decision-log")
        .arg(&log)
        .arg("--")
        .arg(crate::support::me())
        .args(["probe", "forge-labels-via-proxy", "origin.test:80"])
        .output()
        .map_err(|e| e.to_string())?;
    expect(
        "answered",
        &String::from_utf8_lossy(&out.stdout),
        "HTTP/1.1 400 Bad Request\n",
    )?;
    let text = std::fs::read_to_string(&log).map_err(|e| e.to_string())?;
    let line = decisions(&log)
        .into_iter()
        .find(|l| l["event"] == "decision")
        .ok_or_else(|| format!("no decision: {text}"))?;
    if text.contains("forged")
        || line["tags"] != serde_json::json!({"tool": "t2"})
        || !line["invocation"]
            .as_str()
            .is_some_and(|i| i.starts_with("inv-"))
    {
        return Err(format!("the run's labels, never the command's: {text}"));
    }
    Ok(())
}

/// The manual's host loop (`examples/ask-host.py --control`, docs/shim.md) as a person
/// runs it: `y` allows exactly the host:port asked, through a new grant.
fn the_manuals_host_loop_answers_on_the_control_socket() -> TestResult {
    let Some(python) = ["/usr/bin/python3", "/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        return Err(format!(
            "{}python3 is not installed (Debian: python3)",
            crate::IGNORED
        ));
    };
    let s = Scratch::new("ask-script");
    let port = http_origin();
    let (child, mut go) = shim_waiting(&embedded_flags(&s, "tool=call_9"), &one_call(port));
    let control = s.path("control.sock");
    if !crate::support::wait_until(|| control.exists(), 10) {
        return Err("no control socket".into());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ask-host.py");
    let mut host = Command::new(python)
        .arg(&script)
        .arg("--control")
        .arg(&control)
        .args(["--allow-private", "127.0.0.1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut said = BufReader::new(host.stdout.take().ok_or("no stdout")?);
    let mut first = String::new();
    said.read_line(&mut first).map_err(|e| e.to_string())?;
    expect(
        "ready",
        &first,
        &format!("waiting for questions on {}\n", control.display()),
    )?;
    writeln!(host.stdin.as_mut().ok_or("no stdin")?, "y").map_err(|e| e.to_string())?;
    writeln!(go, "go").map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let _ = host.kill();
    let mut transcript = String::new();
    for _ in 0..2 {
        let mut l = String::new();
        let _ = said.read_line(&mut l);
        transcript.push_str(&l);
    }
    let _ = host.wait();
    println!("{first}{transcript}");
    expect(
        "the same call",
        &String::from_utf8_lossy(&out.stdout),
        "hi\n200\n",
    )?;
    if !transcript.contains("shim [invocation inv-") || !transcript.contains("tool=call_9") {
        return Err(format!(
            "the question as the script showed it: {transcript}"
        ));
    }
    Ok(())
}
