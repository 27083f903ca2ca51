//! Filesystem violations (design section 18): each filesystem operation of the confined
//! tree that the walls refuse, as one JSON object an agent can act on:
//!
//! ```json
//! {"type":"fs_denied","ts":"2026-12-04T10:00:00.123Z","pid":4242,"exe":"/usr/bin/touch",
//!  "op":"create","path":"/etc/x","rule":"outside_write_roots",
//!  "hint":"/etc/x is outside the write roots; write under /work or ask for --allow-write /etc"}
//! ```
//!
//! The backend observes the attempts (Linux: seccomp user notifications, `linux::notify`)
//! and hands them here; this module judges each against the [`Walls`] the backend built
//! (the same plan its mounts and Landlock enforce), writes the refused ones live to
//! `--violations PATH|fd:N`, says them on stderr, and keeps the counts and the first
//! [`MAX_PATHS`](tally::MAX_PATHS) distinct paths for `--report`. It only ever reports:
//! the kernel decided each call already, whatever is concluded here.
//!
//! Three jobs, a file each: `walls.rs` (what a write outside the writable roots hits and
//! why), `sink.rs` (where the records go, within the stream's bound), `tally.rs` (the
//! counts for the report).

mod sink;
mod tally;
mod walls;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

pub(crate) use sink::Sink;
use sink::Stream;
use tally::{Tally, Unobserved};
pub(crate) use walls::{FsOp, FsRule, HostView, Seen, Wall, Walls, normalise};

/// One attempted operation, as the backend saw it.
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    /// The task (host PID).
    pub(crate) pid: u32,
    /// What it tried.
    pub(crate) op: FsOp,
    /// The path(s) it named, absolute (a rename and a link name two).
    pub(crate) paths: Vec<PathBuf>,
}

/// One refused operation: the record of `--violations`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FsDenied {
    /// Always `fs_denied`.
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    /// When (RFC 3339, UTC).
    pub(crate) ts: String,
    /// The task (host PID).
    pub(crate) pid: u32,
    /// Its executable.
    pub(crate) exe: String,
    /// What it tried.
    pub(crate) op: FsOp,
    /// The path it named, absolute (bytes that are not UTF-8 shown as U+FFFD).
    #[serde(serialize_with = "crate::report::lossy_path")]
    pub(crate) path: PathBuf,
    /// The path's bytes in hexadecimal when they are not UTF-8 (so `path` is not exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) path_hex: Option<String>,
    /// Which wall refused it.
    pub(crate) rule: FsRule,
    /// What to do instead.
    pub(crate) hint: String,
}

/// The run's filesystem violations: judged, written live, counted for the report.
#[derive(Debug)]
pub(crate) struct Violations {
    walls: Mutex<Walls>,
    stream: Option<Mutex<Stream>>,
    live: bool,
    tally: Mutex<Tally>,
}

impl Violations {
    /// Violations written to `sink` (if any), and said on stderr when `live`.
    pub(crate) fn new(sink: Option<Sink>, live: bool) -> Self {
        Self {
            walls: Mutex::new(Walls::default()),
            stream: sink.map(|s| Mutex::new(Stream::new(s))),
            live,
            tally: Mutex::new(Tally::default()),
        }
    }

    /// The backend's walls, and that it observes: called once the sandbox is planned.
    pub(crate) fn observe_with(&self, walls: Walls) {
        *self
            .walls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = walls;
        self.tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .observing = true;
    }

    /// Whether the walls refuse `a` as named (nothing written, no system call): the cheap
    /// first look at every write-intent call, before [`Self::observe`] looks closer.
    pub(crate) fn refuses(&self, a: &Attempt) -> bool {
        let walls = self
            .walls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        a.paths.iter().any(|p| walls.judge_named(a.op, p).is_some())
    }

    /// Judges `a` with what `seen` tells of it; an operation the walls refuse (and that
    /// would not fail for a reason of its own) is written, said and counted. A masked
    /// path's refusal always counts: the mask hides what is really there.
    pub(crate) fn observe(&self, a: Attempt, seen: &dyn Seen) {
        let walls = self
            .walls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let refused = a
            .paths
            .iter()
            .find_map(|p| walls.judge(a.op, p, seen).map(|rule| (p, rule)));
        let Some((path, rule)) = refused else {
            return;
        };
        if rule != FsRule::DenyRead && seen.not_the_walls(&a.paths) {
            return;
        }
        // An open with O_CREAT of a file that exists writes to it; it creates nothing.
        let op = if a.op == FsOp::Create && seen.exists(path) {
            FsOp::OpenWrite
        } else {
            a.op
        };
        let record = FsDenied {
            kind: "fs_denied",
            ts: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            pid: a.pid,
            exe: seen.exe(),
            op,
            path: path.clone(),
            path_hex: path.to_str().is_none().then(|| {
                path.as_os_str()
                    .as_encoded_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect()
            }),
            rule,
            hint: walls.hint(rule, path),
        };
        // A watched path of the mandatory deny set takes the write; it is moved aside
        // when the run ends (the quarantine), which is how it is denied.
        let outcome = if rule == FsRule::MandatoryDeny && walls.watched(path) {
            "denied: moved aside at exit"
        } else {
            "refused"
        };
        drop(walls);
        let written = self.write(&record);
        let first = self.count(&record, written);
        if self.live && first {
            eprintln!(
                "shim: filesystem: {} {} {outcome} ({}): {}",
                record.op.as_str(),
                crate::report::on_one_line(&record.path.display().to_string()),
                rule.as_str(),
                crate::report::on_one_line(&record.hint)
            );
        }
    }

    /// Says once that `ops` cannot be observed, and why.
    pub(crate) fn unobservable(&self, ops: &[FsOp], why: &str) {
        let u = Unobserved {
            ops: ops.to_vec(),
            why: why.to_owned(),
        };
        let line = serde_json::json!({
            "type": "fs_unobserved",
            "ts": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            "ops": u.ops,
            "why": u.why,
        });
        if let Some(stream) = &self.stream {
            stream
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .sink
                .write_line(&line.to_string());
        }
        self.tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .unobserved
            .push(u);
    }

    /// Writes `record` to the stream, within its bound: whether it was written (`true`
    /// without a stream, where nothing is held back).
    fn write(&self, record: &FsDenied) -> bool {
        let Some(stream) = &self.stream else {
            return true;
        };
        let Ok(line) = serde_json::to_string(record) else {
            return true;
        };
        stream
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .offer(&line, &record.ts, Instant::now())
    }

    /// Says what the stream held back since its last line: called when the run ends.
    pub(crate) fn finish(&self) {
        if let Some(stream) = &self.stream {
            let ts = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
            stream
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .flush_held(&ts);
        }
    }

    /// Counts `r` (`written` to the stream or held back); whether its (path, op, rule) is
    /// new among the first [`MAX_PATHS`](tally::MAX_PATHS).
    fn count(&self, r: &FsDenied, written: bool) -> bool {
        self.tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .count(r, written)
    }

    /// The report's `filesystem` section.
    pub(crate) fn summary(&self) -> serde_json::Value {
        self.tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .summary()
    }
}

#[cfg(test)]
mod tests;
