//! One run of the shim, OS-independent: resolve the channel, prepare the CA files, give the
//! [`Job`] to a [`Backend`], serve the proxy listener it hands back (relay to the
//! authority's socket, or the embedded mediator), and write the `--report`.
//!
//! It never confines anything itself and names no backend: the caller picks one. What it
//! can check itself (the channel, the socket's directory, the CA file) it checks before
//! the backend starts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::ca::TrustFiles;
use crate::capture::{Addresses, Capture, Dial, Summary};
use crate::cli::{CaptureMode, ChannelSpec, Settings};
use crate::control::{Binding, Bound, ControlSocket, Rebinder};
use crate::embedded::Embedded;
use crate::error::{Error, Result};
use crate::feed::{Answers, Feed};
use crate::relay::{self, RelayStats};
use crate::report::{Denials, FILESYSTEM, Report, ReportFile};
use crate::sandbox::{Backend, CaptureJob, CaptureState, Handoff, Job};
use crate::violations::{Sink, Violations};

/// Confine and run `settings.command` with `backend`; returns the status to leave with.
///
/// The CA files (see [`crate::ca`]) are removed before returning, by the backend, which
/// also removes them if the shim itself is killed.
///
/// # Errors
/// Any [`Error`] that stops the sandbox from being built exactly as asked (nothing has run
/// then), the embedded mediator's refusal to start, or a report that cannot be written.
#[expect(
    clippy::too_many_lines,
    reason = "one run: channel, backend, child, report, in order"
)]
pub(crate) fn run(backend: &impl Backend, settings: &Settings) -> Result<i32> {
    let handover =
        crate::handover::Handover::check(&settings.pass_fd, &settings.listen_fd, |fd| {
            backend.probe_fd(fd)
        })?;
    let channel = Channel::resolve(&settings.channel)?;
    let ca_pem = settings.ca_cert.as_ref().map(crate::ca::load).transpose()?;
    // The mediator's files: the config's and the default locations, masked (checked
    // before anything is made on the host).
    let mut mediator_paths = settings.mediator_paths.clone();
    mediator_paths.extend(crate::secrets::defaults(|k| std::env::var_os(k)));
    let mediator =
        crate::secrets::settle(mediator_paths, &settings.allow_write, &settings.allow_read)?;
    if let ChannelSpec::Socket(socket) = &settings.channel {
        crate::secrets::warn_same_owner(socket, backend.command_uid(&settings.allow_degraded));
    }
    // Bound before the sandbox is built, so that it is masked inside.
    let mut control = settings
        .control
        .as_deref()
        .map(ControlSocket::bind)
        .transpose()?;
    let cache = settings.cache.as_deref().map(cache_dir).transpose()?;
    let mut allow_write = settings.allow_write.clone();
    allow_write.extend(cache.clone());
    let mut deny_read = deny_read(settings)?;
    deny_read.extend(control.as_ref().map(|c| c.path().to_owned()));
    deny_read.extend(mediator.masks);
    // The caller's cargo registry tokens are not the command's (design section 14).
    deny_read.extend(crate::caches::cargo_credentials(
        std::env::var_os("CARGO_HOME").map(PathBuf::from).as_deref(),
        std::env::var_os("HOME").map(PathBuf::from).as_deref(),
    ));
    let mut allow_read = settings.allow_read.clone();
    allow_read.extend(mediator.reopen);
    let report_file = match &settings.report {
        Some(Some(path)) => Some(ReportFile::open(path)?),
        _ => None,
    };
    let binding = Arc::new(Binding::new(channel.first_binding()));
    let trust = match &ca_pem {
        Some(pem) => Some(TrustFiles::create(pem)?),
        None => None,
    };
    let capture = match settings.capture {
        CaptureMode::Off => None,
        mode => Some(CaptureJob {
            addrs: Addresses::generate(),
            required: mode == CaptureMode::Required,
        }),
    };
    // Filesystem violations: observed when asked for live or in the report.
    let violations = if settings.violations.is_some() || settings.report.is_some() {
        let sink = settings.violations.as_deref().map(Sink::open).transpose()?;
        Some(Arc::new(Violations::new(sink, settings.live_denials)))
    } else {
        None
    };
    // The run's own records, written from outside, are masked inside: the command can
    // neither forge lines in them nor read them, and the shim never opens their paths
    // again after the command could have replaced one.
    deny_read.extend(
        [
            channel.decision_log(),
            settings.violations.as_deref().and_then(Sink::named_file),
            report_file.as_ref().map(ReportFile::path),
        ]
        .into_iter()
        .flatten()
        .filter_map(maskable),
    );
    let job = Job {
        handover: &handover,
        command: &settings.command,
        allow_write: &allow_write,
        deny_read: &deny_read,
        allow_read: &allow_read,
        allow_unix_sockets: settings.allow_unix_sockets,
        allow_degraded: &settings.allow_degraded,
        trust: trust.as_ref(),
        capture,
        child_env: &settings.child_env,
        hidden_env: &settings.hidden_env,
        violations: violations.clone(),
        tmp: settings.tmp.as_ref(),
        cache: cache.as_deref(),
    };
    // The run's one list of denials, said on stderr as they happen unless --quiet-denials.
    let denials = Arc::new(Denials::new(settings.live_denials));
    // Socket mode with a known admin API: the run's denials come from there (from now on).
    let admin = match (&channel, &settings.admin) {
        (Channel::Socket(_), Some((endpoint, authority))) => Some(Admin {
            endpoint: endpoint.clone(),
            authority: authority.clone(),
            since: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        }),
        _ => None,
    };
    // What a client that refuses the mediator's certificate is told (see crate::rejected).
    let told = crate::rejected::Trust {
        bundle: trust.as_ref().map(|t| t.files().bundle),
        program_of: backend.program_of(),
        clients: Arc::default(),
    };
    let mut serving = None;
    let outcome = backend.run(&job, |handoff| {
        let (served, rebinder) = channel.serve(
            handoff,
            capture,
            &denials,
            admin,
            &binding,
            settings.allow_unix_sockets,
            told,
        )?;
        serving = Some(served);
        if let Some(c) = &mut control {
            c.serve(Arc::clone(&binding), rebinder)?;
        }
        Ok(())
    })?;
    drop(control);
    if let Some(v) = &violations {
        v.finish();
    }
    let (channel, connections, channel_errors, source, summary) = match serving {
        Some(s) => {
            let errors = s.capture_errors();
            let summary = s.capture.finish();
            let from_admin = s.feed.is_some();
            if let Some(feed) = s.feed {
                feed.finish();
            }
            let (channel, connections, relay_errors, source) = match s.channel {
                Served::Relay(socket, stats) => (
                    socket.display().to_string(),
                    stats.connections.load(Ordering::Relaxed),
                    stats.channel_errors.load(Ordering::Relaxed),
                    if from_admin {
                        "the mediator's admin API: the denials of this run's connections"
                    } else {
                        "relay: denials seen in the mediator's replies on this run's channel"
                    },
                ),
                Served::Embedded(e) => {
                    let connections = e.connections.load(Ordering::Relaxed);
                    e.finish();
                    (
                        "embedded".to_owned(),
                        connections,
                        0,
                        "the embedded mediator's decisions (and capture's stub resolver)",
                    )
                }
            };
            (channel, connections, relay_errors + errors, source, summary)
        }
        None => (
            String::new(),
            0,
            0,
            "none: the sandbox did not start",
            Summary::without("off", None),
        ),
    };
    let failures = denials.take_failures();
    let denials = denials.take();
    if settings.report.is_some() {
        let capture = serde_json::to_value(&summary)
            .map_err(|e| Error::io("serialise the report", e.into()))?;
        Report {
            report: "shim",
            channel,
            exit_status: outcome.exit_status,
            connections,
            channel_errors,
            channel_failures: &failures,
            denials: &denials.0,
            denials_dropped: denials.1,
            source,
            tampering: &outcome.tampering,
            capture: &capture,
            rebinds: &binding.rebinds().0,
            mediator_masked: &serde_json::to_value(&mediator.masked)
                .map_err(|e| Error::io("serialise the report", e.into()))?,
            runs_as: outcome.runs_as,
            filesystem: &violations.as_ref().map_or_else(
                || serde_json::json!({ "observed": false, "note": FILESYSTEM }),
                |v| v.summary(),
            ),
        }
        .write(report_file.as_ref())?;
    }
    Ok(outcome.exit_status)
}

/// `--cache DIR`, made if missing (0700, with its parents) and canonical.
///
/// # Errors
/// [`Error::Path`] when it cannot be made or resolved, [`Error::Usage`] when it is `/`.
fn cache_dir(dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let path_error = |source| Error::Path {
        what: "--cache",
        path: dir.to_owned(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(path_error)?;
    let canonical = std::fs::canonicalize(dir).map_err(path_error)?;
    if canonical == Path::new("/") || !canonical.is_dir() {
        return Err(Error::Usage(format!(
            "--cache {}: name a directory of its own",
            dir.display()
        )));
    }
    Ok(canonical)
}

/// The settings' read-denied paths, plus the directory of the authority's socket: with
/// `--allow-unix-sockets` the command could otherwise connect to any authority's socket
/// there (or the admin socket).
///
/// # Errors
/// [`Error::Usage`] when that directory is `/` (masking it would hide everything).
fn deny_read(settings: &Settings) -> Result<Vec<PathBuf>> {
    let mut deny_read = settings.deny_read.clone();
    if let ChannelSpec::Socket(p) = &settings.channel
        && let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty())
    {
        if std::fs::canonicalize(dir).is_ok_and(|d| d == Path::new("/")) {
            return Err(Error::Usage(format!(
                "the mediator socket {} must be in a directory of its own (it is masked inside the sandbox), not in /",
                p.display()
            )));
        }
        deny_read.push(dir.to_owned());
    }
    Ok(deny_read)
}

/// `path`, canonical, when it is a regular file or a FIFO: what masking one of the run's
/// own records covers. A terminal or `/dev/null` named as one stays as it is (a command
/// may open its terminal by name), and so does a path that cannot be resolved (a pipe
/// named through `/dev/stderr`).
fn maskable(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let canonical = std::fs::canonicalize(path).ok()?;
    let kind = std::fs::metadata(&canonical).ok()?.file_type();
    (kind.is_file() || kind.is_fifo()).then_some(canonical)
}

/// Where the sandbox's proxy connections go, checked before anything runs.
enum Channel {
    /// Relayed to a running mediator's per-authority Unix socket.
    Socket(PathBuf),
    /// Served by an in-process mediator (validated config, the decision-log file as named
    /// and opened before the sandbox exists, and the same grant for capture's stub
    /// resolver).
    Embedded(
        Box<policy::config::Config>,
        Option<(PathBuf, std::fs::File)>,
        Arc<policy::Grant>,
    ),
}

impl Channel {
    /// The decision-log file of an embedded mediator, as named.
    fn decision_log(&self) -> Option<&Path> {
        match self {
            Self::Embedded(_, Some((path, _)), _) => Some(path),
            _ => None,
        }
    }

    /// Where new connections go until a rebind (`--control`).
    fn first_binding(&self) -> Bound {
        match self {
            Self::Socket(p) => Bound::Socket(p.clone()),
            Self::Embedded(_, _, grant) => Bound::Embedded {
                authority: crate::embedded::AUTHORITY.into(),
                grant: Arc::clone(grant),
            },
        }
    }

    /// Check the socket, or build and validate the embedded grant.
    ///
    /// # Errors
    /// [`Error::Channel`] when the socket is missing or not a socket; the errors of
    /// [`crate::embedded::config`].
    fn resolve(spec: &ChannelSpec) -> Result<Self> {
        Ok(match spec {
            ChannelSpec::Socket(p) => {
                crate::control::check_socket(p)?;
                Self::Socket(p.clone())
            }
            ChannelSpec::Embedded {
                allow,
                deny,
                allow_private,
                decision_log,
                resolve,
            } => {
                let (config, grant) = crate::embedded::config(allow, deny, allow_private, resolve)?;
                // Opened (made if absent) now: it exists from the start, empty when the
                // command decides nothing, and a path that cannot be one refuses the run.
                let log = match decision_log {
                    Some(p) => {
                        let file =
                            mediator::decision_log::open_append(p).map_err(|e| Error::Channel {
                                path: PathBuf::from("<embedded>"),
                                detail: e.to_string(),
                            })?;
                        Some((p.clone(), file))
                    }
                    None => None,
                };
                Self::Embedded(Box::new(config), log, Arc::new(grant))
            }
        })
    }

    /// Start serving the sandbox's listener, and its TUN device when capture is up.
    /// `allow_unix_sockets`: the command may connect to sockets it sees, so a rebind may
    /// not leave the masked socket directory (see [`crate::control::socket_rebinder`]).
    ///
    /// `trust`: what a client that refuses the mediator's certificate is told.
    ///
    /// # Errors
    /// [`Error::Io`] if the relay or capture thread cannot start; the errors of
    /// [`Embedded::start`].
    #[expect(
        clippy::too_many_arguments,
        reason = "the run's parts, each handed to what serves it"
    )]
    fn serve(
        self,
        handoff: Handoff,
        capture: Option<CaptureJob>,
        denials: &Arc<Denials>,
        admin: Option<Admin>,
        binding: &Arc<Binding>,
        allow_unix_sockets: bool,
        trust: crate::rejected::Trust,
    ) -> Result<(Serving, Rebinder)> {
        let feed = match admin {
            Some(a) => {
                let authorities = bound_authorities(a.authority, Arc::clone(binding));
                Some(
                    Feed::start(
                        a.endpoint,
                        authorities,
                        a.since,
                        Arc::clone(denials),
                        trust.clone(),
                    )
                    .map_err(|e| Error::io("start the denial feed", e))?,
                )
            }
            None => None,
        };
        // Socket mode: the denials read in the mediator's answers, said before the client
        // gets them (from the admin API at once, when there is one).
        let answers = Answers::new(Arc::clone(denials), feed.as_ref().map(Feed::polls));
        let (channel, dial, grant, rebinder) = match self {
            Self::Socket(socket) => {
                let stats = Arc::new(RelayStats {
                    connections: AtomicU64::new(0),
                    channel_errors: AtomicU64::new(0),
                    denials: Arc::clone(denials),
                    answers: answers.clone(),
                    trust: trust.clone(),
                });
                let (b, st) = (Arc::clone(binding), Arc::clone(&stats));
                let listener = handoff.listener;
                std::thread::Builder::new()
                    .name("relay-accept".into())
                    .spawn(move || relay::serve(listener, b, st))
                    .map_err(|e| Error::io("start the relay", e))?;
                let dial = Dial::Socket(Arc::clone(binding));
                let rebinder = crate::control::socket_rebinder(&socket, allow_unix_sockets);
                (Served::Relay(socket, stats), dial, None, rebinder)
            }
            Self::Embedded(config, log, _) => {
                let e = Embedded::start(
                    *config,
                    handoff.listener,
                    log.map(|(_, file)| file),
                    (Arc::clone(denials), trust.clone()),
                    Arc::clone(binding),
                )?;
                let dial = e.dial();
                let rebinder = e.rebinder();
                (
                    Served::Embedded(e),
                    dial,
                    Some(Arc::clone(binding)),
                    rebinder,
                )
            }
        };
        let capture = match (handoff.capture, capture) {
            (CaptureState::Up(tun), Some(job)) => {
                // Socket mode: the flows hand the denials of the mediator's answers over
                // (embedded mode: its tap records them).
                let answers = grant.is_none().then_some(answers);
                CaptureRun::Running(Capture::start(
                    tun,
                    job.addrs,
                    dial,
                    grant,
                    (Arc::clone(denials), trust),
                    answers,
                )?)
            }
            (CaptureState::Unavailable(why), _) => {
                eprintln!(
                    "shim: transparent capture is off: {why}; clients that ignore HTTP_PROXY have no network (proxy-aware clients are unaffected; --capture makes this an error, --no-capture silences it)"
                );
                CaptureRun::Done(Summary::without("unavailable", Some(why)))
            }
            _ => CaptureRun::Done(Summary::without("off", None)),
        };
        Ok((
            Serving {
                channel,
                capture,
                feed,
            },
            rebinder,
        ))
    }
}

/// Where socket mode reads the run's denials from (see [`crate::feed`]).
/// The authorities of the mediator whose admin API the feed reads that the run has been
/// bound to: `first`, then each rebind target that is a socket in the first socket's
/// directory (`<socket_dir>/<name>.sock`, that mediator's). A socket elsewhere belongs
/// to no authority this admin API knows; its denials come from the replies only.
fn bound_authorities(first: String, binding: Arc<Binding>) -> crate::feed::Authorities {
    let dir = match binding.first() {
        Bound::Socket(p) => p.parent().map(Path::to_owned),
        Bound::Embedded { .. } => None,
    };
    Box::new(move || {
        let mut names = vec![first.clone()];
        for r in binding.rebinds().0 {
            let to = Path::new(&r.to);
            let name = to
                .file_name()
                .and_then(|f| f.to_str())
                .and_then(|f| f.strip_suffix(".sock"));
            if let Some(name) = name
                && to.parent() == dir.as_deref()
                && !names.iter().any(|n| n == name)
            {
                names.push(name.to_owned());
            }
        }
        names
    })
}

struct Admin {
    endpoint: crate::cli::AdminEndpoint,
    authority: String,
    /// The run's start (RFC 3339).
    since: String,
}

/// What serves the sandbox once it handed its listener (and TUN device) out.
struct Serving {
    channel: Served,
    capture: CaptureRun,
    feed: Option<Feed>,
}

impl Serving {
    /// Captured connections that could not reach the channel.
    fn capture_errors(&self) -> u64 {
        match &self.capture {
            CaptureRun::Running(c) => c.channel_errors(),
            CaptureRun::Done(_) => 0,
        }
    }
}

/// The proxy listener's server.
enum Served {
    Relay(PathBuf, Arc<RelayStats>),
    Embedded(Embedded),
}

/// Capture, running or not.
enum CaptureRun {
    Running(Capture),
    Done(Summary),
}

impl CaptureRun {
    fn finish(self) -> Summary {
        match self {
            Self::Running(c) => c.finish(),
            Self::Done(s) => s,
        }
    }
}
