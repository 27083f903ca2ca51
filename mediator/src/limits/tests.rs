//! Unit tests of `limits`.

use super::*;
use policy::config::Limits;

fn limits(max: u32, per: u32, unid: u32) -> Limits {
    Limits {
        request_head_bytes: 65536,
        max_connections: max,
        authority_connections: per,
        unidentified_connections: unid,
        idle_upstream_connections: 0,
        authority_idle_upstream_connections: 0,
    }
}

#[test]
fn the_idle_upstream_connections_come_out_of_the_budget() {
    let kept = Limits {
        idle_upstream_connections: 1000,
        ..limits(0, 0, 0)
    };
    let f = InForce::derive(&kept, 20_000, 8);
    assert_eq!(f.max_connections, (20_000 - 128 - 64 - 8 - 1000) / 4);
}

#[test]
fn zeros_are_derived_from_the_open_files_limit() {
    let f = InForce::derive(&limits(0, 0, 0), 20_000, 8);
    assert_eq!(f.max_connections, (20_000 - 128 - 64 - 8) / 4);
    assert_eq!(f.authority_connections, f.max_connections / 4);
    assert_eq!(f.unidentified_connections, f.max_connections / 4);
    assert!(!f.overcommitted());
    let text = f.to_string();
    assert!(text.contains("max_connections = 4950 (derived)"), "{text}");
    assert!(
        f.fields()
            .contains("max_connections=4950 authority_connections=1237")
    );
    // Configured values stay; what is still 0 is derived from them.
    let f = InForce::derive(&limits(1000, 0, 50), 1024, 2);
    assert_eq!((f.max_connections, f.authority_connections), (1000, 250));
    assert_eq!(f.unidentified_connections, 50);
    assert!(
        f.overcommitted(),
        "1000 tunnels need 2000 descriptors of 1024"
    );
    // A tiny limit still leaves a working mediator.
    let f = InForce::derive(&limits(0, 0, 0), 64, 1);
    assert_eq!(
        (
            f.max_connections,
            f.authority_connections,
            f.unidentified_connections
        ),
        (16, 4, 8)
    );
    // A configured cap below the derived shares' floors bounds them.
    let f = InForce::derive(&limits(3, 0, 0), 20_000, 1);
    assert_eq!(
        (
            f.max_connections,
            f.authority_connections,
            f.unidentified_connections
        ),
        (3, 3, 3)
    );
}

fn limiter(max: u32, per: u32, unid: u32) -> Arc<Limiter> {
    Arc::new(Limiter::new(InForce::derive(
        &limits(max, per, unid),
        100_000,
        1,
    )))
}

#[test]
fn an_authority_cap_refuses_with_a_detail_and_gives_slots_back() {
    let lim = limiter(100, 2, 10);
    let counts = Arc::new(AuthorityCounts::new(
        &AuthorityLimits::default(),
        lim.in_force(),
    ));
    let admit = |id| lim.admit(id, Door::Channel, &CancellationToken::new(), || {});
    let (a, b, c) = (admit(1), admit(2), admit(3));
    assert_eq!(a.attribute(&counts, "a"), Attributed::Admitted);
    assert_eq!(b.attribute(&counts, "a"), Attributed::Admitted);
    let Attributed::Refused {
        kind,
        denial,
        fresh: true,
    } = c.attribute(&counts, "a")
    else {
        panic!("a third connection over a cap of 2 was admitted");
    };
    assert_eq!(kind, LimitKind::Connections);
    assert_eq!(
        (denial.reason, denial.http_status()),
        (Reason::RateLimited, 429)
    );
    assert!(
        denial.detail.contains("authority_connections = 2"),
        "{}",
        denial.detail
    );
    // Asked again, a refused connection stays refused with the same denial.
    assert_eq!(
        c.attribute(&counts, "a"),
        Attributed::Refused {
            kind: LimitKind::Connections,
            denial,
            fresh: false
        }
    );
    assert_eq!((counts.open(), lim.open()), (2, 3));
    drop(a);
    let d = admit(4);
    assert_eq!(d.attribute(&counts, "a"), Attributed::Admitted);
    drop((b, c, d));
    assert_eq!((counts.open(), lim.open()), (0, 0));
    assert_eq!(counts.refusing.load(Ordering::Acquire), 0);
}

#[test]
fn the_rate_bucket_holds_and_says_when_to_retry() {
    let lim = limiter(100, 100, 10);
    let own = AuthorityLimits {
        max_connections: None,
        connect_rate: 1,
        connect_burst: 2,
    };
    let counts = Arc::new(AuthorityCounts::new(&own, lim.in_force()));
    let conns: Vec<_> = (0..3)
        .map(|i| lim.admit(i, Door::Channel, &CancellationToken::new(), || {}))
        .collect();
    assert_eq!(conns[0].attribute(&counts, "a"), Attributed::Admitted);
    assert_eq!(conns[1].attribute(&counts, "a"), Attributed::Admitted);
    let Attributed::Refused {
        kind: LimitKind::Rate,
        denial,
        ..
    } = conns[2].attribute(&counts, "a")
    else {
        panic!("the burst of 2 let a third through");
    };
    assert_eq!(denial.cause, Cause::Limited { retry_after: 1 });
    assert!(
        denial.detail.contains("connect_rate = 1"),
        "{}",
        denial.detail
    );
}

#[test]
fn a_full_unidentified_pool_sheds_its_oldest_member() {
    let lim = limiter(100, 10, 2);
    let tokens: Vec<_> = (0..3).map(|_| CancellationToken::new()).collect();
    let shed = AtomicUsize::new(0);
    let on_shed = || {
        shed.fetch_add(1, Ordering::Relaxed);
    };
    let a = lim.admit(1, Door::Tcp, &tokens[0], on_shed);
    let b = lim.admit(2, Door::Tcp, &tokens[1], on_shed);
    assert!(!tokens[0].is_cancelled());
    // Half full or more: the newcomer gets the short head timeout.
    assert_eq!(
        b.head_timeout(Duration::from_secs(10)),
        PRESSURE_HEAD_TIMEOUT
    );
    let c = lim.admit(3, Door::Tcp, &tokens[2], on_shed);
    assert!(tokens[0].is_cancelled() && !tokens[1].is_cancelled());
    assert_eq!(shed.load(Ordering::Relaxed), 1);
    // Identified connections leave the pool and can no longer be shed.
    let counts = Arc::new(AuthorityCounts::new(
        &AuthorityLimits::default(),
        lim.in_force(),
    ));
    assert_eq!(b.attribute(&counts, "a"), Attributed::Admitted);
    let d = lim.admit(4, Door::Tcp, &CancellationToken::new(), on_shed);
    assert!(!tokens[1].is_cancelled());
    drop((a, b, c, d));
    assert_eq!(lim.open(), 0);
}

#[tokio::test]
async fn listeners_wait_at_their_mark_and_resume_below_it() {
    let lim = limiter(16, 4, 8);
    let held: Vec<_> = (0..14)
        .map(|i| lim.admit(i, Door::Channel, &CancellationToken::new(), || {}))
        .collect();
    // TCP stops at 14 (16 - 16/8); the Unix sockets still have room.
    let pressured = AtomicBool::new(false);
    tokio::time::timeout(Duration::from_secs(1), lim.room(Door::Channel, || {}))
        .await
        .unwrap();
    let waiting = tokio::time::timeout(
        Duration::from_millis(50),
        lim.room(Door::Tcp, || pressured.store(true, Ordering::Relaxed)),
    )
    .await;
    assert!(waiting.is_err() && lim.is_pressured());
    assert!(pressured.load(Ordering::Relaxed));
    drop(held);
    tokio::time::timeout(Duration::from_secs(1), lim.room(Door::Tcp, || {}))
        .await
        .unwrap();
    assert!(!lim.is_pressured());
}
