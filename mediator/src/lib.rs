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

pub mod config;
pub mod counting;
pub mod decision_log;
pub mod demo;
pub mod error;
pub mod http;
pub mod listener;
pub mod pipeline;
pub mod relay;
pub mod resolve;
pub mod route;
pub mod sni;
pub mod socks;
pub mod tunnel;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use policy::OwnAddrs;
use policy::config::Config;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use decision_log::{DecisionLog, Sink};
pub use error::Error;
use pipeline::Shared;

/// A running mediator.
#[derive(Debug)]
pub struct Running {
    shared: Arc<Shared>,
    tcp: Option<SocketAddr>,
    sockets: Vec<(String, PathBuf)>,
    draining: watch::Sender<bool>,
    closing: watch::Sender<bool>,
    grace: Duration,
}

/// Binds every listener of `config` and starts serving on the current tokio runtime.
/// The decision log goes to `sink` when given, else where `[log] decisions` says.
///
/// # Errors
/// [`Error`] when a listener cannot be bound, the resolver cannot be configured or the
/// decision log cannot be opened. Nothing is left listening on error.
pub async fn start(config: Config, sink: Option<Sink>) -> Result<Running, Error> {
    let sink = sink.unwrap_or_else(|| match &config.log {
        policy::config::Log::Stdout => Sink::Stdout,
        policy::config::Log::File(p) => Sink::File(p.clone()),
    });
    let log = DecisionLog::open(sink)?;
    let resolver = resolve::Resolver::new(
        &config.resolver.nameservers,
        config.resolver.hosts.clone(),
        config.timeouts.dns,
    )?;

    let tcp = match config.listen.tcp {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Listen {
                    what: format!("tcp {addr}"),
                    source,
                })?,
        ),
        None => None,
    };
    let tcp_addr = tcp.as_ref().map(TcpListener::local_addr).transpose()?;
    let mut own = Vec::new();
    own.extend(tcp_addr);
    own.extend(config.listen.admin);

    let authorities: HashMap<String, Arc<policy::config::Authority>> = config
        .authorities
        .into_iter()
        .map(|a| (a.grant.name().to_owned(), Arc::new(a)))
        .collect();

    let mut unix = Vec::new();
    let mut sockets = Vec::new();
    if let Some(dir) = &config.listen.socket_dir {
        let mut names: Vec<&String> = authorities.keys().collect();
        names.sort();
        for name in names {
            let auth = &authorities[name];
            match listener::bind_unix(dir, auth) {
                Ok((l, path)) => {
                    sockets.push((name.clone(), path));
                    unix.push((l, Arc::clone(auth)));
                }
                Err(e) => {
                    remove_sockets(&sockets);
                    return Err(e);
                }
            }
        }
    }

    let (draining_tx, draining_rx) = watch::channel(false);
    let (closing_tx, closing_rx) = watch::channel(false);
    let shared = Arc::new(Shared::new(
        authorities,
        resolver,
        log,
        OwnAddrs(own),
        (config.timeouts, config.limits),
        pipeline::Signals {
            closing: closing_rx,
            draining: draining_rx,
        },
    ));
    for (l, auth) in unix {
        tokio::spawn(listener::accept_unix(l, auth, Arc::clone(&shared)));
    }
    if let Some(l) = tcp {
        tokio::spawn(listener::accept_tcp(l, Arc::clone(&shared)));
    }
    Ok(Running {
        shared,
        tcp: tcp_addr,
        sockets,
        draining: draining_tx,
        closing: closing_tx,
        grace: config.timeouts.shutdown_grace,
    })
}

impl Running {
    /// The bound address of the shared TCP listener, if configured.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// The Unix socket path of `authority`, if it has one.
    pub fn socket_path(&self, authority: &str) -> Option<&Path> {
        self.sockets
            .iter()
            .find(|(n, _)| n == authority)
            .map(|(_, p)| p.as_path())
    }

    /// The decision log.
    pub fn log(&self) -> &DecisionLog {
        &self.shared.log
    }

    /// Serves a connection that arrives by other means than a listener (embedded mode):
    /// it is attributed to `authority`, with channel `embedded`.
    pub fn serve_embedded<S>(&self, io: S, authority: &str) -> bool
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Some(auth) = self.shared.authorities.get(authority).cloned() else {
            return false;
        };
        let shared = Arc::clone(&self.shared);
        let ctx = pipeline::Ctx {
            conn: shared.next_id(),
            peer: decision_log::Peer::Embedded,
            authority: Some(auth),
        };
        tokio::spawn(async move {
            let _guard = shared.enter();
            listener::dispatch(io, shared, ctx).await;
        });
        true
    }

    /// Graceful shutdown: stop accepting and remove the socket files at once, let live
    /// connections drain for `shutdown_grace`, then close what is left (each still gets
    /// its close record) and flush the decision log.
    pub async fn shutdown(self) {
        let _ = self.draining.send(true);
        remove_sockets(&self.sockets);
        if !self.shared.wait_idle(self.grace).await {
            tracing::info!(
                "shutdown grace over; closing {} live connection(s)",
                self.shared.active()
            );
            let _ = self.closing.send(true);
            let _ = self.shared.wait_idle(Duration::from_secs(2)).await;
        }
        self.shared.log.flush();
    }
}

fn remove_sockets(sockets: &[(String, PathBuf)]) {
    for (_, path) in sockets {
        if let Err(e) = std::fs::remove_file(path) {
            tracing::warn!("cannot remove {}: {e}", path.display());
        }
    }
}
