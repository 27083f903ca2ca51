//! Credentials held by the mediator (design section 14): loading each secret (from its
//! file, which must not be readable by others nor writable by its group or others, or
//! from the mediator's environment), adding
//! it to the terminated requests of its host ([`apply`], the one path of h1 and h2
//! requests), and refusing a request that carries one of its authority's placeholders
//! anywhere else: reason `credential_misuse`. Where it is looked for: the header values
//! and target of terminated requests ([`apply`]), of plain `http://` ones
//! ([`check_plain`]), their trailer fields ([`CheckedBody`]), and the host of every
//! target where it is decided ([`check_target`], CONNECT and SOCKS5 included). Bodies
//! and WebSocket frames are streamed and not looked into.
//!
//! No message built here quotes a secret: errors name the credential's source and
//! location, denials its header and host.

use std::os::unix::fs::PermissionsExt as _;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Uri;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use policy::config::{Authority, Credential, SecretSource};
use policy::{Reason, Target};

use crate::decision_log::CredentialUse;
use crate::denial::Denial;
use crate::error::Error;

/// Loads the secret of every credential of `authority`. Each error starts with the
/// credential's location and never holds the secret.
///
/// # Errors
/// Every credential whose secret cannot be read, is in a file readable by others or
/// writable by its group or others, or is empty or not a header value.
pub(crate) fn load_secrets(authority: &mut Authority) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    for credential in &mut authority.credentials {
        if let Err(e) = load_one(credential) {
            errors.push(format!("{}: {e}", credential.location));
        }
    }
    // A placeholder is handed to the child: none may hold a secret or part of one.
    for credential in &authority.credentials {
        for other in &authority.credentials {
            if let Some(p) = other.placeholder()
                && credential.has_secret()
                && credential.secret_overlaps(p)
            {
                errors.push(format!(
                    "{}: a placeholder of this authority ({}) contains this secret or is part of it; a placeholder is what the child is given, so it must share nothing with a secret",
                    credential.location, other.location
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn load_one(credential: &mut Credential) -> Result<(), LoadError> {
    let bytes = match &credential.source {
        SecretSource::File(path) => {
            let shown = path.display().to_string();
            let unreadable = |e| LoadError::Read(shown.clone(), e);
            let meta = std::fs::metadata(path).map_err(unreadable)?;
            if !meta.is_file() {
                return Err(LoadError::NotFile(shown));
            }
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o007 != 0 {
                return Err(LoadError::Others(shown, mode));
            }
            // Whoever may write the file may choose the secret the mediator sends.
            if mode & 0o020 != 0 {
                return Err(LoadError::Group(shown, mode));
            }
            std::fs::read(path).map_err(unreadable)?
        }
        SecretSource::Env(name) => match std::env::var_os(name) {
            Some(v) => v.into_encoded_bytes(),
            None => {
                return Err(LoadError::Unset(name.clone()));
            }
        },
    };
    Ok(credential.set_secret(bytes)?)
}

/// Why a credential's secret could not be loaded (never quoting it).
#[derive(Debug, thiserror::Error)]
enum LoadError {
    #[error("secret_file {0:?}: cannot read it: {1}")]
    Read(String, std::io::Error),
    #[error("secret_file {0:?} is not a regular file")]
    NotFile(String),
    #[error(
        "secret_file {0:?} is readable or writable by others (mode {1:04o}); make it 0600 or 0640 (chmod o= {0:?})"
    )]
    Others(String, u32),
    #[error(
        "secret_file {0:?} is writable by its group (mode {1:04o}); make it 0600 or 0640 (chmod g-w {0:?})"
    )]
    Group(String, u32),
    #[error("secret_env {0:?} is not set in the mediator's environment")]
    Unset(String),
    #[error(transparent)]
    Secret(#[from] policy::ValueError),
}

/// A request's credentials, judged for a terminated request of `authority` to `target`:
/// each credential of that host sets its header to its secret (replacing what the client
/// sent; with a placeholder, only where the client sent the placeholder), and a
/// placeholder anywhere else (another header, the target, a request to another host) is
/// refused. Returns the credentials used, for the request's log line.
///
/// # Errors
/// A `credential_misuse` denial naming the credential (never its secret).
pub(crate) fn apply(
    authority: &Authority,
    target: &Target,
    uri: &Uri,
    headers: &mut HeaderMap,
) -> Result<Vec<CredentialUse>, Denial> {
    let mut used = Vec::new();
    let mut set: Vec<(HeaderName, HeaderValue)> = Vec::new();
    for (i, c) in authority.credentials.iter().enumerate() {
        if !c.belongs_to(target) {
            continue;
        }
        let Ok(name) = HeaderName::from_bytes(c.header().as_bytes()) else {
            continue;
        };
        let wanted = match c.placeholder() {
            None => true,
            Some(p) => headers
                .get_all(&name)
                .iter()
                .any(|v| contains(v.as_bytes(), p.as_bytes())),
        };
        if !wanted {
            continue;
        }
        // A credential without a loaded secret cannot occur (the loader refuses to start
        // without it); fail closed rather than send the placeholder on.
        let found = Found {
            index: i,
            credential: c,
            place: Place::Header(name.as_str().to_owned()),
            encoded: false,
        };
        if !c.has_secret() {
            return Err(misuse(
                authority,
                &found,
                target,
                "but its secret is not loaded",
            ));
        }
        let value = HeaderValue::from_bytes(&c.header_value()).map_err(|_| {
            misuse(
                authority,
                &found,
                target,
                "but its secret is not a header value",
            )
        })?;
        set.push((name, value));
        used.push(CredentialUse {
            header: c.header().to_owned(),
            host: c.host().to_owned(),
        });
    }
    for (name, mut value) in set {
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    // What is left may hold no placeholder: every one that was asked for is replaced.
    find_placeholder(authority, uri, headers).map_or(Ok(used), |found| {
        Err(misuse(authority, &found, target, &found.why(target)))
    })
}

/// A plain `http://` request of `authority` to `target`: it may carry none of the
/// authority's placeholders, not even to the credential's own host (a secret never
/// travels in clear text, so there it would be forwarded as it is).
///
/// # Errors
/// A `credential_misuse` denial naming the credential.
pub(crate) fn check_plain(
    authority: &Authority,
    target: &Target,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(), Denial> {
    match find_placeholder(authority, uri, headers) {
        None => Ok(()),
        Some(found) => Err(misuse(
            authority,
            &found,
            target,
            &format!(
                "{} of a plain http:// request, where no secret is ever added",
                found.place_words()
            ),
        )),
    }
}

/// The target of a tunnel (`CONNECT host:port`, a SOCKS5 domain name) or of any request,
/// judged where it is decided and before its name is resolved: a host name that holds one
/// of `authority`'s placeholders (as a label under an allowed `*.` pattern, say) would
/// carry it to DNS resolvers and, as the TLS SNI, to whoever answers. The canonical host
/// is compared as the request-target check compares (as it is and percent-decoded),
/// ignoring ASCII case (host names are case-insensitive, RFC 4343).
///
/// # Errors
/// A `credential_misuse` denial naming the credential.
pub(crate) fn check_target(authority: &Authority, target: &Target) -> Result<(), Denial> {
    if !has_placeholders(authority) {
        return Ok(());
    }
    let host = target.host.as_text().to_ascii_lowercase();
    let decoded = if host.contains('%') {
        percent_decode(host.as_bytes())
    } else {
        Vec::new()
    };
    for (index, credential) in authority.credentials.iter().enumerate() {
        let Some(p) = credential.placeholder() else {
            continue;
        };
        let p = p.to_ascii_lowercase();
        let raw = contains(host.as_bytes(), p.as_bytes());
        let encoded = !raw && decoded.iter().any(|d| contains(d, p.as_bytes()));
        if raw || encoded {
            let found = Found {
                index,
                credential,
                place: Place::Host,
                encoded,
            };
            return Err(misuse(
                authority,
                &found,
                target,
                "in the host name itself (refused before the name is resolved)",
            ));
        }
    }
    Ok(())
}

/// The trailer fields of a request of `authority` to `target` (RFC 9110 section 6.5): a
/// placeholder there is never replaced (a credential's header is a header, not a
/// trailer), so it is refused on every host, the credential's own included.
///
/// # Errors
/// A `credential_misuse` denial naming the credential.
pub(crate) fn check_trailers(
    authority: &Authority,
    target: &Target,
    trailers: &HeaderMap,
) -> Result<(), Denial> {
    if !has_placeholders(authority) {
        return Ok(());
    }
    let texts = trailers
        .iter()
        .map(|(name, value)| (Place::Trailer(name.as_str().to_owned()), value.as_bytes()));
    match scan(authority, texts) {
        None => Ok(()),
        Some(found) => Err(misuse(
            authority,
            &found,
            target,
            &format!(
                "{}, sent after the body, where a placeholder is never replaced; the request was cut before the trailer left the mediator",
                found.place_words()
            ),
        )),
    }
}

/// A request body passed on upstream with its trailer fields checked
/// ([`check_trailers`]): they arrive after the body, when the request head (and the body)
/// may already be upstream, so a trailer that carries a placeholder is never yielded:
/// the body fails instead, which cuts the upstream request (HTTP/2: its stream is reset;
/// HTTP/1.1: the connection is closed before the last chunk), and the denial is recorded
/// at once by the `record` callback and kept for the request's answer ([`TrailerVerdict`]).
/// Data frames pass through untouched; bodies themselves are not scanned.
pub(crate) struct CheckedBody {
    inner: Incoming,
    /// `None` when the authority holds no placeholder: nothing to check.
    check: Option<Box<TrailerCheck>>,
    /// A trailer was refused: nothing more is passed on.
    cut: bool,
}

struct TrailerCheck {
    authority: Arc<Authority>,
    target: Target,
    denied: Arc<OnceLock<Denial>>,
    record: Box<dyn FnOnce(&Denial) + Send>,
}

/// What the trailer check of one [`CheckedBody`] found, readable after the upstream
/// request ended.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrailerVerdict(Option<Arc<OnceLock<Denial>>>);

impl TrailerVerdict {
    /// The `credential_misuse` denial of a trailer, once the body reached it.
    pub(crate) fn denial(&self) -> Option<&Denial> {
        self.0.as_ref().and_then(|d| d.get())
    }
}

impl CheckedBody {
    /// `body` as it is: for what needs no check (an authority without placeholders).
    pub(crate) fn unchecked(body: Incoming) -> Self {
        Self {
            inner: body,
            check: None,
            cut: false,
        }
    }

    /// `body` of a request of `authority` to `target`, its trailers checked; `record`
    /// logs the denial once, when a trailer is refused.
    pub(crate) fn new(
        body: Incoming,
        authority: &Arc<Authority>,
        target: &Target,
        record: impl FnOnce(&Denial) + Send + 'static,
    ) -> (Self, TrailerVerdict) {
        if !has_placeholders(authority) {
            return (Self::unchecked(body), TrailerVerdict::default());
        }
        let denied = Arc::new(OnceLock::new());
        let check = TrailerCheck {
            authority: Arc::clone(authority),
            target: target.clone(),
            denied: Arc::clone(&denied),
            record: Box::new(record),
        };
        (
            Self {
                inner: body,
                check: Some(Box::new(check)),
                cut: false,
            },
            TrailerVerdict(Some(denied)),
        )
    }
}

impl Body for CheckedBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        if this.cut {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(Error::ClientBody(e)))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let (Some(trailers), Some(check)) = (frame.trailers_ref(), &this.check)
            && let Err(denial) = check_trailers(&check.authority, &check.target, trailers)
        {
            // Taken so that the callback runs once; a body polled again after its error
            // passes nothing more on either.
            this.cut = true;
            if let Some(check) = this.check.take() {
                (check.record)(&denial);
                let _ = check.denied.set(denial);
            }
            return Poll::Ready(Some(Err(Error::PlaceholderInTrailer)));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.cut || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

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
enum Place {
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
struct Found<'a> {
    /// The credential's index in its authority (`credential[index + 1]` in messages).
    index: usize,
    credential: &'a Credential,
    place: Place,
    /// Only the percent-decoded text held it.
    encoded: bool,
}

impl Found<'_> {
    /// `in the x-note header`, `percent-encoded in the request target`, ...
    fn place_words(&self) -> String {
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
    fn why(&self, target: &Target) -> String {
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

fn has_placeholders(authority: &Authority) -> bool {
    authority
        .credentials
        .iter()
        .any(|c| c.placeholder().is_some())
}

/// The first credential whose placeholder occurs in the request target or a header value
/// (as sent, or percent-decoded).
fn find_placeholder<'a>(
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
fn scan<'a, 't>(
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

fn misuse(authority: &Authority, found: &Found<'_>, target: &Target, why: &str) -> Denial {
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

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
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

#[cfg(test)]
#[path = "credential_tests.rs"]
mod tests;
