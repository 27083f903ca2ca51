//! The mediator's vocabulary that code branches on (design sections 2, 6 and 10): which
//! front-end a decision came from, why a connection closed, which kind of log line a record
//! is, which channel a peer used, and which TLS alert a client ended a handshake with.
//! Each is an enum whose string form exists only at serialisation (decision log, metrics
//! labels, admin API), so a new variant is a compile error at every `match` instead of a
//! string nobody compares against.
//!
//! This module is a leaf: it imports nothing from the crate. The TLS alert vocabulary
//! (the IANA registry's table) is in `tls.rs`.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod tls;

pub use tls::{CLIENT_REJECTED_CERTIFICATE, ClientTlsEnd, TlsAlert};

/// The protocol a decision was taken for (the `protocol` log field and metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// HTTP/1.1 `CONNECT host:port` (RFC 9110 section 9.3.6).
    Connect,
    /// Absolute-form forwarding of a plain `http://` request (RFC 9112 section 3.2.2).
    Http,
    /// SOCKS5 `CONNECT` (RFC 1928).
    Socks5,
    /// One request inside a TLS-terminated tunnel (design section 9).
    Tls,
}

impl Protocol {
    /// Every protocol, in contract order (metric series are created up front).
    pub const ALL: [Self; 4] = [Self::Connect, Self::Http, Self::Socks5, Self::Tls];

    /// The contract string: `connect`, `http`, `socks5` or `tls`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Http => "http",
            Self::Socks5 => "socks5",
            Self::Tls => "tls",
        }
    }

    /// How the route is used for this protocol: absolute-form forwarding (plain `http://`)
    /// or a byte tunnel (everything else).
    pub(crate) fn is_forwarding(self) -> bool {
        match self {
            Self::Http => true,
            Self::Connect | Self::Socks5 | Self::Tls => false,
        }
    }
}

/// Why an allowed connection closed (the `close_reason` field of a close record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// The client ended the connection (or both sides ended, the client first).
    ClientClosed,
    /// The upstream ended the connection first.
    UpstreamClosed,
    /// No byte moved in either direction for `timeouts.idle_tunnel`.
    IdleTimeout,
    /// A reset, a failed write, a failed handshake, or a connection that ended on no
    /// path that wrote its record (the connection's owner was dropped unfinished).
    Error,
    /// The mediator cut it: the shutdown grace is over.
    Shutdown,
    /// The mediator cut it: its authority was revoked (or the grant it was opened under
    /// replaced by a narrower one on reload) and the revoke grace is over.
    Revoked,
    /// The SNI gate refused the tunnel (design section 6); its close record is a deny.
    SniMismatch,
}

impl CloseReason {
    /// Every close reason.
    pub const ALL: [Self; 7] = [
        Self::ClientClosed,
        Self::UpstreamClosed,
        Self::IdleTimeout,
        Self::Error,
        Self::Shutdown,
        Self::Revoked,
        Self::SniMismatch,
    ];

    /// The contract string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClientClosed => "client_closed",
            Self::UpstreamClosed => "upstream_closed",
            Self::IdleTimeout => "idle_timeout",
            Self::Error => "error",
            Self::Shutdown => "shutdown",
            Self::Revoked => "revoked",
            Self::SniMismatch => "sni_mismatch",
        }
    }

    /// Whether the mediator ended the connection itself (idle, shutdown or revocation):
    /// such an end is a reset, never a clean close.
    pub fn is_cut(self) -> bool {
        matches!(self, Self::IdleTimeout | Self::Shutdown | Self::Revoked)
    }

    /// The verdict and reason a close record carries: a tunnel the SNI gate cut ends
    /// denied; every other close ends the allowed connection it closes.
    pub fn verdict(self) -> (policy::Verdict, policy::Reason) {
        match self {
            Self::SniMismatch => (policy::Verdict::Deny, policy::Reason::SniMismatch),
            Self::ClientClosed
            | Self::UpstreamClosed
            | Self::IdleTimeout
            | Self::Error
            | Self::Shutdown
            | Self::Revoked => (policy::Verdict::Allow, policy::Reason::Allowed),
        }
    }
}

/// Which kind of decision-log line a record is (the `event` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// A decision (allow or deny) was taken.
    Decision,
    /// An allowed connection closed.
    Close,
}

impl Event {
    /// Both events.
    pub const ALL: [Self; 2] = [Self::Decision, Self::Close];

    /// The contract string: `decision` or `close`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Decision => "decision",
            Self::Close => "close",
        }
    }
}

/// How a connection proved its authority (the `channel` field, design section 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// A per-authority Unix socket.
    Unix,
    /// The shared TCP listener, with a credential.
    Tcp,
    /// In-process (the shim's embedded mode, the demo).
    Embedded,
}

impl Channel {
    /// Every channel.
    pub const ALL: [Self; 3] = [Self::Unix, Self::Tcp, Self::Embedded];

    /// The contract string: `unix`, `tcp` or `embedded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unix => "unix",
            Self::Tcp => "tcp",
            Self::Embedded => "embedded",
        }
    }
}

/// The `limit` label of `mediator_limited_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitKind {
    /// An authority's cap on open connections.
    Connections,
    /// An authority's connect rate.
    Rate,
    /// An unidentified TCP connection shed to admit a newer one.
    Unidentified,
    /// `max_connections` reached: the listeners stopped accepting (once per episode).
    Global,
}

impl LimitKind {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::Rate => "rate",
            Self::Unidentified => "unidentified",
            Self::Global => "global",
        }
    }
}

/// The `kind` label of `mediator_upstream_errors_total`: a fixed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpstreamErrorKind {
    /// NXDOMAIN or no A/AAAA records.
    DnsNoRecords,
    /// No DNS answer in time.
    DnsTimeout,
    /// Any other resolver failure.
    DnsError,
    /// Every vetted address refused the connection.
    ConnectRefused,
    /// The connect deadline passed.
    ConnectTimeout,
    /// Unreachable network or host, or another connect error.
    ConnectError,
}

impl UpstreamErrorKind {
    /// Every kind (series are created up front so that dashboards see zeros).
    pub(crate) const ALL: [Self; 6] = [
        Self::DnsNoRecords,
        Self::DnsTimeout,
        Self::DnsError,
        Self::ConnectRefused,
        Self::ConnectTimeout,
        Self::ConnectError,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::DnsNoRecords => "dns_no_records",
            Self::DnsTimeout => "dns_timeout",
            Self::DnsError => "dns_error",
            Self::ConnectRefused => "connect_refused",
            Self::ConnectTimeout => "connect_timeout",
            Self::ConnectError => "connect_error",
        }
    }
}

/// How a configuration reload ended (`mediator_reloads_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReloadResult {
    /// Applied as a whole.
    Ok,
    /// Applied, but some authorities could not be (their old versions stay).
    Partial,
    /// Not applied: the file could not be read or parsed, or it was refused.
    Failed,
}

impl ReloadResult {
    /// Every result, for priming the series.
    pub(crate) const ALL: [Self; 3] = [Self::Ok, Self::Partial, Self::Failed];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Partial => "partial",
            Self::Failed => "failed",
        }
    }
}

/// How a question to the host ended (design section 20): the `outcome` of a record's
/// `asked` and the label of `mediator_asks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AskOutcome {
    /// Answered `allow_via`: judged again under the named authority (which may still deny).
    AllowVia,
    /// Answered `deny` (`ask_denied`).
    Deny,
    /// No answer in time, or the mediator shut down meanwhile (`ask_timeout`).
    Timeout,
    /// Not asked: the authority held `max_pending_asks` already (`ask_overloaded`).
    Overloaded,
    /// The client hung up while its request was held.
    HungUp,
    /// Nobody was there to ask (the embedding shim had no control connection open): the
    /// grant miss stood, at once.
    NoHost,
}

impl AskOutcome {
    /// Every outcome (metric series are created up front).
    pub const ALL: [Self; 6] = [
        Self::AllowVia,
        Self::Deny,
        Self::Timeout,
        Self::Overloaded,
        Self::HungUp,
        Self::NoHost,
    ];

    /// The contract string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllowVia => "allow_via",
            Self::Deny => "deny",
            Self::Timeout => "timeout",
            Self::Overloaded => "overloaded",
            Self::HungUp => "hung_up",
            Self::NoHost => "no_host",
        }
    }
}

macro_rules! string_forms {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                <$t>::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| serde::de::Error::custom(format!("unknown value {s:?}")))
            }
        }
    )*};
}

string_forms!(
    Protocol,
    CloseReason,
    Event,
    Channel,
    ClientTlsEnd,
    AskOutcome
);

/// Serialises a policy [`policy::Reason`] as its contract string (for `#[serde(serialize_with)]`).
pub(crate) fn serialize_reason<S: Serializer>(r: &policy::Reason, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(r.as_str())
}

/// Reads a policy [`policy::Reason`] from its contract string.
pub(crate) fn deserialize_reason<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<policy::Reason, D::Error> {
    parsed(d, policy::Reason::parse, "reason")
}

/// Reads a policy [`policy::Verdict`] from `allow` or `deny`.
pub(crate) fn deserialize_verdict<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<policy::Verdict, D::Error> {
    parsed(d, policy::Verdict::parse, "decision")
}

/// Reads a string and turns it into a `T` with `parse`; a string it does not know is the
/// error `unknown <what> "<string>"`.
fn parsed<'de, D: Deserializer<'de>, T>(
    d: D,
    parse: fn(&str) -> Option<T>,
    what: &str,
) -> Result<T, D::Error> {
    let s = String::deserialize(d)?;
    parse(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown {what} {s:?}")))
}

/// Serialises a policy [`policy::Verdict`] as `allow` or `deny`.
pub(crate) fn serialize_verdict<S: Serializer>(
    v: &policy::Verdict,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_strings() {
        let protocols: Vec<&str> = Protocol::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(protocols, ["connect", "http", "socks5", "tls"]);
        assert_eq!(
            serde_json::to_string(&CloseReason::IdleTimeout).unwrap(),
            "\"idle_timeout\""
        );
        assert_eq!(Event::Close.to_string(), "close");
        assert_eq!(Channel::Embedded.as_str(), "embedded");
        assert_eq!(
            CloseReason::SniMismatch.verdict(),
            (policy::Verdict::Deny, policy::Reason::SniMismatch)
        );
        assert!(Protocol::Http.is_forwarding() && !Protocol::Socks5.is_forwarding());
    }

    #[test]
    fn tls_alerts_read_back_by_code_and_name() {
        for &a in TlsAlert::ALL {
            assert_eq!(TlsAlert::from_code(a.code()), Some(a));
            let json = serde_json::to_string(&a).unwrap();
            assert_eq!(serde_json::from_str::<TlsAlert>(&json).unwrap(), a);
        }
        assert_eq!(TlsAlert::from_code(48), Some(TlsAlert::UnknownCa));
        assert_eq!(TlsAlert::UnknownCa.as_str(), "unknown_ca");
        assert_eq!(TlsAlert::from_code(200), None);
        let end = |a| ClientTlsEnd::of_alert(Some(a));
        assert_eq!(
            end(TlsAlert::CertificateUnknown).detail_word(),
            "client_rejected_certificate"
        );
        assert_eq!(end(TlsAlert::ProtocolVersion), ClientTlsEnd::Alert);
        assert_eq!(
            ClientTlsEnd::of_alert(None).detail_word(),
            "client_tls_alert"
        );
        assert!(ClientTlsEnd::ClosedAfterCertificate.rejects_certificate());
        assert_eq!(
            serde_json::to_string(&ClientTlsEnd::ClosedAfterCertificate).unwrap(),
            "\"closed_after_certificate\""
        );
    }
}
