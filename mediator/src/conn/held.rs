//! A request held for the host's answer (design section 20): one step of
//! [`super::establish`], taken only for a grant miss (`not_in_allowlist`,
//! `port_not_allowed`) of an authority with `ask`, and of a terminated tunnel's
//! requests (`crate::terminate`) for a request rule's miss (`denied_by_rule`, its records
//! `protocol: "tls"` with the method and path); never for the second judgement an answer
//! asks for (that one's miss is final).
//!
//! The question goes to `shared.asks` (bounded per authority: one more than
//! `max_pending_asks` is denied at once, `ask_overloaded`); the request waits for the
//! first of: the host's answer, `ask_timeout_s` (`ask_timeout`), the mediator's shutdown
//! (`ask_timeout`, never an allow), its client leaving. An `allow_via` answer hands the
//! request back to `establish` attributed to that authority, to be judged again in full
//! there (its limits, vetting, watchdog, records); a `deny` answer denies it,
//! `ask_denied`, with the host's words as `message`. Every record of it says `asked: {id,
//! from, ms, outcome, by}`.
//!
//! A client that leaves while held frees its place at once: where the front-end holds
//! the socket it is read meanwhile ([`Watch::Read`]); where hyper serves the connection,
//! hyper drops the request's future, and the hold's drop writes its record
//! (`outcome: hung_up`, the miss's own reason).

use std::sync::Arc;
use std::time::Instant;

use policy::config::{Ask, Authority};
use policy::{Reason, Target};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::record::{self, Timing};
use super::{Ctx, TargetLabel};
use crate::ask::{Answer, Answered, Held, Overloaded, Question};
use crate::decision_log::{Asked, now_rfc3339};
use crate::denial::{Cause, Denial};
use crate::shared::Shared;
use crate::vocab::{AskOutcome, Protocol};

/// The most a client may send while its request is held (kept for the tunnel); past it
/// the socket is no longer read until the answer.
const MAX_EARLY: usize = 64 * 1024;

/// How a held request learns that its client left.
pub(crate) enum Watch<'a> {
    /// hyper serves the connection: a client that leaves makes hyper drop the request's
    /// future (HTTP/1.1 reads for the end of the connection while a response is awaited;
    /// HTTP/2 has its stream reset).
    Dropped,
    /// The front-end holds the socket (a connection that opened with CONNECT, SOCKS5): it
    /// is read while the request is held, and what arrives is kept in `early` for the
    /// tunnel.
    Read {
        /// The client's socket.
        io: &'a mut (dyn AsyncRead + Unpin + Send),
        /// Bytes the client sent after its request.
        early: &'a mut Vec<u8>,
    },
}

impl Watch<'_> {
    /// Returns when the client has left (never for [`Watch::Dropped`]).
    async fn left(&mut self) {
        let Self::Read { io, early } = self else {
            return std::future::pending().await;
        };
        loop {
            if early.len() >= MAX_EARLY {
                return std::future::pending().await;
            }
            early.reserve(4096);
            match io.read_buf(*early).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}

/// The asking of `authority` for a request inside a terminated tunnel that its request
/// rules refused (the per-request holds: the rule that missed is the record's
/// `rule`), unless this is the judgement an answer asked for.
pub(crate) fn askable_request<'a>(ctx: &Ctx, authority: &'a Authority) -> Option<&'a Ask> {
    if ctx.asked.is_some() {
        return None;
    }
    authority.ask.as_ref()
}

/// The asking of `authority` when `denial` (of `ctx`'s request to `target`) may be asked
/// about: a grant miss, an authority with `ask`, not the judgement an answer asked for,
/// and not a target the address check refuses whatever the grant (design section 20:
/// an address-class refusal is never asked about).
pub(crate) fn askable<'a>(
    ctx: &Ctx,
    authority: &'a Authority,
    target: &Target,
    denial: &Denial,
) -> Option<&'a Ask> {
    let miss = matches!(
        denial.reason,
        Reason::NotInAllowlist | Reason::PortNotAllowed
    );
    if !miss || ctx.asked.is_some() || not_public(target) {
        return None;
    }
    authority.ask.as_ref()
}

/// Whether `target` is known, before any resolution, to be an address the address check
/// refuses (section 4.2): an IP literal that is not global, or `localhost` and the names
/// under it (RFC 6761 section 6.3: always loopback). A name is never resolved to tell.
fn not_public(target: &Target) -> bool {
    match (target.host.ip(), target.host.name()) {
        (Some(ip), _) => policy::classify(ip) != policy::AddrClass::Global,
        (None, Some(name)) => name == "localhost" || name.ends_with(".localhost"),
        (None, None) => true,
    }
}

/// The question about `ctx`'s request to `target` that `denial` refused.
fn question(
    ctx: &Ctx,
    protocol: Protocol,
    target: &Target,
    denial: &Denial,
    ask: &Ask,
    id: u64,
) -> Question {
    let labels = ctx.labels.as_deref();
    Question {
        id: id.to_string(),
        authority: ctx.authority_name().unwrap_or("-").to_owned(),
        invocation: labels.and_then(|l| l.invocation.clone()),
        tags: labels.map(|l| l.tags.clone()).unwrap_or_default(),
        host: target.host.as_text(),
        port: target.port,
        protocol,
        peer: ctx.peer,
        message: denial
            .message
            .as_deref()
            .unwrap_or(&denial.detail)
            .to_owned(),
        reason: denial.reason,
        ts: now_rfc3339(),
        timeout_s: ask.timeout.as_secs(),
        method: ctx.request.as_ref().map(|r| r.method.clone()),
        path: ctx.request.as_ref().map(|r| r.path.clone()),
    }
}

/// The request being held, as its records name it.
struct Req<'a> {
    shared: &'a Arc<Shared>,
    ctx: &'a Ctx,
    id: u64,
    protocol: Protocol,
    label: TargetLabel,
    /// The grant miss that was asked about.
    miss: Denial,
}

impl Req<'_> {
    /// The `asked` of its records.
    fn asked(&self, since: Instant, outcome: AskOutcome, by: Option<String>) -> Asked {
        Asked {
            id: self.id.to_string(),
            from: self.ctx.authority_name().unwrap_or("-").to_owned(),
            ms: u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX),
            outcome,
            by,
        }
    }

    /// Logs `denial` as the request's decision, with `asked`, and returns it.
    fn deny(&self, asked: Asked, denial: Denial) -> Denial {
        let ctx = self.ctx.with_asked(asked);
        record::decision(
            self.shared,
            &ctx,
            self.id,
            self.protocol,
            &self.label,
            Err(&denial),
            Timing::default(),
        );
        denial
    }

    /// The miss, saying that the client left while held.
    fn left(&self) -> Denial {
        let mut denial = self.miss.clone();
        denial.detail = format!(
            "the client left while its request was held for the host's answer; {}",
            denial.detail
        );
        denial
    }
}

/// One held request: writes its record if it is dropped before it ends (its client left
/// and hyper dropped the request).
struct Holding<'a> {
    req: Req<'a>,
    held: Held,
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        if self.held.is_finished() {
            return;
        }
        let asked = self.req.asked(self.held.since(), AskOutcome::HungUp, None);
        self.req.deny(asked, self.req.left());
        // `held` drops after this: counted `hung_up`, its place freed.
    }
}

/// Why a held request ended without an answer.
enum Unanswered {
    Timeout,
    Shutdown,
    Left,
}

/// Holds `ctx`'s request to `target` (decision id `id`), refused `miss`, for the host's
/// answer under `ask`. `Ok`: the context to judge it again in (attributed to the
/// `allow_via` authority, carrying `asked`); `Err`: the denial, logged.
///
/// # Errors
/// `ask_overloaded`, `ask_timeout`, `ask_denied`, `unknown_authority` (an `allow_via`
/// naming no live authority), or the miss itself when the client left.
#[expect(
    clippy::too_many_arguments,
    reason = "the request as establish holds it; ceiling 9 arguments"
)]
pub(crate) async fn hold(
    shared: &Arc<Shared>,
    ctx: &Ctx,
    protocol: Protocol,
    target: &Target,
    id: u64,
    miss: Denial,
    ask: &Ask,
    mut watch: Watch<'_>,
) -> Result<Ctx, Denial> {
    let question = question(ctx, protocol, target, &miss, ask, id);
    let req = Req {
        shared,
        ctx,
        id,
        protocol,
        label: TargetLabel::from(target),
        miss,
    };
    let held = match shared.asks.raise(id, question, ask.max_pending) {
        Ok(held) => held,
        Err(Overloaded { max }) => {
            let asked = req.asked(Instant::now(), AskOutcome::Overloaded, None);
            let denial = overloaded(&req, max);
            return Err(req.deny(asked, denial));
        }
    };
    let mut holding = Holding { req, held };
    let since = holding.held.since();
    let ended = tokio::select! {
        answered = holding.held.answered() => Ok(answered),
        () = tokio::time::sleep(ask.timeout) => Err(Unanswered::Timeout),
        () = shared.signals.draining.cancelled() => Err(Unanswered::Shutdown),
        () = watch.left() => Err(Unanswered::Left),
    };
    // An answer that came in the same instant as the end is the answer.
    let ended = ended.or_else(|why| holding.held.close().ok_or(why));
    let outcome = match &ended {
        Ok(Answered {
            answer: Answer::AllowVia(_),
            ..
        }) => AskOutcome::AllowVia,
        Ok(Answered {
            answer: Answer::Deny(_),
            ..
        }) => AskOutcome::Deny,
        Ok(Answered {
            answer: Answer::Decline,
            ..
        }) => AskOutcome::NoHost,
        Err(Unanswered::Left) => AskOutcome::HungUp,
        Err(Unanswered::Timeout | Unanswered::Shutdown) => AskOutcome::Timeout,
    };
    holding.held.finish(outcome);
    let req = &holding.req;
    match ended {
        Ok(answered) => answer(req, since, answered),
        Err(Unanswered::Left) => Err(req.deny(req.asked(since, outcome, None), req.left())),
        Err(why) => {
            let detail = match why {
                Unanswered::Shutdown => format!(
                    "{}:{} was held for the host's answer and the mediator is shutting down",
                    target.host, target.port
                ),
                _ => format!(
                    "{}:{} was held for the host's answer, and none came within {} s (ask_timeout_s)",
                    target.host,
                    target.port,
                    ask.timeout.as_secs()
                ),
            };
            let denial = Denial::new(
                Reason::AskTimeout,
                detail,
                "the host did not answer in time; retry once it has, or ask for the host in the grant",
            )
            .with_rule(req.miss.rule.clone());
            Err(req.deny(req.asked(since, outcome, None), denial))
        }
    }
}

/// Acts on the host's answer.
fn answer(req: &Req<'_>, since: Instant, answered: Answered) -> Result<Ctx, Denial> {
    let Answered { answer, by } = answered;
    match answer {
        Answer::Decline => Err(req.deny(
            req.asked(since, AskOutcome::NoHost, Some(by)),
            req.miss.clone(),
        )),
        Answer::Deny(message) => {
            let asked = req.asked(since, AskOutcome::Deny, Some(by));
            let mut denial = Denial::new(
                Reason::AskDenied,
                format!(
                    "the host was asked about {}:{} and denied it",
                    req.label.host.as_deref().unwrap_or("-"),
                    req.label.port.unwrap_or_default()
                ),
                "the host said no; do without this destination",
            )
            .with_rule(req.miss.rule.clone());
            denial.message = message.map(String::into_boxed_str);
            Err(req.deny(asked, denial))
        }
        Answer::AllowVia(name) => {
            let asked = req.asked(since, AskOutcome::AllowVia, Some(by));
            let Some(via) = req.shared.authorities.get(&name) else {
                let denial = Denial::new(
                    Reason::UnknownAuthority,
                    format!(
                        "the host answered allow_via {name:?}, and no live authority has that name"
                    ),
                    "the host's answer named an authority this mediator does not have; nothing was allowed",
                )
                .with_cause(Cause::Answered);
                return Err(req.deny(asked, denial));
            };
            Ok(req.ctx.attributed(&via.authority).with_asked(asked))
        }
    }
}

/// The `ask_overloaded` denial of an authority holding `max` requests already.
fn overloaded(req: &Req<'_>, max: u32) -> Denial {
    Denial::new(
        Reason::AskOverloaded,
        format!(
            "authority {:?} holds {max} requests for the host's answer already (max_pending_asks = {max})",
            req.ctx.authority_name().unwrap_or("-")
        ),
        "retry once the host has answered the questions it holds",
    )
    .with_cause(Cause::Limited { retry_after: 1 })
    .with_rule(req.miss.rule.clone())
}
