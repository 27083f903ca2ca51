//! The handle of a started mediator ([`Running`]): its addresses, what the binary and the
//! shim ask of it while it runs (reload, add an authority, serve a connection handed in),
//! and the graceful shutdown that drains it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use policy::config::Config;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use crate::audit::ReloadTrigger;
use crate::conn::accept::{attributed_ctx, spawn_conn};
use crate::control::{Control, CreateError, ReloadRefused, ReloadReport};
use crate::decision_log::{DecisionLog, Peer};
use crate::error::{Error, ErrorCause};
use crate::labels::Labels;
use crate::shared::Shared;
use crate::tls::TlsState;

/// A running mediator.
#[derive(Debug)]
pub struct Running {
    pub(super) shared: Arc<Shared>,
    pub(super) control: Arc<Control>,
    pub(super) tcp: Option<SocketAddr>,
    pub(super) admin: Option<SocketAddr>,
    pub(super) admin_socket: Option<PathBuf>,
    pub(super) admin_stop: CancellationToken,
    pub(super) grace: Duration,
}

impl Drop for Running {
    /// A mediator dropped without [`Running::shutdown`] stops its serving threads (their
    /// connections end with them).
    fn drop(&mut self) {
        self.shared.serving.cancel();
    }
}

impl Running {
    /// The bound address of the shared TCP listener, if configured.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// The bound address of the admin API's TCP listener, if configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// Counts and audits a reload that never reached [`Self::reload`]: its file could not
    /// be read or parsed (`why`; `mediator_reloads_total{result="failed"}`).
    pub fn reload_failed(&self, trigger: ReloadTrigger, why: &str) {
        self.shared
            .metrics
            .reloaded(crate::vocab::ReloadResult::Failed);
        let record = crate::audit::reload_record(&self.shared, trigger, &[], Err(why.to_owned()));
        self.control.audit().record(&self.shared, record);
        self.shared.log.flush();
    }

    /// Makes `authority` live beside the others, as an authority of the configuration
    /// (the embedded mediator's rebind, design section 18: a new authority, never an
    /// edited grant). Must run inside the mediator's runtime.
    ///
    /// # Errors
    /// [`Error::Control`] when an authority of that name is live, or its socket cannot
    /// be created.
    pub fn add_authority(&self, authority: policy::config::Authority) -> Result<(), Error> {
        let name = authority.grant.name().to_owned();
        self.control.add(authority).map(drop).map_err(|e| match e {
            CreateError::Duplicate(n) | CreateError::OfTheFile(n) => {
                Error::control(format!("authority \"{n}\" is live already"))
            }
            CreateError::Listen(e) => Error::control_by(
                format!("authority \"{name}\""),
                ErrorCause::Mediator(Box::new(e)),
            ),
            CreateError::Invalid(_) | CreateError::Unavailable(_) => {
                Error::control(format!("authority \"{name}\" cannot be added"))
            }
            CreateError::Store(e) => Error::control_by(
                format!("authority \"{name}\" cannot be added"),
                ErrorCause::inner(e),
            ),
        })
    }

    /// The Unix socket path of `authority`, if it is live and has one.
    pub fn socket_path(&self, authority: &str) -> Option<PathBuf> {
        self.shared
            .authorities
            .get(authority)
            .and_then(|l| l.socket.clone())
    }

    /// The limits in force, derived values included, as `key=value` fields
    /// (`max_connections=4950 authority_connections=1237 ...`, the `ready` line's).
    pub fn limits(&self) -> String {
        self.shared.limiter.in_force().fields()
    }

    /// The decision log.
    pub fn log(&self) -> &DecisionLog {
        &self.shared.log
    }

    /// The CA certificate (PEM) that TLS termination issues leaves from, when `[tls]
    /// ca_dir` is configured: what a child's trust store needs (the shim exports it).
    pub fn tls_ca_pem(&self) -> Option<&str> {
        self.shared.tls.as_deref().map(TlsState::ca_pem)
    }

    /// The node this replica serves (`[registry] node` as resolved at start): a reload
    /// places the file's authorities by it ([`crate::config::parse_on`]).
    pub fn node(&self) -> &str {
        self.control.store().node()
    }

    /// Records the configuration text the running set was built from, so that a later
    /// [`Self::reload`] can tell which authorities changed. Called once after start.
    pub fn set_baseline(&self, text: &str) {
        self.control.set_baseline(text);
    }

    /// Applies a new configuration parsed from `text`: authorities added, revoked, or
    /// (changed) revoked and re-created; other sections need a restart. One audit record
    /// says what it did and what `trigger` started it, on record before this returns.
    ///
    /// # Errors
    /// [`ReloadRefused`] when the file defines a name a stored API authority holds;
    /// nothing is changed.
    pub fn reload(
        &self,
        config: Config,
        text: &str,
        trigger: ReloadTrigger,
    ) -> Result<ReloadReport, ReloadRefused> {
        use crate::vocab::ReloadResult;
        let before = self.shared.authorities.list();
        let result = self.control.reload(config, text);
        let record = crate::audit::reload_record(
            &self.shared,
            trigger,
            &before,
            result
                .as_ref()
                .map(|r| crate::audit::Reloaded {
                    added: &r.added,
                    removed: &r.removed,
                    changed: &r.changed,
                    failed: &r.failed,
                })
                .map_err(ToString::to_string),
        );
        self.control.audit().record(&self.shared, record);
        self.shared.log.flush();
        let report = result.inspect_err(|_| {
            self.shared.metrics.reloaded(ReloadResult::Failed);
        })?;
        self.shared.metrics.reloaded(if report.failed.is_empty() {
            ReloadResult::Ok
        } else {
            ReloadResult::Partial
        });
        // `[upstream] mode = "system"`: the desktop settings are read again too.
        self.shared.router.reread();
        Ok(report)
    }

    /// Serves a connection that arrives by other means than a listener (embedded mode):
    /// it is attributed to `authority`, with channel `embedded`, and every record of it
    /// carries `labels` (design section 20: the invocation and the host's tags; pass
    /// `&Labels::default()` for none). `false` when no such authority is live.
    pub fn serve_embedded<S>(&self, io: S, authority: &str, labels: &Labels) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Some(live) = self.shared.authorities.get(authority) else {
            return false;
        };
        let ctx = attributed_ctx(&self.shared, &live, Peer::Embedded).labelled(labels.clone());
        spawn_conn(&self.shared, io, ctx);
        true
    }

    /// [`Self::serve_embedded`] for a connection the shim captured transparently (design
    /// section 15): its lines carry `capture: true`.
    pub fn serve_captured<S>(&self, io: S, authority: &str, labels: &Labels) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Some(live) = self.shared.authorities.get(authority) else {
            return false;
        };
        let ctx = attributed_ctx(&self.shared, &live, Peer::Embedded)
            .captured()
            .labelled(labels.clone());
        spawn_conn(&self.shared, io, ctx);
        true
    }

    /// Graceful shutdown: stop accepting and remove the socket files at once (the admin
    /// API keeps answering, `/readyz` with 503), let live connections drain for
    /// `shutdown_grace`, then close what is left (each still gets its close record), flush
    /// the decision log and stop the admin API.
    pub async fn shutdown(self) {
        self.shared.signals.draining.cancel();
        for live in self.shared.authorities.list() {
            if let Some(path) = &live.socket
                && let Err(e) = std::fs::remove_file(path)
            {
                tracing::warn!("cannot remove {}: {e}", path.display());
            }
        }
        if !self.shared.wait_idle(self.grace).await {
            tracing::info!(
                "shutdown grace over; closing {} live connection(s)",
                self.shared.active()
            );
            self.shared.signals.closing.cancel();
            let _ = self.shared.wait_idle(Duration::from_secs(2)).await;
        }
        // What is left on the serving threads ends with them (its close records queued)
        // before the log is flushed.
        let shared = Arc::clone(&self.shared);
        if let Err(e) = tokio::task::spawn_blocking(move || shared.serving.stop()).await {
            tracing::warn!("stopping the serving threads: {e}");
        }
        self.shared.log.flush();
        crate::socket_file::remove_staging();
        self.admin_stop.cancel();
        if let Some(path) = &self.admin_socket
            && let Err(e) = std::fs::remove_file(path)
        {
            tracing::warn!("cannot remove {}: {e}", path.display());
        }
    }
}
