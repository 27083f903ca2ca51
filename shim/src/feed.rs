//! Socket mode: where the run's denials come from, and how each is said before the client
//! can say its own error.
//!
//! With a known admin API (`--config FILE` whose `[listen]` names `admin` or
//! `admin_socket`) the run's denials come from the mediator itself, `GET
//! /v1/authorities/<name>/denials?since=` (design section 10: "for the shim's end-of-run
//! report"), kept when their `peer.pid` is this shim's (every connection of the run, proxy
//! or captured, reaches the authority's socket from this process). So the report and the
//! live lines include what the replies cannot show: SOCKS5 denials with their reason,
//! denials inside terminated TLS tunnels, the SNI rule's refusal after the `200`, and a
//! client that refused the mediator's certificate (an entry with `"event": "close"`,
//! said by [`crate::rejected`]).
//!
//! After a rebind (`--control`), new connections reach another authority's socket: the
//! feed then polls every authority the run has been bound to, each with its own cursor,
//! so the denials taken under the new grant are in the report and said live too.
//!
//! It polls every [`POLL`] while the run lasts, and once more at the end. Reads of the
//! admin API need no token. It never writes to the mediator.
//!
//! [`Answers`]: the relay and capture read the mediator's answer on each connection (an
//! HTTP denial, a SOCKS5 failure reply) before the client gets it, and hand a denial here
//! first. With the admin API the feed is asked at once (the mediator keeps a denial
//! before it answers), so the line said is the API's, with its reason and hint; without
//! it, or when the API has no such entry, the line is the answer's. Each denial is said
//! once: a [`Ledger`] pairs what the answers saw with what the API lists.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mediator::vocab::ClientTlsEnd;

use crate::cli::AdminEndpoint;
use crate::rejected::{Rejection, Trust};
use crate::report::{Denial, Denials};

/// How often the admin API is asked.
const POLL: Duration = Duration::from_millis(250);
/// Most bytes of one answer read (the ring holds a bounded number of denials).
const MAX_ANSWER: u64 = 8 * 1024 * 1024;
/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The authorities whose denials are the run's, asked before each round of polls.
pub(crate) type Authorities = Box<dyn Fn() -> Vec<String> + Send + Sync>;

/// The feed of one run.
pub(crate) struct Feed {
    thread: std::thread::JoinHandle<()>,
    done: Arc<AtomicBool>,
    polls: Arc<Polls>,
}

/// What the polls of one run share: the background thread's and those a connection asks
/// for ([`Polls::round`]).
pub(crate) struct Polls {
    endpoint: AdminEndpoint,
    authorities: Authorities,
    since: String,
    pid: u32,
    /// Per authority: the cursor and the last decision id seen (one round at a time).
    cursors: Mutex<HashMap<String, (String, u64)>>,
    denials: Arc<Denials>,
    trust: Trust,
    ledger: Ledger,
}

impl Feed {
    /// Start polling `endpoint` for the denials since `since` (RFC 3339) of each authority
    /// `authorities` names (asked before every round: the run's channels so far).
    pub(crate) fn start(
        endpoint: AdminEndpoint,
        authorities: Authorities,
        since: String,
        denials: Arc<Denials>,
        trust: Trust,
    ) -> std::io::Result<Self> {
        let done = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(Polls {
            endpoint,
            authorities,
            since,
            pid: std::process::id(),
            cursors: Mutex::default(),
            denials,
            trust,
            ledger: Ledger::default(),
        });
        let (d, p) = (Arc::clone(&done), Arc::clone(&polls));
        let thread = std::thread::Builder::new()
            .name("denial-feed".into())
            .spawn(move || {
                loop {
                    let last = d.load(Ordering::Acquire);
                    p.round();
                    if last {
                        return;
                    }
                    std::thread::sleep(POLL);
                }
            })?;
        Ok(Self {
            thread,
            done,
            polls,
        })
    }

    /// The polls, for [`Answers`].
    pub(crate) fn polls(&self) -> Arc<Polls> {
        Arc::clone(&self.polls)
    }

    /// One last poll (the run is over), then stop.
    pub(crate) fn finish(self) {
        self.done.store(true, Ordering::Release);
        let _ = self.thread.join();
    }
}

impl Polls {
    /// Asks the admin API once for every authority of the run; records (and says) what is
    /// new. `false` when an authority could not be asked.
    fn round(&self) -> bool {
        let mut cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all = true;
        for authority in (self.authorities)() {
            let (cursor, seen) = cursors
                .entry(authority.clone())
                .or_insert_with(|| (self.since.clone(), 0));
            match self.poll(&authority, cursor, seen) {
                Some(next) => *cursor = next,
                None => all = false,
            }
        }
        all
    }

    /// One request: records the new entries of this process (decision ids above `seen`),
    /// returns the next cursor (the last id seen), or `None` when the API did not answer.
    fn poll(&self, authority: &str, since: &str, seen: &mut u64) -> Option<String> {
        let body = get(
            &self.endpoint,
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
            if e["peer"]["pid"].as_u64() != Some(u64::from(self.pid)) {
                continue;
            }
            self.take(e);
        }
        Some(next.unwrap_or_else(|| since.to_owned()))
    }

    /// Records one entry of this run: a client's refusal of the mediator's certificate,
    /// or a denial (unless an answer said it already).
    fn take(&self, e: &serde_json::Value) {
        let s = |k: &str| e[k].as_str().map(str::to_owned);
        let port = e["port"].as_u64().and_then(|p| u16::try_from(p).ok());
        if e["event"] == "close" {
            let end = serde_json::from_value::<ClientTlsEnd>(e["client_tls"].clone());
            if end.is_ok_and(ClientTlsEnd::rejects_certificate) {
                self.trust.rejected(
                    &self.denials,
                    Rejection {
                        host: s("host"),
                        port,
                        alert: s("tls_alert"),
                        detail: s("detail").unwrap_or_default(),
                        client: None,
                    },
                );
            }
            return;
        }
        let d = Denial {
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
            port,
            detail: s("detail"),
            hint: s("hint").filter(|h| !h.is_empty()),
            message: s("message"),
        };
        if !self.ledger.answered(&d) {
            self.denials.push(d);
        }
    }
}

/// How the relay and capture hand over a denial they read in the mediator's answer on one
/// of the run's connections: said (and recorded) before the client gets the answer.
#[derive(Clone)]
pub(crate) struct Answers {
    denials: Arc<Denials>,
    /// Socket mode with the admin API: asked at once.
    polls: Option<Arc<Polls>>,
}

impl Answers {
    /// Answers whose denials go to `denials`, read from the admin API's `polls` when there
    /// is one.
    pub(crate) fn new(denials: Arc<Denials>, polls: Option<Arc<Polls>>) -> Self {
        Self { denials, polls }
    }

    /// The answer to a connection of this run was the denial `d` (as far as the answer
    /// tells): say it now. With the admin API, its entry (reason, hint, the operator's
    /// words) is asked for first and said instead; `d` is said when the API has none.
    /// Blocks for at most one round of requests to the admin API.
    pub(crate) fn denied(&self, d: Denial) {
        let Some(polls) = &self.polls else {
            self.denials.push(d);
            return;
        };
        polls.round();
        if !polls.ledger.claim_listed(&d) {
            polls.ledger.note_answer(&d);
            self.denials.push(d);
        }
    }
}

/// How long the ledger remembers a denial.
const LEDGER_KEEP: Duration = Duration::from_secs(60);
/// Most denials it remembers on each side.
const LEDGER_MAX: usize = 256;

/// Pairs the denials the answers saw with those the admin API lists, so that each is said
/// once: one the API listed first is claimed by its answer; one an answer said first (the
/// API had nothing yet, or could not be asked) is skipped when the API lists it.
#[derive(Default)]
struct Ledger(Mutex<LedgerSides>);

#[derive(Default)]
struct LedgerSides {
    /// Said from the API, not yet paired with an answer.
    listed: VecDeque<(Key, Instant)>,
    /// Said from an answer, not yet paired with an API entry.
    answered: VecDeque<(Key, Instant)>,
}

/// What pairs an answer with an API entry: the destination, and the reason when the
/// answer carries one (a SOCKS5 reply does not).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    host: Option<String>,
    port: Option<u16>,
    reason: Option<String>,
}

impl Key {
    fn of(d: &Denial) -> Self {
        Self {
            host: d
                .host
                .as_deref()
                .map(|h| h.trim_end_matches('.').to_ascii_lowercase()),
            port: d.port,
            reason: d.reason.clone(),
        }
    }

    /// Whether `self`, an answer's, is `listed`, an API entry's.
    fn answers(&self, listed: &Self) -> bool {
        self.host == listed.host
            && self.port == listed.port
            && (self.reason.is_none() || self.reason == listed.reason)
    }
}

impl Ledger {
    fn sides(&self) -> std::sync::MutexGuard<'_, LedgerSides> {
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let sides = &mut *guard;
        for side in [&mut sides.listed, &mut sides.answered] {
            side.retain(|(_, at)| now.duration_since(*at) < LEDGER_KEEP);
        }
        guard
    }

    /// The API lists `d`: `true` if an answer said it already (paired); else it is noted
    /// for its answer to claim.
    fn answered(&self, d: &Denial) -> bool {
        let key = Key::of(d);
        let mut sides = self.sides();
        if let Some(i) = sides.answered.iter().position(|(k, _)| k.answers(&key)) {
            sides.answered.remove(i);
            return true;
        }
        push_bounded(&mut sides.listed, key);
        false
    }

    /// An answer was `d`: `true` if the API listed (and said) it already (paired).
    fn claim_listed(&self, d: &Denial) -> bool {
        let key = Key::of(d);
        let mut sides = self.sides();
        match sides.listed.iter().position(|(k, _)| key.answers(k)) {
            Some(i) => {
                sides.listed.remove(i);
                true
            }
            None => false,
        }
    }

    /// An answer's `d` was said (the API had no entry for it yet).
    fn note_answer(&self, d: &Denial) {
        push_bounded(&mut self.sides().answered, Key::of(d));
    }
}

fn push_bounded(side: &mut VecDeque<(Key, Instant)>, key: Key) {
    if side.len() == LEDGER_MAX {
        side.pop_front();
    }
    side.push_back((key, Instant::now()));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(host: &str, reason: Option<&str>) -> Denial {
        Denial {
            protocol: "http",
            status: 403,
            reason: reason.map(str::to_owned),
            host: Some(host.into()),
            port: Some(443),
            detail: None,
            hint: None,
            message: None,
        }
    }

    #[test]
    fn each_denial_is_paired_once_whichever_side_saw_it_first() {
        let ledger = Ledger::default();
        // The API listed it first: its answer claims it, once.
        assert!(!ledger.answered(&denial("a.test", Some("not_in_allowlist"))));
        assert!(ledger.claim_listed(&denial("A.test.", Some("not_in_allowlist"))));
        assert!(!ledger.claim_listed(&denial("a.test", Some("not_in_allowlist"))));
        // An answer said it first (a SOCKS5 reply: no reason): the API's entry is skipped,
        // once; a second entry for the same host is said.
        ledger.note_answer(&denial("b.test", None));
        assert!(ledger.answered(&denial("b.test", Some("denied_by_rule"))));
        assert!(!ledger.answered(&denial("b.test", Some("denied_by_rule"))));
        // Another reason is another denial.
        ledger.note_answer(&denial("c.test", Some("not_in_allowlist")));
        assert!(!ledger.answered(&denial("c.test", Some("private_address"))));
    }
}
