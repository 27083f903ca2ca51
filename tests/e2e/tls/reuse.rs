//! Upstream connection reuse for terminated tunnels (`[limits] idle_upstream_connections`,
//! `authority_idle_upstream_connections`, `[timeouts] idle_upstream`): the upstream TLS
//! connection a terminated tunnel leaves behind carries the next tunnel of the same
//! authority to the same host, pin and route, as the loopback origin sees by counting its
//! TLS handshakes; never another authority's tunnel, nor one whose vetted addresses or
//! route changed; a revoked authority's idle connections are closed; the caps hold; and one the
//! origin closed is not used (the next request goes on a new connection, without error).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use e2e::harness::Case;
use e2e::mediator::{AuthoritySpec, MediatorBuilder, toml_list, toml_str};
use e2e::parent::HttpParent;
use e2e::tls::{TestCa, TlsOrigin, tls_through_connect};
use e2e::wait::{retry_for, wait_until};
use e2e::{AGENT_A, AGENT_B, Fixture, LOOPBACK, TOKEN_A, TOKEN_B, case};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use mediator::vocab::{Event, Protocol};
use nix::sys::signal::Signal;
use serde_json::Value;
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::support::{is, mediator};

const API: &str = "api.test";
/// Long enough for a loaded machine; every wait ends as soon as its condition holds.
const WAIT: Duration = Duration::from_secs(20);

/// A TLS origin for `api.test` (its CA trusted by the mediator) and a mediator where
/// `agent-a` and `agent-b` may both reach it, its TLS terminated.
struct Env {
    fx: Fixture,
    origin: TlsOrigin,
    mediator_ca: PathBuf,
    _dir: TempDir,
}

fn terminating(name: &str, token: &str) -> AuthoritySpec {
    AuthoritySpec::new(name)
        .allow(&[API])
        .allow_private(&["127.0.0.0/8"])
        .token(token)
        .raw(&format!("tls_terminate = {}", toml_list(&[API])))
}

/// [`start_with`] with connections kept idle for 300 s (longer than any test).
async fn start(configure: impl FnOnce(MediatorBuilder) -> MediatorBuilder) -> Result<Env> {
    start_with(300, configure).await
}

/// The origin and the mediator, idle upstream connections kept for `idle` seconds
/// (`[timeouts] idle_upstream`), the mediator `configure`d further.
async fn start_with(
    idle: u64,
    configure: impl FnOnce(MediatorBuilder) -> MediatorBuilder,
) -> Result<Env> {
    let dir = tempfile::tempdir()?;
    let test_ca = TestCa::create(dir.path())?;
    let origin = TlsOrigin::start(&test_ca.ca, API).await?;
    let ca_dir = dir.path().join("mediator-ca");
    let tls = format!(
        "\n[tls]\nca_dir = {}\nextra_ca_files = {}\n",
        toml_str(&ca_dir.display().to_string()),
        toml_list(&[test_ca.pem_path.display().to_string()])
    );
    let builder = configure(
        mediator()
            .admin(true)
            .timeout("idle_upstream", idle)
            .extra_toml(&tls)
            .authority(terminating(AGENT_A, TOKEN_A))
            .authority(terminating(AGENT_B, TOKEN_B)),
    );
    let fx = Fixture::start(builder).await?;
    fx.dns.set(API, [LOOPBACK]);
    Ok(Env {
        fx,
        origin,
        mediator_ca: ca_dir.join("ca.pem"),
        _dir: dir,
    })
}

/// An HTTP/1.1 client inside one terminated tunnel.
struct H1 {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    conn: tokio::task::JoinHandle<()>,
}

impl H1 {
    async fn over(tls: TlsStream<TcpStream>) -> Result<Self> {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self { sender, conn })
    }

    /// `GET path`: the status, the origin's echo read whole.
    async fn get(&mut self, port: u16, path: &str) -> Result<(u16, Value)> {
        let req = hyper::Request::get(path)
            .header("host", format!("{API}:{port}"))
            .body(Empty::new())?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    /// Closes the tunnel: the client's connection ends, as a client's does after its last
    /// request.
    async fn close(self) -> Result<()> {
        drop(self.sender);
        Ok(self.conn.await?)
    }
}

impl Env {
    fn target(&self) -> String {
        format!("{API}:{}", self.origin.port())
    }

    /// A terminated tunnel as `who`, the client offering `alpn`.
    async fn tunnel(&self, who: (&str, &str), alpn: &[&[u8]]) -> Result<TlsStream<TcpStream>> {
        tls_through_connect(
            self.fx.mediator.tcp_addr(),
            who,
            &self.target(),
            API,
            &self.mediator_ca,
            alpn,
        )
        .await
    }

    /// An HTTP/1.1 client in a new terminated tunnel as `who`.
    async fn h1(&self, who: (&str, &str)) -> Result<H1> {
        H1::over(self.tunnel(who, &[b"http/1.1"]).await?).await
    }

    /// One `GET` in a new tunnel as `who`, the tunnel closed after it; the status.
    async fn get_once(&self, who: (&str, &str), path: &str) -> Result<u16> {
        let mut h1 = self.h1(who).await?;
        let (status, _) = h1.get(self.origin.port(), path).await?;
        h1.close().await?;
        Ok(status)
    }

    /// The mediator's `mediator_upstream_idle_connections`.
    async fn idle(&self) -> Result<f64> {
        Ok(self
            .fx
            .mediator
            .metrics()
            .await?
            .get("mediator_upstream_idle_connections", &[]))
    }

    /// Waits until the mediator keeps exactly `n` idle upstream connections.
    async fn wait_idle(&self, n: usize) -> Result<()> {
        let want = n as f64;
        let seen = std::cell::Cell::new(f64::NAN);
        retry_for(
            WAIT,
            async || {
                seen.set(self.idle().await?);
                Ok((seen.get() == want).then_some(()))
            },
            || {
                format!(
                    "the mediator keeps {} idle upstream connections, not {n}",
                    seen.get()
                )
            },
        )
        .await
    }

    /// Waits until the origin has exactly `n` connections open.
    async fn wait_origin_open(&self, n: usize) -> Result<()> {
        wait_until(
            WAIT,
            &format!("the origin has {n} connections open"),
            || self.origin.open_connections() == n,
        )
        .await
    }

    /// The mediator's `mediator_upstream_reused_total`.
    async fn reused(&self) -> Result<f64> {
        Ok(self
            .fx
            .mediator
            .metrics()
            .await?
            .get("mediator_upstream_reused_total", &[]))
    }
}

const A: (&str, &str) = (AGENT_A, TOKEN_A);
const B: (&str, &str) = (AGENT_B, TOKEN_B);

async fn the_next_tunnel_of_the_same_authority_reuses_the_upstream_connection() -> Result<()> {
    let env = start(|b| b).await?;
    for n in 1..=3 {
        let status = env.get_once(A, &format!("/{n}")).await?;
        ensure!(status == 200, "request {n}: {status}");
        env.wait_idle(1).await?;
    }
    assert_eq!(env.origin.requests(), 3);
    assert_eq!(
        env.origin.handshakes(),
        1,
        "three tunnels, one upstream TLS connection"
    );
    assert_eq!(env.reused().await?, 2.0);
    // The tunnels that reused it were decided as any is, with no connect of their own.
    let decisions = env.fx.mediator.decisions()?;
    let connects: Vec<&Value> = decisions
        .iter()
        .filter(|d| d["event"] == "decision" && d["protocol"] == "connect")
        .collect();
    ensure!(connects.len() == 3, "{connects:?}");
    ensure!(
        connects
            .iter()
            .all(|d| d["decision"] == "allow" && d["pin"] == "127.0.0.1"),
        "{connects:?}"
    );
    let connected: Vec<bool> = connects.iter().map(|d| d["connect_ms"].is_f64()).collect();
    assert_eq!(connected, [true, false, false]);
    Ok(())
}

async fn another_authority_never_gets_the_connection() -> Result<()> {
    let env = start(|b| b).await?;
    ensure!(env.get_once(A, "/a1").await? == 200);
    env.wait_idle(1).await?;
    ensure!(env.get_once(B, "/b1").await? == 200);
    assert_eq!(
        env.origin.handshakes(),
        2,
        "agent-b's tunnel did not get agent-a's connection"
    );
    env.wait_idle(2).await?;
    // Each authority gets its own back.
    ensure!(env.get_once(B, "/b2").await? == 200);
    ensure!(env.get_once(A, "/a2").await? == 200);
    assert_eq!(env.origin.handshakes(), 2);
    assert_eq!(env.reused().await?, 2.0);
    Ok(())
}

async fn a_changed_pin_never_reuses() -> Result<()> {
    let env = start(|b| b).await?;
    ensure!(env.get_once(A, "/1").await? == 200);
    env.wait_idle(1).await?;
    // The host now resolves to two addresses (the first still the origin's): the vetted
    // addresses differ, so the kept connection is not theirs.
    env.fx.dns.set(API, [LOOPBACK, "127.0.0.2".parse()?]);
    ensure!(env.get_once(A, "/2").await? == 200);
    assert_eq!(env.origin.handshakes(), 2, "a new pin, a new connection");
    // Under the same pin again, the connection of that pin is taken.
    ensure!(env.get_once(A, "/3").await? == 200);
    assert_eq!(env.origin.handshakes(), 2);
    env.fx.dns.set(API, [LOOPBACK]);
    ensure!(env.get_once(A, "/4").await? == 200);
    assert_eq!(
        env.origin.handshakes(),
        2,
        "the first pin's connection is still kept"
    );
    Ok(())
}

async fn a_changed_route_never_reuses() -> Result<()> {
    // `[upstream] mode = "system"` reading a KDE settings file the test writes: no proxy
    // first (DIRECT), then a parent after a SIGHUP, then no proxy again.
    let dir = tempfile::tempdir()?;
    let kde = dir.path().join("kioslaverc");
    std::fs::write(&kde, "[Proxy Settings]\nProxyType=0\n")?;
    let parent = HttpParent::start().await?;
    let files = toml_list(&[kde.display().to_string()]);
    let env = start(|b| {
        b.upstream_line("mode = \"system\"")
            .upstream_line("dconf_databases = []")
            .upstream_line(&format!("kioslaverc_files = {files}"))
    })
    .await?;
    let reread = async |setting: &str, said: &str| -> Result<()> {
        std::fs::write(&kde, format!("[Proxy Settings]\n{setting}\n"))?;
        env.fx.mediator.signal(Signal::SIGHUP)?;
        env.fx
            .mediator
            .wait_for_stderr(
                |l| l.contains("upstream system settings re-read") && l.contains(said),
                e2e::LOG_TIMEOUT,
            )
            .await?;
        Ok(())
    };
    ensure!(env.get_once(A, "/direct").await? == 200);
    env.wait_idle(1).await?;
    let url = format!("http://{}", parent.addr());
    reread(&format!("ProxyType=1\nhttpsProxy={url}"), &url).await?;
    ensure!(env.get_once(A, "/parent").await? == 200);
    parent.wait_requests(1).await?;
    assert_eq!(env.origin.handshakes(), 2, "a new route, a new connection");
    env.wait_idle(2).await?;
    ensure!(env.get_once(A, "/parent-again").await? == 200);
    assert_eq!(parent.requests().len(), 1, "the parent's tunnel was reused");
    reread("ProxyType=0", "ProxyType=0").await?;
    ensure!(env.get_once(A, "/direct-again").await? == 200);
    assert_eq!(
        env.origin.handshakes(),
        2,
        "the direct connection is still kept"
    );
    assert_eq!(parent.requests().len(), 1);
    Ok(())
}

async fn a_revoked_authoritys_idle_connections_are_closed() -> Result<()> {
    let env = start(|b| b).await?;
    ensure!(env.get_once(A, "/a").await? == 200);
    ensure!(env.get_once(B, "/b").await? == 200);
    env.wait_idle(2).await?;
    env.wait_origin_open(2).await?;
    let resp = env.fx.mediator.revoke(AGENT_A).await?;
    ensure!(resp.status == 200, "{}", resp.text());
    // agent-a's closes at once (not after the revoke grace); agent-b's stays.
    env.wait_idle(1).await?;
    env.wait_origin_open(1).await?;
    ensure!(env.get_once(B, "/b").await? == 200);
    assert_eq!(env.origin.handshakes(), 2);
    Ok(())
}

async fn the_caps_hold_per_authority_and_in_all() -> Result<()> {
    let env = start(|b| {
        b.limits_line("idle_upstream_connections = 3")
            .limits_line("authority_idle_upstream_connections = 2")
    })
    .await?;
    // Four tunnels of agent-a open at once: four upstream connections; two are kept.
    let mut open = Vec::new();
    for n in 0..4 {
        let mut h1 = env.h1(A).await?;
        ensure!(h1.get(env.origin.port(), &format!("/a{n}")).await?.0 == 200);
        open.push(h1);
    }
    assert_eq!(env.origin.handshakes(), 4);
    for h1 in open.drain(..) {
        h1.close().await?;
    }
    env.wait_idle(2).await?;
    env.wait_origin_open(2).await?;
    // Two of agent-b at once: the total cap (3) makes agent-a, the largest holder, give up
    // one; agent-b keeps both of its own.
    for n in 0..2 {
        let mut h1 = env.h1(B).await?;
        ensure!(h1.get(env.origin.port(), &format!("/b{n}")).await?.0 == 200);
        open.push(h1);
    }
    assert_eq!(env.origin.handshakes(), 6);
    for h1 in open.drain(..) {
        h1.close().await?;
    }
    env.wait_idle(3).await?;
    env.wait_origin_open(3).await?;
    // What is kept: one of agent-a's (two tunnels at once: one reuses, one connects) and
    // two of agent-b's.
    for who in [A, B] {
        for n in 0..2 {
            let mut h1 = env.h1(who).await?;
            ensure!(h1.get(env.origin.port(), &format!("/again{n}")).await?.0 == 200);
            open.push(h1);
        }
    }
    assert_eq!(env.origin.handshakes(), 7);
    for h1 in open.drain(..) {
        h1.close().await?;
    }
    Ok(())
}

async fn reuse_is_off_with_a_cap_of_zero() -> Result<()> {
    let env = start(|b| b.limits_line("authority_idle_upstream_connections = 0")).await?;
    for n in 1..=2 {
        ensure!(env.get_once(A, &format!("/{n}")).await? == 200);
        // The tunnel's upstream connection closes with it.
        env.wait_origin_open(0).await?;
    }
    assert_eq!(env.origin.handshakes(), 2);
    assert_eq!(env.idle().await?, 0.0);
    Ok(())
}

async fn an_idle_connection_is_closed_after_the_idle_timeout() -> Result<()> {
    let env = start_with(1, |b| b).await?;
    ensure!(env.get_once(A, "/1").await? == 200);
    // Kept, then closed by the mediator after `idle_upstream` (1 s).
    env.wait_origin_open(0).await?;
    env.wait_idle(0).await?;
    ensure!(env.get_once(A, "/2").await? == 200);
    assert_eq!(env.origin.handshakes(), 2);
    Ok(())
}

async fn a_connection_the_origin_closed_is_not_used() -> Result<()> {
    let env = start(|b| b).await?;
    ensure!(env.get_once(A, "/1").await? == 200);
    env.wait_idle(1).await?;
    env.origin.close_idle_connections();
    env.wait_origin_open(0).await?;
    // The mediator sees the close and drops the connection from the pool.
    env.wait_idle(0).await?;
    let status = env.get_once(A, "/2").await?;
    ensure!(
        status == 200,
        "the request after the origin's close: {status}"
    );
    assert_eq!(env.origin.handshakes(), 2);
    assert_eq!(env.reused().await?, 0.0);
    env.fx
        .mediator
        .expect_log_lacks("upstream request failed")
        .context("no request failed on the closed connection")?;
    Ok(())
}

async fn http2_tunnels_reuse_an_http2_connection_and_an_http1_client_gets_its_own() -> Result<()> {
    let env = start(|b| b).await?;
    let url = format!("https://{}/h2", env.target());
    for _ in 0..2 {
        let tls = env.tunnel(A, &[b"h2"]).await?;
        let (mut h2, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(tls),
        )
        .await?;
        let conn = tokio::spawn(conn);
        let resp = h2
            .send_request(hyper::Request::get(&url).body(Full::new(Bytes::new()))?)
            .await?;
        ensure!(resp.status() == 200);
        let echo: Value = serde_json::from_slice(&resp.into_body().collect().await?.to_bytes())?;
        assert_eq!(echo["version"], "HTTP/2.0", "the origin spoke h2: {echo}");
        // The client goes away: its connection is dropped, not closed politely.
        drop(h2);
        conn.abort();
        let _ = conn.await;
        env.wait_idle(1).await?;
    }
    assert_eq!(env.origin.handshakes(), 1);
    // An HTTP/1.1 client needs an upstream that offered HTTP/1.1 only (its upgrades go
    // through as asked): the kept h2 connection is not its, and stays kept.
    ensure!(env.get_once(A, "/h1").await? == 200);
    assert_eq!(env.origin.handshakes(), 2);
    env.wait_idle(2).await?;
    env.fx
        .mediator
        .expect_log(
            is(|r| {
                r.event == Event::Decision
                    && r.protocol == Protocol::Tls
                    && r.path.as_deref() == Some("/h1")
            }),
            &[("decision", serde_json::json!("allow"))],
        )
        .await?;
    Ok(())
}

/// This file's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(the_next_tunnel_of_the_same_authority_reuses_the_upstream_connection),
        case!(another_authority_never_gets_the_connection),
        case!(a_changed_pin_never_reuses),
        case!(a_changed_route_never_reuses),
        case!(a_revoked_authoritys_idle_connections_are_closed),
        case!(the_caps_hold_per_authority_and_in_all),
        case!(reuse_is_off_with_a_cap_of_zero),
        case!(an_idle_connection_is_closed_after_the_idle_timeout),
        case!(a_connection_the_origin_closed_is_not_used),
        case!(http2_tunnels_reuse_an_http2_connection_and_an_http1_client_gets_its_own),
    ]
}
