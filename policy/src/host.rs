//! Host canonicalisation (design section 4.1): the one place where an untrusted host
//! string becomes a [`CanonicalHost`]. Every later step (decision, routing, TLS rules,
//! logs) uses only the canonical form, so this module must accept exactly one spelling of
//! each host and reject every ambiguous one (`127.1`, `0x7f.1`, zone IDs, userinfo, ...).

use std::fmt;
use std::net::IpAddr;

use crate::error::PolicyError;

/// A destination host in canonical form: a DNS name (lowercase A-labels, no trailing dot)
/// or an IP address (IPv4-mapped IPv6 unwrapped to IPv4).
///
/// Built only by [`canonicalize_host`] (or [`parse_authority_form`]), so holding one proves
/// the checks ran.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CanonicalHost(HostInner);

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum HostInner {
    Name(String),
    Ip(IpAddr),
}

impl CanonicalHost {
    /// The IP address, when the host is an IP literal.
    pub fn ip(&self) -> Option<IpAddr> {
        match &self.0 {
            HostInner::Ip(ip) => Some(*ip),
            HostInner::Name(_) => None,
        }
    }

    /// The DNS name (lowercase A-labels, no trailing dot), when the host is a name.
    pub fn name(&self) -> Option<&str> {
        match &self.0 {
            HostInner::Name(n) => Some(n),
            HostInner::Ip(_) => None,
        }
    }

    /// The host as text: the name, dotted-quad IPv4, or compressed IPv6 *without*
    /// brackets (`2001:db8::1`). Use [`CanonicalHost::to_uri_host`] in URIs and request lines.
    pub fn as_text(&self) -> String {
        match &self.0 {
            HostInner::Name(n) => n.clone(),
            HostInner::Ip(ip) => ip.to_string(),
        }
    }

    /// The host as it appears in a URI or authority-form: IPv6 bracketed (`[2001:db8::1]`).
    pub fn to_uri_host(&self) -> String {
        match &self.0 {
            HostInner::Ip(IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => self.as_text(),
        }
    }

    pub(crate) fn from_name_unchecked(name: String) -> Self {
        Self(HostInner::Name(name))
    }

    pub(crate) fn from_ip(ip: IpAddr) -> Self {
        Self(HostInner::Ip(ip))
    }
}

impl fmt::Display for CanonicalHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_text())
    }
}

/// A destination: canonical host and TCP port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// The canonical host.
    pub host: CanonicalHost,
    /// The TCP port, 1..=65535 (port 0 is rejected as malformed).
    pub port: u16,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host.to_uri_host(), self.port)
    }
}

/// Canonicalises one host string (no port, no brackets except around an IPv6 literal).
///
/// Applies, in order: rejection of empty input, NUL/CR/LF/space/`%`/`@`/`/` and other
/// characters outside a host; brackets only around an IPv6 literal; lowercase; strip one
/// trailing dot; IPv4 only in canonical dotted-quad (rejects `127.1`, `0x7f.0.0.1`,
/// `2130706433`, `0177.0.0.1`, `01.2.3.4`); IPv6 compressed with IPv4-mapped unwrapped;
/// zone IDs rejected; names mapped by UTS-46 (IDNA) to A-labels, each label 1..=63 bytes of
/// letters, digits, hyphen and underscore, the whole name at most 253 bytes. A name that
/// looks numeric in its last label (`1.2.3`, `example.123`) is rejected (WHATWG URL rules
/// would treat it as an IPv4 number).
///
/// # Errors
/// [`PolicyError::Host`] naming the input and what is wrong with it.
pub fn canonicalize_host(input: &str) -> Result<CanonicalHost, PolicyError> {
    todo!("{input}")
}

/// Parses an RFC 9110 section 3.2 / RFC 9112 section 3.2.3 authority-form target
/// (`host:port`, `[v6]:port`) as used by CONNECT. The port is required, decimal, 1..=65535,
/// without sign or leading `+`. Userinfo (`user@host:port`) is rejected.
///
/// # Errors
/// [`PolicyError::Host`] naming the input and what is wrong with it.
pub fn parse_authority_form(input: &str) -> Result<Target, PolicyError> {
    todo!("{input}")
}
