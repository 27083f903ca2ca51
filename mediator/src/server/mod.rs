//! Starting and stopping one mediator: every listener bound, the authorities of the
//! configuration added, the admin API served; and the graceful shutdown that drains them.
//! [`start`] runs inside the caller's tokio runtime (the binary, the demo, the shim's
//! embedded mode) and returns a [`Running`] handle.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use policy::OwnAddrs;
use policy::config::Config;
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

mod asking;
mod check;
mod running;

pub use check::{check_resources, limits_of, registry_listing};
pub use running::Running;

use crate::admin::{self, Admin, AdminDoor};
use crate::conn::accept::serve_tcp;
use crate::control::registry::{self, RegistryMetrics};
use crate::control::{Control, CreateError, Setup};
use crate::decision_log::{DecisionLog, Sink, Tap};
use crate::error::Error;
use crate::limits::{InForce, Limiter, raise_nofile};
use crate::metrics::Metrics;
use crate::resolve::Resolver;
use crate::route::Router;
use crate::serving::Serving;
use crate::shared::{Parts, Shared};
use crate::socket_file::bind_socket_file;
use crate::tls::TlsState;

/// How [`start`] writes its decision log.
#[derive(Default)]
pub struct Options {
    /// Where the decision log goes; `None`: where `[log] decisions` says.
    pub sink: Option<Sink>,
    /// Called with every record before it is written (see [`Tap`]).
    pub tap: Option<Tap>,
}

/// Binds every listener of `config` (shared TCP, per-authority Unix sockets, admin API on
/// TCP and/or its own Unix socket) and starts serving on the current tokio runtime. The
/// process's soft open-files limit is raised to its hard limit first, and the limits are
/// derived from it (design section 13).
///
/// # Errors
/// [`Error`] when a listener cannot be bound, the resolver cannot be configured, the
/// metrics cannot be registered, the CA or the PAC cannot be loaded, or the decision log
/// cannot be opened. Nothing is left listening on error.
pub async fn start(mut config: Config, options: Options) -> Result<Running, Error> {
    let metrics = Metrics::new()?;
    let log = decision_log(&config, options, &metrics)?;
    let resolver = resolver_of(&config)?;
    // Before any listener: a CA that cannot be loaded stops the start.
    let tls = TlsState::load(&config.tls)?.map(Arc::new);
    let router = router(&config).await?;
    let listeners = Listeners::bind(&config).await?;
    let own = OwnAddrs(
        listeners
            .tcp_addr
            .into_iter()
            .chain(listeners.admin_addr)
            .collect(),
    );
    let in_force = limits_in_force(&config);
    // Before any listener: a registry that cannot be opened (a state directory another
    // mediator holds, no start number) stops the start.
    let registry_metrics = RegistryMetrics::new(&metrics)?;
    let store = registry::open(&config.registry, registry_metrics.clone()).await?;
    // Only the authorities placed on this node or on every node are served here.
    config.place(store.node());
    let boot = store.boot().await.map_err(Error::RegistryBoot)?;
    let shared = Arc::new(Shared::new(Parts {
        metrics,
        resolver,
        router,
        tls,
        log,
        own,
        timeouts: config.timeouts,
        limits: config.limits,
        limiter: Arc::new(Limiter::new(in_force)),
        serving: Serving::start(serving_threads())?,
        boot,
    }));
    let setup = Setup {
        socket_dir: config.listen.socket_dir.clone(),
        tcp: listeners.tcp_addr,
        revoke_grace: config.timeouts.revoke_grace,
        global_deny: config.global_deny.clone(),
        store: Arc::clone(&store),
        registry_metrics,
        audit: crate::audit::Auditor::new(&shared.metrics)?,
    };
    let control = Control::new(Arc::clone(&shared), setup);
    crate::control::asks::start_poster(&control);
    control.set_placed_elsewhere(&config.placed_elsewhere);
    shared.metrics.set_authorities(0);
    let admin_api_on = config.listen.admin.is_some() || config.listen.admin_socket.is_some();
    let added = add_authorities(&control, config.authorities, admin_api_on).await;
    if let Err(e) = added {
        for live in shared.authorities.list() {
            control.revoke(live.name());
        }
        if let Some(path) = &config.listen.admin_socket {
            let _ = std::fs::remove_file(path);
        }
        return Err(e);
    }
    let (tcp, admin) = (listeners.tcp_addr, listeners.admin_addr);
    let (admin_stop, admin_socket) = listeners.serve(&shared, &control, config.listen)?;
    Ok(Running {
        shared,
        control,
        tcp,
        admin,
        admin_socket,
        admin_stop,
        grace: config.timeouts.shutdown_grace,
    })
}

/// The decision log: where `options` or `[log]` says, its records stamped and rendered
/// as configured, shipped over OTLP when `[telemetry]` names an endpoint.
fn decision_log(
    config: &Config,
    options: Options,
    metrics: &Metrics,
) -> Result<DecisionLog, Error> {
    let sink = options.sink.unwrap_or_else(|| match &config.log {
        policy::config::Log::Stdout => Sink::Stdout,
        policy::config::Log::File(p) => Sink::File(p.clone()),
    });
    let log = DecisionLog::open(sink)?
        .with_tap(options.tap)
        .with_stamp(config.log_instance.as_deref())
        .with_render(match config.log_format {
            policy::config::LogFormat::Native => None,
            policy::config::LogFormat::Ocsf => Some(Arc::new(crate::export::ocsf::Ocsf)),
        });
    let Some(endpoint) = &config.otlp_endpoint else {
        return Ok(log);
    };
    let instance = config
        .log_instance
        .clone()
        .unwrap_or_else(crate::decision_log::host_name);
    let exporter = crate::export::otlp::Exporter::start(endpoint, &instance, metrics)?;
    Ok(log.with_ship(Arc::new(exporter)))
}

/// The router of `[upstream]`. Before any listener too: no usable PAC (or proxy
/// environment) stops the start. PAC helpers and parent names resolve with a resolver of
/// their own, configured exactly as the destinations' one (never the system resolver).
async fn router(config: &Config) -> Result<Arc<Router>, Error> {
    let router = new_router(config).await?;
    if let Some(reading) = router.system_reading() {
        crate::say!(Info, "mediator: upstream system: {reading}");
    }
    if let Some(library) = router.gssapi_library() {
        crate::say!(Info, "mediator: {library}");
    }
    Ok(router)
}

/// The router of `[upstream]`, as a start would build it (`mediator check` too).
pub(super) async fn new_router(config: &Config) -> Result<Arc<Router>, Error> {
    Router::new(
        &config.upstream,
        &config.tls.extra_ca_files,
        Arc::new(resolver_of(config)?),
        &config.timeouts,
        |key| std::env::var(key).ok(),
    )
    .await
}

/// The listeners of `[listen]`, bound and not yet served.
struct Listeners {
    tcp: Option<TcpListener>,
    admin: Option<TcpListener>,
    admin_unix: Option<UnixListener>,
    tcp_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
}

impl Listeners {
    /// Binds the shared TCP listener, the admin API's TCP listener and its Unix socket.
    async fn bind(config: &Config) -> Result<Self, Error> {
        let tcp = bind_tcp(config.listen.tcp, "tcp").await?;
        let admin = bind_tcp(config.listen.admin, "admin").await?;
        let tcp_addr = tcp.as_ref().map(TcpListener::local_addr).transpose()?;
        let admin_addr = admin.as_ref().map(TcpListener::local_addr).transpose()?;
        let admin_unix: Option<UnixListener> = match &config.listen.admin_socket {
            Some(path) => Some(bind_socket_file(path, 0o600, None, None)?),
            None => None,
        };
        Ok(Self {
            tcp,
            admin,
            admin_unix,
            tcp_addr,
            admin_addr,
        })
    }

    /// Serves them: the TCP listener on a serving thread, the admin API (warning when
    /// anonymous writes are on) on this runtime. Returns the admin API's stop signal and
    /// its socket's path.
    fn serve(
        self,
        shared: &Arc<Shared>,
        control: &Arc<Control>,
        listen: policy::config::Listen,
    ) -> Result<(CancellationToken, Option<PathBuf>), Error> {
        if let Some(l) = self.tcp {
            // Served on a serving thread: the listener is registered with that thread's
            // runtime there.
            let l = l.into_std()?;
            let for_tcp = Arc::clone(shared);
            shared.serving.spawn_listener(async move {
                match TcpListener::from_std(l) {
                    Ok(l) => serve_tcp(l, for_tcp).await,
                    Err(e) => tracing::error!("the TCP listener cannot be served: {e}"),
                }
            });
        }
        let anonymous_writes = listen.admin_allow_anonymous_writes;
        if anonymous_writes
            && listen.admin_token_sha256.is_none()
            && let Some(addr) = self.admin_addr
        {
            tracing::warn!(
                "admin_allow_anonymous_writes = true: any local process that can reach {addr} \
                     can create and revoke authorities (set admin_token_sha256 instead)"
            );
            crate::say!(
                Warning,
                "mediator: WARNING: admin_allow_anonymous_writes = true: any local process can \
                     create and revoke authorities through the admin API on {addr}"
            );
        }
        let admin_api = Arc::new(Admin::new(
            Arc::clone(control),
            listen.admin_token_sha256,
            anonymous_writes,
        ));
        let admin_stop = CancellationToken::new();
        if let Some(l) = self.admin {
            let (api, stop) = (Arc::clone(&admin_api), admin_stop.clone());
            tokio::spawn(admin::serve(l, AdminDoor::Tcp, api, stop));
        }
        if let Some(l) = self.admin_unix {
            tokio::spawn(admin::serve(
                l,
                AdminDoor::Unix,
                admin_api,
                admin_stop.clone(),
            ));
        }
        Ok((admin_stop, listen.admin_socket))
    }
}

/// Adds the authorities of the file, then those the registry holds (design section 17),
/// and starts following the registry's other writers (etcd).
async fn add_authorities(
    control: &Arc<Control>,
    authorities: Vec<policy::config::Authority>,
    admin_api_on: bool,
) -> Result<(), Error> {
    for authority in authorities {
        control.add(authority).map_err(|e| match e {
            CreateError::Listen(e) => e,
            CreateError::Duplicate(name) | CreateError::OfTheFile(name) => {
                Error::control(format!("authority {name:?} is defined twice"))
            }
            CreateError::Invalid(v) => Error::control(format!("{v:?}")),
            CreateError::Unavailable(why) => {
                Error::Registry(registry::RegistryError::Unavailable(why))
            }
            CreateError::Store(e) => Error::Registry(e),
        })?;
    }
    let store = Arc::clone(control.store());
    let backend = store.backend();
    if backend == policy::config::RegistryBackend::Memory && admin_api_on {
        tracing::warn!(
            "[registry] backend = \"memory\": authorities created through the admin API are lost when this process ends"
        );
        crate::say!(
            Warning,
            "mediator: WARNING: [registry] backend = \"memory\": authorities created through the admin API are lost when this process ends, and other replicas do not have them"
        );
    }
    let revision = match control.load_registry().await {
        Ok(revision) => revision,
        // etcd out of reach: served stale (registry authorities refused) until the
        // follower confirms a current view; the file's authorities are unaffected.
        Err(registry::RegistryError::Unavailable(why)) => {
            control.set_fresh(false);
            crate::say!(
                Warning,
                "mediator: registry: {why}; authorities from the registry are refused (registry_unavailable) until it answers"
            );
            0
        }
        Err(e) => return Err(Error::Registry(e)),
    };
    if admin_api_on || backend != policy::config::RegistryBackend::Memory {
        crate::say!(
            Info,
            "mediator: registry: {backend} {} ({} stored authorities loaded)",
            store.location(),
            control.stored_count()
        );
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let fresh: Arc<dyn Fn(bool) + Send + Sync> = {
        let control = Arc::downgrade(control);
        Arc::new(move |fresh| {
            if let Some(c) = control.upgrade() {
                c.set_fresh(fresh);
            }
        })
    };
    store.follow(tx, fresh, revision);
    let applier = Arc::downgrade(control);
    tokio::spawn(async move {
        while let Some(change) = rx.recv().await {
            let Some(control) = applier.upgrade() else {
                break;
            };
            control.apply_change(change);
        }
    });
    Ok(())
}

/// How many serving threads to start: `TOKIO_WORKER_THREADS` when set to a number (the
/// variable tokio's own multi-threaded runtime reads), else one per core this process may
/// run on.
fn serving_threads() -> usize {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1)
}

/// Raises the soft open-files limit to the hard limit and derives the limits in force
/// from it (design section 13).
fn limits_in_force(config: &Config) -> InForce {
    let nofile = raise_nofile();
    let in_force = InForce::derive(&config.limits, nofile, check::listeners(config));
    if in_force.overcommitted() {
        tracing::warn!(
            "[limits] max_connections = {} needs about {} open files; the limit is {}: \
             connections may fail with EMFILE before the limit is reached",
            in_force.max_connections,
            u64::from(in_force.max_connections) * 2 + 128,
            in_force.nofile
        );
    }
    crate::relay::set_pipe_budget(in_force.pipes);
    in_force
}

/// The resolver of `[resolver]` (nameservers or the system configuration, and `hosts`).
pub(super) fn resolver_of(config: &Config) -> Result<Resolver, Error> {
    Resolver::new(
        &config.resolver.nameservers,
        config.resolver.hosts.clone(),
        config.timeouts.dns,
    )
}

async fn bind_tcp(addr: Option<SocketAddr>, what: &str) -> Result<Option<TcpListener>, Error> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listen = || -> std::io::Result<TcpListener> {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // As std and tokio's `bind` do on Unix: a restart rebinds at once.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().map(Some).map_err(|source| Error::Listen {
        what: format!("{what} {addr}"),
        source,
    })
}

/// The accept queue of the TCP listeners (the kernel caps it at `net.core.somaxconn`,
/// 4096 by default). Tokio's default of 1024 (128 under older caps) overflows under a
/// connection flood, and a dropped SYN costs its sender a second: a flood by one tenant
/// would delay everyone else's connects by that much.
const LISTEN_BACKLOG: u32 = 4096;

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, UnixStream};

    use super::*;
    use std::time::Duration;

    /// The tap of a client stream that panics when it reads `boom`: a bug in one
    /// connection's code, provoked from the test's side (no hook in the connection's path).
    struct Tripwire;

    impl crate::tap::Tap for Tripwire {
        fn read(&mut self, read: &[u8], polled: std::io::Result<()>) -> std::io::Result<()> {
            assert!(
                !read.windows(4).any(|w| w == b"boom"),
                "a bug in one connection"
            );
            polled
        }
    }

    /// Sends `CONNECT target` on `socket` and returns the stream and the status line.
    async fn connect(socket: &std::path::Path, target: &str) -> (UnixStream, String) {
        let mut s = UnixStream::connect(socket).await.unwrap();
        s.write_all(format!("CONNECT {target} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut head = vec![0u8; 19];
        s.read_exact(&mut head).await.unwrap();
        (s, String::from_utf8_lossy(&head).into_owned())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_ends_its_own_connection_only_and_leaves_its_close_record() {
        let dir = tempfile::tempdir().unwrap();
        let origin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = origin.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = origin.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 1];
                    while s.read_exact(&mut b).await.is_ok() && s.write_all(&b).await.is_ok() {}
                });
            }
        });
        let text = format!(
            "[listen]\nsocket_dir = {:?}\n[resolver]\nnameservers = [\"127.0.0.1:9\"]\nhosts = {{ \"ok.test\" = [\"127.0.0.1\"] }}\n[registry]\nbackend = \"memory\"\n[[authority]]\nname = \"a\"\nallow = [\"ok.test\"]\nallow_private = [\"127.0.0.1/32\"]\n",
            dir.path().display()
        );
        let config = policy::config::parse(&text, "test.toml").unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let running = start(
            config,
            Options {
                sink: Some(Sink::Memory(Arc::clone(&lines))),
                tap: None,
            },
        )
        .await
        .unwrap();
        let socket = running.socket_path("a").unwrap();

        // The first tunnel's task panics when its client's bytes say `boom`: its
        // connection closes.
        let (mut broken, server_side) = tokio::io::duplex(4096);
        assert!(running.serve_embedded(
            crate::tap::Tapped::new(server_side, Tripwire),
            "a",
            &crate::labels::Labels::default()
        ));
        broken
            .write_all(format!("CONNECT ok.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut head = vec![0u8; 19];
        broken.read_exact(&mut head).await.unwrap();
        assert_eq!(head, b"HTTP/1.1 200 OK\r\n\r\n");
        broken.write_all(b"boom").await.unwrap();
        let mut rest = Vec::new();
        let n = broken.read_to_end(&mut rest).await.unwrap_or(0);
        assert_eq!(n, 0, "the panicking connection is closed");
        // Another connection of the same authority is served as before.
        let (mut ok, status) = connect(&socket, &format!("ok.test:{port}")).await;
        assert_eq!(status, "HTTP/1.1 200 OK\r\n\r\n");
        ok.write_all(b"x").await.unwrap();
        let mut echo = [0u8; 1];
        ok.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"x");
        // The panicking connection still has its close record, `error` (the other one is
        // still open).
        running.log().flush();
        let close = lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v["event"] == "close");
        let close = close.expect("a close record for the panicking connection");
        assert_eq!(close["close_reason"], "error", "{close}");
        drop(ok);
        // Both connections end: nothing of the panicking one stays counted as live.
        assert!(
            running.shared.wait_idle(Duration::from_secs(5)).await,
            "still live: {}",
            running.shared.active()
        );
        running.shutdown().await;
    }
}
