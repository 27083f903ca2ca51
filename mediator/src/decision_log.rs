//! The decision log (design section 10): one JSON line per decision and one per closed
//! connection, on stdout or appended to a file.
//!
//! Lines are handed to a dedicated writer thread over a bounded channel: a slow disk
//! applies back-pressure instead of dropping records (no decision goes unaccounted), and
//! the hot path never performs a write system call. The writer flushes whenever it has
//! drained its queue, so a line is visible promptly. It never logs secrets: tokens and
//! `Proxy-Authorization` values never reach a [`Record`].

use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;

use crate::error::Error;

/// How a connection proved its authority, with the peer it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A per-authority Unix socket; credentials from `SO_PEERCRED`.
    Unix {
        /// Peer process id (`None` if the kernel did not report one).
        pid: Option<i32>,
        /// Peer user id.
        uid: u32,
        /// Peer group id.
        gid: u32,
    },
    /// The shared TCP listener; the peer's address.
    Tcp(std::net::SocketAddr),
    /// In-process (embedded mode, demo): no socket peer.
    Embedded,
}

impl Peer {
    /// The `channel` field: `"unix"`, `"tcp"` or `"embedded"`.
    pub fn channel(&self) -> &'static str {
        match self {
            Self::Unix { .. } => "unix",
            Self::Tcp(_) => "tcp",
            Self::Embedded => "embedded",
        }
    }
}

impl Serialize for Peer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        match self {
            Self::Unix { pid, uid, gid } => {
                m.serialize_entry("pid", pid)?;
                m.serialize_entry("uid", uid)?;
                m.serialize_entry("gid", gid)?;
            }
            Self::Tcp(addr) => m.serialize_entry("addr", &addr.to_string())?,
            Self::Embedded => {}
        }
        m.end()
    }
}

/// One decision-log line. `event` is `"decision"` or `"close"`; close-only fields are
/// omitted on decision lines.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// `"decision"` or `"close"`.
    pub event: &'static str,
    /// RFC 3339 UTC timestamp with milliseconds.
    pub ts: String,
    /// Decision id, unique within this mediator process.
    pub id: u64,
    /// Id of the client connection the decision was taken on.
    pub conn: u64,
    /// Authority name; `None` when the channel did not establish one.
    pub authority: Option<String>,
    /// `"unix"`, `"tcp"` or `"embedded"`.
    pub channel: &'static str,
    /// Peer credentials (unix) or address (tcp).
    pub peer: Peer,
    /// `"connect"`, `"http"`, `"socks5"` or `"tls"` (a request inside a terminated tunnel).
    pub protocol: &'static str,
    /// Canonical host, or the raw target (escaped) when it could not be canonicalised.
    pub host: Option<String>,
    /// Destination port.
    pub port: Option<u16>,
    /// `"allow"` or `"deny"`.
    pub decision: &'static str,
    /// Reason (design section 4.3).
    pub reason: &'static str,
    /// The grant entry that decided, as written.
    pub rule: Option<String>,
    /// Human-readable detail.
    pub detail: String,
    /// The vetted address connected to.
    pub pin: Option<String>,
    /// `"direct"` (or a parent, later).
    pub route: Option<String>,
    /// Time spent resolving, in milliseconds.
    pub dns_ms: Option<f64>,
    /// Time spent connecting upstream, in milliseconds.
    pub connect_ms: Option<f64>,
    /// Close lines: bytes client -> upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_up: Option<u64>,
    /// Close lines: bytes upstream -> client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_down: Option<u64>,
    /// Close lines: connection lifetime in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Close lines: `client_closed`, `upstream_closed`, `idle_timeout`, `error`, `shutdown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub close_reason: Option<&'static str>,
    /// Requests inside a TLS-terminated tunnel (`protocol: "tls"`): the method.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Requests inside a TLS-terminated tunnel: the path, its query replaced by
    /// `?<redacted>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// Where the log goes.
#[derive(Debug, Clone)]
pub enum Sink {
    /// Standard output.
    Stdout,
    /// Appended to this file (created with mode 0600 if absent).
    File(std::path::PathBuf),
    /// Kept in memory (tests, demo).
    Memory(Arc<Mutex<Vec<String>>>),
}

/// Handle to the decision log; cheap to clone.
#[derive(Debug, Clone)]
pub struct DecisionLog {
    tx: SyncSender<Msg>,
}

enum Msg {
    Line(String),
    Flush(SyncSender<()>),
}

/// Queue depth before writers block.
const QUEUE: usize = 16 * 1024;

impl DecisionLog {
    /// Opens the sink and starts the writer thread.
    ///
    /// # Errors
    /// [`Error::DecisionLog`] if the file cannot be opened for appending.
    pub fn open(sink: Sink) -> Result<Self, Error> {
        let out: Box<dyn Write + Send> = match &sink {
            Sink::Stdout => Box::new(io::stdout()),
            Sink::File(path) => Box::new(open_append(path)?),
            Sink::Memory(lines) => Box::new(MemoryWriter(Arc::clone(lines), Vec::new())),
        };
        let (tx, rx) = sync_channel(QUEUE);
        // The thread ends when the last handle (and so the last sender) is dropped.
        std::thread::Builder::new()
            .name("decision-log".into())
            .spawn(move || writer(rx, BufWriter::with_capacity(64 * 1024, out)))?;
        Ok(Self { tx })
    }

    /// Appends one record. Blocks only if the writer is more than 16 Ki lines behind.
    pub fn write(&self, record: &Record) {
        match serde_json::to_string(record) {
            Ok(line) => {
                if self.tx.send(Msg::Line(line)).is_err() {
                    tracing::error!("decision log writer has stopped; record lost: {record:?}");
                }
            }
            Err(e) => tracing::error!("cannot serialise decision record: {e}"),
        }
    }

    /// Waits until every record written so far has reached the sink.
    pub fn flush(&self) {
        let (tx, rx) = sync_channel(1);
        if self.tx.send(Msg::Flush(tx)).is_ok() {
            let _ = rx.recv();
        }
    }
}

fn open_append(path: &Path) -> Result<std::fs::File, Error> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| Error::DecisionLog {
            path: path.to_path_buf(),
            source,
        })
}

fn writer(rx: Receiver<Msg>, mut out: BufWriter<Box<dyn Write + Send>>) {
    let handle = |msg: Msg, out: &mut BufWriter<Box<dyn Write + Send>>| match msg {
        Msg::Line(line) => {
            if let Err(e) = out
                .write_all(line.as_bytes())
                .and_then(|()| out.write_all(b"\n"))
            {
                tracing::error!("decision log write failed: {e}");
            }
        }
        Msg::Flush(done) => {
            let _ = out.flush();
            let _ = done.send(());
        }
    };
    while let Ok(msg) = rx.recv() {
        handle(msg, &mut out);
        while let Ok(more) = rx.try_recv() {
            handle(more, &mut out);
        }
        if let Err(e) = out.flush() {
            tracing::error!("decision log flush failed: {e}");
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

/// The current time as RFC 3339 UTC with milliseconds (`2026-11-29T08:56:13.123Z`).
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}
