//! Test support for the control plane: requests to the mediator's admin API (on its
//! loopback TCP listener), a Prometheus text parser, SIGHUP reloads that wait for the
//! mediator's reload line, and a watchdog server on a Unix socket.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

use crate::http::{HttpConn, HttpResponse};
use crate::mediator::Mediator;
use crate::wait::wait_for;

/// How long [`Mediator::reload_with`] waits for the mediator's reload line.
pub const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);

impl Mediator {
    /// The admin API's bound address from the `ready` line.
    ///
    /// # Errors
    /// When the mediator reported no admin listener.
    pub fn admin_addr(&self) -> Result<std::net::SocketAddr> {
        self.ready()
            .admin
            .ok_or_else(|| anyhow!("the mediator's ready line names no admin listener"))
    }

    /// Sends one request to the admin API (`Connection: close`), with a JSON `body` and a
    /// bearer `token` when given.
    ///
    /// # Errors
    /// No admin listener, I/O failure or an unparseable response.
    pub async fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        token: Option<&str>,
    ) -> Result<HttpResponse> {
        let addr = self.admin_addr()?;
        let mut conn = HttpConn::tcp(addr).await?;
        let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        if let Some(t) = token {
            raw.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        match body {
            Some(b) => raw.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            )),
            None => raw.push_str("\r\n"),
        }
        conn.request(raw.as_bytes()).await
    }

    /// `GET <path>` on the admin API (no token), checked to be `200`, with the body parsed
    /// as JSON.
    ///
    /// # Errors
    /// As [`Self::admin`], another status, or a body that is not JSON.
    pub async fn admin_get(&self, path: &str) -> Result<Value> {
        let resp = self.admin("GET", path, None, None).await?;
        anyhow::ensure!(
            resp.status == 200,
            "GET {path}: {} {}",
            resp.status,
            resp.text()
        );
        resp.json()
    }

    /// `DELETE /v1/authorities/<name>` (no token): revokes an authority. Returns the
    /// response, whatever its status.
    ///
    /// # Errors
    /// As [`Self::admin`].
    pub async fn revoke(&self, name: &str) -> Result<HttpResponse> {
        self.admin("DELETE", &format!("/v1/authorities/{name}"), None, None)
            .await
    }

    /// Polls `/metrics` (up to 20 s) until `authority`'s `mediator_bytes_total` is above 0
    /// in both directions while it still has an open connection: an open connection's
    /// bytes are reported every 5 s, not only at its close (design section 19).
    ///
    /// # Errors
    /// A failed scrape, or no bytes counted in time.
    pub async fn bytes_counted_while_open(&self, authority: &str) -> Result<PromText> {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let p = self.metrics().await?;
            let bytes = |d: &str| {
                p.get(
                    "mediator_bytes_total",
                    &[("authority", authority), ("direction", d)],
                )
            };
            if bytes("up") > 0.0 && bytes("down") > 0.0 {
                anyhow::ensure!(
                    p.get("mediator_active_connections", &[("authority", authority)]) >= 1.0,
                    "the bytes were counted, but no connection is open any more"
                );
                return Ok(p);
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "no bytes counted while the connection is open: {:?}",
                p.family("mediator_bytes_total")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `GET /metrics`, parsed.
    ///
    /// # Errors
    /// As [`Self::admin`], or a status other than 200.
    pub async fn metrics(&self) -> Result<PromText> {
        let resp = self.admin("GET", "/metrics", None, None).await?;
        anyhow::ensure!(
            resp.status == 200,
            "/metrics: {} {}",
            resp.status,
            resp.text()
        );
        Ok(PromText::parse(&resp.text()))
    }

    /// Waits until a stderr line satisfies `pred` and returns it.
    ///
    /// # Errors
    /// No such line within `timeout` (the error shows stderr).
    pub async fn wait_for_stderr(
        &self,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<String> {
        wait_for(
            timeout,
            || {
                Ok(self
                    .stderr_text()
                    .lines()
                    .find(|l| pred(l))
                    .map(str::to_owned))
            },
            || format!("no matching stderr line; stderr:\n{}", self.stderr_text()),
        )
        .await
    }

    /// Writes `config` over the mediator's config file, sends SIGHUP and waits for the
    /// mediator's next `mediator: reload ...` line, which it returns with the lines that
    /// follow it (up to 20). A line ending in `:` (a failed reload) announces its reasons
    /// on the following lines, so then at least one of those is waited for too: the
    /// reader gets stderr line by line, and the reasons may come a moment later.
    ///
    /// # Errors
    /// Signal failure, or no new reload line (with its first reason, for a failure)
    /// within [`RELOAD_TIMEOUT`].
    pub async fn reload_with(&self, config: &str) -> Result<String> {
        let is_reload = |l: &str| l.starts_with("mediator: reload");
        let before = self.stderr_text().lines().filter(|l| is_reload(l)).count();
        std::fs::write(self.config_path(), config).context("rewriting mediator.toml")?;
        self.signal(Signal::SIGHUP)?;
        wait_for(
            RELOAD_TIMEOUT,
            || {
                let text = self.stderr_text();
                let lines: Vec<&str> = text.lines().collect();
                let Some(at) = (0..lines.len())
                    .filter(|i| is_reload(lines[*i]))
                    .nth(before)
                else {
                    return Ok(None);
                };
                let rest = &lines[at..lines.len().min(at + 20)];
                if lines[at].ends_with(':') && rest.len() < 2 {
                    return Ok(None);
                }
                Ok(Some(rest.join("\n")))
            },
            || format!("no new reload line; stderr:\n{}", self.stderr_text()),
        )
        .await
    }
}

/// A parsed Prometheus text exposition: series (`name{labels}` exactly as printed) to
/// value.
#[derive(Debug, Clone, Default)]
pub struct PromText {
    /// Every sample line.
    pub series: BTreeMap<String, f64>,
    /// Every `# TYPE` line: family -> type.
    pub types: BTreeMap<String, String>,
}

impl PromText {
    /// Parses the text format (version 0.0.4).
    pub fn parse(text: &str) -> Self {
        let mut out = Self::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((name, ty)) = rest.split_once(' ') {
                    out.types.insert(name.to_owned(), ty.to_owned());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            if let Some((series, value)) = line.rsplit_once(' ')
                && let Ok(v) = value.parse::<f64>()
            {
                out.series.insert(series.to_owned(), v);
            }
        }
        out
    }

    /// The value of the series `name` with exactly these labels (in any order), or 0 when
    /// absent.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series
            .iter()
            .find(|(k, _)| series_matches(k, name, labels))
            .map_or(0.0, |(_, v)| *v)
    }

    /// Every series as printed (`name{labels}`).
    pub fn raw_series(&self) -> Vec<String> {
        self.series.keys().cloned().collect()
    }

    /// Number of series whose name starts with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        self.series.keys().filter(|k| k.starts_with(prefix)).count()
    }

    /// Every series of family `name` (any labels): (labels as printed, value).
    pub fn family(&self, name: &str) -> Vec<(String, f64)> {
        self.series
            .iter()
            .filter(|(k, _)| k.as_str() == name || k.starts_with(&format!("{name}{{")))
            .map(|(k, v)| (k[name.len()..].to_owned(), *v))
            .collect()
    }
}

fn series_matches(series: &str, name: &str, labels: &[(&str, &str)]) -> bool {
    let (n, rest) = match series.split_once('{') {
        Some((n, rest)) => (n, rest.trim_end_matches('}')),
        None => (series, ""),
    };
    if n != name {
        return false;
    }
    let mut have: Vec<String> = if rest.is_empty() {
        Vec::new()
    } else {
        rest.split("\",")
            .map(|p| p.trim_end_matches('"').to_owned())
            .collect()
    };
    let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}")).collect();
    have.sort();
    want.sort();
    have == want
}

/// How a [`Watchdog`] answers.
#[derive(Debug, Clone)]
pub enum WatchdogMode {
    /// `{"decision":"allow"}` to everything.
    AllowAll,
    /// `{"decision":"deny","reason":...}` to everything.
    DenyAll(String),
    /// Allow, but only after this delay.
    SlowAllow(Duration),
    /// Allow, once the test opens the gate (`Notify::notify_one`): holds a decision at
    /// the watchdog step for exactly as long as the test needs.
    Gate(Arc<tokio::sync::Notify>),
}

/// A watchdog on a Unix socket: answers every question per its [`WatchdogMode`] and keeps
/// every question it was asked.
#[derive(Debug)]
pub struct Watchdog {
    path: PathBuf,
    questions: Arc<Mutex<Vec<Value>>>,
    task: JoinHandle<()>,
}

impl Watchdog {
    /// Binds `<dir>/<name>.sock` and serves.
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub fn start(dir: &Path, name: &str, mode: WatchdogMode) -> Result<Self> {
        let path = dir.join(format!("{name}.sock"));
        let listener = UnixListener::bind(&path)
            .with_context(|| format!("binding watchdog {}", path.display()))?;
        let questions = Arc::new(Mutex::new(Vec::new()));
        let q = Arc::clone(&questions);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let q = Arc::clone(&q);
                let mode = mode.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let q = Arc::clone(&q);
                        let mode = mode.clone();
                        async move {
                            let body = req.into_body().collect().await.map(|b| b.to_bytes());
                            let question: Value = body
                                .ok()
                                .and_then(|b| serde_json::from_slice(&b).ok())
                                .unwrap_or(Value::Null);
                            q.lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(question);
                            let answer = match &mode {
                                WatchdogMode::AllowAll => {
                                    serde_json::json!({"decision": "allow", "reason": "ok"})
                                }
                                WatchdogMode::DenyAll(r) => {
                                    serde_json::json!({"decision": "deny", "reason": r})
                                }
                                WatchdogMode::SlowAllow(d) => {
                                    tokio::time::sleep(*d).await;
                                    serde_json::json!({"decision": "allow", "reason": "slow"})
                                }
                                WatchdogMode::Gate(gate) => {
                                    gate.notified().await;
                                    serde_json::json!({"decision": "allow", "reason": "opened"})
                                }
                            };
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(
                                answer.to_string(),
                            ))))
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

    /// The `watchdog` config value: `unix:<path>`.
    pub fn endpoint(&self) -> String {
        format!("unix:{}", self.path.display())
    }

    /// Every question asked so far.
    pub fn questions(&self) -> Vec<Value> {
        self.questions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}
