//! An allowed connection's standing under its authority, from its decision to its close
//! (design section 5): what cuts it, and what a reload that changes its authority does.
//!
//! Every allowed connection (a tunnel, a terminated tunnel, a forwarding connection to an
//! origin) gets a [`Standing`] from `establish`: the live authority it runs under and a
//! cut signal of its own, which its relay (or server) ends on. The standing joins the
//! authority's members (`crate::members`); nothing runs for it while it waits, and its
//! owner's [`Membership`] takes it out when the connection closes. The authority tells
//! it:
//!
//! - its authority revoked, or the shutdown grace over: the cut comes when the
//!   authority's connections must close (after the revoke grace, or at once);
//! - its authority re-created by a reload (a changed table, same channel): the
//!   connection is judged again under the new grant ([`judge_again`], in a task of its
//!   own that ends with the judgement, the cut or the connection's close): the same
//!   credential (on the TCP listener), the same TLS handling, the grant's name
//!   decision, the pinned address vetted again, and the new watchdog asked if it
//!   changed. Still allowed, it continues under the new generation: its slot moves to
//!   the new counts, it joins the new generation's members, and one decision line says
//!   so. No longer allowed, one decision line says why, and the cut comes when the old
//!   generation's grace ends.
//!
//! A cut is never an end the client could take for the origin's: the relay resets both
//! sockets (`crate::relay`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use policy::Target;
use policy::config::Authority;
use tokio_util::sync::CancellationToken;

use super::record::{self, Allowed};
use super::{Ctx, TargetLabel};
use crate::authorities::Live;
use crate::denial::Denial;
use crate::members::{Joined, Key, Member};
use crate::route::Route;
use crate::shared::Shared;
use crate::vocab::{Channel, Protocol};

/// The authority an allowed connection runs under, and its cut signal.
#[derive(Debug)]
pub(crate) struct Standing {
    shared: Arc<Shared>,
    subject: Subject,
    at: Mutex<At>,
    cut: CancellationToken,
}

/// Where a standing is joined.
#[derive(Debug)]
struct At {
    /// The generation it runs under.
    live: Arc<Live>,
    /// Its place among that generation's members; `None` when not joined (closing).
    key: Option<Key>,
    /// The connection closed: a judgement that ends now changes nothing.
    closed: bool,
    /// Made by the first re-judgement, cancelled when the connection closes: a judgement
    /// still under way stops (a connection never judged again pays nothing for it).
    ended: Option<CancellationToken>,
}

impl Standing {
    /// The authority the connection runs under now (its successor's after a reload that
    /// kept it).
    pub(crate) fn authority(&self) -> Arc<Authority> {
        Arc::clone(&self.lock().live.authority)
    }

    /// Cancelled when the connection must be cut.
    pub(crate) fn cut_signal(&self) -> CancellationToken {
        self.cut.clone()
    }

    fn lock(&self) -> MutexGuard<'_, At> {
        self.at.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins `at.live`'s members (held: `at`, so that a close cannot interleave).
    fn enter(self: &Arc<Self>, at: &mut At) {
        let me: Weak<dyn Member> = Arc::downgrade(self) as Weak<dyn Member>;
        match at.live.join(me) {
            Joined::Closing => {
                at.key = None;
                self.cut.cancel();
            }
            Joined::Member { key, replaced } => {
                at.key = Some(key);
                if replaced {
                    self.rejudge(at);
                }
            }
        }
    }

    /// Judges the connection again, in a task of its own, under the successor of the
    /// generation it runs under (held: `at`).
    fn rejudge(self: &Arc<Self>, at: &mut At) {
        let from = Arc::clone(&at.live);
        let ended = at.ended.get_or_insert_with(CancellationToken::new).clone();
        tokio::spawn(Arc::clone(self).judged_from(from, ended));
    }

    async fn judged_from(self: Arc<Self>, from: Arc<Live>, ended: CancellationToken) {
        let subject = &self.subject;
        let judged = tokio::select! {
            biased;
            () = self.cut.cancelled() => return,
            () = ended.cancelled() => return,
            j = judge_again(&self.shared, &from, subject) => j,
        };
        let label = TargetLabel::from(&subject.target);
        let mut at = self.lock();
        if at.closed || self.cut.is_cancelled() || !Arc::ptr_eq(&at.live, &from) {
            return;
        }
        match judged {
            Ok((next, rule)) => {
                subject.ctx.admission.transfer(&next.counts);
                let ctx = subject.ctx.attributed(&next.authority);
                let detail = format!(
                    "judged again after a reload: still allowed, continues under generation {} (was {})",
                    next.generation, from.generation
                );
                let allow = Allowed {
                    rule: rule.as_deref(),
                    pin: subject.pin,
                    route: self.shared.route_label(subject.route),
                };
                record::rejudged(
                    &self.shared,
                    &ctx,
                    subject.protocol,
                    &label,
                    Ok(allow),
                    detail,
                );
                if let Some(key) = at.key.take() {
                    from.leave(key);
                }
                at.live = next;
                self.enter(&mut at);
            }
            Err(denial) => {
                // It stays among `from`'s members: cut when its grace ends.
                let detail = format!(
                    "judged again after a reload: {}; the connection is cut when generation {}'s revoke grace ends",
                    denial.detail, from.generation
                );
                record::rejudged(
                    &self.shared,
                    &subject.ctx,
                    subject.protocol,
                    &label,
                    Err(&denial),
                    detail,
                );
            }
        }
    }
}

impl Member for Standing {
    fn replaced(self: Arc<Self>) {
        let mut at = self.lock();
        if !at.closed {
            self.rejudge(&mut at);
        }
    }

    fn close(&self) {
        self.cut.cancel();
    }
}

/// The connection as it was allowed: what is judged again.
#[derive(Debug)]
pub(crate) struct Subject {
    /// Its context (attributed to the authority that allowed it).
    pub(crate) ctx: Ctx,
    /// Its protocol.
    pub(crate) protocol: Protocol,
    /// Its target.
    pub(crate) target: Target,
    /// The vetted address it is connected to.
    pub(crate) pin: SocketAddr,
    /// Its route.
    pub(crate) route: Route,
}

/// A standing's membership of its authority, held by the connection's owner until it
/// closes; dropping it leaves.
#[derive(Debug)]
pub(crate) struct Membership(Arc<Standing>);

impl Drop for Membership {
    fn drop(&mut self) {
        let mut at = self.0.lock();
        at.closed = true;
        if let Some(ended) = at.ended.take() {
            ended.cancel();
        }
        if let Some(key) = at.key.take() {
            at.live.leave(key);
        }
    }
}

/// The standing of a connection just allowed under `live`, and the membership its owner
/// holds until it closes.
pub(crate) fn start(
    shared: &Arc<Shared>,
    live: Arc<Live>,
    subject: Subject,
) -> (Arc<Standing>, Membership) {
    let standing = Arc::new(Standing {
        shared: Arc::clone(shared),
        subject,
        at: Mutex::new(At {
            live,
            key: None,
            closed: false,
            ended: None,
        }),
        cut: CancellationToken::new(),
    });
    standing.enter(&mut standing.lock());
    (Arc::clone(&standing), Membership(standing))
}

/// Judges the connection again under the grant that replaced `live`'s; the successor and
/// the rule that allowed, or why the connection may not continue.
async fn judge_again(
    shared: &Shared,
    live: &Live,
    subject: &Subject,
) -> Result<(Arc<Live>, Option<String>), Denial> {
    let name = live.name();
    let Some(next) = shared.authorities.current_of(&live.authority) else {
        return Err(replaced(
            name,
            "the authority was re-created on a changed channel (socket settings) or revoked since",
        ));
    };
    let (old, new, target) = (&live.authority, &next.authority, &subject.target);
    if subject.ctx.peer.channel() == Channel::Tcp && old.token_sha256 != new.token_sha256 {
        return Err(replaced(
            name,
            "its token changed, and this connection authenticated with the old one",
        ));
    }
    if !subject.protocol.is_forwarding() {
        if new.grant.terminates_tls(target) != old.grant.terminates_tls(target) {
            return Err(replaced(
                name,
                &format!("whether TLS to {target} is terminated changed"),
            ));
        }
        if new.grant.sni_check() && !old.grant.sni_check() {
            return Err(replaced(
                name,
                "the new grant checks SNI, and this tunnel was opened unchecked",
            ));
        }
    }
    let decision = new.grant.decide(target);
    if !decision.is_allow() {
        return Err(Denial::from(decision));
    }
    if let Err(d) = new.grant.vet(target, &[subject.pin.ip()], &shared.own) {
        return Err(Denial::from(d));
    }
    if new.watchdog != old.watchdog {
        crate::watchdog::consult(new, subject.protocol, target, shared.timeouts.watchdog).await?;
    }
    Ok((Arc::clone(&next), decision.rule))
}

/// The denial of a connection that cannot continue under its authority's successor.
fn replaced(name: &str, why: &str) -> Denial {
    Denial::new(
        policy::Reason::UnknownAuthority,
        format!("authority \"{name}\" was replaced by a reload: {why}"),
        "open a new connection; it is decided under the new grant",
    )
}
