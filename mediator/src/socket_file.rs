//! Unix socket files (design section 5: one per authority, `<socket_dir>/<name>.sock`, and
//! the admin API's own), created safely: bound inside a fresh private (0700) directory,
//! given their mode and owner there, then renamed into place, so no client can reach a
//! socket before its permissions are final. A stale socket file (nobody listening) is
//! replaced; a live one, or any file that is not a socket, is an error, never deleted.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

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
    let staging = tempfile::Builder::new()
        .prefix(".staging-")
        .tempdir_in(dir)
        .map_err(err)?;
    std::fs::set_permissions(staging.path(), std::fs::Permissions::from_mode(0o700))
        .map_err(err)?;
    let tmp = staging.path().join("s");
    let listener = UnixListener::bind(&tmp).map_err(err)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    if uid.is_some() || gid.is_some() {
        std::os::unix::fs::chown(&tmp, uid, gid).map_err(|e| err(chown_error(uid, gid, &e)))?;
    }
    std::fs::rename(&tmp, path).map_err(err)?;
    Ok(listener)
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
