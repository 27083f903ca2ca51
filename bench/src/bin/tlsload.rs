//! A TLS load generator for the TLS-termination benchmark (`bench/tls-terminate.sh`):
//! through an HTTP proxy (a `CONNECT HOST:PORT` tunnel, then TLS with SNI `HOST` inside)
//! or straight to the origin, it runs `GET PATH` over HTTP/1.1 with rustls, trusting only
//! the CA given. `new`: one request per TLS connection (a full handshake each: session
//! resumption is off, so every proxy pays the same); `keepalive`: one TLS connection per
//! worker, requests one after the other. Prints one JSON line: requests per second in the
//! measured window, p50/p99 latency, errors, the proxy's CPU seconds and RSS, and this
//! process's own CPU seconds (to show the load generator is not the bound). Loopback only.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bench::via::{Credential, Via};
use bench::{Percentiles, procstat, require_loopback};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// How connections are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Mode {
    /// One request per new TLS connection.
    New,
    /// One TLS connection per worker, requests one after the other.
    Keepalive,
}

#[derive(Debug, Parser)]
#[command(about = "TLS load through a CONNECT proxy or direct (loopback only)")]
struct Args {
    /// `direct` or `tcp:ADDR` (an HTTP proxy on loopback).
    #[arg(long)]
    via: Via,
    /// Proxy user (the mediator: the authority's name).
    #[arg(long, requires = "password")]
    user: Option<String>,
    /// Proxy password (the mediator: the authority's token).
    #[arg(long)]
    password: Option<String>,
    /// The origin's address (loopback): where `direct` connects.
    #[arg(long)]
    origin: SocketAddr,
    /// The host name: CONNECT target, SNI and `Host` (it must resolve to the origin for
    /// the proxy).
    #[arg(long)]
    host: String,
    /// The PEM file of the CA to trust (the proxy's, or the origin's for `direct`).
    #[arg(long)]
    ca: PathBuf,
    /// The mode.
    #[arg(long, value_enum)]
    mode: Mode,
    /// The request path.
    #[arg(long, default_value = "/small")]
    path: String,
    /// Concurrent workers (1..=256).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    concurrency: u32,
    /// Measured seconds (at most 120).
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Unmeasured seconds first (at most 30).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// The proxy's pid (its process tree's CPU seconds and RSS are read from /proc).
    #[arg(long)]
    proxy_pid: Option<u32>,
    /// Tokio worker threads (default: min(concurrency, 2)).
    #[arg(long)]
    threads: Option<usize>,
    /// Resume TLS sessions (tickets or session IDs, as the server offers) across this
    /// process's connections, as a long-running client would; off by default (a full
    /// handshake per connection).
    #[arg(long)]
    resume: bool,
    /// A free-form label copied into the output.
    #[arg(long, default_value = "")]
    label: String,
}

#[derive(Debug, Serialize)]
struct Output {
    label: String,
    mode: Mode,
    resume: bool,
    concurrency: u32,
    requests: u64,
    rate: f64,
    #[serde(flatten)]
    latency: Percentiles,
    errors: u64,
    first_error: Option<String>,
    proxy_cpu_s: Option<f64>,
    proxy_cpu_s_per_1000: Option<f64>,
    proxy_rss_kib: Option<u64>,
    loadgen_cpu_s: f64,
    window_s: f64,
}

/// What every worker shares.
struct Ctx {
    args: Args,
    via: Via,
    tls: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
    start: Instant,
    end: Instant,
    errors: AtomicU64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    require_loopback(args.origin)?;
    if !(0.0..=120.0).contains(&args.duration) || !(0.0..=30.0).contains(&args.warmup) {
        bail!("--duration must be at most 120 s and --warmup at most 30 s");
    }
    let threads = args
        .threads
        .unwrap_or_else(|| (args.concurrency as usize).min(2));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?;
    let out = rt.block_on(run(args))?;
    eprintln!(
        "{:>14} {:>9} c={:<3} {:>9.0} req/s  p50 {:.3} ms  p99 {:.3} ms  errors {}",
        out.label,
        format!("{:?}", out.mode),
        out.concurrency,
        out.rate,
        out.latency.p50_ms,
        out.latency.p99_ms,
        out.errors
    );
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

fn tls_connector(ca: &PathBuf, resume: bool) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(&pem)? {
        roots.add(cert)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Without --resume every connection is a full handshake: what a proxy pays for a
    // client it has not seen.
    if !resume {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// The certificates of a PEM file.
fn rustls_pemfile_certs(
    pem: &[u8],
) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject as _;
    let certs: Result<Vec<_>, _> = rustls::pki_types::CertificateDer::pem_slice_iter(pem).collect();
    let certs = certs.context("parsing the CA file")?;
    if certs.is_empty() {
        bail!("no certificate in the CA file");
    }
    Ok(certs)
}

async fn run(args: Args) -> anyhow::Result<Output> {
    let credential = args.user.clone().map(|user| Credential {
        user,
        password: args.password.clone().unwrap_or_default(),
    });
    let via = args.via.clone().with_credential(credential);
    let tls = tls_connector(&args.ca, args.resume)?;
    let name = ServerName::try_from(args.host.clone())?;
    let start = Instant::now() + Duration::from_secs_f64(args.warmup);
    let end = start + Duration::from_secs_f64(args.duration);
    let ctx = Arc::new(Ctx {
        via,
        tls,
        name,
        start,
        end,
        errors: AtomicU64::new(0),
        args,
    });
    let pid = ctx.args.proxy_pid;
    let sampler = tokio::spawn(async move {
        tokio::time::sleep_until(start.into()).await;
        let me = std::process::id();
        let a = (
            pid.map(procstat::cpu_seconds).transpose()?,
            procstat::cpu_seconds(me)?,
        );
        tokio::time::sleep_until(end.into()).await;
        let b = (
            pid.map(procstat::cpu_seconds).transpose()?,
            procstat::cpu_seconds(me)?,
        );
        let rss = pid.map(procstat::memory).transpose()?.map(|m| m.rss_kib);
        let proxy = a.0.zip(b.0).map(|(a, b)| b - a);
        anyhow::Ok((proxy, b.1 - a.1, rss))
    });
    let workers: Vec<_> = (0..ctx.args.concurrency)
        .map(|_| {
            let ctx = Arc::clone(&ctx);
            tokio::spawn(async move { worker(&ctx).await })
        })
        .collect();
    let mut samples = Vec::new();
    let mut first_error = None;
    for w in workers {
        let (mut s, e) = w.await?;
        samples.append(&mut s);
        first_error = first_error.or(e);
    }
    let (proxy_cpu_s, loadgen_cpu_s, proxy_rss_kib) = sampler.await??;
    let requests = samples.len() as u64;
    let window_s = ctx.args.duration;
    let rate = requests as f64 / window_s;
    Ok(Output {
        label: ctx.args.label.clone(),
        mode: ctx.args.mode,
        resume: ctx.args.resume,
        concurrency: ctx.args.concurrency,
        requests,
        rate,
        latency: Percentiles::from_nanos(&mut samples),
        errors: ctx.errors.load(Ordering::Relaxed),
        first_error,
        proxy_cpu_s,
        proxy_cpu_s_per_1000: proxy_cpu_s
            .filter(|_| requests > 0)
            .map(|c| c * 1000.0 / requests as f64),
        proxy_rss_kib,
        loadgen_cpu_s,
        window_s,
    })
}

/// Runs requests until the window ends; returns the latencies (ns) of those completed in
/// the window, and the first error.
async fn worker(ctx: &Ctx) -> (Vec<u64>, Option<String>) {
    let mut samples = Vec::new();
    let mut first_error = None;
    let mut kept: Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> = None;
    loop {
        let began = Instant::now();
        if began >= ctx.end {
            return (samples, first_error);
        }
        let result = match ctx.args.mode {
            Mode::New => match open(ctx).await {
                Ok(mut sender) => get(ctx, &mut sender).await,
                Err(e) => Err(e),
            },
            Mode::Keepalive => {
                if kept.is_none() {
                    kept = open(ctx)
                        .await
                        .map_err(|e| note(&mut first_error, ctx, &e))
                        .ok();
                }
                match kept.as_mut() {
                    Some(sender) => {
                        let r = get(ctx, sender).await;
                        if r.is_err() {
                            kept = None;
                        }
                        r
                    }
                    None => continue,
                }
            }
        };
        let done = Instant::now();
        match result {
            Ok(()) if began >= ctx.start && done <= ctx.end => {
                samples.push(u64::try_from((done - began).as_nanos()).unwrap_or(u64::MAX));
            }
            Ok(()) => {}
            Err(e) => note(&mut first_error, ctx, &e),
        }
    }
}

fn note(first: &mut Option<String>, ctx: &Ctx, e: &anyhow::Error) {
    if Instant::now() < ctx.end {
        ctx.errors.fetch_add(1, Ordering::Relaxed);
        first.get_or_insert_with(|| format!("{e:#}"));
    }
}

/// A new TLS connection (through the proxy's tunnel, or direct) with HTTP/1.1 on it.
async fn open(ctx: &Ctx) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let port = ctx.args.origin.port();
    let tcp = match &ctx.via {
        Via::Direct => {
            let s = tokio::net::TcpStream::connect(ctx.args.origin).await?;
            s.set_nodelay(true)?;
            s
        }
        Via::Tcp { addr, .. } => {
            let mut s = tokio::net::TcpStream::connect(require_loopback(*addr)?).await?;
            s.set_nodelay(true)?;
            let auth = ctx
                .via
                .proxy_authorization()
                .map(|a| format!("Proxy-Authorization: {a}\r\n"))
                .unwrap_or_default();
            let host = &ctx.args.host;
            s.write_all(
                format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}\r\n")
                    .as_bytes(),
            )
            .await?;
            connect_answer(&mut s).await?;
            s
        }
        Via::Unix { .. } => bail!("unix: is not supported here"),
    };
    let tls = ctx.tls.connect(ctx.name.clone(), tcp).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// Reads a CONNECT answer head byte by byte (no tunnelled byte is consumed); 2xx or an
/// error.
async fn connect_answer<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> anyhow::Result<()> {
    let mut head = Vec::with_capacity(128);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 {
            bail!("CONNECT answer head too long");
        }
        let b = s.read_u8().await.context("reading the CONNECT answer")?;
        head.push(b);
    }
    if !(head.starts_with(b"HTTP/1.1 2") || head.starts_with(b"HTTP/1.0 2")) {
        bail!(
            "CONNECT refused: {}",
            String::from_utf8_lossy(&head).lines().next().unwrap_or("")
        );
    }
    Ok(())
}

async fn get(
    ctx: &Ctx,
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
) -> anyhow::Result<()> {
    let host = format!("{}:{}", ctx.args.host, ctx.args.origin.port());
    let req = http::Request::get(ctx.args.path.as_str())
        .header(http::header::HOST, host)
        .body(Empty::new())?;
    sender.ready().await?;
    let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req))
        .await
        .context("no answer in 10 s")??;
    let status = resp.status();
    resp.into_body().collect().await?;
    if !status.is_success() {
        bail!("status {status}");
    }
    Ok(())
}
