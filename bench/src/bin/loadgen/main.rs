//! The load generator of the benchmark harness. `loadgen run` drives one mode
//! against one path (direct, or a proxy over TCP or a Unix socket) at a fixed concurrency
//! for a bounded time and request count, and prints one JSON line. `loadgen idle-tunnels`
//! holds many idle CONNECT tunnels open and reports the proxy's RSS growth per tunnel.
//! Every address must be on loopback.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use bench::procstat;
use bench::via::{Credential, Stream, Via};
use bench::{Percentiles, require_loopback};
use bytes::Bytes;
use clap::{Parser, Subcommand, ValueEnum};
use http::{Request, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::time::Instant;

mod idle;

use idle::idle_tunnels;

/// Load generator for the egress mediator benchmarks (loopback only).
#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one mode at one concurrency against one path; print one JSON line.
    Run(RunArgs),
    /// Hold many idle CONNECT tunnels open; print the proxy's RSS growth per tunnel.
    IdleTunnels(IdleArgs),
    /// Print a loopback TCP port that is free right now.
    FreePort,
}

/// What each request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Mode {
    /// A new proxy connection per request: CONNECT, one GET /small through it, close.
    ConnectRate,
    /// The same over SOCKS5.
    SocksRate,
    /// Keep-alive absolute-form GET /small on one proxy connection per worker.
    ForwardRate,
    /// One CONNECT tunnel per worker, repeated GET /bytes/N on it.
    TunnelThroughput,
}

/// Where the proxy is and who we are to it.
#[derive(Debug, clap::Args)]
struct Target {
    /// `direct`, `tcp:ADDR` or `unix:PATH`.
    #[arg(long)]
    via: Via,
    /// User (authority name) for a TCP proxy; needs --password.
    #[arg(long, requires = "password")]
    user: Option<String>,
    /// Password (authority token) for a TCP proxy.
    #[arg(long)]
    password: Option<String>,
    /// The origin's address (loopback).
    #[arg(long)]
    origin: SocketAddr,
}

impl Target {
    fn via(&self) -> Via {
        let credential = self.user.clone().map(|user| Credential {
            user,
            password: self.password.clone().unwrap_or_default(),
        });
        self.via.clone().with_credential(credential)
    }
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    #[command(flatten)]
    target: Target,
    /// The mode.
    #[arg(long, value_enum)]
    mode: Mode,
    /// Concurrent workers (1..=1024).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    concurrency: u32,
    /// Measured seconds (at most 120).
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Unmeasured seconds before the measured window (at most 30).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Stop after this many requests in all (warm-up included).
    #[arg(long, default_value_t = 5_000_000)]
    max_requests: u64,
    /// Body size of each tunnel-throughput request.
    #[arg(long, default_value_t = 256 << 20)]
    bytes: u64,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// A free-form label copied into the output.
    #[arg(long, default_value = "")]
    label: String,
    /// The proxy's pid: CPU seconds over the measured window and RSS are read from /proc.
    #[arg(long)]
    proxy_pid: Option<u32>,
    /// Tokio worker threads (default: min(concurrency, available cores)).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Debug, clap::Args)]
struct IdleArgs {
    #[command(flatten)]
    target: Target,
    /// Tunnels to hold open (at most 100000).
    #[arg(long, default_value_t = 10_000)]
    count: u32,
    /// Tunnels being opened at once.
    #[arg(long, default_value_t = 64)]
    parallel: usize,
    /// The proxy's pid (required: RSS is the point).
    #[arg(long)]
    proxy_pid: u32,
    /// Seconds to wait after the last tunnel opened before reading RSS.
    #[arg(long, default_value_t = 2.0)]
    settle: f64,
    /// A free-form label copied into the output.
    #[arg(long, default_value = "")]
    label: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::FreePort => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            println!("{}", l.local_addr()?.port());
            Ok(())
        }
        Command::Run(args) => {
            require_loopback(args.target.origin)?;
            if !(0.0..=120.0).contains(&args.duration) || !(0.0..=30.0).contains(&args.warmup) {
                bail!("--duration must be at most 120 s and --warmup at most 30 s");
            }
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            let threads = args
                .threads
                .unwrap_or((args.concurrency as usize).min(cores));
            let result = runtime(threads)?.block_on(run(args))?;
            eprintln!("{}", result.summary());
            println!("{}", serde_json::to_string(&result)?);
            Ok(())
        }
        Command::IdleTunnels(args) => {
            require_loopback(args.target.origin)?;
            if args.count > 100_000 {
                bail!("--count must be at most 100000");
            }
            let result = runtime(2)?.block_on(idle_tunnels(args))?;
            println!("{}", serde_json::to_string(&result)?);
            Ok(())
        }
    }
}

fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    })
}

/// One JSON line per run.
#[derive(Debug, Serialize)]
struct RunResult {
    label: String,
    mode: Mode,
    via: String,
    concurrency: u32,
    /// Length of the measured window.
    duration_s: f64,
    /// Requests completed inside the measured window.
    requests: u64,
    /// Failed requests inside the measured window.
    errors: u64,
    /// Requests per second (for tunnel-throughput: transfers per second).
    rate: f64,
    #[serde(flatten)]
    latency: Percentiles,
    /// Response body MiB per second received in the measured window.
    mib_s: f64,
    /// The proxy's CPU seconds in the measured window (user + system).
    proxy_cpu_s: Option<f64>,
    /// The proxy's CPU seconds per 1,000 requests.
    proxy_cpu_per_1000: Option<f64>,
    /// The proxy's CPU seconds per GiB of response body (for tunnel-throughput).
    proxy_cpu_per_gib: Option<f64>,
    /// The proxy's memory at the end of the window.
    proxy_memory: Option<procstat::Memory>,
    /// The first error seen, for diagnosis.
    first_error: Option<String>,
}

impl RunResult {
    /// One human-readable line for progress output.
    fn summary(&self) -> String {
        let cpu = self
            .proxy_cpu_s
            .map(|c| format!(" proxy_cpu={c:.2}s"))
            .unwrap_or_default();
        let err = self
            .first_error
            .as_deref()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        format!(
            "{:<13} {:<17} c={:<3} {:>9.0}/s p50={:.3}ms p99={:.3}ms {:>6.0} MiB/s{cpu} errors={}{err}",
            self.label,
            serde_json::to_value(self.mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            self.concurrency,
            self.rate,
            self.latency.p50_ms,
            self.latency.p99_ms,
            self.mib_s,
            self.errors
        )
    }
}

/// The measured window: results are kept for requests completing inside it.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

impl Window {
    fn contains(&self, t: Instant) -> bool {
        t >= self.start && t <= self.end
    }
}

#[derive(Debug, Default)]
struct WorkerResult {
    latencies: Vec<u64>,
    ok: u64,
    errors: u64,
    first_error: Option<String>,
}

impl WorkerResult {
    fn error(&mut self, window: Window, e: &anyhow::Error) {
        if window.contains(Instant::now()) {
            self.errors += 1;
        }
        if self.first_error.is_none() {
            self.first_error = Some(format!("{e:#}"));
        }
    }
}

/// Shared read-only state of one run.
struct Ctx {
    mode: Mode,
    via: Via,
    origin: SocketAddr,
    auth: Option<String>,
    /// Body length of each tunnel-throughput request.
    body_len: u64,
    /// Body bytes received inside the window, by every worker (counted as they arrive,
    /// so that transfers cut off by the end of the window count too).
    received: AtomicU64,
    timeout: Duration,
    window: Window,
    issued: AtomicU64,
    max_requests: u64,
}

impl Ctx {
    /// Whether another request may start: before the end of the window and under the cap.
    fn may_start(&self) -> bool {
        Instant::now() < self.window.end
            && self.issued.fetch_add(1, Ordering::Relaxed) < self.max_requests
    }

    /// A GET for `path`, absolute-form (with the credential) for forward-rate through a
    /// proxy, origin-form otherwise.
    fn request(&self, path: &str, absolute: bool) -> anyhow::Result<Request<Empty<Bytes>>> {
        let uri = if absolute {
            format!("http://{}{path}", self.origin)
        } else {
            path.to_owned()
        };
        let mut b = Request::get(uri).header(header::HOST, self.origin.to_string());
        if absolute && let Some(a) = &self.auth {
            b = b.header(header::PROXY_AUTHORIZATION, a);
        }
        Ok(b.body(Empty::new())?)
    }
}

async fn run(args: RunArgs) -> anyhow::Result<RunResult> {
    let via = args.target.via();
    let start = Instant::now() + Duration::from_secs_f64(args.warmup);
    let window = Window {
        start,
        end: start + Duration::from_secs_f64(args.duration),
    };
    let ctx = Arc::new(Ctx {
        mode: args.mode,
        auth: via.proxy_authorization(),
        via,
        origin: args.target.origin,
        body_len: args.bytes,
        received: AtomicU64::new(0),
        timeout: Duration::from_secs_f64(args.timeout),
        window,
        issued: AtomicU64::new(0),
        max_requests: args.max_requests,
    });

    // Proxy CPU time at both ends of the window, sampled off the runtime's workers.
    let cpu = args.proxy_pid.map(|pid| {
        tokio::spawn(async move {
            tokio::time::sleep_until(window.start).await;
            let a = tokio::task::spawn_blocking(move || procstat::cpu_seconds(pid)).await??;
            tokio::time::sleep_until(window.end).await;
            let b = tokio::task::spawn_blocking(move || procstat::cpu_seconds(pid)).await??;
            let m = tokio::task::spawn_blocking(move || procstat::memory(pid)).await??;
            anyhow::Ok((b - a, m))
        })
    });

    let workers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let ctx = Arc::clone(&ctx);
            tokio::spawn(async move {
                match ctx.mode {
                    Mode::ConnectRate | Mode::SocksRate => one_shot_worker(&ctx).await,
                    Mode::ForwardRate => keepalive_worker(&ctx, "/small").await,
                    Mode::TunnelThroughput => {
                        let path = format!("/bytes/{}", ctx.body_len);
                        keepalive_worker(&ctx, &path).await
                    }
                }
            })
        })
        .collect();
    let mut total = WorkerResult::default();
    for w in workers {
        let r = w.await?;
        total.latencies.extend(r.latencies);
        total.ok += r.ok;
        total.errors += r.errors;
        if total.first_error.is_none() {
            total.first_error = r.first_error;
        }
    }
    let (proxy_cpu_s, proxy_memory) = match cpu {
        Some(h) => {
            let (c, m) = h.await??;
            (Some(c), Some(m))
        }
        None => (None, None),
    };
    let secs = (window.end - window.start).as_secs_f64();
    let received = ctx.received.load(Ordering::Relaxed);
    Ok(RunResult {
        label: args.label,
        mode: args.mode,
        via: ctx.via.to_string(),
        concurrency: args.concurrency,
        duration_s: secs,
        requests: total.ok,
        errors: total.errors,
        rate: total.ok as f64 / secs,
        latency: Percentiles::from_nanos(&mut total.latencies),
        mib_s: received as f64 / secs / (1024.0 * 1024.0),
        proxy_cpu_s,
        proxy_cpu_per_1000: proxy_cpu_s
            .filter(|_| total.ok > 0)
            .map(|c| c * 1000.0 / total.ok as f64),
        proxy_cpu_per_gib: proxy_cpu_s
            .filter(|_| received > 0)
            .map(|c| c * (1u64 << 30) as f64 / received as f64),
        proxy_memory,
        first_error: total.first_error,
    })
}

/// Reads a response body to its end, adding the bytes received inside the window to
/// `ctx.received`.
async fn drain(resp: http::Response<Incoming>, ctx: &Ctx) -> anyhow::Result<()> {
    if !resp.status().is_success() {
        bail!("origin answered {}", resp.status());
    }
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data()
            && ctx.window.contains(Instant::now())
        {
            ctx.received.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// connect-rate and socks-rate: a new connection per request.
async fn one_shot_worker(ctx: &Ctx) -> WorkerResult {
    let mut out = WorkerResult::default();
    while ctx.may_start() {
        let t0 = Instant::now();
        let limit = (t0 + ctx.timeout).min(ctx.window.end);
        let r = tokio::time::timeout_at(limit, async {
            let stream = match ctx.mode {
                Mode::SocksRate => ctx.via.socks_tunnel(ctx.origin).await?,
                _ => ctx.via.connect_tunnel(ctx.origin).await?,
            };
            let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
            let req = ctx.request("/small", false)?;
            let exchange = async move {
                let resp = sender.send_request(req).await?;
                // Dropping the sender here lets `conn` finish: the connection closes.
                drain(resp, ctx).await
            };
            let (n, _closed) = tokio::join!(exchange, conn);
            n
        })
        .await;
        record(&mut out, ctx, t0, r).await;
    }
    out
}

/// forward-rate and tunnel-throughput: one connection (or tunnel) per worker, reused.
async fn keepalive_worker(ctx: &Ctx, path: &str) -> WorkerResult {
    let mut out = WorkerResult::default();
    let absolute = ctx.mode == Mode::ForwardRate && ctx.via.is_proxy();
    let mut sender: Option<http1::SendRequest<Empty<Bytes>>> = None;
    while ctx.may_start() {
        let t0 = Instant::now();
        let limit = (t0 + ctx.timeout).min(ctx.window.end);
        let r = tokio::time::timeout_at(limit, async {
            // A connection the server closed after its last answer (tinyproxy does not keep
            // client connections alive) is reopened, and a request that met such a close
            // on a reused connection is sent once more on a new one, as HTTP clients do
            // for idempotent requests: neither is an error.
            let mut attempt = 0;
            let resp = loop {
                attempt += 1;
                let reused = match sender.as_mut() {
                    Some(s) if !s.is_closed() => s.ready().await.is_ok(),
                    _ => false,
                };
                if !reused {
                    let stream: Stream = if ctx.mode == Mode::ForwardRate {
                        ctx.via.dial(ctx.origin).await?
                    } else {
                        ctx.via.connect_tunnel(ctx.origin).await?
                    };
                    let (s, conn) = http1::handshake(TokioIo::new(stream)).await?;
                    tokio::spawn(conn);
                    sender = Some(s);
                }
                let s = sender.as_mut().context("no connection")?;
                match s.send_request(ctx.request(path, absolute)?).await {
                    Ok(resp) => break resp,
                    Err(e)
                        if reused
                            && attempt == 1
                            && (e.is_incomplete_message() || e.is_canceled()) =>
                    {
                        sender = None;
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            drain(resp, ctx).await
        })
        .await;
        if !matches!(r, Ok(Ok(_))) {
            // A failed or cut-off exchange leaves the connection in an unknown state.
            sender = None;
        }
        record(&mut out, ctx, t0, r).await;
    }
    out
}

async fn record(
    out: &mut WorkerResult,
    ctx: &Ctx,
    t0: Instant,
    r: Result<anyhow::Result<()>, tokio::time::error::Elapsed>,
) {
    let t1 = Instant::now();
    match r {
        Ok(Ok(())) => {
            if ctx.window.contains(t1) {
                out.ok += 1;
                out.latencies.push((t1 - t0).as_nanos() as u64);
            }
        }
        // Cut off by the end of the window: neither a success nor an error.
        Err(_) if t1 >= ctx.window.end => {}
        Err(_) => out.error(
            ctx.window,
            &anyhow::anyhow!("timed out after {:?}", t1 - t0),
        ),
        Ok(Err(e)) => {
            out.error(ctx.window, &e);
            // Do not spin on a refusing peer.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
