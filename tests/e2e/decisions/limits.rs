//! Limits and fairness (design section 13): an authority's cap and connect rate answered
//! with `429` / SOCKS5 REP 0x02 (logged, counted, then closed); the unidentified TCP pool
//! that sheds its oldest member; the global limit that stops the listeners (`/readyz`
//! 503) while the Unix channels keep working; and, with no `[limits]` keys at all under
//! the soft open-files limit a systemd service gets, one authority holding as many tunnels
//! as it can plus a flood of silent TCP connections while another authority keeps being
//! served; slow heads cut at `request_head`; a 10 MiB head refused with memory bounded.
//!
//! Latency under abuse is measured by the benchmark (`bench/fairness.sh`), not here: the
//! bounds below are only "served at all, well before a client would give up".

use e2e::Tool;
use e2e::case;
use e2e::harness::Case;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::socks::{METHOD_USER_PASS, REP_NOT_ALLOWED};
use e2e::{
    AGENT_A, AGENT_B, AuthoritySpec, Fixture, HttpConn, HttpResponse, LOG_TIMEOUT, ORIGIN_HOST,
    SocksTarget, TOKEN_A, TOKEN_B, agent_a_spec, check_deny, retry_for, wait_for,
};
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::support::mediator;

/// A third authority, on its Unix socket only.
const AGENT_C: &str = "agent-c";

fn authority(name: &str, token: Option<&str>) -> AuthoritySpec {
    let spec = AuthoritySpec::new(name)
        .allow(&[ORIGIN_HOST])
        .allow_private(&["127.0.0.0/8"]);
    match token {
        Some(t) => spec.token(t),
        None => spec,
    }
}

/// `n` CONNECT tunnels to the origin on `name`'s Unix socket, each answered 200.
async fn unix_tunnels(fx: &Fixture, name: &str, n: usize) -> Result<Vec<HttpConn>> {
    let target = fx.origin_target();
    let mut held = Vec::new();
    for _ in 0..n {
        let mut c = fx.unix_conn(name).await?;
        let answer = c.connect(&target, None).await?;
        ensure!(answer.status == 200, "{answer:?}");
        held.push(c);
    }
    Ok(held)
}

/// A CONNECT on `conn` to the origin and one echoed request through the tunnel: proof
/// that the authority is served end to end.
async fn served(fx: &Fixture, mut conn: HttpConn, auth: Option<(&str, &str)>) -> Result<()> {
    let target = fx.origin_target();
    let answer = conn.connect(&target, auth).await?;
    ensure!(
        answer.status == 200,
        "CONNECT: {answer:?} {}",
        answer.text()
    );
    let resp = conn.get(&target, "/still-served", true).await?;
    ensure!(resp.status == 200, "through the tunnel: {resp:?}");
    Ok(())
}

/// Checks a `rate_limited` answer: 429, the JSON deny shape, `Retry-After`, the limit
/// named in the detail, and the connection closed after the answer.
fn check_limited(resp: &HttpResponse, detail_has: &str) -> Result<()> {
    let body = check_deny(resp, 429, "rate_limited")?;
    let detail = body["detail"].as_str().unwrap_or_default();
    ensure!(
        detail.contains(detail_has),
        "detail {detail:?} lacks {detail_has:?}"
    );
    let retry = resp.header("retry-after").context("no Retry-After")?;
    ensure!(
        retry.parse::<u32>().is_ok_and(|s| s >= 1),
        "Retry-After {retry}"
    );
    ensure!(
        resp.header("connection") == Some("close"),
        "a limited connection is closed after its answer: {resp:?}"
    );
    Ok(())
}

async fn the_connect_rate_bucket_holds_and_says_when_to_retry() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .authority(agent_a_spec().raw("connect_rate = 1\nconnect_burst = 2")),
    )
    .await?;
    let target = fx.origin_target();
    // The burst of 2 passes; the third within the second is refused, on either channel.
    for _ in 0..2 {
        let answer = fx.connect_unix(AGENT_A, &target).await?;
        ensure!(answer.status == 200, "{answer:?}");
    }
    let refused = fx.connect_a(&target).await?;
    check_limited(&refused, "connect_rate = 1")?;
    let line = fx
        .mediator
        .wait_for_decision("rate_limited", Some(ORIGIN_HOST))
        .await?;
    ensure!(
        line["authority"] == AGENT_A && line["decision"] == "deny",
        "{line}"
    );
    let metrics = fx.mediator.metrics().await?;
    let limited = metrics.get(
        "mediator_limited_total",
        &[("authority", AGENT_A), ("limit", "rate")],
    );
    ensure!(limited == 1.0, "mediator_limited_total{{rate}} = {limited}");
    // After the time the answer named, a token is back.
    let retry: u64 = refused.header("retry-after").unwrap_or("1").parse()?;
    retry_for(
        Duration::from_secs(retry + 5),
        async || Ok((fx.connect_unix(AGENT_A, &target).await?.status == 200).then_some(())),
        || "the bucket never refilled".into(),
    )
    .await
}

async fn an_authority_at_its_cap_is_refused_on_every_channel_until_one_closes() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .authority(agent_a_spec().raw("max_connections = 2"))
            .authority(authority(AGENT_B, Some(TOKEN_B))),
    )
    .await?;
    let target = fx.origin_target();
    let mut held = unix_tunnels(&fx, AGENT_A, 2).await?;
    // The cap counts client connections, whatever channel they came on.
    check_limited(
        &fx.connect_unix(AGENT_A, &target).await?,
        "max_connections = 2",
    )?;
    check_limited(&fx.connect_a(&target).await?, "max_connections = 2")?;
    let mut socks = fx.socks().await?;
    ensure!(socks.greet(&[METHOD_USER_PASS]).await? == METHOD_USER_PASS);
    ensure!(socks.auth(AGENT_A, TOKEN_A).await? == 0);
    let reply = socks
        .request(
            0x01,
            &SocksTarget::Domain(ORIGIN_HOST.into(), fx.origin.port()),
        )
        .await?;
    ensure!(
        reply.rep == REP_NOT_ALLOWED,
        "SOCKS5 over the cap: {reply:?}"
    );
    // Another authority is not affected.
    served(&fx, fx.tcp_conn().await?, Some((AGENT_B, TOKEN_B))).await?;
    let metrics = fx.mediator.metrics().await?;
    ensure!(
        metrics.get(
            "mediator_limited_total",
            &[("authority", AGENT_A), ("limit", "connections")]
        ) == 3.0
            && metrics.get("mediator_open_connections", &[("authority", AGENT_A)]) == 2.0,
        "limited/open: {:?}",
        metrics.family("mediator_limited_total")
    );
    let listed = fx.mediator.admin_get("/v1/authorities").await?;
    let a = listed["authorities"]
        .as_array()
        .and_then(|l| l.iter().find(|a| a["name"] == AGENT_A))
        .context("agent-a listed")?;
    ensure!(
        a["limits"]
            == json!({"max_connections": 2, "connect_rate": 0, "connect_burst": 1, "open_connections": 2}),
        "{a}"
    );
    // One tunnel closes: its slot is given back.
    drop(held.pop());
    retry_for(
        LOG_TIMEOUT,
        async || Ok((fx.connect_unix(AGENT_A, &target).await?.status == 200).then_some(())),
        || "the slot of a closed tunnel was never given back".into(),
    )
    .await
}

/// A revoked authority still holds its connections during its grace, and none once the
/// grace has cut them: `mediator_open_connections` says so, and then 0, not the count it
/// had when revoked.
async fn a_revoked_authority_shows_no_open_connections_after_its_cut() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .timeout("revoke_grace", 3)
            .authority(agent_a_spec())
            .authority(authority(AGENT_B, Some(TOKEN_B))),
    )
    .await?;
    let target = fx.origin_target();
    let mut held = unix_tunnels(&fx, AGENT_A, 3).await?;
    let open = |m: &e2e::PromText| m.get("mediator_open_connections", &[("authority", AGENT_A)]);
    let before = open(&fx.mediator.metrics().await?);
    ensure!(before == 3.0, "open before the revoke: {before}");
    let answer = fx.mediator.revoke(AGENT_A).await?;
    ensure!(answer.status == 200, "{answer:?}");
    // Within the grace (3 s; this scrape follows the revoke at once) they are still held.
    let during = open(&fx.mediator.metrics().await?);
    ensure!(during == 3.0, "open during the grace: {during}");
    for c in &mut held {
        ensure!(
            c.closes_within(Duration::from_secs(10)).await,
            "a tunnel outlived the revoke grace"
        );
    }
    retry_for(
        LOG_TIMEOUT,
        async || Ok((open(&fx.mediator.metrics().await?) == 0.0).then_some(())),
        || "mediator_open_connections of the revoked authority never went back to 0".into(),
    )
    .await?;
    // Another authority's count is still its own.
    let mut b = fx.tcp_conn().await?;
    ensure!(b.connect(&target, Some((AGENT_B, TOKEN_B))).await?.status == 200);
    let metrics = fx.mediator.metrics().await?;
    let b_open = metrics.get("mediator_open_connections", &[("authority", AGENT_B)]);
    ensure!(b_open == 1.0, "agent-b open: {b_open}");
    Ok(())
}

async fn a_full_unidentified_pool_sheds_its_oldest_silent_member() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .limits_line("unidentified_connections = 4")
            .authority(agent_a_spec()),
    )
    .await?;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(fx.tcp_conn().await?);
    }
    // Connections are accepted in the order they connected: when the fifth is admitted,
    // the pool holds the first four.
    let fifth = fx.tcp_conn().await?;
    // The oldest, which never sent a head, is closed to admit the newcomer.
    let mut oldest = silent.remove(0);
    ensure!(
        oldest.closes_within(LOG_TIMEOUT).await,
        "the oldest silent connection was not shed"
    );
    // A client that sends its head at once is served.
    served(&fx, fifth, Some((AGENT_A, TOKEN_A))).await?;
    let metrics = fx.mediator.metrics().await?;
    let shed = metrics.get(
        "mediator_limited_total",
        &[("authority", "-"), ("limit", "unidentified")],
    );
    ensure!(shed >= 1.0, "unidentified sheds counted: {shed}");
    // And it is a decision line, as every refusal is.
    let line = fx
        .mediator
        .wait_for_log(
            |v| {
                v["reason"] == "rate_limited"
                    && v["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains("unidentified pool"))
            },
            LOG_TIMEOUT,
        )
        .await?;
    ensure!(
        line["authority"].is_null() && line["host"].is_null(),
        "{line}"
    );
    Ok(())
}

async fn at_max_connections_the_tcp_listener_waits_readyz_says_so_and_channels_still_work()
-> Result<()> {
    // 16 in all: the TCP listener stops at 14, the Unix sockets at 16.
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .limits_line(
                "max_connections = 16\nauthority_connections = 100\nunidentified_connections = 100",
            )
            .authority(agent_a_spec())
            .authority(authority(AGENT_C, None)),
    )
    .await?;
    let m = &fx.mediator;
    let mut held = Vec::new();
    for _ in 0..14 {
        held.push(fx.tunnel_a().await?);
    }
    // The 15th TCP client is not accepted (it waits in the listen queue, unanswered).
    let mut waiting = fx.tcp_conn().await?;
    waiting
        .send(format!("CONNECT {} HTTP/1.1\r\n", fx.origin_target()).as_bytes())
        .await?;
    m.wait_for_stderr(
        |l| l.contains("reached the limit (max_connections = 16)"),
        LOG_TIMEOUT,
    )
    .await?;
    let ready = m.admin("GET", "/readyz", None, None).await?;
    ensure!(ready.status == 503, "/readyz at the limit: {ready:?}");
    // The admin API and the Unix channels still work.
    served(&fx, fx.unix_conn(AGENT_C).await?, None).await?;
    let metrics = m.metrics().await?;
    ensure!(
        metrics.get(
            "mediator_limited_total",
            &[("authority", "-"), ("limit", "global")]
        ) == 1.0,
        "one episode counted"
    );
    // Below the mark again: the waiting client is served, readiness is back.
    held.truncate(10);
    waiting
        .send(format!("{}\r\n", e2e::proxy_authorization(AGENT_A, TOKEN_A)).as_bytes())
        .await?;
    let answer = waiting.read_response(true).await?;
    ensure!(answer.status == 200, "the waiting client: {answer:?}");
    retry_for(
        LOG_TIMEOUT,
        async || Ok((m.admin("GET", "/readyz", None, None).await?.status == 200).then_some(())),
        || "/readyz stayed 503".into(),
    )
    .await?;
    m.wait_for_stderr(
        |l| l.contains("below the connection limit again"),
        LOG_TIMEOUT,
    )
    .await?;
    Ok(())
}

/// Open descriptors of process `pid`.
fn open_fds(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("/proc/{pid}/fd"))?
        .count())
}

/// Lets this test process hold the thousands of sockets the abuse needs.
fn raise_own_nofile() -> Result<()> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    Ok(())
}

async fn with_no_limit_keys_one_authority_and_a_flood_cannot_starve_another() -> Result<()> {
    raise_own_nofile()?;
    // A systemd service's soft limit; the mediator raises it to the hard one and derives
    // every limit from that.
    let fx = Fixture::start(
        mediator()
            .admin(true)
            .soft_nofile(1024)
            .authority(agent_a_spec())
            .authority(authority(AGENT_B, Some(TOKEN_B)))
            .authority(authority(AGENT_C, None)),
    )
    .await?;
    let m = &fx.mediator;
    let limits = &m.ready().limits;
    let cap = usize::try_from(
        *limits
            .get("authority_connections")
            .context("ready limits")?,
    )?;
    let pool = usize::try_from(
        *limits
            .get("unidentified_connections")
            .context("ready limits")?,
    )?;
    ensure!(
        limits.get("open_files").is_some_and(|&n| n > 1024),
        "the soft limit was raised: {limits:?}"
    );
    let pid = m.pid().context("mediator pid")?;
    // At rest once everything it keeps open (the resolver's sockets) exists.
    served(&fx, fx.tcp_conn().await?, Some((AGENT_B, TOKEN_B))).await?;
    let fds_at_rest = open_fds(pid)?;
    let target = fx.origin_target();

    // Abuse 1: agent-a holds as many tunnels as it can on its own socket.
    let mut abuser = Vec::new();
    let refused = loop {
        let mut c = fx.unix_conn(AGENT_A).await?;
        let answer = c.connect(&target, None).await?;
        if answer.status != 200 {
            break answer;
        }
        abuser.push(c);
        ensure!(abuser.len() <= cap, "agent-a got past its cap of {cap}");
    };
    ensure!(
        abuser.len() == cap,
        "agent-a held {} of {cap}",
        abuser.len()
    );
    check_limited(&refused, "authority_connections")?;
    // ... and over TCP with its credential: the same cap.
    check_limited(&fx.connect_a(&target).await?, "authority_connections")?;
    // The others are served, over TCP and over their own socket.
    served(&fx, fx.tcp_conn().await?, Some((AGENT_B, TOKEN_B))).await?;
    served(&fx, fx.unix_conn(AGENT_C).await?, None).await?;

    // Abuse 2: more silent TCP connections than the unidentified pool holds.
    let mut flood = Vec::new();
    for _ in 0..pool + 200 {
        flood.push(tokio::net::TcpStream::connect(m.tcp_addr()).await?);
    }
    served(&fx, fx.tcp_conn().await?, Some((AGENT_B, TOKEN_B))).await?;
    served(&fx, fx.unix_conn(AGENT_C).await?, None).await?;
    let ready = m.admin("GET", "/readyz", None, None).await?;
    ensure!(ready.status == 200, "/readyz under abuse: {ready:?}");

    // The abusers leave: the mediator is back to its descriptors at rest.
    drop(abuser);
    drop(flood);
    wait_for(
        Duration::from_secs(30),
        || Ok((open_fds(pid)? <= fds_at_rest + 2).then_some(())),
        || format!("descriptors at rest {fds_at_rest}, now {:?}", open_fds(pid)),
    )
    .await
}

async fn slow_heads_are_cut_at_request_head() -> Result<()> {
    let fx = Fixture::start(
        mediator()
            .timeout("request_head", 2)
            .authority(agent_a_spec()),
    )
    .await?;
    // Each sends a byte of its head now and then, never the whole head.
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut c = fx.tcp_conn().await?;
        c.send(b"CONN").await?;
        slow.push(c);
    }
    let started = std::time::Instant::now();
    for c in &mut slow {
        c.send(b"E").await?;
    }
    for c in &mut slow {
        ensure!(
            c.closes_within(Duration::from_secs(10)).await,
            "a slow head outlived request_head"
        );
    }
    ensure!(
        started.elapsed() < Duration::from_secs(8),
        "cut after {:?}",
        started.elapsed()
    );
    Ok(())
}

/// `VmHWM` (peak resident memory) of `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM")
}

async fn a_10_mib_head_is_refused_early_and_memory_stays_bounded() -> Result<()> {
    let fx = Fixture::start(mediator().authority(agent_a_spec())).await?;
    let pid = fx.mediator.pid().context("mediator pid")?;
    let before = peak_rss_kib(pid)?;
    let mut conn = tokio::net::TcpStream::connect(fx.mediator.tcp_addr()).await?;
    conn.write_all(b"GET http://origin.test/ HTTP/1.1\r\nX-Filler: ")
        .await?;
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0usize;
    while sent < 10 << 20 {
        // The mediator stops reading (and answers) long before 10 MiB.
        match tokio::time::timeout(Duration::from_secs(5), conn.write_all(&chunk)).await {
            Ok(Ok(())) => sent += chunk.len(),
            Ok(Err(_)) | Err(_) => break,
        }
    }
    // Whatever the kernel's buffers took, the mediator read only its head limit.
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut conn, &mut answer),
    )
    .await;
    let text = String::from_utf8_lossy(&answer);
    ensure!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "answer to an oversized head: {text}"
    );
    let after = peak_rss_kib(pid)?;
    ensure!(
        after < before + 8 * 1024,
        "peak RSS grew from {before} KiB to {after} KiB"
    );
    Ok(())
}

/// The listen backlog of the socket listening on `port` (`ss`'s Send-Q of a LISTEN line).
async fn listen_backlog(port: u16) -> Result<u64> {
    let out = Tool::Ss
        .command("ss")?
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .await
        .context("running ss")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .nth(2)
        .and_then(|q| q.parse().ok())
        .with_context(|| format!("no LISTEN line for port {port}: {text:?}"))
}

/// A connection flood by one tenant must not overflow the shared listener's accept queue:
/// a dropped SYN costs every other client a one-second retransmission.
async fn the_tcp_listeners_accept_queue_is_deep() -> Result<()> {
    let fx = Fixture::start(mediator().admin(true).authority(agent_a_spec())).await?;
    let cap: u64 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")?
        .trim()
        .parse()?;
    let want = cap.min(4096);
    let tcp = listen_backlog(fx.mediator.tcp_addr().port()).await?;
    ensure!(tcp >= want, "TCP listener backlog {tcp}, want {want}");
    let admin = fx
        .mediator
        .ready()
        .admin
        .context("no admin address in the ready line")?;
    let admin = listen_backlog(admin.port()).await?;
    ensure!(admin >= want, "admin listener backlog {admin}, want {want}");
    Ok(())
}

/// This module's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(the_connect_rate_bucket_holds_and_says_when_to_retry),
        case!(an_authority_at_its_cap_is_refused_on_every_channel_until_one_closes),
        case!(a_revoked_authority_shows_no_open_connections_after_its_cut),
        case!(a_full_unidentified_pool_sheds_its_oldest_silent_member),
        case!(at_max_connections_the_tcp_listener_waits_readyz_says_so_and_channels_still_work),
        case!(with_no_limit_keys_one_authority_and_a_flood_cannot_starve_another)
            .needs(&[Tool::Prlimit]),
        case!(slow_heads_are_cut_at_request_head),
        case!(a_10_mib_head_is_refused_early_and_memory_stays_bounded),
        case!(the_tcp_listeners_accept_queue_is_deep).needs(&[Tool::Ss]),
    ]
}
