//! Issued leaves, ready for rustls, in an LRU bounded by count.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use lru::LruCache;
use rustls::sign::CertifiedKey;

use crate::ca::{Ca, LeafName};
use crate::error::Error;

/// Leaves by name, at most `capacity` of them; the least recently used is dropped first.
/// A leaf is re-issued once half of its remaining validity at issue time has passed, so a
/// client never receives one close to expiry.
pub struct LeafCache {
    ca: Arc<Ca>,
    entries: Mutex<LruCache<LeafName, Entry>>,
}

struct Entry {
    key: Arc<CertifiedKey>,
    renew_at: SystemTime,
}

impl std::fmt::Debug for LeafCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeafCache")
            .field("ca", &self.ca)
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl LeafCache {
    /// An empty cache issuing from `ca`, holding at most `capacity` leaves.
    pub fn new(ca: Arc<Ca>, capacity: NonZeroUsize) -> Self {
        Self {
            ca,
            entries: Mutex::new(LruCache::new(capacity)),
        }
    }

    /// The CA this cache issues from.
    pub fn ca(&self) -> &Arc<Ca> {
        &self.ca
    }

    /// The leaf for exactly `name` (chain: leaf, CA), issued now if it is not cached or
    /// due for renewal. Issuing happens outside the lock, so other names are not held up.
    ///
    /// # Errors
    /// As [`Ca::issue`]; [`Error::Rustls`] if rustls cannot load the issued key.
    pub fn get(&self, name: &LeafName) -> Result<Arc<CertifiedKey>, Error> {
        let now = SystemTime::now();
        if let Some(e) = self.lock().get(name)
            && now < e.renew_at
        {
            return Ok(Arc::clone(&e.key));
        }
        let leaf = self.ca.issue(name)?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&leaf.key)?;
        let key = Arc::new(CertifiedKey::new(leaf.chain, signing));
        let half = leaf.not_after.duration_since(now).unwrap_or_default() / 2;
        self.lock().put(
            name.clone(),
            Entry {
                key: Arc::clone(&key),
                renew_at: now + half,
            },
        );
        Ok(key)
    }

    /// How many leaves are cached.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no leaf is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most leaves the cache holds.
    pub fn capacity(&self) -> NonZeroUsize {
        self.lock().cap()
    }

    /// Whether a leaf for `name` is cached (without touching its recency).
    pub fn contains(&self, name: &LeafName) -> bool {
        self.lock().contains(name)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<LeafName, Entry>> {
        // A panic while holding the lock cannot leave the LRU half-updated in a way that
        // matters: every entry is complete on insertion.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::CaOptions;

    fn name(s: &str) -> LeafName {
        LeafName::parse(s).unwrap()
    }

    #[test]
    fn cache_is_bounded_by_count_and_evicts_the_least_recently_used() {
        let ca = Arc::new(Ca::create(&CaOptions::default()).unwrap());
        let cache = LeafCache::new(ca, NonZeroUsize::new(2).unwrap());
        let a1 = cache.get(&name("a.test")).unwrap();
        let _b = cache.get(&name("b.test")).unwrap();
        // A hit returns the very same leaf.
        let a2 = cache.get(&name("a.test")).unwrap();
        assert!(Arc::ptr_eq(&a1, &a2));
        // c.test evicts b.test (least recently used), not a.test.
        let _c = cache.get(&name("c.test")).unwrap();
        assert_eq!(cache.len(), 2);
        assert!(cache.contains(&name("a.test")));
        assert!(!cache.contains(&name("b.test")));
        assert!(cache.contains(&name("c.test")));
        for i in 0..20 {
            cache.get(&name(&format!("n{i}.test"))).unwrap();
            assert!(cache.len() <= 2);
        }
        assert_eq!(cache.capacity().get(), 2);
    }

    #[test]
    fn cached_leaves_chain_to_the_ca_for_their_name() {
        let ca = Arc::new(Ca::create(&CaOptions::default()).unwrap());
        let cache = LeafCache::new(Arc::clone(&ca), NonZeroUsize::new(4).unwrap());
        let key = cache.get(&name("origin.test")).unwrap();
        assert_eq!(key.cert.len(), 2);
        assert_eq!(&key.cert[1], ca.cert_der());
        let leaf = crate::ca::Leaf {
            chain: key.cert.clone(),
            key: rustls_pki_types::PrivateKeyDer::Pkcs8(Vec::new().into()),
            not_after: SystemTime::now(),
        };
        ca.verify_leaf(&leaf, &name("origin.test")).unwrap();
        assert!(key.keys_match().is_ok(), "the private key matches the leaf");
    }
}
