//! Runs the real `curl` as a client, so the mediator is exercised by the same code that
//! agents use. curl here (7.88) can use a SOCKS proxy on a Unix socket
//! (`socks5h://localhost/<path>`) but not an HTTP proxy on one; the HTTP Unix channel is
//! driven by [`crate::http::HttpConn`] instead.
//!
//! The child gets no proxy variables from our environment and no `.curlrc` (`-q`), so
//! only the arguments given decide where it connects.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};

use crate::mediator::Mediator;

/// What one curl run produced.
#[derive(Debug, Clone)]
pub struct CurlOutput {
    /// curl's exit code (0 = transfer done; 56, 97 etc. for proxy failures).
    pub exit_code: i32,
    /// The response body (everything before the trailing `-w` line).
    pub body: String,
    /// `%{http_connect}`: the proxy's answer to CONNECT (0 when there was none).
    pub http_connect: u16,
    /// `%{http_code}`: the final response's status (0 when there was none).
    pub http_code: u16,
    /// curl's stderr (`-sS` keeps only errors).
    pub stderr: String,
    /// The pid the child had, for matching a Unix-socket peer in the decision log.
    pub pid: Option<u32>,
}

impl CurlOutput {
    /// Checks the outcome of a transfer the mediator cut inside an allowed tunnel: the
    /// proxy answered CONNECT with `200`, and curl still failed.
    ///
    /// # Errors
    /// Another CONNECT answer, or a transfer that succeeded.
    pub fn expect_cut_after_connect(&self) -> Result<()> {
        anyhow::ensure!(
            self.http_connect == 200,
            "the CONNECT itself is allowed: {self:?}"
        );
        anyhow::ensure!(self.exit_code != 0, "curl must fail: {self:?}");
        Ok(())
    }
}

/// Marker separating the body from the `-w` write-out line.
const MARK: &str = "\n@@curl-write-out@@ ";

/// Runs `curl -q -sS --max-time 20 -w <marker> ARGS...` and parses the write-out.
///
/// # Errors
/// curl cannot be spawned, runs longer than 30 s, or its output lacks the write-out.
pub async fn curl(args: &[&str]) -> Result<CurlOutput> {
    let mut cmd = crate::Tool::Curl.command("curl")?;
    cmd.arg("-q")
        .arg("-sS")
        .args(["--max-time", "20"])
        .args(["-w", &format!("{MARK}%{{http_connect}} %{{http_code}}")])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for var in [
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "no_proxy",
        "NO_PROXY",
        "CURL_HOME",
    ] {
        cmd.env_remove(var);
    }
    let child = cmd.spawn().context("spawning curl (is it installed?)")?;
    let pid = child.id();
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .context("curl ran longer than 30 s")??;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, wo) = stdout
        .rsplit_once(MARK)
        .ok_or_else(|| anyhow!("curl output lacks the write-out line: {stdout:?}"))?;
    let mut codes = wo.split_whitespace().map(|c| c.parse::<u16>().unwrap_or(0));
    Ok(CurlOutput {
        exit_code: out.status.code().unwrap_or(-1),
        body: body.to_owned(),
        http_connect: codes.next().unwrap_or(0),
        http_code: codes.next().unwrap_or(0),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        pid,
    })
}

impl Mediator {
    /// Runs curl with this mediator's TCP listener as its proxy (`--proxy
    /// <scheme>://<addr>`, `scheme` being `http` or `socks5h`), as `(authority, token)`
    /// (`--proxy-user`), then `args` (the URL last).
    ///
    /// # Errors
    /// As [`curl`].
    pub async fn curl_via(
        &self,
        scheme: &str,
        (authority, token): (&str, &str),
        args: &[&str],
    ) -> Result<CurlOutput> {
        let proxy = format!("{scheme}://{}", self.tcp_addr());
        let user = format!("{authority}:{token}");
        let mut all = vec!["--proxy", &proxy, "--proxy-user", &user];
        all.extend_from_slice(args);
        curl(&all).await
    }
}
