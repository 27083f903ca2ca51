//! The `memory` registry: records live in the process only, as before design section 17.
//! An authority created through the admin API is gone when the process ends (the start
//! warns when an admin API can create one).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use policy::config::RegistryBackend;

use super::{Loaded, Record, RegistryError, Store, Stored};

/// The memory backend.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    records: Mutex<BTreeMap<String, Stored>>,
    node: String,
}

impl Memory {
    /// An empty store of the replica of `node`.
    pub(crate) fn new(node: String) -> Self {
        Self {
            records: Mutex::default(),
            node,
        }
    }
}

impl Store for Memory {
    fn backend(&self) -> RegistryBackend {
        RegistryBackend::Memory
    }

    fn node(&self) -> &str {
        &self.node
    }

    fn location(&self) -> String {
        "this process's memory".to_owned()
    }

    fn boot(&self) -> BoxFuture<'_, Result<u64, RegistryError>> {
        // Nothing outlives the process: ids start at 1, as they always did.
        async { Ok(0) }.boxed()
    }

    fn load(&self) -> BoxFuture<'_, Result<Loaded, RegistryError>> {
        let records = self
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        async move {
            Ok(Loaded {
                records,
                ..Loaded::default()
            })
        }
        .boxed()
    }

    fn create<'a>(
        &'a self,
        record: &'a Record,
        generation: u64,
        _ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<u64, RegistryError>> {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let result = if records.contains_key(&record.name) {
            Err(RegistryError::Exists(record.name.clone()))
        } else {
            records.insert(
                record.name.clone(),
                Stored {
                    record: record.clone(),
                    generation,
                },
            );
            Ok(generation)
        };
        async move { result }.boxed()
    }

    fn delete<'a>(
        &'a self,
        name: &'a str,
        generation: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<u64>, RegistryError>> {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let matches = records
            .get(name)
            .is_some_and(|s| generation.is_none_or(|g| s.generation == g));
        let result = matches.then(|| {
            records.remove(name);
            0
        });
        async move { Ok(result) }.boxed()
    }

    fn set_aside<'a>(&'a self, name: &'a str) -> BoxFuture<'a, String> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
        async move { format!("the record of {name:?} (dropped from memory)") }.boxed()
    }
}
