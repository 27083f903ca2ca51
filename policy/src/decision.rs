//! Decisions: allow or deny, with a machine-readable reason (design section 4.3), the rule
//! that decided, and a detail and hint for people. The reason strings are metric label
//! values and part of the interface contract; this file never maps a decision to a wire
//! code (HTTP status, SOCKS reply), which the mediator does at its edge.

use std::fmt;

/// The outcome of a [`Decision`]: whether the connection (or request) may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The connection may proceed.
    Allow,
    /// The connection is refused.
    Deny,
}

impl Verdict {
    /// Both verdicts.
    pub const ALL: [Self; 2] = [Self::Allow, Self::Deny];

    /// The verdict whose [`Self::as_str`] is `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// The log and metric label value: `"allow"` or `"deny"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

/// Why a decision was taken. The string forms are metric label values and part of the
/// interface contract (design section 4.3); extend only with care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The grant allows the host and port, and every check passed.
    Allowed,
    /// No allow entry of the grant matches the host.
    NotInAllowlist,
    /// A deny entry (of the grant or the global deny list) matches.
    DeniedByRule,
    /// The destination address belongs to some host or organisation (loopback, RFC 1918,
    /// RFC 6598 shared space, link-local, unique-local).
    PrivateAddress,
    /// Any other non-global address: unspecified, documentation, benchmarking, reserved,
    /// multicast, broadcast, IPv4/IPv6 embeddings, the mediator's own listeners.
    SpecialAddress,
    /// The request target could not be parsed or canonicalised.
    MalformedTarget,
    /// The request head itself is not HTTP/1.1 the mediator takes (a bare CR, an
    /// obs-folded line, a `Transfer-Encoding` it does not implement): the client's fault,
    /// answered 400 before any target is read.
    BadRequest,
    /// The host matches an allow entry, but not on this port.
    PortNotAllowed,
    /// A credential names an authority that does not exist.
    UnknownAuthority,
    /// A credential is missing or wrong.
    BadCredential,
    /// The host could not be resolved.
    DnsFailure,
    /// The upstream connection failed (refused, reset, timed out).
    UpstreamFailure,
    /// The TLS ClientHello's SNI does not match the CONNECT host.
    SniMismatch,
    /// The watchdog hook denied (or did not answer in time).
    WatchdogDenied,
    /// A rate limit was hit.
    RateLimited,
    /// A request carried a placeholder of one of the authority's credentials (design
    /// section 14) to a host the credential does not belong to, or in clear text.
    CredentialMisuse,
    /// The authority comes from the registry (created through the admin API), and this
    /// replica cannot confirm its view of the registry is current (design section 17).
    RegistryUnavailable,
    /// A grant miss was held for the host's answer (design section 20) and the host
    /// answered `deny`; its text is the denial's `message`.
    AskDenied,
    /// A grant miss was held for the host's answer and none came within the authority's
    /// `ask_timeout_s` (or the mediator shut down meanwhile: held requests are never
    /// allowed by a shutdown).
    AskTimeout,
    /// A grant miss could not be held: the authority already holds `max_pending_asks`
    /// requests for the host's answer.
    AskOverloaded,
}

impl Reason {
    /// The reason whose [`Self::as_str`] is `s` (a log line's `reason`).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Every reason, in the order design section 4.3 lists them.
    pub const ALL: [Self; 20] = [
        Self::Allowed,
        Self::NotInAllowlist,
        Self::DeniedByRule,
        Self::PrivateAddress,
        Self::SpecialAddress,
        Self::MalformedTarget,
        Self::PortNotAllowed,
        Self::UnknownAuthority,
        Self::BadCredential,
        Self::DnsFailure,
        Self::UpstreamFailure,
        Self::SniMismatch,
        Self::WatchdogDenied,
        Self::RateLimited,
        Self::CredentialMisuse,
        Self::RegistryUnavailable,
        Self::BadRequest,
        Self::AskDenied,
        Self::AskTimeout,
        Self::AskOverloaded,
    ];

    /// The contract string: `allowed`, `not_in_allowlist`, ... (design section 4.3).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::NotInAllowlist => "not_in_allowlist",
            Self::DeniedByRule => "denied_by_rule",
            Self::PrivateAddress => "private_address",
            Self::SpecialAddress => "special_address",
            Self::MalformedTarget => "malformed_target",
            Self::BadRequest => "bad_request",
            Self::PortNotAllowed => "port_not_allowed",
            Self::UnknownAuthority => "unknown_authority",
            Self::BadCredential => "bad_credential",
            Self::DnsFailure => "dns_failure",
            Self::UpstreamFailure => "upstream_failure",
            Self::SniMismatch => "sni_mismatch",
            Self::WatchdogDenied => "watchdog_denied",
            Self::RateLimited => "rate_limited",
            Self::CredentialMisuse => "credential_misuse",
            Self::RegistryUnavailable => "registry_unavailable",
            Self::AskDenied => "ask_denied",
            Self::AskTimeout => "ask_timeout",
            Self::AskOverloaded => "ask_overloaded",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decision: verdict, reason, the grant entry that decided it (if any), a human detail
/// and a hint telling an agent what would make the request work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Allow or deny.
    pub verdict: Verdict,
    /// Machine-readable reason (design section 4.3).
    pub reason: Reason,
    /// The rule that matched, as written in the grant (`"*.example.com:443"`), or `None`.
    pub rule: Option<String>,
    /// What happened, for a human (`"93.184.216.34 is not in the allow list"`).
    pub detail: String,
    /// What would make it work (`"add \"example.com:443\" to the authority's allow list"`).
    pub hint: String,
    /// The operator's own words (design section 18): the `reason` of the deny entry that
    /// matched, or the grant's `default_deny_reason` for a host outside it. Printable
    /// ASCII, at most [`MAX_OPERATOR_REASON`] bytes; `None` when the operator wrote none.
    pub message: Option<String>,
}

/// The longest operator reason, in bytes (design section 18).
pub const MAX_OPERATOR_REASON: usize = 400;

/// Checks an operator reason (a deny entry's `reason`, a `default_deny_reason`): 1 to
/// [`MAX_OPERATOR_REASON`] bytes of printable ASCII (0x20 to 0x7E), so that it can travel
/// in a JSON body, a log line, an HTTP header and an SSH disconnect message unchanged.
///
/// # Errors
/// What is wrong with it, for a configuration error message.
pub fn check_operator_reason(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("a reason must not be empty".to_owned());
    }
    if text.len() > MAX_OPERATOR_REASON {
        return Err(format!(
            "a reason is at most {MAX_OPERATOR_REASON} bytes; this one has {}",
            text.len()
        ));
    }
    if let Some((i, c)) = text.char_indices().find(|(_, c)| !(' '..='~').contains(c)) {
        return Err(format!(
            "a reason is printable ASCII only; byte {i} is {c:?}"
        ));
    }
    Ok(())
}

impl Decision {
    /// An allow decision by `rule`.
    pub(crate) fn allow(rule: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Allow,
            reason: Reason::Allowed,
            rule: Some(rule.into()),
            detail: String::new(),
            hint: String::new(),
            message: None,
        }
    }

    /// A deny decision with `reason`, `detail` and `hint`, matched by no rule.
    pub(crate) fn deny(reason: Reason, detail: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Deny,
            reason,
            rule: None,
            detail: detail.into(),
            hint: hint.into(),
            message: None,
        }
    }

    /// The same decision, naming `rule` as the one that decided it.
    #[must_use]
    pub(crate) fn with_rule(mut self, rule: impl Into<String>) -> Self {
        self.rule = Some(rule.into());
        self
    }

    /// The same decision, carrying the operator's `message` (if any).
    #[must_use]
    pub(crate) fn with_message(mut self, message: Option<&String>) -> Self {
        self.message = message.cloned();
        self
    }

    /// `true` when the verdict is [`Verdict::Allow`].
    pub fn is_allow(&self) -> bool {
        self.verdict == Verdict::Allow
    }
}
