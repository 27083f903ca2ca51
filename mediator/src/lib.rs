//! The egress mediator: a proxy (HTTP CONNECT, absolute-form HTTP, SOCKS5) that learns
//! which *authority* a connection belongs to from its channel, decides with that
//! authority's immutable grant, refuses destinations that resolve to non-public
//! addresses, connects only to the vetted addresses (the pin), and writes one JSON line
//! per decision and per closed connection.
//!
//! The per-connection path is `listener` (accept, identify) -> `http` / `socks`
//! (parse the request, canonicalise the target) -> `pipeline` (grant decision, `resolve`,
//! vet, `route`) -> `relay` -> close record in `decision_log`.
//!
//! Embedding: [`start`] runs a mediator inside the caller's tokio runtime and returns a
//! [`Running`] handle (used by the binary, the demo and the shim's embedded mode).

pub mod admin;
pub mod authorities;
pub mod config;
pub mod control;
pub mod counting;
pub mod decision_log;
pub mod demo;
pub mod error;
pub mod explain;
pub mod http;
pub mod listener;
pub mod metrics;
pub mod pipeline;
#[allow(unsafe_code)] // the SIOCOUTQ ioctl (send-queue length), one SAFETY-commented block
pub mod relay;
pub mod resolve;
pub mod rewind;
pub mod route;
pub mod sni;
pub mod socks;
pub mod tls;
pub mod tunnel;
pub mod watchdog;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use policy::OwnAddrs;
use policy::config::Config;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

pub use decision_log::{DecisionLog, Sink};
pub use error::Error;
use pipeline::Shared;

use crate::authorities::{Origin, Registry};
use crate::control::{Control, CreateError, ReloadReport};
use crate::metrics::Metrics;

/// A running mediator.
#[derive(Debug)]
pub struct Running {
    shared: Arc<Shared>,
    control: Arc<Control>,
    tcp: Option<SocketAddr>,
    admin: Option<SocketAddr>,
    admin_socket: Option<PathBuf>,
    draining: watch::Sender<bool>,
    closing: watch::Sender<bool>,
    admin_stop: watch::Sender<bool>,
    grace: Duration,
}

/// Binds every listener of `config` (shared TCP, per-authority Unix sockets, admin API on
/// TCP and/or its own Unix socket) and starts serving on the current tokio runtime. The
/// decision log goes to `sink` when given, else where `[log] decisions` says.
///
/// # Errors
/// [`Error`] when a listener cannot be bound, the resolver cannot be configured, the
/// metrics cannot be registered or the decision log cannot be opened. Nothing is left
/// listening on error.
pub async fn start(config: Config, sink: Option<Sink>) -> Result<Running, Error> {
    let sink = sink.unwrap_or_else(|| match &config.log {
        policy::config::Log::Stdout => Sink::Stdout,
        policy::config::Log::File(p) => Sink::File(p.clone()),
    });
    let log = DecisionLog::open(sink)?;
    let metrics = Metrics::new()?;
    let resolver = resolve::Resolver::new(
        &config.resolver.nameservers,
        config.resolver.hosts.clone(),
        config.timeouts.dns,
    )?;
    // Before any listener: a CA that cannot be loaded stops the start.
    let tls = tls::TlsState::load(&config.tls)?;
    // Before any listener too: no usable PAC (or proxy environment) stops the start.
    let router = route_for(&config).await?;

    let bind_tcp = |addr: SocketAddr, what: &'static str| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Listen {
                what: format!("{what} {addr}"),
                source,
            })
    };
    let tcp = match config.listen.tcp {
        Some(addr) => Some(bind_tcp(addr, "tcp").await?),
        None => None,
    };
    let admin = match config.listen.admin {
        Some(addr) => Some(bind_tcp(addr, "admin").await?),
        None => None,
    };
    let tcp_addr = tcp.as_ref().map(TcpListener::local_addr).transpose()?;
    let admin_addr = admin.as_ref().map(TcpListener::local_addr).transpose()?;
    let admin_unix: Option<UnixListener> = match &config.listen.admin_socket {
        Some(path) => Some(listener::bind_socket_file(path, 0o600, None, None)?),
        None => None,
    };
    let mut own = Vec::new();
    own.extend(tcp_addr);
    own.extend(admin_addr);

    let (draining_tx, draining_rx) = watch::channel(false);
    let (closing_tx, closing_rx) = watch::channel(false);
    let (admin_stop_tx, admin_stop_rx) = watch::channel(false);
    let shared = Arc::new(Shared::new(
        (Registry::new(), metrics),
        resolver,
        log,
        OwnAddrs(own),
        (config.timeouts, config.limits),
        pipeline::Signals {
            closing: closing_rx,
            draining: draining_rx,
        },
    ));
    if let Some(tls) = tls {
        // `shared` is fresh: nothing else can have set it.
        let _ = shared.tls.set(Arc::new(tls));
    }
    let _ = shared.router.set(router);
    let control = Arc::new(Control::new(
        Arc::clone(&shared),
        config.listen.socket_dir.clone(),
        tcp_addr,
        config.timeouts.revoke_grace,
        config.global_deny.clone(),
    ));
    shared.metrics.set_authorities(0);
    for authority in config.authorities {
        if let Err(e) = control.add(authority, Origin::Config) {
            for live in shared.authorities.list() {
                control.revoke(live.name());
            }
            if let Some(path) = &config.listen.admin_socket {
                let _ = std::fs::remove_file(path);
            }
            return Err(match e {
                CreateError::Listen(e) => e,
                CreateError::Duplicate(name) => {
                    Error::Control(format!("authority {name:?} is defined twice"))
                }
                CreateError::Invalid(v) => Error::Control(format!("{v:?}")),
            });
        }
    }
    if let Some(l) = tcp {
        tokio::spawn(listener::accept_tcp(l, Arc::clone(&shared)));
    }
    let admin_api = Arc::new(admin::Admin::new(
        Arc::clone(&control),
        config.listen.admin_token_sha256,
    ));
    if let Some(l) = admin {
        tokio::spawn(admin::serve_tcp(
            l,
            Arc::clone(&admin_api),
            admin_stop_rx.clone(),
        ));
    }
    if let Some(l) = admin_unix {
        tokio::spawn(admin::serve_unix(l, Arc::clone(&admin_api), admin_stop_rx));
    }
    Ok(Running {
        shared,
        control,
        tcp: tcp_addr,
        admin: admin_addr,
        admin_socket: config.listen.admin_socket,
        draining: draining_tx,
        closing: closing_tx,
        admin_stop: admin_stop_tx,
        grace: config.timeouts.shutdown_grace,
    })
}

/// Builds the router of `[upstream]` (design section 8) with its own instance of the
/// mediator's resolver (same nameservers and `hosts`): PAC helpers and parent names
/// resolve exactly as destinations do, never through the system resolver. `env` mode
/// reads the mediator's proxy variables here, once.
async fn route_for(config: &Config) -> Result<Arc<route::Router>, Error> {
    let resolver = Arc::new(resolve::Resolver::new(
        &config.resolver.nameservers,
        config.resolver.hosts.clone(),
        config.timeouts.dns,
    )?);
    route::Router::new(
        &config.upstream,
        &config.tls.extra_ca_files,
        resolver,
        (config.timeouts.connect, config.timeouts.dns),
        |key| std::env::var(key).ok(),
    )
    .await
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

    /// The Unix socket path of `authority`, if it is live and has one.
    pub fn socket_path(&self, authority: &str) -> Option<PathBuf> {
        self.shared
            .authorities
            .get(authority)
            .and_then(|l| l.socket.clone())
    }

    /// The decision log.
    pub fn log(&self) -> &DecisionLog {
        &self.shared.log
    }

    /// The CA certificate (PEM) that TLS termination issues leaves from, when `[tls]
    /// ca_dir` is configured: what a child's trust store needs (the shim exports it).
    pub fn tls_ca_pem(&self) -> Option<&str> {
        self.shared.tls.get().map(|t| t.ca_pem())
    }

    /// The control plane (add, revoke, reload).
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// Applies a new configuration parsed from `text` (see [`Control::reload`]).
    pub fn reload(&self, config: Config, text: &str) -> ReloadReport {
        self.control.reload(config, text)
    }

    /// Serves a connection that arrives by other means than a listener (embedded mode):
    /// it is attributed to `authority`, with channel `embedded`.
    pub fn serve_embedded<S>(&self, io: S, authority: &str) -> bool
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Some(auth) = self
            .shared
            .authorities
            .get(authority)
            .map(|l| Arc::clone(&l.authority))
        else {
            return false;
        };
        let shared = Arc::clone(&self.shared);
        let ctx = pipeline::Ctx {
            conn: shared.next_id(),
            peer: decision_log::Peer::Embedded,
            authority: Some(auth),
            request: None,
        };
        tokio::spawn(async move {
            let _guard = shared.enter();
            listener::dispatch(io, shared, ctx).await;
        });
        true
    }

    /// Graceful shutdown: stop accepting and remove the socket files at once (the admin
    /// API keeps answering, `/readyz` with 503), let live connections drain for
    /// `shutdown_grace`, then close what is left (each still gets its close record), flush
    /// the decision log and stop the admin API.
    pub async fn shutdown(self) {
        let _ = self.draining.send(true);
        for live in self.shared.authorities.list() {
            if let Some(path) = &live.socket {
                if let Err(e) = std::fs::remove_file(path) {
                    tracing::warn!("cannot remove {}: {e}", path.display());
                }
            }
        }
        if !self.shared.wait_idle(self.grace).await {
            tracing::info!(
                "shutdown grace over; closing {} live connection(s)",
                self.shared.active()
            );
            let _ = self.closing.send(true);
            let _ = self.shared.wait_idle(Duration::from_secs(2)).await;
        }
        self.shared.log.flush();
        let _ = self.admin_stop.send(true);
        if let Some(path) = &self.admin_socket {
            if let Err(e) = std::fs::remove_file(path) {
                tracing::warn!("cannot remove {}: {e}", path.display());
            }
        }
    }
}
