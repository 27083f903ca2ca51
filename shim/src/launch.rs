//! One run of the shim, OS-independent: resolve the channel, prepare the CA files, give the
//! [`Job`] to a [`Backend`], serve the proxy listener it hands back (relay to the
//! authority's socket, or the embedded mediator), and write the `--report`.
//!
//! It never confines anything itself and names no backend: the caller picks one. What it
//! can check itself (the channel, the socket's directory, the CA file) it checks before
//! the backend starts.

use std::net::TcpListener;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::ca::TrustFiles;
use crate::cli::{ChannelSpec, Settings};
use crate::embedded::Embedded;
use crate::error::{Error, Result};
use crate::relay::{self, RelayStats};
use crate::report::Report;
use crate::sandbox::{Backend, Job};

/// Confine and run `settings.command` with `backend`; returns the status to leave with.
///
/// The CA files (see [`crate::ca`]) are removed before returning, by the backend, which
/// also removes them if the shim itself is killed.
///
/// # Errors
/// Any [`Error`] that stops the sandbox from being built exactly as asked (nothing has run
/// then), the embedded mediator's refusal to start, or a report that cannot be written.
pub(crate) fn run(backend: &impl Backend, settings: &Settings) -> Result<i32> {
    let channel = Channel::resolve(&settings.channel)?;
    let deny_read = deny_read(settings)?;
    let trust = match &settings.ca_cert {
        Some(ca) => Some(TrustFiles::create(&crate::ca::load(ca)?)?),
        None => None,
    };
    let job = Job {
        command: &settings.command,
        allow_write: &settings.allow_write,
        deny_read: &deny_read,
        allow_read: &settings.allow_read,
        allow_unix_sockets: settings.allow_unix_sockets,
        allow_degraded: &settings.allow_degraded,
        trust: trust.as_ref(),
    };
    let mut serving = Serving::Nothing;
    let outcome = backend.run(&job, |listener| {
        serving = channel.serve(listener)?;
        Ok(())
    })?;
    let (channel, connections, channel_errors, denials, source) = match serving {
        Serving::Relay(socket, stats) => (
            socket.display().to_string(),
            stats.connections.load(Ordering::Relaxed),
            stats.channel_errors.load(Ordering::Relaxed),
            stats.denials.take(),
            "relay: denials seen in the mediator's replies on this run's channel",
        ),
        Serving::Embedded(e) => {
            let connections = e.connections.load(Ordering::Relaxed);
            (
                "embedded".to_owned(),
                connections,
                0,
                e.finish(),
                "the embedded mediator's decisions",
            )
        }
        Serving::Nothing => (
            String::new(),
            0,
            0,
            (Vec::new(), 0),
            "none: the sandbox did not start",
        ),
    };
    if let Some(dest) = &settings.report {
        Report {
            report: "shim",
            channel,
            exit_status: outcome.exit_status,
            connections,
            channel_errors,
            denials: &denials.0,
            denials_dropped: denials.1,
            source,
            tampering: &outcome.tampering,
        }
        .write(dest.as_deref())?;
    }
    Ok(outcome.exit_status)
}

/// The settings' read-denied paths, plus the directory of the authority's socket: with
/// `--allow-unix-sockets` the command could otherwise connect to any authority's socket
/// there (or the admin socket).
///
/// # Errors
/// [`Error::Usage`] when that directory is `/` (masking it would hide everything).
fn deny_read(settings: &Settings) -> Result<Vec<PathBuf>> {
    let mut deny_read = settings.deny_read.clone();
    if let ChannelSpec::Socket(p) = &settings.channel {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            if std::fs::canonicalize(dir).is_ok_and(|d| d == Path::new("/")) {
                return Err(Error::Usage(format!(
                    "the mediator socket {} must be in a directory of its own (it is masked inside the sandbox), not in /",
                    p.display()
                )));
            }
            deny_read.push(dir.to_owned());
        }
    }
    Ok(deny_read)
}

/// Where the sandbox's proxy connections go, checked before anything runs.
enum Channel {
    /// Relayed to a running mediator's per-authority Unix socket.
    Socket(PathBuf),
    /// Served by an in-process mediator (validated config, decision-log file).
    Embedded(Box<policy::config::Config>, Option<PathBuf>),
}

impl Channel {
    /// Check the socket, or build and validate the embedded grant.
    ///
    /// # Errors
    /// [`Error::Channel`] when the socket is missing or not a socket; the errors of
    /// [`crate::embedded::config`].
    fn resolve(spec: &ChannelSpec) -> Result<Self> {
        Ok(match spec {
            ChannelSpec::Socket(p) => {
                check_socket(p)?;
                Self::Socket(p.clone())
            }
            ChannelSpec::Embedded {
                allow,
                deny,
                allow_private,
                decision_log,
            } => Self::Embedded(
                Box::new(crate::embedded::config(allow, deny, allow_private)?),
                decision_log.clone(),
            ),
        })
    }

    /// Start serving the sandbox's listener.
    ///
    /// # Errors
    /// [`Error::Io`] if the relay thread cannot start; the errors of [`Embedded::start`].
    fn serve(self, listener: TcpListener) -> Result<Serving> {
        match self {
            Self::Socket(socket) => {
                let stats = Arc::new(RelayStats::default());
                let (sock, st) = (socket.clone(), Arc::clone(&stats));
                std::thread::Builder::new()
                    .name("relay-accept".into())
                    .spawn(move || relay::serve(listener, sock, st))
                    .map_err(|e| Error::io("start the relay", e))?;
                Ok(Serving::Relay(socket, stats))
            }
            Self::Embedded(config, log) => Ok(Serving::Embedded(Embedded::start(
                *config,
                listener,
                log.as_deref(),
            )?)),
        }
    }
}

fn check_socket(socket: &Path) -> Result<()> {
    let meta = std::fs::metadata(socket).map_err(|e| Error::Channel {
        path: socket.to_owned(),
        detail: if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "{e}: the mediator makes this socket while it runs; is it running with this \
                 socket_dir (`mediator --config FILE`), and is the authority in its config?"
            )
        } else {
            e.to_string()
        },
    })?;
    if !meta.file_type().is_socket() {
        return Err(Error::Channel {
            path: socket.to_owned(),
            detail: "not a Unix socket".into(),
        });
    }
    Ok(())
}

/// What serves the listener once the sandbox handed it out.
enum Serving {
    Relay(PathBuf, Arc<RelayStats>),
    Embedded(Embedded),
    /// The sandbox failed before handing the listener out (the backend said why).
    Nothing,
}
