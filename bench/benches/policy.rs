//! Criterion micro-benchmarks of the policy crate: host canonicalisation,
//! `Grant::decide` with grants of 10, 1,000 and 10,000 rules (exact and wildcard entries
//! mixed), and address classification.
//!
//! `cargo bench -p bench --bench policy`; bench/run.sh passes short measurement times.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::IpAddr;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use policy::{Grant, GrantSpec, Target, canonicalize_host, classify, parse_authority_form};

fn canonicalize(c: &mut Criterion) {
    let mut g = c.benchmark_group("canonicalize_host");
    for (name, input) in [
        ("ascii", "api.github.com"),
        ("mixed_case_dot", "API.GitHub.COM."),
        ("idna", "bücher.example"),
        ("ipv4", "203.0.113.7"),
        ("ipv6", "[2001:db8::1]"),
    ] {
        g.bench_with_input(BenchmarkId::from_parameter(name), input, |b, input| {
            b.iter(|| canonicalize_host(black_box(input)));
        });
    }
    g.finish();
}

/// A grant of `n` allow entries: half exact names (`hostI.exampleI.com`, every fourth
/// with a port), half wildcards (`*.zoneI.example.net`), interleaved.
fn grant(n: usize) -> Grant {
    let allow = (0..n)
        .map(|i| match i % 4 {
            0 => format!("host{i}.example{i}.com"),
            1 => format!("*.zone{i}.example.net"),
            2 => format!("host{i}.example{i}.com:443"),
            _ => format!("*.zone{i}.example.org:443"),
        })
        .collect();
    let spec = GrantSpec {
        name: "bench".into(),
        allow,
        deny: vec!["blocked.zone1.example.net".into()],
        ..GrantSpec::default()
    };
    match Grant::new(&spec, &["*:25".into()]) {
        Ok(g) => g,
        Err(e) => panic!("generated grant rejected: {e}"),
    }
}

fn target(s: &str) -> Target {
    match parse_authority_form(s) {
        Ok(t) => t,
        Err(e) => panic!("{s}: {e}"),
    }
}

fn decide(c: &mut Criterion) {
    let mut g = c.benchmark_group("grant_decide");
    for n in [10usize, 1_000, 10_000] {
        let grant = grant(n);
        // Entries near the end of the list: a linear scan would show here.
        let last_exact = (n - 4..n).find(|i| i % 4 == 0).unwrap_or(0);
        let last_wild = (n - 4..n).find(|i| i % 4 == 1).unwrap_or(1);
        let last_port = (n - 4..n).find(|i| i % 4 == 2).unwrap_or(2);
        let cases = [
            (
                "exact_hit",
                target(&format!("host{last_exact}.example{last_exact}.com:443")),
            ),
            (
                "wildcard_hit",
                target(&format!("a.b.zone{last_wild}.example.net:443")),
            ),
            ("miss", target("nowhere.example.com:443")),
            (
                "port_miss",
                // An exact entry limited to port 443, asked for port 80.
                target(&format!("host{last_port}.example{last_port}.com:80")),
            ),
        ];
        for (name, t) in cases {
            g.bench_with_input(BenchmarkId::new(name, n), &t, |b, t| {
                b.iter(|| grant.decide(black_box(t)));
            });
        }
    }
    g.finish();
}

fn classify_addrs(c: &mut Criterion) {
    let mut g = c.benchmark_group("classify");
    for (name, ip) in [
        ("v4_global", "8.8.8.8"),
        ("v4_private", "192.168.1.1"),
        ("v6_global", "2606:4700::1111"),
        ("v6_mapped", "::ffff:10.0.0.1"),
        ("v6_ula", "fd00::1"),
    ] {
        let ip: IpAddr = match ip.parse() {
            Ok(ip) => ip,
            Err(e) => panic!("{ip}: {e}"),
        };
        g.bench_with_input(BenchmarkId::from_parameter(name), &ip, |b, ip| {
            b.iter(|| classify(black_box(*ip)));
        });
    }
    g.finish();
}

criterion_group!(benches, canonicalize, decide, classify_addrs);
criterion_main!(benches);
