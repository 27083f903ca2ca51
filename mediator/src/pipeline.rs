//! The per-connection pipeline shared by every protocol front-end: identify authority ->
//! canonical target -> grant decision -> resolve + vet + pin -> connect -> (relay) ->
//! close record. Each step is a small function; the front-ends (`http`, `socks`) only
//! translate their wire format to and from these steps.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use policy::config::{Authority, Limits, Timeouts};
use policy::{Grant, OwnAddrs, Reason, Target};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};

use crate::decision_log::{DecisionLog, Peer, Record, now_rfc3339};
use crate::resolve::{ResolveFailure, Resolver};
use crate::route::{self, ConnectFailure};

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
        }
    }

    fn from_decision(d: policy::Decision) -> Self {
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
}

/// The facts of an allowed connection that its close record repeats.
#[derive(Debug, Clone, Copy)]
pub struct Opened {
    /// The decision id.
    pub id: u64,
    /// The address actually connected to.
    pub pin: SocketAddr,
    /// When the decision was taken.
    pub started: Instant,
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
    /// Authorities by name.
    pub authorities: HashMap<String, Arc<Authority>>,
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
        authorities: HashMap<String, Arc<Authority>>,
        resolver: Resolver,
        log: DecisionLog,
        own: OwnAddrs,
        (timeouts, limits): (Timeouts, Limits),
        signals: Signals,
    ) -> Self {
        Self {
            authorities,
            resolver,
            log,
            own,
            timeouts,
            limits,
            closing: signals.closing,
            draining: signals.draining,
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
        let Some(auth) = self.authorities.get(name) else {
            // Hash anyway so that timing does not reveal which names exist.
            let _ = digest.ct_eq(&[0u8; 32]);
            return Err(Denial::new(
                Reason::UnknownAuthority,
                "the credential names an authority that does not exist",
                "use the authority name your security team configured as the proxy user name",
            ));
        };
        let Some(stored) = auth.token_sha256 else {
            return Err(Denial::new(
                Reason::UnknownAuthority,
                format!(
                    "authority \"{}\" has no token and cannot use the TCP listener",
                    auth.grant.name()
                ),
                "use the authority's Unix socket, or configure token_sha256 for it",
            ));
        };
        if bool::from(digest.ct_eq(&stored)) {
            Ok(Arc::clone(auth))
        } else {
            Err(Denial::new(
                Reason::BadCredential,
                "wrong token for this authority",
                "check the proxy password (the token whose SHA-256 is configured)",
            ))
        }
    }

    /// Decides, resolves, vets and connects. Logs the decision line (allow or deny).
    pub async fn establish(
        &self,
        ctx: &Ctx,
        grant: &Grant,
        protocol: &'static str,
        target: &Target,
    ) -> Result<Connected, Denial> {
        let id = self.next_id();
        let started = Instant::now();
        let label = TargetLabel::from(target);
        let decision = grant.decide(target);
        if !decision.is_allow() {
            let denial = Denial::from_decision(decision);
            self.log_decision(ctx, id, protocol, &label, Err(&denial), None, None);
            return Err(denial);
        }
        let rule = decision.rule;
        let (resolved, dns_time) = self.resolver.resolve(&target.host).await;
        let addrs = match resolved {
            Ok(addrs) => addrs,
            Err(failure) => {
                let mut denial = Denial::new(
                    Reason::DnsFailure,
                    format!("cannot resolve {}: {failure}", target.host),
                    "check the host name; the mediator's resolver found no address for it",
                );
                if failure == ResolveFailure::Timeout {
                    denial.status = 504;
                }
                denial.rule = rule;
                self.log_decision(
                    ctx,
                    id,
                    protocol,
                    &label,
                    Err(&denial),
                    Some(dns_time),
                    None,
                );
                return Err(denial);
            }
        };
        let pin = match grant.vet(target, &addrs, &self.own) {
            Ok(pin) => pin,
            Err(d) => {
                let denial = Denial::from_decision(d);
                self.log_decision(
                    ctx,
                    id,
                    protocol,
                    &label,
                    Err(&denial),
                    Some(dns_time),
                    None,
                );
                return Err(denial);
            }
        };
        let (connected, connect_time) =
            route::connect_pinned(&pin, target.port, self.timeouts.connect).await;
        match connected {
            Ok((stream, addr)) => {
                let allow = AllowInfo {
                    rule: rule.as_deref(),
                    pin: addr,
                };
                self.log_decision(
                    ctx,
                    id,
                    protocol,
                    &label,
                    Ok(allow),
                    Some(dns_time),
                    Some(connect_time),
                );
                Ok(Connected {
                    stream,
                    opened: Opened {
                        id,
                        pin: addr,
                        started,
                    },
                })
            }
            Err(failure) => {
                let mut denial = Denial::new(
                    Reason::UpstreamFailure,
                    format!("{}: {failure}", target),
                    "the destination did not accept the connection; check the host and port",
                );
                match failure {
                    ConnectFailure::Refused(_) => denial.socks_rep = 0x05,
                    ConnectFailure::Timeout => {
                        denial.status = 504;
                        denial.socks_rep = 0x04;
                    }
                    ConnectFailure::Other(_) => denial.socks_rep = 0x04,
                }
                denial.rule = rule;
                self.log_decision(
                    ctx,
                    id,
                    protocol,
                    &label,
                    Err(&denial),
                    Some(dns_time),
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
        denial: Denial,
    ) -> Denial {
        let id = self.next_id();
        let mut rec = self.base_record(ctx, id, protocol, label);
        rec.authority = authority.map(str::to_owned);
        fill_deny(&mut rec, &denial);
        self.log.write(&rec);
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
        let Opened { id, pin, started } = opened;
        let mut rec = self.base_record(ctx, id, protocol, label);
        rec.event = "close";
        rec.decision = "allow";
        rec.reason = Reason::Allowed.as_str();
        rec.pin = Some(pin.ip().to_string());
        rec.route = Some(route::DIRECT.to_owned());
        rec.bytes_up = Some(outcome.up);
        rec.bytes_down = Some(outcome.down);
        rec.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        rec.close_reason = Some(outcome.close_reason);
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
        pin: SocketAddr,
    ) {
        let id = self.next_id();
        let allow = AllowInfo { rule, pin };
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
                rec.route = Some(route::DIRECT.to_owned());
            }
            Err(denial) => fill_deny(&mut rec, denial),
        }
        self.log.write(&rec);
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
        }
    }
}

struct AllowInfo<'a> {
    rule: Option<&'a str>,
    pin: SocketAddr,
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

/// Escapes a raw, untrusted target for logs and JSON bodies: printable ASCII kept,
/// everything else as `\xNN`, at most 256 bytes.
pub fn escape_raw(raw: &[u8]) -> String {
    let mut out = String::new();
    for &b in raw.iter().take(256) {
        if (0x20..0x7f).contains(&b) && b != b'\\' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}
