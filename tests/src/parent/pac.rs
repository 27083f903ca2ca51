//! [`PacServer`]: a PAC script served over HTTP on loopback, replaceable at run time.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Serves a PAC script over HTTP on `127.0.0.1:0` (any path); the script can be replaced
/// or made to fail (`500`) at run time. Counts the fetches.
#[derive(Debug)]
pub struct PacServer {
    addr: SocketAddr,
    script: Arc<Mutex<Option<String>>>,
    fetches: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl PacServer {
    /// Starts serving `script`.
    ///
    /// # Errors
    /// When the listener cannot be bound.
    pub async fn start(script: &str) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Mutex::new(Some(script.to_owned())));
        let fetches = Arc::new(AtomicUsize::new(0));
        let task = {
            let (shared, fetches) = (Arc::clone(&shared), Arc::clone(&fetches));
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (shared, fetches) = (Arc::clone(&shared), Arc::clone(&fetches));
                    tokio::spawn(async move {
                        let svc = service_fn(move |_req: Request<hyper::body::Incoming>| {
                            fetches.fetch_add(1, Ordering::SeqCst);
                            let current = shared
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .clone();
                            async move {
                                let resp = match current {
                                    Some(s) => Response::new(Full::new(Bytes::from(s))),
                                    None => {
                                        let mut r = Response::new(Full::new(Bytes::new()));
                                        *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
                                        r
                                    }
                                };
                                Ok::<_, Infallible>(resp)
                            }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            })
        };
        Ok(Self {
            addr,
            script: shared,
            fetches,
            task,
        })
    }

    /// `http://127.0.0.1:<port>/proxy.pac`.
    pub fn url(&self) -> String {
        format!("http://{}/proxy.pac", self.addr)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Replaces the script (`None`: answer `500`).
    pub fn set(&self, script: Option<&str>) {
        *self.script.lock().unwrap_or_else(PoisonError::into_inner) = script.map(str::to_owned);
    }

    /// Fetches served so far.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

impl Drop for PacServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
