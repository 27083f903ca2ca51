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
//! [`MAX_PATHS`] distinct paths for `--report`. It only ever reports: the kernel decided
//! each call already, whatever is concluded here.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};

/// Distinct paths a report lists.
pub(crate) const MAX_PATHS: usize = 100;

/// The `--violations` stream's bound: `fs_denied` lines written in one burst...
const STREAM_BURST: f64 = 1_000.0;
/// ...and then at most this many a second, so that a command that keeps hitting the walls
/// (a retry loop) cannot fill the disk through the stream. What is held back is said in
/// one `fs_suppressed` line before the next written one and at exit, and counted in full
/// by the report.
const STREAM_RATE: f64 = 100.0;

/// A filesystem operation (the `op` of a record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FsOp {
    /// An open for writing (or truncating) of an existing file.
    OpenWrite,
    /// A new file (an open with `O_CREAT`, `creat`, `mknod`).
    Create,
    /// A removal (`unlink`, `rmdir`).
    Unlink,
    /// A rename (either end).
    Rename,
    /// A new directory.
    Mkdir,
    /// A hard link (either end).
    Link,
    /// A new symbolic link.
    Symlink,
    /// A mode change.
    Chmod,
    /// A truncation by path.
    Truncate,
    /// A read of a `--deny-read` path.
    Read,
}

impl FsOp {
    /// Every write operation.
    pub(crate) const WRITES: [Self; 9] = [
        Self::OpenWrite,
        Self::Create,
        Self::Unlink,
        Self::Rename,
        Self::Mkdir,
        Self::Link,
        Self::Symlink,
        Self::Chmod,
        Self::Truncate,
    ];

    /// The record's string.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::OpenWrite => "open_write",
            Self::Create => "create",
            Self::Unlink => "unlink",
            Self::Rename => "rename",
            Self::Mkdir => "mkdir",
            Self::Link => "link",
            Self::Symlink => "symlink",
            Self::Chmod => "chmod",
            Self::Truncate => "truncate",
            Self::Read => "read",
        }
    }

    /// Whether the operation follows a symbolic link in its last component.
    pub(crate) fn follows(self) -> bool {
        matches!(
            self,
            Self::OpenWrite | Self::Chmod | Self::Truncate | Self::Read
        )
    }
}

/// Which wall refused it (the `rule` of a record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FsRule {
    /// Not beneath any writable root.
    OutsideWriteRoots,
    /// In the mandatory deny set (files that make tools run code), even in a write root.
    MandatoryDeny,
    /// Beneath a `--deny-read` path.
    DenyRead,
}

impl FsRule {
    fn as_str(self) -> &'static str {
        match self {
            Self::OutsideWriteRoots => "outside_write_roots",
            Self::MandatoryDeny => "mandatory_deny",
            Self::DenyRead => "deny_read",
        }
    }
}

/// What a path of the sandbox's view is, as the backend built it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wall {
    /// A writable root (and the sandbox's private `/dev`).
    Writable,
    /// Shown read-only (a path re-opened for reading, the CA files).
    ReadOnly,
    /// Masked (`--deny-read`, the authority sockets' directory, `--control`, the run's own
    /// decision log, violations file and report file).
    Masked,
    /// Read-only: the mandatory deny set.
    Protected,
    /// Writable inside, but the path itself cannot be removed or renamed (`.git`).
    Pinned,
    /// In the mandatory deny set but missing at start, with no placeholder (a shell
    /// startup file in a root that is not the home directory): what the command puts
    /// there is moved aside when the run ends.
    Watched,
}

/// The walls, by canonical host path.
#[derive(Debug, Clone, Default)]
pub(crate) struct Walls {
    entries: Vec<(PathBuf, Wall)>,
    roots: Vec<PathBuf>,
}

impl Walls {
    /// Walls from `(path, wall)` entries (canonical paths).
    pub(crate) fn new(entries: Vec<(PathBuf, Wall)>) -> Self {
        let roots = entries
            .iter()
            .filter(|(p, w)| *w == Wall::Writable && p != Path::new("/dev"))
            .map(|(p, _)| p.clone())
            .collect();
        Self { entries, roots }
    }

    /// The rule that refuses `op` on `path` (absolute, lexically normalised), if any,
    /// with the path's links resolved by `seen` as the kernel resolves them for the
    /// command.
    pub(crate) fn judge(&self, op: FsOp, path: &Path, seen: &dyn Seen) -> Option<FsRule> {
        // The path as named first (no system call: this runs for every write of the
        // command); a refusal is confirmed with its links resolved as the kernel resolves
        // them, so a link into a write root is not blamed. A link inside a write root that
        // leads out of it is refused by the kernel without a record (docs/shim.md).
        self.judge_named(op, path)?;
        self.judge_named(op, &seen.resolved(op, path))
    }

    /// The rule that refuses `op` on `path` as named (no link resolved, no system call).
    fn judge_named(&self, op: FsOp, path: &Path) -> Option<FsRule> {
        if is_descriptor_link(path) {
            return None;
        }
        // Every entry that holds `path` is a prefix of it: the longest is the deepest.
        let deepest = self
            .entries
            .iter()
            .filter(|(p, _)| beneath(path, p))
            .max_by_key(|(p, _)| p.as_os_str().len());
        match deepest {
            Some((p, Wall::Pinned)) => (p == path && matches!(op, FsOp::Unlink | FsOp::Rename))
                .then_some(FsRule::MandatoryDeny),
            Some((_, Wall::Writable)) => None,
            Some((_, Wall::Protected | Wall::Watched)) => Some(FsRule::MandatoryDeny),
            Some((_, Wall::Masked)) => Some(FsRule::DenyRead),
            Some((_, Wall::ReadOnly)) | None => Some(FsRule::OutsideWriteRoots),
        }
    }

    /// What to do about a refusal, in words an agent can follow.
    pub(crate) fn hint(&self, rule: FsRule, path: &Path) -> String {
        match rule {
            FsRule::OutsideWriteRoots => {
                let ask = path
                    .parent()
                    .filter(|p| *p != Path::new("/"))
                    .unwrap_or(path)
                    .display();
                if self.roots.is_empty() {
                    format!(
                        "{} is outside the write roots (this sandbox has none); ask for --allow-write {ask}",
                        path.display()
                    )
                } else {
                    let roots: Vec<String> =
                        self.roots.iter().map(|r| r.display().to_string()).collect();
                    format!(
                        "{} is outside the write roots; write under {} or ask for --allow-write {ask}",
                        path.display(),
                        roots.join(", ")
                    )
                }
            }
            FsRule::MandatoryDeny if self.watched(path) => format!(
                "{} is in the mandatory deny set (files that make shells and tools run code): what is written there is moved aside when the run ends; leave it alone",
                path.display()
            ),
            FsRule::MandatoryDeny => format!(
                "{} is in the mandatory deny set (files that make shells and tools run code) and is read-only in every sandbox; leave it as it is",
                path.display()
            ),
            FsRule::DenyRead => format!(
                "{} is hidden from this sandbox (a --deny-read path, or one the shim keeps from the command: the mediator's sockets, the run's own logs and report): it can be neither read nor written",
                path.display()
            ),
        }
    }
}

impl Walls {
    /// Whether `path` is at or beneath a watched path.
    fn watched(&self, path: &Path) -> bool {
        self.entries
            .iter()
            .any(|(p, w)| *w == Wall::Watched && beneath(path, p))
    }
}

/// Whether `path` is `dir` or beneath it, both absolute and normalised (no `.`, `..`,
/// repeated or trailing `/`). Compares bytes: this runs for every wall and every
/// write-intent call of the command, and `Path::starts_with` splits both into components.
fn beneath(path: &Path, dir: &Path) -> bool {
    let (path, dir) = (
        path.as_os_str().as_encoded_bytes(),
        dir.as_os_str().as_encoded_bytes(),
    );
    path.starts_with(dir)
        && (path.len() == dir.len() || dir.ends_with(b"/") || path.get(dir.len()) == Some(&b'/'))
}

/// `/proc/<pid>/fd/<n>` (and `self`, `thread-self`): a descriptor the task holds, not a
/// place in the tree.
fn is_descriptor_link(path: &Path) -> bool {
    let mut c = path.components().filter_map(|c| match c {
        Component::Normal(s) => Some(s),
        _ => None,
    });
    c.next().is_some_and(|s| s == "proc") && c.nth(1).is_some_and(|s| s == "fd")
}

/// What the backend can tell about an attempt the walls refuse as named, looked at in
/// the command's own view of the tree.
pub(crate) trait Seen {
    /// `path` with its symbolic links resolved as `op` resolves them: the directory it is
    /// in always, the last component only for an operation that follows it. A path that
    /// does not exist (yet) keeps its missing components.
    fn resolved(&self, op: FsOp, path: &Path) -> PathBuf;
    /// Whether the attempt on `paths` fails for a reason of its own (`EEXIST`, `ENOENT`,
    /// `ENOTDIR`, ...) or writes nothing, whatever the walls are: then it is no violation.
    fn not_the_walls(&self, paths: &[PathBuf]) -> bool;
    /// Whether `path` exists (its last component not followed).
    fn exists(&self, path: &Path) -> bool;
    /// The executable of the task that tried it.
    fn exe(&self) -> String;
}

/// The host's view, for a backend that cannot look at the command's: links resolved on
/// the host, every refused attempt taken as the walls'.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostView {
    /// The executable to report.
    pub(crate) exe: String,
}

impl Seen for HostView {
    fn resolved(&self, op: FsOp, path: &Path) -> PathBuf {
        host_resolved(op, path)
    }

    fn not_the_walls(&self, _: &[PathBuf]) -> bool {
        false
    }

    fn exists(&self, path: &Path) -> bool {
        std::fs::symlink_metadata(path).is_ok()
    }

    fn exe(&self) -> String {
        self.exe.clone()
    }
}

/// `path` with its symbolic links resolved on the host, as [`Seen::resolved`] says.
fn host_resolved(op: FsOp, path: &Path) -> PathBuf {
    if op.follows()
        && let Ok(c) = std::fs::canonicalize(path)
    {
        return c;
    }
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or_else(|_| path.to_owned()),
        _ => path.to_owned(),
    }
}

/// `path` with `.` and `..` taken out lexically (`..` at `/` stays at `/`).
pub(crate) fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

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

/// `--violations fd:N`: the caller's descriptor N.
const FD_PREFIX: &str = "fd:";

/// How long a line longer than a pipe's atomic write (`PIPE_BUF`, 4,096 bytes), which a
/// full pipe took only part of, waits for room for the rest.
const PARTIAL_WAIT_MS: u16 = 1_000;

/// Where `--violations` goes. A pipe or FIFO is written without blocking (set on the
/// shim's own open file description): a reader that does not read never holds the
/// command, whose next refused call would otherwise wait for the supervisor's write; a
/// full pipe holds the line back instead.
#[derive(Debug)]
pub(crate) struct Sink(File);

impl Sink {
    fn new(file: File) -> Self {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        use std::os::unix::fs::FileTypeExt;
        if file.metadata().is_ok_and(|m| m.file_type().is_fifo())
            && let Ok(flags) = fcntl(&file, FcntlArg::F_GETFL)
        {
            let flags = OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK;
            let _ = fcntl(&file, FcntlArg::F_SETFL(flags));
        }
        Self(file)
    }

    /// Appends `line` and a newline, in one write (a reader never sees half a record):
    /// whether it was written. `false` when nothing of it could be: a full pipe, a reader
    /// gone.
    fn write_line(&mut self, line: &str) -> bool {
        let buf = format!("{line}\n");
        let mut done = 0;
        while done < buf.len() {
            match self.0.write(&buf.as_bytes()[done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // A line up to PIPE_BUF goes whole or not at all; only a longer one can be
                // taken in part, and its rest waits a bounded time for room.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && done > 0 => {
                    let mut fds = [nix::poll::PollFd::new(
                        std::os::fd::AsFd::as_fd(&self.0),
                        nix::poll::PollFlags::POLLOUT,
                    )];
                    if !matches!(nix::poll::poll(&mut fds, PARTIAL_WAIT_MS), Ok(n) if n > 0) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        done > 0
    }

    /// The file `spec` names: `PATH`, not `fd:N`.
    pub(crate) fn named_file(spec: &str) -> Option<&Path> {
        (!spec.starts_with(FD_PREFIX)).then_some(Path::new(spec))
    }

    /// Opens `PATH` (appended, created 0600) or `fd:N` (the caller's descriptor N, which
    /// the confined command never inherits).
    ///
    /// # Errors
    /// [`Error::Usage`] for a bad `fd:` value, [`Error::Io`] when it cannot be opened.
    pub(crate) fn open(spec: &str) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(n) = spec.strip_prefix(FD_PREFIX) {
            let fd: u32 = n.parse().map_err(|_| {
                Error::Usage(format!("--violations {spec}: write fd:N with N a number"))
            })?;
            if fd < 3 && fd != 1 && fd != 2 {
                return Err(Error::Usage(format!(
                    "--violations {spec}: descriptor {fd} is not writable output"
                )));
            }
            // A new open of the same file or pipe: no unsafe adoption of a raw descriptor.
            let path = format!("/proc/self/fd/{fd}");
            return std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .map(Self::new)
                .map_err(|e| Error::io(format!("--violations {spec}: descriptor {fd}"), e));
        }
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(spec)
            .map(Self::new)
            .map_err(|e| Error::io(format!("--violations {spec}"), e))
    }
}

/// A kind of operation that cannot be observed here, and why (said once).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Unobserved {
    /// The operations.
    pub(crate) ops: Vec<FsOp>,
    /// Why.
    pub(crate) why: String,
}

#[derive(Debug, Default)]
struct Tally {
    total: u64,
    by_op: BTreeMap<FsOp, u64>,
    by_rule: BTreeMap<FsRule, u64>,
    /// The first [`MAX_PATHS`] distinct (path, op, rule), with how often each was seen.
    paths: Vec<(PathBuf, FsOp, FsRule, u64)>,
    unobserved: Vec<Unobserved>,
    observing: bool,
    /// `fs_denied` lines the stream's bound held back.
    suppressed: u64,
}

/// The `--violations` stream with its bound (a token bucket of [`STREAM_BURST`] lines,
/// refilled at [`STREAM_RATE`] a second).
#[derive(Debug)]
struct Stream {
    sink: Sink,
    /// Lines that may be written now.
    tokens: f64,
    refilled: Instant,
    /// `fs_denied` lines held back since the last written one, and the time of the first.
    held: u64,
    held_since: Option<String>,
}

impl Stream {
    fn new(sink: Sink) -> Self {
        Self {
            sink,
            tokens: STREAM_BURST,
            refilled: Instant::now(),
            held: 0,
            held_since: None,
        }
    }

    /// Writes one `fs_denied` line (stamped `ts`) if the bound lets it at `now` and the
    /// sink takes it, after the `fs_suppressed` line for what was held back before it;
    /// else holds it back. Whether it was written.
    fn offer(&mut self, line: &str, ts: &str, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * STREAM_RATE).min(STREAM_BURST);
        self.refilled = now;
        let written = self.tokens >= 1.0 && {
            self.tokens -= 1.0;
            self.flush_held(ts) && self.sink.write_line(line)
        };
        if !written {
            self.held += 1;
            self.held_since.get_or_insert_with(|| ts.to_owned());
        }
        written
    }

    /// Writes the `fs_suppressed` line for the lines held back, if any (stamped `ts`):
    /// whether nothing is held back now.
    fn flush_held(&mut self, ts: &str) -> bool {
        if self.held == 0 {
            return true;
        }
        let line = serde_json::json!({
            "type": "fs_suppressed",
            "ts": ts,
            "since": self.held_since,
            "count": self.held,
            "why": format!(
                "these fs_denied lines were not written: the command hit the walls faster than {STREAM_RATE} times a second after a burst of {STREAM_BURST}, or the reader of this stream did not keep up; the report counts every one"
            ),
        });
        if !self.sink.write_line(&line.to_string()) {
            return false;
        }
        self.held = 0;
        self.held_since = None;
        true
    }
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
    /// new among the first [`MAX_PATHS`].
    fn count(&self, r: &FsDenied, written: bool) -> bool {
        let mut t = self
            .tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        t.total += 1;
        t.suppressed += u64::from(!written);
        *t.by_op.entry(r.op).or_default() += 1;
        *t.by_rule.entry(r.rule).or_default() += 1;
        if let Some(e) = t
            .paths
            .iter_mut()
            .find(|(p, o, rule, _)| *p == r.path && *o == r.op && *rule == r.rule)
        {
            e.3 += 1;
            return false;
        }
        if t.paths.len() < MAX_PATHS {
            t.paths.push((r.path.clone(), r.op, r.rule, 1));
            return true;
        }
        false
    }

    /// The report's `filesystem` section.
    pub(crate) fn summary(&self) -> serde_json::Value {
        let t = self
            .tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        serde_json::json!({
            "observed": t.observing,
            "denied": t.total,
            "by_op": t.by_op.iter().map(|(k, v)| (k.as_str(), *v)).collect::<BTreeMap<_, _>>(),
            "by_rule": t.by_rule.iter().map(|(k, v)| (k.as_str(), *v)).collect::<BTreeMap<_, _>>(),
            "paths": t.paths.iter().map(|(p, o, r, n)| serde_json::json!({
                "path": p.to_string_lossy(), "op": o, "rule": r, "count": n,
            })).collect::<Vec<_>>(),
            "paths_limit": MAX_PATHS,
            "stream_suppressed": t.suppressed,
            "unobserved": t.unobserved,
        })
    }
}

#[cfg(test)]
#[path = "violations_tests.rs"]
mod tests;
