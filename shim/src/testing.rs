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

    /// `sub` below this directory, made with each of `entries` below it: a path ending in
    /// `/` is made a directory, any other a file holding its text (the directories above
    /// it made too).
    pub(crate) fn tree(&self, sub: &str, entries: &[(&str, &str)]) -> PathBuf {
        let root = self.0.join(sub);
        std::fs::create_dir_all(&root).unwrap();
        for (path, text) in entries {
            let at = root.join(path);
            if path.ends_with('/') {
                std::fs::create_dir_all(&at).unwrap();
            } else {
                std::fs::create_dir_all(at.parent().unwrap()).unwrap();
                std::fs::write(&at, text).unwrap();
            }
        }
        root
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
