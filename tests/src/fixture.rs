//! The one fixture every end-to-end test starts from: a DNS server, an echoing origin and
//! a mediator wired together, plus the client steps the tests repeat (a CONNECT as
//! `agent-a`, a GET inside the tunnel, a SOCKS5 client).

use std::net::IpAddr;

use anyhow::{Result, ensure};
use serde_json::{Value, json};
use tokio::net::TcpStream;

use crate::dns::DnsServer;
use crate::expect::check_tcp_peer;
use crate::http::{HttpConn, HttpResponse};
use crate::mediator::{Mediator, MediatorBuilder};
use crate::origin::Origin;
use crate::socks::{Socks5, SocksReply, SocksTarget};
use crate::{AGENT_A, LOOPBACK, ORIGIN_HOST, TOKEN_A};

/// A DNS server, an origin and a mediator wired together: `origin.test` resolves to
/// `127.0.0.1` and the mediator's resolver is the DNS server.
#[derive(Debug)]
pub struct Fixture {
    /// The loopback DNS server (program more names on it freely).
    pub dns: DnsServer,
    /// The echoing origin on 127.0.0.1.
    pub origin: Origin,
    /// The running mediator.
    pub mediator: Mediator,
}

impl Fixture {
    /// Starts DNS and origin, then the mediator `builder` describes, with the DNS server
    /// as its nameserver.
    ///
    /// # Errors
    /// When any of the three fails to start.
    pub async fn start(builder: MediatorBuilder) -> Result<Self> {
        let dns = DnsServer::start().await?;
        dns.set(ORIGIN_HOST, [LOOPBACK]);
        let origin = Origin::start().await?;
        let mediator = builder.nameserver(dns.addr()).start().await?;
        Ok(Self {
            dns,
            origin,
            mediator,
        })
    }

    /// `origin.test:<origin port>`.
    pub fn origin_target(&self) -> String {
        format!("{ORIGIN_HOST}:{}", self.origin.port())
    }

    /// A fresh connection to the mediator's TCP listener.
    ///
    /// # Errors
    /// Connect failure.
    pub async fn tcp_conn(&self) -> Result<HttpConn> {
        HttpConn::tcp(self.mediator.tcp_addr()).await
    }

    /// Makes each of `names` resolve to `ip` (on top of `origin.test`).
    pub fn resolve(&self, names: &[&str], ip: IpAddr) {
        for name in names {
            self.dns.set(name, [ip]);
        }
    }

    /// Sends `CONNECT target` on a fresh TCP connection, with `Proxy-Authorization` for
    /// `auth = Some((authority, token))`, and returns the answer. The connection is
    /// dropped: use [`Self::tcp_conn`] to keep a tunnel.
    ///
    /// # Errors
    /// Connect or read failure.
    pub async fn connect(&self, target: &str, auth: Option<(&str, &str)>) -> Result<HttpResponse> {
        self.tcp_conn().await?.connect(target, auth).await
    }

    /// [`Self::connect`] as `agent-a` with its token.
    ///
    /// # Errors
    /// As [`Self::connect`].
    pub async fn connect_a(&self, target: &str) -> Result<HttpResponse> {
        self.connect(target, Some((AGENT_A, TOKEN_A))).await
    }

    /// A fresh connection to `authority`'s Unix socket.
    ///
    /// # Errors
    /// Connect failure.
    pub async fn unix_conn(&self, authority: &str) -> Result<HttpConn> {
        HttpConn::unix(&self.mediator.socket_path(authority)).await
    }

    /// Sends `CONNECT target` (no credential) on a fresh connection to `authority`'s
    /// Unix socket and returns the answer.
    ///
    /// # Errors
    /// Connect or read failure.
    pub async fn connect_unix(&self, authority: &str, target: &str) -> Result<HttpResponse> {
        self.unix_conn(authority).await?.connect(target, None).await
    }

    /// Sends the raw request `raw` on a fresh TCP connection and returns the response.
    ///
    /// # Errors
    /// Connect, write or read failure.
    pub async fn request(&self, raw: &str) -> Result<HttpResponse> {
        self.tcp_conn().await?.request(raw.as_bytes()).await
    }

    /// CONNECTs to `<host>:<origin port>` as `agent-a`, then sends `GET <path>` with
    /// `Connection: close` inside the tunnel. Returns the origin's answer, or the CONNECT
    /// answer when that was not `200`.
    ///
    /// # Errors
    /// Connect, write or read failure.
    pub async fn tunnel_get(&self, host: &str, path: &str) -> Result<HttpResponse> {
        let mut conn = self.tcp_conn().await?;
        let target = format!("{host}:{}", self.origin.port());
        let answer = conn.connect(&target, Some((AGENT_A, TOKEN_A))).await?;
        if answer.status != 200 {
            return Ok(answer);
        }
        conn.get(&target, path, true).await
    }

    /// A tunnel to the origin: `CONNECT origin.test:<port>` as `agent-a` on a fresh TCP
    /// connection, checked to be answered `200`.
    ///
    /// # Errors
    /// Connect or read failure, or another answer.
    pub async fn tunnel_a(&self) -> Result<HttpConn> {
        let mut conn = self.tcp_conn().await?;
        let answer = conn
            .connect(&self.origin_target(), Some((AGENT_A, TOKEN_A)))
            .await?;
        ensure!(answer.status == 200, "CONNECT to the origin: {answer:?}");
        Ok(conn)
    }

    /// Waits for the decision that let `agent-a` reach the origin directly over the TCP
    /// listener with `protocol` (`connect`, `http`, `socks5`) and checks all of it that
    /// is known: reason, authority, channel, protocol, host, port, pin `127.0.0.1`, route
    /// `direct`, and a loopback peer. Returns the line.
    ///
    /// # Errors
    /// No such line in time, or a deviation.
    pub async fn expect_origin_allowed(&self, protocol: &str) -> Result<Value> {
        let line = self
            .mediator
            .expect_allow(
                ORIGIN_HOST,
                &[
                    ("authority", json!(AGENT_A)),
                    ("channel", json!("tcp")),
                    ("protocol", json!(protocol)),
                    ("port", json!(self.origin.port())),
                    ("pin", json!("127.0.0.1")),
                    ("route", json!("direct")),
                ],
            )
            .await?;
        check_tcp_peer(&line)?;
        Ok(line)
    }

    /// A SOCKS5 client on a fresh TCP connection, authenticated as `agent-a`, that has
    /// sent CONNECT to `target`; with the server's reply.
    ///
    /// # Errors
    /// Connect or I/O failure, or a failed authentication.
    pub async fn socks_connect_a(
        &self,
        target: &SocksTarget,
    ) -> Result<(Socks5<TcpStream>, SocksReply)> {
        let mut client = self.socks().await?;
        let reply = client.connect_with_auth(AGENT_A, TOKEN_A, target).await?;
        Ok((client, reply))
    }

    /// A SOCKS5 client on a fresh connection to the TCP listener.
    ///
    /// # Errors
    /// Connect failure.
    pub async fn socks(&self) -> Result<Socks5<TcpStream>> {
        Ok(Socks5::new(
            TcpStream::connect(self.mediator.tcp_addr()).await?,
        ))
    }
}
