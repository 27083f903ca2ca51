//! A loopback HTTP/1.1 origin for the benchmarks: `GET /small` answers a 64-byte body,
//! `GET /bytes/N` streams N bytes (from one static buffer, without copying). Prints
//! `listening ADDR` on stdout once bound; runs until killed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use clap::Parser;
use http::{Request, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Loopback HTTP origin for the benchmark harness.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on (loopback only; port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

const CHUNK_LEN: usize = 256 * 1024;
static CHUNK: [u8; CHUNK_LEN] = [b'x'; CHUNK_LEN];
/// Length of the `/small` body.
const SMALL_LEN: u64 = 64;

/// A body of `remaining` bytes served from [`CHUNK`].
struct Repeat {
    remaining: u64,
}

impl Body for Repeat {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = self.remaining.min(CHUNK_LEN as u64) as usize;
        self.remaining -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&CHUNK[..n])))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

fn respond(req: &Request<Incoming>) -> Response<Repeat> {
    let path = req.uri().path();
    let (status, len) = if path == "/small" {
        (StatusCode::OK, Some(SMALL_LEN))
    } else if let Some(n) = path.strip_prefix("/bytes/") {
        match n.parse::<u64>() {
            Ok(n) => (StatusCode::OK, Some(n)),
            Err(_) => (StatusCode::BAD_REQUEST, None),
        }
    } else {
        (StatusCode::NOT_FOUND, None)
    };
    let len = len.unwrap_or(0);
    let mut resp = Response::new(Repeat { remaining: len });
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, header::HeaderValue::from(len));
    resp
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    bench::require_loopback(args.listen)?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?
        .block_on(serve(args.listen))
}

async fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    println!("listening {}", listener.local_addr()?);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off rather than spin.
                eprintln!("origin: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        // Nagle would delay small responses behind the previous one's ACK.
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service =
                service_fn(
                    |req: Request<Incoming>| async move { Ok::<_, Infallible>(respond(&req)) },
                );
            // Errors are clients going away mid-request (the load generator stops at its
            // deadline): nothing to report.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
