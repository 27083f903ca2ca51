//! Prometheus metrics (design section 10), served as text on the admin API's `/metrics`.
//!
//! Every label value comes from a configured authority name or a fixed enum (protocol,
//! decision, reason, direction, error kind): never a host, a port or an address, so a
//! flood of distinct destinations cannot grow the number of series. A decision taken
//! before any authority is known (a missing or wrong credential) is counted under the
//! authority label [`NO_AUTHORITY`] (`"-"`).
//!
//! | family | type | labels |
//! |---|---|---|
//! | `mediator_decisions_total` | counter | `authority`, `protocol`, `decision`, `reason` |
//! | `mediator_active_connections` | gauge | `authority` |
//! | `mediator_bytes_total` | counter | `authority`, `direction` (`up`, `down`) |
//! | `mediator_connect_duration_seconds` | histogram | |
//! | `mediator_dns_duration_seconds` | histogram | |
//! | `mediator_upstream_errors_total` | counter | `kind` ([`UpstreamErrorKind`]) |
//! | `mediator_authorities` | gauge | |
//! | `mediator_limited_total` | counter | `authority`, `limit` (`connections`, `rate`, `unidentified`, `global`) |
//! | `mediator_open_connections` | gauge | `authority` (client connections it holds) |
//! | `mediator_asks_*`, `mediator_ask_*` | | asking the host (`crate::ask::metrics`) |
//! | `mediator_upstream_reused_total` | counter | |
//! | `mediator_upstream_idle_connections` | gauge | |
//! | `process_*` | (process collector) | |

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use policy::{Reason, Verdict};
use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::ask::metrics::AskMetrics;
use crate::vocab::{LimitKind, Protocol, ReloadResult, UpstreamErrorKind};

mod series;
pub(crate) use series::DecisionSeries;

/// The `authority` label value of decisions that no authority could be attributed to.
pub(crate) const NO_AUTHORITY: &str = "-";

/// Histogram buckets for connect and DNS latency, in seconds (1 ms .. 10 s).
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Seconds since the Unix epoch, now.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `family` registered in `registry`, and given back: a family is a handle to what the
/// registry renders (cloning it clones the handle).
///
/// # Errors
/// [`prometheus::Error`] when the name is taken.
pub(crate) fn registered<C: Collector + Clone + 'static>(
    registry: &Registry,
    family: C,
) -> Result<C, prometheus::Error> {
    registry.register(Box::new(family.clone()))?;
    Ok(family)
}

/// A family of series told apart by their labels (`IntCounterVec`, `IntGaugeVec`).
trait Labelled: Collector + Clone + Sized + 'static {
    /// A family of `opts` with `labels`.
    fn labelled(opts: Opts, labels: &[&str]) -> Result<Self, prometheus::Error>;
}

impl Labelled for IntCounterVec {
    fn labelled(opts: Opts, labels: &[&str]) -> Result<Self, prometheus::Error> {
        Self::new(opts, labels)
    }
}

impl Labelled for IntGaugeVec {
    fn labelled(opts: Opts, labels: &[&str]) -> Result<Self, prometheus::Error> {
        Self::new(opts, labels)
    }
}

/// A family with `labels`, registered in `registry`.
fn family<C: Labelled>(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<C, prometheus::Error> {
    registered(registry, C::labelled(Opts::new(name, help), labels)?)
}

/// Creates the series of `family` (of one label) for each of `values`, at zero: so that
/// they are rendered before the first count.
pub(crate) fn prime<T: MetricVecBuilder>(
    family: &MetricVec<T>,
    values: impl IntoIterator<Item = &'static str>,
) {
    for value in values {
        family.with_label_values(&[value]);
    }
}

/// A latency histogram with the [`LATENCY_BUCKETS`], registered in `registry`.
fn latency(registry: &Registry, name: &str, help: &str) -> Result<Histogram, prometheus::Error> {
    let buckets = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    registered(registry, Histogram::with_opts(buckets)?)
}

/// The families of the upstream pool (`crate::reuse`): connections reused, and kept idle.
fn reuse_families(r: &Registry) -> Result<(IntCounter, IntGauge), prometheus::Error> {
    let upstream_reused = IntCounter::new(
        "mediator_upstream_reused_total",
        "Terminated tunnels that were given an idle upstream connection instead of a new one ([limits] idle_upstream_connections).",
    )?;
    let upstream_idle = IntGauge::new(
        "mediator_upstream_idle_connections",
        "Idle upstream connections of terminated tunnels kept for reuse, as of this scrape.",
    )?;
    Ok((
        registered(r, upstream_reused)?,
        registered(r, upstream_idle)?,
    ))
}

/// The families about the service itself, registered in `registry`: reloads by result,
/// the time of the last good one, and the build (`mediator_build_info`, set to 1).
fn service_families(
    registry: &Registry,
) -> Result<(IntCounterVec, prometheus::Gauge), prometheus::Error> {
    let reloads: IntCounterVec = family(
        registry,
        "mediator_reloads_total",
        "Configuration reloads (SIGHUP, --watch-config), by result: ok, partial (some authorities kept their old version), failed (nothing applied).",
        &["result"],
    )?;
    let last_reload = prometheus::Gauge::new(
        "mediator_last_reload_success_timestamp_seconds",
        "When the configuration was last applied as a whole (Unix time, seconds); the start until then.",
    )?;
    let build_info: IntGaugeVec = family(
        registry,
        "mediator_build_info",
        "Always 1; the labels name the build: its version and git revision.",
        &["version", "revision"],
    )?;
    build_info
        .with_label_values(&[env!("CARGO_PKG_VERSION"), crate::version::GIT_REVISION])
        .set(1);
    prime(&reloads, ReloadResult::ALL.map(ReloadResult::as_str));
    last_reload.set(unix_now());
    Ok((reloads, registered(registry, last_reload)?))
}

/// The mediator's metric families, registered in a registry of their own. Cheap to clone
/// (every family is reference-counted).
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    registry: Registry,
    decisions: IntCounterVec,
    active: IntGaugeVec,
    bytes: IntCounterVec,
    connect: Histogram,
    dns: Histogram,
    upstream_errors: IntCounterVec,
    authorities: IntGauge,
    routed: IntCounterVec,
    limited: IntCounterVec,
    open: IntGaugeVec,
    upstream_reused: IntCounter,
    upstream_idle: IntGauge,
    reloads: IntCounterVec,
    last_reload: prometheus::Gauge,
    asks: AskMetrics,
    /// The authority names that have series of their own (at most `label_cap`); every
    /// other one is counted under [`OVERFLOW`].
    labelled: Arc<std::sync::RwLock<std::collections::HashSet<String>>>,
    label_cap: usize,
    /// Changed whenever an authority's label or series may change (`prime`, `forget`):
    /// a [`DecisionSeries`] of an older epoch is looked up again.
    epoch: Arc<AtomicU64>,
}

/// The most authority names with series of their own: beyond it, a new authority's
/// series are counted under [`OVERFLOW`], so that `/metrics` stays bounded even with
/// many thousands of live task-scoped authorities.
pub(crate) const AUTHORITY_LABEL_CAP: usize = 2_000;

/// The `authority` label of the authorities beyond [`AUTHORITY_LABEL_CAP`].
pub(crate) const OVERFLOW: &str = "_overflow";

impl Metrics {
    /// Creates and registers every family, plus the process collector (CPU, memory, file
    /// descriptors, start time of this process).
    ///
    /// # Errors
    /// [`prometheus::Error`] if a family cannot be registered (only possible through a
    /// programming error: the names are fixed and distinct).
    pub(crate) fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let r = &registry;
        let decisions: IntCounterVec = family(
            r,
            "mediator_decisions_total",
            "Decisions taken, by authority (\"-\" when none was established), protocol, decision and reason.",
            &["authority", "protocol", "decision", "reason"],
        )?;
        let active: IntGaugeVec = family(
            r,
            "mediator_active_connections",
            "Allowed upstream connections (tunnels and forwarding connections) currently open, by authority.",
            &["authority"],
        )?;
        let bytes: IntCounterVec = family(
            r,
            "mediator_bytes_total",
            "Bytes relayed, by authority and direction (up: client to upstream, down: upstream to client); an open connection (tunnel, terminated tunnel, forwarding connection) adds its bytes every 5 s.",
            &["authority", "direction"],
        )?;
        let connect = latency(
            r,
            "mediator_connect_duration_seconds",
            "Time to connect to a pinned upstream address (successful or not).",
        )?;
        let dns = latency(
            r,
            "mediator_dns_duration_seconds",
            "Time to resolve a destination name (hosts map or DNS; IP literals are not counted).",
        )?;
        let upstream_errors: IntCounterVec = family(
            r,
            "mediator_upstream_errors_total",
            "Failures after an allowed name decision: DNS and upstream connect, by kind.",
            &["kind"],
        )?;
        let authorities = registered(
            r,
            IntGauge::new(
                "mediator_authorities",
                "Authorities currently configured (live, not revoked).",
            )?,
        )?;
        let routed: IntCounterVec = family(
            r,
            "mediator_routed_connections_total",
            "Allowed upstream connections opened, by authority and route (direct or parent: [upstream]).",
            &["authority", "route"],
        )?;
        let limited: IntCounterVec = family(
            r,
            "mediator_limited_total",
            "Connections refused or shed by a limit (design section 13), by authority (\"-\" for the unidentified pool and the global limit) and limit.",
            &["authority", "limit"],
        )?;
        let open: IntGaugeVec = family(
            r,
            "mediator_open_connections",
            "Client connections each authority holds (what its max_connections counts).",
            &["authority"],
        )?;
        let (upstream_reused, upstream_idle) = reuse_families(r)?;
        let (reloads, last_reload) = service_families(r)?;
        let asks = AskMetrics::new(r)?;
        for kind in [LimitKind::Unidentified, LimitKind::Global] {
            limited.with_label_values(&[NO_AUTHORITY, kind.as_str()]);
        }
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        prime(
            &upstream_errors,
            UpstreamErrorKind::ALL.map(UpstreamErrorKind::as_str),
        );
        Ok(Self {
            registry,
            decisions,
            active,
            bytes,
            connect,
            dns,
            upstream_errors,
            authorities,
            routed,
            limited,
            open,
            upstream_reused,
            upstream_idle,
            reloads,
            last_reload,
            asks,
            labelled: Arc::default(),
            label_cap: AUTHORITY_LABEL_CAP,
            epoch: Arc::default(),
        })
    }

    /// The `authority` label of `name`: the name itself if it has series of its own,
    /// else [`OVERFLOW`].
    fn label<'a>(&self, name: &'a str) -> &'a str {
        if name == NO_AUTHORITY
            || self
                .labelled
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(name)
        {
            name
        } else {
            OVERFLOW
        }
    }

    /// The families of asking the host, with the `authority` label of `name` (its own, or
    /// [`OVERFLOW`] beyond the cap).
    pub(crate) fn asks<'a>(&'a self, name: &'a str) -> (&'a AskMetrics, &'a str) {
        (&self.asks, self.label(name))
    }

    /// Counts one configuration reload; a whole success also sets the time of the last.
    pub(crate) fn reloaded(&self, result: ReloadResult) {
        self.reloads.with_label_values(&[result.as_str()]).inc();
        if result == ReloadResult::Ok {
            self.last_reload.set(unix_now());
        }
    }

    /// Creates the per-authority series with value 0 (so that a new authority shows up on
    /// dashboards before its first connection).
    pub(crate) fn prime(&self, authority: &str) {
        {
            let mut labelled = self
                .labelled
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if labelled.len() < self.label_cap {
                labelled.insert(authority.to_owned());
            }
            self.epoch.fetch_add(1, Ordering::SeqCst);
        }
        let authority = self.label(authority);
        self.active.with_label_values(&[authority]);
        self.open.with_label_values(&[authority]);
        for kind in [LimitKind::Connections, LimitKind::Rate] {
            self.limited.with_label_values(&[authority, kind.as_str()]);
        }
        for direction in ["up", "down"] {
            self.bytes.with_label_values(&[authority, direction]);
        }
    }

    /// Counts one decision. `authority` must be a configured name or `None`.
    pub(crate) fn decision(
        &self,
        authority: Option<&str>,
        protocol: Protocol,
        decision: Verdict,
        reason: Reason,
    ) {
        self.decision_counter(authority, protocol, decision, reason)
            .inc();
    }

    fn decision_counter(
        &self,
        authority: Option<&str>,
        protocol: Protocol,
        decision: Verdict,
        reason: Reason,
    ) -> IntCounter {
        let authority = self.label(authority.unwrap_or(NO_AUTHORITY));
        self.decisions.with_label_values(&[
            authority,
            protocol.as_str(),
            decision.as_str(),
            reason.as_str(),
        ])
    }

    /// An allowed upstream connection of `authority` was routed `route` (`"direct"` or
    /// `"parent"`, [`crate::route::Route::kind`]).
    pub(crate) fn routed(&self, authority: &str, route: &'static str) {
        self.routed
            .with_label_values(&[self.label(authority), route])
            .inc();
    }

    /// An allowed upstream connection was opened for `authority`.
    pub(crate) fn opened(&self, authority: &str) {
        self.active
            .with_label_values(&[self.label(authority)])
            .inc();
    }

    /// An allowed upstream connection of `authority` closed after relaying `up` and
    /// `down` more bytes (those not counted by [`Self::bytes`] while it was open).
    pub(crate) fn closed(&self, authority: &str, up: u64, down: u64) {
        self.active
            .with_label_values(&[self.label(authority)])
            .dec();
        self.bytes(authority, up, down);
    }

    /// Counts bytes relayed for `authority` (up: client to upstream).
    pub(crate) fn bytes(&self, authority: &str, up: u64, down: u64) {
        let authority = self.label(authority);
        self.bytes.with_label_values(&[authority, "up"]).inc_by(up);
        self.bytes
            .with_label_values(&[authority, "down"])
            .inc_by(down);
    }

    /// Observes one upstream connect attempt.
    pub(crate) fn observe_connect(&self, took: Duration) {
        self.connect.observe(took.as_secs_f64());
    }

    /// Observes one name resolution.
    pub(crate) fn observe_dns(&self, took: Duration) {
        self.dns.observe(took.as_secs_f64());
    }

    /// Counts one connection refused or shed by `limit` (`authority`: a configured name,
    /// or `None` for the unidentified pool and the global limit).
    pub(crate) fn limited(&self, authority: Option<&str>, limit: LimitKind) {
        self.limited
            .with_label_values(&[
                self.label(authority.unwrap_or(NO_AUTHORITY)),
                limit.as_str(),
            ])
            .inc();
    }

    /// Sets the client connections each authority in `live` (name, count) holds: the live
    /// ones and the revoked or replaced ones still holding connections. The series of any
    /// other authority (revoked, its last connection closed) are removed from every
    /// family, so that churn of task-scoped authorities does not grow `/metrics` for ever
    /// (design section 19); a name created again starts from zero.
    pub(crate) fn set_open<'a>(&self, live: impl IntoIterator<Item = (&'a str, u32)>) {
        let live: HashMap<&str, u32> = live.into_iter().collect();
        let mut gone: Vec<String> = Vec::new();
        for family in Collector::collect(&self.open)
            .iter()
            .chain(&Collector::collect(&self.decisions))
        {
            for metric in family.get_metric() {
                for label in metric.get_label() {
                    let name = label.value();
                    if label.name() == "authority"
                        && name != NO_AUTHORITY
                        && name != OVERFLOW
                        && !live.contains_key(name)
                        && !gone.iter().any(|g| g == name)
                    {
                        gone.push(name.to_owned());
                    }
                }
            }
        }
        for name in &gone {
            // Its upstream connections hold it: a non-zero gauge means one is still open.
            if self.active.with_label_values(&[name]).get() == 0 {
                self.forget(name);
            }
        }
        let mut overflow = 0;
        for (authority, n) in live {
            let label = self.label(authority);
            if label == OVERFLOW {
                overflow += i64::from(n);
            } else {
                self.open.with_label_values(&[label]).set(i64::from(n));
            }
        }
        if overflow > 0 || self.open.get_metric_with_label_values(&[OVERFLOW]).is_ok() {
            self.open.with_label_values(&[OVERFLOW]).set(overflow);
        }
    }

    /// Removes every series labelled `authority = name`, and gives its place among the
    /// labelled names back.
    fn forget(&self, name: &str) {
        self.labelled
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        fn remove_from<T: MetricVecBuilder>(family: &MetricVec<T>, name: &str) {
            for f in family.collect() {
                for metric in f.get_metric() {
                    let labels: HashMap<&str, &str> = metric
                        .get_label()
                        .iter()
                        .map(|l| (l.name(), l.value()))
                        .collect();
                    if labels.get("authority") == Some(&name) {
                        let _ = family.remove(&labels);
                    }
                }
            }
        }
        remove_from(&self.decisions, name);
        remove_from(&self.bytes, name);
        remove_from(&self.routed, name);
        remove_from(&self.limited, name);
        remove_from(&self.active, name);
        remove_from(&self.open, name);
        self.asks.forget(name);
    }

    /// Counts one upstream failure.
    pub(crate) fn upstream_error(&self, kind: UpstreamErrorKind) {
        self.upstream_errors
            .with_label_values(&[kind.as_str()])
            .inc();
    }

    /// Counts a terminated tunnel given an idle upstream connection.
    pub(crate) fn reused_upstream(&self) {
        self.upstream_reused.inc();
    }

    /// Sets how many idle upstream connections are kept for reuse.
    pub(crate) fn set_idle_upstream(&self, n: usize) {
        self.upstream_idle.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets the number of live authorities.
    pub(crate) fn set_authorities(&self, n: usize) {
        self.authorities.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The live connections of `authority` (the gauge's value).
    pub(crate) fn active_of(&self, authority: &str) -> i64 {
        self.active
            .with_label_values(&[self.label(authority)])
            .get()
    }

    /// `family` registered with the mediator's registry (rendered with the others), and
    /// given back.
    ///
    /// # Errors
    /// [`prometheus::Error`] when the name is taken.
    pub(crate) fn registered<C: Collector + Clone + 'static>(
        &self,
        family: C,
    ) -> Result<C, prometheus::Error> {
        registered(&self.registry, family)
    }

    /// Every family in the Prometheus text exposition format (version 0.0.4).
    pub(crate) fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!("cannot encode metrics: {e}");
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// The content type of [`Metrics::render`].
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
