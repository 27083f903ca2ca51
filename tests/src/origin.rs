//! A loopback HTTP/1.1 origin server (hyper) that echoes what it received, so a test can
//! see exactly what the mediator forwarded: method, request-target and every header.
//!
//! Every response is `200` with a JSON body
//! `{"method":..,"target":..,"headers":{name:[values..]},"body":..}` (header names as
//! hyper reports them: lowercase) and carries a forged `X-Mediator-Decision: allow;
//! forged-by-origin` header that the mediator must strip. The server counts the TCP
//! connections it accepted, so a test can show that a denied request never reached it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The forged decision header value the origin sends; it must never reach a client.
pub const FORGED_DECISION: &str = "allow; forged-by-origin";

/// An echoing HTTP/1.1 origin on `127.0.0.1:0`. Dropping it stops accepting.
#[derive(Debug)]
pub struct Origin {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Origin {
    /// Binds `127.0.0.1:0` and starts serving on the current tokio runtime.
    ///
    /// # Errors
    /// When the listener cannot be bound.
    pub async fn start() -> Result<Self> {
        Self::start_on("127.0.0.1:0".parse()?).await
    }

    /// Binds `addr` (which must be loopback, e.g. `[::1]:0`) and starts serving.
    ///
    /// # Errors
    /// When `addr` is not loopback or cannot be bound.
    pub async fn start_on(addr: SocketAddr) -> Result<Self> {
        anyhow::ensure!(
            addr.ip().is_loopback(),
            "the origin only binds loopback, not {addr}"
        );
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the test origin on {addr}"))?;
        let addr = listener.local_addr()?;
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(accept_loop(
            listener,
            Arc::clone(&connections),
            Arc::clone(&requests),
        ));
        Ok(Self {
            addr,
            connections,
            requests,
            task,
        })
    }

    /// The origin's address (`127.0.0.1:<port>` unless started with [`Self::start_on`]).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The origin's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// How many TCP connections the origin has accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// How many HTTP requests the origin has answered so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
) {
    loop {
        let Ok((stream, _peer)) = listener.accept().await else {
            continue;
        };
        connections.fetch_add(1, Ordering::SeqCst);
        let requests = Arc::clone(&requests);
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let requests = Arc::clone(&requests);
                async move {
                    requests.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(echo(req).await)
                }
            });
            // A client hanging up mid-request is not the origin's problem.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn echo(req: Request<Incoming>) -> Response<Full<Bytes>> {
    echo_response(req, false).await
}

/// The echo both origins answer with: `200`, a JSON body
/// `{"method","target",["version",]"headers","body"[,"trailers"]}` (`version` with
/// `with_version`, as hyper prints it; `trailers` when the request had trailer fields),
/// and the forged [`FORGED_DECISION`] header.
pub(crate) async fn echo_response(
    req: Request<Incoming>,
    with_version: bool,
) -> Response<Full<Bytes>> {
    echo_reply(&echo_json(req, with_version).await)
}

/// The JSON of [`echo_response`]: what the origin received.
pub(crate) async fn echo_json(req: Request<Incoming>, with_version: bool) -> serde_json::Value {
    let method = req.method().to_string();
    let target = req.uri().to_string();
    let version = format!("{:?}", req.version());
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in req.headers() {
        headers
            .entry(name.as_str().to_owned())
            .or_default()
            .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
    }
    let mut trailers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let body = match req.into_body().collect().await {
        Ok(collected) => {
            for (name, value) in collected.trailers().into_iter().flatten() {
                trailers
                    .entry(name.as_str().to_owned())
                    .or_default()
                    .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
            }
            String::from_utf8_lossy(&collected.to_bytes()).into_owned()
        }
        Err(_) => String::new(),
    };
    let mut json = serde_json::json!({
        "method": method,
        "target": target,
        "headers": headers,
        "body": body,
    });
    if !trailers.is_empty() {
        json["trailers"] = serde_json::json!(trailers);
    }
    if with_version {
        json["version"] = serde_json::Value::String(version);
    }
    json
}

/// The response of [`echo_response`] for `json`.
pub(crate) fn echo_reply(json: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(json.to_string())));
    let h = response.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    h.insert(
        "x-mediator-decision",
        hyper::header::HeaderValue::from_static(FORGED_DECISION),
    );
    response
}
