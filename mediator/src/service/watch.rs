//! `mediator --watch-config`: reload when the config file's content changes, as SIGHUP
//! does. Meant for a Kubernetes ConfigMap mounted as a volume, which the kubelet updates by
//! swapping a symlink (no signal reaches the process, and inotify on the file itself
//! misses the swap): the file is read every [`INTERVAL`] and its SHA-256 compared, so any
//! way of replacing it (rename, symlink swap, rewrite in place) is seen.
//!
//! It never decides what a reload does: it only says "changed", and the caller runs the
//! same reload as SIGHUP (a file that does not validate changes nothing).

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// How often the file is read.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// The last content seen of one config file.
#[derive(Debug)]
pub struct ConfigWatch {
    path: PathBuf,
    digest: [u8; 32],
    /// The last read failed (reported once until a read succeeds again).
    unreadable: bool,
}

impl ConfigWatch {
    /// Watches `path`, whose content the running set was built from is `text`.
    pub fn new(path: &Path, text: &str) -> Self {
        Self {
            path: path.to_owned(),
            digest: Sha256::digest(text.as_bytes()).into(),
            unreadable: false,
        }
    }

    /// Reads the file again: `true` when its content differs from the last content seen
    /// (which it then becomes). A file that cannot be read is not a change: it is reported
    /// on stderr once, and the running set is kept.
    pub fn changed(&mut self) -> bool {
        match std::fs::read(&self.path) {
            Ok(bytes) => {
                self.unreadable = false;
                let digest: [u8; 32] = Sha256::digest(&bytes).into();
                let changed = digest != self.digest;
                self.digest = digest;
                changed
            }
            Err(e) => {
                if !self.unreadable {
                    crate::say!(
                        Warning,
                        "mediator: --watch-config: cannot read {}: {e}; the running authorities are unchanged",
                        self.path.display()
                    );
                }
                self.unreadable = true;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_content_changes_only() {
        let (dir, path) = crate::testing::file_in_temp_dir("m.toml", "a = 1\n");
        let mut w = ConfigWatch::new(&path, "a = 1\n");
        assert!(!w.changed(), "same content");
        std::fs::write(&path, "a = 2\n").unwrap();
        assert!(w.changed(), "new content");
        assert!(!w.changed(), "seen once");
        // A symlink swap, as the kubelet does for a ConfigMap volume.
        let other = dir.path().join("other.toml");
        std::fs::write(&other, "a = 3\n").unwrap();
        let link = dir.path().join("link.tmp");
        std::os::unix::fs::symlink(&other, &link).unwrap();
        std::fs::rename(&link, &path).unwrap();
        assert!(w.changed(), "swapped");
        std::fs::remove_file(&path).unwrap();
        assert!(!w.changed(), "a missing file is not a change");
        std::fs::write(&path, "a = 3\n").unwrap();
        assert!(!w.changed(), "back with the content last seen");
    }
}
