//! What the unit tests of several modules share (tests only).

use std::path::PathBuf;

/// A fresh, canonical scratch directory of this test process, `shim-{name}-{pid}` in the
/// temporary directory, removed on drop. `name` starts with the module's own word
/// (`fs-`, `secrets-`, ...): the tests of one process run at once.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("shim-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(std::fs::canonicalize(&p).unwrap())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
