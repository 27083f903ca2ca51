//! The processes of the registry benchmarks, all on loopback: an etcd cluster (Debian's
//! `etcd-server`) whose members can be killed and started again on their data, and
//! mediator replicas, each with its own config, state and socket directory, that can be
//! killed (`SIGKILL`) and started again; plus the one-request HTTP client they are driven
//! with. Every child is killed when its handle is dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A child killed (`SIGKILL`) and reaped when dropped.
#[derive(Debug)]
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port (bound, then released for a child to take). The machine's
/// ephemeral ports can run out for a while (other load on it, sockets in TIME_WAIT):
/// then it tries again for up to a minute.
///
/// # Errors
/// No port can be bound within a minute.
pub fn free_port() -> Result<SocketAddr> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match std::net::TcpListener::bind("127.0.0.1:0") {
            Ok(l) => return Ok(l.local_addr()?),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// One etcd member.
#[derive(Debug)]
struct Member {
    name: String,
    client: SocketAddr,
    peer: SocketAddr,
    data: PathBuf,
    child: Option<Killed>,
}

/// An etcd cluster on loopback.
#[derive(Debug)]
pub struct Etcd {
    bin: PathBuf,
    members: Vec<Member>,
    initial: String,
}

impl Etcd {
    /// Starts `n` members of `bin` with their data under `dir`, and waits until each is
    /// healthy.
    ///
    /// # Errors
    /// A member cannot start, or is not healthy within 60 s.
    pub async fn start(bin: &Path, dir: &Path, n: usize) -> Result<Self> {
        let members: Vec<Member> = (0..n)
            .map(|i| {
                Ok(Member {
                    name: format!("m{i}"),
                    client: free_port()?,
                    peer: free_port()?,
                    data: dir.join(format!("etcd-m{i}")),
                    child: None,
                })
            })
            .collect::<Result<_>>()?;
        let initial = members
            .iter()
            .map(|m| format!("{}=http://{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Self {
            bin: bin.to_owned(),
            members,
            initial,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        for i in 0..n {
            cluster.wait_healthy(i).await?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let initial = self.initial.clone();
        let m = &mut self.members[i];
        let (client, peer) = (format!("http://{}", m.client), format!("http://{}", m.peer));
        let child = Command::new(&self.bin)
            .args(["--name", &m.name, "--data-dir"])
            .arg(&m.data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args([
                "--initial-cluster",
                &initial,
                "--initial-cluster-state",
                "new",
            ])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            // Room for a run's history (nothing compacts it): 4 GiB instead of 2.
            .args(["--quota-backend-bytes", "4294967296"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(m.data.with_extension("log"))?)
            .spawn()
            .context("starting etcd (apt-get install etcd-server)")?;
        m.child = Some(Killed(child));
        Ok(())
    }

    /// Waits until member `i` answers `/health` with `true`.
    async fn wait_healthy(&self, i: usize) -> Result<()> {
        let addr = self.members[i].client;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok((200, body)) = request(addr, "GET", "/health", None).await
                && body.contains("\"true\"")
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("etcd member {i} on {addr} is not healthy within 60 s")
    }

    /// The members' client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{}", m.client))
            .collect()
    }

    /// How many members there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Bytes the members have sent to their gRPC clients so far
    /// (`etcd_network_client_grpc_sent_bytes_total`, summed): what the replicas received
    /// from the registry, as etcd counts it.
    ///
    /// # Errors
    /// A member's metrics cannot be read.
    pub async fn sent_bytes(&self) -> Result<u64> {
        let members: Vec<SocketAddr> = self.members.iter().map(|m| m.client).collect();
        Ok(etcd_counter(&members, "etcd_network_client_grpc_sent_bytes_total").await? as u64)
    }

    /// `[registry]` for a replica of node `node` under `prefix`.
    pub fn registry_toml(&self, prefix: &str, node: &str) -> String {
        let endpoints: Vec<String> = self
            .endpoints()
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect();
        format!(
            "[registry]\nbackend = \"etcd\"\nendpoints = [{}]\nprefix = \"{prefix}\"\nnode = \"{node}\"\n",
            endpoints.join(", ")
        )
    }

    /// Kills member `i` (`SIGKILL`).
    pub fn kill(&mut self, i: usize) {
        self.members[i].child = None;
    }

    /// Starts member `i` again on its data, without waiting.
    ///
    /// # Errors
    /// It cannot start.
    pub fn start_member(&mut self, i: usize) -> Result<()> {
        self.spawn(i)
    }

    /// Waits until every member is healthy.
    ///
    /// # Errors
    /// One is not healthy within 60 s.
    pub async fn wait_all_healthy(&self) -> Result<()> {
        for i in 0..self.members.len() {
            self.wait_healthy(i).await?;
        }
        Ok(())
    }

    /// Starts member `i` again on its data and waits until it is healthy.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub async fn restart(&mut self, i: usize) -> Result<()> {
        self.spawn(i)?;
        self.wait_healthy(i).await
    }
}

/// A mediator replica: its admin API on a fixed loopback port, its sockets under
/// `dir/sockets`, its config `dir/mediator.toml`, its stderr in `dir/stderr`.
#[derive(Debug)]
pub struct Replica {
    bin: PathBuf,
    dir: PathBuf,
    /// The admin API.
    pub admin: SocketAddr,
    child: Option<Killed>,
}

impl Replica {
    /// Writes the config of a replica in `dir` (created) with `registry` (TOML) and
    /// starts it; does not wait for it to be ready.
    ///
    /// # Errors
    /// The directory or config cannot be written, or the binary cannot start.
    pub fn spawn(bin: &Path, dir: &Path, registry: &str) -> Result<Self> {
        let admin = free_port()?;
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("mediator.toml"),
            format!(
                "[listen]\nsocket_dir = \"{}\"\nadmin = \"{admin}\"\nadmin_allow_anonymous_writes = true\n[log]\ndecisions = \"{}\"\n{registry}",
                dir.join("sockets").display(),
                dir.join("decisions.jsonl").display()
            ),
        )?;
        let mut replica = Self {
            bin: bin.to_owned(),
            dir: dir.to_owned(),
            admin,
            child: None,
        };
        replica.start()?;
        Ok(replica)
    }

    /// Starts the process (again).
    ///
    /// # Errors
    /// The binary cannot start.
    pub fn start(&mut self) -> Result<()> {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stderr"))?;
        let child = Command::new(&self.bin)
            .arg("--config")
            .arg(self.dir.join("mediator.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.child = Some(Killed(child));
        Ok(())
    }

    /// Kills the process (`SIGKILL`).
    pub fn kill(&mut self) {
        self.child = None;
    }

    /// Whether its process runs (was started and not killed).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.0.id())
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The socket of authority `name`.
    pub fn socket(&self, name: &str) -> PathBuf {
        self.dir.join("sockets").join(format!("{name}.sock"))
    }

    /// Waits (up to `within`) until `/readyz` answers 200; how long that took.
    ///
    /// # Errors
    /// Not ready in time.
    pub async fn wait_ready(&self, within: Duration) -> Result<Duration> {
        let started = Instant::now();
        while started.elapsed() < within {
            if let Ok((200, _)) = request(self.admin, "GET", "/readyz", None).await {
                return Ok(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        bail!(
            "the replica in {} was not ready within {within:?}",
            self.dir.display()
        )
    }

    /// One value of its `/metrics` (the first series whose line starts with `series`).
    ///
    /// # Errors
    /// The metrics cannot be read, or have no such series.
    pub async fn metric(&self, series: &str) -> Result<f64> {
        let (_, text) = request(self.admin, "GET", "/metrics", None).await?;
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no series {series}"))
    }
}

/// One HTTP/1.1 request with `Connection: close` to a loopback address; the status and
/// the body (unparsed).
///
/// # Errors
/// The address is not loopback, the connection fails, or the answer has no status.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String)> {
    crate::require_loopback(addr)?;
    let mut s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .context("connect timed out")??;
    let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n");
    match body {
        Some(b) => raw.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )),
        None => raw.push_str("\r\n"),
    }
    s.write_all(raw.as_bytes()).await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .context("no answer within 30 s")??;
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// A keep-alive HTTP/1.1 connection to one loopback admin API, made again after it
/// fails. A request that fails is not sent again: its outcome is unknown to the caller.
#[derive(Debug)]
pub struct Conn {
    addr: SocketAddr,
    stream: Option<BufReader<TcpStream>>,
}

impl Conn {
    /// A connection to `addr`, made at the first request.
    pub fn new(addr: SocketAddr) -> Self {
        Self { addr, stream: None }
    }

    /// One request; the status and the body.
    ///
    /// # Errors
    /// The address is not loopback, the connection fails or closes, or the answer cannot
    /// be read within 30 s.
    pub async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<(u16, String)> {
        let answer = tokio::time::timeout(Duration::from_secs(30), self.once(method, path, body))
            .await
            .context("no answer within 30 s")
            .and_then(|r| r);
        if answer.is_err() {
            self.stream = None;
        }
        answer
    }

    async fn once(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<(u16, String)> {
        if self.stream.is_none() {
            crate::require_loopback(self.addr)?;
            let s = TcpStream::connect(self.addr).await?;
            s.set_nodelay(true)?;
            self.stream = Some(BufReader::new(s));
        }
        let s = self.stream.as_mut().context("no connection")?;
        let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: b\r\n");
        match body {
            Some(b) => raw.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            )),
            None => raw.push_str("\r\n"),
        }
        s.get_mut().write_all(raw.as_bytes()).await?;
        let mut line = String::new();
        if s.read_line(&mut line).await? == 0 {
            bail!("the connection closed");
        }
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("no status in {line:?}"))?;
        let (mut length, mut close) = (0usize, false);
        loop {
            line.clear();
            if s.read_line(&mut line).await? == 0 {
                bail!("the connection closed in the head");
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().context("content-length")?;
                } else if k.eq_ignore_ascii_case("connection")
                    && v.trim().eq_ignore_ascii_case("close")
                {
                    close = true;
                }
            }
        }
        let mut body = vec![0; length];
        s.read_exact(&mut body).await?;
        if close {
            self.stream = None;
        }
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// The sum over `members` of a counter in etcd's own `/metrics`.
async fn etcd_counter(members: &[SocketAddr], name: &str) -> Result<f64> {
    let mut total = 0.0;
    for m in members {
        let (_, text) = request(*m, "GET", "/metrics", None).await?;
        total += text
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("no {name} in etcd's metrics"))?;
    }
    Ok(total)
}
