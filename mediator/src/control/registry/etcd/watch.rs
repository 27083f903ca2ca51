//! Following the registry: one watch stream with two watchers, this replica's node's
//! records and the fleet-wide ones ([`RANGES`]), and the periodic confirmation that the
//! view is current. The view is as current as its slower watcher: the revision applied is
//! the lower of the two, and staleness (design section 17) covers both.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use etcd_client::{EventType, GetOptions, WatchOptions};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use super::super::{Change, KeyRange, Op};
use super::{Etcd, tick_of};
use crate::control::TARGET;

/// The ranges a replica follows, in the order their watchers are created on the stream.
const RANGES: [KeyRange; 2] = [KeyRange::Node, KeyRange::Fleet];

/// The watch id of a progress report that concerns every watcher of the stream.
const EVERY_WATCHER: i64 = -1;

/// What the watch and the confirmation share.
#[derive(Debug)]
struct View {
    /// Per range of [`RANGES`]: the revision up to which every change in it has been
    /// applied.
    applied: [AtomicI64; 2],
    /// Asks the watch for a progress report.
    want_progress: Notify,
    /// Told when `applied` moves.
    progressed: Notify,
}

impl View {
    /// The revision up to which every change this replica follows has been applied.
    fn applied(&self) -> i64 {
        self.applied
            .iter()
            .map(|a| a.load(Ordering::Acquire))
            .min()
            .unwrap_or_default()
    }

    /// Watcher `which` has sent every change up to `revision`.
    fn advance(&self, which: usize, revision: i64) {
        if let Some(a) = self.applied.get(which) {
            a.fetch_max(revision, Ordering::AcqRel);
        }
        self.progressed.notify_waiters();
    }

    /// Every watcher has sent every change up to `revision`.
    fn advance_all(&self, revision: i64) {
        for which in 0..RANGES.len() {
            self.advance(which, revision);
        }
    }
}

/// Starts following: the watch, and the confirmation that the view is current. `since`:
/// the revision the start loaded (0: nothing was loaded, so the watch lists first).
pub(super) fn start(
    etcd: Arc<Etcd>,
    changes: mpsc::Sender<Change>,
    fresh: Arc<dyn Fn(bool) + Send + Sync>,
    since: i64,
) {
    let view = Arc::new(View {
        applied: [AtomicI64::new(since), AtomicI64::new(since)],
        want_progress: Notify::new(),
        progressed: Notify::new(),
    });
    tokio::spawn(Arc::clone(&etcd).confirm(Arc::clone(&view), fresh, since > 0));
    tokio::spawn(etcd.watch(view, changes, since == 0));
}

/// Why one watch stream ended.
enum Ended {
    /// Broken or cancelled: resume each watcher from where it was.
    Resume,
    /// Compacted past where a watcher was: list again.
    Relist,
    /// Nobody applies changes any more.
    Closed,
}

impl Etcd {
    /// Follows this replica's two ranges: resumes each watcher from the last revision it
    /// applied after a broken stream, re-lists when it cannot (compacted, or nothing was
    /// loaded at start).
    async fn watch(self: Arc<Self>, view: Arc<View>, changes: mpsc::Sender<Change>, resync: bool) {
        let tick = tick_of(self.max_staleness);
        let mut resync = resync;
        loop {
            if changes.is_closed() {
                return;
            }
            if resync {
                match self.read().await {
                    Ok(loaded) => {
                        let revision = loaded.revision;
                        self.metrics.operation(Op::Load, "ok");
                        if changes.send(Change::Snapshot(loaded)).await.is_err() {
                            return;
                        }
                        view.advance_all(revision);
                        resync = false;
                    }
                    Err(e) => {
                        tracing::debug!(target: TARGET, "registry: re-list failed: {e}");
                        tokio::time::sleep(tick).await;
                        continue;
                    }
                }
            }
            match self.stream(&view, &changes).await {
                Ended::Closed => return,
                Ended::Relist => resync = true,
                Ended::Resume => {}
            }
            tokio::time::sleep(tick / 4).await;
        }
    }

    /// One watch stream with a watcher per range, each from the revision after the one it
    /// applied, until it ends.
    async fn stream(&self, view: &View, changes: &mpsc::Sender<Change>) -> Ended {
        let options = |which: usize| {
            WatchOptions::new()
                .with_prefix()
                .with_start_revision(view.applied[which].load(Ordering::Acquire) + 1)
                .with_progress_notify()
        };
        let mut client = self.client.watch_client();
        let first = self.layout.prefix(RANGES[0]);
        let mut stream = match client.watch(first.as_str(), Some(options(0))).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(target: TARGET, "registry: watch failed: {e}");
                return Ended::Resume;
            }
        };
        if let Err(e) = stream
            .watch(self.layout.prefix(RANGES[1]), Some(options(1)))
            .await
        {
            tracing::debug!(target: TARGET, "registry: watch failed: {e}");
            return Ended::Resume;
        }
        let (mut sender, mut responses) = stream.split();
        // The watch ids, in the order the watchers were created (etcd answers the create
        // requests of one stream in order).
        let mut ids: Vec<i64> = Vec::with_capacity(RANGES.len());
        loop {
            tokio::select! {
                () = view.want_progress.notified() => {
                    if sender.request_progress().await.is_err() {
                        return Ended::Resume;
                    }
                }
                message = responses.message() => {
                    let Ok(Some(resp)) = message else { return Ended::Resume };
                    if resp.compact_revision() > 0 {
                        tracing::warn!(target: TARGET, "registry: the watch was compacted past revision {}; re-listing", view.applied());
                        return Ended::Relist;
                    }
                    if resp.canceled() {
                        return Ended::Resume;
                    }
                    if resp.created() {
                        ids.push(resp.watch_id());
                        continue;
                    }
                    let header = resp.header().map_or(0, |h| h.revision());
                    let which = ids.iter().position(|id| *id == resp.watch_id());
                    if resp.events().is_empty() {
                        // A progress report: every change up to `header` was sent, to
                        // that watcher or (asked for) to every one.
                        match which {
                            Some(w) => view.advance(w, header),
                            None if resp.watch_id() == EVERY_WATCHER && ids.len() == RANGES.len() => {
                                view.advance_all(header);
                            }
                            None => continue,
                        }
                    } else {
                        let Some(w) = which else { continue };
                        for event in resp.events() {
                            let Some((change, revision)) = self.change_of(w, event) else {
                                continue;
                            };
                            if changes.send(change).await.is_err() {
                                return Ended::Closed;
                            }
                            view.advance(w, revision);
                        }
                    }
                    if changes.send(Change::Progress(view.applied())).await.is_err() {
                        return Ended::Closed;
                    }
                }
            }
        }
    }

    /// The change one event of watcher `which` says, and its revision.
    fn change_of(&self, which: usize, event: &etcd_client::Event) -> Option<(Change, i64)> {
        let kv = event.kv()?;
        self.metrics.keys_read(RANGES[which], 1);
        let revision = kv.mod_revision();
        let change = match event.event_type() {
            EventType::Put => match self.layout.stored_of(kv.key(), kv.value(), revision) {
                Ok(s) => Change::Put(s),
                Err(r) => Change::Rejected(r),
            },
            EventType::Delete => {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                Change::Delete {
                    name: self.layout.locate(&key)?.1.to_owned(),
                    revision: u64::try_from(revision).unwrap_or(0),
                }
            }
        };
        Some((change, revision))
    }

    /// Confirms, every tick, that the view is current: a linearizable read (a quorum
    /// answered) gives the cluster's revision, and both watchers must have reached it.
    /// Says `fresh(false)` once no confirmation happened for `max_staleness`,
    /// `fresh(true)` at the next one.
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
        // Counts keys, reads none: the cheapest linearizable read of this node's range.
        let probe = self.layout.prefix(KeyRange::Node);
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
                        probe.as_str(),
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    )
                    .await
                    .ok()?;
                let revision = resp.header()?.revision();
                loop {
                    let waiting = view.progressed.notified();
                    if view.applied() >= revision {
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
