//! Finding a placeholder: in header values and targets as sent and percent-decoded
//! (once and twice), and the denial that names the credential, never the secret.

use http::Uri;
use http::header::{HeaderMap, HeaderValue};
use policy::config::{Authority, Credential};
use policy::{Reason, Target};

use crate::denial::Denial;

/// A request's header map as the request rules read it.
pub(crate) struct Headers<'a>(pub(crate) &'a HeaderMap);

impl policy::HeaderLookup for Headers<'_> {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        self.0
            .get_all(name)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect()
    }
}

/// Where in a request a placeholder was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Place {
    /// The request target (path and query, or the absolute-form URI).
    Target,
    /// The value of this request header.
    Header(String),
    /// The value of this trailer field.
    Trailer(String),
    /// The host name of the target.
    Host,
}

/// A placeholder found in a request: whose, where, and whether only its percent-decoded
/// form matched.
#[derive(Debug)]
pub(super) struct Found<'a> {
    /// The credential's index in its authority (`credential[index + 1]` in messages).
    pub(super) index: usize,
    pub(super) credential: &'a Credential,
    pub(super) place: Place,
    /// Only the percent-decoded text held it.
    pub(super) encoded: bool,
}

impl Found<'_> {
    /// `in the x-note header`, `percent-encoded in the request target`, ...
    pub(super) fn place_words(&self) -> String {
        let place = match &self.place {
            Place::Target => "in the request target".to_owned(),
            Place::Header(name) => format!("in the {name} header"),
            Place::Trailer(name) => format!("in the {name} trailer field"),
            Place::Host => "in the host name".to_owned(),
        };
        if self.encoded {
            format!("percent-encoded {place}")
        } else {
            place
        }
    }

    /// Why a found placeholder is refused on a terminated request to `target`.
    pub(super) fn why(&self, target: &Target) -> String {
        let c = self.credential;
        if !c.belongs_to(target) {
            return format!("{} to a host it does not belong to", self.place_words());
        }
        match &self.place {
            // Only the placeholder exactly as the child was given it is replaced: an
            // encoded one would go out as it is, so it is refused.
            Place::Header(name) if name.eq_ignore_ascii_case(c.header()) && self.encoded => {
                format!(
                    "percent-encoded in its own {name} header: only the placeholder exactly as given is replaced by the secret, so this one is refused, not forwarded"
                )
            }
            _ => format!(
                "{}, outside its {} header (the only place it is replaced by the secret)",
                self.place_words(),
                c.header()
            ),
        }
    }
}

pub(super) fn has_placeholders(authority: &Authority) -> bool {
    authority
        .credentials
        .iter()
        .any(|c| c.placeholder().is_some())
}

/// The first credential whose placeholder occurs in the request target or a header value
/// (as sent, or percent-decoded).
pub(super) fn find_placeholder<'a>(
    authority: &'a Authority,
    uri: &Uri,
    headers: &HeaderMap,
) -> Option<Found<'a>> {
    // Most authorities hold no placeholder: then nothing is copied or scanned.
    if !has_placeholders(authority) {
        return None;
    }
    let target = uri.to_string();
    let texts = std::iter::once((Place::Target, target.as_bytes())).chain(
        headers
            .iter()
            .map(|(name, value)| (Place::Header(name.as_str().to_owned()), value.as_bytes())),
    );
    scan(authority, texts)
}

/// The first of `texts` that holds a placeholder of `authority`, as it is or (only when
/// none does as it is) percent-decoded.
pub(super) fn scan<'a, 't>(
    authority: &'a Authority,
    texts: impl Iterator<Item = (Place, &'t [u8])>,
) -> Option<Found<'a>> {
    let texts: Vec<(Place, &[u8])> = texts.collect();
    let decoded: Vec<(&Place, Vec<u8>)> = texts
        .iter()
        .filter(|(_, t)| t.contains(&b'%'))
        .flat_map(|(place, t)| percent_decode(t).into_iter().map(move |d| (place, d)))
        .collect();
    for (index, credential) in authority.credentials.iter().enumerate() {
        let Some(p) = credential.placeholder() else {
            continue;
        };
        let raw = texts
            .iter()
            .find(|(_, t)| contains(t, p.as_bytes()))
            .map(|(place, _)| (place.clone(), false));
        let found = raw.or_else(|| {
            decoded
                .iter()
                .find(|(_, t)| contains(t, p.as_bytes()))
                .map(|(place, _)| ((*place).clone(), true))
        });
        if let Some((place, encoded)) = found {
            return Some(Found {
                index,
                credential,
                place,
                encoded,
            });
        }
    }
    None
}

/// `Ok` when no placeholder was `found`; else the misuse denial whose why is the place
/// it was found, in words, then `after`.
pub(super) fn refuse_found(
    authority: &Authority,
    found: Option<Found<'_>>,
    target: &Target,
    after: &str,
) -> Result<(), Denial> {
    match found {
        None => Ok(()),
        Some(found) => {
            let why = format!("{}{after}", found.place_words());
            Err(misuse(authority, &found, target, &why))
        }
    }
}

pub(super) fn misuse(
    authority: &Authority,
    found: &Found<'_>,
    target: &Target,
    why: &str,
) -> Denial {
    let c = found.credential;
    let index = found.index;
    Denial::new(
        Reason::CredentialMisuse,
        format!(
            "the request to {target} carries the placeholder of credential[{}] ({} for {}) of authority \"{}\" {why}",
            index + 1,
            c.header(),
            c.host(),
            authority.grant.name()
        ),
        format!(
            "this placeholder stands for a secret of {} only: send it in the {} header of HTTPS requests to that host, and nowhere else",
            c.host(),
            c.header()
        ),
    )
    .with_rule(Some(format!("credential[{}] {}", index + 1, c.host())))
}

pub(super) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// `text` with its `%XX` escapes decoded once and, when that still holds a `%`, twice (so
/// that `%2541` is seen too); malformed escapes kept. Both forms are returned: a server
/// may decode once or twice, and the second decoding can destroy what the first revealed
/// (`%25` before hex digits, a placeholder that holds a `%`). Neither is longer than
/// `text`.
pub(crate) fn percent_decode(text: &[u8]) -> Vec<Vec<u8>> {
    fn once(text: &[u8]) -> Vec<u8> {
        percent_encoding::percent_decode(text).collect()
    }
    let first = once(text);
    if first.contains(&b'%') {
        let second = once(&first);
        vec![first, second]
    } else {
        vec![first]
    }
}
