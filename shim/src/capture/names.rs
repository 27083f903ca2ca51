//! The synthetic name map of one run (design section 15): each canonical host the stub
//! resolver answered for gets one pool index (one IPv4 and one IPv6 address, see
//! [`super::addrs`]), kept for the life of the run, so that a captured connection to that
//! address can name the host to the mediator.
//!
//! Bounded: at most [`MAX_NAMES`] names; past that the stub answers SERVFAIL. It stores
//! canonical hosts only (the policy canonicaliser made them), never what a query spelled.

use std::collections::HashMap;
use std::sync::Mutex;

use super::addrs::POOL;

/// Most names one run maps (each costs about a hundred bytes).
pub(crate) const MAX_NAMES: usize = 65_536;

/// Canonical host <-> pool index, for the life of the run.
#[derive(Debug, Default)]
pub(crate) struct Names {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_name: HashMap<String, u32>,
    by_index: Vec<String>,
}

impl Names {
    /// The pool index of `host` (a canonical host's text), given a new one the first time;
    /// `None` when the map is full.
    pub(crate) fn index(&self, host: &str) -> Option<u32> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(&i) = inner.by_name.get(host) {
            return Some(i);
        }
        if inner.by_index.len() >= MAX_NAMES.min(POOL as usize) {
            return None;
        }
        let i = u32::try_from(inner.by_index.len()).ok()?;
        inner.by_index.push(host.to_owned());
        inner.by_name.insert(host.to_owned(), i);
        Some(i)
    }

    /// The host that pool index `i` stands for.
    pub(crate) fn host(&self, i: u32) -> Option<String> {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.by_index.get(i as usize).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_keeps_its_index_and_the_map_is_bounded() {
        let n = Names::default();
        assert_eq!(n.index("a.test"), Some(0));
        assert_eq!(n.index("b.test"), Some(1));
        assert_eq!(n.index("a.test"), Some(0));
        assert_eq!(n.host(1).as_deref(), Some("b.test"));
        assert_eq!(n.host(2), None);
        for i in 2..MAX_NAMES {
            assert!(n.index(&format!("h{i}.test")).is_some());
        }
        assert_eq!(n.index("one-too-many.test"), None);
        assert_eq!(n.index("a.test"), Some(0));
    }
}
