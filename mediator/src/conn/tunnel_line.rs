//! The decision line of an allowed request inside a terminated tunnel (design section 10),
//! its constant part serialised once per tunnel. Every request of a tunnel repeats the
//! tunnel's fields (`conn`, `authority`, `channel`, `peer`, `host`, `port`, `pin`,
//! `route`, the labels, the stamp); a [`Template`] holds them as the bytes `serde_json`
//! makes of them, cut out of one record serialised by the same code as every other line
//! ([`record::tls_record`]), and a request's line is those bytes with its own `ts`, `id`,
//! `rule`, `method` and `path` put in between. The line is byte for byte the one
//! [`record::tls_request`] writes (the tests compare them); anything the template does not
//! cover (credentials added, a log with a tap, a rendering or an export, a reload that
//! moved the tunnel to another grant) takes that full path.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use policy::{Reason, Verdict};

use super::record::{self, Allowed};
use super::{Ctx, RequestLine, TargetLabel};
use crate::decision_log::CredentialUse;
use crate::metrics::DecisionSeries;
use crate::shared::Shared;
use crate::vocab::Protocol;

/// One tunnel's template, made at its first allowed request (`None` inside: the record's
/// serialisation did not have the expected shape, and every line takes the full path).
#[derive(Debug, Default)]
pub(crate) struct TunnelLines(OnceLock<Option<Template>>);

impl TunnelLines {
    /// Logs one allowed request of the tunnel as [`record::tls_request`] does with
    /// `Ok(allow)` (the same line, counted the same way) and returns its decision id.
    pub(crate) fn allowed(
        &self,
        shared: &Shared,
        ctx: &Ctx,
        label: &TargetLabel,
        request: &RequestLine,
        allow: Allowed<'_>,
        credential: Vec<CredentialUse>,
    ) -> u64 {
        if credential.is_empty() && shared.log.native() {
            let template = self
                .0
                .get_or_init(|| Template::of(shared, ctx, label, allow.pin, allow.route));
            if let Some(template) = template.as_ref().filter(|t| t.fits(ctx, label, allow)) {
                let id = shared.next_id();
                shared.metrics.count(&template.series);
                shared.log.write_stamped(|line| {
                    template.write(line, SystemTime::now(), id, allow.rule, request);
                });
                return id;
            }
        }
        record::tls_request(shared, ctx, label, request, Ok(allow), credential)
    }
}

/// The serialised constant part of a tunnel's allow lines, and what it was made for.
#[derive(Debug)]
struct Template {
    /// What the bytes hold: the line is only for a request of this very context.
    conn: u64,
    authority: Option<Arc<policy::config::Authority>>,
    peer: crate::decision_log::Peer,
    capture: bool,
    labels: Option<Arc<crate::labels::Labels>>,
    asked: Option<Arc<crate::decision_log::Asked>>,
    label: TargetLabel,
    pin: SocketAddr,
    route: String,
    /// The `mediator_decisions_total` series its lines count on.
    series: DecisionSeries,
    /// `{"event":"decision","ts":`
    head: Box<[u8]>,
    /// From `,"conn":` to `"rule":`.
    before_rule: Box<[u8]>,
    /// From `,"detail":` to `"method":`.
    before_method: Box<[u8]>,
    /// After the path: the optional fields (`capture`, `invocation`, `tags`, `asked`),
    /// the log's stamp (`instance`, `run`, on TCP `peer_ip` and `peer_port`) and the
    /// closing `}`.
    tail: Box<[u8]>,
}

/// The template record's `ts`, `method` and `path` (`id` is 0, `rule` none), as they
/// appear serialised: markers found again in the serialisation.
const TS: &str = "T";
const METHOD: &str = "M";
const PATH: &str = "P";

impl Template {
    /// Serialises the allow record of a request `M P` of `ctx` with `serde_json`, stamps
    /// it as `shared`'s log does, and cuts it around the fields that change per request;
    /// `None` if it is not cut as expected.
    fn of(
        shared: &Shared,
        ctx: &Ctx,
        label: &TargetLabel,
        pin: SocketAddr,
        route: &str,
    ) -> Option<Self> {
        let request = RequestLine {
            method: METHOD.to_owned(),
            path: PATH.to_owned(),
        };
        let allow = Allowed {
            rule: None,
            pin,
            route,
        };
        let mut rec = record::tls_record(ctx, 0, label, &request, Ok(allow), Vec::new());
        rec.ts = TS.to_owned();
        let mut line = serde_json::to_vec(&rec).ok()?;
        shared.log.stamp(&mut line, &rec.peer);
        let line = String::from_utf8(line).ok()?;
        // A `,"` never occurs inside a JSON string (its `"` is escaped), and every field
        // before `method` is one of the record's own: each marker below is found where the
        // record put it.
        let ts = r#"{"event":"decision","ts":"T","id":0,"conn":"#;
        let rest = line.strip_prefix(ts)?;
        let rule = rest.find(r#","rule":null,"detail":"#)?;
        let method = rest.find(r#","method":"M","path":"P""#)?;
        let head = &ts[..ts.find(r#""T""#)?];
        let before_rule = format!(r#","conn":{}"rule":"#, &rest[..rule + 1]);
        let before_method = format!(
            "{}\"method\":",
            &rest[rule + r#","rule":null"#.len()..=method]
        );
        let tail = &rest[method + r#","method":"M","path":"P""#.len()..];
        Some(Self {
            series: shared.metrics.decision_series(
                ctx.authority_name(),
                Protocol::Tls,
                Verdict::Allow,
                Reason::Allowed,
            ),
            conn: ctx.conn,
            authority: ctx.authority.clone(),
            peer: ctx.peer,
            capture: ctx.capture,
            labels: ctx.labels.clone(),
            asked: ctx.asked.clone(),
            label: label.clone(),
            pin,
            route: route.to_owned(),
            head: head.as_bytes().into(),
            before_rule: before_rule.into_bytes().into(),
            before_method: before_method.into_bytes().into(),
            tail: tail.as_bytes().into(),
        })
    }

    /// Whether this template is that of `ctx`'s requests allowed as `allow`: the same
    /// context (the tunnel's, under the same grant), target, pin and route.
    fn fits(&self, ctx: &Ctx, label: &TargetLabel, allow: Allowed<'_>) -> bool {
        fn same<T>(a: Option<&Arc<T>>, b: Option<&Arc<T>>) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            }
        }
        self.conn == ctx.conn
            && self.peer == ctx.peer
            && self.capture == ctx.capture
            && same(self.authority.as_ref(), ctx.authority.as_ref())
            && same(self.labels.as_ref(), ctx.labels.as_ref())
            && same(self.asked.as_ref(), ctx.asked.as_ref())
            && self.label == *label
            && self.pin == allow.pin
            && self.route == allow.route
    }

    /// Serialises the stamped line of the request `request` allowed by `rule`, decided
    /// at `ts` under the id `id`, into `line`.
    fn write(
        &self,
        line: &mut Vec<u8>,
        ts: SystemTime,
        id: u64,
        rule: Option<&str>,
        request: &RequestLine,
    ) {
        line.extend_from_slice(&self.head);
        // Writing to a Vec cannot fail; a timestamp and digits need no escaping.
        let _ = write!(
            line,
            "\"{}\",\"id\":{id}",
            humantime::format_rfc3339_millis(ts)
        );
        line.extend_from_slice(&self.before_rule);
        string(line, rule);
        line.extend_from_slice(&self.before_method);
        string(line, Some(&request.method));
        line.extend_from_slice(b",\"path\":");
        string(line, Some(&request.path));
        line.extend_from_slice(&self.tail);
    }
}

/// `s` as `serde_json` serialises an `Option<String>`.
fn string(line: &mut Vec<u8>, s: Option<&str>) {
    match s {
        // Serialising a string into a Vec cannot fail.
        Some(s) => {
            let _ = serde_json::to_writer(&mut *line, s);
        }
        None => line.extend_from_slice(b"null"),
    }
}

#[cfg(test)]
#[path = "tunnel_line_tests.rs"]
mod tests;
