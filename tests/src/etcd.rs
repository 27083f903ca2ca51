//! A real etcd cluster for the shared registry's tests (design section 17): three members
//! of Debian's `etcd-server` on loopback, on free ports, their data under a temporary
//! directory. Members can be stopped and started again (the same data directory).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::process::Child;

use crate::http::HttpConn;
use crate::port::unclaimed_port;
use crate::tool::Tool;
use crate::wait::retry_for;

/// How long a cluster (or a restarted member) may take to be healthy.
const HEALTHY: Duration = Duration::from_secs(30);

/// One member.
#[derive(Debug)]
struct Member {
    name: String,
    client: SocketAddr,
    peer: SocketAddr,
    data: PathBuf,
    child: Option<Child>,
}

/// A running etcd cluster on loopback.
#[derive(Debug)]
pub struct EtcdCluster {
    _dir: tempfile::TempDir,
    members: Vec<Member>,
    initial: String,
}

impl EtcdCluster {
    /// Starts `n` members and waits until the cluster answers through each.
    ///
    /// # Errors
    /// etcd is not installed (`apt-get install etcd-server`), or the cluster is not
    /// healthy in time.
    pub async fn start(n: usize) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("e2e-etcd-").tempdir()?;
        let mut members = Vec::new();
        for i in 0..n {
            members.push(Member {
                name: format!("m{i}"),
                client: unclaimed_port()?,
                peer: unclaimed_port()?,
                data: dir.path().join(format!("m{i}")),
                child: None,
            });
        }
        let initial = members
            .iter()
            .map(|m| format!("{}=http://{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Self {
            _dir: dir,
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
        let log = std::fs::File::create(m.data.with_extension("log"))?;
        let child = Tool::Etcd
            .command("etcd")?
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data)
            .arg("--listen-client-urls")
            .arg(format!("http://{}", m.client))
            .arg("--advertise-client-urls")
            .arg(format!("http://{}", m.client))
            .arg("--listen-peer-urls")
            .arg(format!("http://{}", m.peer))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://{}", m.peer))
            .arg("--initial-cluster")
            .arg(&initial)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg("e2e")
            // Fast elections on loopback: tests stop and start members.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting etcd (apt-get install etcd-server)")?;
        m.child = Some(child);
        Ok(())
    }

    /// Waits until member `i` says it is healthy (it has a leader and quorum).
    async fn wait_healthy(&self, i: usize) -> Result<()> {
        let m = &self.members[i];
        let addr = m.client;
        let log = m.data.with_extension("log");
        retry_for(
            HEALTHY,
            async || {
                let Ok(mut c) = HttpConn::tcp(addr).await else {
                    return Ok(None);
                };
                let Ok(r) = c
                    .request(
                        format!(
                            "GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await
                else {
                    return Ok(None);
                };
                Ok((r.status == 200 && r.text().contains("\"true\"")).then_some(()))
            },
            || {
                format!(
                    "etcd member {} on {addr} is not healthy; its log:\n{}",
                    m.name,
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            },
        )
        .await
    }

    /// The members' client URLs, for `[registry] endpoints`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{}", m.client))
            .collect()
    }

    /// `[registry]` for a mediator of this cluster, with `max_staleness_s`.
    pub fn registry_toml(&self, max_staleness_s: u64) -> String {
        let endpoints: Vec<String> = self
            .endpoints()
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect();
        format!(
            "\n[registry]\nbackend = \"etcd\"\nendpoints = [{}]\nprefix = \"/e2e/\"\nmax_staleness_s = {max_staleness_s}\n",
            endpoints.join(", ")
        )
    }

    /// `[registry]` for the replica of node `node`, talking to the members `members` only
    /// (their indexes), with `max_staleness_s`.
    pub fn registry_toml_on(&self, node: &str, members: &[usize], max_staleness_s: u64) -> String {
        let endpoints: Vec<String> = members
            .iter()
            .filter_map(|i| self.members.get(*i))
            .map(|m| format!("\"http://{}\"", m.client))
            .collect();
        format!(
            "\n[registry]\nbackend = \"etcd\"\nendpoints = [{}]\nprefix = \"/e2e/\"\nmax_staleness_s = {max_staleness_s}\nnode = \"{node}\"\n",
            endpoints.join(", ")
        )
    }

    /// Runs `etcdctl` (API 3) against every member with `args`; its standard output.
    ///
    /// # Errors
    /// etcdctl cannot run or fails (its standard error is in the message).
    pub async fn etcdctl(&self, args: &[&str]) -> Result<String> {
        let out = Tool::Etcd
            .command("etcdctl")?
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(self.endpoints().join(","))
            .args(args)
            .output()
            .await?;
        anyhow::ensure!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    /// Stops member `i` (SIGKILL) and reaps it.
    ///
    /// # Errors
    /// It cannot be killed.
    pub async fn stop(&mut self, i: usize) -> Result<()> {
        if let Some(mut child) = self.members[i].child.take() {
            child.kill().await?;
        }
        Ok(())
    }

    /// Starts member `i` again on its data directory and waits until it is healthy.
    ///
    /// # Errors
    /// It does not start, or is not healthy in time.
    pub async fn restart(&mut self, i: usize) -> Result<()> {
        self.spawn(i)?;
        self.wait_healthy(i).await
    }

    /// Waits until member `i` is healthy (after others came back).
    ///
    /// # Errors
    /// Not healthy in time.
    pub async fn healthy(&self, i: usize) -> Result<()> {
        self.wait_healthy(i).await
    }
}
