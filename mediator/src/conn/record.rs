//! Decision lines (design section 10): every [`Record`] starts in [`base`], and every
//! decision line is written here. Each line is counted in `mediator_decisions_total` first
//! (so a visible line is always counted), a denial is kept in the ring of the connection's
//! (still live) authority for the admin API, then the line is written. Close records start
//! in [`base`] too and are written by their one owner, [`super::close::Opened`].
//!
//! Nothing here sees a secret: details are redacted by their producers and by
//! [`deny`], and no header value is ever put in a record.

use std::net::SocketAddr;
use std::time::Duration;

use policy::{Reason, Verdict};

use super::{Ctx, RequestLine, TargetLabel};
use crate::authorities::DenialEntry;
use crate::decision_log::{CredentialUse, Record, now_rfc3339};
use crate::denial::{Cause, Denial};
use crate::redact::redact_userinfo;
use crate::relay::RelayOutcome;
use crate::shared::Shared;
use crate::vocab::{Event, Protocol};

/// How long the steps before a decision took (repeated in the close record).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Timing {
    /// Resolving the name (`None` when it was not resolved).
    pub(crate) dns: Option<Duration>,
    /// Connecting upstream (`None` when no connect was tried).
    pub(crate) connect: Option<Duration>,
}

/// What an allow line names.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Allowed<'a> {
    /// The grant entry (or request rule) that allowed, if any.
    pub(crate) rule: Option<&'a str>,
    /// The vetted address connected to.
    pub(crate) pin: SocketAddr,
    /// The `route` log value.
    pub(crate) route: &'a str,
}

/// A record of `ctx` with every field that does not depend on the outcome; the caller
/// fills in the verdict.
pub(crate) fn base(
    ctx: &Ctx,
    id: u64,
    event: Event,
    protocol: Protocol,
    label: &TargetLabel,
) -> Record {
    Record {
        event,
        ts: now_rfc3339(),
        id,
        conn: ctx.conn,
        authority: ctx.authority_name().map(str::to_owned),
        channel: ctx.peer.channel(),
        peer: ctx.peer,
        protocol,
        host: label.host.clone(),
        port: label.port,
        decision: Verdict::Deny,
        reason: Reason::MalformedTarget,
        rule: None,
        detail: String::new(),
        hint: String::new(),
        message: None,
        cause: Cause::Policy,
        pin: None,
        route: None,
        dns_ms: None,
        connect_ms: None,
        bytes_up: None,
        bytes_down: None,
        duration_ms: None,
        close_reason: None,
        client_tls: None,
        tls_alert: None,
        method: ctx.request.as_ref().map(|r| r.method.clone()),
        path: ctx.request.as_ref().map(|r| r.path.clone()),
        capture: ctx.capture,
        credential: Vec::new(),
        upgrade: None,
        invocation: ctx.labels.as_ref().and_then(|l| l.invocation.clone()),
        tags: ctx
            .labels
            .as_ref()
            .map(|l| l.tags.clone())
            .unwrap_or_default(),
        asked: ctx.asked.as_deref().cloned(),
    }
}

/// Logs one decision taken by [`super::establish`] (or served by an already-open upstream
/// connection), under the decision id `id`.
pub(crate) fn decision(
    shared: &Shared,
    ctx: &Ctx,
    id: u64,
    protocol: Protocol,
    label: &TargetLabel,
    result: Result<Allowed<'_>, &Denial>,
    timing: Timing,
) {
    let mut rec = base(ctx, id, Event::Decision, protocol, label);
    rec.dns_ms = timing.dns.map(ms);
    rec.connect_ms = timing.connect.map(ms);
    match result {
        Ok(allow) => fill_allow(&mut rec, allow),
        Err(denial) => fill_deny(&mut rec, denial),
    }
    emit(shared, ctx, &rec);
}

/// Logs a denial taken outside [`super::establish`] (credentials, a malformed target, the
/// SNI gate, a request rule, a protocol error) and returns it. The line names the
/// connection's authority, or the configured authority a failed credential claimed.
pub(crate) fn deny(
    shared: &Shared,
    ctx: &Ctx,
    protocol: Protocol,
    label: &TargetLabel,
    mut denial: Denial,
) -> Denial {
    // These details often quote the raw input, which may hold userinfo.
    if denial.detail.contains('@') {
        denial.detail = redact_userinfo(&denial.detail);
    }
    let mut rec = base(ctx, shared.next_id(), Event::Decision, protocol, label);
    if rec.authority.is_none() {
        rec.authority = denial.claimed_authority.as_deref().map(str::to_owned);
    }
    fill_deny(&mut rec, &denial);
    emit(shared, ctx, &rec);
    denial
}

/// Logs an allow served by an already-open upstream connection (keep-alive reuse within
/// one client connection): no new resolution or connect.
pub(crate) fn reuse(
    shared: &Shared,
    ctx: &Ctx,
    protocol: Protocol,
    label: &TargetLabel,
    allow: Allowed<'_>,
) {
    let zero = Timing {
        dns: Some(Duration::ZERO),
        connect: Some(Duration::ZERO),
    };
    decision(
        shared,
        ctx,
        shared.next_id(),
        protocol,
        label,
        Ok(allow),
        zero,
    );
}

/// Logs one request inside a TLS-terminated tunnel (`protocol: "tls"`, design sections 9
/// and 10): its method and path (query redacted; no header values), the tunnel's pin and
/// route, and the allow (with the request rule that allowed it, if any, and the
/// credentials added to it) or the denial.
pub(crate) fn tls_request(
    shared: &Shared,
    ctx: &Ctx,
    label: &TargetLabel,
    request: &RequestLine,
    result: Result<Allowed<'_>, &Denial>,
    credential: Vec<CredentialUse>,
) -> u64 {
    let id = shared.next_id();
    let rec = tls_record(ctx, id, label, request, result, credential);
    emit(shared, ctx, &rec);
    id
}

/// The record [`tls_request`] writes, under the decision id `id` (also what
/// `super::tunnel_line` serialises the constant part of once per tunnel).
pub(crate) fn tls_record(
    ctx: &Ctx,
    id: u64,
    label: &TargetLabel,
    request: &RequestLine,
    result: Result<Allowed<'_>, &Denial>,
    credential: Vec<CredentialUse>,
) -> Record {
    let mut rec = base(ctx, id, Event::Decision, Protocol::Tls, label);
    rec.method = Some(request.method.clone());
    rec.path = Some(request.path.clone());
    rec.credential = credential;
    match result {
        Ok(allow) => fill_allow(&mut rec, allow),
        Err(denial) => fill_deny(&mut rec, denial),
    }
    rec
}

/// What the close record of an upgraded request repeats.
#[derive(Debug, Clone)]
pub(crate) struct UpgradeFacts {
    /// The protocol upgraded to.
    pub(crate) kind: policy::UpgradeToken,
    /// The tunnel's pin.
    pub(crate) pin: SocketAddr,
    /// The tunnel's `route` value.
    pub(crate) route: String,
    /// When the upgrade was answered.
    pub(crate) started: std::time::Instant,
}

/// The close record of an upgraded request inside a terminated tunnel (`protocol: "tls"`,
/// the `id` of the request's decision line, its method and path, `upgrade`): the bytes
/// of the upgraded protocol each way (the tunnel's own close record counts its TLS bytes,
/// these included; the metrics count those).
pub(crate) fn upgrade_close(
    shared: &Shared,
    ctx: &Ctx,
    id: u64,
    label: &TargetLabel,
    request: &RequestLine,
    facts: UpgradeFacts,
    outcome: RelayOutcome,
) {
    let mut rec = base(ctx, id, Event::Close, Protocol::Tls, label);
    (rec.decision, rec.reason) = outcome.close_reason.verdict();
    rec.method = Some(request.method.clone());
    rec.path = Some(request.path.clone());
    rec.pin = Some(facts.pin.ip().to_string());
    rec.route = Some(facts.route);
    rec.bytes_up = Some(outcome.up);
    rec.bytes_down = Some(outcome.down);
    rec.duration_ms = Some(u64::try_from(facts.started.elapsed().as_millis()).unwrap_or(u64::MAX));
    rec.close_reason = Some(match outcome.close_reason {
        crate::vocab::CloseReason::Shutdown if !shared.signals.is_draining() => {
            crate::vocab::CloseReason::Revoked
        }
        other => other,
    });
    rec.upgrade = Some(facts.kind);
    shared.log.write(&rec);
}

/// Logs the outcome of judging an open connection again after a reload replaced its
/// authority (`super::standing`): an allow (it continues under the new generation) or a
/// denial (it is cut when the grace ends), `detail` saying which.
pub(crate) fn rejudged(
    shared: &Shared,
    ctx: &Ctx,
    protocol: Protocol,
    label: &TargetLabel,
    result: Result<Allowed<'_>, &Denial>,
    detail: String,
) {
    let mut rec = base(ctx, shared.next_id(), Event::Decision, protocol, label);
    match result {
        Ok(allow) => fill_allow(&mut rec, allow),
        Err(denial) => fill_deny(&mut rec, denial),
    }
    rec.detail = detail;
    emit(shared, ctx, &rec);
}

fn fill_allow(rec: &mut Record, allow: Allowed<'_>) {
    rec.decision = Verdict::Allow;
    rec.reason = Reason::Allowed;
    rec.rule = allow.rule.map(str::to_owned);
    rec.pin = Some(allow.pin.ip().to_string());
    rec.route = Some(allow.route.to_owned());
}

fn fill_deny(rec: &mut Record, denial: &Denial) {
    rec.decision = Verdict::Deny;
    rec.reason = denial.reason;
    rec.cause = denial.cause;
    rec.rule.clone_from(&denial.rule);
    rec.detail.clone_from(&denial.detail);
    rec.hint.clone_from(&denial.hint);
    rec.message = denial.message.as_deref().map(str::to_owned);
}

/// Counts, keeps (denials) and writes one decision line.
fn emit(shared: &Shared, ctx: &Ctx, rec: &Record) {
    shared.metrics.decision(
        rec.authority.as_deref(),
        rec.protocol,
        rec.decision,
        rec.reason,
    );
    if rec.decision == Verdict::Deny {
        let status = match rec.protocol {
            Protocol::Socks5 => u16::from(crate::denial::socks_rep(rec.reason, rec.cause)),
            _ => crate::denial::http_status(rec.reason, rec.cause),
        };
        keep(shared, ctx, rec, rec.id, status);
    }
    shared.log.write(rec);
}

/// Keeps `rec` as the entry `id` of the admin API's recent denials (answered `status`):
/// only in the ring of the authority the connection really belongs to, and only while
/// that very grant is live.
fn keep(shared: &Shared, ctx: &Ctx, rec: &Record, id: u64, status: u16) {
    let live = ctx
        .authority
        .as_ref()
        .filter(|a| rec.authority.as_deref() == Some(a.grant.name()))
        .and_then(|a| shared.authorities.live_of(a));
    if let Some(live) = live {
        let close = rec.event == Event::Close;
        live.record_denial(DenialEntry {
            event: rec.event,
            id,
            tunnel_id: close.then_some(rec.id),
            client_tls: rec.client_tls,
            tls_alert: rec.tls_alert,
            ts: rec.ts.clone(),
            protocol: rec.protocol,
            host: rec.host.clone(),
            port: rec.port,
            reason: rec.reason,
            rule: rec.rule.clone(),
            detail: rec.detail.clone(),
            hint: rec.hint.clone(),
            message: rec.message.clone(),
            invocation: rec.invocation.clone(),
            tags: rec.tags.clone(),
            status,
            peer: rec.peer,
        });
    }
}

/// Keeps the close record `rec` of a terminated tunnel whose client refused the
/// mediator's certificate among its authority's recent denials (the admin API's, which
/// the shim reads in socket mode), under an id drawn now: the shim then hears of it as of
/// a denial, with what to do.
pub(crate) fn client_refused(shared: &Shared, ctx: &Ctx, rec: &Record) {
    // The client was answered that its tunnel was open: `200`, or SOCKS5 REP 0x00.
    let status = match rec.protocol {
        Protocol::Socks5 => 0,
        _ => 200,
    };
    keep(shared, ctx, rec, shared.next_id(), status);
}

/// Milliseconds with microsecond precision.
pub(crate) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0
}
