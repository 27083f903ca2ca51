//! The admin API (design section 10), served with hyper on `[listen] admin` (a loopback
//! TCP address) and/or `[listen] admin_socket` (a Unix socket of its own, mode 0600, never
//! a channel socket).
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /metrics` | Prometheus text exposition |
//! | `GET /healthz` | 200 while the process serves |
//! | `GET /readyz` | 200 when accepting; 503 while shutting down, at `max_connections`, or with a stale `registry` |
//! | `GET /v1/authorities` | every live authority: name, generation, origin, channel, grant digest, `expires_at`, live connections |
//! | `POST /v1/authorities` | create one from the flat JSON of an `[[authority]]` table (+ `"generate_token": true`, `"ttl_s": N`), stored durably in the registry first; 201 (`"persisted"`, `"backend"`, `"served_here"`: false for one placed on another node, which is live there only), 400 naming each bad field, 409 duplicate, 503 registry unavailable |
//! | `DELETE /v1/authorities/<name>` | revoke (once the registry's removal is durable); 200, 404, 503 |
//! | `GET /v1/authorities/<name>/denials?since=<id or RFC 3339>` | its recent denials (bounded ring) |
//! | `GET /v1/asks`, `GET`/`POST /v1/asks/<id>` | the requests held for the host's answer, and their answers (`asks.rs`, design section 20) |
//!
//! `/healthz`, `/readyz` and `/metrics` are always open. With `[listen]
//! admin_token_sha256`, every other path needs `Authorization: Bearer <token>` (compared
//! by SHA-256 in constant time; else 401). Without a token, reads are open and writes
//! (`POST`, `DELETE`) are served on the admin Unix socket (mode 0600) only: on the TCP
//! listener, which any local process can reach, they get 403 unless
//! `admin_allow_anonymous_writes = true` (warned at start).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::audit::AuditRecord;
use crate::authorities::{Live, Origin};
use crate::conn::accept::{Listener, accept_loop};
use crate::control::{Control, Created};
use crate::decision_log::Peer;
use crate::limits::ADMIN_CONNECTIONS;

/// What a `POST /v1/authorities` answer says of the authority's lifetime with
/// `[registry] backend = "memory"`.
const PER_PROCESS: &str = "[registry] backend = \"memory\": this authority lives in this \
     mediator process only: it and its token are gone when the mediator restarts, and other \
     replicas do not have it; use backend = \"local\" (the default) or \"etcd\" to keep it";

/// Largest request body accepted, in bytes.
const MAX_BODY: usize = 64 * 1024;

/// Time allowed to read a request head.
const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// An admin answer's body: whole, or the event stream of `/v1/asks`.
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

mod asks;
mod audit;
mod since;
mod write;

use since::parse_since;
use write::{create, delete};

/// The admin API's state.
#[derive(Debug)]
pub(crate) struct Admin {
    control: Arc<Control>,
    token_sha256: Option<[u8; 32]>,
    anonymous_writes: bool,
}

impl Admin {
    /// An admin API over `control`, requiring a bearer token whose SHA-256 is
    /// `token_sha256` when given (see [`access`] for what needs it; `anonymous_writes`
    /// opens writes on the TCP listener when there is no token).
    pub(crate) fn new(
        control: Arc<Control>,
        token_sha256: Option<[u8; 32]>,
        anonymous_writes: bool,
    ) -> Self {
        Self {
            control,
            token_sha256,
            anonymous_writes,
        }
    }
}

/// Serves the admin API on `listener` (its TCP listener or its own Unix socket) until
/// `stop` is cancelled.
/// At most [`ADMIN_CONNECTIONS`] admin connections are served at once; more wait in the
/// listen backlog (they never take a client connection's descriptors).
pub(crate) async fn serve<L: Listener>(
    listener: L,
    door: AdminDoor,
    admin: Arc<Admin>,
    stop: CancellationToken,
) {
    let connections = stop.clone();
    let permits = Arc::new(Semaphore::new(ADMIN_CONNECTIONS));
    let room = || {
        let permits = Arc::clone(&permits);
        async move { permits.acquire_owned().await.ok() }
    };
    accept_loop(listener, stop, "the admin API", room, |io, peer, permit| {
        let admin = Arc::clone(&admin);
        let stop = connections.clone();
        tokio::spawn(async move {
            let _permit = permit;
            serve_conn(io, admin, door, peer, stop).await;
        });
    })
    .await;
}

async fn serve_conn<S>(
    io: S,
    admin: Arc<Admin>,
    door: AdminDoor,
    peer: Peer,
    stop: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let admin = Arc::clone(&admin);
        async move { Ok::<_, Infallible>(handle(req, &admin, door, peer).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!("admin connection ended: {e}");
            }
        }
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Serves one request; a create or delete (done or refused) is audited before it is
/// answered (`crate::audit`).
async fn handle(
    req: Request<Incoming>,
    admin: &Admin,
    door: AdminDoor,
    peer: Peer,
) -> Response<Body> {
    let mut audit = audit::pending(&req, &peer);
    let resp = route(req, admin, door, audit.as_mut()).await;
    if let Some(record) = audit {
        audit::finish(&admin.control, record, resp.status()).await;
    }
    resp
}

#[expect(
    clippy::too_many_lines,
    reason = "the admin API routes, one match arm per endpoint; ceiling 120 lines"
)]
async fn route(
    req: Request<Incoming>,
    admin: &Admin,
    door: AdminDoor,
    mut audit: Option<&mut AuditRecord>,
) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match access(admin, &req, door) {
        Access::Granted => {}
        Access::NeedsToken => {
            audit::why(&mut audit, "no valid admin token (Authorization: Bearer)");
            let mut resp = error(
                StatusCode::UNAUTHORIZED,
                "this admin API needs Authorization: Bearer <token>",
            );
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"mediator-admin\""),
            );
            return resp;
        }
        Access::WritesClosed => {
            audit::why(
                &mut audit,
                "writes on the TCP admin listener need a token (none is configured)",
            );
            return error(
                StatusCode::FORBIDDEN,
                "creating and revoking authorities on the TCP admin listener needs a token: \
                 set [listen] admin_token_sha256 (and send Authorization: Bearer <token>), \
                 use the admin Unix socket (admin_socket), or opt out with \
                 admin_allow_anonymous_writes = true",
            );
        }
    }
    let shared = admin.control.shared();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["metrics"]) => {
            let open = shared.authorities.open_by_name();
            shared
                .metrics
                .set_open(open.iter().map(|(name, n)| (name.as_str(), *n)));
            shared.metrics.set_idle_upstream(shared.reuse.total());
            let mut resp = Response::new(whole(Bytes::from(shared.metrics.render())));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
            );
            resp
        }
        (&Method::GET, ["healthz"]) => text(StatusCode::OK, "ok\n"),
        (&Method::GET, ["readyz"]) => {
            if shared.signals.is_draining() {
                text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
            } else if shared.authorities.registry_stale() {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "registry: its view cannot be confirmed current; authorities from the registry are refused (registry_unavailable)\n",
                )
            } else if shared.limiter.is_pressured() {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "at max_connections: not accepting new connections\n",
                )
            } else {
                text(StatusCode::OK, "ready\n")
            }
        }
        (&Method::GET, ["v1", "authorities"]) => {
            let list: Vec<Value> = shared
                .authorities
                .list()
                .iter()
                .map(|l| describe(admin, l))
                .collect();
            let global = policy::review::deny_views(&admin.control.global_deny());
            json_response(
                StatusCode::OK,
                &json!({ "authorities": list, "global_deny": global }),
            )
        }
        (&Method::POST, ["v1", "authorities"]) => create(req, admin, audit).await,
        (&Method::DELETE, ["v1", "authorities", name]) => delete(admin, name, audit).await,
        (&Method::GET, ["v1", "authorities", name]) => match shared.authorities.get(name) {
            Some(live) => json_response(StatusCode::OK, &describe(admin, &live)),
            None => not_found(name),
        },
        (_, ["v1", "asks"]) => asks::route(req, admin, None, audit).await,
        (_, ["v1", "asks", id]) => asks::route(req, admin, Some(id), audit).await,
        (&Method::GET, ["v1", "authorities", name, "denials"]) => {
            let Some(live) = shared.authorities.get(name) else {
                return not_found(name);
            };
            let since = match parse_since(req.uri().query()) {
                Ok(s) => s,
                Err(why) => return error(StatusCode::BAD_REQUEST, &why.to_string()),
            };
            let (denials, dropped) = live.denials(&since);
            json_response(
                StatusCode::OK,
                &json!({
                    "authority": live.name(),
                    "generation": live.generation,
                    "denials": denials,
                    "dropped": dropped,
                    "ring_size": crate::authorities::DENIAL_RING,
                }),
            )
        }
        (_, ["metrics" | "healthz" | "readyz"])
        | (_, ["v1", "authorities"])
        | (_, ["v1", "authorities", _])
        | (_, ["v1", "authorities", _, "denials"]) => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here")
        }
        _ => error(StatusCode::NOT_FOUND, "no such admin endpoint"),
    }
}

/// Which admin listener a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AdminDoor {
    /// The TCP admin listener (loopback: any local process can reach it).
    Tcp,
    /// The admin Unix socket (mode 0600: its owner only).
    Unix,
}

/// Whether a request may be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Granted,
    /// `401`: a token is configured and this request lacks it.
    NeedsToken,
    /// `403`: a write on the TCP listener with no token configured (and no opt-out).
    WritesClosed,
}

/// The admin API's access rule (design section 10): `/healthz`, `/readyz` and `/metrics`
/// are always open; with a token configured, everything else needs it; without one,
/// reads are open and writes (`POST`, `DELETE`) are open on the Unix socket only, unless
/// `admin_allow_anonymous_writes` opens them on TCP too.
fn access(admin: &Admin, req: &Request<Incoming>, door: AdminDoor) -> Access {
    if matches!(req.uri().path(), "/healthz" | "/readyz" | "/metrics") {
        return Access::Granted;
    }
    if admin.token_sha256.is_some() {
        return if authorized(admin, req) {
            Access::Granted
        } else {
            Access::NeedsToken
        };
    }
    let write = !matches!(*req.method(), Method::GET | Method::HEAD);
    if write && door == AdminDoor::Tcp && !admin.anonymous_writes {
        Access::WritesClosed
    } else {
        Access::Granted
    }
}

fn authorized(admin: &Admin, req: &Request<Incoming>) -> bool {
    let Some(stored) = admin.token_sha256 else {
        return true;
    };
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    let Some(token) = value
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case(b"bearer "))
        .and_then(|_| value.get(7..))
    else {
        return false;
    };
    let digest: [u8; 32] = Sha256::digest(token.trim_ascii()).into();
    bool::from(digest.ct_eq(&stored))
}

fn describe(admin: &Admin, live: &Live) -> Value {
    let a = &live.authority;
    json!({
        "name": live.name(),
        "node": a.node.as_str(),
        "generation": live.generation,
        "origin": live.origin,
        "created": live.created,
        "expires_at": live.expires_at,
        "channel": {
            "socket": live.socket,
            "tcp": a.token_sha256.and(admin.control.tcp_addr()).map(|s| s.to_string()),
        },
        "grant_digest": live.digest,
        // What it may reach, as `mediator diff --admin` reads it (design section 21).
        "reach": policy::review::Reach::of(a, policy::review::Sources::Hidden),
        "grant": {
            "allow": a.grant.allow_entries().collect::<Vec<_>>(),
            "deny": a.grant.deny_entries().collect::<Vec<_>>(),
            "allow_private": a.grant.allow_private().iter().map(ToString::to_string).collect::<Vec<_>>(),
            "sni_check": a.grant.sni_check(),
            "watchdog": a.watchdog.as_ref().map_or_else(String::new, ToString::to_string),
        },
        // Which header goes to which host; never the secret, its source or placeholder.
        "credentials": a.credentials.iter().map(|c| json!({
            "host": c.host(),
            "header": c.header(),
        })).collect::<Vec<_>>(),
        "live_connections": admin.control.shared().metrics.active_of(live.name()),
        "limits": {
            "max_connections": live.counts.cap(),
            "connect_rate": live.counts.rate().0,
            "connect_burst": live.counts.rate().1,
            "open_connections": live.counts.open(),
        },
    })
}

/// What a create answers for an authority placed on another node: stored, served by that
/// node's replica only (its socket is there; this replica refuses its token).
fn placed_elsewhere(created: &Created) -> Value {
    let record = &created.stored.record;
    json!({
        "name": record.name,
        "node": created.node.as_str(),
        "generation": created.stored.generation,
        "origin": Origin::Api,
        "created": record.created_at,
        "expires_at": record.expires_at,
        "channel": { "socket": null, "tcp": null },
    })
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    let mut body = v.to_string();
    body.push('\n');
    let mut resp = Response::new(whole(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn text(status: StatusCode, s: &'static str) -> Response<Body> {
    let mut resp = Response::new(whole(Bytes::from_static(s.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A whole body.
fn whole(bytes: Bytes) -> Body {
    BodyExt::boxed_unsync(Full::new(bytes))
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    json_response(
        status,
        &json!({ "error": status.canonical_reason(), "message": message }),
    )
}

fn not_found(name: &str) -> Response<Body> {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({ "error": "unknown_authority", "message": format!("no live authority named {name:?}") }),
    )
}
