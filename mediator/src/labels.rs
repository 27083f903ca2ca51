//! Invocation labels (design section 20): the host's own names for what made a request,
//! carried on every record of it: `invocation` (one id per shim invocation, not the
//! mediator's per-process `run`) and `tags` (`KEY=VALUE` pairs the host chose, such as
//! the agent's tool-call id).
//!
//! They are set outside the sandbox: the shim puts them on the channel before the
//! client's bytes (`crate::front::proxy_v2`, a PROXY protocol v2 header on an
//! authority's Unix socket), or hands them to the embedded mediator with the connection
//! (`Running::serve_embedded`). A process that reaches an authority's socket directly
//! can at most label its own records: labels never decide anything.
//!
//! Bounded and checked once, here ([`Labels::new`]): at most [`MAX_TAGS`] tags, keys of
//! 1..=[`MAX_KEY`] bytes of letters, digits, `.`, `_` and `-`, values of
//! 0..=[`MAX_VALUE`] bytes of printable ASCII, an invocation of 1..=[`MAX_INVOCATION`]
//! bytes of letters, digits, `.`, `_`, `:` and `-`. What breaks a bound is refused whole,
//! never cut.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The most tags one connection may carry.
pub const MAX_TAGS: usize = 16;
/// The longest tag key, in bytes.
pub const MAX_KEY: usize = 64;
/// The longest tag value, in bytes.
pub const MAX_VALUE: usize = 256;
/// The longest invocation id, in bytes.
pub const MAX_INVOCATION: usize = 64;

/// PROXY protocol v2 TLV type of the invocation id (in the custom range, 0xE0..=0xEF).
pub const TLV_INVOCATION: u8 = 0xE0;
/// PROXY protocol v2 TLV type of one `KEY=VALUE` tag (one TLV per tag).
pub const TLV_TAG: u8 = 0xE1;
/// The largest PROXY protocol v2 header the mediator takes, in bytes (signature, fixed
/// part, addresses and TLVs); the labels' bounds keep a header well below it.
pub const MAX_HEADER: usize = 8192;

/// The labels of one connection: every record of it carries them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Labels {
    /// The invocation id, if the host gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation: Option<String>,
    /// The host's tags, by key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// Why labels were refused (the connection is then denied `bad_request`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// More tags than [`MAX_TAGS`].
    #[error("{0} tags; at most {MAX_TAGS} are taken")]
    TooManyTags(usize),
    /// A tag key that is empty, too long or holds another character.
    #[error("tag key {0:?} must be 1 to {MAX_KEY} bytes of letters, digits, '.', '_' and '-'")]
    Key(String),
    /// A tag given twice.
    #[error("tag {0:?} is given twice")]
    Duplicate(String),
    /// A tag value too long or not printable ASCII.
    #[error("the value of tag {0:?} must be at most {MAX_VALUE} bytes of printable ASCII")]
    Value(String),
    /// A tag that is not `KEY=VALUE`.
    #[error("a tag must be KEY=VALUE; got {0:?}")]
    NoEquals(String),
    /// An invocation id that is empty, too long or holds another character.
    #[error(
        "invocation {0:?} must be 1 to {MAX_INVOCATION} bytes of letters, digits, '.', '_', ':' and '-'"
    )]
    Invocation(String),
    /// The invocation given twice.
    #[error("the invocation is given twice")]
    TwoInvocations,
}

impl Labels {
    /// Labels from an invocation id and `KEY=VALUE` tags, every bound checked.
    ///
    /// # Errors
    /// The first [`LabelError`] found.
    pub fn new<'t>(
        invocation: Option<&str>,
        tags: impl IntoIterator<Item = &'t str>,
    ) -> Result<Self, LabelError> {
        let mut out = Self::default();
        if let Some(id) = invocation {
            out.set_invocation(id.as_bytes())?;
        }
        for tag in tags {
            out.add_tag(tag.as_bytes())?;
        }
        Ok(out)
    }

    /// Whether there is no label at all.
    pub fn is_empty(&self) -> bool {
        self.invocation.is_none() && self.tags.is_empty()
    }

    /// The PROXY protocol v2 header that carries these labels on an authority's Unix
    /// socket, to be written before the client's first byte: command `LOCAL`, family
    /// `UNSPEC`, one [`TLV_INVOCATION`] and one [`TLV_TAG`] per tag (`KEY=VALUE`).
    ///
    /// # Errors
    /// Only when a value does not fit a TLV (labels built by [`Self::new`] always fit,
    /// well within [`MAX_HEADER`]).
    pub fn proxy_v2_header(&self) -> std::io::Result<Vec<u8>> {
        use ppp::v2::{Addresses, Builder, Command, Protocol, Version};
        let mut b = Builder::with_addresses(
            Version::Two | Command::Local,
            Protocol::Unspecified,
            Addresses::Unspecified,
        );
        if let Some(id) = &self.invocation {
            b = b.write_tlv(TLV_INVOCATION, id.as_bytes())?;
        }
        for (k, v) in &self.tags {
            b = b.write_tlv(TLV_TAG, format!("{k}={v}").as_bytes())?;
        }
        b.build()
    }

    /// Sets the invocation id from raw bytes (a TLV's value).
    pub(crate) fn set_invocation(&mut self, raw: &[u8]) -> Result<(), LabelError> {
        if self.invocation.is_some() {
            return Err(LabelError::TwoInvocations);
        }
        if !is_word(raw, MAX_INVOCATION, b".:_-") {
            return Err(LabelError::Invocation(shown(raw)));
        }
        self.invocation = Some(String::from_utf8_lossy(raw).into_owned());
        Ok(())
    }

    /// Adds one `KEY=VALUE` tag from raw bytes (a TLV's value, or a flag).
    pub(crate) fn add_tag(&mut self, raw: &[u8]) -> Result<(), LabelError> {
        let Some(eq) = raw.iter().position(|&b| b == b'=') else {
            return Err(LabelError::NoEquals(shown(raw)));
        };
        let (key, value) = (&raw[..eq], &raw[eq + 1..]);
        if !is_word(key, MAX_KEY, b"._-") {
            return Err(LabelError::Key(shown(key)));
        }
        let key = String::from_utf8_lossy(key).into_owned();
        if value.len() > MAX_VALUE || !value.iter().all(|b| (0x20..=0x7e).contains(b)) {
            return Err(LabelError::Value(key));
        }
        if self.tags.contains_key(&key) {
            return Err(LabelError::Duplicate(key));
        }
        if self.tags.len() == MAX_TAGS {
            return Err(LabelError::TooManyTags(MAX_TAGS + 1));
        }
        self.tags
            .insert(key, String::from_utf8_lossy(value).into_owned());
        Ok(())
    }
}

/// Whether `raw` is 1 to `max` bytes, each an ASCII letter, a digit or one of `extra`.
fn is_word(raw: &[u8], max: usize, extra: &[u8]) -> bool {
    (1..=max).contains(&raw.len())
        && raw
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(b))
}

/// At most 80 bytes of untrusted text, escaped, for an error message.
fn shown(raw: &[u8]) -> String {
    let cut = &raw[..raw.len().min(80)];
    let mut s = crate::redact::escape_raw(cut);
    if raw.len() > cut.len() {
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_within_bounds_are_taken() {
        let l = Labels::new(
            Some("inv-1:a.b_c"),
            ["tool=call_01", "empty=", "k.1-x=a b=c"],
        )
        .unwrap();
        assert_eq!(l.invocation.as_deref(), Some("inv-1:a.b_c"));
        assert_eq!(l.tags["tool"], "call_01");
        assert_eq!(l.tags["empty"], "");
        assert_eq!(l.tags["k.1-x"], "a b=c");
        assert!(Labels::default().is_empty() && !l.is_empty());
        let many: Vec<String> = (0..MAX_TAGS).map(|i| format!("k{i}=v")).collect();
        assert!(Labels::new(None, many.iter().map(String::as_str)).is_ok());
        let long_value = format!("k={}", "v".repeat(MAX_VALUE));
        assert!(Labels::new(None, [long_value.as_str()]).is_ok());
    }

    #[test]
    fn labels_out_of_bounds_are_refused_whole() {
        let many: Vec<String> = (0..=MAX_TAGS).map(|i| format!("k{i}=v")).collect();
        let rows: Vec<(Option<&str>, Vec<&str>, &str)> = vec![
            (
                None,
                many.iter().map(String::as_str).collect(),
                "tags; at most",
            ),
            (None, vec!["=v"], "tag key"),
            (None, vec!["k k=v"], "tag key"),
            (None, vec!["novalue"], "KEY=VALUE"),
            (None, vec!["k=v", "k=w"], "twice"),
            (None, vec!["k=\u{e9}"], "printable ASCII"),
            (None, vec!["k=a\nb"], "printable ASCII"),
            (Some(""), vec![], "invocation"),
            (Some("a b"), vec![], "invocation"),
        ];
        for (inv, tags, expected) in rows {
            let e = Labels::new(inv, tags.iter().copied())
                .unwrap_err()
                .to_string();
            assert!(e.contains(expected), "{inv:?} {tags:?}: {e}");
        }
        let long_key = format!("{}=v", "k".repeat(MAX_KEY + 1));
        assert!(Labels::new(None, [long_key.as_str()]).is_err());
        let long_value = format!("k={}", "v".repeat(MAX_VALUE + 1));
        assert!(Labels::new(None, [long_value.as_str()]).is_err());
        let long_id = "i".repeat(MAX_INVOCATION + 1);
        assert!(Labels::new(Some(&long_id), []).is_err());
    }
}
