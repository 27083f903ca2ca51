//! Socket mode with a known admin API (`--config FILE` whose `[listen]` names `admin` or
//! `admin_socket`): the run's denials come from the mediator itself, `GET
//! /v1/authorities/<name>/denials?since=` (design section 10: "for the shim's end-of-run
//! report"), kept when their `peer.pid` is this shim's (every connection of the run, proxy
//! or captured, reaches the authority's socket from this process). So the report and the
//! live lines include what the replies cannot show: SOCKS5 denials with their reason,
//! denials inside terminated TLS tunnels, the SNI rule's refusal after the `200`.
//!
//! After a rebind (`--control`), new connections reach another authority's socket: the
//! feed then polls every authority the run has been bound to, each with its own cursor,
//! so the denials taken under the new grant are in the report and said live too.
//!
//! It polls every [`POLL`] while the run lasts, and once more at the end. Reads of the
//! admin API need no token. It never writes to the mediator.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::cli::AdminEndpoint;
use crate::report::{Denial, Denials};

/// How often the admin API is asked.
const POLL: Duration = Duration::from_millis(250);
/// Most bytes of one answer read (the ring holds a bounded number of denials).
const MAX_ANSWER: u64 = 8 * 1024 * 1024;
/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The authorities whose denials are the run's, asked before each round of polls.
pub(crate) type Authorities = Box<dyn Fn() -> Vec<String> + Send>;

/// The feed of one run.
pub(crate) struct Feed {
    thread: std::thread::JoinHandle<()>,
    done: Arc<AtomicBool>,
}

impl Feed {
    /// Start polling `endpoint` for the denials since `since` (RFC 3339) of each authority
    /// `authorities` names (asked before every round: the run's channels so far).
    pub(crate) fn start(
        endpoint: AdminEndpoint,
        authorities: Authorities,
        since: String,
        denials: Arc<Denials>,
    ) -> std::io::Result<Self> {
        let done = Arc::new(AtomicBool::new(false));
        let d = Arc::clone(&done);
        let pid = std::process::id();
        let thread = std::thread::Builder::new()
            .name("denial-feed".into())
            .spawn(move || {
                // Per authority: the cursor and the last decision id seen.
                let mut state: HashMap<String, (String, u64)> = HashMap::new();
                loop {
                    let last = d.load(Ordering::Acquire);
                    for authority in authorities() {
                        let (cursor, seen) = state
                            .entry(authority.clone())
                            .or_insert_with(|| (since.clone(), 0));
                        if let Some(next) = poll(&endpoint, &authority, cursor, pid, seen, &denials)
                        {
                            *cursor = next;
                        }
                    }
                    if last {
                        return;
                    }
                    std::thread::sleep(POLL);
                }
            })?;
        Ok(Self { thread, done })
    }

    /// One last poll (the run is over), then stop.
    pub(crate) fn finish(self) {
        self.done.store(true, Ordering::Release);
        let _ = self.thread.join();
    }
}

/// One request: records the new denials of `pid` (decision ids above `seen`), returns the
/// next cursor (the last decision id seen), or `None` when the API did not answer.
fn poll(
    endpoint: &AdminEndpoint,
    authority: &str,
    since: &str,
    pid: u32,
    seen: &mut u64,
    denials: &Denials,
) -> Option<String> {
    let body = get(
        endpoint,
        &format!("/v1/authorities/{authority}/denials?since={since}"),
    )?;
    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
    let mut next = None;
    for e in v["denials"].as_array()? {
        let Some(id) = e["id"].as_u64() else { continue };
        if id <= *seen {
            continue;
        }
        *seen = id;
        next = Some(id.to_string());
        if e["peer"]["pid"].as_u64() != Some(u64::from(pid)) {
            continue;
        }
        let s = |k: &str| e[k].as_str().map(str::to_owned);
        denials.push(Denial {
            protocol: match e["protocol"].as_str() {
                Some("connect") => "connect",
                Some("http") => "http",
                Some("socks5") => "socks5",
                Some("tls") => "tls",
                _ => "unknown",
            },
            status: e["status"]
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .unwrap_or(0),
            reason: s("reason"),
            host: s("host"),
            port: e["port"].as_u64().and_then(|p| u16::try_from(p).ok()),
            detail: s("detail"),
            hint: s("hint").filter(|h| !h.is_empty()),
            message: s("message"),
        });
    }
    Some(next.unwrap_or_else(|| since.to_owned()))
}

/// `GET path` with `Connection: close`; the body of a 200.
fn get(endpoint: &AdminEndpoint, path: &str) -> Option<Vec<u8>> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: mediator\r\nConnection: close\r\n\r\n");
    let mut answer = Vec::new();
    match endpoint {
        AdminEndpoint::Tcp(addr) => {
            let mut s = std::net::TcpStream::connect_timeout(addr, TIMEOUT).ok()?;
            s.set_read_timeout(Some(TIMEOUT)).ok()?;
            s.write_all(request.as_bytes()).ok()?;
            s.take(MAX_ANSWER).read_to_end(&mut answer).ok()?;
        }
        AdminEndpoint::Unix(path) => {
            let mut s = UnixStream::connect(path).ok()?;
            s.set_read_timeout(Some(TIMEOUT)).ok()?;
            s.write_all(request.as_bytes()).ok()?;
            s.take(MAX_ANSWER).read_to_end(&mut answer).ok()?;
        }
    }
    let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
    let status_ok = answer.starts_with(b"HTTP/1.1 200 ");
    status_ok.then(|| answer[head_end + 4..].to_vec())
}
