//! The close record of an allowed connection (design section 10: bytes up/down, duration,
//! close reason), written by one owner exactly once.
//!
//! [`Opened`] is that owner: `establish` hands one out with every allowed upstream
//! connection, and whoever ends the connection calls [`Opened::finish`]. A path that
//! forgets, returns early, or unwinds from a panic drops it unfinished, and the drop
//! writes the record with `close_reason = "error"`: no allowed connection goes without
//! its close record. The same value moves the authority's `mediator_active_connections`
//! gauge and `mediator_bytes_total` counters.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::record::{self, ms};
use super::standing::Membership;
use super::{Ctx, TargetLabel};
use crate::relay::RelayOutcome;
use crate::route::Route;
use crate::shared::Shared;
use crate::vocab::{ClientTlsEnd, CloseReason, Event, Protocol, TlsAlert};

/// The facts of an allowed connection that its close record repeats.
#[derive(Debug, Clone)]
pub(crate) struct Facts {
    /// The decision id.
    pub(crate) id: u64,
    /// The grant entry that allowed it, as its decision line names it.
    pub(crate) rule: Option<String>,
    /// The address actually connected to (or named to a parent).
    pub(crate) pin: SocketAddr,
    /// When the decision was taken.
    pub(crate) started: Instant,
    /// The route taken.
    pub(crate) route: Route,
    /// Time spent resolving.
    pub(crate) dns: Option<Duration>,
    /// Time spent connecting.
    pub(crate) connect: Option<Duration>,
}

/// An allowed connection whose close record is still to be written.
#[must_use = "an opened connection writes its close record when finished, or `error` when dropped"]
#[derive(Debug)]
pub(crate) struct Opened {
    shared: Arc<Shared>,
    ctx: Ctx,
    protocol: Protocol,
    label: TargetLabel,
    facts: Facts,
    /// Takes the connection's standing (`super::standing`) out of its authority's
    /// members when the connection closes.
    keeper: Option<Membership>,
    /// Bytes already added to `mediator_bytes_total` while the connection was open (up,
    /// down): the close adds only the rest.
    reported: [std::sync::atomic::AtomicU64; 2],
    /// How the client of a terminated tunnel ended its handshake, the alert it sent, and
    /// the record's `detail` saying it.
    ending: Option<(ClientTlsEnd, Option<TlsAlert>, String)>,
    /// Set once the record is written.
    written: bool,
}

impl Opened {
    /// Takes ownership of the close record of an allowed connection of `ctx`'s authority
    /// and counts it open in `mediator_active_connections`. The record describes the
    /// connection, not a request: it carries no request line.
    pub(crate) fn new(
        shared: Arc<Shared>,
        mut ctx: Ctx,
        protocol: Protocol,
        label: TargetLabel,
        facts: Facts,
    ) -> Self {
        if let Some(name) = ctx.authority_name() {
            shared.metrics.opened(name);
        }
        ctx.request = None;
        Self {
            shared,
            ctx,
            protocol,
            label,
            facts,
            keeper: None,
            reported: Default::default(),
            ending: None,
            written: false,
        }
    }

    /// Bytes moved since the last call while the connection is open (the relay's
    /// progress): counted in `mediator_bytes_total` now, not only at the close (design
    /// section 19).
    pub(crate) fn progress(&self, up: u64, down: u64) {
        use std::sync::atomic::Ordering;
        if let Some(name) = self.ctx.authority_name() {
            self.shared.metrics.bytes(name, up, down);
            self.reported[0].fetch_add(up, Ordering::Relaxed);
            self.reported[1].fetch_add(down, Ordering::Relaxed);
        }
    }

    /// The same, holding its standing's membership until it closes.
    pub(crate) fn keeping(mut self, keeper: Membership) -> Self {
        self.keeper = Some(keeper);
        self
    }

    /// The facts its close record will repeat.
    pub(crate) fn facts(&self) -> &Facts {
        &self.facts
    }

    /// The connection's context.
    pub(crate) fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// The protocol of the decision that opened it.
    pub(crate) fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The client of this terminated tunnel ended its handshake (`end`, with `alert`):
    /// the close record says so (`client_tls`, `tls_alert`, and `detail`), and a
    /// certificate it refused is also kept among the authority's recent denials for the
    /// admin API ([`record::client_refused`]).
    pub(crate) fn client_ended(
        &mut self,
        end: ClientTlsEnd,
        alert: Option<TlsAlert>,
        detail: String,
    ) {
        self.ending = Some((end, alert, detail));
    }

    /// Writes the close record with `outcome`.
    pub(crate) fn finish(mut self, outcome: RelayOutcome) {
        self.write(outcome);
    }

    fn write(&mut self, outcome: RelayOutcome) {
        if std::mem::replace(&mut self.written, true) {
            return;
        }
        let Facts {
            id,
            ref rule,
            pin,
            started,
            route,
            dns,
            connect,
        } = self.facts;
        let mut rec = record::base(&self.ctx, id, Event::Close, self.protocol, &self.label);
        (rec.decision, rec.reason) = outcome.close_reason.verdict();
        rec.rule.clone_from(rule);
        rec.dns_ms = dns.map(ms);
        rec.connect_ms = connect.map(ms);
        rec.pin = Some(pin.ip().to_string());
        rec.route = Some(self.shared.route_label(route).to_owned());
        rec.bytes_up = Some(outcome.up);
        rec.bytes_down = Some(outcome.down);
        rec.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        // The closing signal is the same for both cuts: outside the shutdown drain it was
        // the authority's revocation (or its grant's replacement).
        rec.close_reason = Some(match outcome.close_reason {
            CloseReason::Shutdown if !self.shared.signals.is_draining() => CloseReason::Revoked,
            other => other,
        });
        if let Some(name) = self.ctx.authority_name() {
            let [up, down] = &self.reported;
            let (up, down) = (
                up.load(std::sync::atomic::Ordering::Relaxed),
                down.load(std::sync::atomic::Ordering::Relaxed),
            );
            self.shared.metrics.closed(
                name,
                outcome.up.saturating_sub(up),
                outcome.down.saturating_sub(down),
            );
        }
        if let Some((end, alert, detail)) = self.ending.take() {
            (rec.client_tls, rec.tls_alert, rec.detail) = (Some(end), alert, detail);
            if end.rejects_certificate() {
                record::client_refused(&self.shared, &self.ctx, &rec);
            }
        }
        self.shared.log.write(&rec);
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        // Unfinished: a path that ended without saying how (or a panic). The bytes are not
        // known here; the record still says the connection existed and ended.
        self.write(RelayOutcome::ended(CloseReason::Error));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::decision_log::Peer;
    use crate::testing;

    fn opened(shared: &Arc<Shared>, id: u64) -> Opened {
        let facts = Facts {
            id,
            rule: Some("a.test".into()),
            pin: "192.0.2.1:443".parse().unwrap(),
            started: Instant::now(),
            route: Route::Direct,
            dns: Some(Duration::from_millis(1)),
            connect: None,
        };
        let admission = shared.limiter.admit(
            7,
            crate::limits::Door::Channel,
            &tokio_util::sync::CancellationToken::new(),
            || {},
        );
        let ctx = Ctx::new(7, Peer::Embedded, None, admission);
        let label = TargetLabel {
            host: Some("a.test".into()),
            port: Some(443),
        };
        Opened::new(Arc::clone(shared), ctx, Protocol::Socks5, label, facts)
    }

    fn close_records(shared: &Shared, lines: &Mutex<Vec<String>>) -> Vec<serde_json::Value> {
        shared.log.flush();
        let lines = lines.lock().unwrap();
        lines
            .iter()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["event"] == "close")
            .collect()
    }

    #[test]
    fn finish_writes_the_record_once_and_drop_writes_none_after_it() {
        let lines = Arc::default();
        let shared = testing::shared(Arc::clone(&lines));
        let outcome = RelayOutcome {
            up: 3,
            down: 4,
            close_reason: CloseReason::UpstreamClosed,
        };
        opened(&shared, 1).finish(outcome);
        let records = close_records(&shared, &lines);
        assert_eq!(records.len(), 1, "{records:?}");
        let r = &records[0];
        assert_eq!(
            (
                &r["id"],
                &r["close_reason"],
                &r["bytes_up"],
                &r["bytes_down"]
            ),
            (&1.into(), &"upstream_closed".into(), &3.into(), &4.into())
        );
        assert_eq!(
            (&r["decision"], &r["reason"]),
            (&"allow".into(), &"allowed".into())
        );
        assert_eq!(
            (&r["protocol"], &r["pin"], &r["rule"]),
            (&"socks5".into(), &"192.0.2.1".into(), &"a.test".into())
        );
    }

    #[test]
    fn an_unfinished_connection_still_gets_its_record_with_close_reason_error() {
        let lines = Arc::default();
        let shared = testing::shared(Arc::clone(&lines));
        drop(opened(&shared, 2));
        // A panic on the connection's task unwinds through the same drop.
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _owner = opened(&shared, 3);
            panic!("a bug in one connection");
        }));
        assert!(unwound.is_err());
        let records = close_records(&shared, &lines);
        let ids: Vec<_> = records
            .iter()
            .map(|r| (r["id"].clone(), r["close_reason"].clone()))
            .collect();
        assert_eq!(
            ids,
            [(2.into(), "error".into()), (3.into(), "error".into())]
        );
    }
}
