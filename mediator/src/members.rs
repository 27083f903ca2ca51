//! The allowed connections of one live authority, and the one task per authority that
//! tells them when a reload replaced it and when their cut comes (design section 5).
//!
//! A connection joins the members of the authority it was allowed under
//! ([`Members::join`]) and leaves when it closes, or when a reload's judgement moves it
//! to the successor. Nothing runs per connection while it waits: the authority's watcher
//! task, spawned at the first join, waits on the authority's two signals and walks the
//! members when one fires.
//!
//! - *Replaced* (a reload registered a successor): every member is told once
//!   ([`Member::replaced`]) and judges itself again; a member that joins after that walk
//!   is told so by `join` and judges itself at once. The replaced signal is watched before
//!   the closing one: a reload registers the successor before its predecessor's grace can
//!   start.
//! - *Closing* (revoke grace or shutdown grace over): every member still here is cut
//!   ([`Member::close`]); a later join is refused ([`Joined::Closing`]).
//!
//! Each walk takes its snapshot and sets its flag under the same lock a join takes, so a
//! member is told of each signal exactly once, by the walk or by its join.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio_util::sync::CancellationToken;

/// What a live authority's connection is told.
pub(crate) trait Member: Send + Sync {
    /// A reload re-created the authority the member is joined to: it judges itself again
    /// under the successor (and leaves if it moves there). Must not block: the walk tells
    /// every member in turn.
    fn replaced(self: Arc<Self>);
    /// The authority's connections must close now.
    fn close(&self);
}

/// A member's place, for [`Members::leave`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key(u64);

/// The outcome of [`Members::join`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Joined {
    /// Joined under `key`. `replaced`: the authority was already replaced (the walk is
    /// over), so the member judges itself again now.
    Member {
        /// Its place.
        key: Key,
        /// Whether a successor was already registered.
        replaced: bool,
    },
    /// The authority's connections are closing: not joined; the member is cut at once.
    Closing,
}

/// The members of one live authority.
pub(crate) struct Members {
    replaced: CancellationToken,
    closing: CancellationToken,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    joined: HashMap<Key, Weak<dyn Member>>,
    /// The watcher task is spawned.
    watched: bool,
    /// The replaced walk has taken its snapshot.
    replaced: bool,
    /// The closing walk has taken its snapshot.
    closed: bool,
}

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("Members")
            .field("joined", &inner.joined.len())
            .field("replaced", &inner.replaced)
            .field("closed", &inner.closed)
            .finish_non_exhaustive()
    }
}

impl Members {
    /// The members of an authority whose signals are `replaced` and `closing`.
    pub(crate) fn new(replaced: CancellationToken, closing: CancellationToken) -> Self {
        Self {
            replaced,
            closing,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Adds `member`, starting the watcher task (on the current tokio runtime) at the
    /// first join.
    pub(crate) fn join(self: &Arc<Self>, member: Weak<dyn Member>) -> Joined {
        let mut inner = self.lock();
        if inner.closed {
            return Joined::Closing;
        }
        let key = Key(inner.next);
        inner.next += 1;
        inner.joined.insert(key, member);
        if !inner.watched {
            inner.watched = true;
            tokio::spawn(watch(
                Arc::downgrade(self),
                self.replaced.clone(),
                self.closing.clone(),
            ));
        }
        Joined::Member {
            key,
            replaced: inner.replaced,
        }
    }

    /// Removes the member at `key` (a no-op if it was not there).
    pub(crate) fn leave(&self, key: Key) {
        self.lock().joined.remove(&key);
    }

    /// The members now, with `flag` set under the same lock.
    fn walk(&self, flag: fn(&mut Inner) -> &mut bool) -> Vec<Arc<dyn Member>> {
        let mut inner = self.lock();
        *flag(&mut inner) = true;
        inner.joined.values().filter_map(Weak::upgrade).collect()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The watcher: tells the members of the replacement, then of the closing. Ends with the
/// closing walk, or when the members are gone (the authority dropped).
async fn watch(members: Weak<Members>, replaced: CancellationToken, closing: CancellationToken) {
    let was_replaced = tokio::select! {
        biased;
        () = replaced.cancelled() => true,
        () = closing.cancelled() => false,
    };
    if was_replaced {
        let Some(m) = members.upgrade() else { return };
        for member in m.walk(|i| &mut i.replaced) {
            member.replaced();
        }
        drop(m);
        closing.cancelled().await;
    }
    let Some(m) = members.upgrade() else { return };
    for member in m.walk(|i| &mut i.closed) {
        member.close();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Default)]
    struct Counting {
        replaced: AtomicUsize,
        closed: AtomicUsize,
    }

    impl Member for Counting {
        fn replaced(self: Arc<Self>) {
            self.replaced.fetch_add(1, Ordering::SeqCst);
        }
        fn close(&self) {
            self.closed.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn weak(c: &Arc<Counting>) -> Weak<dyn Member> {
        let w: Weak<dyn Member> = Arc::downgrade(c) as Weak<dyn Member>;
        w
    }

    /// Members watching two new signals: the replacement signal, the closing signal, the
    /// members.
    fn watched() -> (CancellationToken, CancellationToken, Arc<Members>) {
        let (replaced, closing) = (CancellationToken::new(), CancellationToken::new());
        let members = Arc::new(Members::new(replaced.clone(), closing.clone()));
        (replaced, closing, members)
    }

    /// Lets the watcher task run to its next wait (current-thread runtime).
    async fn settle() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn each_member_is_told_of_each_signal_once_by_the_walk_or_its_join() {
        let (replaced, closing, members) = watched();
        let (early, left, late) = (
            Arc::new(Counting::default()),
            Arc::new(Counting::default()),
            Arc::new(Counting::default()),
        );
        assert!(matches!(
            members.join(weak(&early)),
            Joined::Member {
                replaced: false,
                ..
            }
        ));
        let Joined::Member { key, .. } = members.join(weak(&left)) else {
            panic!("not closing yet")
        };
        members.leave(key);
        replaced.cancel();
        settle().await;
        assert_eq!(early.replaced.load(Ordering::SeqCst), 1);
        assert_eq!(left.replaced.load(Ordering::SeqCst), 0, "it had left");
        // After the walk, a joiner judges itself: told by its join, not by the walk.
        assert!(matches!(
            members.join(weak(&late)),
            Joined::Member { replaced: true, .. }
        ));
        settle().await;
        assert_eq!(late.replaced.load(Ordering::SeqCst), 0);
        closing.cancel();
        settle().await;
        assert_eq!(early.closed.load(Ordering::SeqCst), 1);
        assert_eq!(late.closed.load(Ordering::SeqCst), 1);
        assert_eq!(left.closed.load(Ordering::SeqCst), 0);
        assert_eq!(members.join(weak(&late)), Joined::Closing);
        // The cut members stay until they leave (as its Debug output, what an operator sees).
        assert!(format!("{members:?}").contains("joined: 2"), "{members:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn closing_without_a_replacement_cuts_without_judging() {
        let (replaced, closing, members) = watched();
        let one = Arc::new(Counting::default());
        let _ = members.join(weak(&one));
        closing.cancel();
        settle().await;
        // A replacement after the cut tells no one.
        replaced.cancel();
        settle().await;
        assert_eq!(one.closed.load(Ordering::SeqCst), 1);
        assert_eq!(one.replaced.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_member_is_skipped() {
        let (replaced, closing, members) = watched();
        let gone = Arc::new(Counting::default());
        let _ = members.join(weak(&gone));
        drop(gone);
        replaced.cancel();
        closing.cancel();
        settle().await;
        // A dead entry, skipped by both walks, stays until its connection leaves.
        assert!(format!("{members:?}").contains("joined: 1"), "{members:?}");
    }
}
