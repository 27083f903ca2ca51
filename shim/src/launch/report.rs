//! The `--report` document: what one run says of itself at exit, as one JSON line, and
//! the file it goes to (settled before the sandbox exists).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::channel::ServedSummary;
use crate::cli::Settings;
use crate::control::Binding;
use crate::error::{Error, Result};
use crate::report::{ChannelFailure, Counted, Denials, RunsAs, Tampering};
use crate::violations::Violations;

/// The `--report` document.
#[derive(Debug, Serialize)]
pub(crate) struct Report<'a> {
    /// Always `"shim"`.
    pub(crate) report: &'static str,
    /// The run's invocation id and the host's `--tag`s (design section 20): what every
    /// record of the run carries.
    #[serde(flatten)]
    pub(crate) labels: &'a mediator::labels::Labels,
    /// The questions the run's requests raised (embedded mode with `--control`, design
    /// section 20), each with how it ended.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub(crate) asks: &'a [crate::asking::Asked],
    /// The channel (socket path) of the run.
    pub(crate) channel: String,
    /// The command's exit status as the shim returns it.
    pub(crate) exit_status: i32,
    /// Connections the sandbox opened to its proxy listener.
    pub(crate) connections: u64,
    /// Connections that could not reach the channel (the relay's and capture's).
    pub(crate) channel_errors: u64,
    /// Those connections, each with what failed (at most [`MAX_CHANNEL_FAILURES`](crate::report::MAX_CHANNEL_FAILURES)).
    pub(crate) channel_failures: &'a [ChannelFailure],
    /// Distinct denials, in the order first seen, each with its count (at most
    /// [`MAX_DENIALS`](crate::report::MAX_DENIALS)).
    pub(crate) denials: &'a [Counted],
    /// Distinct denials seen beyond [`MAX_DENIALS`](crate::report::MAX_DENIALS).
    pub(crate) denials_dropped: u64,
    /// Where the denials come from.
    pub(crate) source: &'static str,
    /// Paths the command created that would have run code on the host (a new
    /// `.git/commondir`, a shell startup file or tool config of the mandatory deny set
    /// that was missing at start), and where the shim moved them.
    pub(crate) tampering: &'a [Tampering],
    /// Transparent capture: its state, connections, and what it dropped.
    pub(crate) capture: &'a serde_json::Value,
    /// `--control` rebinds, in order (design section 18): when, from which channel, to
    /// which.
    pub(crate) rebinds: &'a [crate::control::Rebind],
    /// The mediator's files masked for this run besides `--deny-read` (its secrets, its
    /// CA's key, its state; each `{path, what}`).
    pub(crate) mediator_masked: &'a serde_json::Value,
    /// The host uid and gid the command ran as.
    pub(crate) runs_as: RunsAs,
    /// The command's refused filesystem operations (design section 18): counts by
    /// operation and rule, the first distinct paths, and what could not be observed.
    pub(crate) filesystem: &'a serde_json::Value,
}

/// The report's statement on filesystem denials when they were not observed.
pub(crate) const FILESYSTEM: &str = "not observed in this run: without --violations or --report the kernel's refusals (EROFS, EACCES) reach the command only as errors";

/// `--report-file F`, settled before the sandbox exists (whose mount plan masks F, so the
/// command can neither write a report of its own into it nor read this one).
#[derive(Debug)]
pub(crate) enum ReportFile {
    /// A regular file (made if absent, left as it is until the exit), held open and
    /// rewritten through this descriptor at exit: nothing done to the path meanwhile
    /// (a directory above it renamed, a link put in its place) redirects the write.
    Held(PathBuf, std::fs::File),
    /// Anything else (a FIFO whose reader waits, a terminal), opened at exit: opening a
    /// FIFO now would wait for its reader before the command runs.
    AtExit(PathBuf),
}

impl ReportFile {
    /// Opens (or makes) `path` as said above.
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be opened for writing.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let err = |e| Error::io(format!("--report-file {}", path.display()), e);
        match std::fs::metadata(path) {
            // Refused now rather than after the command ran.
            Ok(m) if m.is_dir() => {
                return Err(err(std::io::Error::new(
                    std::io::ErrorKind::IsADirectory,
                    "is a directory; name a file",
                )));
            }
            Ok(m) if !m.is_file() => return Ok(Self::AtExit(path.to_owned())),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e)),
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map(|f| Self::Held(path.to_owned(), f))
            .map_err(err)
    }

    /// The path the caller named.
    pub(crate) fn path(&self) -> &Path {
        match self {
            Self::Held(p, _) | Self::AtExit(p) => p,
        }
    }
}

impl Report<'_> {
    /// Write the report as one JSON line: to stderr (`dest` `None`) or to the file `dest`
    /// (replacing what it held).
    ///
    /// # Errors
    /// [`Error::Io`] if it cannot be serialised or the file cannot be written.
    pub(crate) fn write(&self, dest: Option<&ReportFile>) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let text =
            serde_json::to_string(self).map_err(|e| Error::io("serialise the report", e.into()))?;
        let line = format!("{text}\n");
        let (path, written) = match dest {
            None => {
                eprintln!("{text}");
                return Ok(());
            }
            Some(ReportFile::Held(path, file)) => (
                path,
                file.set_len(0)
                    .and_then(|()| file.write_all_at(line.as_bytes(), 0)),
            ),
            Some(ReportFile::AtExit(path)) => (path, std::fs::write(path, line)),
        };
        written.map_err(|e| Error::io(format!("write report {}", path.display()), e))
    }
}

/// Writes the `--report` (when asked for) of a run that `served` what it did and ended
/// as `outcome`, with its `denials` and the `binding`'s rebinds.
///
/// # Errors
/// A report that cannot be serialised or written.
pub(super) fn write_report(
    settings: &Settings,
    report_file: Option<&ReportFile>,
    served: (ServedSummary, &crate::sandbox::Outcome),
    denials: (&Denials, &Binding),
    mediator_masked: &[crate::secrets::MediatorPath],
    violations: Option<&Violations>,
) -> Result<()> {
    let (served, outcome) = served;
    let (denials, binding) = denials;
    let failures = denials.take_failures();
    let denials = denials.take();
    if settings.report.is_some() {
        let capture = serde_json::to_value(&served.capture)
            .map_err(|e| Error::io("serialise the report", e.into()))?;
        Report {
            report: "shim",
            labels: &settings.labels,
            asks: &served.asked,
            channel: served.channel,
            exit_status: outcome.exit_status,
            connections: served.connections,
            channel_errors: served.channel_errors,
            channel_failures: &failures,
            denials: &denials.0,
            denials_dropped: denials.1,
            source: served.source,
            tampering: &outcome.tampering,
            capture: &capture,
            rebinds: &binding.rebinds().0,
            mediator_masked: &serde_json::to_value(mediator_masked)
                .map_err(|e| Error::io("serialise the report", e.into()))?,
            runs_as: outcome.runs_as,
            filesystem: &violations.map_or_else(
                || serde_json::json!({ "observed": false, "note": FILESYSTEM }),
                |v| v.summary(),
            ),
        }
        .write(report_file)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Denial, TamperKind};

    #[test]
    fn the_report_is_one_json_line_with_every_field() {
        let denials = [Counted {
            denial: Denial {
                protocol: "http",
                status: 403,
                reason: Some("not_in_allowlist".into()),
                host: Some("blocked.test".into()),
                port: Some(80),
                detail: None,
                hint: None,
                message: None,
            },
            count: 6,
        }];
        let tampering = [Tampering {
            path: "/w/.git/commondir".into(),
            quarantined_as: "/w/.git/commondir.shim-quarantine-1".into(),
            kind: TamperKind::GitCommondir,
        }];
        let labels = mediator::labels::Labels::new(Some("inv-1"), ["tool=t1"]).unwrap();
        let report = Report {
            report: "shim",
            labels: &labels,
            asks: &[],
            channel: "embedded".into(),
            exit_status: 3,
            connections: 1,
            channel_errors: 0,
            channel_failures: &[],
            denials: &denials,
            denials_dropped: 0,
            source: "test",
            tampering: &tampering,
            capture: &serde_json::json!({"state": "off"}),
            rebinds: &[],
            mediator_masked: &serde_json::json!([{"path": "/srv/ca", "what": "[tls] ca_dir"}]),
            runs_as: RunsAs { uid: 7, gid: 8 },
            filesystem: &serde_json::json!({ "observed": false, "note": FILESYSTEM }),
        };
        let dir = std::env::temp_dir().join(format!("shim-report-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("r.json");
        // A directory is refused before anything runs.
        assert!(ReportFile::open(&dir).is_err());
        // Held open before the run; what the file held before is replaced, not appended to.
        std::fs::write(&file, "x".repeat(10_000)).unwrap();
        let held = ReportFile::open(&file).unwrap();
        assert!(matches!(held, ReportFile::Held(..)));
        report.write(Some(&held)).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(text.lines().count(), 1);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["exit_status"], 3);
        assert_eq!(v["denials"][0]["host"], "blocked.test");
        assert_eq!(v["denials"][0]["count"], 6);
        // `hint` is omitted when absent; the other options are null.
        assert!(v["denials"][0].get("hint").is_none());
        assert!(v["denials"][0]["detail"].is_null());
        assert_eq!(v["tampering"][0]["path"], "/w/.git/commondir");
        assert_eq!(v["tampering"][0]["kind"], "git_commondir");
        assert_eq!(v["denials_dropped"], 0);
        assert_eq!(v["mediator_masked"][0]["path"], "/srv/ca");
        assert_eq!(v["runs_as"], serde_json::json!({"uid": 7, "gid": 8}));
    }
}
