//! The etcd key layout (design section 17, with placement by node), and the reads that
//! follow it:
//!
//! ```text
//! <prefix>boot                    the start counter (generations, decision ids)
//! <prefix>names/<name>            the name index: where the authority is placed ("*" or
//!                                 a node), one key per name across the fleet
//! <prefix>fleet/<name>            the record of an authority every replica serves
//! <prefix>nodes/<node>/<name>     the record of an authority placed on <node>
//! <prefix>authorities/<name>      the layout before placement: moved at start
//! ```
//!
//! A replica reads two ranges, its node's and the fleet's, so what it lists at start and
//! what its watch carries follow its own share, never the other nodes'. A create puts the
//! index key and the record in one transaction that requires both absent, so a name is
//! unique across every node; a delete removes both in one transaction. A `ttl_s` lease
//! holds both keys, so its end removes both at once.
//!
//! Ranges are read a page at a time ([`PAGE`] keys), every page at the revision of the
//! first, so a view is one revision of the store however large.

use etcd_client::{GetOptions, KeyValue, KvClient};
use policy::config::Placement;

use super::super::{ErrorKind, KeyRange, RegistryError, RegistryMetrics, Rejected, Stored, decode};
use super::unavailable;

/// Keys per page of a range read: well under etcd's 4 MiB answer limit for records of a
/// few KiB.
const PAGE: i64 = 500;

/// Where a key of the layout is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Place {
    /// A record, placed as the key says.
    Record(Placement),
    /// A record of the layout before placement.
    Legacy,
}

/// The key names under one prefix, for the replica of one node.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    /// `[registry] prefix`.
    root: String,
    /// This replica's node.
    node: String,
}

impl Layout {
    /// The layout under `root` for the replica of `node`.
    pub(super) fn new(root: &str, node: &str) -> Self {
        Self {
            root: root.to_owned(),
            node: node.to_owned(),
        }
    }

    /// The prefix, for messages.
    pub(super) fn root(&self) -> &str {
        &self.root
    }

    /// This replica's node.
    pub(super) fn node(&self) -> &str {
        &self.node
    }

    /// The start counter's key.
    pub(super) fn boot(&self) -> String {
        format!("{}boot", self.root)
    }

    /// The prefix of a range: this replica's node's records, the fleet's, the index, the
    /// layout before placement.
    pub(super) fn prefix(&self, range: KeyRange) -> String {
        match range {
            KeyRange::Node => self.node_prefix(&self.node),
            KeyRange::Fleet => format!("{}fleet/", self.root),
            KeyRange::Index => format!("{}names/", self.root),
            KeyRange::Legacy => format!("{}authorities/", self.root),
        }
    }

    /// The prefix of every node's records (`mediator registry list`).
    pub(super) fn nodes(&self) -> String {
        format!("{}nodes/", self.root)
    }

    fn node_prefix(&self, node: &str) -> String {
        format!("{}nodes/{node}/", self.root)
    }

    /// The index key of `name`.
    pub(super) fn index(&self, name: &str) -> String {
        format!("{}{name}", self.prefix(KeyRange::Index))
    }

    /// The record key of `name` placed as `placement`.
    pub(super) fn record(&self, placement: &Placement, name: &str) -> String {
        match placement {
            Placement::Fleet => format!("{}{name}", self.prefix(KeyRange::Fleet)),
            Placement::Node(node) => format!("{}{name}", self.node_prefix(node)),
        }
    }

    /// Where a record key is, and the name it ends in; `None` for a key that is not a
    /// record key of this layout.
    pub(super) fn locate<'k>(&self, key: &'k str) -> Option<(Place, &'k str)> {
        let rest = key.strip_prefix(self.root.as_str())?;
        if let Some(name) = rest.strip_prefix("fleet/") {
            return Some((Place::Record(Placement::Fleet), name));
        }
        if let Some(name) = rest.strip_prefix("authorities/") {
            return Some((Place::Legacy, name));
        }
        let (node, name) = rest.strip_prefix("nodes/")?.split_once('/')?;
        Some((Place::Record(Placement::Node(node.to_owned())), name))
    }

    /// A stored record from a record key and its value; the generation is the revision
    /// it was put at. Refused: a key that does not end in an authority name, a record
    /// that cannot be read, or one whose placement is not its key's.
    pub(super) fn stored_of(
        &self,
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
        let (place, name) = self
            .locate(&key_text)
            .filter(|(_, n)| policy::check_authority_name(n).is_ok())
            .ok_or_else(|| reject("the key does not end in an authority name".into()))?;
        let (record, _) = decode(value, name).map_err(reject)?;
        let placed = record
            .placement()
            .map_err(|e| reject(format!("node: {e}")))?;
        let expected = match place {
            Place::Record(p) => p,
            Place::Legacy => Placement::Fleet,
        };
        if placed != expected {
            return Err(reject(format!(
                "it is placed on {placed:?} (node = {:?}) but stored under {expected:?}'s key",
                placed.as_str()
            )));
        }
        let generation =
            u64::try_from(revision).map_err(|_| reject("a negative revision".into()))?;
        Ok(Stored { record, generation })
    }
}

/// The end of the range of keys starting with `prefix` (its last byte raised by one).
fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    // Only for a prefix of 0xff bytes, which no layout prefix is: every key.
    vec![0]
}

/// Every key under `prefix`, a page at a time, at `revision` (0: now, read
/// linearizably); returns them and the revision of the view. `range` labels the keys
/// counted in `mediator_registry_keys_read_total`.
///
/// # Errors
/// [`RegistryError::Unavailable`] when a page cannot be read (the caller retries the
/// whole view).
pub(super) async fn read_range(
    kv: &mut KvClient,
    prefix: &str,
    revision: i64,
    range: KeyRange,
    metrics: &RegistryMetrics,
) -> Result<(Vec<KeyValue>, i64), RegistryError> {
    let end = range_end(prefix);
    let mut from = prefix.as_bytes().to_vec();
    let mut at = revision;
    let mut out = Vec::new();
    loop {
        let options = GetOptions::new()
            .with_range(end.clone())
            .with_limit(PAGE)
            .with_revision(at);
        let mut resp = kv
            .get(from.clone(), Some(options))
            .await
            .map_err(unavailable)?;
        if at == 0 {
            at = resp.header().map_or(0, |h| h.revision());
        }
        let more = resp.more();
        let kvs = resp.take_kvs();
        metrics.keys_read(range, kvs.len());
        // The next page starts at the first key after the last one read.
        let next = kvs.last().filter(|_| more).map(|last| {
            let mut k = last.key().to_vec();
            k.push(0);
            k
        });
        out.extend(kvs);
        match next {
            Some(k) => from = k,
            None => return Ok((out, at)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_place_records_by_node_and_read_back() {
        let l = Layout::new("/e/", "n-1");
        assert_eq!(l.prefix(KeyRange::Node), "/e/nodes/n-1/");
        assert_eq!(l.prefix(KeyRange::Fleet), "/e/fleet/");
        assert_eq!(l.index("a"), "/e/names/a");
        let on = Placement::Node("n-2".into());
        assert_eq!(l.record(&on, "a"), "/e/nodes/n-2/a");
        assert_eq!(l.record(&Placement::Fleet, "a"), "/e/fleet/a");
        assert_eq!(l.locate("/e/nodes/n-2/a"), Some((Place::Record(on), "a")));
        assert_eq!(
            l.locate("/e/fleet/a"),
            Some((Place::Record(Placement::Fleet), "a"))
        );
        assert_eq!(l.locate("/e/authorities/a"), Some((Place::Legacy, "a")));
        assert_eq!(l.locate("/e/boot"), None);
        assert_eq!(l.locate("/other/fleet/a"), None);
        // A node's range never holds another node whose name it starts: "n-1" vs "n-10".
        assert!(
            !l.record(&Placement::Node("n-10".into()), "a")
                .starts_with(&l.prefix(KeyRange::Node))
        );
        assert_eq!(range_end("/e/fleet/"), b"/e/fleet0".to_vec());
    }
}
