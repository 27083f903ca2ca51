//! What untrusted or secret-bearing text becomes before it reaches a log line, a JSON body
//! or an error message: userinfo (`user:token@`) replaced, raw bytes escaped and bounded,
//! a request's query (which often holds tokens) redacted.
//!
//! This module is a leaf: it imports nothing from the crate. It must never pass a secret
//! through: every function here removes, never keeps, what might be one.

/// The most bytes of a raw target [`escape_raw`] keeps.
const MAX_RAW: usize = 256;

/// Replaces each userinfo-like run (the characters before an `@` back to a quote, space or
/// `/`) with `<userinfo redacted>`.
pub(crate) fn redact_userinfo(text: &str) -> String {
    let mut result = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('@') {
        let (before, after) = rest.split_at(at);
        let start = before.rfind(['"', ' ', '/', '\'']).map_or(0, |p| p + 1);
        result.push_str(&before[..start]);
        result.push_str("<userinfo redacted>@");
        rest = &after[1..];
    }
    result.push_str(rest);
    result
}

/// The path of a request for the decision log: escaped, its query replaced by
/// `?<redacted>`.
pub(crate) fn logged_path(uri: &http::Uri) -> String {
    let path = escape_raw(uri.path().as_bytes());
    if uri.query().is_some() {
        format!("{path}?<redacted>")
    } else {
        path
    }
}

/// Escapes a raw, untrusted target for logs and JSON bodies: userinfo (everything up to
/// the last `@`) replaced by `<userinfo redacted>@`, printable ASCII kept, everything else
/// as `\xNN`, at most 256 bytes.
pub(crate) fn escape_raw(raw: &[u8]) -> String {
    use std::fmt::Write as _;
    let (redacted, raw) = match raw.iter().rposition(|&b| b == b'@') {
        Some(at) => (true, &raw[at + 1..]),
        None => (false, raw),
    };
    let mut out = String::new();
    if redacted {
        out.push_str("<userinfo redacted>@");
    }
    for &b in raw.iter().take(MAX_RAW) {
        if (0x20..0x7f).contains(&b) && b != b'\\' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_never_survives_in_details_or_labels() {
        assert_eq!(
            redact_userinfo(r#"invalid host "alpha:tok@origin.test:443": userinfo"#),
            r#"invalid host "<userinfo redacted>@origin.test:443": userinfo"#
        );
        assert_eq!(redact_userinfo("no at sign"), "no at sign");
        assert_eq!(escape_raw(b"u:secret@h.test"), "<userinfo redacted>@h.test");
        assert_eq!(escape_raw(b"a@b@c.test"), "<userinfo redacted>@c.test");
    }

    #[test]
    fn raw_bytes_are_escaped_and_bounded() {
        assert_eq!(escape_raw(b"a\r\nb\\"), "a\\x0d\\x0ab\\x5c");
        assert_eq!(escape_raw(&[b'x'; 300]).len(), MAX_RAW);
    }

    #[test]
    fn a_logged_path_never_shows_its_query() {
        let uri: http::Uri = "/repos/x?access_token=secret".parse().unwrap();
        assert_eq!(logged_path(&uri), "/repos/x?<redacted>");
        let uri: http::Uri = "/plain".parse().unwrap();
        assert_eq!(logged_path(&uri), "/plain");
    }
}
