//! An allowed connection's standing under its authority, from its decision to its close
//! (design section 5): what cuts it, and what a reload that changes its authority does.
//!
//! Every allowed connection (a tunnel, a terminated tunnel, a forwarding connection to an
//! origin) gets a [`Standing`] from `establish`: the live authority it runs under and a
//! cut signal of its own, which its relay (or server) ends on. A watcher, [`keep`], runs
//! beside it until it closes:
//!
//! - its authority revoked, or the shutdown grace over: the cut comes when the
//!   authority's connections must close (after the revoke grace, or at once);
//! - its authority re-created by a reload (a changed table, same channel): the
//!   connection is judged again under the new grant ([`judge_again`]): the same
//!   credential (on the TCP listener), the same TLS handling, the grant's name decision,
//!   the pinned address vetted again, and the new watchdog asked if it changed. Still
//!   allowed, it continues under the new generation: its slot moves to the new counts and
//!   one decision line says so. No longer allowed, one decision line says why, and the
//!   cut comes when the old generation's grace ends.
//!
//! A cut is never an end the client could take for the origin's: the relay resets both
//! sockets (`crate::relay`).

use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

use policy::Target;
use policy::config::Authority;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::record::{self, Allowed};
use super::{Ctx, TargetLabel};
use crate::authorities::Live;
use crate::denial::Denial;
use crate::route::Route;
use crate::shared::Shared;
use crate::vocab::{Channel, Protocol};

/// The authority an allowed connection runs under, and its cut signal.
#[derive(Debug)]
pub(crate) struct Standing {
    live: RwLock<Arc<Live>>,
    cut: CancellationToken,
}

impl Standing {
    /// The authority the connection runs under now (its successor's after a reload that
    /// kept it).
    pub(crate) fn authority(&self) -> Arc<Authority> {
        Arc::clone(&self.live().authority)
    }

    /// Cancelled when the connection must be cut.
    pub(crate) fn cut_signal(&self) -> CancellationToken {
        self.cut.clone()
    }

    fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live.read().unwrap_or_else(PoisonError::into_inner))
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

/// The standing of a connection just allowed under `live`, and the guard its owner holds
/// until it closes (dropping the guard stops the watcher).
pub(crate) fn start(
    shared: &Arc<Shared>,
    live: Arc<Live>,
    subject: Subject,
) -> (Arc<Standing>, DropGuard) {
    let standing = Arc::new(Standing {
        live: RwLock::new(live),
        cut: CancellationToken::new(),
    });
    let done = CancellationToken::new();
    tokio::spawn(keep(
        Arc::clone(shared),
        Arc::clone(&standing),
        subject,
        done.clone(),
    ));
    (standing, done.drop_guard())
}

/// Watches the connection's authority until `done` (the connection closed) or the cut.
async fn keep(
    shared: Arc<Shared>,
    standing: Arc<Standing>,
    subject: Subject,
    done: CancellationToken,
) {
    let label = TargetLabel::from(&subject.target);
    loop {
        let live = standing.live();
        let (closing, replaced) = (live.closing_signal(), live.replaced_signal());
        // A replacement is registered before its predecessor's grace starts: judging
        // again comes first.
        tokio::select! {
            biased;
            () = done.cancelled() => return,
            () = replaced.cancelled() => {}
            () = closing.cancelled() => {
                standing.cut.cancel();
                return;
            }
        }
        let judged = tokio::select! {
            biased;
            () = done.cancelled() => return,
            // Boxed: only a reload gets here; every connection carries this future.
            j = Box::pin(judge_again(&shared, &live, &subject)) => j,
            () = closing.cancelled() => {
                standing.cut.cancel();
                return;
            }
        };
        match judged {
            Ok((next, rule)) => {
                subject.ctx.admission.transfer(&next.counts);
                let ctx = subject.ctx.attributed(&next.authority);
                let detail = format!(
                    "judged again after a reload: still allowed, continues under generation {} (was {})",
                    next.generation, live.generation
                );
                let allow = Allowed {
                    rule: rule.as_deref(),
                    pin: subject.pin,
                    route: shared.route_label(subject.route),
                };
                record::rejudged(&shared, &ctx, subject.protocol, &label, Ok(allow), detail);
                *standing
                    .live
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = next;
            }
            Err(denial) => {
                let detail = format!(
                    "judged again after a reload: {}; the connection is cut when generation {}'s revoke grace ends",
                    denial.detail, live.generation
                );
                record::rejudged(
                    &shared,
                    &subject.ctx,
                    subject.protocol,
                    &label,
                    Err(&denial),
                    detail,
                );
                tokio::select! {
                    () = done.cancelled() => {}
                    () = closing.cancelled() => standing.cut.cancel(),
                }
                return;
            }
        }
    }
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

#[cfg(test)]
mod tests {
    #![allow(unreachable_code, clippy::diverging_sub_expression)]

    /// The size of the future `make` would return, without calling it.
    fn future_size<F, Fut>(_make: F) -> usize
    where
        F: FnOnce() -> Fut,
    {
        size_of::<Fut>()
    }

    /// Every allowed connection's watcher task holds this future for the connection's
    /// whole life (an idle tunnel pays its size in memory); what only a reload needs is
    /// boxed. It was 1,768 bytes with `judge_again` inline, 888 without.
    #[test]
    fn the_watcher_future_stays_small() {
        let keep = future_size(|| {
            super::keep(
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
            )
        });
        assert!(keep <= 1024, "the watcher future is {keep} bytes");
    }
}
