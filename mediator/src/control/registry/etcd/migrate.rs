//! Moving the records of the layout before placement (`<prefix>authorities/<name>`, every
//! replica reading all of them) into the fleet-wide range: a record of that layout was
//! served by every replica, so it is placed on `"*"`.
//!
//! Each record moves in one transaction: if the old key is still the one read, and its
//! name is free in the current layout, the name index and the fleet record are put (with
//! the old key's lease, so a `ttl_s` still ends on time) and the old key deleted. Every
//! start looks for such records, so a move interrupted by a crash is finished by the next
//! start, and two replicas moving at once move each record once: the second finds the old
//! key gone. A record whose name the current layout already holds, or that cannot be read,
//! is left in place and named, as a start always named records it could not load.

use etcd_client::{Compare, CompareOp, KeyValue, KvClient, PutOptions, Txn, TxnOp};
use policy::config::{FLEET, Placement};

use super::super::{ErrorKind, KeyRange, RegistryError, Rejected, decode};
use super::layout::{Place, read_range};
use super::{Etcd, unavailable};

/// What became of one record of the old layout.
enum Moved {
    /// Moved by this replica.
    Here,
    /// Gone meanwhile: moved by another replica, or its lease ended.
    Gone,
    /// Left in place, and why.
    Left(Rejected),
}

impl Etcd {
    /// Moves every record of the layout before placement into the current one. Returns
    /// the records left in place (named and counted by the caller).
    ///
    /// # Errors
    /// [`RegistryError::Unavailable`] when the cluster does not answer.
    pub(super) async fn migrate(&self) -> Result<Vec<Rejected>, RegistryError> {
        let mut kv = self.client.kv_client();
        let prefix = self.layout.prefix(KeyRange::Legacy);
        let (old, _) = read_range(&mut kv, &prefix, 0, KeyRange::Legacy, &self.metrics).await?;
        let mut left = Vec::new();
        let mut moved = 0usize;
        for entry in old {
            match self.move_one(&mut kv, &entry).await? {
                Moved::Here => moved += 1,
                Moved::Gone => {}
                Moved::Left(why) => left.push(why),
            }
        }
        if moved > 0 {
            tracing::warn!(target: crate::control::TARGET, "registry: moved {moved} records from {prefix} to the fleet-wide range {} (the layout with placement by node)", self.layout.prefix(KeyRange::Fleet));
            crate::say!(
                Info,
                "mediator: registry: moved {moved} records of the layout before placement ({prefix}) to {}",
                self.layout.prefix(KeyRange::Fleet)
            );
        }
        Ok(left)
    }

    /// Moves one record of the old layout, if it is still there and its name is free.
    async fn move_one(&self, kv: &mut KvClient, entry: &KeyValue) -> Result<Moved, RegistryError> {
        let key = String::from_utf8_lossy(entry.key()).into_owned();
        let left = |why: String, kind: ErrorKind| {
            Moved::Left(Rejected {
                what: format!("etcd key {key} (left in place)"),
                why,
                kind,
            })
        };
        let name = match self.layout.locate(&key) {
            Some((Place::Legacy, name)) if policy::check_authority_name(name).is_ok() => name,
            _ => {
                return Ok(left(
                    "the key does not end in an authority name".into(),
                    ErrorKind::Damaged,
                ));
            }
        };
        // Read before it is moved: a record that cannot be trusted stays where it is.
        if let Err(why) = decode(entry.value(), name) {
            return Ok(left(why, ErrorKind::Damaged));
        }
        let index = self.layout.index(name);
        let fleet = self.layout.record(&Placement::Fleet, name);
        let put = (entry.lease() != 0).then(|| PutOptions::new().with_lease(entry.lease()));
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key.as_str(), CompareOp::Equal, entry.mod_revision()),
                Compare::create_revision(index.as_str(), CompareOp::Equal, 0),
                Compare::create_revision(fleet.as_str(), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(index.as_str(), FLEET, put.clone()),
                TxnOp::put(fleet.as_str(), entry.value(), put),
                TxnOp::delete(key.as_str(), None),
            ]);
        // A failed call (a lease that ended meanwhile fails the put) is told apart below.
        if kv.txn(txn).await.is_ok_and(|r| r.succeeded()) {
            return Ok(Moved::Here);
        }
        let now = kv.get(key.as_str(), None).await.map_err(unavailable)?;
        Ok(match now.kvs().first() {
            None => Moved::Gone,
            Some(k) if k.mod_revision() == entry.mod_revision() => left(
                format!("its name is taken in the current layout ({index}): remove one of the two"),
                ErrorKind::Conflict,
            ),
            Some(_) => left(
                "it changed while it was being moved; it is moved at the next start".into(),
                ErrorKind::Damaged,
            ),
        })
    }
}
