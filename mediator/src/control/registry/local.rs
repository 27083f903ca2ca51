//! The `local` registry: one file per authority under the state directory, each written
//! durably before the admin API answers.
//!
//! ```text
//! <state_dir>/lock                        held (flock) while a mediator uses the directory
//! <state_dir>/boot                        the start counter (generations, decision ids)
//! <state_dir>/authorities/<name>.json     one sealed record per authority
//! <state_dir>/authorities/<name>.json.rejected   a record that could not be read, set aside
//! ```
//!
//! A local registry serves one node, its own (`[registry] node`): a record names its
//! placement in its table (`node`), and one placed on another node (a state directory
//! copied from another machine, a node renamed) is kept as it is but not served; the admin
//! API refuses to create one.
//!
//! A write goes to a temporary file that is fsynced, then linked to its name (a create:
//! the link fails if the name exists) or renamed over it (the counter), then the directory
//! is fsynced. A crash at any byte leaves the old state or the new one: a temporary file
//! left behind was never acknowledged and is removed at the next load.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{ErrorKind as IoKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use policy::config::RegistryBackend;

use super::{
    ErrorKind, Loaded, Record, RegistryError, RegistryMetrics, Rejected, Store, Stored, decode,
    encode,
};

/// Suffix of a stored record.
const RECORD: &str = ".json";
/// Suffix of a record set aside.
const REJECTED: &str = ".rejected";
/// Suffix of a write in progress.
const TMP: &str = ".tmp";

/// The local backend. Holds the directory's lock for its life.
#[derive(Debug)]
pub(crate) struct Local {
    dir: PathBuf,
    node: String,
    _lock: File,
}

impl Local {
    /// Opens (creating, mode 0700) the state directory `dir` of the replica of `node` and
    /// takes its lock.
    ///
    /// # Errors
    /// [`RegistryError::Io`] when it cannot be made or read, [`RegistryError::Locked`] when
    /// another mediator holds it.
    pub(crate) fn open(
        dir: &Path,
        node: String,
        metrics: RegistryMetrics,
    ) -> Result<Self, RegistryError> {
        let _ = metrics;
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("authorities"))
            .map_err(|e| RegistryError::io(dir, e))?;
        check_mode(dir)?;
        let path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| RegistryError::io(&path, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(RegistryError::Locked {
                    path: dir.to_owned(),
                });
            }
            Err(fs::TryLockError::Error(e)) => return Err(RegistryError::io(&path, e)),
        }
        Ok(Self {
            dir: dir.to_owned(),
            node,
            _lock: lock,
        })
    }

    fn records(&self) -> PathBuf {
        self.dir.join("authorities")
    }
}

/// Refuses a state directory that group or others may write: they could plant records.
///
/// # Errors
/// [`RegistryError::Io`] naming the mode.
pub(crate) fn check_mode(dir: &Path) -> Result<(), RegistryError> {
    let mode = fs::metadata(dir)
        .map_err(|e| RegistryError::io(dir, e))?
        .permissions()
        .mode();
    if mode & 0o022 != 0 {
        return Err(RegistryError::io(
            dir,
            std::io::Error::other(format!(
                "the state directory is writable by group or others (mode {:o}): chmod go-w it",
                mode & 0o777
            )),
        ));
    }
    Ok(())
}

/// Runs blocking file work off the runtime's threads.
async fn blocking<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> Result<T, RegistryError> + Send + 'static,
) -> Result<T, RegistryError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(RegistryError::io(
            path,
            std::io::Error::other(e.to_string()),
        )),
    }
}

impl Store for Local {
    fn backend(&self) -> RegistryBackend {
        RegistryBackend::Local
    }

    fn node(&self) -> &str {
        &self.node
    }

    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    fn boot(&self) -> BoxFuture<'_, Result<u64, RegistryError>> {
        let dir = self.dir.clone();
        async move { blocking(&self.dir, move || next_boot(&dir)).await }.boxed()
    }

    fn load(&self) -> BoxFuture<'_, Result<Loaded, RegistryError>> {
        let dir = self.records();
        async move { blocking(&self.dir, move || read(&dir, true)).await }.boxed()
    }

    fn create<'a>(
        &'a self,
        record: &'a Record,
        generation: u64,
        _ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<u64, RegistryError>> {
        let dir = self.records();
        let name = record.name.clone();
        let bytes = encode(record, generation);
        async move {
            let bytes = bytes?;
            blocking(&self.dir, move || {
                let file = format!("{name}{RECORD}");
                match write_durably(&dir, &file, &bytes, false) {
                    Err(e) if e.kind() == IoKind::AlreadyExists => Err(RegistryError::Exists(name)),
                    Err(e) => Err(RegistryError::io(&dir.join(file), e)),
                    Ok(()) => Ok(generation),
                }
            })
            .await
        }
        .boxed()
    }

    fn delete<'a>(
        &'a self,
        name: &'a str,
        generation: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<u64>, RegistryError>> {
        let dir = self.records();
        let name = name.to_owned();
        async move {
            blocking(&self.dir, move || {
                let path = dir.join(format!("{name}{RECORD}"));
                if let Some(want) = generation {
                    match fs::read(&path) {
                        Ok(bytes) => match decode(&bytes, &name) {
                            Ok((_, g)) if g == want => {}
                            // Another generation (or a damaged file): not the one asked.
                            _ => return Ok(None),
                        },
                        Err(e) if e.kind() == IoKind::NotFound => return Ok(None),
                        Err(e) => return Err(RegistryError::io(&path, e)),
                    }
                }
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == IoKind::NotFound => return Ok(None),
                    Err(e) => return Err(RegistryError::io(&path, e)),
                }
                sync_dir(&dir).map_err(|e| RegistryError::io(&dir, e))?;
                Ok(Some(0))
            })
            .await
        }
        .boxed()
    }

    fn set_aside<'a>(&'a self, name: &'a str) -> BoxFuture<'a, String> {
        let dir = self.records();
        let name = name.to_owned();
        async move {
            match blocking(&self.dir, move || {
                Ok(set_aside(&dir, &format!("{name}{RECORD}")))
            })
            .await
            {
                Ok(s) | Err(RegistryError::Exists(s)) => s,
                Err(e) => e.to_string(),
            }
        }
        .boxed()
    }
}

/// Reads the start counter, stores the next one durably, returns the one read (0 for a
/// new directory).
fn next_boot(dir: &Path) -> Result<u64, RegistryError> {
    let path = dir.join("boot");
    let current = match fs::read_to_string(&path) {
        Ok(s) => s.trim().parse::<u64>().map_err(|_| {
            RegistryError::io(
                &path,
                std::io::Error::other(format!(
                    "the start counter holds {:?}, not a number: restore it from a backup (any number larger than every earlier one will do)",
                    s.trim()
                )),
            )
        })?,
        Err(e) if e.kind() == IoKind::NotFound => 0,
        Err(e) => return Err(RegistryError::io(&path, e)),
    };
    let next = current
        .checked_add(1)
        .filter(|n| *n < 1 << 24)
        .ok_or_else(|| {
            RegistryError::io(
                &path,
                std::io::Error::other("the start counter is exhausted (2^24 starts)"),
            )
        })?;
    write_durably(dir, "boot", format!("{next}\n").as_bytes(), true)
        .map_err(|e| RegistryError::io(&path, e))?;
    Ok(current)
}

/// Reads every record of `dir`. `repair` (a start): temporary files (never acknowledged)
/// are removed and damaged records renamed `*.rejected`; without it (`mediator registry
/// list`, `check`) nothing is changed. Damaged records are listed either way.
pub(crate) fn read(dir: &Path, repair: bool) -> Result<Loaded, RegistryError> {
    let mut loaded = Loaded::default();
    let entries = fs::read_dir(dir).map_err(|e| RegistryError::io(dir, e))?;
    let mut removed_tmp = false;
    for entry in entries {
        let entry = entry.map_err(|e| RegistryError::io(dir, e))?;
        let file = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if file.starts_with('.') && file.ends_with(TMP) {
            if !repair {
                continue;
            }
            if let Err(e) = fs::remove_file(&path) {
                tracing::warn!("registry: cannot remove {}: {e}", path.display());
            }
            removed_tmp = true;
            continue;
        }
        let Some(name) = file.strip_suffix(RECORD) else {
            continue;
        };
        let regular = entry.file_type().is_ok_and(|t| t.is_file());
        let read = if policy::check_authority_name(name).is_err() {
            Err("its file name is not an authority name".to_owned())
        } else if !regular {
            // Never followed: a link could make the mediator read any file.
            Err("not a regular file (a symbolic link or another kind)".to_owned())
        } else {
            fs::read(&path)
                .map_err(|e| format!("cannot read it: {e}"))
                .and_then(|bytes| decode(&bytes, name))
        };
        match read {
            Ok((record, generation)) => loaded.records.push(Stored { record, generation }),
            Err(why) => {
                let what = if repair {
                    set_aside(dir, &file)
                } else {
                    path.display().to_string()
                };
                loaded.rejected.push(Rejected {
                    what,
                    why,
                    kind: ErrorKind::Damaged,
                });
            }
        }
    }
    if removed_tmp {
        sync_dir(dir).map_err(|e| RegistryError::io(dir, e))?;
    }
    loaded
        .records
        .sort_by(|a, b| a.record.name.cmp(&b.record.name));
    Ok(loaded)
}

/// Renames `dir/file` to `dir/file.rejected` (or `.rejected.N` when taken); returns the
/// new path, or the old one with why it could not be renamed.
fn set_aside(dir: &Path, file: &str) -> String {
    let from = dir.join(file);
    for n in 0..1000 {
        let to = if n == 0 {
            dir.join(format!("{file}{REJECTED}"))
        } else {
            dir.join(format!("{file}{REJECTED}.{n}"))
        };
        if to.exists() {
            continue;
        }
        return match fs::rename(&from, &to).and_then(|()| sync_dir(dir)) {
            Ok(()) => to.display().to_string(),
            Err(e) => format!("{} (cannot set it aside: {e})", from.display()),
        };
    }
    format!(
        "{} (cannot set it aside: 1000 rejected copies)",
        from.display()
    )
}

/// Writes `bytes` to `dir/file` durably: a temporary file, fsynced, then linked to its
/// name (`replace = false`: fails with `AlreadyExists` if the name exists) or renamed
/// over it, then the directory fsynced.
fn write_durably(dir: &Path, file: &str, bytes: &[u8], replace: bool) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{file}.{}{TMP}", std::process::id()));
    let target = dir.join(file);
    let written = (|| {
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        if replace {
            fs::rename(&tmp, &target)
        } else {
            fs::hard_link(&tmp, &target)
        }
    })();
    if !replace || written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    sync_dir(dir)
}

/// fsyncs a directory, so that a rename, link or removal in it is durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
#[path = "local_tests.rs"]
mod tests;
