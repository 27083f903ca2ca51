//! Test support for asking the host (design section 20): the admin API's questions and
//! answers, a client of the `/v1/asks` event stream, and an `ask` endpoint on a Unix
//! socket that answers every question one fixed way and keeps what it was asked.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixListener};
use tokio::task::JoinHandle;

use crate::http::HttpResponse;
use crate::mediator::Mediator;
use crate::wait::retry_for;

/// How long a test waits for a question to be raised.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(10);

impl Mediator {
    /// `GET /v1/asks`: the pending questions.
    ///
    /// # Errors
    /// No admin listener, another status, or a body without `asks`.
    pub async fn asks(&self) -> Result<Vec<Value>> {
        let v = self.admin_get("/v1/asks").await?;
        v["asks"]
            .as_array()
            .cloned()
            .ok_or_else(|| anyhow!("GET /v1/asks: no asks list: {v}"))
    }

    /// Waits (up to [`ASK_TIMEOUT`]) for a pending question that satisfies `pred`.
    ///
    /// # Errors
    /// None in time (the error shows the list and the log).
    pub async fn wait_question(&self, pred: impl Fn(&Value) -> bool) -> Result<Value> {
        let mut last = Vec::new();
        let found = retry_for(
            ASK_TIMEOUT,
            async || {
                last = self.asks().await?;
                Ok(last.iter().find(|q| pred(q)).cloned())
            },
            || "no matching question".to_owned(),
        )
        .await;
        found.with_context(|| format!("pending: {last:?}\nlog: {:?}", self.decision_lines()))
    }

    /// `POST /v1/asks/<id>` with `body`.
    ///
    /// # Errors
    /// As [`Mediator::admin`].
    pub async fn answer(&self, id: &str, body: &str) -> Result<HttpResponse> {
        self.admin("POST", &format!("/v1/asks/{id}"), Some(body), None)
            .await
    }
}

/// A client of `GET /v1/asks` with `Accept: text/event-stream`.
#[derive(Debug)]
pub struct AskStream {
    io: BufReader<TcpStream>,
}

impl AskStream {
    /// Opens the stream on `mediator`'s admin API and reads the answer's head.
    ///
    /// # Errors
    /// Connect failure, or an answer that is not a `200` event stream.
    pub async fn open(mediator: &Mediator) -> Result<Self> {
        let addr = mediator.admin_addr()?;
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET /v1/asks HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut io = BufReader::new(s);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(ASK_TIMEOUT, io.read_line(&mut line)).await??;
            ensure!(n > 0, "the event stream closed in its head: {head}");
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        ensure!(
            head.starts_with("HTTP/1.1 200")
                && head.to_ascii_lowercase().contains("text/event-stream"),
            "{head}"
        );
        Ok(Self { io })
    }

    /// The next question (`data:` event), skipping comments and chunk framing, within
    /// `timeout`.
    ///
    /// # Errors
    /// None in time, the stream closed, or an event that is not JSON.
    pub async fn next(&mut self, timeout: Duration) -> Result<Value> {
        tokio::time::timeout(timeout, async {
            loop {
                let mut line = String::new();
                let n = self.io.read_line(&mut line).await?;
                ensure!(n > 0, "the event stream ended");
                if let Some(json) = line.strip_prefix("data: ") {
                    return Ok(serde_json::from_str(json.trim_end())?);
                }
            }
        })
        .await
        .map_err(|_| anyhow!("no question on the event stream within {timeout:?}"))?
    }
}

/// How an [`AskEndpoint`] answers.
#[derive(Debug, Clone)]
pub enum AskMode {
    /// `200` with this body (an answer, or not).
    Answer(Value),
    /// `202`: pending, the answer comes through the admin API.
    Pending,
}

/// An `ask` endpoint on a Unix socket.
#[derive(Debug)]
pub struct AskEndpoint {
    path: PathBuf,
    questions: Arc<Mutex<Vec<Value>>>,
    task: JoinHandle<()>,
}

impl AskEndpoint {
    /// Binds `<dir>/<name>.sock` and answers every question per `mode`.
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub fn start(dir: &Path, name: &str, mode: AskMode) -> Result<Self> {
        let path = dir.join(format!("{name}.sock"));
        let listener = UnixListener::bind(&path)
            .with_context(|| format!("binding ask endpoint {}", path.display()))?;
        let questions = Arc::new(Mutex::new(Vec::new()));
        let q = Arc::clone(&questions);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (q, mode) = (Arc::clone(&q), mode.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (q, mode) = (Arc::clone(&q), mode.clone());
                        async move {
                            let body = req.into_body().collect().await.map(|b| b.to_bytes());
                            let question = body
                                .ok()
                                .and_then(|b| serde_json::from_slice(&b).ok())
                                .unwrap_or(Value::Null);
                            q.lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(question);
                            let mut resp = Response::new(Full::new(Bytes::new()));
                            match mode {
                                AskMode::Answer(v) => {
                                    *resp.body_mut() = Full::new(Bytes::from(v.to_string()));
                                }
                                AskMode::Pending => *resp.status_mut() = StatusCode::ACCEPTED,
                            }
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Self {
            path,
            questions,
            task,
        })
    }

    /// The `ask` config value: `unix:<path>`.
    pub fn endpoint(&self) -> String {
        format!("unix:{}", self.path.display())
    }

    /// Every question posted so far.
    pub fn questions(&self) -> Vec<Value> {
        self.questions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for AskEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}
