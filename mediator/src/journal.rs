//! The lines the mediator writes to stderr (`say!`), with their priorities when stderr is
//! the journal (design section 19): systemd sets
//! `JOURNAL_STREAM=<dev>:<inode>` for a service whose stderr it reads; when our stderr is
//! that stream, every line carries a `<N>` syslog priority prefix (`sd-daemon(3)`), so that
//! `journalctl -p warning` shows the warnings and errors. Anywhere else lines are plain.
//!
//! A leaf on the bottom floor: every layer may say something, so this imports nothing
//! of the crate.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

/// A line's syslog priority (RFC 5424 section 6.2.1 severities).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// 3, `err`: something failed; the service may not do what it should.
    Error,
    /// 4, `warning`: it works, but an operator should look.
    Warning,
    /// 6, `info`: what it does.
    Info,
}

impl Priority {
    /// The `<N>` prefix of this priority.
    fn prefix(self) -> &'static str {
        match self {
            Self::Error => "<3>",
            Self::Warning => "<4>",
            Self::Info => "<6>",
        }
    }
}

/// Whether stderr is the stream `JOURNAL_STREAM` names (checked once).
pub fn stderr_is_journal() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let Some(named) = std::env::var_os("JOURNAL_STREAM") else {
            return false;
        };
        let Some((dev, ino)) = named.to_str().and_then(|s| s.split_once(':')) else {
            return false;
        };
        let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
            return false;
        };
        std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
    })
}

/// The prefix for a line of `priority`: `<N>` when stderr is the journal, else nothing.
pub fn prefix(priority: Priority) -> &'static str {
    if stderr_is_journal() {
        priority.prefix()
    } else {
        ""
    }
}

/// Writes `text` to stderr, each of its lines with the prefix of `priority`.
pub fn say(priority: Priority, text: &str) {
    let p = prefix(priority);
    let mut out = String::with_capacity(text.len() + 8);
    for line in text.split('\n') {
        out.push_str(p);
        out.push_str(line);
        out.push('\n');
    }
    let _ = std::io::stderr().lock().write_all(out.as_bytes());
}

/// `eprintln!` with a priority: `say!(Warning, "...", args)`.
#[macro_export]
macro_rules! say {
    ($priority:ident, $($arg:tt)*) => {
        $crate::journal::say(
            $crate::journal::Priority::$priority,
            &format!($($arg)*),
        )
    };
}

/// A [`tracing_subscriber::fmt::MakeWriter`]-style writer for one event: stderr, its first
/// write prefixed with the priority of the event's level (error 3, warn 4, else 6).
#[derive(Debug)]
pub struct PrefixedStderr {
    prefix: &'static str,
}

impl PrefixedStderr {
    /// For an event of `level`.
    pub fn for_level(level: tracing::Level) -> Self {
        let priority = match level {
            tracing::Level::ERROR => Priority::Error,
            tracing::Level::WARN => Priority::Warning,
            _ => Priority::Info,
        };
        Self {
            prefix: prefix(priority),
        }
    }
}

impl Write for PrefixedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        if !self.prefix.is_empty() {
            err.write_all(self.prefix.as_bytes())?;
            self.prefix = "";
        }
        err.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// The tracing subscriber's writer: stderr, each event prefixed by its level's priority
/// when stderr is the journal.
#[derive(Debug, Clone, Copy, Default)]
pub struct JournalStderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for JournalStderr {
    type Writer = PrefixedStderr;

    fn make_writer(&'a self) -> PrefixedStderr {
        PrefixedStderr::for_level(tracing::Level::INFO)
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> PrefixedStderr {
        PrefixedStderr::for_level(*meta.level())
    }
}
