//! Rebinding, never editing (design section 18): `--control PATH` makes a Unix socket
//! outside the sandbox (mode 0600, the caller's; masked inside) on which the host sends
//! one JSON line per command, `{"rebind": "<authority socket path or name>"}` (socket
//! mode) or `{"rebind": {"allow": [...], "deny": [...], "allow_private": [...]}}`
//! (embedded mode: a new in-process authority with that grant). New connections of the
//! command then go to that channel; open ones finish on the one they were opened on. A
//! grant is never changed: widening or narrowing mid-run is moving the command to
//! another immutable grant. Each rebind is answered with one JSON line and listed in the
//! report (`rebinds: [{ts, from, to}]`).
//!
//! [`Binding`] is the one place new connections read their channel from: the relay, the
//! embedded listener, capture's dial and capture's stub resolver (its grant, in embedded
//! mode).
//!
//! In embedded mode the socket also carries the run's questions (design section 20,
//! `crate::asking`): `{"ask": {...}}` lines to every connection, and the host's
//! `{"answer": "<id>", "allow_via": ...}` or `{"answer": "<id>", "deny": "..."}` back
//! (`{"allow_via": {"allow": [...]}}` makes a new in-process authority with that grant).
//! Up to [`MAX_CLIENTS`] connections are served at once, each on a thread of its own.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::Serialize;

use crate::error::{Error, Result};

/// Longest command line read from the control socket.
const MAX_LINE: u64 = 64 * 1024;

/// How long a control client may stay silent before it is disconnected, when the socket
/// carries no questions (a host waiting for questions is silent by design).
const IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// Control connections served at once (one more is told so and closed).
pub(crate) const MAX_CLIENTS: usize = 8;

/// Most rebinds a run keeps for its report (later ones are still made, and counted).
const MAX_REBINDS: usize = 1_000;

/// Where new connections of the command go.
#[derive(Debug, Clone)]
pub(crate) enum Bound {
    /// A running mediator's per-authority Unix socket.
    Socket(PathBuf),
    /// An authority of the embedded mediator, and its grant (for the stub resolver).
    Embedded {
        /// The authority's name in the embedded mediator.
        authority: Arc<str>,
        /// Its grant, for the names capture's stub resolver answers.
        grant: Arc<policy::Grant>,
    },
}

impl Bound {
    /// The channel as the report names it: the socket's path, or `embedded:<authority>`.
    pub(crate) fn name(&self) -> String {
        match self {
            Self::Socket(p) => p.display().to_string(),
            Self::Embedded { authority, .. } => format!("embedded:{authority}"),
        }
    }
}

/// One rebind, as the report lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Rebind {
    /// When (RFC 3339, UTC).
    pub(crate) ts: String,
    /// The channel new connections took before.
    pub(crate) from: String,
    /// The channel they take since.
    pub(crate) to: String,
}

/// The channel new connections take, swapped by a rebind, and the labels every one of
/// them carries (the run's invocation and tags, design section 20).
#[derive(Debug)]
pub(crate) struct Binding {
    first: Bound,
    current: RwLock<Bound>,
    rebinds: Mutex<(Vec<Rebind>, u64)>,
    labels: mediator::labels::Labels,
    /// `labels` as the PROXY protocol v2 header written before a connection's first byte
    /// on an authority's socket.
    header: Vec<u8>,
}

impl Binding {
    /// Bound to `first`, every connection labelled `labels`.
    pub(crate) fn new(first: Bound, labels: mediator::labels::Labels) -> Self {
        // Labels built by `Labels::new` always fit a header (their bounds are far below
        // its size); an empty header would only leave them off.
        let header = labels.proxy_v2_header().unwrap_or_default();
        Self {
            current: RwLock::new(first.clone()),
            first,
            rebinds: Mutex::new((Vec::new(), 0)),
            labels,
            header,
        }
    }

    /// The run's labels.
    pub(crate) fn labels(&self) -> &mediator::labels::Labels {
        &self.labels
    }

    /// The labels' header, to write before anything else on an authority's socket.
    pub(crate) fn header(&self) -> &[u8] {
        &self.header
    }

    /// The channel the run started on.
    pub(crate) fn first(&self) -> &Bound {
        &self.first
    }

    /// Where a new connection goes now.
    pub(crate) fn current(&self) -> Bound {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Embedded mode: the grant names are answered from now (`None` in socket mode).
    pub(crate) fn grant(&self) -> Option<Arc<policy::Grant>> {
        match &*self.current.read().unwrap_or_else(PoisonError::into_inner) {
            Bound::Socket(_) => None,
            Bound::Embedded { grant, .. } => Some(Arc::clone(grant)),
        }
    }

    /// Moves new connections to `to`; returns the rebind as the report lists it.
    pub(crate) fn rebind(&self, to: Bound) -> Rebind {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let r = Rebind {
            ts: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            from: current.name(),
            to: to.name(),
        };
        *current = to;
        drop(current);
        let mut list = self.rebinds.lock().unwrap_or_else(PoisonError::into_inner);
        if list.0.len() < MAX_REBINDS {
            list.0.push(r.clone());
        } else {
            list.1 += 1;
        }
        r
    }

    /// The run's rebinds, in order, and how many were made beyond those kept.
    pub(crate) fn rebinds(&self) -> (Vec<Rebind>, u64) {
        self.rebinds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Turns the value of a `rebind` command into the channel it names (checked), or says
/// why it cannot.
pub(crate) type Rebinder = Box<dyn FnMut(&serde_json::Value) -> Result<Bound> + Send>;

/// Applies the host's answer to a question (embedded mode): the question's id, the
/// answer, who gave it; returns what the host is told.
pub(crate) type Answerer = Box<
    dyn FnMut(
            &str,
            mediator::ask::reply::Reply,
            mediator::audit::Actor,
        ) -> Result<serde_json::Value>
        + Send,
>;

/// Asking through the control socket (embedded mode with `--control`).
pub(crate) struct AskingHost {
    /// Where questions go.
    pub(crate) asking: Arc<crate::asking::Asking>,
    /// How answers are applied.
    pub(crate) answerer: Answerer,
    /// The questions pending now (for a connection that arrives late).
    pub(crate) pending: PendingFn,
}

/// What every control connection shares.
struct Served {
    binding: Arc<Binding>,
    rebinder: Mutex<Rebinder>,
    host: Option<(Arc<crate::asking::Asking>, Mutex<Answerer>, PendingFn)>,
    clients: std::sync::atomic::AtomicUsize,
}

/// The questions pending now.
pub(crate) type PendingFn = Box<dyn Fn() -> Vec<Arc<mediator::ask::Question>> + Send + Sync>;

/// The control socket, bound before the sandbox is built (so that it can be masked in
/// it), served once the channel runs; its file is removed when it is dropped.
#[derive(Debug)]
pub(crate) struct ControlSocket {
    path: PathBuf,
    listener: Option<UnixListener>,
}

impl ControlSocket {
    /// Binds `path` (absolute) with mode 0600. Nothing may exist there but a stale socket
    /// (one nobody listens on: a shim killed with SIGKILL left it), which is replaced.
    ///
    /// # Errors
    /// [`Error::Usage`] for a relative path, or one where a file or a live socket is;
    /// [`Error::Io`] when it cannot be bound.
    pub(crate) fn bind(path: &Path) -> Result<Self> {
        if !path.is_absolute() {
            return Err(Error::Usage(format!(
                "--control {}: give an absolute path (it is masked inside the sandbox by that name)",
                path.display()
            )));
        }
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            // A socket nobody listens on is what a shim killed with SIGKILL leaves: taken
            // over. Anything else (a live socket, a file) is not ours to replace.
            let stale = meta.file_type().is_socket()
                && matches!(
                    UnixStream::connect(path),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
                );
            if !stale {
                return Err(Error::Usage(format!(
                    "--control {}: something exists there already (a live socket or a file); the shim makes the socket itself and removes it at exit",
                    path.display()
                )));
            }
            std::fs::remove_file(path).map_err(|e| {
                Error::io(format!("remove the stale --control {}", path.display()), e)
            })?;
        }
        let listener = UnixListener::bind(path)
            .map_err(|e| Error::io(format!("bind --control {}", path.display()), e))?;
        let me = Self {
            path: path.to_owned(),
            listener: Some(listener),
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod 0600 --control {}", path.display()), e))?;
        Ok(me)
    }

    /// The socket's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Serves commands until the shim exits: each connection on a thread of its own, at
    /// most [`MAX_CLIENTS`] at once; with `host` (embedded mode), questions go out on
    /// every connection and answers come back.
    ///
    /// # Errors
    /// [`Error::Io`] when the thread cannot start.
    pub(crate) fn serve(
        &mut self,
        binding: Arc<Binding>,
        rebinder: Rebinder,
        host: Option<AskingHost>,
    ) -> Result<()> {
        let Some(listener) = self.listener.take() else {
            return Ok(());
        };
        let served = Arc::new(Served {
            binding,
            rebinder: Mutex::new(rebinder),
            host: host.map(|h| (h.asking, Mutex::new(h.answerer), h.pending)),
            clients: std::sync::atomic::AtomicUsize::new(0),
        });
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                use std::sync::atomic::Ordering;
                for conn in listener.incoming() {
                    let Ok(mut conn) = conn else { continue };
                    if served.clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
                        served.clients.fetch_sub(1, Ordering::AcqRel);
                        let busy = error(&format!(
                            "{MAX_CLIENTS} control connections are open already"
                        ));
                        let _ = conn.write_all(format!("{busy}\n").as_bytes());
                        continue;
                    }
                    let served = Arc::clone(&served);
                    let spawned = std::thread::Builder::new()
                        .name("control-conn".into())
                        .spawn(move || {
                            serve_one(conn, &served);
                            served.clients.fetch_sub(1, Ordering::AcqRel);
                        });
                    if spawned.is_err() {
                        eprintln!("shim: a control connection cannot get a thread");
                    }
                }
            })
            .map(drop)
            .map_err(|e| Error::io("start the control thread", e))
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.file_type().is_socket()) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Answers each line of one client with one JSON line; with asking on, it also gets the
/// run's questions.
fn serve_one(conn: UnixStream, served: &Served) {
    if served.host.is_none() {
        // Without questions to wait for, an idle client is disconnected after this long.
        let _ = conn.set_read_timeout(Some(IDLE));
    }
    let actor = actor_of(&conn);
    let Ok(out) = conn.try_clone() else {
        return;
    };
    let out = Arc::new(Mutex::new(out));
    if let Some((asking, _, pending)) = &served.host {
        asking.subscribe(&out, &pending());
    }
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = Vec::new();
        match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let too_long = !line.ends_with(b"\n") && line.len() as u64 >= MAX_LINE;
        let answer = if too_long {
            error(&format!("a command line is at most {MAX_LINE} bytes"))
        } else {
            command(&line, served, &actor).unwrap_or_else(|e| error(&e.to_string()))
        };
        // One write per answer: a client reading once gets the whole line.
        let sent = out
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write_all(format!("{answer}\n").as_bytes());
        if sent.is_err() || too_long {
            break;
        }
    }
    if let Some((asking, _, _)) = &served.host {
        asking.unsubscribe(&out);
    }
}

/// Who is on the other end of a control connection (`SO_PEERCRED`), for the audit
/// record of its answers.
fn actor_of(conn: &UnixStream) -> mediator::audit::Actor {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    match getsockopt(conn, PeerCredentials) {
        Ok(c) => mediator::audit::Actor::ShimControl {
            uid: c.uid(),
            gid: c.gid(),
            pid: (c.pid() > 0).then_some(c.pid()),
        },
        Err(_) => mediator::audit::Actor::ShimControl {
            uid: u32::MAX,
            gid: u32::MAX,
            pid: None,
        },
    }
}

fn error(why: &str) -> serde_json::Value {
    serde_json::json!({"ok": false, "error": why})
}

/// One command line: `{"rebind": VALUE}`, or (embedded mode with asking) `{"answer":
/// "<id>", ...}`; what the client is told.
fn command(
    line: &[u8],
    served: &Served,
    actor: &mediator::audit::Actor,
) -> Result<serde_json::Value> {
    let is_answer = mediator::parse_strict_json(line)
        .ok()
        .is_some_and(|v| v.get("answer").is_some());
    if !is_answer {
        let mut rebinder = served
            .rebinder
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let r = rebind(line, &served.binding, &mut rebinder)?;
        eprintln!(
            "shim: rebound: new connections go to {} (was {})",
            r.to, r.from
        );
        return Ok(serde_json::json!({"ok": true, "rebind": r}));
    }
    let Some((_, answerer, _)) = &served.host else {
        return Err(Error::Usage(
            "socket mode: questions belong to the authority's own ask setting; answer them through the mediator's admin API (POST /v1/asks/<id>)".into(),
        ));
    };
    let (id, reply) =
        mediator::ask::reply::parse_line(line).map_err(|e| Error::Usage(format!("answer: {e}")))?;
    let mut answerer = answerer.lock().unwrap_or_else(PoisonError::into_inner);
    answerer(&id, reply, actor.clone())
}

/// `{"rebind": VALUE}` and nothing else.
fn rebind(line: &[u8], binding: &Binding, rebinder: &mut Rebinder) -> Result<Rebind> {
    // Strict: a key given twice is refused, never "the last one wins" (a host reading its
    // own command must see the grant that applies).
    let v = mediator::parse_strict_json(line).map_err(|e| {
        Error::Usage(match e {
            mediator::StrictJsonError::NotJson(e) => format!("not a JSON line: {e}"),
            mediator::StrictJsonError::DuplicateKey { field, key } => format!(
                "key {key:?} is given twice (in {field:?}); give each key once (nothing changed)"
            ),
        })
    })?;
    let Some(obj) = v.as_object().filter(|o| o.len() == 1) else {
        return Err(Error::Usage(
            "a command is one JSON object with one key: {\"rebind\": ...}".into(),
        ));
    };
    let Some(target) = obj.get("rebind") else {
        return Err(Error::Usage(format!(
            "unknown command {:?}; the one command is \"rebind\"",
            obj.keys().next().map_or("", String::as_str)
        )));
    };
    let to = rebinder(target)?;
    Ok(binding.rebind(to))
}

/// Socket mode's rebinder: `"NAME"` is `<directory of the first socket>/NAME.sock`, an
/// absolute path names a socket itself; either must be a live socket. With
/// `direct_reach` (`--allow-unix-sockets`, where the command can connect to any socket
/// it can see), a socket outside that directory, which is masked inside, is refused: the
/// command could reach it directly, and keep it after a later rebind narrows it again.
pub(crate) fn socket_rebinder(first: &Path, direct_reach: bool) -> Rebinder {
    let dir = first.parent().map(Path::to_owned).unwrap_or_default();
    let masked = std::fs::canonicalize(&dir).ok();
    Box::new(move |v| {
        let Some(s) = v.as_str() else {
            return Err(Error::Usage(
                "socket mode: rebind to an authority's name or its socket's absolute path (a string)".into(),
            ));
        };
        let path = if s.starts_with('/') {
            PathBuf::from(s)
        } else {
            policy::check_authority_name(s)
                .map_err(|e| Error::Usage(format!("rebind {s:?}: {e}")))?;
            dir.join(format!("{s}.sock"))
        };
        let beneath_mask = || {
            let parent = path.parent().and_then(|p| std::fs::canonicalize(p).ok());
            parent.is_some() && parent == masked
        };
        match std::fs::metadata(&path) {
            Ok(m) if m.file_type().is_socket() && direct_reach && !beneath_mask() => {
                Err(Error::Usage(format!(
                    "rebind: {} is outside {}, the socket directory masked inside the sandbox: \
                     with --allow-unix-sockets the command could connect to it directly, and \
                     keep it after a later rebind; put the authority's socket there",
                    path.display(),
                    dir.display()
                )))
            }
            Ok(m) if m.file_type().is_socket() => Ok(Bound::Socket(path)),
            Ok(_) => Err(Error::Usage(format!(
                "rebind: {} is not a Unix socket",
                path.display()
            ))),
            Err(e) => Err(Error::Usage(format!(
                "rebind: {}: {e} (is the authority live in the mediator?)",
                path.display()
            ))),
        }
    })
}

/// Checks that `socket` is a live authority socket's file (it exists and is a Unix
/// socket): the first channel, and every rebind target.
///
/// # Errors
/// [`Error::Channel`] saying what is wrong with it.
pub(crate) fn check_socket(socket: &Path) -> Result<()> {
    let meta = std::fs::metadata(socket).map_err(|e| Error::Channel {
        path: socket.to_owned(),
        detail: if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "{e}: the mediator makes this socket while it runs; is it running with this \
                 socket_dir (`mediator --config FILE`), and is the authority in its config?"
            )
        } else {
            e.to_string()
        },
    })?;
    if !meta.file_type().is_socket() {
        return Err(Error::Channel {
            path: socket.to_owned(),
            detail: "not a Unix socket".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
