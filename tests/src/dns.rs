//! A programmable DNS server on loopback (UDP, `127.0.0.1:0`) so that the mediator's
//! resolver can be pointed at answers the test chooses, without touching the system
//! resolver or the internet.
//!
//! It answers `A` and `AAAA` queries from a table `name -> sequence of answer sets`:
//! the n-th query of one record type for a name gets the n-th answer set (the last set
//! repeats once the sequence is exhausted), which is how the DNS-rebinding test makes two
//! consecutive resolutions disagree. Unknown names get `NXDOMAIN`. Every answer carries
//! TTL 0 so a caching resolver cannot hide a second resolution. Queries are counted per
//! name and record type.
//!
//! Answering a non-loopback address (e.g. `10.0.0.1`) is fine: that is data for the
//! mediator to refuse. This server must never *connect* anywhere.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result};
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// The record types the server counts separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueryKind {
    /// `A` (IPv4 addresses).
    A,
    /// `AAAA` (IPv6 addresses).
    Aaaa,
    /// Any other record type (answered with an empty NOERROR for known names).
    Other,
}

#[derive(Debug, Default)]
struct State {
    /// Canonical name -> answer sets, consumed one per query of each kind.
    zones: HashMap<String, Vec<Vec<IpAddr>>>,
    /// (canonical name, kind) -> number of queries seen.
    counts: HashMap<(String, QueryKind), usize>,
}

/// A UDP DNS server on `127.0.0.1` answering from a table the test programs.
///
/// Dropping it stops the server task.
#[derive(Debug)]
pub struct DnsServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

/// Lowercases and strips one trailing dot, so that `Origin.Test.` and `origin.test` are
/// the same table key.
fn canonical(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    lower
        .strip_suffix('.')
        .map_or_else(|| lower.clone(), str::to_owned)
}

impl DnsServer {
    /// Binds `127.0.0.1:0` (UDP) and starts answering on the current tokio runtime.
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub async fn start() -> Result<Self> {
        let socket = UdpSocket::bind("127.0.0.1:0")
            .await
            .context("binding the test DNS server on 127.0.0.1:0")?;
        let addr = socket.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let task = tokio::spawn(serve(socket, Arc::clone(&state)));
        Ok(Self { addr, state, task })
    }

    /// The `ip:port` to put in the mediator's `[resolver] nameservers`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes `name` answer `addrs` to every query (IPv4 addresses in `A` answers, IPv6 in
    /// `AAAA` answers). Replaces any earlier entry.
    pub fn set(&self, name: &str, addrs: impl IntoIterator<Item = IpAddr>) {
        self.set_sequence(name, vec![addrs.into_iter().collect()]);
    }

    /// Makes `name` answer `steps[n]` to its n-th query of each record type, and the last
    /// step to every later query. An empty step answers NOERROR with no records.
    pub fn set_sequence(&self, name: &str, steps: Vec<Vec<IpAddr>>) {
        self.lock().zones.insert(canonical(name), steps);
    }

    /// Forgets `name`: later queries get `NXDOMAIN`.
    pub fn remove(&self, name: &str) {
        self.lock().zones.remove(&canonical(name));
    }

    /// How many queries of `kind` arrived for `name` (case-insensitive, trailing dot
    /// ignored), whether or not the name is known.
    pub fn queries_of(&self, name: &str, kind: QueryKind) -> usize {
        self.lock()
            .counts
            .get(&(canonical(name), kind))
            .copied()
            .unwrap_or(0)
    }

    /// How many queries of any type arrived for `name`.
    pub fn queries(&self, name: &str) -> usize {
        [QueryKind::A, QueryKind::Aaaa, QueryKind::Other]
            .into_iter()
            .map(|k| self.queries_of(name, k))
            .sum()
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(socket: UdpSocket, state: Arc<Mutex<State>>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((len, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let Some(reply) = answer(&buf[..len], &state) else {
            continue;
        };
        // A lost reply only makes the resolver retry; nothing to do about it here.
        let _ = socket.send_to(&reply, peer).await;
    }
}

/// Builds the reply bytes for one query datagram; `None` for garbage we cannot even
/// parse (the resolver then times out, which no test relies on).
fn answer(datagram: &[u8], state: &Mutex<State>) -> Option<Vec<u8>> {
    let request = Message::from_vec(datagram).ok()?;
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
    reply.metadata.recursion_desired = request.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.metadata.authoritative = true;
    if request.metadata.op_code != OpCode::Query || request.queries.len() != 1 {
        reply.metadata.response_code = ResponseCode::NotImp;
        return reply.to_vec().ok();
    }
    let query = request.queries[0].clone();
    reply.add_query(query.clone());
    let name = canonical(&query.name().to_ascii());
    let kind = match query.query_type() {
        RecordType::A => QueryKind::A,
        RecordType::AAAA => QueryKind::Aaaa,
        _ => QueryKind::Other,
    };
    let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
    let count = st.counts.entry((name.clone(), kind)).or_insert(0);
    let index = *count;
    *count += 1;
    let Some(steps) = st.zones.get(&name) else {
        reply.metadata.response_code = ResponseCode::NXDomain;
        return reply.to_vec().ok();
    };
    let step = steps
        .get(index)
        .or_else(|| steps.last())
        .cloned()
        .unwrap_or_default();
    drop(st);
    for ip in step {
        let rdata = match (kind, ip) {
            (QueryKind::A, IpAddr::V4(v4)) => RData::A(A(v4)),
            (QueryKind::Aaaa, IpAddr::V6(v6)) => RData::AAAA(AAAA(v6)),
            _ => continue,
        };
        // TTL 0: a caching resolver must come back to us for every resolution.
        reply.add_answer(Record::from_rdata(query.name().clone(), 0, rdata));
    }
    reply.to_vec().ok()
}
