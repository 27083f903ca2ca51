//! The tally: the run's violations counted for the report's `filesystem` section, with
//! the first [`MAX_PATHS`] distinct paths.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use super::{FsDenied, FsOp, FsRule};

/// Distinct paths a report lists.
pub(crate) const MAX_PATHS: usize = 100;

/// A kind of operation that cannot be observed here, and why (said once).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Unobserved {
    /// The operations.
    pub(crate) ops: Vec<FsOp>,
    /// Why.
    pub(crate) why: String,
}
/// What the report says of the run's violations.
#[derive(Debug, Default)]
pub(super) struct Tally {
    total: u64,
    by_op: BTreeMap<FsOp, u64>,
    by_rule: BTreeMap<FsRule, u64>,
    /// The first [`MAX_PATHS`] distinct (path, op, rule), with how often each was seen.
    paths: Vec<(PathBuf, FsOp, FsRule, u64)>,
    pub(super) unobserved: Vec<Unobserved>,
    pub(super) observing: bool,
    /// `fs_denied` lines the stream's bound held back.
    suppressed: u64,
}

impl Tally {
    /// Counts `r` (`written` to the stream or held back); whether its (path, op, rule) is
    /// new among the first [`MAX_PATHS`].
    pub(super) fn count(&mut self, r: &FsDenied, written: bool) -> bool {
        self.total += 1;
        self.suppressed += u64::from(!written);
        *self.by_op.entry(r.op).or_default() += 1;
        *self.by_rule.entry(r.rule).or_default() += 1;
        if let Some(e) = self
            .paths
            .iter_mut()
            .find(|(p, o, rule, _)| *p == r.path && *o == r.op && *rule == r.rule)
        {
            e.3 += 1;
            return false;
        }
        if self.paths.len() < MAX_PATHS {
            self.paths.push((r.path.clone(), r.op, r.rule, 1));
            return true;
        }
        false
    }

    /// The report's `filesystem` section.
    pub(super) fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "observed": self.observing,
            "denied": self.total,
            "by_op": self.by_op.iter().map(|(k, v)| (k.as_str(), *v)).collect::<BTreeMap<_, _>>(),
            "by_rule": self.by_rule.iter().map(|(k, v)| (k.as_str(), *v)).collect::<BTreeMap<_, _>>(),
            "paths": self.paths.iter().map(|(p, o, r, n)| serde_json::json!({
                "path": p.to_string_lossy(), "op": o, "rule": r, "count": n,
            })).collect::<Vec<_>>(),
            "paths_limit": MAX_PATHS,
            "stream_suppressed": self.suppressed,
            "unobserved": self.unobserved,
        })
    }
}
