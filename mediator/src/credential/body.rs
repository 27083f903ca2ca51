//! A terminated request's trailer fields, checked for the authority's placeholders:
//! they arrive after the body, so a refused one cuts the request ([`CheckedBody`]).

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::HeaderMap;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use policy::Target;
use policy::config::Authority;

use crate::denial::Denial;
use crate::error::{Error, chain};

use super::scan::{Place, has_placeholders, refuse_found, scan};

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
    refuse_found(
        authority,
        scan(authority, texts),
        target,
        ", sent after the body, where a placeholder is never replaced; the request was cut before the trailer left the mediator",
    )
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
    /// Where the client's own body failure is told (see [`TrailerVerdict::client_fault`]).
    fault: Arc<OnceLock<String>>,
}

pub(super) struct TrailerCheck {
    authority: Arc<Authority>,
    target: Target,
    denied: Arc<OnceLock<Denial>>,
    record: Box<dyn FnOnce(&Denial) + Send>,
}

/// What the trailer check of one [`CheckedBody`] found, and whether the client's body
/// itself failed, readable after the upstream request ended.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrailerVerdict {
    denied: Option<Arc<OnceLock<Denial>>>,
    fault: Arc<OnceLock<String>>,
}

impl TrailerVerdict {
    /// The `credential_misuse` denial of a trailer, once the body reached it.
    pub(crate) fn denial(&self) -> Option<&Denial> {
        self.denied.as_ref().and_then(|d| d.get())
    }

    /// What was wrong with the client's body when reading it failed (e.g. a chunk-size
    /// line that does not end in CRLF, RFC 9112 section 7.1, or a body cut short): the
    /// upstream request failed by the client's fault, not the upstream's.
    pub(crate) fn client_fault(&self) -> Option<&str> {
        self.fault.get().map(String::as_str)
    }
}

impl CheckedBody {
    /// `body` as it is: for what needs no check (an authority without placeholders).
    fn unchecked(body: Incoming, fault: Arc<OnceLock<String>>) -> Self {
        Self {
            inner: body,
            check: None,
            cut: false,
            fault,
        }
    }

    /// `body` of a request of `authority` to `target`, its trailers checked; the
    /// callback `record` makes (only when there is something to check: the authority
    /// holds placeholders) logs the denial once, when a trailer is refused.
    pub(crate) fn new<R>(
        body: Incoming,
        authority: &Arc<Authority>,
        target: &Target,
        record: impl FnOnce() -> R,
    ) -> (Self, TrailerVerdict)
    where
        R: FnOnce(&Denial) + Send + 'static,
    {
        let verdict = TrailerVerdict::default();
        if !has_placeholders(authority) {
            return (Self::unchecked(body, Arc::clone(&verdict.fault)), verdict);
        }
        let denied = Arc::new(OnceLock::new());
        let check = TrailerCheck {
            authority: Arc::clone(authority),
            target: target.clone(),
            denied: Arc::clone(&denied),
            record: Box::new(record()),
        };
        (
            Self {
                inner: body,
                check: Some(Box::new(check)),
                cut: false,
                fault: Arc::clone(&verdict.fault),
            },
            TrailerVerdict {
                denied: Some(denied),
                fault: verdict.fault,
            },
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
            Poll::Ready(Some(Err(e))) => {
                // hyper's own text for a body error is only "error reading a body from
                // connection"; the source says what was wrong.
                let _ = this.fault.set(chain(&e));
                return Poll::Ready(Some(Err(Error::ClientBody(e))));
            }
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
