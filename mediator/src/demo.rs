//! `mediator demo`: a self-contained tour on loopback only. It starts an origin on
//! 127.0.0.1, a mediator with an embedded example configuration (a static `hosts` map
//! stands in for DNS), then sends allowed and denied requests over real sockets and prints
//! what each client saw next to the decision-log lines the request produced.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};

use crate::decision_log::Sink;
use crate::error::Error;

const TOKEN: &str = "demo-token";

/// Prints one line of the report; a reader that went away (`mediator demo | head`) ends the
/// demo quietly instead of a panic on the broken pipe.
macro_rules! report {
    ($($arg:tt)*) => {
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            return Ok(());
        }
    };
}

/// The embedded example configuration; `@DIR@` and `@HASH@` are filled in at run time.
pub const DEMO_CONFIG: &str = r#"
[listen]
socket_dir = "@DIR@"
tcp = "127.0.0.1:0"

[registry]
# The demo keeps its records in its own temporary directory (the default is the
# machine's state directory: see docs/control.md).
state_dir = "@DIR@/state"

[resolver]
# A static hosts map stands in for DNS: both names live on loopback.
hosts = { "origin.test" = ["127.0.0.1"], "internal.test" = ["127.0.0.2"] }

[[authority]]
name = "demo-agent"
allow = ["origin.test", "internal.test"]
deny = []
# 127.0.0.1 (the demo origin) is an explicit exception; 127.0.0.2 is not.
allow_private = ["127.0.0.1/32"]
token_sha256 = "@HASH@"

[[authority]]
name = "other-agent"
allow = ["api.example.org:443"]
"#;

/// Runs the demo and prints its report to stdout.
///
/// # Errors
/// [`Error`] if the origin or the mediator cannot start on loopback.
#[expect(
    clippy::too_many_lines,
    reason = "the demo script: each case is one client call and its printed line; ceiling 133 lines"
)]
pub async fn run() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let origin = TcpListener::bind("127.0.0.1:0").await?;
    let origin_addr = origin.local_addr()?;
    tokio::spawn(serve_origin(origin));

    let hash = hex::encode(Sha256::digest(TOKEN.as_bytes()));
    let text = DEMO_CONFIG
        .replace("@DIR@", &dir.path().display().to_string())
        .replace("@HASH@", &hash);
    let config = policy::config::parse(&text, "<demo config>")?;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let options = crate::Options {
        sink: Some(Sink::Memory(Arc::clone(&lines))),
        tap: None,
    };
    let running = crate::start(config, options).await?;
    let Some(tcp) = running.tcp_addr() else {
        return Err(Error::Io(std::io::Error::other("demo has no TCP listener")));
    };
    let sock = |name: &str| running.socket_path(name);
    let port = origin_addr.port();
    let auth = format!(
        "Proxy-Authorization: Basic {}\r\n",
        base64_encode(&format!("demo-agent:{TOKEN}"))
    );
    let bad_auth = format!(
        "Proxy-Authorization: Basic {}\r\n",
        base64_encode("demo-agent:wrong")
    );

    report!("mediator demo: origin on {origin_addr}, mediator TCP listener on {tcp},");
    report!("Unix sockets in {}", dir.path().display());
    report!("config:{}", text.replace(&hash, "<sha256 of demo-token>"));

    let mut seen = 0usize;
    // demo-agent's requests over TCP, with its token.
    let connect = |target: String| Step::Connect {
        via: Via::Tcp(tcp),
        target,
        auth: auth.clone(),
    };
    let forward = |url: String| Step::Forward {
        via: Via::Tcp(tcp),
        url,
        auth: auth.clone(),
    };
    let steps: Vec<(String, Step)> = vec![
        (
            format!("CONNECT origin.test:{port} over TCP as demo-agent, then GET / in the tunnel"),
            connect(format!("origin.test:{port}")),
        ),
        (
            format!("GET http://origin.test:{port}/hello (absolute-form) over TCP as demo-agent"),
            forward(format!("http://origin.test:{port}/hello")),
        ),
        (
            format!("SOCKS5 CONNECT origin.test:{port} on demo-agent's Unix socket"),
            Step::Socks {
                via: Via::Unix(sock("demo-agent")),
                host: "origin.test".into(),
                port,
            },
        ),
        (
            "CONNECT blocked.example:443: not in demo-agent's grant".into(),
            connect("blocked.example:443".into()),
        ),
        (
            format!(
                "GET http://internal.test:{port}/ : allowed name, but it resolves to 127.0.0.2 (private)"
            ),
            forward(format!("http://internal.test:{port}/")),
        ),
        (
            format!("CONNECT 127.1:{port}: a non-canonical IPv4 spelling"),
            connect(format!("127.1:{port}")),
        ),
        (
            format!(
                "CONNECT origin.test:{port} on other-agent's Unix socket: same host, other grant"
            ),
            Step::Connect {
                via: Via::Unix(sock("other-agent")),
                target: format!("origin.test:{port}"),
                auth: String::new(),
            },
        ),
        (
            format!("CONNECT origin.test:{port} over TCP with a wrong token"),
            Step::Connect {
                via: Via::Tcp(tcp),
                target: format!("origin.test:{port}"),
                auth: bad_auth,
            },
        ),
    ];
    for (i, (title, step)) in steps.into_iter().enumerate() {
        report!("\n== {}. {title}", i + 1);
        let saw = match tokio::time::timeout(Duration::from_secs(10), step.run()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => format!("client error: {e}"),
            Err(_) => "client timed out".into(),
        };
        for line in saw.lines() {
            report!("   client saw | {line}");
        }
        // Wait (bounded) for the step's log lines: the log is written asynchronously.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            running.log().flush();
            let n = lines.lock().map(|l| l.len()).unwrap_or(0);
            if n > seen || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Give close records of the step a moment to land too.
        tokio::time::sleep(Duration::from_millis(50)).await;
        running.log().flush();
        if let Ok(l) = lines.lock() {
            for line in &l[seen..] {
                report!("   decision log | {line}");
            }
            seen = l.len();
        }
    }
    running.shutdown().await;
    report!(
        "\nDone: allowed requests reached the origin; every denial names its reason and a hint, and its log line the authority."
    );
    Ok(())
}

enum Via {
    Tcp(SocketAddr),
    Unix(Option<std::path::PathBuf>),
}

enum Step {
    Connect {
        via: Via,
        target: String,
        auth: String,
    },
    Forward {
        via: Via,
        url: String,
        auth: String,
    },
    Socks {
        via: Via,
        host: String,
        port: u16,
    },
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

async fn open(via: &Via) -> std::io::Result<Box<dyn Io>> {
    Ok(match via {
        Via::Tcp(a) => Box::new(TcpStream::connect(a).await?),
        Via::Unix(Some(p)) => Box::new(UnixStream::connect(p).await?),
        Via::Unix(None) => return Err(std::io::Error::other("no socket")),
    })
}

impl Step {
    async fn run(self) -> std::io::Result<String> {
        match self {
            Self::Connect { via, target, auth } => {
                let mut s = open(&via).await?;
                let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n");
                s.write_all(req.as_bytes()).await?;
                let (head, body) = read_response(&mut s).await?;
                let mut out = format!("{head}\n{body}");
                if head.starts_with("HTTP/1.1 200") {
                    out.push_str(&through_tunnel(&mut s).await?);
                }
                Ok(out)
            }
            Self::Forward { via, url, auth } => {
                let mut s = open(&via).await?;
                let req = format!(
                    "GET {url} HTTP/1.1\r\nHost: ignored.invalid\r\n{auth}Connection: close\r\n\r\n"
                );
                s.write_all(req.as_bytes()).await?;
                let (head, body) = read_response(&mut s).await?;
                Ok(format!("{head}\n{body}"))
            }
            Self::Socks { via, host, port } => {
                let mut s = open(&via).await?;
                s.write_all(&[5, 1, 0]).await?;
                let mut m = [0u8; 2];
                s.read_exact(&mut m).await?;
                let mut req = vec![5, 1, 0, 3, u8::try_from(host.len()).unwrap_or(0)];
                req.extend_from_slice(host.as_bytes());
                req.extend_from_slice(&port.to_be_bytes());
                s.write_all(&req).await?;
                let mut rep = [0u8; 10];
                s.read_exact(&mut rep).await?;
                let mut out = format!(
                    "SOCKS5 reply REP=0x{:02x} ({})",
                    rep[1],
                    if rep[1] == 0 { "succeeded" } else { "refused" }
                );
                if rep[1] == 0 {
                    let _ = write!(out, "\n{}", through_tunnel(&mut s).await?);
                }
                Ok(out)
            }
        }
    }
}

/// `GET /` of the origin through the open tunnel `s`: what the client saw of the answer.
async fn through_tunnel(s: &mut Box<dyn Io>) -> std::io::Result<String> {
    s.write_all(b"GET / HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n")
        .await?;
    let (head, body) = read_response(s).await?;
    let status = head.lines().next().unwrap_or("");
    Ok(format!("(through the tunnel) {status}\n{body}"))
}

/// Reads one response head and a Content-Length body.
async fn read_response<S: AsyncRead + Unpin + ?Sized>(
    s: &mut S,
) -> std::io::Result<(String, String)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await? == 0 {
            break;
        }
        buf.push(byte[0]);
        if buf.len() > 65536 {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf).trim_end().to_string();
    let len = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len.min(1 << 20)];
    s.read_exact(&mut body).await?;
    Ok((head, String::from_utf8_lossy(&body).into_owned()))
}

async fn serve_origin(listener: TcpListener) {
    while let Ok((mut s, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let request_line = String::from_utf8_lossy(&seen);
            let first = request_line.lines().next().unwrap_or("").to_string();
            let body = format!("hello from the demo origin; it received: {first}\n");
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
        });
    }
}

fn base64_encode(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}
