//! The registry's metric families (design section 17): `mediator_registry_stale`,
//! `mediator_registry_revision` (etcd), `mediator_registry_errors_total{kind}`,
//! `mediator_registry_operations_total{op,result}` and (etcd)
//! `mediator_registry_keys_read_total{range}`, registered with the mediator's others.

use prometheus::{IntCounterVec, IntGauge, Opts};

use crate::metrics::{Metrics, prime};

/// What went wrong with a stored record or the backend (`kind` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// A record cannot be read or its seal does not match (set aside).
    Damaged,
    /// A record was read but is not a valid authority under this configuration.
    Invalid,
    /// A record names an authority of the configuration file (a name is config or api).
    Conflict,
    /// A stored authority's socket could not be created.
    Socket,
    /// The backend could not be reached, or did not confirm in time.
    Unavailable,
    /// The state directory could not be written.
    Io,
}

impl ErrorKind {
    /// Every kind (primed at start so dashboards see zeros).
    pub(crate) const ALL: [Self; 6] = [
        Self::Damaged,
        Self::Invalid,
        Self::Conflict,
        Self::Socket,
        Self::Unavailable,
        Self::Io,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Damaged => "damaged",
            Self::Invalid => "invalid",
            Self::Conflict => "conflict",
            Self::Socket => "socket",
            Self::Unavailable => "unavailable",
            Self::Io => "io",
        }
    }
}

/// A registry operation (`op` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// `POST /v1/authorities` storing a record.
    Create,
    /// `DELETE /v1/authorities/<name>` or an expiry removing one.
    Delete,
    /// Loading every record (start, or a re-list after a lost watch).
    Load,
    /// A change another writer made, applied from the watch.
    Watch,
    /// A `ttl_s` authority revoked at its `expires_at`.
    Expire,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Delete => "delete",
            Self::Load => "load",
            Self::Watch => "watch",
            Self::Expire => "expire",
        }
    }
}

/// Which keys of the etcd layout a read returned (`range` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyRange {
    /// The records placed on this replica's node.
    Node,
    /// The fleet-wide records (`node = "*"`).
    Fleet,
    /// The name index (a delete finding where a record is placed).
    Index,
    /// The layout before placement, read to move its records.
    Legacy,
}

impl KeyRange {
    /// Every range (primed at start).
    const ALL: [Self; 4] = [Self::Node, Self::Fleet, Self::Index, Self::Legacy];

    /// The label value.
    fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Fleet => "fleet",
            Self::Index => "index",
            Self::Legacy => "legacy",
        }
    }
}

/// The registry's families. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct RegistryMetrics {
    stale: IntGauge,
    revision: IntGauge,
    errors: IntCounterVec,
    operations: IntCounterVec,
    keys_read: IntCounterVec,
}

impl RegistryMetrics {
    /// Creates the families and registers them with `metrics`.
    ///
    /// # Errors
    /// [`prometheus::Error`] when a family cannot be registered (a programming error).
    pub(crate) fn new(metrics: &Metrics) -> Result<Self, prometheus::Error> {
        let stale = metrics.registered(IntGauge::new(
            "mediator_registry_stale",
            "1 while this replica cannot confirm its view of the registry is current (decisions under registry authorities are refused: registry_unavailable), else 0.",
        )?)?;
        let revision = metrics.registered(IntGauge::new(
            "mediator_registry_revision",
            "etcd: the revision of the registry this replica has applied (0 for the local and memory backends).",
        )?)?;
        let errors = metrics.registered(IntCounterVec::new(
            Opts::new(
                "mediator_registry_errors_total",
                "Registry problems, by kind: damaged or invalid records set aside, names held by the config file, sockets that could not be made, an unreachable backend, write failures.",
            ),
            &["kind"],
        )?)?;
        let operations = metrics.registered(IntCounterVec::new(
            Opts::new(
                "mediator_registry_operations_total",
                "Registry operations, by op (create, delete, load, watch, expire) and result (ok, error, exists).",
            ),
            &["op", "result"],
        )?)?;
        let keys_read = metrics.registered(IntCounterVec::new(
            Opts::new(
                "mediator_registry_keys_read_total",
                "etcd: keys this replica received from the registry (listed or watched), by range: node (its own node's records), fleet (node = \"*\"), index (a delete finding a record's node), legacy (the layout before placement, read to move it).",
            ),
            &["range"],
        )?)?;
        prime(&keys_read, KeyRange::ALL.map(KeyRange::as_str));
        prime(&errors, ErrorKind::ALL.map(ErrorKind::as_str));
        Ok(Self {
            stale,
            revision,
            errors,
            operations,
            keys_read,
        })
    }

    /// Sets `mediator_registry_stale`.
    pub(crate) fn set_stale(&self, stale: bool) {
        self.stale.set(i64::from(stale));
    }

    /// Sets `mediator_registry_revision`.
    pub(crate) fn set_revision(&self, revision: i64) {
        self.revision.set(revision);
    }

    /// Counts one problem.
    pub(crate) fn error(&self, kind: ErrorKind) {
        self.errors.with_label_values(&[kind.as_str()]).inc();
    }

    /// Counts `n` keys received from the registry in `range`.
    #[cfg_attr(
        not(feature = "etcd"),
        expect(dead_code, reason = "counted by the etcd backend")
    )]
    pub(crate) fn keys_read(&self, range: KeyRange, n: usize) {
        self.keys_read
            .with_label_values(&[range.as_str()])
            .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }

    /// Counts one operation and its result (`ok`, `error`, `exists`).
    pub(crate) fn operation(&self, op: Op, result: &'static str) {
        self.operations
            .with_label_values(&[op.as_str(), result])
            .inc();
    }
}
