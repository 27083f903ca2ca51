//! The grant's rule index: exact names and wildcard suffixes in hash maps, so a
//! decision looks up the target's labels instead of scanning every entry.

use std::collections::HashMap;

use crate::host::{CanonicalHost, Target};
use crate::pattern::{HostPattern, PatternKind};

/// A fast, unkeyed hasher (the FxHash mix) for the rule index. Hash flooding is not a
/// concern: the tables are filled only from configuration, and a lookup with a hostile key
/// costs at most one probe sequence over those fixed entries.
#[derive(Default, Clone, Copy)]
pub(super) struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub(super) type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;

/// Lookup structure over a list of patterns, so that a decision does not scan every rule:
/// exact hosts and wildcard suffixes are hashed; only CIDRs and `*` are scanned.
#[derive(Debug, Default)]
pub(super) struct RuleIndex {
    pub(super) exact: FastMap<CanonicalHost, Vec<usize>>,
    pub(super) suffix: FastMap<String, Vec<usize>>,
    pub(super) scanned: Vec<usize>,
}

/// The result of looking a target up in a [`RuleIndex`].
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Lookup {
    /// The first pattern (in written order) matching host and port.
    pub(super) full: Option<usize>,
    /// The first pattern matching the host, whatever its port.
    pub(super) host_only: Option<usize>,
}

impl RuleIndex {
    pub(super) fn build(patterns: &[HostPattern]) -> Self {
        let mut index = Self::default();
        for (i, p) in patterns.iter().enumerate() {
            match &p.kind {
                PatternKind::Exact(h) => index.exact.entry(h.clone()).or_default().push(i),
                PatternKind::Suffix(s) => index.suffix.entry(s.clone()).or_default().push(i),
                PatternKind::Net(_) | PatternKind::Any => index.scanned.push(i),
            }
        }
        index
    }

    /// Calls `f` with the index of every pattern whose host part matches `host`, in no
    /// particular order.
    pub(super) fn for_each_match(
        &self,
        patterns: &[HostPattern],
        host: &CanonicalHost,
        mut f: impl FnMut(usize),
    ) {
        if let Some(list) = self.exact.get(host) {
            list.iter().for_each(|&i| f(i));
        }
        if let Some(name) = host.name() {
            // Every proper suffix after a dot: "a.b.c" -> "b.c", "c".
            for (dot, _) in name.match_indices('.') {
                if let Some(list) = self.suffix.get(&name[dot + 1..]) {
                    list.iter().for_each(|&i| f(i));
                }
            }
        }
        for &i in &self.scanned {
            if patterns[i].matches_host(host) {
                f(i);
            }
        }
    }

    /// The lowest-index patterns matching `target`, on its port and on any port.
    pub(super) fn lookup(&self, patterns: &[HostPattern], target: &Target) -> Lookup {
        let mut found = Lookup::default();
        self.for_each_match(patterns, &target.host, |i| {
            if found.host_only.is_none_or(|b| i < b) {
                found.host_only = Some(i);
            }
            if patterns[i].port.is_none_or(|p| p == target.port) && found.full.is_none_or(|b| i < b)
            {
                found.full = Some(i);
            }
        });
        found
    }
}
