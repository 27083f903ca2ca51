//! One denial, and the one place that says how it is answered on each wire (design
//! section 6): the HTTP status and the SOCKS5 REP code (RFC 1928 section 6) follow from the
//! decision's [`Reason`] and, where the reason alone does not say, its [`Cause`]. Nothing
//! sets a status or a REP code by hand: a denial is built once and never changed.
//!
//! The shim's `--report` uses the same mapping, so what it says a client got is what the
//! client got.

use policy::{Decision, Reason};

/// What exactly failed, where the reason alone does not determine the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Cause {
    /// The policy decided (grant, credential, SNI rule, watchdog, a limit): the reason says
    /// everything.
    #[default]
    Policy,
    /// The resolver did not answer within `timeouts.dns`.
    DnsTimeout,
    /// Every vetted address refused the connection.
    ConnectRefused,
    /// No vetted address answered within `timeouts.connect`.
    ConnectTimeout,
    /// Unreachable network or host, or another connect error.
    ConnectError,
    /// A forwarded request's upstream connection moved no byte for `timeouts.idle_tunnel`
    /// while its answer was awaited (`504`).
    ResponseTimeout,
    /// A request inside a terminated tunnel names another host than the tunnel's
    /// (RFC 9110 section 15.5.20: `421 Misdirected Request`).
    Misdirected,
    /// The denial came after the front-end's success reply: the client saw its CONNECT
    /// `200` (SOCKS5 REP 0x00), then the tunnel was cut (the SNI gate, TLS termination's
    /// SNI rule). The status and REP it was answered with are the success ones.
    AfterReply,
    /// A credential on the shared TCP listener was missing, malformed, for an unknown
    /// authority, or wrong: the client is answered with the same `407` whatever the case
    /// ([`Denial::public`]), so it cannot learn which authority names exist; the decision
    /// log keeps the real reason and detail.
    CredentialRejected,
    /// A SOCKS5 command other than CONNECT (BIND, UDP ASSOCIATE: REP 0x07).
    CommandNotSupported,
    /// A SOCKS5 address type other than IPv4, domain and IPv6 (REP 0x08).
    AddressTypeNotSupported,
    /// The host's answer to a question (design section 20) named what the mediator does
    /// not have (an `allow_via` authority that is not live): `403`, never the `407` of a
    /// credential.
    Answered,
    /// A limit (design section 13): the client may retry after this many seconds
    /// (`Retry-After`, RFC 9110 section 10.2.3).
    Limited {
        /// Whole seconds, at least 1.
        retry_after: u32,
    },
}

/// One denial, ready to be written in any protocol's wire format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// Machine-readable reason (design section 4.3).
    pub reason: Reason,
    /// What exactly failed, when the reason alone does not say how to answer.
    pub cause: Cause,
    /// Human detail (never a secret: callers redact raw input first).
    pub detail: String,
    /// What would make it work.
    pub hint: String,
    /// The grant entry that decided, if any.
    pub rule: Option<String>,
    /// The operator's own words for this denial (design section 18): a deny entry's
    /// `reason` or the grant's `default_deny_reason`; printable ASCII, at most 400 bytes.
    /// (A `Box<str>`: a denial travels in `Result::Err` and is kept small.)
    pub message: Option<Box<str>>,
    /// A configured authority that a failed credential named (wrong token, or no token
    /// configured): the decision log attributes the attempt to it, so a security team
    /// sees who is being impersonated. `None` for names that are not authorities.
    pub claimed_authority: Option<Box<str>>,
}

impl Denial {
    /// A denial for `reason`, decided by the policy ([`Cause::Policy`]).
    pub fn new(reason: Reason, detail: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            reason,
            cause: Cause::Policy,
            detail: detail.into(),
            hint: hint.into(),
            rule: None,
            message: None,
            claimed_authority: None,
        }
    }

    /// The `sni_mismatch` denial of a tunnel to `target` (design section 6).
    pub fn sni_mismatch(detail: impl Into<String>, target: &policy::Target) -> Self {
        Self::new(
            Reason::SniMismatch,
            detail,
            format!(
                "the TLS server name (SNI) must equal the tunnel host {}; connect to the host you name",
                target.host
            ),
        )
    }

    /// The `bad_request` denial of a request whose body the client sent wrong: not valid
    /// chunked coding (RFC 9112 section 7.1: every chunk-size line ends in CRLF), or cut
    /// short of its framing; `fault` says what hyper found.
    pub fn bad_body(fault: &str) -> Self {
        Self::new(
            Reason::BadRequest,
            format!("the request body could not be read: {fault}"),
            "send a body that matches its framing: Content-Length bytes, or chunked coding with CRLF line ends",
        )
    }

    /// The same denial with `cause`.
    #[must_use]
    pub fn with_cause(mut self, cause: Cause) -> Self {
        self.cause = cause;
        self
    }

    /// The same denial, naming the grant entry that decided.
    #[must_use]
    pub fn with_rule(mut self, rule: Option<String>) -> Self {
        self.rule = rule;
        self
    }

    /// The same denial, attributed to the configured authority a credential claimed.
    #[must_use]
    pub fn claiming(mut self, authority: Option<String>) -> Self {
        self.claimed_authority = authority.map(String::into_boxed_str);
        self
    }

    /// The HTTP status that answers it: 400 malformed, 407 credentials, 429 limits (and
    /// `ask_overloaded`), 502 DNS
    /// or upstream failure (504 on a timeout), 421 a misdirected terminated request, else
    /// 403.
    pub fn http_status(&self) -> u16 {
        http_status(self.reason, self.cause)
    }

    /// The `Retry-After` of a limit's denial, in seconds.
    pub fn retry_after(&self) -> Option<u32> {
        match self.cause {
            Cause::Limited { retry_after } => Some(retry_after),
            Cause::Policy
            | Cause::DnsTimeout
            | Cause::ConnectRefused
            | Cause::ConnectTimeout
            | Cause::ConnectError
            | Cause::ResponseTimeout
            | Cause::Misdirected
            | Cause::AfterReply
            | Cause::CredentialRejected
            | Cause::CommandNotSupported
            | Cause::AddressTypeNotSupported
            | Cause::Answered => None,
        }
    }

    /// What the client is told: the denial itself, except for a rejected credential,
    /// which is always the same `bad_credential` answer (design section 5: no authority
    /// enumeration through the answers).
    pub fn public(&self) -> std::borrow::Cow<'_, Self> {
        if self.cause != Cause::CredentialRejected {
            return std::borrow::Cow::Borrowed(self);
        }
        std::borrow::Cow::Owned(Self::new(
            Reason::BadCredential,
            "the proxy credential was missing or not accepted",
            "send the authority name as proxy user and its token as password \
             (Proxy-Authorization: Basic base64(authority:token), or SOCKS5 username/password); \
             your operator has them",
        ))
    }

    /// Whether the client's connection is closed after this answer (a limit's: the
    /// connection is answered, then closed).
    pub fn closes_connection(&self) -> bool {
        self.reason == Reason::RateLimited
    }

    /// The SOCKS5 REP code that answers it (RFC 1928 section 6): `0x02` not allowed by
    /// ruleset for policy denials, `0x04` host unreachable (DNS, timeouts, unreachable),
    /// `0x05` connection refused, `0x01` general failure (another upstream failure).
    pub fn socks_rep(&self) -> u8 {
        socks_rep(self.reason, self.cause)
    }
}

impl From<Decision> for Denial {
    fn from(d: Decision) -> Self {
        let mut denial = Self::new(d.reason, d.detail, d.hint).with_rule(d.rule);
        denial.message = d.message.map(String::into_boxed_str);
        denial
    }
}

/// The HTTP status of a denial with `reason` and `cause` (see [`Denial::http_status`]): for
/// a denial after the success reply, the success status the client saw.
pub fn http_status(reason: Reason, cause: Cause) -> u16 {
    match (reason, cause) {
        (_, Cause::AfterReply) => 200,
        (Reason::MalformedTarget | Reason::BadRequest, _) => 400,
        (_, Cause::Answered) => 403,
        (Reason::BadCredential | Reason::UnknownAuthority, _) => 407,
        (Reason::RateLimited | Reason::AskOverloaded, _) => 429,
        (Reason::RegistryUnavailable, _) => 503,
        (Reason::DnsFailure, Cause::DnsTimeout) => 504,
        (Reason::UpstreamFailure, Cause::ConnectTimeout | Cause::ResponseTimeout) => 504,
        (Reason::DnsFailure | Reason::UpstreamFailure, _) => 502,
        (_, Cause::Misdirected) => 421,
        (
            Reason::Allowed
            | Reason::NotInAllowlist
            | Reason::DeniedByRule
            | Reason::PrivateAddress
            | Reason::SpecialAddress
            | Reason::PortNotAllowed
            | Reason::SniMismatch
            | Reason::WatchdogDenied
            | Reason::CredentialMisuse
            | Reason::AskDenied
            | Reason::AskTimeout,
            _,
        ) => 403,
    }
}

/// The SOCKS5 REP code of a denial with `reason` and `cause` (see [`Denial::socks_rep`]).
pub fn socks_rep(reason: Reason, cause: Cause) -> u8 {
    match (reason, cause) {
        (_, Cause::AfterReply) => 0x00,
        (_, Cause::CommandNotSupported) => 0x07,
        (_, Cause::AddressTypeNotSupported) => 0x08,
        (Reason::DnsFailure, _) => 0x04,
        (Reason::UpstreamFailure, Cause::ConnectRefused) => 0x05,
        (
            Reason::UpstreamFailure,
            Cause::ConnectTimeout | Cause::ConnectError | Cause::ResponseTimeout,
        ) => 0x04,
        (Reason::UpstreamFailure | Reason::RegistryUnavailable | Reason::BadRequest, _) => 0x01,
        (
            Reason::Allowed
            | Reason::NotInAllowlist
            | Reason::DeniedByRule
            | Reason::PrivateAddress
            | Reason::SpecialAddress
            | Reason::MalformedTarget
            | Reason::PortNotAllowed
            | Reason::UnknownAuthority
            | Reason::BadCredential
            | Reason::SniMismatch
            | Reason::WatchdogDenied
            | Reason::RateLimited
            | Reason::CredentialMisuse
            | Reason::AskDenied
            | Reason::AskTimeout
            | Reason::AskOverloaded,
            _,
        ) => 0x02,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rejected_credential_gets_the_same_answer() {
        let unknown = Denial::new(Reason::UnknownAuthority, "no such authority \"alice\"", "x")
            .with_cause(Cause::CredentialRejected)
            .claiming(None);
        let wrong = Denial::new(Reason::BadCredential, "wrong token for \"bob\"", "y")
            .with_cause(Cause::CredentialRejected)
            .claiming(Some("bob".into()));
        let (a, b) = (unknown.public(), wrong.public());
        assert_eq!(a.as_ref(), b.as_ref());
        assert_eq!(a.reason, Reason::BadCredential);
        assert!(!a.detail.contains("alice") && !b.detail.contains("bob"));
        assert_eq!(a.http_status(), 407);
        // Other denials are told as they are.
        let other = Denial::new(Reason::NotInAllowlist, "d", "h");
        assert_eq!(other.public().as_ref(), &other);
    }

    #[test]
    fn every_reason_and_cause_maps_to_the_contract_codes() {
        let d = |r, c| Denial::new(r, "", "").with_cause(c);
        let rows = [
            (Reason::NotInAllowlist, Cause::Policy, 403, 0x02),
            (Reason::PrivateAddress, Cause::Policy, 403, 0x02),
            (Reason::MalformedTarget, Cause::Policy, 400, 0x02),
            (Reason::BadCredential, Cause::Policy, 407, 0x02),
            (Reason::UnknownAuthority, Cause::Policy, 407, 0x02),
            (Reason::RateLimited, Cause::Policy, 429, 0x02),
            (Reason::DnsFailure, Cause::Policy, 502, 0x04),
            (Reason::DnsFailure, Cause::DnsTimeout, 504, 0x04),
            (Reason::UpstreamFailure, Cause::Policy, 502, 0x01),
            (Reason::UpstreamFailure, Cause::ConnectRefused, 502, 0x05),
            (Reason::UpstreamFailure, Cause::ConnectTimeout, 504, 0x04),
            (Reason::UpstreamFailure, Cause::ResponseTimeout, 504, 0x04),
            (Reason::UpstreamFailure, Cause::ConnectError, 502, 0x04),
            (Reason::SniMismatch, Cause::Policy, 403, 0x02),
            (Reason::SniMismatch, Cause::Misdirected, 421, 0x02),
            (Reason::WatchdogDenied, Cause::Policy, 403, 0x02),
            (Reason::AskDenied, Cause::Policy, 403, 0x02),
            (Reason::AskTimeout, Cause::Policy, 403, 0x02),
            (
                Reason::AskOverloaded,
                Cause::Limited { retry_after: 1 },
                429,
                0x02,
            ),
            (
                Reason::RateLimited,
                Cause::Limited { retry_after: 3 },
                429,
                0x02,
            ),
        ];
        for (reason, cause, status, rep) in rows {
            let denial = d(reason, cause);
            assert_eq!(denial.http_status(), status, "{reason} {cause:?}");
            assert_eq!(denial.socks_rep(), rep, "{reason} {cause:?}");
        }
    }
}
