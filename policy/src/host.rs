//! Host canonicalisation (design section 4.1): the one place where an untrusted host
//! string becomes a [`CanonicalHost`]. Every later step (decision, routing, TLS rules,
//! logs) uses only the canonical form, so this module must accept exactly one spelling of
//! each host and reject every ambiguous one (`127.1`, `0x7f.1`, zone IDs, userinfo, ...).
//! It never resolves a name: a canonical host is a spelling, not an address.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use crate::error::{HostError, PolicyError};

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
            HostInner::Ip(IpAddr::V4(_)) | HostInner::Name(_) => self.as_text(),
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

/// The longest host input looked at; anything longer cannot be a valid host (a name is at
/// most 253 bytes, but IDN input may be longer before mapping) and is rejected before any
/// IDNA work is spent on it.
const MAX_INPUT_BYTES: usize = 1024;

/// Canonicalises one host string (no port, no brackets except around an IPv6 literal).
///
/// Applies, in order: rejection of empty input, NUL/CR/LF/space/`%`/`@`/`/` and other
/// characters outside a host; brackets only around an IPv6 literal; lowercase; strip one
/// trailing dot; IPv4 only in canonical dotted-quad (rejects `127.1`, `0x7f.0.0.1`,
/// `2130706433`, `0177.0.0.1`, `01.2.3.4`); IPv6 compressed with IPv4-mapped unwrapped;
/// zone IDs rejected; names mapped by UTS-46 (IDNA) to A-labels, each label 1..=63 bytes of
/// letters, digits, hyphen and underscore, the whole name at most 253 bytes. A name that
/// looks numeric in its last label (`1.2.3`, `example.123`, `example.0x1f`) is rejected
/// (WHATWG URL rules would treat it as an IPv4 number).
///
/// Further decisions, each keeping one spelling per host:
/// - an IPv4 literal with a trailing dot (`1.2.3.4.`) is rejected;
/// - two trailing dots (`example.com..`) are rejected (only one is stripped);
/// - a bare IPv6 literal (`2001:db8::1`) and a bracketed one (`[2001:db8::1]`) are both
///   accepted and give the same host; brackets around anything else are rejected;
/// - an IPv4 literal spelled with non-ASCII digits (full-width `１２７.０.０.１`) is
///   rejected rather than mapped.
///
/// # Errors
/// [`PolicyError::Host`] naming the input and what is wrong with it.
pub fn canonicalize_host(input: &str) -> Result<CanonicalHost, PolicyError> {
    canonicalize_inner(input).map_err(|why| PolicyError::Host {
        input: input.to_owned(),
        why,
    })
}

/// [`canonicalize_host`] with only the reason as error, for callers that put it in an error
/// of their own (authority-form targets, grant patterns).
pub(crate) fn canonicalize_inner(input: &str) -> Result<CanonicalHost, HostError> {
    if input.is_empty() {
        return Err(HostError::Empty);
    }
    if input.len() > MAX_INPUT_BYTES {
        return Err(HostError::TooLong(MAX_INPUT_BYTES));
    }
    if let Some(rest) = input.strip_prefix('[') {
        let Some(inner) = rest.strip_suffix(']') else {
            return Err(HostError::UnclosedBracket);
        };
        screen_chars(inner)?;
        if !inner.contains(':') {
            return Err(HostError::BracketsNotIpv6);
        }
        return parse_ipv6(inner);
    }
    screen_chars(input)?;
    if input.contains(':') {
        return parse_ipv6(input).map_err(|why| {
            if input.matches(':').count() == 1 {
                HostError::PortNotAllowed
            } else {
                why
            }
        });
    }

    let lower = input.to_ascii_lowercase();
    let (body, trailing_dot) = match lower.strip_suffix('.') {
        Some(b) => (b, true),
        None => (lower.as_str(), false),
    };
    if body.is_empty() {
        return Err(HostError::Empty);
    }
    if body.ends_with('.') {
        return Err(HostError::TrailingDots);
    }

    if body.is_ascii() && last_label_is_numeric(body) {
        if trailing_dot {
            return Err(HostError::Ipv4TrailingDot);
        }
        return parse_dotted_quad(body).map(|v4| CanonicalHost::from_ip(IpAddr::V4(v4)));
    }

    let mapped = if body.is_ascii() && body.bytes().all(is_host_byte) {
        // Fast path: already lowercase LDH+underscore ASCII; UTS-46 would only validate
        // `xn--` labels, which we still send through it below.
        if body.split('.').any(|l| l.starts_with("xn--")) {
            idna_to_ascii(body)?
        } else {
            body.to_owned()
        }
    } else {
        idna_to_ascii(body)?
    };

    check_name(&mapped)?;
    if last_label_is_numeric(&mapped) {
        return Err(HostError::MapsToNumeric(mapped));
    }
    Ok(CanonicalHost::from_name_unchecked(mapped))
}

/// Bytes allowed in a canonical name (after lowercasing and mapping).
fn is_host_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'
}

/// Rejects ASCII characters that can never be part of a host, with a message saying what
/// they usually mean. Non-ASCII characters pass to UTS-46 mapping and the checks after it.
fn screen_chars(s: &str) -> Result<(), HostError> {
    for c in s.chars() {
        if !c.is_ascii() || c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':') {
            continue;
        }
        return Err(match c {
            '@' => HostError::Userinfo,
            '/' | '\\' | '?' | '#' => HostError::PathChar(c),
            '%' => HostError::Percent,
            '[' | ']' => HostError::StrayBracket,
            c if c.is_ascii_control() || c == ' ' => HostError::ControlChar(c),
            c => HostError::BadChar(c),
        });
    }
    Ok(())
}

fn parse_ipv6(s: &str) -> Result<CanonicalHost, HostError> {
    if s.contains('%') {
        return Err(HostError::ZoneId);
    }
    let v6: Ipv6Addr = s.parse().map_err(|_| HostError::BadIpv6(s.to_owned()))?;
    Ok(CanonicalHost::from_ip(match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }))
}

/// The WHATWG URL "ends in a number" check: the last label is all ASCII digits, or `0x`
/// followed by zero or more hex digits. Such names would be parsed as IPv4 by browsers and
/// many libraries, so they are either a canonical dotted quad or rejected.
fn last_label_is_numeric(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    match last.strip_prefix("0x").or_else(|| last.strip_prefix("0X")) {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// Parses exactly four decimal octets 0..=255 without leading zeros (`0` alone is fine).
fn parse_dotted_quad(s: &str) -> Result<std::net::Ipv4Addr, HostError> {
    let numeric = |l: &str| {
        !l.is_empty()
            && (l.bytes().all(|b| b.is_ascii_digit())
                || l.strip_prefix("0x")
                    .or_else(|| l.strip_prefix("0X"))
                    .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit())))
    };
    if !s.split('.').all(numeric) {
        return Err(HostError::NumericLastLabel(s.to_owned()));
    }
    let bad = |what: &'static str| {
        Err(HostError::NotDottedQuad {
            input: s.to_owned(),
            what,
        })
    };
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 4 {
        return bad("it must have exactly four parts");
    }
    let mut octets = [0u8; 4];
    for (slot, part) in octets.iter_mut().zip(&parts) {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return bad("each part must be decimal digits");
        }
        if part.len() > 1 && part.starts_with('0') {
            return bad("leading zeros are not allowed");
        }
        match part.parse::<u8>() {
            Ok(v) => *slot = v,
            Err(_) => return bad("each part must be at most 255"),
        }
    }
    Ok(std::net::Ipv4Addr::from(octets))
}

fn idna_to_ascii(s: &str) -> Result<String, HostError> {
    // UseSTD3ASCIIRules=false (AsciiDenyList::EMPTY) so that `_dmarc.example.com` passes;
    // the characters of the result are checked by `check_name` instead.
    idna::uts46::Uts46::new()
        .to_ascii(
            s.as_bytes(),
            idna::uts46::AsciiDenyList::EMPTY,
            idna::uts46::Hyphens::Allow,
            idna::uts46::DnsLength::Ignore,
        )
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| HostError::Idna)
}

/// Checks a mapped name: only `[a-z0-9_-]` labels of 1..=63 bytes, at most 253 bytes.
fn check_name(name: &str) -> Result<(), HostError> {
    if name.len() > 253 {
        return Err(HostError::NameTooLong(name.len()));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(HostError::EmptyLabel);
        }
        if label.len() > 63 {
            return Err(HostError::LabelTooLong(label.len()));
        }
        if let Some(c) = label
            .chars()
            .find(|&c| !c.is_ascii() || !is_host_byte(c as u8))
        {
            return Err(HostError::MappedChar(c));
        }
    }
    Ok(())
}

/// Parses an RFC 9110 section 3.2 / RFC 9112 section 3.2.3 authority-form target
/// (`host:port`, `[v6]:port`) as used by CONNECT. The port is required, decimal, 1..=65535,
/// without sign or leading `+`, and without leading zeros (`example.com:0443` is rejected
/// so that each port has one spelling). Userinfo (`user@host:port`) is rejected, and so
/// is an IPv6 literal without brackets. The host is canonicalised by [`canonicalize_host`].
///
/// # Errors
/// [`PolicyError::Host`] naming the input and what is wrong with it. Near misses are named
/// as such, with the target probably meant when it is valid: a URL (`http://host:8081/`:
/// `e.g. "host:8081"`; without a port, 80 for `http` and 443 for `https`), a path, query or
/// fragment (`host:80/x`), userinfo (never repeated in the message), an unbracketed IPv6
/// literal followed by a port (`2001:db8::1:443`: `"[2001:db8::1]:443"`).
pub fn parse_authority_form(input: &str) -> Result<Target, PolicyError> {
    authority_form(input).map_err(|why| PolicyError::Host {
        input: input.to_owned(),
        why,
    })
}

/// [`parse_authority_form`] with only the reason as error.
fn authority_form(input: &str) -> Result<Target, HostError> {
    if let Some(why) = not_a_target(input) {
        return Err(why);
    }
    let (host, port) = split_host_port(input)?;
    let Some(port) = port else {
        return Err(HostError::PortRequired);
    };
    let port = parse_port(port)?;
    let host = canonicalize_inner(host)?;
    Ok(Target { host, port })
}

/// Why `input` cannot be a target when it is a URL, holds a path, query or fragment, or
/// holds userinfo (no host or port can hold `://`, `/`, `?`, `#` or `@`, so these inputs
/// are rejected whatever else they hold), and the target probably meant when that one is
/// valid. `None` for every other input.
fn not_a_target(input: &str) -> Option<HostError> {
    let (problem, scheme, rest) = match input.split_once("://") {
        Some((scheme, rest)) => ("it is a URL", Some(scheme), rest),
        None if input.contains(['/', '?', '#']) => (
            "paths, queries and fragments are not part of a target",
            None,
            input,
        ),
        None if input.contains('@') => ("userinfo is not part of a target", None, input),
        None => return None,
    };
    // `host:port` is what precedes the path and follows the userinfo. It holds none of
    // `://`, `/`, `?`, `#`, `@`, so parsing it never comes back here.
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let meant = authority_form(hostport).ok().or_else(|| {
        // A URL without a port means its scheme's default port (RFC 9110 sections 4.2.1
        // and 4.2.2); only then, so that `host:bad` never becomes `host:bad:80`.
        let port = match scheme?.to_ascii_lowercase().as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let (_, None) = split_host_port(hostport).ok()? else {
            return None;
        };
        authority_form(&format!("{hostport}:{port}")).ok()
    });
    // A canonical target holds no quote or control character: safe to quote plainly.
    Some(HostError::NotATarget {
        problem,
        meant: meant.map(|t| t.to_string()),
    })
}

/// Splits `host[:port]` or `[v6][:port]`. More than one `:` outside brackets means a bare
/// IPv6 literal, which cannot carry a port unambiguously: an error here (callers that
/// accept a bare IPv6 without a port check for it first).
pub(crate) fn split_host_port(input: &str) -> Result<(&str, Option<&str>), HostError> {
    if input.starts_with('[') {
        let Some(close) = input.find(']') else {
            return Err(HostError::UnclosedBracket);
        };
        let (host, rest) = input.split_at(close + 1);
        return match rest {
            "" => Ok((host, None)),
            _ => match rest.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err(HostError::AfterBracket(rest.to_owned())),
            },
        };
    }
    match input.matches(':').count() {
        0 => Ok((input, None)),
        1 => {
            let (h, p) = input.split_once(':').unwrap_or((input, ""));
            Ok((h, Some(p)))
        }
        _ => Err(unbracketed(input)),
    }
}

/// Why `input`, with two or more `:` and no brackets, is not `host:port`.
fn unbracketed(input: &str) -> HostError {
    // An IPv6 literal, then a port: `2001:db8::1:443`.
    if let Some((ip, port)) = input.rsplit_once(':')
        && !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
        && ip.parse::<Ipv6Addr>().is_ok()
    {
        // `ip` parsed as an address and `port` is digits: nothing to escape.
        let bracketed = format!("[{ip}]:{port}");
        let example = match authority_form(&bracketed) {
            Ok(_) => bracketed,
            Err(_) => "[2001:db8::1]:443".to_owned(),
        };
        return HostError::Ipv6NeedsBrackets(example);
    }
    if let Ok(ip) = input.parse::<Ipv6Addr>() {
        return HostError::Ipv6WithoutPort(ip);
    }
    HostError::ManyColons
}

/// Parses a decimal port 1..=65535 with no sign and no leading zeros.
pub(crate) fn parse_port(s: &str) -> Result<u16, HostError> {
    if s.is_empty() {
        return Err(HostError::EmptyPort);
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HostError::PortNotDecimal(s.to_owned()));
    }
    if s.len() > 1 && s.starts_with('0') {
        return Err(HostError::PortLeadingZeros(s.to_owned()));
    }
    match s.parse::<u16>() {
        Ok(0) => Err(HostError::PortZero),
        Ok(p) => Ok(p),
        Err(_) => Err(HostError::PortRange(s.to_owned())),
    }
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
