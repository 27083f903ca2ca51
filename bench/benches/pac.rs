//! PAC routing throughput: evaluations per second through the mediator's
//! router (`Router::plan`), with the per-host cache (`pac_cache_secs = 300`, the same
//! host again: a cache hit) and without it (`pac_cache_secs = 0`: every call is a QuickJS
//! evaluation on a PAC worker thread). The script is the corporate example from
//! `examples/proxy.pac`, minus DNS lookups (those would measure the resolver).
//!
//! `cargo bench -p bench --bench pac`; criterion's `thrpt` line is evaluations per second.

// A benchmark, like a test: a broken setup should stop it loudly.
#![allow(clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mediator::resolve::Resolver;
use mediator::route::{Router, Via};
use policy::parse_authority_form;

const SCRIPT: &str = r#"
function FindProxyForURL(url, host) {
    if (isPlainHostName(host) || dnsDomainIs(host, ".corp.example"))
        return "DIRECT";
    if (shExpMatch(host, "*.internal.example") ||
        (/^\d+\.\d+\.\d+\.\d+$/.test(host) && isInNet(host, "10.0.0.0", "255.0.0.0")))
        return "PROXY 127.0.0.1:3128";
    if (shExpMatch(url, "https://*.github.com/*") || dnsDomainIs(host, ".npmjs.org"))
        return "PROXY 127.0.0.1:3128; SOCKS5 127.0.0.1:1080";
    return "PROXY 127.0.0.1:3128; DIRECT";
}
"#;

fn router(rt: &tokio::runtime::Runtime, cache_secs: u64) -> Arc<Router> {
    let path = std::env::temp_dir().join(format!("bench-pac-{}.pac", std::process::id()));
    std::fs::write(&path, SCRIPT).expect("writing the bench PAC");
    let text = format!(
        "[upstream]\nmode = \"pac\"\npac = {:?}\nallowed_parents = [\"127.0.0.1:3128\", \"127.0.0.1:1080\"]\npac_cache_secs = {cache_secs}\npac_refresh_secs = 0\n",
        path.display().to_string()
    );
    let config = policy::config::parse(&text, "bench.toml").expect("bench config");
    rt.block_on(async {
        // Loopback nameserver that is never asked: the script makes no lookups.
        let resolver = Resolver::new(
            &["127.0.0.1:9".parse().expect("addr")],
            Default::default(),
            Duration::from_secs(1),
        )
        .expect("resolver");
        Router::new(
            &config.upstream,
            &[],
            Arc::new(resolver),
            &config.timeouts,
            |_| None,
        )
        .await
        .expect("router")
    })
}

fn pac(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("pac_plan");
    g.throughput(Throughput::Elements(1));

    let cached = router(&rt, 300);
    let target = parse_authority_form("api.github.com:443").expect("target");
    g.bench_function("cached", |b| {
        b.iter(|| rt.block_on(cached.plan(Via::Tunnel, black_box(&target))));
    });

    let uncached = router(&rt, 0);
    let targets: Vec<_> = (0..64)
        .map(|i| parse_authority_form(&format!("host{i}.example.net:443")).expect("target"))
        .collect();
    let mut i = 0usize;
    g.bench_function("uncached", |b| {
        b.iter(|| {
            i = (i + 1) % targets.len();
            rt.block_on(uncached.plan(Via::Tunnel, black_box(&targets[i])))
        });
    });
    g.finish();
}

criterion_group!(benches, pac);
criterion_main!(benches);
