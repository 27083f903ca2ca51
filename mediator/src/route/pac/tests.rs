//! Unit tests of `mod`.

use super::*;
use std::collections::BTreeMap;

fn env() -> HelperEnv {
    let mut hosts = BTreeMap::new();
    hosts.insert(
        "intranet.corp".to_owned(),
        vec!["10.1.2.3".parse().unwrap()],
    );
    hosts.insert(
        "dual.corp".to_owned(),
        vec!["2001:db8::5".parse().unwrap(), "192.0.2.5".parse().unwrap()],
    );
    // Explicit loopback nameserver that nothing answers on: unknown names fail fast
    // with "no records"/timeout, never reaching the network.
    let resolver = Resolver::new(
        &["127.0.0.1:9".parse().unwrap()],
        hosts,
        Duration::from_secs(1),
    )
    .unwrap();
    HelperEnv {
        resolver: Arc::new(resolver),
        handle: Handle::current(),
    }
}

fn limits() -> Limits {
    Limits {
        cpu: Duration::from_millis(200),
        memory: 8 << 20,
        dns_timeout: Duration::from_secs(1),
    }
}

async fn pac(script: &str) -> Pac {
    Pac::start(script.to_owned(), limits(), env(), 1)
        .await
        .unwrap()
}

/// Evaluates `expr` (a JS expression) through a FindProxyForURL that returns it as a
/// string.
async fn eval(p: &Pac, url: &str, host: &str) -> String {
    p.find(url, host).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_helpers() {
    let p = pac(r#"
        function FindProxyForURL(url, host) {
            var r = [];
            r.push(isPlainHostName("www"), isPlainHostName("www.corp"));
            r.push(dnsDomainIs("www.corp.example", ".corp.example"), dnsDomainIs("www", ".corp.example"));
            r.push(localHostOrDomainIs("www", "www.corp.example"), localHostOrDomainIs("www.corp.example", "www.corp.example"), localHostOrDomainIs("home", "www.corp.example"));
            r.push(isResolvable("intranet.corp"), isResolvable("nowhere.invalid"));
            r.push(isInNet("intranet.corp", "10.0.0.0", "255.0.0.0"), isInNet("10.1.2.3", "10.1.0.0", "255.255.0.0"), isInNet("192.168.1.1", "10.0.0.0", "255.0.0.0"));
            r.push(dnsResolve("intranet.corp"), dnsResolve("nowhere.invalid"), dnsResolve("dual.corp"));
            r.push(convert_addr("10.1.2.3"), dnsDomainLevels("a.b.c"), dnsDomainLevels("www"));
            r.push(shExpMatch("http://x.corp.example/a", "*.corp.example/*"), shExpMatch("abc", "a?c"), shExpMatch("abcd", "a?c"), shExpMatch("a.b", "a*b"), shExpMatch("axb", "a.b"));
            r.push(weekdayRange("SUN", "SAT"), weekdayRange("FOO"), dateRange(1, 31) || true, timeRange(0, 23), typeof myIpAddress());
            return r.join(",");
        }"#).await;
    assert_eq!(
        eval(&p, "https://x/", "x").await,
        "true,false,true,false,true,true,false,true,false,true,true,false,10.1.2.3,,192.0.2.5,167838211,2,0,true,true,false,true,false,true,false,true,true,string"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ex_helpers() {
    let p = pac(r#"
        function FindProxyForURLEx(url, host) {
            var r = [];
            r.push(dnsResolveEx("dual.corp"), dnsResolveEx("nowhere.invalid") === "", isResolvableEx("dual.corp"), isResolvableEx("nowhere.invalid"));
            r.push(isInNetEx("2001:db8::5", "2001:db8::/32"), isInNetEx("192.0.2.5", "192.0.2.0/24"), isInNetEx("192.0.3.5", "192.0.2.0/24"), isInNetEx("dual.corp", "192.0.2.0/24"));
            r.push(sortIpAddressList("10.2.3.9;2001:4898::1;::1;10.2.3.1"), sortIpAddressList("x;1.2.3.4"));
            r.push(getClientVersion(), typeof myIpAddressEx());
            return r.join("|");
        }
        function FindProxyForURL(url, host) { return "never"; }"#).await;
    assert_eq!(
        eval(&p, "https://x/", "x").await,
        "2001:db8::5;192.0.2.5|true|true|false|true|true|false|false|::1;2001:4898::1;10.2.3.1;10.2.3.9|false|1.0|string"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_cut_off_and_the_engine_recovers() {
    let p = pac(r#"
        function FindProxyForURL(url, host) {
            if (host == "loop") { while (true) {} }
            if (host == "big") { var s = "x"; while (true) { s = s + s; } }
            if (host == "buf") { return String(new ArrayBuffer(1 << 30).byteLength); }
            if (host == "deep") { var f = function(n) { return f(n + 1) + 1; }; return String(f(0)); }
            if (host == "throw") { throw new Error("boom"); }
            if (host == "num") { return 42; }
            return "DIRECT";
        }"#).await;
    let started = Instant::now();
    assert!(matches!(
        p.find("https://loop/", "loop").await,
        Err(PacError::Cpu(_))
    ));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(
            p.find("https://big/", "big").await,
            Err(PacError::Memory(_))
        ),
        "{:?}",
        p.find("https://big/", "big").await
    );
    assert!(matches!(
        p.find("https://buf/", "buf").await,
        Err(PacError::Memory(_))
    ));
    assert!(matches!(
        p.find("https://deep/", "deep").await,
        Err(PacError::Script(_))
    ));
    let e = p.find("https://throw/", "throw").await.unwrap_err();
    assert_eq!(e, PacError::Script("boom".into()));
    assert!(matches!(
        p.find("https://num/", "num").await,
        Err(PacError::BadAnswer(_))
    ));
    assert_eq!(eval(&p, "https://ok/", "ok").await, "DIRECT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_pac_routes_as_documented() {
    let p = pac(include_str!("../../../../examples/proxy.pac")).await;
    for (url, host, want) in [
        ("https://wiki/", "wiki", "DIRECT"),
        ("https://git.corp.example/", "git.corp.example", "DIRECT"),
        ("https://intranet.corp/", "intranet.corp", "DIRECT"),
        (
            "https://registry.npmjs.org/",
            "registry.npmjs.org",
            "PROXY proxy-fast.corp.example:3128; PROXY proxy.corp.example:8080",
        ),
        (
            "https://192.0.2.5/",
            "192.0.2.5",
            "PROXY proxy.corp.example:8080; SOCKS5 socks.corp.example:1080",
        ),
    ] {
        assert_eq!(eval(&p, url, host).await, want, "{host}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_scripts_are_refused_and_the_last_good_copy_stays() {
    for bad in [
        "function FindProxyForURL(url, host) { return 'DIRECT' ",
        "var x = 1;",
        "while (true) {}",
        "throw 'no';",
    ] {
        assert!(
            Pac::start(bad.into(), limits(), env(), 1).await.is_err(),
            "{bad}"
        );
    }
    let p = pac("function FindProxyForURL(u, h) { return 'PROXY a:1'; }").await;
    assert!(p.install("garbage(".into()).await.is_err());
    assert_eq!(eval(&p, "https://x/", "x").await, "PROXY a:1");
    assert!(
        p.install("function FindProxyForURL(u, h) { return 'PROXY b:2'; }".into())
            .await
            .unwrap()
    );
    assert_eq!(eval(&p, "https://x/", "x").await, "PROXY b:2");
}
