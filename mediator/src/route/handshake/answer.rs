//! A parent's answer head to `CONNECT` (RFC 9112 sections 4 and 5), read once: its
//! status, version and header fields, what a refusal says in words, and the
//! authentication a parent offers (`Proxy-Authenticate`, RFC 9110 section 11.6.1, for
//! Negotiate, RFC 4559).

use super::{HandshakeError, MAX_DISCARD, MAX_HEAD};

/// Why a parent's answer could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AnswerError {
    /// The connection failed.
    #[error("read failed: {0}")]
    Read(std::io::Error),
    /// The TLS connection to an HTTPS parent failed, in words.
    #[error("read failed: {0}")]
    ReadTls(String),
    /// The parent closed before its answer was complete.
    #[error("connection closed before the answer")]
    ClosedBeforeAnswer,
    /// The parent closed in the body of a refusal.
    #[error("connection closed in the answer body")]
    ClosedInBody,
    /// The head is larger than [`MAX_HEAD`].
    #[error("answer head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// A refusal's body is larger than [`MAX_DISCARD`].
    #[error("a {0}-byte answer body (more than {MAX_DISCARD})")]
    BodyTooLarge(u64),
    /// The head ends before its blank line.
    #[error("an incomplete answer head")]
    Incomplete,
    /// Not HTTP/1.x.
    #[error("not an HTTP answer ({0})")]
    NotHttp(httparse::Error),
    /// No status code.
    #[error("an answer head without a status")]
    NoStatus,
}

/// A parent's answer head to `CONNECT`, parsed once with `httparse` (RFC 9112 sections 4
/// and 5): its status, version and header fields (never the body). A field value that is
/// not UTF-8 (legal obs-text) is kept, lossily, and hides no other field.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The status code.
    pub(crate) status: u16,
    /// The minor version: `HTTP/1.0` or `HTTP/1.1`.
    pub(super) minor: u8,
    /// The reason phrase, printable ASCII only, at most 64 bytes (it goes into logs).
    pub(super) reason: String,
    /// The header fields, `(name, value)`.
    pub(super) fields: Vec<(String, String)>,
}

/// `value` with each obsolete line folding (a line break followed by spaces or tabs,
/// RFC 9112 section 5.2) replaced by one space.
fn unfold(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(i) = rest.find(['\r', '\n']) {
        out.push_str(&rest[..i]);
        out.push(' ');
        rest = rest[i..].trim_start_matches(['\r', '\n', ' ', '\t']);
    }
    out.push_str(rest);
    out
}

/// The most header fields an answer head may have (it is at most [`MAX_HEAD`] bytes).
const MAX_FIELDS: usize = 128;

/// How the body of a parent's non-2xx answer is delimited (RFC 9112 section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyLength {
    /// `Content-Length: n` and the connection stays open: read `n` bytes and reuse it.
    Known(u64),
    /// Chunked, delimited by the close, or `Connection: close`: open a new connection.
    Unusable,
}

impl Answer {
    /// Parses a complete answer head. An obsolete line folding is replaced by a space, as
    /// RFC 9112 section 5.2 tells a recipient of a response to do.
    ///
    /// # Errors
    /// The head is not an HTTP/1.x status line and fields, in `httparse`'s words.
    pub(crate) fn parse(head: &[u8]) -> Result<Self, AnswerError> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut response = httparse::Response::new(&mut headers);
        let parsed = httparse::ParserConfig::default()
            .allow_obsolete_multiline_headers_in_responses(true)
            .parse_response(&mut response, head);
        match parsed {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => return Err(AnswerError::Incomplete),
            Err(e) => return Err(AnswerError::NotHttp(e)),
        }
        let (Some(status), Some(minor)) = (response.code, response.version) else {
            return Err(AnswerError::NoStatus);
        };
        // The reason phrase may be obs-text, which httparse leaves out: read it from the
        // line itself.
        let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
        let reason = String::from_utf8_lossy(line)
            .splitn(3, ' ')
            .nth(2)
            .unwrap_or_default()
            .chars()
            .filter(|c| c.is_ascii_graphic() || *c == ' ')
            .take(64)
            .collect();
        let fields = response
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_owned(),
                    ows_trim(&unfold(&String::from_utf8_lossy(h.value))).to_owned(),
                )
            })
            .collect();
        Ok(Self {
            status,
            minor,
            reason,
            fields,
        })
    }

    /// The header fields, `(name, value)` with the value trimmed.
    fn fields(&self) -> impl Iterator<Item = (&str, &str)> {
        self.fields.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// `Some(token)` when a `Proxy-Authenticate` field offers `Negotiate` (RFC 4559
    /// section 4): the token is empty for a bare offer.
    pub(crate) fn negotiate(&self) -> Option<&str> {
        negotiate_in(self.challenges())
    }

    /// The authentication schemes the parent offered (`Proxy-Authenticate`), for messages.
    pub(crate) fn offered(&self) -> String {
        offered_in(self.challenges())
    }

    /// The `Proxy-Authenticate` values.
    fn challenges(&self) -> impl Iterator<Item = &str> {
        self.fields()
            .filter(|(n, _)| n.eq_ignore_ascii_case("proxy-authenticate"))
            .map(|(_, v)| v)
    }

    /// How the answer's body is delimited.
    pub(crate) fn body(&self) -> BodyLength {
        let mut length = None;
        for (name, value) in self.fields() {
            if name.eq_ignore_ascii_case("transfer-encoding")
                || (name.eq_ignore_ascii_case("connection")
                    && value
                        .split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case("close")))
            {
                return BodyLength::Unusable;
            }
            if name.eq_ignore_ascii_case("content-length") {
                match (length, value.parse::<u64>()) {
                    (None, Ok(n)) => length = Some(n),
                    (Some(a), Ok(b)) if a == b => {}
                    _ => return BodyLength::Unusable,
                }
            }
        }
        if self.minor == 0 {
            return BodyLength::Unusable;
        }
        length.map_or(BodyLength::Unusable, BodyLength::Known)
    }

    /// The refusal this non-2xx answer means for `CONNECT authority`.
    pub(crate) fn refusal(&self, authority: &str, basic: bool, parent: &str) -> HandshakeError {
        let status = self.status;
        let detail = if status == 407 {
            format!(
                "parent {parent} answered 407 Proxy Authentication Required{} (it offers {}): {}",
                if basic {
                    " (the configured credentials were refused)"
                } else {
                    ""
                },
                self.offered(),
                "configure the parent's credentials (userinfo or parent_credentials_file) or parent_auth"
            )
        } else {
            format!(
                "parent {parent} answered {status} {} to CONNECT {authority}",
                self.reason
            )
        };
        HandshakeError::Refused {
            detail,
            next_addr: matches!(status, 502..=504),
        }
    }
}

/// `Some(token)` when one of the `Proxy-Authenticate` values `challenges` offers
/// `Negotiate` (RFC 4559 section 4): the token is empty for a bare offer.
pub(crate) fn negotiate_in<'a>(challenges: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    challenges.map(ows_trim).find_map(|v| {
        let (scheme, rest) = v.split_once(' ').unwrap_or((v, ""));
        scheme
            .eq_ignore_ascii_case("negotiate")
            .then_some(ows_trim(rest))
    })
}

/// `s` without the optional whitespace of RFC 9110 section 5.6.3 (spaces and tabs) at
/// either end: never other control or Unicode whitespace, which belongs to the value.
pub(crate) fn ows_trim(s: &str) -> &str {
    s.trim_matches([' ', '\t'])
}

/// The schemes of the `Proxy-Authenticate` values `challenges`, for messages: a scheme
/// that is an RFC 9110 token as it is, anything else quoted with its control characters
/// escaped (so that `Nego\0tiate` never reads as `Negotiate`); at most 32 characters each.
pub(crate) fn offered_in<'a>(challenges: impl Iterator<Item = &'a str>) -> String {
    let schemes: Vec<String> = challenges
        .map(str::trim)
        .filter_map(|v| v.split([' ', ',']).next())
        .filter(|s| !s.is_empty())
        .map(|s| {
            let cut: String = s.chars().take(32).collect();
            if cut.chars().all(is_tchar) {
                cut
            } else {
                format!("\"{}\"", cut.escape_default())
            }
        })
        .collect();
    if schemes.is_empty() {
        "no scheme".to_owned()
    } else {
        schemes.join(", ")
    }
}

/// RFC 9110 section 5.6.2 `tchar`.
fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}
