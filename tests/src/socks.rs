//! A small SOCKS5 client (RFC 1928, username/password per RFC 1929), step by step, so a
//! test can offer odd method lists, send BIND or UDP ASSOCIATE, and read the raw `REP`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Result, anyhow, bail, ensure};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::http::IO_TIMEOUT;

/// Method `0x00`: no authentication.
pub const METHOD_NO_AUTH: u8 = 0x00;
/// Method `0x02`: username/password (RFC 1929).
pub const METHOD_USER_PASS: u8 = 0x02;
/// Method answer `0xFF`: no acceptable method.
pub const METHOD_NONE_ACCEPTABLE: u8 = 0xFF;

/// Command `CONNECT`.
pub const CMD_CONNECT: u8 = 0x01;
/// Command `BIND`.
pub const CMD_BIND: u8 = 0x02;
/// Command `UDP ASSOCIATE`.
pub const CMD_UDP_ASSOCIATE: u8 = 0x03;

/// `REP 0x00`: succeeded.
pub const REP_SUCCEEDED: u8 = 0x00;
/// `REP 0x01`: general failure.
pub const REP_GENERAL_FAILURE: u8 = 0x01;
/// `REP 0x02`: connection not allowed by ruleset.
pub const REP_NOT_ALLOWED: u8 = 0x02;
/// `REP 0x04`: host unreachable.
pub const REP_HOST_UNREACHABLE: u8 = 0x04;
/// `REP 0x05`: connection refused.
pub const REP_REFUSED: u8 = 0x05;
/// `REP 0x07`: command not supported.
pub const REP_COMMAND_NOT_SUPPORTED: u8 = 0x07;

/// A SOCKS5 request destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocksTarget {
    /// `ATYP 1` (IPv4) or `ATYP 4` (IPv6), by the address family.
    Ip(SocketAddr),
    /// `ATYP 3`: a name (at most 255 bytes) and port.
    Domain(String, u16),
}

/// The server's reply to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocksReply {
    /// The `REP` byte.
    pub rep: u8,
    /// `BND.ADDR:BND.PORT`, when the reply was complete and IP-typed.
    pub bound: Option<SocketAddr>,
}

/// A SOCKS5 client over any stream.
#[derive(Debug)]
pub struct Socks5<S> {
    io: S,
}

async fn timed<T>(f: impl Future<Output = std::io::Result<T>>) -> Result<T> {
    tokio::time::timeout(IO_TIMEOUT, f)
        .await
        .map_err(|_| anyhow!("SOCKS5 peer silent for {IO_TIMEOUT:?}"))?
        .map_err(Into::into)
}

impl<S: AsyncRead + AsyncWrite + Unpin> Socks5<S> {
    /// Wraps a connected stream.
    pub fn new(io: S) -> Self {
        Self { io }
    }

    /// Sends the greeting offering `methods`; returns the method the server chose.
    ///
    /// # Errors
    /// I/O failure, timeout, or a reply whose version is not 5.
    pub async fn greet(&mut self, methods: &[u8]) -> Result<u8> {
        let mut msg = vec![0x05, u8::try_from(methods.len())?];
        msg.extend_from_slice(methods);
        self.io.write_all(&msg).await?;
        let mut reply = [0u8; 2];
        timed(self.io.read_exact(&mut reply)).await?;
        ensure!(reply[0] == 0x05, "method reply version {:#04x}", reply[0]);
        Ok(reply[1])
    }

    /// RFC 1929 sub-negotiation; returns the status byte (0 = success).
    ///
    /// # Errors
    /// I/O failure, timeout, or a reply whose version is not 1.
    pub async fn auth(&mut self, user: &str, pass: &str) -> Result<u8> {
        let mut msg = vec![0x01, u8::try_from(user.len())?];
        msg.extend_from_slice(user.as_bytes());
        msg.push(u8::try_from(pass.len())?);
        msg.extend_from_slice(pass.as_bytes());
        self.io.write_all(&msg).await?;
        let mut reply = [0u8; 2];
        timed(self.io.read_exact(&mut reply)).await?;
        ensure!(reply[0] == 0x01, "auth reply version {:#04x}", reply[0]);
        Ok(reply[1])
    }

    /// Sends a request with command `cmd` to `target` and reads the reply.
    ///
    /// # Errors
    /// I/O failure before the `REP` byte, timeout, or a reply whose version is not 5. A
    /// connection closed after `REP` is tolerated (`bound` is then `None`).
    pub async fn request(&mut self, cmd: u8, target: &SocksTarget) -> Result<SocksReply> {
        let mut msg = vec![0x05, cmd, 0x00];
        match target {
            SocksTarget::Ip(SocketAddr::V4(a)) => {
                msg.push(0x01);
                msg.extend_from_slice(&a.ip().octets());
                msg.extend_from_slice(&a.port().to_be_bytes());
            }
            SocksTarget::Ip(SocketAddr::V6(a)) => {
                msg.push(0x04);
                msg.extend_from_slice(&a.ip().octets());
                msg.extend_from_slice(&a.port().to_be_bytes());
            }
            SocksTarget::Domain(name, port) => {
                msg.push(0x03);
                msg.push(u8::try_from(name.len())?);
                msg.extend_from_slice(name.as_bytes());
                msg.extend_from_slice(&port.to_be_bytes());
            }
        }
        self.io.write_all(&msg).await?;
        let mut head = [0u8; 4];
        timed(self.io.read_exact(&mut head[..2])).await?;
        ensure!(head[0] == 0x05, "request reply version {:#04x}", head[0]);
        let rep = head[1];
        let bound = self.read_bound(&mut head).await.ok().flatten();
        Ok(SocksReply { rep, bound })
    }

    async fn read_bound(&mut self, head: &mut [u8; 4]) -> Result<Option<SocketAddr>> {
        timed(self.io.read_exact(&mut head[2..])).await?;
        let ip = match head[3] {
            0x01 => {
                let mut b = [0u8; 4];
                timed(self.io.read_exact(&mut b)).await?;
                Some(IpAddr::V4(Ipv4Addr::from(b)))
            }
            0x04 => {
                let mut b = [0u8; 16];
                timed(self.io.read_exact(&mut b)).await?;
                Some(IpAddr::V6(Ipv6Addr::from(b)))
            }
            0x03 => {
                let mut len = [0u8; 1];
                timed(self.io.read_exact(&mut len)).await?;
                let mut name = vec![0u8; usize::from(len[0])];
                timed(self.io.read_exact(&mut name)).await?;
                None
            }
            other => bail!("reply ATYP {other:#04x}"),
        };
        let mut port = [0u8; 2];
        timed(self.io.read_exact(&mut port)).await?;
        Ok(ip.map(|ip| SocketAddr::new(ip, u16::from_be_bytes(port))))
    }

    /// Greets offering username/password, authenticates, and sends CONNECT.
    ///
    /// # Errors
    /// As the steps; also when the server does not pick username/password or rejects
    /// the credential.
    pub async fn connect_with_auth(
        &mut self,
        user: &str,
        pass: &str,
        target: &SocksTarget,
    ) -> Result<SocksReply> {
        let m = self.greet(&[METHOD_USER_PASS]).await?;
        ensure!(m == METHOD_USER_PASS, "server chose method {m:#04x}");
        let st = self.auth(user, pass).await?;
        ensure!(st == 0, "auth status {st:#04x}");
        self.request(CMD_CONNECT, target).await
    }

    /// Whether the peer closes (EOF or reset) within `timeout` without sending more.
    pub async fn closes_within(&mut self, timeout: Duration) -> bool {
        let mut buf = [0u8; 1];
        matches!(
            tokio::time::timeout(timeout, self.io.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    /// The stream, for tunnelled traffic after a successful CONNECT.
    pub fn stream(&mut self) -> &mut S {
        &mut self.io
    }

    /// Gives the stream back.
    pub fn into_inner(self) -> S {
        self.io
    }
}
