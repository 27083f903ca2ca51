//! A run's channel: the running mediator's socket (relayed) or an embedded mediator,
//! resolved before the sandbox is built and served once the backend hands the proxy
//! listener (and the TUN device) out; what it served, for the report.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::capture::{Capture, Dial, Summary};
use crate::cli::{ChannelSpec, Settings};
use crate::control::{Binding, Bound, Rebinder};
use crate::embedded::Embedded;
use crate::error::{Error, Result};
use crate::feed::{Answers, Feed};
use crate::relay::{self, RelayStats};
use crate::report::Denials;
use crate::sandbox::{CaptureJob, CaptureState, Handoff};

/// Where the sandbox's proxy connections go, checked before anything runs.
pub(super) enum Channel {
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
    pub(super) fn decision_log(&self) -> Option<&Path> {
        match self {
            Self::Embedded(_, Some((path, _)), _) => Some(path),
            _ => None,
        }
    }

    /// Where new connections go until a rebind (`--control`).
    pub(super) fn first_binding(&self) -> Bound {
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
    /// With `asks` (`--control`), the embedded authority asks the host about a grant miss
    /// (design section 20).
    pub(super) fn resolve(spec: &ChannelSpec, asks: bool) -> Result<Self> {
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
                let (config, grant) =
                    crate::embedded::config(allow, deny, allow_private, resolve, asks)?;
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
    pub(super) fn serve(
        self,
        handoff: Handoff,
        capture: Option<CaptureJob>,
        denials: &Arc<Denials>,
        admin: Option<Admin>,
        binding: &Arc<Binding>,
        allow_unix_sockets: bool,
        trust: crate::rejected::Trust,
    ) -> Result<(Serving, Rebinder, Option<crate::control::AskingHost>)> {
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
        let mut asking = None;
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
                let dial = Dial::embedded(&e);
                let rebinder = e.rebinder();
                asking = e.asking_host();
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
            asking,
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

pub(super) struct Admin {
    endpoint: crate::cli::AdminEndpoint,
    authority: String,
    /// The run's start (RFC 3339).
    since: String,
}

impl Admin {
    /// The admin API the run's denials are read from: socket mode with a known one.
    pub(super) fn of(channel: &Channel, settings: &Settings) -> Option<Self> {
        match (channel, &settings.admin) {
            (Channel::Socket(_), Some((endpoint, authority))) => Some(Self {
                endpoint: endpoint.clone(),
                authority: authority.clone(),
                since: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            }),
            _ => None,
        }
    }
}

/// What serves the sandbox once it handed its listener (and TUN device) out.
pub(super) struct Serving {
    channel: Served,
    capture: CaptureRun,
    feed: Option<Feed>,
}

impl Serving {
    /// Ends what served the run (capture, the admin API's feed, the embedded mediator;
    /// `None`: the sandbox did not start) and says what it served, for the report.
    pub(super) fn finish(serving: Option<Self>) -> ServedSummary {
        let mut asked = Vec::new();
        let (channel, connections, channel_errors, source, capture) = match serving {
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
                        asked = e.asked();
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
        ServedSummary {
            channel,
            connections,
            channel_errors,
            source,
            capture,
            asked,
        }
    }

    /// Captured connections that could not reach the channel.
    fn capture_errors(&self) -> u64 {
        match &self.capture {
            CaptureRun::Running(c) => c.channel_errors(),
            CaptureRun::Done(_) => 0,
        }
    }
}

/// What a run's channel served, for the report.
pub(super) struct ServedSummary {
    /// The socket's path, `embedded`, or empty when the sandbox did not start.
    pub(super) channel: String,
    pub(super) connections: u64,
    pub(super) channel_errors: u64,
    /// Where the denials come from.
    pub(super) source: &'static str,
    pub(super) capture: Summary,
    /// The questions the run's requests raised (embedded mode).
    pub(super) asked: Vec<crate::asking::Asked>,
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
