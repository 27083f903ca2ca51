//! How the load generator reaches the origin: directly, or through a proxy listening on a
//! loopback TCP port (optionally with a credential) or on a Unix socket.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{Context, bail};
use base64::Engine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_util::either::Either;

use crate::require_loopback;

/// A connection to a proxy or to the origin.
pub type Stream = Either<TcpStream, UnixStream>;

/// A proxy credential (`Proxy-Authorization: Basic`, or SOCKS5 username/password).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// The user name (for the mediator: the authority's name).
    pub user: String,
    /// The password (for the mediator: the authority's token).
    pub password: String,
}

/// The path from the load generator to the origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// No proxy: straight to the origin.
    Direct,
    /// A proxy on a loopback TCP port.
    Tcp {
        /// The proxy's address.
        addr: SocketAddr,
        /// Sent with every CONNECT, SOCKS5 handshake and absolute-form request when set.
        credential: Option<Credential>,
    },
    /// A proxy on a Unix socket (the mediator's per-authority channel): no credential.
    Unix {
        /// The socket file.
        path: PathBuf,
    },
}

impl FromStr for Via {
    type Err = anyhow::Error;

    /// `direct`, `tcp:ADDR` or `unix:PATH`.
    fn from_str(s: &str) -> anyhow::Result<Self> {
        if s == "direct" {
            Ok(Self::Direct)
        } else if let Some(a) = s.strip_prefix("tcp:") {
            let addr = a
                .parse()
                .with_context(|| format!("bad proxy address {a:?}"))?;
            Ok(Self::Tcp {
                addr: require_loopback(addr)?,
                credential: None,
            })
        } else if let Some(p) = s.strip_prefix("unix:") {
            Ok(Self::Unix { path: p.into() })
        } else {
            bail!("expected direct, tcp:ADDR or unix:PATH, got {s:?}")
        }
    }
}

impl fmt::Display for Via {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Direct => f.write_str("direct"),
            Self::Tcp { addr, .. } => write!(f, "tcp:{addr}"),
            Self::Unix { path } => write!(f, "unix:{}", path.display()),
        }
    }
}

async fn tcp(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    let s = TcpStream::connect(require_loopback(addr)?)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_nodelay(true)?;
    Ok(s)
}

impl Via {
    /// Attaches a credential (TCP proxies only; ignored otherwise).
    #[must_use]
    pub fn with_credential(self, credential: Option<Credential>) -> Self {
        match self {
            Self::Tcp { addr, .. } => Self::Tcp { addr, credential },
            other => other,
        }
    }

    /// Whether requests go through a proxy.
    pub fn is_proxy(&self) -> bool {
        !matches!(self, Self::Direct)
    }

    /// The `Proxy-Authorization` value for this path, if it carries a credential.
    pub fn proxy_authorization(&self) -> Option<String> {
        match self {
            Self::Tcp {
                credential: Some(c),
                ..
            } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", c.user, c.password))
            )),
            _ => None,
        }
    }

    /// A plain connection: to the proxy, or (direct) to `origin`.
    ///
    /// # Errors
    /// Connection failures.
    pub async fn dial(&self, origin: SocketAddr) -> anyhow::Result<Stream> {
        Ok(match self {
            Self::Direct => Either::Left(tcp(origin).await?),
            Self::Tcp { addr, .. } => Either::Left(tcp(*addr).await?),
            Self::Unix { path } => Either::Right(
                UnixStream::connect(path)
                    .await
                    .with_context(|| format!("connecting to {}", path.display()))?,
            ),
        })
    }

    /// A byte stream to `origin`: an HTTP CONNECT tunnel through the proxy, or (direct) a
    /// TCP connection.
    ///
    /// # Errors
    /// Connection failures, or a CONNECT answered with anything but 2xx.
    pub async fn connect_tunnel(&self, origin: SocketAddr) -> anyhow::Result<Stream> {
        let mut s = self.dial(origin).await?;
        if self.is_proxy() {
            let auth = self
                .proxy_authorization()
                .map(|a| format!("Proxy-Authorization: {a}\r\n"))
                .unwrap_or_default();
            let head = format!("CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n{auth}\r\n");
            s.write_all(head.as_bytes()).await?;
            read_connect_response(&mut s).await?;
        }
        Ok(s)
    }

    /// A byte stream to `origin`: a SOCKS5 CONNECT through the proxy (username/password
    /// when the path carries a credential, else no authentication), or (direct) a TCP
    /// connection.
    ///
    /// # Errors
    /// Connection failures, or a SOCKS5 refusal.
    pub async fn socks_tunnel(&self, origin: SocketAddr) -> anyhow::Result<Stream> {
        let s = self.dial(origin).await?;
        if !self.is_proxy() {
            return Ok(s);
        }
        let credential = match self {
            Self::Tcp { credential, .. } => credential.clone(),
            _ => None,
        };
        Ok(match s {
            Either::Left(t) => Either::Left(socks(t, origin, credential.as_ref()).await?),
            Either::Right(u) => Either::Right(socks(u, origin, credential.as_ref()).await?),
        })
    }
}

async fn socks<S>(s: S, origin: SocketAddr, credential: Option<&Credential>) -> anyhow::Result<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let stream = match credential {
        Some(c) => {
            tokio_socks::tcp::Socks5Stream::connect_with_password_and_socket(
                s,
                origin,
                &c.user,
                &c.password,
            )
            .await
        }
        None => tokio_socks::tcp::Socks5Stream::connect_with_socket(s, origin).await,
    }
    .context("SOCKS5 handshake")?;
    Ok(stream.into_inner())
}

/// Reads the proxy's answer to CONNECT up to the end of its head and requires a 2xx. The
/// proxy sends nothing after the head until the client speaks, so nothing is over-read;
/// bytes after the head are an error.
async fn read_connect_response<S: AsyncRead + Unpin>(s: &mut S) -> anyhow::Result<()> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            bail!("proxy closed the connection before answering CONNECT");
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf)? {
            httparse::Status::Complete(len) => {
                let code = resp.code.unwrap_or(0);
                if !(200..300).contains(&code) {
                    bail!(
                        "CONNECT answered {code}: {}",
                        String::from_utf8_lossy(&buf).lines().next().unwrap_or("")
                    );
                }
                if len != buf.len() {
                    bail!(
                        "proxy sent {} bytes after the CONNECT response",
                        buf.len() - len
                    );
                }
                return Ok(());
            }
            httparse::Status::Partial if buf.len() > 16384 => {
                bail!("CONNECT response head too large")
            }
            httparse::Status::Partial => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths() {
        assert_eq!("direct".parse::<Via>().unwrap(), Via::Direct);
        let v: Via = "tcp:127.0.0.1:3128".parse().unwrap();
        let v = v.with_credential(Some(Credential {
            user: "a".into(),
            password: "b".into(),
        }));
        assert_eq!(v.proxy_authorization().unwrap(), "Basic YTpi");
        assert!("tcp:192.0.2.1:3128".parse::<Via>().is_err());
        assert_eq!(
            "unix:/tmp/x.sock".parse::<Via>().unwrap().to_string(),
            "unix:/tmp/x.sock"
        );
    }
}
