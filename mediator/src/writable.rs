//! Whether this process may create files in a directory: what `mediator check` asks of
//! the decision log's directory and the socket directories, so that a config that passes
//! check starts. A leaf: it imports nothing from the crate.

use std::io;
use std::path::Path;

/// `dir` is a directory this user may write and search (`access(2)` with `W_OK | X_OK`,
/// so root passes, as a start would).
///
/// # Errors
/// `dir` is missing (its own error), not a directory (`NotADirectory`), or not writable
/// (`PermissionDenied`), each message naming `dir`.
pub(crate) fn may_create_in(dir: &Path) -> io::Result<()> {
    let meta = std::fs::metadata(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{} is not a directory", dir.display()),
        ));
    }
    nix::unistd::access(
        dir,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    )
    .map_err(|e| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not writable by this user: {e}", dir.display()),
        )
    })
}

/// The nearest of `dir` and its ancestors that exists (what `create_dir_all` would build
/// on), or `dir` itself when none does.
pub(crate) fn nearest_existing(dir: &Path) -> &Path {
    let mut at = dir;
    while std::fs::symlink_metadata(at).is_err() {
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p,
            _ => return dir,
        }
    }
    at
}
