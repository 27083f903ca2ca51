//! [`Socks5Parent`]: a SOCKS5 parent on loopback (RFC 1928 `CONNECT`, optional RFC 1929
//! username/password), recording each request.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt, copy_bidirectional};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::{Log, loopback_target, wait_requests};

/// One SOCKS5 CONNECT a [`Socks5Parent`] received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocksRequest {
    /// The methods offered in the greeting.
    pub methods: Vec<u8>,
    /// RFC 1929 user and password, when authentication happened.
    pub credentials: Option<(String, String)>,
    /// `ATYP` of the request (1 IPv4, 3 domain, 4 IPv6).
    pub atyp: u8,
    /// The address as text (IP or domain bytes, lossy UTF-8 with escapes).
    pub host: String,
    /// The port.
    pub port: u16,
}

/// A recording SOCKS5 parent on `127.0.0.1:0`.
#[derive(Debug)]
pub struct Socks5Parent {
    addr: SocketAddr,
    log: Arc<Log>,
    seen: Arc<Mutex<Vec<SocksRequest>>>,
    task: JoinHandle<()>,
}

impl Socks5Parent {
    /// Starts a SOCKS5 parent; `auth` = `Some((user, password))` requires RFC 1929.
    ///
    /// # Errors
    /// When the listener cannot be bound.
    pub async fn start(auth: Option<(&str, &str)>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the test SOCKS5 parent")?;
        let addr = listener.local_addr()?;
        let log = Arc::new(Log::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let auth = auth.map(|(u, p)| (u.to_owned(), p.to_owned()));
        let task = {
            let (log, seen) = (Arc::clone(&log), Arc::clone(&seen));
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    log.accepted.fetch_add(1, Ordering::SeqCst);
                    let (log, seen, auth) = (Arc::clone(&log), Arc::clone(&seen), auth.clone());
                    tokio::spawn(async move {
                        if let Ok(req) = serve_socks(stream, auth.as_ref()).await {
                            log.push(format!("{}:{}", req.host, req.port));
                            seen.lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(req);
                        }
                    });
                }
            })
        };
        Ok(Self {
            addr,
            log,
            seen,
            task,
        })
    }

    /// `host:port` of the parent.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// TCP connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.log.accepted.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` CONNECT requests were answered; returns them all.
    ///
    /// # Errors
    /// Fewer within [`PARENT_WAIT`](super::PARENT_WAIT).
    pub async fn wait_requests(&self, n: usize) -> Result<Vec<SocksRequest>> {
        wait_requests(&self.log, n, "the SOCKS5 parent").await?;
        Ok(self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone())
    }
}

impl Drop for Socks5Parent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_socks(mut s: TcpStream, auth: Option<&(String, String)>) -> Result<SocksRequest> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).await?;
    let mut methods = vec![0u8; usize::from(head[1])];
    s.read_exact(&mut methods).await?;
    let mut credentials = None;
    match auth {
        Some((user, pass)) => {
            if !methods.contains(&0x02) {
                s.write_all(&[0x05, 0xFF]).await?;
                bail!("no user/pass offered");
            }
            s.write_all(&[0x05, 0x02]).await?;
            let mut v = [0u8; 2];
            s.read_exact(&mut v).await?;
            let mut u = vec![0u8; usize::from(v[1])];
            s.read_exact(&mut u).await?;
            let mut plen = [0u8; 1];
            s.read_exact(&mut plen).await?;
            let mut p = vec![0u8; usize::from(plen[0])];
            s.read_exact(&mut p).await?;
            let given = (
                String::from_utf8_lossy(&u).into_owned(),
                String::from_utf8_lossy(&p).into_owned(),
            );
            let ok = given.0 == *user && given.1 == *pass;
            s.write_all(&[0x01, if ok { 0 } else { 1 }]).await?;
            if !ok {
                bail!("bad credentials");
            }
            credentials = Some(given);
        }
        None => s.write_all(&[0x05, 0x00]).await?,
    }
    let mut req = [0u8; 4];
    s.read_exact(&mut req).await?;
    let host = match req[3] {
        0x01 => {
            let mut a = [0u8; 4];
            s.read_exact(&mut a).await?;
            Ipv4Addr::from(a).to_string()
        }
        0x04 => {
            let mut a = [0u8; 16];
            s.read_exact(&mut a).await?;
            Ipv6Addr::from(a).to_string()
        }
        0x03 => {
            let mut len = [0u8; 1];
            s.read_exact(&mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            s.read_exact(&mut name).await?;
            name.iter()
                .flat_map(|b| std::ascii::escape_default(*b))
                .map(char::from)
                .collect()
        }
        _ => bail!("bad atyp"),
    };
    let mut port = [0u8; 2];
    s.read_exact(&mut port).await?;
    let port = u16::from_be_bytes(port);
    let record = SocksRequest {
        methods,
        credentials,
        atyp: req[3],
        host: host.clone(),
        port,
    };
    let upstream = match loopback_target(&host, port) {
        Some(dest) => TcpStream::connect(dest).await.ok(),
        None => None,
    };
    let Some(mut upstream) = upstream else {
        s.write_all(&[0x05, 0x05, 0x00, 0x01, 0, 0, 0, 0, 0, 0])
            .await?;
        return Ok(record);
    };
    s.write_all(&[0x05, 0x00, 0x00, 0x01, 127, 0, 0, 1, 0, 0])
        .await?;
    tokio::spawn(async move {
        let _ = copy_bidirectional(&mut s, &mut upstream).await;
    });
    Ok(record)
}
