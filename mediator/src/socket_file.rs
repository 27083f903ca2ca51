//! Unix socket files (design section 5: one per authority, `<socket_dir>/<name>.sock`, and
//! the admin API's own), created safely: bound inside a private (0700) staging directory,
//! given their mode and owner there, then renamed into place, so no client can reach a
//! socket before its permissions are final. A stale socket file (nobody listening) is
//! replaced; a live one, or any file that is not a socket, is an error, never deleted.
//!
//! The staging directory is made once per directory sockets go to and kept while the
//! process runs (removed at shutdown; an empty one left by a crash is removed by the next
//! start): a directory made and removed for every socket cost a start with thousands of
//! authorities more than the sockets themselves (on a disk file system, a removed
//! directory's block is freed, even discarded, synchronously).

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use policy::config::Authority;
use tokio::net::UnixListener;

use crate::error::Error;

/// Creates `<dir>/<name>.sock` for one authority with `mode` and optional owner.
///
/// # Errors
/// [`Error::Listen`] when the directory cannot be used, a live socket or a non-socket file
/// is in the way, or bind/chmod/chown/rename fails.
pub(crate) fn bind_authority(
    dir: &Path,
    auth: &Authority,
) -> Result<(UnixListener, PathBuf), Error> {
    let name = auth.grant.name();
    let path = policy::config::authority_socket(dir, name);
    let listener = bind_socket_file(&path, auth.socket_mode, auth.socket_uid, auth.socket_gid)?;
    Ok((listener, path))
}

/// Creates the Unix socket `path` with `mode` and optional owner, safely (see the module
/// documentation); the parent directory is created if needed.
///
/// # Errors
/// As [`bind_authority`].
pub(crate) fn bind_socket_file(
    path: &Path,
    mode: u32,
    uid: Option<u32>,
    gid: Option<u32>,
) -> Result<UnixListener, Error> {
    let what = || format!("unix {}", path.display());
    let dir = path.parent().ok_or_else(|| Error::Listen {
        what: what(),
        source: io::Error::new(
            io::ErrorKind::InvalidInput,
            "a socket path needs a directory",
        ),
    })?;
    let err = |source: io::Error| Error::Listen {
        what: what(),
        source,
    };
    // A directory made here is 0711: others may reach a socket whose mode lets them,
    // but not list which authorities exist (a directory made by the operator keeps its
    // mode).
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(dir)
            .map_err(err)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "another process is listening on this socket",
                )));
            }
            // Stale: replaced atomically by the rename below.
        }
        Ok(_) => {
            return Err(err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way; remove it by hand",
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let mut tmp = staged(dir).map_err(err)?;
    let listener = match UnixListener::bind(&tmp) {
        // The staging directory went away (removed by hand, or by another mediator's
        // start as a crash's leftover): made again, once.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            forget_staging(dir);
            tmp = staged(dir).map_err(err)?;
            UnixListener::bind(&tmp).map_err(err)?
        }
        bound => bound.map_err(err)?,
    };
    let placed = (|| {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::chown(&tmp, uid, gid).map_err(|e| chown_error(uid, gid, &e))?;
        }
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(listener)
}

/// The staging directories of this process: (the directory sockets go to, its staging
/// directory, how many sockets were staged in it).
static STAGING: Mutex<Vec<(PathBuf, tempfile::TempDir, u64)>> = Mutex::new(Vec::new());

/// A fresh path in the staging directory of `dir` (made, mode 0700, at its first use;
/// empty staging directories a crashed process left in `dir` are removed then).
fn staged(dir: &Path) -> io::Result<PathBuf> {
    let mut all = STAGING.lock().unwrap_or_else(PoisonError::into_inner);
    let i = match all.iter().position(|(d, _, _)| d == dir) {
        Some(i) => i,
        None => {
            sweep_staging(dir);
            let staging = tempfile::Builder::new()
                .prefix(".staging-")
                .tempdir_in(dir)?;
            std::fs::set_permissions(staging.path(), std::fs::Permissions::from_mode(0o700))?;
            all.push((dir.to_owned(), staging, 0));
            all.len() - 1
        }
    };
    let (_, staging, n) = &mut all[i];
    *n += 1;
    Ok(staging.path().join(format!("s{n}")))
}

/// Forgets (and removes) the staging directory of `dir`.
fn forget_staging(dir: &Path) {
    STAGING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .retain(|(d, _, _)| d != dir);
}

/// Removes every staging directory of this process (at shutdown).
pub(crate) fn remove_staging() {
    STAGING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clear();
}

/// Removes the empty staging directories in `dir` (a crash's leftovers; `rmdir` leaves a
/// directory that is not empty, and one another process is using is empty only between
/// two of its sockets, which then makes it again).
fn sweep_staging(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".staging-")
            && entry.file_type().is_ok_and(|t| t.is_dir())
        {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

/// The error of a failed `chown(2)` of a new socket, naming the owner asked for and, when
/// the kernel refused (`EPERM`), who may set it.
fn chown_error(uid: Option<u32>, gid: Option<u32>, e: &io::Error) -> io::Error {
    let owner = match (uid, gid) {
        (Some(u), Some(g)) => format!("socket_uid {u} and socket_gid {g}"),
        (Some(u), None) => format!("socket_uid {u}"),
        (None, Some(g)) => format!("socket_gid {g}"),
        (None, None) => "its owner".to_owned(),
    };
    let why = if e.kind() == io::ErrorKind::PermissionDenied {
        "; only root may give a socket to another user, and a mediator that is not root may \
         set socket_gid only to a group it is a member of"
    } else {
        ""
    };
    io::Error::new(
        e.kind(),
        format!("cannot give the socket {owner} (chown): {e}{why}"),
    )
}

/// Whether a start could make `dir` (and sockets in it) as the user running this: the
/// directory, or the nearest ancestor that exists when it does not, must be a directory
/// this user may write and search (`access(2)`, so root passes as a start would).
/// `mediator check` asks it, so that a config that passes check starts.
///
/// # Errors
/// [`Error::Listen`] naming `dir` and what is in the way.
pub(crate) fn check_can_make(dir: &Path) -> Result<(), Error> {
    let err = |source: io::Error| Error::Listen {
        what: format!("unix sockets in {}", dir.display()),
        source,
    };
    // create_dir_all builds on the nearest directory that exists: that one must take it.
    crate::writable::may_create_in(crate::writable::nearest_existing(dir)).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_chown_names_the_owner_and_who_may_set_it() {
        let eperm = io::Error::from_raw_os_error(libc::EPERM);
        let text = chown_error(None, Some(4242), &eperm).to_string();
        assert!(text.contains("socket_gid 4242 (chown)"), "{text}");
        assert!(text.contains("Operation not permitted"), "{text}");
        assert!(text.contains("a group it is a member of"), "{text}");
        let other = io::Error::from_raw_os_error(libc::ENOENT);
        let text = chown_error(Some(1), None, &other).to_string();
        assert!(
            text.contains("socket_uid 1") && !text.contains("member"),
            "{text}"
        );
    }
}
