//! The `etcd` registry (cargo feature `etcd`): records under `<prefix>authorities/<name>`
//! in an etcd cluster every replica shares, through the `etcd-client` crate.
//!
//! - A create is a transaction that puts the record only if its key has never been
//!   created (`create_revision == 0`); the generation is the revision of that put (for a
//!   record changed in place by another writer, the revision of the change). `ttl_s` is a
//!   lease: etcd removes the key when it ends.
//! - Every replica watches the prefix from the revision it loaded, and applies creates and
//!   deletes in revision order. A watch that breaks resumes from the last revision it
//!   applied; one that cannot (compacted) re-lists and reconciles.
//! - The view is *confirmed current* when a linearizable read (a quorum answered) gives a
//!   revision the watch has reached (asking the watch for a progress report when it is
//!   behind). A replica that has not confirmed its view for `max_staleness_s` reports
//!   itself stale: the control plane then fails closed (design section 17).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, WatchOptions,
};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use policy::config::{Registry, RegistryBackend};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use super::{
    Change, ErrorKind, Loaded, Record, RegistryError, RegistryMetrics, Rejected, Store, Stored,
    decode, encode,
};

/// The etcd backend.
pub(crate) struct Etcd {
    client: Client,
    /// `[registry] prefix`.
    root: String,
    endpoints: Vec<String>,
    max_staleness: Duration,
    metrics: RegistryMetrics,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.root)
            .field("max_staleness", &self.max_staleness)
            .finish_non_exhaustive()
    }
}

/// How often the view is confirmed, and how long one etcd call may take: a quarter of
/// `max_staleness`, between 200 ms and 2 s.
fn tick_of(max_staleness: Duration) -> Duration {
    (max_staleness / 4).clamp(Duration::from_millis(200), Duration::from_secs(2))
}

fn unavailable(e: impl std::fmt::Display) -> RegistryError {
    RegistryError::Unavailable(format!("etcd: {e}"))
}

impl Etcd {
    /// A client of the cluster `[registry]` names. Connections are made when first used:
    /// an unreachable cluster is reported by the calls, not here.
    ///
    /// # Errors
    /// [`RegistryError::Io`] when a TLS file cannot be read,
    /// [`RegistryError::Unavailable`] when the endpoints are refused by the client.
    pub(crate) async fn connect(
        config: &Registry,
        metrics: RegistryMetrics,
    ) -> Result<Self, RegistryError> {
        let tick = tick_of(config.max_staleness);
        let mut options = ConnectOptions::new()
            .with_connect_timeout(tick)
            .with_timeout(tick)
            .with_keep_alive(tick, tick)
            .with_require_leader(true);
        let https = config.endpoints.iter().any(|e| e.starts_with("https://"));
        if https || config.ca_file.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &config.ca_file {
                let pem = std::fs::read(ca).map_err(|e| RegistryError::io(ca, e))?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            if let (Some(cert), Some(key)) = (&config.cert_file, &config.key_file) {
                let c = std::fs::read(cert).map_err(|e| RegistryError::io(cert, e))?;
                let k = std::fs::read(key).map_err(|e| RegistryError::io(key, e))?;
                tls = tls.identity(Identity::from_pem(c, k));
            }
            options = options.with_tls(tls);
        }
        let client = Client::connect(&config.endpoints, Some(options))
            .await
            .map_err(unavailable)?;
        Ok(Self {
            client,
            root: config.prefix.clone(),
            endpoints: config.endpoints.clone(),
            max_staleness: config.max_staleness,
            metrics,
        })
    }

    /// Lists what the cluster holds once, changing nothing (`mediator registry list`).
    ///
    /// # Errors
    /// As [`Self::connect`], and [`RegistryError::Unavailable`] when it does not answer.
    pub(crate) async fn list_once(config: &Registry) -> Result<Loaded, RegistryError> {
        let metrics = RegistryMetrics::new(&crate::metrics::Metrics::new().map_err(unavailable)?)
            .map_err(unavailable)?;
        Self::connect(config, metrics).await?.read().await
    }

    fn records(&self) -> String {
        format!("{}authorities/", self.root)
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.records())
    }

    /// Every record under the prefix, read linearizably, and the revision of that view.
    async fn read(&self) -> Result<Loaded, RegistryError> {
        let mut kv = self.client.kv_client();
        let resp = kv
            .get(self.records(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut loaded = Loaded {
            revision,
            ..Loaded::default()
        };
        let prefix = self.records();
        for kv in resp.kvs() {
            match self.stored_of(&prefix, kv.key(), kv.value(), kv.mod_revision()) {
                Ok(s) => loaded.records.push(s),
                Err(r) => loaded.rejected.push(r),
            }
        }
        Ok(loaded)
    }

    /// A stored record from its key and value; the generation is the revision it was put
    /// at.
    fn stored_of(
        &self,
        prefix: &str,
        key: &[u8],
        value: &[u8],
        revision: i64,
    ) -> Result<Stored, Rejected> {
        let key_text = String::from_utf8_lossy(key).into_owned();
        let reject = |why: String| Rejected {
            what: format!("etcd key {key_text} (left in place)"),
            why,
            kind: ErrorKind::Damaged,
        };
        let name = key_text
            .strip_prefix(prefix)
            .filter(|n| policy::check_authority_name(n).is_ok())
            .ok_or_else(|| reject("the key does not end in an authority name".into()))?;
        let (record, _) = decode(value, name).map_err(reject)?;
        let generation =
            u64::try_from(revision).map_err(|_| reject("a negative revision".into()))?;
        Ok(Stored { record, generation })
    }
}

impl Store for Etcd {
    fn backend(&self) -> RegistryBackend {
        RegistryBackend::Etcd
    }

    fn location(&self) -> String {
        format!("{} prefix {}", self.endpoints.join(","), self.root)
    }

    fn boot(&self) -> BoxFuture<'_, Result<u64, RegistryError>> {
        async move {
            let key = format!("{}boot", self.root);
            let deadline = Instant::now() + self.max_staleness;
            let mut kv = self.client.kv_client();
            loop {
                let attempt: Result<Option<u64>, RegistryError> = async {
                    let resp = kv.get(key.as_str(), None).await.map_err(unavailable)?;
                    let (current, guard) = match resp.kvs().first() {
                        Some(kv) => (
                            kv.value_str()
                                .ok()
                                .and_then(|s| s.trim().parse::<u64>().ok())
                                .ok_or_else(|| {
                                    unavailable(format!("{key} does not hold a start number"))
                                })?,
                            Compare::mod_revision(
                                key.as_str(),
                                CompareOp::Equal,
                                kv.mod_revision(),
                            ),
                        ),
                        None => (
                            0,
                            Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                        ),
                    };
                    let next = current + 1;
                    let txn = Txn::new().when([guard]).and_then([TxnOp::put(
                        key.as_str(),
                        next.to_string(),
                        None,
                    )]);
                    let resp = kv.txn(txn).await.map_err(unavailable)?;
                    Ok(resp.succeeded().then_some(current))
                }
                .await;
                match attempt {
                    Ok(Some(n)) if n < 1 << 24 => return Ok(n),
                    Ok(Some(_)) => {
                        return Err(unavailable("the start counter is exhausted (2^24 starts)"));
                    }
                    // Another replica started at the same moment: read again.
                    Ok(None) => {}
                    Err(e) if Instant::now() >= deadline => return Err(e),
                    Err(_) => tokio::time::sleep(tick_of(self.max_staleness)).await,
                }
            }
        }
        .boxed()
    }

    fn load(&self) -> BoxFuture<'_, Result<Loaded, RegistryError>> {
        self.read().boxed()
    }

    fn create<'a>(
        &'a self,
        record: &'a Record,
        _generation: u64,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<u64, RegistryError>> {
        async move {
            let value = encode(record, 0)?;
            let key = self.key(&record.name);
            let mut lease = None;
            if let Some(ttl) = ttl {
                let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
                let granted = self
                    .client
                    .lease_client()
                    .grant(secs, None)
                    .await
                    .map_err(unavailable)?;
                lease = Some(granted.id());
            }
            let put = lease.map(|id| PutOptions::new().with_lease(id));
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.as_str(), value, put)]);
            let resp = self.client.kv_client().txn(txn).await;
            let resp = match resp {
                Ok(r) => r,
                Err(e) => {
                    if let Some(id) = lease {
                        let _ = self.client.lease_client().revoke(id).await;
                    }
                    return Err(unavailable(e));
                }
            };
            if !resp.succeeded() {
                if let Some(id) = lease {
                    let _ = self.client.lease_client().revoke(id).await;
                }
                return Err(RegistryError::Exists(record.name.clone()));
            }
            let revision = resp.header().map_or(0, |h| h.revision());
            u64::try_from(revision).map_err(|_| unavailable("a negative revision"))
        }
        .boxed()
    }

    fn delete<'a>(
        &'a self,
        name: &'a str,
        generation: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<u64>, RegistryError>> {
        async move {
            let key = self.key(name);
            let guard = match generation {
                Some(g) => Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    i64::try_from(g).unwrap_or(i64::MAX),
                ),
                None => Compare::create_revision(key.as_str(), CompareOp::Greater, 0),
            };
            let txn = Txn::new()
                .when([guard])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            let resp = self
                .client
                .kv_client()
                .txn(txn)
                .await
                .map_err(unavailable)?;
            if !resp.succeeded() {
                return Ok(None);
            }
            let revision = resp.header().map_or(0, |h| h.revision());
            Ok(Some(u64::try_from(revision).unwrap_or(0)))
        }
        .boxed()
    }

    fn set_aside<'a>(&'a self, name: &'a str) -> BoxFuture<'a, String> {
        let key = self.key(name);
        async move { format!("etcd key {key} (left in place)") }.boxed()
    }

    fn follow(
        self: Arc<Self>,
        changes: mpsc::Sender<Change>,
        fresh: Arc<dyn Fn(bool) + Send + Sync>,
        since: i64,
    ) {
        let view = Arc::new(View {
            applied: AtomicI64::new(since),
            want_progress: Notify::new(),
            progressed: Notify::new(),
        });
        tokio::spawn(Arc::clone(&self).confirm(Arc::clone(&view), fresh, since > 0));
        tokio::spawn(self.watch(view, changes, since == 0));
    }
}

/// What the watch and the confirmation share.
#[derive(Debug)]
struct View {
    /// The revision up to which every change under the prefix has been applied.
    applied: AtomicI64,
    /// Asks the watch for a progress report.
    want_progress: Notify,
    /// Told when `applied` moves.
    progressed: Notify,
}

impl View {
    fn advance(&self, revision: i64) {
        self.applied.fetch_max(revision, Ordering::AcqRel);
        self.progressed.notify_waiters();
    }
}

impl Etcd {
    /// Follows the prefix: resumes from the last applied revision after a broken watch,
    /// re-lists when it cannot (compacted, or nothing was loaded at start).
    async fn watch(self: Arc<Self>, view: Arc<View>, changes: mpsc::Sender<Change>, resync: bool) {
        let tick = tick_of(self.max_staleness);
        let mut resync = resync;
        let prefix = self.records();
        loop {
            if changes.is_closed() {
                return;
            }
            if resync {
                match self.read().await {
                    Ok(loaded) => {
                        let revision = loaded.revision;
                        self.metrics.operation(super::Op::Load, "ok");
                        if changes.send(Change::Snapshot(loaded)).await.is_err() {
                            return;
                        }
                        view.advance(revision);
                        resync = false;
                    }
                    Err(e) => {
                        tracing::debug!(target: super::super::TARGET, "registry: re-list failed: {e}");
                        tokio::time::sleep(tick).await;
                        continue;
                    }
                }
            }
            let from = view.applied.load(Ordering::Acquire) + 1;
            let options = WatchOptions::new()
                .with_prefix()
                .with_start_revision(from)
                .with_progress_notify();
            let stream = match self
                .client
                .watch_client()
                .watch(prefix.as_str(), Some(options))
                .await
            {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(target: super::super::TARGET, "registry: watch failed: {e}");
                    tokio::time::sleep(tick).await;
                    continue;
                }
            };
            let (mut sender, mut responses) = stream.split();
            loop {
                tokio::select! {
                    () = view.want_progress.notified() => {
                        if sender.request_progress().await.is_err() {
                            break;
                        }
                    }
                    message = responses.message() => {
                        let Ok(Some(resp)) = message else { break };
                        if resp.compact_revision() > 0 {
                            tracing::warn!(target: super::super::TARGET, "registry: the watch was compacted past revision {from}; re-listing");
                            resync = true;
                            break;
                        }
                        if resp.canceled() {
                            break;
                        }
                        let header = resp.header().map_or(0, |h| h.revision());
                        if resp.events().is_empty() {
                            if !resp.created() {
                                // A progress report: every change up to `header` was sent.
                                view.advance(header);
                                if changes.send(Change::Progress(view.applied.load(Ordering::Acquire))).await.is_err() {
                                    return;
                                }
                            }
                            continue;
                        }
                        for event in resp.events() {
                            let Some((change, revision)) = self.change_of(&prefix, event) else {
                                continue;
                            };
                            if changes.send(change).await.is_err() {
                                return;
                            }
                            view.advance(revision);
                        }
                        if changes.send(Change::Progress(view.applied.load(Ordering::Acquire))).await.is_err() {
                            return;
                        }
                    }
                }
            }
            tokio::time::sleep(tick / 4).await;
        }
    }

    /// The change one watch event says, and its revision.
    fn change_of(&self, prefix: &str, event: &etcd_client::Event) -> Option<(Change, i64)> {
        let kv = event.kv()?;
        let revision = kv.mod_revision();
        let change = match event.event_type() {
            EventType::Put => match self.stored_of(prefix, kv.key(), kv.value(), revision) {
                Ok(s) => Change::Put(s),
                Err(r) => Change::Rejected(r),
            },
            EventType::Delete => {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                Change::Delete {
                    name: key.strip_prefix(prefix)?.to_owned(),
                    revision: u64::try_from(revision).unwrap_or(0),
                }
            }
        };
        Some((change, revision))
    }

    /// Confirms, every tick, that the view is current: a linearizable read (a quorum
    /// answered) gives the cluster's revision, and the watch must have reached it. Says
    /// `fresh(false)` once no confirmation happened for `max_staleness`, `fresh(true)` at
    /// the next one.
    async fn confirm(
        self: Arc<Self>,
        view: Arc<View>,
        fresh: Arc<dyn Fn(bool) + Send + Sync>,
        loaded: bool,
    ) {
        let tick = tick_of(self.max_staleness);
        // A start that loaded confirmed its view then; one that did not is stale already.
        let mut confirmed = loaded.then(Instant::now);
        let mut was_fresh = loaded;
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            if Arc::strong_count(&view) == 1 {
                return;
            }
            let asked = Instant::now();
            let current = tokio::time::timeout(tick, async {
                let mut kv = self.client.kv_client();
                let resp = kv
                    .get(
                        self.records(),
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    )
                    .await
                    .ok()?;
                let revision = resp.header()?.revision();
                loop {
                    let waiting = view.progressed.notified();
                    if view.applied.load(Ordering::Acquire) >= revision {
                        return Some(());
                    }
                    view.want_progress.notify_one();
                    waiting.await;
                }
            })
            .await
            .ok()
            .flatten()
            .is_some();
            if current {
                confirmed = Some(asked);
            }
            let now_fresh = confirmed.is_some_and(|t| t.elapsed() <= self.max_staleness);
            if now_fresh != was_fresh {
                fresh(now_fresh);
                was_fresh = now_fresh;
            }
        }
    }
}
