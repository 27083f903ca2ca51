//! The decision log's writer (design section 10): records handed over as lines, stamped
//! and rendered, written by one thread to stdout or a file.
//!
//! Lines are handed to a dedicated writer thread through a bounded in-memory queue: a
//! slow disk applies back-pressure instead of dropping records (no decision goes
//! unaccounted), and the hot path never performs a write system call. The writer takes
//! every queued line at once and waits a couple of milliseconds between batches, so under
//! load a line costs neither a thread wake-up nor a write of its own, and a line still
//! reaches the sink within milliseconds.
//!
//! A file sink can be reopened ([`DecisionLog::reopen`], SIGUSR1, for logrotate): the
//! writer switches files between two batches, so every line lands whole in the old file
//! (renamed away) or in the new one, and none is lost.
//!
//! A sink that fails a write (a full disk, a closed stdout) is fatal: the log marks itself
//! broken ([`DecisionLog::broken`]) and the service stops, since a decision that cannot
//! be recorded must not be made. Nothing is dropped silently.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::record::{Line, Peer, Record};
use super::stamp::{Stamp, random_run};
use crate::error::Error;

/// Called with every record before it is queued (the shim's embedded mode collects its
/// run's denials this way, typed, without re-reading the log). It runs on the connection's
/// task: it must be quick and must not block.
pub type Tap = Arc<dyn Fn(&Record) + Send + Sync>;

/// Where the log goes.
#[derive(Debug, Clone)]
pub enum Sink {
    /// Standard output.
    Stdout,
    /// Appended to this file (created with mode 0600 if absent).
    File(PathBuf),
    /// Appended to this file, opened for appending by the caller (see [`open_append`])
    /// and never opened again by path: for a caller whose path could be replaced before
    /// the log starts (the shim's embedded mediator, which starts with the sandbox's first
    /// connection, when the file lies in a directory the sandbox may write). Not reopened.
    Opened(Arc<std::fs::File>),
    /// Kept in memory (tests, demo).
    Memory(Arc<Mutex<Vec<String>>>),
    /// Not written (an embedded mediator whose caller reads its records through a [`Tap`]).
    Discard,
}

/// Handle to the decision log; cheap to clone. The writer thread ends (after writing
/// every queued line) when the last handle is dropped.
#[derive(Clone)]
pub struct DecisionLog {
    handle: Arc<Handle>,
    tap: Option<Tap>,
    /// `instance` and `run`, added to every line (design section 19).
    stamp: Arc<Stamp>,
    /// `[log] format = "ocsf"`: what each stamped native line is rendered into.
    render: Option<Arc<dyn Render>>,
    /// `[telemetry] otlp_endpoint`: every record is offered to it too.
    ship: Option<Arc<dyn Ship>>,
    /// The file of a [`Sink::File`] (what [`Self::reopen`] opens again).
    path: Option<Arc<PathBuf>>,
}

/// A format a record is written in instead of the native line (design section 19;
/// implemented in `export/`, so that the writer never names a format).
pub(crate) trait Render: Send + Sync {
    /// Writes `line` to `out`; `native` is its stamped native line (a JSON object).
    ///
    /// # Errors
    /// The rendering cannot be serialised.
    fn render(
        &self,
        line: Line<'_>,
        native: &[u8],
        run: &str,
        out: &mut Vec<u8>,
    ) -> serde_json::Result<()>;
}

/// Somewhere a copy of each record goes besides the log (design section 19; implemented
/// in `export/`). It must never block: the caller is deciding.
pub(crate) trait Ship: Send + Sync {
    /// Offers `line` (its stamped native line `native`); may drop it (and count it).
    fn offer(&self, line: Line<'_>, native: &[u8], run: &str);
}

/// What [`DecisionLog::reopen`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reopened {
    /// The file was opened again by its path: later lines go there.
    File(PathBuf),
    /// The log is not a file (stdout, memory): nothing to reopen.
    NotAFile,
}

impl std::fmt::Debug for DecisionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionLog")
            .field("tap", &self.tap.is_some())
            .finish_non_exhaustive()
    }
}

/// The producers' side; its drop tells the writer that no line will follow.
#[derive(Debug)]
struct Handle(Arc<Queue>);

impl Drop for Handle {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.closed = true;
        self.0.writer.notify_one();
    }
}

/// Lines waiting for the writer. Producers append serialised lines to one buffer under a
/// mutex and wake the writer only when it sleeps; the writer takes the whole buffer at
/// once, writes it, then lingers [`LINGER`] before looking again, so under load one
/// wake-up and one `write(2)` carry many lines instead of one each.
#[derive(Debug, Default)]
struct Queue {
    state: Mutex<State>,
    /// Signalled when the writer sleeps and there is work (or the log is closed).
    writer: Condvar,
    /// Signalled when the writer has taken a batch or written up to a flush mark.
    progress: Condvar,
    /// Cancelled at the first failed write ([`DecisionLog::broken`]).
    broken: tokio_util::sync::CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    /// Serialised lines, each ending in `\n`.
    buf: Vec<u8>,
    /// Lines appended so far.
    appended: u64,
    /// Lines written to the sink (and flushed) so far.
    written: u64,
    /// The writer waits on `writer` (a producer must wake it).
    writer_asleep: bool,
    /// Threads waiting on `progress` (the writer signals it only when there are any).
    waiting: usize,
    /// A flush is waiting: the writer skips its linger.
    flush_wanted: bool,
    /// Every handle is gone.
    closed: bool,
    /// Reopens asked for so far ([`DecisionLog::reopen`]).
    reopen_asked: u64,
    /// Reopens done so far, and the error of the last one (`None`: it worked).
    reopen_done: u64,
    reopen_error: Option<String>,
    /// The first failed write to the sink (the log is broken from then on).
    failure: Option<String>,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves only a byte buffer behind: keep going.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits, counted among the waiters, until the writer reports progress.
    fn wait_progress<'a>(
        &self,
        mut state: std::sync::MutexGuard<'a, State>,
    ) -> std::sync::MutexGuard<'a, State> {
        state.waiting += 1;
        let mut state = self
            .progress
            .wait(state)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.waiting -= 1;
        state
    }
}

/// Bytes queued before producers wait for the writer (back-pressure, never loss).
const QUEUE_BYTES: usize = 8 << 20;

/// The largest line buffer a thread keeps between records.
const LINE_KEEP: usize = 16 << 10;

thread_local! {
    /// Each thread's buffer for the record it is serialising.
    static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Each thread's buffer for a record's rendering (`[log] format` other than native).
    static RENDERED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How long the writer waits after a batch before taking the next, so that lines arriving
/// meanwhile share one wake-up and one write. Bounds how late a line reaches the sink.
const LINGER: Duration = Duration::from_millis(2);

impl DecisionLog {
    /// Opens the sink and starts the writer thread.
    ///
    /// # Errors
    /// [`Error::DecisionLog`] if the file cannot be opened for appending.
    pub fn open(sink: Sink) -> Result<Self, Error> {
        let out: Box<dyn Write + Send> = match &sink {
            Sink::Stdout => Box::new(io::stdout()),
            Sink::File(path) => Box::new(open_append(path)?),
            Sink::Opened(file) => Box::new(Arc::clone(file)),
            Sink::Memory(lines) => Box::new(MemoryWriter(Arc::clone(lines), Vec::new())),
            Sink::Discard => Box::new(io::sink()),
        };
        let queue = Arc::new(Queue::default());
        let for_writer = Arc::clone(&queue);
        let path = match &sink {
            Sink::File(p) => Some(Arc::new(p.clone())),
            _ => None,
        };
        let reopen_path = path.clone();
        std::thread::Builder::new()
            .name("decision-log".into())
            .spawn(move || {
                writer(
                    &for_writer,
                    out,
                    reopen_path.as_deref().map(PathBuf::as_path),
                )
            })?;
        Ok(Self {
            handle: Arc::new(Handle(queue)),
            tap: None,
            stamp: Arc::new(Stamp::new(None, random_run())),
            render: None,
            ship: None,
            path,
        })
    }

    /// The same log, naming `instance` (`[log] instance`; `None`: the host name). The
    /// run stays this process's.
    #[must_use]
    pub fn with_stamp(mut self, instance: Option<&str>) -> Self {
        self.stamp = Arc::new(Stamp::new(instance, self.stamp.run.clone()));
        self
    }

    /// The same log, writing each record as `render` makes it (`[log] format`, design
    /// section 19); `None`: the native line.
    #[must_use]
    pub(crate) fn with_render(mut self, render: Option<Arc<dyn Render>>) -> Self {
        self.render = render;
        self
    }

    /// The same log, offering every record to `ship` as well (design section 19).
    #[must_use]
    pub(crate) fn with_ship(mut self, ship: Arc<dyn Ship>) -> Self {
        self.ship = Some(ship);
        self
    }

    /// This process's `run`: 16 hex digits drawn at start.
    pub fn run(&self) -> &str {
        &self.stamp.run
    }

    /// Opens the log file again by its path (after logrotate renamed it) and writes later
    /// lines there. Every line queued before the call is written to the old file first, so
    /// no line is lost or split between files. Blocks until the writer has switched.
    ///
    /// # Errors
    /// [`Error::DecisionLog`] when the file cannot be opened again; the log then goes on
    /// writing to the file it had (renamed or not), so still no line is lost.
    pub fn reopen(&self) -> Result<Reopened, Error> {
        let Some(path) = &self.path else {
            return Ok(Reopened::NotAFile);
        };
        let queue = &self.handle.0;
        let mut state = queue.lock();
        state.reopen_asked += 1;
        let ticket = state.reopen_asked;
        if state.writer_asleep {
            state.writer_asleep = false;
            queue.writer.notify_one();
        }
        while state.reopen_done < ticket {
            state = queue.wait_progress(state);
        }
        match state.reopen_error.clone() {
            None => Ok(Reopened::File(path.as_ref().clone())),
            Some(e) => Err(Error::DecisionLog {
                path: path.as_ref().clone(),
                source: io::Error::other(e),
            }),
        }
    }

    /// The same log, calling `tap` with every record before it is queued.
    #[must_use]
    pub fn with_tap(mut self, tap: Option<Tap>) -> Self {
        self.tap = tap;
        self
    }

    /// Appends one record. Blocks only if the writer is more than 8 MiB behind.
    pub fn write(&self, record: &Record) {
        if let Some(tap) = &self.tap {
            tap(record);
        }
        self.append(Line::Decision(record));
    }

    /// Appends one audit record (design section 21), as [`Self::write`] does a decision:
    /// the same stamp, format, export and writer.
    pub(crate) fn write_audit(&self, record: &crate::audit::record::AuditRecord) {
        self.append(Line::Audit(record));
    }

    /// Whether a decision line is the record's native serialisation and nothing else
    /// sees the record: no [`Tap`], no rendering (`[log] format`), no export. Only then
    /// may a caller hand over a line it serialised itself ([`Self::write_stamped`]).
    pub(crate) fn native(&self) -> bool {
        self.tap.is_none() && self.render.is_none() && self.ship.is_none()
    }

    /// Adds this log's stamp to `object`, one record of `peer` serialised by
    /// `serde_json`: what every line carries besides its record (`instance`, `run`, on
    /// TCP the peer's address).
    pub(crate) fn stamp(&self, object: &mut Vec<u8>, peer: &Peer) {
        self.stamp.append(object, peer);
    }

    /// Appends one decision line that `fill` writes into the (empty) buffer it is given:
    /// a record serialised and stamped ([`Self::stamp`]), byte for byte what
    /// [`Self::write`] would make of it (the caller proves that). For a log that is
    /// [`Self::native`] only (the caller asks first; no tap, rendering or export sees a
    /// line handed over this way).
    pub(crate) fn write_stamped(&self, fill: impl FnOnce(&mut Vec<u8>)) {
        debug_assert!(
            self.native(),
            "a stamped line skips the tap, render and ship"
        );
        LINE.with_borrow_mut(|line| {
            line.clear();
            fill(line);
            self.enqueue(line);
        });
    }

    fn append(&self, entry: Line<'_>) {
        // Serialised before the lock is taken (into this thread's reused buffer), so the
        // lock is held only to append.
        LINE.with_borrow_mut(|line| {
            line.clear();
            let (serialised, peer) = match entry {
                Line::Decision(r) => (serde_json::to_writer(&mut *line, r), &r.peer),
                Line::Audit(a) => (serde_json::to_writer(&mut *line, a), &Peer::Embedded),
            };
            if let Err(e) = serialised {
                tracing::error!("cannot serialise decision record: {e}");
                return;
            }
            self.stamp.append(line, peer);
            if let Some(ship) = &self.ship {
                ship.offer(entry, line, &self.stamp.run);
            }
            if let Some(render) = &self.render {
                // Rendered from the stamped native line into this thread's second buffer,
                // which then becomes the line (both keep their capacity).
                let rendered = RENDERED.with_borrow_mut(|out| {
                    out.clear();
                    let r = render.render(entry, line, &self.stamp.run, out);
                    if r.is_ok() {
                        std::mem::swap(line, out);
                    }
                    r
                });
                if let Err(e) = rendered {
                    tracing::error!("cannot render a decision record: {e}");
                    return;
                }
            }
            self.enqueue(line);
        });
    }

    /// Queues `line` (one finished line, without its `\n`) for the writer; waits only
    /// while the writer is more than [`QUEUE_BYTES`] behind.
    fn enqueue(&self, line: &mut Vec<u8>) {
        line.push(b'\n');
        let queue = &self.handle.0;
        let mut state = queue.lock();
        while state.buf.len() >= QUEUE_BYTES && !state.closed {
            state = queue.wait_progress(state);
        }
        state.buf.extend_from_slice(line);
        state.appended += 1;
        let wake = std::mem::take(&mut state.writer_asleep);
        drop(state);
        // Woken after the lock is released: the writer does not wake into a held lock.
        if wake {
            queue.writer.notify_one();
        }
        // A record is a few hundred bytes: a line far larger (a huge detail) does not
        // keep its buffer.
        if line.capacity() > LINE_KEEP {
            *line = Vec::new();
        }
    }

    /// Resolves once a write to the sink has failed, with that failure in words; never
    /// while the sink takes every line. The service stops when it resolves (no decision
    /// may go unrecorded).
    pub async fn broken(&self) -> String {
        let queue = &self.handle.0;
        queue.broken.cancelled().await;
        queue.lock().failure.clone().unwrap_or_default()
    }

    /// Waits until every record written so far has reached the sink.
    pub fn flush(&self) {
        let queue = &self.handle.0;
        let mut state = queue.lock();
        let mark = state.appended;
        while state.written < mark {
            state.flush_wanted = true;
            if state.writer_asleep {
                state.writer_asleep = false;
                queue.writer.notify_one();
            }
            state = queue.wait_progress(state);
        }
    }
}

/// Whether a start could open `path` for appending, without creating or changing it: an
/// existing file is opened for appending (and closed); else its directory must exist and
/// be writable by this user. What `mediator check` asks of a `[log] decisions` file.
///
/// # Errors
/// [`Error::DecisionLog`] naming the file and why.
pub fn check_can_open(path: &Path) -> Result<(), Error> {
    let err = |source: io::Error| Error::DecisionLog {
        path: path.to_path_buf(),
        source,
    };
    match OpenOptions::new().append(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            crate::writable::may_create_in(dir)
                .map_err(|e| err(io::Error::new(e.kind(), format!("cannot create it: {e}"))))
        }
        Err(e) => Err(err(e)),
    }
}

/// Opens `path` for appending, creating it if absent (mode 0600): what a start does for
/// [`Sink::File`], and what a caller of [`Sink::Opened`] does beforehand (it owes the
/// operator the file from the start, empty when nothing is decided, and the log then
/// writes to this very file, whatever becomes of the path meanwhile).
///
/// # Errors
/// [`Error::DecisionLog`] naming the file and why.
pub fn open_append(path: &Path) -> Result<std::fs::File, Error> {
    open_file(path).map_err(|source| Error::DecisionLog {
        path: path.to_path_buf(),
        source,
    })
}

fn open_file(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// The writer thread: takes the queued bytes in one go, writes and flushes them, lingers,
/// and repeats; returns once the log is closed and everything queued is written. A reopen
/// asked for is done right after the batch taken with it (never inside a batch).
fn writer(queue: &Queue, mut out: Box<dyn Write + Send>, path: Option<&Path>) {
    let mut batch = Vec::new();
    loop {
        let (mark, reopen) = {
            let mut state = queue.lock();
            while state.buf.is_empty() && !state.closed && state.reopen_asked == state.reopen_done {
                if state.written == state.appended {
                    // Nothing in flight: wake any flush waiting on an empty queue.
                    state.flush_wanted = false;
                    if state.waiting > 0 {
                        queue.progress.notify_all();
                    }
                }
                state.writer_asleep = true;
                state = queue
                    .writer
                    .wait(state)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            state.writer_asleep = false;
            let reopen = (state.reopen_asked != state.reopen_done).then_some(state.reopen_asked);
            if state.buf.is_empty() && reopen.is_none() {
                return; // closed and drained
            }
            batch.clear();
            std::mem::swap(&mut batch, &mut state.buf);
            // Producers blocked on a full queue may go on.
            if state.waiting > 0 {
                queue.progress.notify_all();
            }
            (state.appended, reopen)
        };
        if !batch.is_empty()
            && let Err(e) = out.write_all(&batch).and_then(|()| out.flush())
        {
            tracing::error!("decision log write failed: {e}");
            let mut state = queue.lock();
            if state.failure.is_none() {
                state.failure = Some(e.to_string());
                queue.broken.cancel();
            }
        }
        // Between batches: the old file has every line taken so far.
        let reopened = reopen.map(|ticket| match path.map(open_file) {
            Some(Ok(file)) => {
                out = Box::new(file);
                (ticket, None)
            }
            Some(Err(e)) => (ticket, Some(e.to_string())),
            None => (ticket, None),
        });
        let flush_wanted = {
            let mut state = queue.lock();
            state.written = mark;
            if let Some((ticket, error)) = reopened {
                state.reopen_done = ticket;
                state.reopen_error = error;
            }
            if state.waiting > 0 {
                queue.progress.notify_all();
            }
            std::mem::take(&mut state.flush_wanted)
        };
        // Let lines gather for the next batch, unless someone waits on a flush.
        if !flush_wanted {
            std::thread::sleep(LINGER);
        }
    }
}

struct MemoryWriter(Arc<Mutex<Vec<String>>>, Vec<u8>);

impl Write for MemoryWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.1.extend_from_slice(buf);
        while let Some(pos) = self.1.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.1.drain(..=pos).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            if let Ok(mut lines) = self.0.lock() {
                lines.push(text);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
