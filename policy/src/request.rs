//! What a request rule judges of one request inside a terminated tunnel, besides the
//! target: its method, path, query and headers ([`RequestFacts`]), and the checks of the
//! `headers` and `query` keys of `[[authority.request_rule]]`. Queries are judged on their
//! decoded parameter names with the strictness of paths: a name the rules cannot judge
//! safely (a `;` separator, a malformed or double escape, anything but letters, digits
//! and `- _ . ~ [ ]` once decoded) makes the request `malformed_target`. Also the one
//! parser of upgrade tokens ([`UpgradeToken::parse`], RFC 9110 section 7.8), for the
//! `upgrade` key of a rule and for the `Upgrade` header (or HTTP/2 `:protocol`) of a
//! request alike.

use crate::error::RuleError;
use std::collections::BTreeSet;

/// The header values of a request, by name (the caller's header map).
pub trait HeaderLookup {
    /// Every value of header `name` (lowercase), in order; empty when absent.
    fn values(&self, name: &str) -> Vec<&[u8]>;
}

/// One request as the request rules see it.
#[derive(Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The method, exactly as sent.
    pub method: &'a str,
    /// The path, without its query.
    pub path: &'a str,
    /// The query (after `?`, not decoded), if any.
    pub query: Option<&'a str>,
    /// The headers, when the caller has them.
    pub headers: Option<&'a dyn HeaderLookup>,
    /// The protocol the request asks to switch to (an HTTP/1.1 `Upgrade`, an HTTP/2
    /// extended CONNECT's `:protocol`), if any.
    pub upgrade: Option<&'a UpgradeToken>,
}

impl<'a> RequestFacts<'a> {
    /// A request with no query and no headers.
    pub fn new(method: &'a str, path: &'a str) -> Self {
        Self {
            method,
            path,
            query: None,
            headers: None,
            upgrade: None,
        }
    }

    /// The same request asking to switch to `upgrade`.
    #[must_use]
    pub fn with_upgrade(mut self, upgrade: Option<&'a UpgradeToken>) -> Self {
        self.upgrade = upgrade;
        self
    }

    /// The same request with `query`.
    #[must_use]
    pub fn with_query(mut self, query: Option<&'a str>) -> Self {
        self.query = query;
        self
    }

    /// The same request with `headers`.
    #[must_use]
    pub fn with_headers(mut self, headers: &'a dyn HeaderLookup) -> Self {
        self.headers = Some(headers);
        self
    }

    pub(crate) fn header_values(&self, name: &str) -> Vec<&'a [u8]> {
        self.headers.map(|h| h.values(name)).unwrap_or_default()
    }
}

/// A protocol a request asks to switch to (RFC 9110 section 7.8: `protocol-name
/// ["/" protocol-version]`, each a token; names from the IANA HTTP Upgrade Token
/// Registry), compared case-insensitively, so held in lowercase.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UpgradeToken {
    /// `websocket` (RFC 6455; over HTTP/2, RFC 8441): relayed unless a request rule
    /// denies the request.
    WebSocket,
    /// `h2c` (RFC 7540 section 3.2): never relayed, it would carry HTTP/2 requests past
    /// the request rules.
    H2c,
    /// Any other token, lowercase (`tls/1.2`, `foo`): relayed only where a request
    /// rule's `upgrade` list names it.
    Other(String),
}

/// The longest upgrade token accepted (name, `/` and version).
const MAX_UPGRADE_TOKEN: usize = 64;

impl UpgradeToken {
    /// Parses one token (surrounding spaces and tabs trimmed).
    ///
    /// # Errors
    /// Empty, longer than 64 bytes, more than one `/`, or a name or version that is not
    /// an RFC 9110 section 5.6.2 token.
    pub fn parse(raw: &[u8]) -> Result<Self, RuleError> {
        let t = raw.trim_ascii();
        let shown = || String::from_utf8_lossy(t).escape_debug().to_string();
        if t.is_empty() {
            return Err(RuleError::EmptyUpgrade);
        }
        if t.len() > MAX_UPGRADE_TOKEN {
            return Err(RuleError::LongUpgrade {
                shown: shown(),
                max: MAX_UPGRADE_TOKEN,
            });
        }
        let mut parts = t.split(|&b| b == b'/');
        let name = parts.next().unwrap_or_default();
        let version = parts.next();
        let token = |p: &[u8]| !p.is_empty() && p.iter().all(|&b| is_tchar(b));
        if !token(name) || version.is_some_and(|v| !token(v)) || parts.next().is_some() {
            return Err(RuleError::BadUpgrade(shown()));
        }
        let lower = String::from_utf8_lossy(t).to_ascii_lowercase();
        Ok(match lower.as_str() {
            "websocket" => Self::WebSocket,
            "h2c" => Self::H2c,
            _ => Self::Other(lower),
        })
    }

    /// The token, lowercase (`websocket`), as sent upstream and logged.
    pub fn as_str(&self) -> &str {
        match self {
            Self::WebSocket => "websocket",
            Self::H2c => "h2c",
            Self::Other(t) => t,
        }
    }
}

impl std::fmt::Display for UpgradeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A required header of a rule: its value must equal the pattern, or start with it when
/// the pattern ends in `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeaderRule {
    /// Lowercase name.
    pub(crate) name: String,
    /// The pattern as written.
    pub(crate) pattern: String,
}

impl HeaderRule {
    /// Validates one `headers` entry.
    pub(crate) fn parse(name: &str, pattern: &str) -> Result<Self, RuleError> {
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(RuleError::HeaderName(name.to_owned()));
        }
        if pattern.is_empty()
            || !pattern
                .bytes()
                .all(|b| b == b' ' || (0x21..0x7f).contains(&b))
            || pattern[..pattern.len() - 1].contains('*')
        {
            return Err(RuleError::HeaderPattern {
                name: name.to_owned(),
                pattern: pattern.to_owned(),
            });
        }
        Ok(Self {
            name: name.to_ascii_lowercase(),
            pattern: pattern.to_owned(),
        })
    }

    /// Present, and every value matches.
    pub(crate) fn allows(&self, facts: &RequestFacts<'_>) -> bool {
        let values = facts.header_values(&self.name);
        !values.is_empty() && values.iter().all(|v| self.matches(v))
    }

    fn matches(&self, value: &[u8]) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => value.starts_with(prefix.as_bytes()),
            None => value == self.pattern.as_bytes(),
        }
    }
}

/// Validates one allowed query parameter name of a rule.
pub(crate) fn check_query_name(name: &str) -> Result<(), RuleError> {
    if name.is_empty() || !name.bytes().all(is_name_byte) {
        return Err(RuleError::QueryName(name.to_owned()));
    }
    Ok(())
}

/// The decoded parameter names of `query`.
///
/// # Errors
/// Why the query cannot be judged safely.
pub(crate) fn query_names(query: &str) -> Result<BTreeSet<String>, &'static str> {
    let mut names = BTreeSet::new();
    for piece in query.split('&').filter(|p| !p.is_empty()) {
        if piece.contains(';') {
            return Err("the query contains ; (which some servers read as a separator)");
        }
        let raw = piece.split('=').next().unwrap_or_default();
        let bytes = raw.as_bytes();
        let mut name = String::with_capacity(raw.len());
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            let decoded = if b == b'%' {
                let hex = |k: usize| bytes.get(i + k).and_then(|&h| (h as char).to_digit(16));
                let (Some(hi), Some(lo)) = (hex(1), hex(2)) else {
                    return Err("the query has a % that is not followed by two hex digits");
                };
                i += 3;
                u8::try_from(hi * 16 + lo).unwrap_or(0xff)
            } else {
                i += 1;
                b
            };
            if !is_name_byte(decoded) {
                return Err(
                    "a query parameter name holds a character other than letters, digits and - _ . ~ [ ] (once decoded)",
                );
            }
            name.push(char::from(decoded));
        }
        if name.is_empty() {
            return Err("the query has a parameter without a name");
        }
        names.insert(name);
    }
    Ok(names)
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'[' | b']')
}

/// RFC 9110 section 5.6.2 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_names_are_decoded_and_odd_ones_refused() {
        let names = query_names("per_page=10&page=2&&a%5B%5D=1&x").unwrap();
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["a[]", "page", "per_page", "x"]
        );
        for bad in [
            "a=1;b=2",
            "%zz=1",
            "a%=1",
            "access%5Ftoken=1%25",
            "%2561ccess_token=x",
            "a+b=1",
            "=1",
            "a%00=1",
            "é=1",
        ] {
            if bad == "access%5Ftoken=1%25" {
                // The value is not judged; the decoded name is.
                assert!(query_names(bad).unwrap().contains("access_token"));
                continue;
            }
            assert!(query_names(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn upgrade_tokens_are_rfc_9110_tokens_compared_without_case() {
        assert_eq!(
            UpgradeToken::parse(b" WebSocket "),
            Ok(UpgradeToken::WebSocket)
        );
        assert_eq!(UpgradeToken::parse(b"H2C"), Ok(UpgradeToken::H2c));
        assert_eq!(
            UpgradeToken::parse(b"TLS/1.2").map(|t| t.to_string()),
            Ok("tls/1.2".to_owned())
        );
        for bad in [
            &b""[..],
            b"a b",
            b"a/",
            b"/1",
            b"a/1/2",
            b"web,socket",
            b"caf\xc3\xa9",
            b"a\r\nb",
            &[b'a'; 65],
        ] {
            assert!(UpgradeToken::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn header_patterns_match_exactly_or_by_prefix() {
        let exact = HeaderRule::parse("Content-Type", "application/json").unwrap();
        let prefix = HeaderRule::parse("content-type", "application/json*").unwrap();
        assert!(exact.matches(b"application/json"));
        assert!(!exact.matches(b"application/json; charset=utf-8"));
        assert!(prefix.matches(b"application/json; charset=utf-8"));
        assert!(HeaderRule::parse("bad name", "x").is_err());
        assert!(HeaderRule::parse("a", "x*y").is_err());
        assert!(HeaderRule::parse("a", "").is_err());
    }
}
