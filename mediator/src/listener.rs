//! Channels (design section 5): one Unix socket per authority, and the optional shared TCP
//! listener where a credential names the authority. Each accepted connection is
//! identified, then handed to the SOCKS5 front-end if its first byte is 0x05, else to
//! the HTTP front-end.
//!
//! Socket files are created safely: bound inside a fresh private (0700) directory,
//! given their mode and owner there, then renamed into place, so no client can reach a
//! socket before its permissions are final. A stale socket file (nobody listening) is
//! replaced; a live one, or any file that is not a socket, is an error, never deleted.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::BytesMut;
use policy::config::Authority;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};

use crate::authorities::Live;
use crate::decision_log::Peer;
use crate::error::Error;
use crate::pipeline::{Ctx, Shared};
use crate::rewind::Rewind;

/// Creates `<dir>/<name>.sock` for one authority with `mode` and optional owner.
///
/// # Errors
/// [`Error::Listen`] when the directory cannot be used, a live socket or a non-socket file
/// is in the way, or bind/chmod/chown/rename fails.
pub fn bind_unix(dir: &Path, auth: &Authority) -> Result<(UnixListener, PathBuf), Error> {
    let name = auth.grant.name();
    let path = dir.join(format!("{name}.sock"));
    let listener = bind_socket_file(&path, auth.socket_mode, auth.socket_uid, auth.socket_gid)?;
    Ok((listener, path))
}

/// Creates the Unix socket `path` with `mode` and optional owner, safely (see the module
/// documentation); the parent directory is created if needed.
///
/// # Errors
/// As [`bind_unix`].
pub fn bind_socket_file(
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
    std::fs::create_dir_all(dir).map_err(err)?;
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
        std::os::unix::fs::chown(&tmp, uid, gid).map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(err)?;
    Ok(listener)
}

/// Accepts on an authority's Unix socket until `draining` turns true or the authority is
/// revoked (its stop signal); the listener is dropped, so closed, when this returns.
pub async fn accept_unix(listener: UnixListener, live: Arc<Live>, shared: Arc<Shared>) {
    let mut draining = shared.draining.clone();
    let mut stop = live.stop_signal();
    let auth = Arc::clone(&live.authority);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = wait_true(&mut draining) => return,
            () = wait_true(&mut stop) => return,
        };
        let (stream, _) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!("accept on {} failed: {e}", auth.grant.name());
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let peer = match stream.peer_cred() {
            Ok(cred) => Peer::Unix {
                pid: cred.pid(),
                uid: cred.uid(),
                gid: cred.gid(),
            },
            Err(e) => {
                tracing::warn!("SO_PEERCRED failed: {e}; closing");
                continue;
            }
        };
        let ctx = Ctx {
            conn: shared.next_id(),
            peer,
            authority: Some(Arc::clone(&auth)),
            request: None,
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _guard = shared.enter();
            dispatch(stream, shared, ctx).await;
        });
    }
}

/// Accepts on the shared TCP listener until `draining` turns true.
pub async fn accept_tcp(listener: TcpListener, shared: Arc<Shared>) {
    let mut draining = shared.draining.clone();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = wait_true(&mut draining) => return,
        };
        let (stream, addr) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!("TCP accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let ctx = Ctx {
            conn: shared.next_id(),
            peer: Peer::Tcp(addr),
            authority: None,
            request: None,
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _guard = shared.enter();
            dispatch(stream, shared, ctx).await;
        });
    }
}

/// Resolves once the watch value is true (or its sender is gone).
pub async fn wait_true(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|d| *d).await.map(|_| ());
}

/// Reads the client's first bytes (under the request-head timeout) and hands the
/// connection to SOCKS5 (first byte 0x05) or HTTP, those bytes put back in front. One read
/// of up to 2 KiB usually holds a whole request head, so HTTP needs no second read.
pub async fn dispatch<S>(mut io: S, shared: Arc<Shared>, ctx: Ctx)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // One request-head deadline for the whole head, however it is split across reads.
    let deadline = tokio::time::Instant::now() + shared.timeouts.request_head;
    let mut first = BytesMut::with_capacity(2048);
    match tokio::time::timeout_at(deadline, io.read_buf(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {}
        _ => return,
    }
    let socks = first[0] == 0x05;
    let io = Rewind::new(first.freeze(), io);
    if socks {
        crate::socks::serve(io, shared, ctx, deadline).await;
    } else {
        crate::http::serve(io, shared, ctx, deadline).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(unreachable_code, clippy::diverging_sub_expression)]
    use super::*;

    /// The size of the future `make` would return, without calling it.
    fn future_size<F, Fut>(_make: F) -> usize
    where
        F: FnOnce() -> Fut,
    {
        size_of::<Fut>()
    }

    /// Every connection's task holds its `dispatch` future for its whole life, and tokio
    /// copies it when the task is created and finished: a buffer or a large sub-future
    /// kept inline (a 4 KiB read buffer, hyper's connection, the resolver) costs every
    /// idle tunnel its size in memory and every connection that many bytes copied. This
    /// was 11.7 KiB (user-space instructions per CONNECT tunnel fell by about 60%
    /// once it was cut); keep large parts boxed or on the heap.
    #[test]
    fn per_connection_futures_stay_small() {
        let unix = future_size(|| {
            dispatch::<tokio::net::UnixStream>(unreachable!(), unreachable!(), unreachable!())
        });
        let tcp = future_size(|| {
            dispatch::<tokio::net::TcpStream>(unreachable!(), unreachable!(), unreachable!())
        });
        let relay = future_size(|| {
            crate::relay::relay::<Rewind<tokio::net::TcpStream>>(
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
            )
        });
        assert!(unix <= 5 * 1024, "dispatch (unix) future is {unix} bytes");
        assert!(tcp <= 5 * 1024, "dispatch (tcp) future is {tcp} bytes");
        assert!(relay <= 2 * 1024, "relay future is {relay} bytes");
    }
}
