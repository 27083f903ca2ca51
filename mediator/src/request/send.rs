//! Sending an allowed request and sorting out what came back, the same for absolute-form
//! forwarding and terminated tunnels: the request's trailer fields are checked for the
//! authority's placeholders as its body streams (`crate::credential::CheckedBody`), then
//! what ended the exchange says what the client is told ([`Sent`]). An answer that is
//! passed on loses its hop-by-hop fields and any decision header ([`relayed`]).

use std::future::Future;
use std::sync::Arc;

use http::{Request, Response};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use policy::Target;
use policy::config::Authority;

use super::response::{Body, DECISION_HEADER};
use super::rewrite::strip_hop_by_hop;
use crate::credential::CheckedBody;
use crate::denial::Denial;

/// How a sent request ended.
#[derive(Debug)]
pub(crate) enum Sent<T> {
    /// The request went through whole: the upstream's answer, or its error.
    Answer(T),
    /// A trailer field carried a placeholder: the request was cut before it (its line is
    /// written already, by the `on_misuse` given to [`send`]).
    Misuse(Denial),
    /// The client's body failed (not valid chunked coding, cut short): its fault, not the
    /// upstream's, and an answer to the part that got through is not the answer to the
    /// request the client sent.
    ClientFault(Denial),
}

/// Sends `req` of `authority` to `target` through `send` (the path's upstream
/// connection), its trailer fields checked on the way: the callback `on_misuse` makes
/// (only for a body that is checked) writes the line of a refused one.
pub(crate) async fn send<F, Fut, T, M>(
    req: Request<Incoming>,
    authority: &Arc<Authority>,
    target: &Target,
    on_misuse: impl FnOnce() -> M,
    send: F,
) -> Sent<T>
where
    M: FnOnce(&Denial) + Send + 'static,
    F: FnOnce(Request<CheckedBody>) -> Fut,
    Fut: Future<Output = T>,
{
    let (parts, body) = req.into_parts();
    let (body, trailers) = CheckedBody::new(body, authority, target, on_misuse);
    let answer = send(Request::from_parts(parts, body)).await;
    if let Some(denial) = trailers.denial() {
        return Sent::Misuse(denial.clone());
    }
    if let Some(fault) = trailers.client_fault() {
        return Sent::ClientFault(Denial::bad_body(fault));
    }
    Sent::Answer(answer)
}

/// The parts of an upstream answer as the client gets them: without hop-by-hop fields
/// (RFC 9110 section 7.6.1) and without an `X-Mediator-Decision` of the upstream's (only
/// the mediator says what it decided).
pub(crate) fn relayed_parts(parts: &mut http::response::Parts) {
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(DECISION_HEADER);
}

/// An upstream answer passed on to the client ([`relayed_parts`], the body as it comes).
pub(crate) fn relayed(resp: Response<Incoming>) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    relayed_parts(&mut parts);
    Response::from_parts(parts, body.boxed())
}
