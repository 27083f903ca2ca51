//! What a request rule judges of one request inside a terminated tunnel, besides the
//! target: its method, path, query and headers ([`RequestFacts`]), and the checks of the
//! `headers` and `query` keys of `[[authority.request_rule]]`. Queries are judged on their
//! decoded parameter names with the strictness of paths: a name the rules cannot judge
//! safely (a `;` separator, a malformed or double escape, anything but letters, digits
//! and `- _ . ~ [ ]` once decoded) makes the request `malformed_target`.

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
}

impl<'a> RequestFacts<'a> {
    /// A request with no query and no headers.
    pub fn new(method: &'a str, path: &'a str) -> Self {
        Self {
            method,
            path,
            query: None,
            headers: None,
        }
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
    pub(crate) fn parse(name: &str, pattern: &str) -> Result<Self, String> {
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(format!("header name {name:?} is not an HTTP token"));
        }
        if pattern.is_empty()
            || !pattern
                .bytes()
                .all(|b| b == b' ' || (0x21..0x7f).contains(&b))
            || pattern[..pattern.len() - 1].contains('*')
        {
            return Err(format!(
                "header {name:?}: value pattern {pattern:?} must be visible ASCII, with * only at its end"
            ));
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
pub(crate) fn check_query_name(name: &str) -> Result<(), String> {
    if name.is_empty() || !name.bytes().all(is_name_byte) {
        return Err(format!(
            "query parameter {name:?} must be letters, digits and - _ . ~ [ ] (as decoded)"
        ));
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
