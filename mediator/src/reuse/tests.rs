//! The pool's bookkeeping with stand-in connections: which is taken, which a cap drops,
//! and when a kept one leaves by itself. The pool with real connections is proven by the
//! end-to-end suite (`tls::reuse`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use policy::OwnAddrs;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::route::Route;

/// A stand-in connection: a number, whether it is alive, its end.
#[derive(Debug)]
struct Fake {
    n: u32,
    alive: Arc<AtomicBool>,
    ended: CancellationToken,
}

impl Fake {
    fn new(n: u32) -> Self {
        Self {
            n,
            alive: Arc::new(AtomicBool::new(true)),
            ended: CancellationToken::new(),
        }
    }
}

impl Reusable for Fake {
    fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst) && !self.ended.is_cancelled()
    }

    fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }
}

fn pool(total: usize, per_authority: usize, idle: Duration) -> Arc<Pool<Fake>> {
    Arc::new(Pool::new(Caps {
        total,
        per_authority,
        idle,
    }))
}

const LONG: Duration = Duration::from_secs(3600);

/// A ticket of authority generation `generation` to `host:443` over `route`, with its
/// authority's signals.
fn ticket(generation: u64, host: &str, route: Route) -> (Ticket, CancellationToken) {
    let target = policy::parse_authority_form(&format!("{host}:443")).expect("target");
    let spec = policy::GrantSpec {
        name: "a".into(),
        allow: vec![host.into()],
        allow_private: vec!["127.0.0.0/8".into()],
        ..policy::GrantSpec::default()
    };
    let grant = policy::Grant::new(&spec, &[]).expect("grant");
    let pin = grant
        .vet(
            &target,
            &["127.0.0.1".parse().expect("ip")],
            &OwnAddrs(Vec::new()),
        )
        .expect("pin");
    let stop = CancellationToken::new();
    let ticket = Ticket {
        key: Key {
            generation,
            target,
            pin: pin.addrs().to_vec(),
            route,
        },
        pin,
        stop: stop.clone(),
    };
    (ticket, stop)
}

#[tokio::test]
async fn the_newest_live_connection_of_the_same_key_is_taken() {
    let pool = pool(8, 8, LONG);
    let (t, _) = ticket(1, "a.test", Route::Direct);
    assert!(pool.give(&t, Fake::new(1)));
    assert!(pool.give(&t, Fake::new(2)));
    assert_eq!(pool.held(&t), (2, 2));
    assert_eq!(pool.take(&t).map(|c| c.n), Some(2));
    assert_eq!(pool.take(&t).map(|c| c.n), Some(1));
    assert!(pool.take(&t).is_none());
    assert_eq!(pool.held(&t), (0, 0));
}

#[tokio::test]
async fn another_authority_host_or_route_never_takes_it() {
    let pool = pool(8, 8, LONG);
    let (t, _) = ticket(1, "a.test", Route::Direct);
    assert!(pool.give(&t, Fake::new(1)));
    for other in [
        ticket(2, "a.test", Route::Direct).0,
        ticket(1, "b.test", Route::Direct).0,
        ticket(1, "a.test", Route::Parent(0)).0,
        t.clone().routed(Route::Parent(0)),
    ] {
        assert!(pool.take(&other).is_none(), "{other:?}");
    }
    assert_eq!(pool.take(&t).map(|c| c.n), Some(1));
}

#[tokio::test]
async fn a_dead_connection_is_neither_kept_nor_taken() {
    let pool = pool(8, 8, LONG);
    let (t, _) = ticket(1, "a.test", Route::Direct);
    let dead = Fake::new(1);
    dead.alive.store(false, Ordering::SeqCst);
    assert!(!pool.give(&t, dead));
    let dying = Fake::new(2);
    let alive = Arc::clone(&dying.alive);
    assert!(pool.give(&t, Fake::new(3)));
    assert!(pool.give(&t, dying));
    alive.store(false, Ordering::SeqCst);
    // The newest is dead: dropped on the way to the one below it.
    assert_eq!(pool.take(&t).map(|c| c.n), Some(3));
    assert_eq!(pool.held(&t), (0, 0));
}

#[tokio::test]
async fn the_authority_cap_drops_its_own_oldest() {
    let pool = pool(8, 2, LONG);
    let (t, _) = ticket(1, "a.test", Route::Direct);
    let (other, _) = ticket(2, "a.test", Route::Direct);
    assert!(pool.give(&other, Fake::new(10)));
    for n in 1..=3 {
        assert!(pool.give(&t, Fake::new(n)));
    }
    assert_eq!(pool.held(&t), (3, 2));
    assert_eq!(pool.take(&t).map(|c| c.n), Some(3));
    assert_eq!(pool.take(&t).map(|c| c.n), Some(2));
    assert!(pool.take(&t).is_none());
    assert_eq!(pool.take(&other).map(|c| c.n), Some(10));
}

#[tokio::test]
async fn at_the_total_cap_the_largest_holder_yields() {
    let pool = pool(3, 3, LONG);
    let (a, _) = ticket(1, "a.test", Route::Direct);
    let (b, _) = ticket(2, "a.test", Route::Direct);
    for n in 1..=3 {
        assert!(pool.give(&a, Fake::new(n)));
    }
    // b holds nothing: a's oldest makes room.
    assert!(pool.give(&b, Fake::new(10)));
    assert_eq!(pool.held(&a), (3, 2));
    assert_eq!(pool.held(&b), (3, 1));
    // a is still the largest: it yields its own oldest again.
    assert!(pool.give(&a, Fake::new(4)));
    assert_eq!(pool.held(&a), (3, 2));
    assert_eq!(pool.take(&b).map(|c| c.n), Some(10));
    assert_eq!(pool.take(&a).map(|c| c.n), Some(4));
    assert_eq!(pool.take(&a).map(|c| c.n), Some(3));
    assert!(pool.take(&a).is_none());
}

#[tokio::test]
async fn caps_of_zero_keep_nothing() {
    for (total, per) in [(0, 4), (4, 0)] {
        let pool = pool(total, per, LONG);
        let (t, _) = ticket(1, "a.test", Route::Direct);
        assert!(!pool.give(&t, Fake::new(1)));
        assert_eq!(pool.held(&t), (0, 0));
    }
}

#[tokio::test(start_paused = true)]
async fn a_kept_connection_leaves_when_idle_too_long_or_ended() {
    let pool = pool(8, 8, Duration::from_secs(4));
    let (t, _) = ticket(1, "a.test", Route::Direct);
    let first = Fake::new(1);
    let ended = first.ended.clone();
    assert!(pool.give(&t, first));
    assert!(pool.give(&t, Fake::new(2)));
    ended.cancel();
    tokio::task::yield_now().await;
    assert_eq!(pool.held(&t), (1, 1));
    tokio::time::sleep(Duration::from_secs(5)).await;
    tokio::task::yield_now().await;
    assert_eq!(pool.held(&t), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_revoked_authority_loses_its_connections_and_keeps_none() {
    let pool = pool(8, 8, LONG);
    let (t, stop) = ticket(1, "a.test", Route::Direct);
    assert!(pool.give(&t, Fake::new(1)));
    stop.cancel();
    tokio::task::yield_now().await;
    assert_eq!(pool.held(&t), (0, 0));
    assert!(!pool.give(&t, Fake::new(2)));
    assert!(pool.take(&t).is_none());
}
