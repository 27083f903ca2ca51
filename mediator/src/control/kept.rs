//! What is kept of a stored record once applied: one per served authority, so small.

use super::registry::Stored;

/// A stored record as applied, kept small, since one is kept per served authority: its
/// generation, and the record as compact JSON, read back only when a reload re-creates
/// it under a changed `[global]` deny list (the parsed table cost about four times as
/// much).
#[derive(Debug, Clone)]
pub(super) struct Kept {
    /// Its generation.
    pub(super) generation: u64,
    /// The record, as compact JSON.
    record: Box<str>,
}

impl Kept {
    /// What is kept of `stored`.
    pub(super) fn of(stored: &Stored) -> Self {
        Self {
            generation: stored.generation,
            // Cannot fail: a record is strings and a JSON map with string keys, which
            // serde_json always writes (it fails only on other map keys or a failing
            // `Serialize`).
            record: serde_json::to_string(&stored.record)
                .unwrap_or_default()
                .into_boxed_str(),
        }
    }

    /// The record again (`None` only for one that could not be written, which cannot
    /// happen: it came from JSON).
    pub(super) fn stored(&self) -> Option<Stored> {
        let record = serde_json::from_str(&self.record).ok()?;
        Some(Stored {
            record,
            generation: self.generation,
        })
    }
}
