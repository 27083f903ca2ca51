//! The per-connection pipeline shared by every protocol front-end: identify authority ->
//! canonical target -> grant decision -> resolve + vet + pin -> connect -> (relay) ->
//! close record. Each step is a small function; the front-ends (`http`, `socks`) only
//! translate their wire format to and from these steps.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use policy::config::{Authority, Limits, Timeouts};
use policy::{Decision, Grant, OwnAddrs, Pin, Reason, Target};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};

use crate::authorities::{DenialEntry, Registry};
use crate::decision_log::{DecisionLog, Peer, Record, now_rfc3339};
use crate::metrics::{Metrics, UpstreamErrorKind};
use crate::resolve::{ResolveFailure, Resolver};
use crate::route::{self, ConnectFailure};
use crate::watchdog;

/// One denial, ready to be written in any protocol's wire format (design section 6).
#[derive(Debug, Clone)]
pub struct Denial {
    /// Machine-readable reason.
    pub reason: Reason,
    /// Human detail.
    pub detail: String,
    /// What would make it work.
    pub hint: String,
    /// The grant entry that decided, if any.
    pub rule: Option<String>,
    /// HTTP status: 400, 403, 407, 502 or 504.
    pub status: u16,
    /// SOCKS5 REP code (RFC 1928 section 6): 0x02 policy, 0x04 unreachable, 0x05 refused,
    /// 0x01 general failure.
    pub socks_rep: u8,
    /// A configured authority that a failed credential named (wrong token, or no token
    /// configured): the decision log attributes the attempt to it, so a security team
    /// sees who is being impersonated. `None` for names that are not authorities.
    pub claimed_authority: Option<String>,
}

impl Denial {
    /// A denial with the status and SOCKS code that `reason` implies.
    pub fn new(reason: Reason, detail: impl Into<String>, hint: impl Into<String>) -> Self {
        let (status, socks_rep) = match reason {
            Reason::MalformedTarget => (400, 0x02),
            Reason::BadCredential | Reason::UnknownAuthority => (407, 0x02),
            Reason::DnsFailure => (502, 0x04),
            Reason::UpstreamFailure => (502, 0x01),
            Reason::RateLimited => (429, 0x02),
            _ => (403, 0x02),
        };
        Self {
            reason,
            detail: detail.into(),
            hint: hint.into(),
            rule: None,
            status,
            socks_rep,
            claimed_authority: None,
        }
    }

    fn from_decision(d: Decision) -> Self {
        let mut denial = Self::new(d.reason, d.detail, d.hint);
        denial.rule = d.rule;
        denial
    }
}

/// Who is on the other end of one client connection.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Connection id (for the `conn` log field).
    pub conn: u64,
    /// Peer credentials or address.
    pub peer: Peer,
    /// The authority bound by the channel (`Some` on a Unix socket; `None` on the shared
    /// TCP listener until a credential names one).
    pub authority: Option<Arc<Authority>>,
    /// The method and logged path (query redacted) of the request being decided, for
    /// plain `http://` requests to a host whose TLS is terminated (the lines then carry
    /// `method` and `path`, as the `tls` lines of its tunnels do). `None` elsewhere.
    pub request: Option<(String, String)>,
}

/// Where a log line's target came from: canonical, or raw (escaped) when unparsable.
#[derive(Debug, Clone, Default)]
pub struct TargetLabel {
    /// Host text.
    pub host: Option<String>,
    /// Port.
    pub port: Option<u16>,
}

impl From<&Target> for TargetLabel {
    fn from(t: &Target) -> Self {
        Self {
            host: Some(t.host.as_text()),
            port: Some(t.port),
        }
    }
}

/// An established upstream connection for an allowed decision.
#[derive(Debug)]
pub struct Connected {
    /// The upstream stream.
    pub stream: TcpStream,
    /// What its close record needs.
    pub opened: Opened,
    /// Turns true when this connection must close: its authority was revoked and the
    /// revoke grace is over, or the shutdown grace is over. Relays watch this one, not
    /// [`Shared::closing`].
    pub closing: watch::Receiver<bool>,
    /// `Some` when `stream` goes to an HTTP parent that takes absolute-form requests
    /// (plain HTTP routed through a parent): send them there, with this authorization.
    pub forward_proxy: Option<route::ForwardProxy>,
}

/// What the shared decision steps found for one target (see [`decide_and_vet`]).
#[derive(Debug)]
pub struct Vetting {
    /// The grant's name-level decision.
    pub decision: Decision,
    /// The resolution and its duration, when the name decision allowed.
    pub resolved: Option<(Result<Vec<IpAddr>, ResolveFailure>, Duration)>,
    /// The pin and the deciding rule, or the denial.
    pub outcome: Result<(Pin, Option<String>), Denial>,
}

/// The decision steps that live traffic and `mediator explain` share: the grant's name
/// decision (deny rules, allow rules, port), one resolution, then vetting of every address
/// (global or excepted, never the mediator's own listeners). Nothing is connected to.
pub async fn decide_and_vet(
    resolver: &Resolver,
    own: &OwnAddrs,
    grant: &Grant,
    target: &Target,
) -> Vetting {
    let decision = grant.decide(target);
    if !decision.is_allow() {
        let denial = Denial::from_decision(decision.clone());
        return Vetting {
            decision,
            resolved: None,
            outcome: Err(denial),
        };
    }
    let rule = decision.rule.clone();
    let (resolved, dns_time) = resolver.resolve(&target.host).await;
    let outcome = match &resolved {
        Err(failure) => {
            let mut denial = Denial::new(
                Reason::DnsFailure,
                format!("cannot resolve {}: {failure}", target.host),
                "check the host name; the mediator's resolver found no address for it",
            );
            if *failure == ResolveFailure::Timeout {
                denial.status = 504;
            }
            denial.rule = rule;
            Err(denial)
        }
        Ok(addrs) => match grant.vet(target, addrs, own) {
            Ok(pin) => Ok((pin, rule)),
            Err(d) => Err(Denial::from_decision(d)),
        },
    };
    Vetting {
        decision,
        resolved: Some((resolved, dns_time)),
        outcome,
    }
}

/// The facts of an allowed connection that its close record repeats.
#[derive(Debug, Clone, Copy)]
pub struct Opened {
    /// The decision id.
    pub id: u64,
    /// The address actually connected to (or named to a parent).
    pub pin: SocketAddr,
    /// When the decision was taken.
    pub started: Instant,
    /// The route taken (`direct` or a parent), for the close record.
    pub route: route::Route,
    /// Time spent resolving (repeated in the close record).
    pub dns: Option<Duration>,
    /// Time spent connecting (repeated in the close record).
    pub connect: Option<Duration>,
}

/// The shutdown signals every connection watches.
#[derive(Debug, Clone)]
pub struct Signals {
    /// Turns true when live tunnels must close (shutdown grace over).
    pub closing: watch::Receiver<bool>,
    /// Turns true when listeners stop and idle keep-alive connections should end.
    pub draining: watch::Receiver<bool>,
}

/// State shared by every connection of one mediator.
#[derive(Debug)]
pub struct Shared {
    /// The live authorities.
    pub authorities: Registry,
    /// The Prometheus metrics.
    pub metrics: Metrics,
    /// The resolver.
    pub resolver: Resolver,
    /// The decision log.
    pub log: DecisionLog,
    /// The mediator's own listening addresses.
    pub own: OwnAddrs,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Limits.
    pub limits: Limits,
    /// Turns true when live tunnels must close (shutdown grace over).
    pub closing: watch::Receiver<bool>,
    /// Turns true when listeners stop and idle keep-alive connections should end.
    pub draining: watch::Receiver<bool>,
    /// TLS termination state (CA, leaf cache, upstream trust), set once by `start` before
    /// any listener accepts; empty when no `[tls] ca_dir` is configured.
    pub tls: std::sync::OnceLock<Arc<crate::tls::TlsState>>,
    /// The router (`[upstream]`), set once by `start` before any listener accepts. A
    /// `Shared` built without `start` (unit tests) has none and connects directly.
    pub router: std::sync::OnceLock<Arc<route::Router>>,
    next_id: AtomicU64,
    active: AtomicUsize,
    idle: Notify,
}

/// Counts a live client connection; drop it when the connection ends.
#[derive(Debug)]
pub struct ActiveGuard(Arc<Shared>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Shared {
    /// Builds the shared state.
    pub fn new(
        (authorities, metrics): (Registry, Metrics),
        resolver: Resolver,
        log: DecisionLog,
        own: OwnAddrs,
        (timeouts, limits): (Timeouts, Limits),
        signals: Signals,
    ) -> Self {
        Self {
            authorities,
            metrics,
            resolver,
            log,
            own,
            timeouts,
            limits,
            closing: signals.closing,
            draining: signals.draining,
            tls: std::sync::OnceLock::new(),
            router: std::sync::OnceLock::new(),
            next_id: AtomicU64::new(1),
            active: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }

    /// A fresh id for a connection or a decision.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers a live client connection.
    pub fn enter(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        ActiveGuard(Arc::clone(self))
    }

    /// Number of live client connections.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Waits until no client connection is live, or `limit` passes.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.idle.notified();
            if self.active() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.active() == 0;
            }
        }
    }

    /// Finds the authority named by a credential on the shared TCP listener. The token is
    /// hashed with SHA-256 and compared with the stored hash in constant time.
    ///
    /// # Errors
    /// `unknown_authority` when no such authority exists (or it has no token), and
    /// `bad_credential` when the token does not match.
    pub fn authenticate(&self, name: &str, token: &[u8]) -> Result<Arc<Authority>, Denial> {
        let digest: [u8; 32] = Sha256::digest(token).into();
        let Some(auth) = self.authorities.get(name).map(|l| Arc::clone(&l.authority)) else {
            // Hash anyway so that timing does not reveal which names exist.
            let _ = digest.ct_eq(&[0u8; 32]);
            return Err(Denial::new(
                Reason::UnknownAuthority,
                "the credential names an authority that does not exist",
                "use the authority name your security team configured as the proxy user name",
            ));
        };
        let claimed = Some(auth.grant.name().to_owned());
        let Some(stored) = auth.token_sha256 else {
            let mut denial = Denial::new(
                Reason::UnknownAuthority,
                format!(
                    "authority \"{}\" has no token and cannot use the TCP listener",
                    auth.grant.name()
                ),
                "use the authority's Unix socket, or configure token_sha256 for it",
            );
            denial.claimed_authority = claimed;
            return Err(denial);
        };
        if bool::from(digest.ct_eq(&stored)) {
            Ok(auth)
        } else {
            let mut denial = Denial::new(
                Reason::BadCredential,
                "wrong token for this authority",
                "check the proxy password (the token whose SHA-256 is configured)",
            );
            denial.claimed_authority = claimed;
            Err(denial)
        }
    }

    /// Decides, resolves, vets, asks the authority's watchdog (only when everything else
    /// allowed) and connects. Logs the decision line (allow or deny) and counts it. A
    /// connection whose authority was revoked (or replaced) since it was attributed gets
    /// `unknown_authority`: no new decision is ever taken under a revoked grant.
    pub async fn establish(
        &self,
        ctx: &Ctx,
        grant: &Grant,
        protocol: &'static str,
        target: &Target,
    ) -> Result<Connected, Denial> {
        // Boxed: resolving and connecting take a large future (kilobytes) that is needed
        // only until the connection is up; inline, every connection's task would carry
        // (and move) it for its whole life.
        let establishing = Box::pin(self.establish_inner(ctx, grant, protocol, target));
        // A shutdown whose grace ends while we resolve, ask the watchdog or connect still
        // gets its decision line (the inner steps log only after their last wait).
        let mut closing = self.closing.clone();
        tokio::select! {
            result = establishing => result,
            () = crate::listener::wait_true(&mut closing) => {
                let denial = Denial::new(
                    Reason::UpstreamFailure,
                    format!("{target}: the mediator shut down before the upstream connection was made"),
                    "retry once the mediator is back",
                );
                let label = TargetLabel::from(target);
                Err(self.deny_early(ctx, Some(grant.name()), protocol, &label, denial))
            }
        }
    }

    async fn establish_inner(
        &self,
        ctx: &Ctx,
        grant: &Grant,
        protocol: &'static str,
        target: &Target,
    ) -> Result<Connected, Denial> {
        let id = self.next_id();
        let started = Instant::now();
        let label = TargetLabel::from(target);
        // The grant decided with must be the live authority's own (never another's).
        let live = ctx
            .authority
            .as_ref()
            .and_then(|a| self.authorities.live_of(a))
            .filter(|l| std::ptr::eq(&l.authority.grant, grant));
        let Some(live) = live else {
            let denial = Denial::new(
                Reason::UnknownAuthority,
                format!(
                    "authority \"{}\" was revoked or replaced after this connection was opened",
                    grant.name()
                ),
                "open a new connection; if the authority was revoked, ask an operator",
            );
            self.log_decision(ctx, id, protocol, &label, Err(&denial), None, None);
            return Err(denial);
        };
        let vetting = decide_and_vet(&self.resolver, &self.own, grant, target).await;
        let dns_time = vetting.resolved.as_ref().map(|(r, took)| {
            if target.host.name().is_some() {
                self.metrics.observe_dns(*took);
            }
            if let Err(failure) = r {
                self.metrics.upstream_error(match failure {
                    ResolveFailure::NoRecords => UpstreamErrorKind::DnsNoRecords,
                    ResolveFailure::Timeout => UpstreamErrorKind::DnsTimeout,
                    ResolveFailure::Other(_) => UpstreamErrorKind::DnsError,
                });
            }
            *took
        });
        let (pin, rule) = match vetting.outcome {
            Ok(pair) => pair,
            Err(denial) => {
                self.log_decision(ctx, id, protocol, &label, Err(&denial), dns_time, None);
                return Err(denial);
            }
        };
        let watchdog = &live.authority.watchdog;
        if !watchdog.is_empty() {
            let host = target.host.as_text();
            let question = watchdog::Question {
                authority: grant.name(),
                host: &host,
                port: target.port,
                protocol,
            };
            if let watchdog::Verdict::Deny(detail) =
                watchdog::ask(watchdog, &question, self.timeouts.watchdog).await
            {
                let mut denial = Denial::new(
                    Reason::WatchdogDenied,
                    detail,
                    "the grant allows this destination but the authority's watchdog refused it; ask its operator",
                );
                denial.rule = rule;
                self.log_decision(ctx, id, protocol, &label, Err(&denial), dns_time, None);
                return Err(denial);
            }
        }
        // Routing, after the decision and the vetting: the route only chooses how to
        // reach the vetted addresses, never which ones.
        let (connected, connect_time) = self.route(protocol, target, &pin).await;
        self.metrics.observe_connect(connect_time);
        match connected {
            Ok(route::Established {
                stream,
                pin: addr,
                route,
                forward,
            }) => {
                let allow = AllowInfo {
                    rule: rule.as_deref(),
                    pin: addr,
                    route: self.route_label(route),
                };
                self.metrics.opened(grant.name());
                self.metrics.routed(grant.name(), route.kind());
                self.log_decision(
                    ctx,
                    id,
                    protocol,
                    &label,
                    Ok(allow),
                    dns_time,
                    Some(connect_time),
                );
                Ok(Connected {
                    stream,
                    opened: Opened {
                        id,
                        pin: addr,
                        started,
                        route,
                        dns: dns_time,
                        connect: Some(connect_time),
                    },
                    closing: live.closing_signal(),
                    forward_proxy: forward,
                })
            }
            Err(failure) => {
                let mut denial = Denial::new(
                    Reason::UpstreamFailure,
                    failure.detail,
                    "the destination (or the parent proxy on its route) did not accept the connection; check the host and port, and the [upstream] parents",
                );
                let kind = match failure.connect {
                    // The parent answered (407, 403, SOCKS5 REP) or the PAC gave no route.
                    None => UpstreamErrorKind::ConnectError,
                    Some(ConnectFailure::Refused(_)) => {
                        denial.socks_rep = 0x05;
                        UpstreamErrorKind::ConnectRefused
                    }
                    Some(ConnectFailure::Timeout) => {
                        denial.status = 504;
                        denial.socks_rep = 0x04;
                        UpstreamErrorKind::ConnectTimeout
                    }
                    Some(ConnectFailure::Other(_)) => {
                        denial.socks_rep = 0x04;
                        UpstreamErrorKind::ConnectError
                    }
                };
                self.metrics.upstream_error(kind);
                denial.rule = rule;
                self.log_decision(
                    ctx,
                    id,
                    protocol,
                    &label,
                    Err(&denial),
                    dns_time,
                    Some(connect_time),
                );
                Err(denial)
            }
        }
    }

    /// Logs a denial taken before a target could be established (credentials, malformed
    /// target, protocol errors) and returns it.
    pub fn deny_early(
        &self,
        ctx: &Ctx,
        authority: Option<&str>,
        protocol: &'static str,
        label: &TargetLabel,
        mut denial: Denial,
    ) -> Denial {
        // Early denials quote the raw input in their detail; it may hold userinfo.
        if denial.detail.contains('@') {
            denial.detail = redact_userinfo(&denial.detail);
        }
        let id = self.next_id();
        let mut rec = self.base_record(ctx, id, protocol, label);
        rec.authority = authority
            .map(str::to_owned)
            .or_else(|| denial.claimed_authority.clone());
        fill_deny(&mut rec, &denial);
        self.emit(ctx, &rec);
        denial
    }

    /// Logs the close line of an allowed connection.
    pub fn log_close(
        &self,
        ctx: &Ctx,
        protocol: &'static str,
        label: &TargetLabel,
        opened: Opened,
        outcome: crate::relay::RelayOutcome,
    ) {
        let Opened {
            id,
            pin,
            started,
            route,
            dns,
            connect,
        } = opened;
        let mut rec = self.base_record(ctx, id, protocol, label);
        rec.event = "close";
        // A tunnel cut by the SNI gate ends denied; its close record says so too.
        if outcome.close_reason == "sni_mismatch" {
            rec.decision = "deny";
            rec.reason = Reason::SniMismatch.as_str();
        } else {
            rec.decision = "allow";
            rec.reason = Reason::Allowed.as_str();
        }
        rec.dns_ms = dns.map(ms);
        rec.connect_ms = connect.map(ms);
        rec.pin = Some(pin.ip().to_string());
        rec.route = Some(self.route_label(route).to_owned());
        rec.bytes_up = Some(outcome.up);
        rec.bytes_down = Some(outcome.down);
        rec.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        rec.close_reason = Some(outcome.close_reason);
        if let Some(a) = &ctx.authority {
            self.metrics
                .closed(a.grant.name(), outcome.up, outcome.down);
        }
        self.log.write(&rec);
    }

    /// Logs an allow decision served by an already-open upstream connection (keep-alive
    /// reuse within one client connection): no new resolution or connect.
    pub fn log_reuse(
        &self,
        ctx: &Ctx,
        protocol: &'static str,
        label: &TargetLabel,
        rule: Option<&str>,
        (pin, route): (SocketAddr, route::Route),
    ) {
        let id = self.next_id();
        let allow = AllowInfo {
            rule,
            pin,
            route: self.route_label(route),
        };
        self.log_decision(
            ctx,
            id,
            protocol,
            label,
            Ok(allow),
            Some(Duration::ZERO),
            Some(Duration::ZERO),
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn log_decision(
        &self,
        ctx: &Ctx,
        id: u64,
        protocol: &'static str,
        label: &TargetLabel,
        result: Result<AllowInfo<'_>, &Denial>,
        dns: Option<Duration>,
        connect: Option<Duration>,
    ) {
        let mut rec = self.base_record(ctx, id, protocol, label);
        rec.dns_ms = dns.map(ms);
        rec.connect_ms = connect.map(ms);
        match result {
            Ok(allow) => {
                rec.decision = "allow";
                rec.reason = Reason::Allowed.as_str();
                rec.rule = allow.rule.map(str::to_owned);
                rec.pin = Some(allow.pin.ip().to_string());
                rec.route = Some(allow.route.to_owned());
            }
            Err(denial) => fill_deny(&mut rec, denial),
        }
        self.emit(ctx, &rec);
    }

    /// Establishes the connection for an allowed, vetted target through the router:
    /// `protocol` `"http"` is absolute-form forwarding, everything else a tunnel.
    async fn route(
        &self,
        protocol: &'static str,
        target: &Target,
        pin: &Pin,
    ) -> (Result<route::Established, route::RouteFailure>, Duration) {
        let via = if protocol == "http" {
            route::Via::Forward
        } else {
            route::Via::Tunnel
        };
        if let Some(router) = self.router.get() {
            return router
                .connect(via, target, pin, self.timeouts.connect)
                .await;
        }
        let (r, took) = route::connect_pinned(pin, target.port, self.timeouts.connect).await;
        let r = r
            .map(|(stream, addr)| route::Established {
                stream,
                pin: addr,
                route: route::Route::Direct,
                forward: None,
            })
            .map_err(|failure| route::RouteFailure {
                detail: format!("{target}: {failure}"),
                connect: Some(failure),
            });
        (r, took)
    }

    /// The `route` log value of `route`.
    pub fn route_label(&self, route: route::Route) -> &str {
        self.router.get().map_or(route::DIRECT, |r| r.label(route))
    }

    /// Writes a decision line, counts it in `mediator_decisions_total` (first, so that a
    /// visible line is always counted), and keeps a denial in the ring of the
    /// connection's (still live) authority.
    fn emit(&self, ctx: &Ctx, rec: &Record) {
        self.metrics.decision(
            rec.authority.as_deref(),
            rec.protocol,
            rec.decision,
            rec.reason,
        );
        if rec.decision == "deny" {
            let live = ctx
                .authority
                .as_ref()
                .filter(|a| rec.authority.as_deref() == Some(a.grant.name()))
                .and_then(|a| self.authorities.live_of(a));
            if let Some(live) = live {
                live.record_denial(DenialEntry {
                    id: rec.id,
                    ts: rec.ts.clone(),
                    protocol: rec.protocol,
                    host: rec.host.clone(),
                    port: rec.port,
                    reason: rec.reason,
                    rule: rec.rule.clone(),
                    detail: rec.detail.clone(),
                });
            }
        }
        self.log.write(rec);
    }

    fn base_record(
        &self,
        ctx: &Ctx,
        id: u64,
        protocol: &'static str,
        label: &TargetLabel,
    ) -> Record {
        Record {
            event: "decision",
            ts: now_rfc3339(),
            id,
            conn: ctx.conn,
            authority: ctx.authority.as_ref().map(|a| a.grant.name().to_owned()),
            channel: ctx.peer.channel(),
            peer: ctx.peer,
            protocol,
            host: label.host.clone(),
            port: label.port,
            decision: "deny",
            reason: "",
            rule: None,
            detail: String::new(),
            pin: None,
            route: None,
            dns_ms: None,
            connect_ms: None,
            bytes_up: None,
            bytes_down: None,
            duration_ms: None,
            close_reason: None,
            method: ctx.request.as_ref().map(|(m, _)| m.clone()),
            path: ctx.request.as_ref().map(|(_, p)| p.clone()),
        }
    }

    /// Logs one request inside a TLS-terminated tunnel (`protocol: "tls"`, design sections
    /// 9 and 10) and counts it: its method and path (the caller redacts the query; no
    /// header values), the pin of the tunnel, and the allow (with the request rule that
    /// allowed it, if any) or the denial.
    pub fn log_tls_request(
        &self,
        ctx: &Ctx,
        label: &TargetLabel,
        pin: SocketAddr,
        (method, path): (&str, &str),
        result: Result<Option<&str>, &Denial>,
    ) {
        let id = self.next_id();
        let mut rec = self.base_record(ctx, id, "tls", label);
        rec.method = Some(method.to_owned());
        rec.path = Some(path.to_owned());
        rec.pin = Some(pin.ip().to_string());
        match result {
            Ok(rule) => {
                rec.decision = "allow";
                rec.reason = Reason::Allowed.as_str();
                rec.rule = rule.map(str::to_owned);
                rec.route = Some(route::DIRECT.to_owned());
            }
            Err(denial) => fill_deny(&mut rec, denial),
        }
        self.emit(ctx, &rec);
    }
}

struct AllowInfo<'a> {
    rule: Option<&'a str>,
    pin: SocketAddr,
    route: &'a str,
}

fn fill_deny(rec: &mut Record, denial: &Denial) {
    rec.decision = "deny";
    rec.reason = denial.reason.as_str();
    rec.rule = denial.rule.clone();
    rec.detail = denial.detail.clone();
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0
}

/// Replaces each userinfo-like run (the characters before an `@` back to a quote, space or
/// `/`) with `<userinfo redacted>`.
pub fn redact_userinfo(text: &str) -> String {
    let mut result = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('@') {
        let (before, after) = rest.split_at(at);
        let start = before.rfind(['"', ' ', '/', '\'']).map_or(0, |p| p + 1);
        result.push_str(&before[..start]);
        result.push_str("<userinfo redacted>@");
        rest = &after[1..];
    }
    result.push_str(rest);
    result
}

/// The path of a request for the decision log: escaped, its query (which often holds
/// tokens) replaced by `?<redacted>`.
pub fn logged_path(uri: &http::Uri) -> String {
    let path = escape_raw(uri.path().as_bytes());
    if uri.query().is_some() {
        format!("{path}?<redacted>")
    } else {
        path
    }
}

/// Escapes a raw, untrusted target for logs and JSON bodies: userinfo (everything up to
/// the last `@`) replaced by `<userinfo redacted>@`, printable ASCII kept, everything else
/// as `\xNN`, at most 256 bytes.
pub fn escape_raw(raw: &[u8]) -> String {
    // Userinfo (`user:token@host`) may carry a secret: never log or echo it.
    let (redacted, raw) = match raw.iter().rposition(|&b| b == b'@') {
        Some(at) => (true, &raw[at + 1..]),
        None => (false, raw),
    };
    let mut out = String::new();
    if redacted {
        out.push_str("<userinfo redacted>@");
    }
    for &b in raw.iter().take(256) {
        if (0x20..0x7f).contains(&b) && b != b'\\' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod redact_tests {
    use super::*;

    #[test]
    fn userinfo_never_survives_in_details_or_labels() {
        assert_eq!(
            redact_userinfo(r#"invalid host "alpha:tok@origin.test:443": userinfo"#),
            r#"invalid host "<userinfo redacted>@origin.test:443": userinfo"#
        );
        assert_eq!(redact_userinfo("no at sign"), "no at sign");
        assert_eq!(escape_raw(b"u:secret@h.test"), "<userinfo redacted>@h.test");
        assert_eq!(escape_raw(b"a@b@c.test"), "<userinfo redacted>@c.test");
    }
}
