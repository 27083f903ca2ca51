//! Decision records as OTLP/HTTP log records (design section 19; OTLP 1.x, protobuf
//! over HTTP, `POST /v1/logs`): each record the writer hands over is queued (bounded; a
//! full queue drops it and counts it, never delaying the decision), and a task sends them
//! in batches of at most [`BATCH`] or every [`LINGER`]. A batch that cannot be delivered
//! is dropped and counted (`mediator_export_dropped_total`): the decision log stays the
//! record of truth.
//!
//! Each log record: `time_unix_nano` the decision's time, `severity_number` INFO (allow)
//! or WARN (deny), `body` the native JSON line, attributes `event`, `decision`, `reason`,
//! `authority`, `host`, `port`, `id`, `run`, and when the record has them `invocation`,
//! `tag.<KEY>` per tag and `asked.id`, `asked.from` (design section 20); the resource names the service
//! (`service.name` `egress-mediator`, `service.instance.id` the instance).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, header};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use tokio::sync::mpsc;

use crate::decision_log::{Line, Record, Ship};

/// Most records waiting to be sent; more are dropped (and counted).
const QUEUE: usize = 16_384;
/// Most records in one request.
const BATCH: usize = 512;
/// Longest a record waits for its batch to fill.
const LINGER: Duration = Duration::from_secs(1);
/// Longest one delivery may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The sending half: cheap to call from any thread.
#[derive(Debug)]
pub(crate) struct Exporter {
    tx: mpsc::Sender<LogRecord>,
    dropped: prometheus::IntCounter,
}

impl Exporter {
    /// Starts the sender on the current tokio runtime; `metrics` gets its two counters.
    ///
    /// # Errors
    /// [`prometheus::Error`] when the counters cannot be registered.
    pub(crate) fn start(
        endpoint: &policy::config::OtlpEndpoint,
        instance: &str,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Self, prometheus::Error> {
        let dropped = metrics.registered(prometheus::IntCounter::new(
            "mediator_export_dropped_total",
            "Decision records not exported to the OTLP endpoint: the queue was full, or the endpoint did not take them.",
        )?)?;
        let sent = metrics.registered(prometheus::IntCounter::new(
            "mediator_export_sent_total",
            "Decision records the OTLP endpoint accepted.",
        )?)?;
        let queued = metrics.registered(prometheus::IntGauge::new(
            "mediator_export_queued",
            "Decision records waiting in the OTLP export queue (at most 16384; a full queue drops), as of the last batch taken.",
        )?)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let resource = Resource {
            attributes: vec![
                attr("service.name", "egress-mediator"),
                attr("service.version", env!("CARGO_PKG_VERSION")),
                attr("service.instance.id", instance),
            ],
            ..Resource::default()
        };
        tokio::spawn(send_loop(
            rx,
            endpoint.clone(),
            resource,
            Counters {
                dropped: dropped.clone(),
                sent,
                queued,
            },
        ));
        Ok(Self { tx, dropped })
    }
}

impl Ship for Exporter {
    /// Queues `line` (whose native line is `native`); a full queue drops it, counted.
    fn offer(&self, line: Line<'_>, native: &[u8], run: &str) {
        let log = match line {
            Line::Decision(record) => decision(record, native, run),
            Line::Audit(record) => audit(record, native, run),
        };
        if self.tx.try_send(log).is_err() {
            self.dropped.inc();
        }
    }
}

/// An audit record (design section 21) as a log record: event `egress.audit`, severity
/// WARN when refused or widening, attributes `event`, `action`, `result`, `authority`,
/// `id`, `run`.
fn audit(record: &crate::audit::record::AuditRecord, line: &[u8], run: &str) -> LogRecord {
    let attributes = first_attributes(
        [
            attr("event", "audit"),
            attr("action", record.action.as_str()),
            attr("result", record.result.as_str()),
        ],
        &record.id.to_string(),
        run,
        record.authority.as_deref(),
    );
    let time = nanos(&record.ts);
    log_record(time, record.notable(), line, attributes, "egress.audit")
}

/// A decision record as a log record.
fn decision(record: &Record, line: &[u8], run: &str) -> LogRecord {
    let deny = record.decision == policy::Verdict::Deny;
    let time = nanos(&record.ts);
    let mut attributes = first_attributes(
        [
            attr("event", record.event.as_str()),
            attr("decision", record.decision.as_str()),
            attr("reason", record.reason.as_str()),
        ],
        &record.id.to_string(),
        run,
        record.authority.as_deref(),
    );
    if let Some(h) = &record.host {
        attributes.push(attr("host", h));
    }
    if let Some(p) = record.port {
        attributes.push(attr("port", &p.to_string()));
    }
    if let Some(i) = &record.invocation {
        attributes.push(attr("invocation", i));
    }
    for (k, v) in &record.tags {
        attributes.push(attr(&format!("tag.{k}"), v));
    }
    if let Some(asked) = &record.asked {
        attributes.push(attr("asked.id", &asked.id));
        attributes.push(attr("asked.from", &asked.from));
    }
    log_record(time, deny, line, attributes, "egress.decision")
}

/// An RFC 3339 timestamp in nanoseconds since the epoch (`u64::MAX` past 2554).
fn nanos(ts: &str) -> u64 {
    u64::try_from(super::since_epoch(ts).as_nanos()).unwrap_or(u64::MAX)
}

/// The attributes every exported record starts with: its `own` three (`event` first),
/// then `id`, `run`, and `authority` when it names one.
fn first_attributes(
    own: [KeyValue; 3],
    id: &str,
    run: &str,
    authority: Option<&str>,
) -> Vec<KeyValue> {
    let mut attributes = Vec::from(own);
    attributes.extend([attr("id", id), attr("run", run)]);
    attributes.extend(authority.map(|a| attr("authority", a)));
    attributes
}

/// One log record: at `time` (nanoseconds since the epoch), WARN or INFO, the native line
/// as its body.
fn log_record(
    time: u64,
    warn: bool,
    line: &[u8],
    attributes: Vec<KeyValue>,
    event_name: &str,
) -> LogRecord {
    LogRecord {
        time_unix_nano: time,
        observed_time_unix_nano: time,
        severity_number: if warn {
            SeverityNumber::Warn as i32
        } else {
            SeverityNumber::Info as i32
        },
        severity_text: if warn { "WARN" } else { "INFO" }.to_owned(),
        body: Some(AnyValue {
            value: Some(any_value::Value::StringValue(
                String::from_utf8_lossy(line).into_owned(),
            )),
        }),
        attributes,
        event_name: event_name.to_owned(),
        ..LogRecord::default()
    }
}

fn attr(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..KeyValue::default()
    }
}

/// The export's own metrics, kept by the send loop.
struct Counters {
    dropped: prometheus::IntCounter,
    sent: prometheus::IntCounter,
    queued: prometheus::IntGauge,
}

/// Takes batches off the queue and sends them until the queue closes.
async fn send_loop(
    mut rx: mpsc::Receiver<LogRecord>,
    endpoint: policy::config::OtlpEndpoint,
    resource: Resource,
    counters: Counters,
) {
    let Counters {
        dropped,
        sent,
        queued,
    } = counters;
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let Some(first) = rx.recv().await else {
            return;
        };
        batch.push(first);
        let deadline = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(r)) => batch.push(r),
                Ok(None) | Err(_) => break,
            }
        }
        queued.set(i64::try_from(rx.len()).unwrap_or(i64::MAX));
        let n = batch.len() as u64;
        let request = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(resource.clone()),
                scope_logs: vec![ScopeLogs {
                    scope: Some(InstrumentationScope {
                        name: "egress-mediator/decisions".to_owned(),
                        version: env!("CARGO_PKG_VERSION").to_owned(),
                        ..InstrumentationScope::default()
                    }),
                    log_records: std::mem::take(&mut batch),
                    ..ScopeLogs::default()
                }],
                ..ResourceLogs::default()
            }],
        };
        let body = request.encode_to_vec();
        match tokio::time::timeout(TIMEOUT, post(&endpoint, body)).await {
            Ok(Ok(())) => sent.inc_by(n),
            Ok(Err(e)) => {
                dropped.inc_by(n);
                tracing::debug!("OTLP export to {}: {e}", endpoint.authority);
            }
            Err(_) => {
                dropped.inc_by(n);
                tracing::debug!("OTLP export to {}: no answer in time", endpoint.authority);
            }
        }
    }
}

/// One `POST` of a protobuf body; `Ok` on a 2xx.
async fn post(endpoint: &policy::config::OtlpEndpoint, body: Vec<u8>) -> Result<(), String> {
    let stream = tokio::net::TcpStream::connect(&endpoint.authority)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let req = Request::builder()
        .method(Method::POST)
        .uri(&endpoint.path)
        .header(header::HOST, &endpoint.authority)
        .header(header::CONTENT_TYPE, "application/x-protobuf")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    conn.abort();
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(format!("HTTP status {}", resp.status()))
    }
}
