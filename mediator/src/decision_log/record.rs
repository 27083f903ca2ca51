//! The decision log's record (design section 10): one typed [`Record`] per decision and
//! per closed connection, serialised as one JSON line, and read back (`Deserialize`) by
//! `mediator suggest`, the shim's report and the tests. Never a secret: tokens and
//! `Proxy-Authorization` values never reach a record.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use policy::{Reason, Verdict};

use crate::denial::Cause;
use crate::vocab::{
    Channel, ClientTlsEnd, CloseReason, Event, Protocol, TlsAlert, deserialize_reason,
    deserialize_verdict, serialize_reason, serialize_verdict,
};

/// How a connection proved its authority, with the peer it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A per-authority Unix socket; credentials from `SO_PEERCRED`.
    Unix {
        /// Peer process id (`None` if the kernel did not report one).
        pid: Option<i32>,
        /// Peer user id.
        uid: u32,
        /// Peer group id.
        gid: u32,
    },
    /// The shared TCP listener; the peer's address.
    Tcp(std::net::SocketAddr),
    /// In-process (embedded mode, demo): no socket peer.
    Embedded,
}

impl Peer {
    /// The `channel` field.
    pub fn channel(&self) -> Channel {
        match self {
            Self::Unix { .. } => Channel::Unix,
            Self::Tcp(_) => Channel::Tcp,
            Self::Embedded => Channel::Embedded,
        }
    }
}

impl Serialize for Peer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        match self {
            Self::Unix { pid, uid, gid } => {
                m.serialize_entry("pid", pid)?;
                m.serialize_entry("uid", uid)?;
                m.serialize_entry("gid", gid)?;
            }
            Self::Tcp(addr) => m.serialize_entry("addr", &addr.to_string())?,
            Self::Embedded => {}
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Peer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            pid: Option<i32>,
            uid: Option<u32>,
            gid: Option<u32>,
            addr: Option<String>,
        }
        let f = Fields::deserialize(d)?;
        match (f.uid, f.gid, f.addr) {
            (Some(uid), Some(gid), None) => Ok(Self::Unix {
                pid: f.pid,
                uid,
                gid,
            }),
            (None, None, Some(addr)) => addr
                .parse()
                .map(Self::Tcp)
                .map_err(serde::de::Error::custom),
            (None, None, None) => Ok(Self::Embedded),
            _ => Err(serde::de::Error::custom(
                "a peer is uid/gid, addr, or nothing",
            )),
        }
    }
}

/// One decision-log line (design section 10): a decision, or the close of an allowed
/// connection. Close-only fields are omitted on decision lines. Every field that code
/// branches on is typed; strings appear only when the record is serialised. It reads back
/// too (`Deserialize`), so a test or a tool parses a line into the same type.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// A decision or a close.
    pub event: Event,
    /// RFC 3339 UTC timestamp with milliseconds.
    pub ts: String,
    /// Decision id, unique within this mediator process.
    pub id: u64,
    /// Id of the client connection the decision was taken on.
    pub conn: u64,
    /// Authority name; `None` when the channel did not establish one.
    pub authority: Option<String>,
    /// The channel the connection came in on.
    pub channel: Channel,
    /// Peer credentials (unix) or address (tcp).
    pub peer: Peer,
    /// The front-end (or `tls` for a request inside a terminated tunnel).
    pub protocol: Protocol,
    /// Canonical host, or the raw target (escaped) when it could not be canonicalised.
    pub host: Option<String>,
    /// Destination port.
    pub port: Option<u16>,
    /// Allow or deny.
    #[serde(
        serialize_with = "serialize_verdict",
        deserialize_with = "deserialize_verdict"
    )]
    pub decision: Verdict,
    /// Reason (design section 4.3).
    #[serde(
        serialize_with = "serialize_reason",
        deserialize_with = "deserialize_reason"
    )]
    pub reason: Reason,
    /// The grant entry that decided, as written.
    pub rule: Option<String>,
    /// Human-readable detail.
    pub detail: String,
    /// Denials: what would make it work, as the client was told (not logged: the client's
    /// answer carries it; a [`Tap`](super::Tap) sees it).
    #[serde(skip)]
    pub hint: String,
    /// Denials: the operator's own words (a deny entry's `reason`, or the grant's
    /// `default_deny_reason`, design section 18); omitted when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// What exactly failed, when the reason alone does not say how the client was
    /// answered (not logged: [`crate::Denial::http_status`] and
    /// [`crate::Denial::socks_rep`] derive the wire answer from it).
    #[serde(skip)]
    pub cause: Cause,
    /// The vetted address connected to.
    pub pin: Option<String>,
    /// `"direct"` or the parent proxy taken.
    pub route: Option<String>,
    /// Time spent resolving, in milliseconds.
    pub dns_ms: Option<f64>,
    /// Time spent connecting upstream, in milliseconds.
    pub connect_ms: Option<f64>,
    /// Close lines: bytes client -> upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_up: Option<u64>,
    /// Close lines: bytes upstream -> client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_down: Option<u64>,
    /// Close lines: connection lifetime in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Close lines: why it closed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub close_reason: Option<CloseReason>,
    /// Close lines of a terminated tunnel whose client ended the TLS handshake instead of
    /// completing it: how (`rejected_certificate`, `closed_after_certificate`: it does
    /// not trust the mediator's CA; `alert`); `detail` says it in words, starting with
    /// `client_rejected_certificate` or `client_tls_alert`. Omitted otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_tls: Option<ClientTlsEnd>,
    /// The same lines: the alert the client sent (`unknown_ca`), when it sent one the
    /// registry lists. Omitted otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_alert: Option<TlsAlert>,
    /// Requests inside a TLS-terminated tunnel (`protocol: "tls"`) and plain requests to
    /// a terminated host: the method.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The same requests' path, its query replaced by `?<redacted>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `true` on the lines of a connection the shim captured transparently (design section
    /// 15); omitted otherwise. On a Unix socket it is the client's own claim (the
    /// `X-Mediator-Capture` header of its CONNECT); in embedded mode the shim sets it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub capture: bool,
    /// Requests the mediator added a held secret to (design section 14): each
    /// credential's header and host, never its value; omitted when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credential: Vec<CredentialUse>,
    /// The close record of an upgraded request inside a terminated tunnel: the protocol
    /// it was upgraded to, its token in lowercase (`websocket`, also for an HTTP/2
    /// extended CONNECT; a token a request rule allows); omitted otherwise.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_upgrade",
        deserialize_with = "deserialize_upgrade"
    )]
    pub upgrade: Option<policy::UpgradeToken>,
}

fn serialize_upgrade<S: serde::Serializer>(
    token: &Option<policy::UpgradeToken>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match token {
        Some(t) => s.serialize_str(t.as_str()),
        None => s.serialize_none(),
    }
}

fn deserialize_upgrade<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<policy::UpgradeToken>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| policy::UpgradeToken::parse(s.as_bytes()).map_err(serde::de::Error::custom))
        .transpose()
}

/// One credential added to a request: which header, for which host pattern (as written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialUse {
    /// The header, lowercase (`authorization`).
    pub header: String,
    /// The credential's host pattern (`api.github.com`).
    pub host: String,
}

/// The current time as RFC 3339 UTC with milliseconds (`2026-11-29T08:56:13.123Z`).
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// One line the writer takes: a decision record, or an audit record (design section 21),
/// stamped, rendered and shipped alike.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Line<'a> {
    /// A decision or a close.
    Decision(&'a Record),
    /// A change to who may reach what.
    Audit(&'a crate::audit::record::AuditRecord),
}
