//! The sink: where `--violations` goes (`PATH` or `fd:N`), and the stream's bound on
//! what is written to it.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use crate::error::{Error, Result};

/// The `--violations` stream's bound: `fs_denied` lines written in one burst...
pub(super) const STREAM_BURST: f64 = 1_000.0;
/// ...and then at most this many a second, so that a command that keeps hitting the walls
/// (a retry loop) cannot fill the disk through the stream. What is held back is said in
/// one `fs_suppressed` line before the next written one and at exit, and counted in full
/// by the report.
pub(super) const STREAM_RATE: f64 = 100.0;

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
    pub(super) fn write_line(&mut self, line: &str) -> bool {
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

/// The `--violations` stream with its bound (a token bucket of [`STREAM_BURST`] lines,
/// refilled at [`STREAM_RATE`] a second).
#[derive(Debug)]
pub(super) struct Stream {
    pub(super) sink: Sink,
    /// Lines that may be written now.
    tokens: f64,
    refilled: Instant,
    /// `fs_denied` lines held back since the last written one, and the time of the first.
    pub(super) held: u64,
    held_since: Option<String>,
}

impl Stream {
    pub(super) fn new(sink: Sink) -> Self {
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
    pub(super) fn offer(&mut self, line: &str, ts: &str, now: Instant) -> bool {
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
    pub(super) fn flush_held(&mut self, ts: &str) -> bool {
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
