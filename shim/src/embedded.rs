//! Embedded mode: an in-process mediator (the `mediator` crate's library API) with a
//! one-authority grant built from `--allow`, `--deny` and `--allow-private`, validated by
//! the same `policy` code as `mediator.toml`. Connections from the sandbox's loopback
//! listener are handed to it directly: no socket file exists at all.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use policy::EntryKind;

use crate::error::{BadFlag, Error, Result};
use crate::report::{Denial, Denials};

/// The authority name of the embedded grant (what the decision log shows).
pub(crate) const AUTHORITY: &str = "shim";

/// Build and validate the one-authority mediator configuration.
///
/// # Errors
/// [`Error::Grant`] naming every flag value the policy rejects (`--allow '*.com': ...`);
/// [`Error::Usage`] if the grant they make together is refused.
pub(crate) fn config(
    allow: &[String],
    deny: &[String],
    allow_private: &[String],
    resolve: &[String],
    asks: bool,
) -> Result<(policy::config::Config, policy::Grant)> {
    let bad_resolve: Vec<BadFlag> = resolve
        .iter()
        .filter_map(|v| resolve_entry(v).err())
        .collect();
    let built = authority(AUTHORITY, allow, deny, allow_private, asks);
    let (authority, names) = match (built, bad_resolve.is_empty()) {
        (Ok(a), true) => a,
        (Ok(_), false) => return Err(Error::Grant(bad_resolve)),
        (Err(Error::Grant(mut problems)), _) => {
            problems.extend(bad_resolve);
            return Err(Error::Grant(problems));
        }
        (Err(e), _) => return Err(e),
    };
    // Every other section at its defaults.
    let mut config =
        policy::config::parse("", "embedded mode").map_err(|e| Error::Usage(e.to_string()))?;
    for v in resolve {
        if let Ok((name, addr)) = resolve_entry(v) {
            config.resolver.hosts.entry(name).or_default().push(addr);
        }
    }
    config.authorities.push(authority);
    Ok((config, names))
}

/// One authority of the embedded mediator named `name`, with the grant of these flag
/// values, and the same grant again for capture's stub resolver.
///
/// # Errors
/// [`Error::Grant`] naming every flag value the policy rejects (`--allow '*.com': ...`);
/// [`Error::Usage`] if the grant they make together is refused.
pub(crate) fn authority(
    name: &str,
    allow: &[String],
    deny: &[String],
    allow_private: &[String],
    asks: bool,
) -> Result<(policy::config::Authority, policy::Grant)> {
    let problems: Vec<BadFlag> = allow
        .iter()
        .filter_map(|v| check_flag("--allow", v, EntryKind::Allow))
        .chain(
            deny.iter()
                .filter_map(|v| check_flag("--deny", v, EntryKind::Deny)),
        )
        .chain(
            allow_private
                .iter()
                .filter_map(|v| check_flag("--allow-private", v, EntryKind::AllowPrivate)),
        )
        .collect();
    if !problems.is_empty() {
        return Err(Error::Grant(problems));
    }
    let spec = policy::GrantSpec {
        name: name.to_owned(),
        allow: allow.to_vec(),
        deny: deny.iter().map(|d| d.as_str().into()).collect(),
        allow_private: allow_private.to_vec(),
        sni_check: true,
        // The grant is the command line: hints name the flags that would widen it.
        advice: policy::Advice::ShimFlags,
        ..policy::GrantSpec::default()
    };
    let grant = policy::Grant::new(&spec, &[]).map_err(|e| Error::Usage(e.to_string()))?;
    // The same grant again, for the capture's stub resolver (a grant is never shared by
    // mutation, and this one is built from the same validated spec).
    let names = policy::Grant::new(&spec, &[]).map_err(|e| Error::Usage(e.to_string()))?;
    Ok((
        policy::config::Authority {
            grant,
            token_sha256: None,
            socket_mode: 0o600,
            socket_uid: None,
            socket_gid: None,
            watchdog: None,
            limits: policy::config::AuthorityLimits::default(),
            // Asking in embedded mode comes with `--control` (design section 20): the
            // host answers on the control socket, through the mediator's own handle.
            ask: asks.then_some(policy::config::Ask {
                endpoint: policy::config::AskEndpoint::Admin,
                timeout: policy::config::DEFAULT_ASK_TIMEOUT,
                max_pending: policy::config::DEFAULT_MAX_PENDING_ASKS,
            }),
            credentials: Vec::new(),
            node: policy::config::Placement::Fleet,
        },
        names,
    ))
}

/// One `--resolve NAME=ADDR`: the canonical name and the address.
fn resolve_entry(value: &str) -> std::result::Result<(String, std::net::IpAddr), BadFlag> {
    let bad = |why: String| BadFlag {
        flag: "--resolve",
        value: value.to_owned(),
        why,
    };
    let (name, addr) = value
        .split_once('=')
        .ok_or_else(|| bad("expected NAME=ADDR, e.g. origin.test=127.0.0.1".into()))?;
    let host = policy::canonicalize_host(name).map_err(|e| bad(e.to_string()))?;
    let Some(name) = host.name() else {
        return Err(bad("NAME must be a host name, not an address".into()));
    };
    let name = name.to_owned();
    let addr = addr
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| bad(format!("{addr:?} is not an IP address")))?;
    Ok((name, addr))
}

/// `value` of `flag` checked alone, as the grant will parse it.
fn check_flag(flag: &'static str, value: &str, kind: EntryKind) -> Option<BadFlag> {
    let why = policy::check_entry(kind, value).err()?;
    Some(BadFlag {
        flag,
        value: value.to_owned(),
        why: why.to_string(),
    })
}

/// The embedded mediator, started by the first connection that needs it: a run whose
/// command opens no connection never pays for its threads, metrics and resolver. What
/// could stop a start is checked before the sandbox is built ([`Embedded::start`]); if a
/// start still fails, every connection is refused (closed) and the reason is said once.
pub(crate) struct Lazy {
    /// The running mediator, once started.
    running: tokio::sync::OnceCell<Arc<mediator::Running>>,
    /// What the first start takes.
    pending: std::sync::Mutex<Option<(policy::config::Config, mediator::Options)>>,
    /// With `--control`: where the mediator's questions go once it runs.
    asking: Option<Arc<crate::asking::Asking>>,
}

impl Lazy {
    /// The running mediator, started on the first call; `None` if it cannot start. Must
    /// run on the embedded mediator's runtime (the start spawns its tasks there).
    pub(crate) async fn get(&self) -> Option<Arc<mediator::Running>> {
        self.running
            .get_or_try_init(|| async {
                let pending = self
                    .pending
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                // Taken by a start that failed: it said why.
                let (config, options) = pending.ok_or(())?;
                match mediator::start(config, options).await {
                    Ok(running) => {
                        let running = Arc::new(running);
                        if let Some(asking) = &self.asking {
                            asking.relay(&running);
                        }
                        Ok(running)
                    }
                    Err(e) => {
                        eprintln!(
                            "shim: the embedded mediator cannot start ({e}): connections are refused"
                        );
                        Err(())
                    }
                }
            })
            .await
            .ok()
            .cloned()
    }

    /// The mediator if a connection started it (no wait: the path of every connection
    /// after the first).
    pub(crate) fn started(&self) -> Option<&Arc<mediator::Running>> {
        self.running.get()
    }
}

/// A running embedded mediator serving the sandbox's listener.
pub(crate) struct Embedded {
    runtime: tokio::runtime::Runtime,
    mediator: Arc<Lazy>,
    accept: tokio::task::JoinHandle<()>,
    /// The authority new connections go to.
    binding: Arc<crate::control::Binding>,
    /// Connections accepted from the sandbox.
    pub(crate) connections: Arc<AtomicU64>,
    /// With `--control`: the run's questions (design section 20).
    asking: Option<Arc<crate::asking::Asking>>,
}

impl Embedded {
    /// Check that the mediator can start and serve `listener` with it; the mediator itself
    /// starts with the first connection (see [`Lazy`]). Must be called after the sandbox is
    /// cloned (it starts threads).
    ///
    /// `decision_log`: append the decision log to this file, opened by the caller before
    /// the sandbox existed (else it is not written). The run's denials are collected from
    /// the mediator's records as they are taken, for `--report`, and so is a client's
    /// refusal of the mediator's certificate (said as `trust` words it).
    ///
    /// # Errors
    /// [`Error::Io`] if the runtime cannot start, [`Error::Channel`] if a start would fail
    /// (resolver configuration, parent proxy settings): what `mediator check` checks.
    pub(crate) fn start(
        config: policy::config::Config,
        listener: std::net::TcpListener,
        decision_log: Option<std::fs::File>,
        (denials, trust): (Arc<Denials>, crate::rejected::Trust),
        binding: Arc<crate::control::Binding>,
    ) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("mediator")
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the embedded mediator's runtime", e))?;
        let refused = |e: mediator::Error| Error::Channel {
            path: PathBuf::from("<embedded>"),
            detail: e.to_string(),
        };
        // The embedded mediator has no admin API: nothing is created at run time, and the
        // host's state directory (another mediator's) is never touched.
        let mut config = config;
        config.registry = policy::config::Registry {
            backend: policy::config::RegistryBackend::Memory,
            ..policy::config::Registry::default()
        };
        runtime
            .block_on(mediator::check_resources(&config))
            .map_err(refused)?;
        let sink = match decision_log {
            Some(f) => mediator::Sink::Opened(Arc::new(f)),
            None => mediator::Sink::Discard,
        };
        // The run asks when its authority does (`--control`, `crate::embedded::config`).
        let asks = config.authorities.iter().any(|a| a.ask.is_some());
        let asking = asks.then(crate::asking::Asking::new);
        let tap: mediator::Tap = {
            let denials = Arc::clone(&denials);
            let asking = asking.clone();
            Arc::new(move |rec: &mediator::Record| {
                if let Some(d) = denial_of(rec) {
                    denials.push(d);
                } else if let Some(r) = crate::rejected::Rejection::of_close(rec) {
                    trust.rejected(&denials, r);
                }
                if let Some(a) = &asking {
                    a.record(rec);
                }
            })
        };
        let mediator = Arc::new(Lazy {
            running: tokio::sync::OnceCell::new(),
            pending: std::sync::Mutex::new(Some((
                config,
                mediator::Options {
                    sink: Some(sink),
                    tap: Some(tap),
                },
            ))),
            asking: asking.clone(),
        });
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("listener non-blocking", e))?;
        let connections = Arc::new(AtomicU64::new(0));
        let accept = {
            let _guard = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|e| Error::io("listener into the runtime", e))?;
            let mediator = Arc::clone(&mediator);
            let connections = Arc::clone(&connections);
            let binding = Arc::clone(&binding);
            runtime.spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::Relaxed);
                    // No mediator: the connection is closed (fail closed), said once.
                    let Some(running) = mediator.get().await else {
                        continue;
                    };
                    // The authority as it is now: a rebind moves new connections only.
                    if let crate::control::Bound::Embedded { authority, .. } = binding.current() {
                        running.serve_embedded(stream, &authority, binding.labels());
                    }
                }
            })
        };
        Ok(Self {
            runtime,
            mediator,
            accept,
            binding,
            connections,
            asking,
        })
    }

    /// What a connection made outside the sandbox's listener (capture's) needs to reach
    /// this mediator: the mediator, the runtime its connections run on, and the binding
    /// that names the authority new connections go to.
    pub(crate) fn reach(
        &self,
    ) -> (
        Arc<Lazy>,
        tokio::runtime::Handle,
        Arc<crate::control::Binding>,
    ) {
        (
            Arc::clone(&self.mediator),
            self.runtime.handle().clone(),
            Arc::clone(&self.binding),
        )
    }

    /// The rebinder of `--control` (design section 18): `{"allow": [...], "deny": [...],
    /// "allow_private": [...]}` becomes a new authority of this mediator (`rebind-1`,
    /// `rebind-2`, ...) with that grant, checked as the flags are. The authorities of
    /// earlier bindings stay live: their open connections finish on them. Runs on the
    /// control socket's thread (it may start the mediator).
    pub(crate) fn rebinder(&self) -> crate::control::Rebinder {
        let asks = self.asking.is_some();
        let mediator = Arc::downgrade(&self.mediator);
        let handle = self.runtime.handle().clone();
        let mut count = 0u32;
        Box::new(move |v| {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Grant {
                #[serde(default)]
                allow: Vec<String>,
                #[serde(default)]
                deny: Vec<String>,
                #[serde(default)]
                allow_private: Vec<String>,
            }
            let g: Grant = serde_json::from_value(v.clone()).map_err(|e| {
                Error::Usage(format!(
                    "embedded mode: rebind to a grant {{\"allow\": [...], \"deny\": [...], \"allow_private\": [...]}}: {e}"
                ))
            })?;
            let name = format!("rebind-{}", count + 1);
            let (authority, names) = authority(&name, &g.allow, &g.deny, &g.allow_private, asks)?;
            let running = running_now(&mediator, &handle)?;
            let _in_mediator = handle.enter();
            running
                .add_authority(authority)
                .map_err(|e| Error::Usage(format!("rebind: {e}")))?;
            count += 1;
            Ok(crate::control::Bound::Embedded {
                authority: name.into(),
                grant: Arc::new(names),
            })
        })
    }

    /// Asking through `--control` (design section 20), when the run asks: where the
    /// questions go, how answers are applied ([`answerer`]).
    pub(crate) fn asking_host(&self) -> Option<crate::control::AskingHost> {
        let asking = Arc::clone(self.asking.as_ref()?);
        let lazy = Arc::downgrade(&self.mediator);
        let pending = {
            let lazy = lazy.clone();
            Box::new(move || {
                lazy.upgrade()
                    .and_then(|l| l.started().map(|r| r.pending_questions()))
                    .unwrap_or_default()
            })
        };
        Some(crate::control::AskingHost {
            asking,
            answerer: answerer(lazy, self.runtime.handle().clone()),
            pending,
        })
    }

    /// The run's questions and how each ended (empty without `--control`).
    pub(crate) fn asked(&self) -> Vec<crate::asking::Asked> {
        self.asking.as_ref().map(|a| a.asked()).unwrap_or_default()
    }

    /// Stop (the sandbox is gone, so connections are closing) and flush the decision log.
    /// Capture must be finished first (its connections hold the mediator). A mediator no
    /// connection started has nothing to stop.
    pub(crate) fn finish(self) {
        self.accept.abort();
        let Some(running) = self.mediator.started().cloned() else {
            // Nothing was started, nothing is left to write: the runtime's idle workers
            // are not waited for (the process exits next).
            self.runtime.shutdown_background();
            return;
        };
        let _ = self.runtime.block_on(self.accept);
        drop(self.mediator);
        let log = running.log().clone();
        if let Ok(running) = Arc::try_unwrap(running) {
            self.runtime.block_on(async {
                let _ = tokio::time::timeout(Duration::from_secs(2), running.shutdown()).await;
            });
        }
        log.flush();
        self.runtime.shutdown_timeout(Duration::from_millis(200));
    }
}

/// The running embedded mediator, started now if no connection did yet (from a thread
/// outside its runtime: the control socket's).
///
/// # Errors
/// [`Error::Usage`] when it has stopped or cannot start.
pub(crate) fn running_now(
    mediator: &std::sync::Weak<Lazy>,
    handle: &tokio::runtime::Handle,
) -> Result<Arc<mediator::Running>> {
    let stopped = || Error::Usage("the embedded mediator has stopped".into());
    let mediator = mediator.upgrade().ok_or_else(stopped)?;
    handle
        .block_on(handle.spawn(async move { mediator.get().await }))
        .ok()
        .flatten()
        .ok_or_else(|| Error::Usage("the embedded mediator did not start".into()))
}

/// The report's denial of one mediator record: a decision that denied, with the status or
/// SOCKS5 reply code the client was answered with (the mediator's own mapping).
fn denial_of(rec: &mediator::Record) -> Option<Denial> {
    if rec.event != mediator::vocab::Event::Decision || rec.decision != policy::Verdict::Deny {
        return None;
    }
    let status = match rec.protocol {
        mediator::Protocol::Socks5 => u16::from(mediator::denial::socks_rep(rec.reason, rec.cause)),
        mediator::Protocol::Connect | mediator::Protocol::Http | mediator::Protocol::Tls => {
            mediator::denial::http_status(rec.reason, rec.cause)
        }
    };
    Some(Denial {
        protocol: rec.protocol.as_str(),
        status,
        reason: Some(rec.reason.as_str().to_owned()),
        host: rec.host.clone(),
        port: rec.port,
        detail: Some(rec.detail.clone()),
        hint: (!rec.hint.is_empty()).then(|| rec.hint.clone()),
        message: rec.message.clone(),
    })
}

/// The answerer of the control socket: `{"allow_via": "<authority>"}` and `{"deny":
/// "..."}` go to the embedded mediator as they are; `{"allow_via": {"allow": [...]}}`
/// first makes a new authority of it with that grant (`answer-1`, `answer-2`, ...,
/// checked as the flags are; it asks too), then answers with its name. Runs on a control
/// connection's thread.
fn answerer(
    mediator: std::sync::Weak<Lazy>,
    handle: tokio::runtime::Handle,
) -> crate::control::Answerer {
    use mediator::ask::reply::Reply;
    let mut made = 0u32;
    Box::new(move |id, reply, actor| {
        let running = running_now(&mediator, &handle)?;
        let reply = match reply {
            Reply::AllowGrant(g) => {
                let name = format!("answer-{}", made + 1);
                let (authority, _) = authority(&name, &g.allow, &g.deny, &g.allow_private, true)?;
                let _in_mediator = handle.enter();
                running
                    .add_authority(authority)
                    .map_err(|e| Error::Usage(format!("answer: {e}")))?;
                made += 1;
                Reply::AllowVia(name)
            }
            other => other,
        };
        let via = match &reply {
            Reply::AllowVia(name) => Some(name.clone()),
            Reply::AllowGrant(_) | Reply::Deny(_) => None,
        };
        let id = id.to_owned();
        let answered = handle
            .block_on(handle.spawn(async move { running.answer(&id, reply, actor).await }))
            .map_err(|e| Error::Usage(format!("answer: {e}")))?
            .map_err(|e| Error::Usage(format!("answer: {e}")))?;
        Ok(serde_json::json!({
            "ok": true,
            "answered": answered.id,
            "authority": answered.authority,
            "host": answered.host,
            "port": answered.port,
            "via": via,
        }))
    })
}

#[cfg(test)]
#[path = "embedded_tests.rs"]
mod tests;
