//! The `etcd` registry (cargo feature `etcd`): records in an etcd cluster every replica
//! shares, through the `etcd-client` crate, laid out by placement ([`layout`]): a
//! replica reads its own node's records and the fleet-wide ones, never another node's.
//!
//! - A create is a transaction that puts the name index key and the record only if
//!   neither has ever been created (`create_revision == 0`), so a name is unique across
//!   the fleet; the generation is the revision of that put (for a record changed in place
//!   by another writer, the revision of the change). `ttl_s` is a lease on both keys: etcd
//!   removes both when it ends. Any replica may create an authority placed on any node.
//! - A delete, from any replica, reads the name's index key to find where the record is
//!   and removes both keys in one transaction.
//! - Every replica watches its two ranges (one watch stream, two watchers) from the
//!   revision it loaded, and applies creates and deletes in revision order per name. A
//!   watch that breaks resumes each watcher from the last revision it applied; one that
//!   cannot (compacted) re-lists both ranges and reconciles ([`watch`]).
//! - The view is *confirmed current* when a linearizable read (a quorum answered) gives a
//!   revision both watchers have reached (asking the stream for a progress report when
//!   one is behind). A replica that has not confirmed its view for `max_staleness_s`
//!   reports itself stale: the control plane then fails closed (design section 17).
//! - At start, records of the layout before placement are moved to the fleet-wide range
//!   once ([`migrate`]).

mod layout;
mod migrate;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, Identity, PutOptions, TlsOptions, Txn,
    TxnOp,
};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use policy::config::{Placement, Registry, RegistryBackend};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Change, KeyRange, Loaded, Record, RegistryError, RegistryMetrics, Store, encode};
use layout::{Layout, read_range};

/// The etcd backend.
pub(crate) struct Etcd {
    client: Client,
    /// The keys, under `[registry] prefix`, for this replica's node.
    layout: Layout,
    endpoints: Vec<String>,
    max_staleness: Duration,
    metrics: RegistryMetrics,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints)
            .field("layout", &self.layout)
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
    /// A client of the cluster `[registry]` names, for the replica of `node`. Connections
    /// are made when first used: an unreachable cluster is reported by the calls, not
    /// here.
    ///
    /// # Errors
    /// [`RegistryError::Io`] when a TLS file cannot be read,
    /// [`RegistryError::Unavailable`] when the endpoints are refused by the client.
    pub(crate) async fn connect(
        config: &Registry,
        node: String,
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
            layout: Layout::new(&config.prefix, &node),
            endpoints: config.endpoints.clone(),
            max_staleness: config.max_staleness,
            metrics,
        })
    }

    /// Lists every record the cluster holds once, every node's and those of the layout
    /// before placement included, changing nothing (`mediator registry list`). Returns
    /// them and how many are in the layout before placement.
    ///
    /// # Errors
    /// As [`Self::connect`], and [`RegistryError::Unavailable`] when it does not answer.
    pub(crate) async fn list_once(config: &Registry) -> Result<(Loaded, usize), RegistryError> {
        let metrics = RegistryMetrics::new(&crate::metrics::Metrics::new().map_err(unavailable)?)
            .map_err(unavailable)?;
        let node = config.node.clone().unwrap_or_default();
        let etcd = Self::connect(config, node, metrics).await?;
        let mut kv = etcd.client.kv_client();
        let fleet = etcd.layout.prefix(KeyRange::Fleet);
        let (mut all, revision) =
            read_range(&mut kv, &fleet, 0, KeyRange::Fleet, &etcd.metrics).await?;
        let nodes = etcd.layout.nodes();
        all.extend(
            read_range(&mut kv, &nodes, revision, KeyRange::Node, &etcd.metrics)
                .await?
                .0,
        );
        let legacy = etcd.layout.prefix(KeyRange::Legacy);
        let old = read_range(&mut kv, &legacy, revision, KeyRange::Legacy, &etcd.metrics)
            .await?
            .0;
        let legacy = old.len();
        all.extend(old);
        Ok((etcd.loaded(all, revision), legacy))
    }

    /// Every record this replica serves (its node's, the fleet's), read at one revision
    /// (linearizably), and that revision.
    async fn read(&self) -> Result<Loaded, RegistryError> {
        let mut kv = self.client.kv_client();
        let node = self.layout.prefix(KeyRange::Node);
        let (mut kvs, revision) =
            read_range(&mut kv, &node, 0, KeyRange::Node, &self.metrics).await?;
        let fleet = self.layout.prefix(KeyRange::Fleet);
        kvs.extend(
            read_range(&mut kv, &fleet, revision, KeyRange::Fleet, &self.metrics)
                .await?
                .0,
        );
        Ok(self.loaded(kvs, revision))
    }

    /// The records of `kvs`, read at `revision`; those that cannot be read are set aside.
    fn loaded(&self, kvs: Vec<etcd_client::KeyValue>, revision: i64) -> Loaded {
        let mut loaded = Loaded {
            revision,
            ..Loaded::default()
        };
        for kv in kvs {
            match self
                .layout
                .stored_of(kv.key(), kv.value(), kv.mod_revision())
            {
                Ok(s) => loaded.records.push(s),
                Err(r) => loaded.rejected.push(r),
            }
        }
        loaded
    }

    /// Removes both keys of `name` in one transaction, found through its index key
    /// (`generation`: only that record). A name whose index has no record (another writer
    /// removed it) is freed. A record without an index key (put by another writer) is
    /// removed where this replica would read it. Returns the revision of the removal.
    async fn remove(
        &self,
        name: &str,
        generation: Option<u64>,
    ) -> Result<Option<u64>, RegistryError> {
        let mut kv = self.client.kv_client();
        let index = self.layout.index(name);
        let wanted = |key: &str| match generation {
            Some(g) => {
                Compare::mod_revision(key, CompareOp::Equal, i64::try_from(g).unwrap_or(i64::MAX))
            }
            None => Compare::create_revision(key, CompareOp::Greater, 0),
        };
        let revision_of = |resp: &etcd_client::TxnResponse| {
            Some(u64::try_from(resp.header().map_or(0, |h| h.revision())).unwrap_or(0))
        };
        // An index that moves under us (removed, or removed and created again) is read
        // again; a few rounds settle any honest race.
        for _ in 0..4 {
            let found = kv.get(index.as_str(), None).await.map_err(unavailable)?;
            self.metrics.keys_read(KeyRange::Index, found.kvs().len());
            let Some(entry) = found.kvs().first() else {
                return self.remove_unindexed(name, &wanted).await;
            };
            let placement = entry
                .value_str()
                .ok()
                .and_then(|v| Placement::parse(v).ok())
                .ok_or_else(|| {
                    unavailable(format!(
                        "the name index {index} does not hold a placement (\"*\" or a node)"
                    ))
                })?;
            let key = self.layout.record(&placement, name);
            let same_index =
                Compare::mod_revision(index.as_str(), CompareOp::Equal, entry.mod_revision());
            let txn = Txn::new()
                .when([same_index.clone(), wanted(&key)])
                .and_then([
                    TxnOp::delete(index.as_str(), None),
                    TxnOp::delete(key.as_str(), None),
                ]);
            let resp = kv.txn(txn).await.map_err(unavailable)?;
            if resp.succeeded() {
                return Ok(revision_of(&resp));
            }
            if generation.is_some() {
                // Another generation (or none): not the record asked for.
                return Ok(None);
            }
            // The index names a record that is gone: free the name.
            let txn = Txn::new()
                .when([
                    same_index,
                    Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                ])
                .and_then([TxnOp::delete(index.as_str(), None)]);
            if kv.txn(txn).await.map_err(unavailable)?.succeeded() {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// Removes a record of `name` that has no index key, from this replica's ranges.
    async fn remove_unindexed(
        &self,
        name: &str,
        wanted: &impl Fn(&str) -> Compare,
    ) -> Result<Option<u64>, RegistryError> {
        let mut kv = self.client.kv_client();
        for placement in [
            Placement::Fleet,
            Placement::Node(self.layout.node().to_owned()),
        ] {
            let key = self.layout.record(&placement, name);
            let txn = Txn::new()
                .when([wanted(&key)])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            let resp = kv.txn(txn).await.map_err(unavailable)?;
            if resp.succeeded() {
                let revision = resp.header().map_or(0, |h| h.revision());
                return Ok(Some(u64::try_from(revision).unwrap_or(0)));
            }
        }
        Ok(None)
    }
}

impl Store for Etcd {
    fn backend(&self) -> RegistryBackend {
        RegistryBackend::Etcd
    }

    fn node(&self) -> &str {
        self.layout.node()
    }

    fn holds_other_nodes(&self) -> bool {
        true
    }

    fn location(&self) -> String {
        format!("{} prefix {}", self.endpoints.join(","), self.layout.root())
    }

    fn boot(&self) -> BoxFuture<'_, Result<u64, RegistryError>> {
        async move {
            let key = self.layout.boot();
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
        async move {
            let left = self.migrate().await?;
            let mut loaded = self.read().await?;
            loaded.rejected.extend(left);
            Ok(loaded)
        }
        .boxed()
    }

    fn create<'a>(
        &'a self,
        record: &'a Record,
        _generation: u64,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<u64, RegistryError>> {
        async move {
            let value = encode(record, 0)?;
            let placement = record.placement().map_err(RegistryError::Encode)?;
            let index = self.layout.index(&record.name);
            let key = self.layout.record(&placement, &record.name);
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
                .when([
                    Compare::create_revision(index.as_str(), CompareOp::Equal, 0),
                    Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                ])
                .and_then([
                    TxnOp::put(index.as_str(), placement.as_str(), put.clone()),
                    TxnOp::put(key.as_str(), value, put),
                ]);
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
        self.remove(name, generation).boxed()
    }

    fn set_aside<'a>(&'a self, name: &'a str) -> BoxFuture<'a, String> {
        let index = self.layout.index(name);
        async move { format!("the etcd record of {name:?} (index {index}; left in place)") }.boxed()
    }

    fn follow(
        self: Arc<Self>,
        changes: mpsc::Sender<Change>,
        fresh: Arc<dyn Fn(bool) + Send + Sync>,
        since: i64,
    ) {
        watch::start(self, changes, fresh, since);
    }
}
