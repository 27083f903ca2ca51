//! The protocol front-ends (design section 6): they translate a wire format to and from
//! the connection's steps (`crate::conn`), and decide nothing themselves. One socket
//! serves both: the first byte `0x05` means SOCKS5 ([`socks`]), anything else HTTP/1.1
//! ([`http`]: CONNECT and absolute-form forwarding). A tunnel whose host's TLS is
//! terminated is served, after its SNI gate, by `crate::terminate`.

pub(crate) mod http;
pub(crate) mod proxy_v2;
pub(crate) mod socks;

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use crate::conn::{Ctx, TargetLabel};
use crate::decision_log::Peer;
use crate::denial::Denial;
use crate::request::response::{refuse, write_raw_response};
use crate::rewind::Rewind;
use crate::shared::Shared;
use crate::vocab::Protocol;

/// SOCKS protocol version 5 (RFC 1928 section 3): the first byte of a SOCKS5 greeting.
const SOCKS5: u8 = 0x05;

/// Reads the client's first bytes (under the request-head timeout) and hands the
/// connection to SOCKS5 or HTTP, those bytes put back in front. One read of up to 2 KiB
/// usually holds a whole request head, so HTTP needs no second read.
pub(crate) async fn dispatch<S>(mut io: S, shared: Arc<Shared>, ctx: Ctx)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // One request-head deadline for the whole head, however it is split across reads
    // (shorter for a connection admitted under pressure or only to be refused).
    let timeout = ctx.admission.head_timeout(shared.timeouts.request_head);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut first = BytesMut::with_capacity(2048);
    match tokio::time::timeout_at(deadline, io.read_buf(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {}
        _ => return,
    }
    // On an authority's socket the shim may put the host's labels in front (design
    // section 20): one byte compared for every other connection.
    let ctx = if first[0] == b'\r' && matches!(ctx.peer, Peer::Unix { .. }) {
        match labelled(&mut io, &mut first, &shared, ctx, deadline).await {
            Some(ctx) => ctx,
            None => return,
        }
    } else {
        ctx
    };
    let socks = first[0] == SOCKS5;
    let io = Rewind::new(first.freeze(), io);
    if socks {
        // Boxed: the SOCKS5 side's future is larger than the HTTP side's, and a CONNECT
        // tunnel (most of them) should not carry its size for its whole life.
        Box::pin(socks::serve(io, shared, ctx, deadline)).await;
    } else {
        http::serve(io, shared, ctx, deadline).await;
    }
}

/// Takes a PROXY protocol v2 header (`proxy_v2`) off the front of `first` and returns
/// `ctx` with its labels, `first` holding the client's first bytes again; `None` when
/// the connection ends here: it closed, or the header was refused (answered with the JSON
/// `400`, `bad_request`, and logged).
async fn labelled<S>(
    io: &mut S,
    first: &mut BytesMut,
    shared: &Shared,
    ctx: Ctx,
    deadline: tokio::time::Instant,
) -> Option<Ctx>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let labels = match proxy_v2::take(io, first, deadline).await {
        Ok(labels) => labels,
        Err(proxy_v2::NotTaken::Closed) => return None,
        Err(proxy_v2::NotTaken::Refused(why)) => {
            let denial = Denial::new(
                policy::Reason::BadRequest,
                why,
                "a PROXY protocol v2 header on an authority's socket may carry the invocation (TLV 0xE0) and KEY=VALUE tags (TLV 0xE1) within their bounds; see docs/control.md",
            );
            let resp = refuse(
                shared,
                &ctx,
                Protocol::Http,
                &TargetLabel::default(),
                denial,
            );
            let _ = write_raw_response(io, resp).await;
            return None;
        }
    };
    if first.is_empty() {
        match tokio::time::timeout_at(deadline, io.read_buf(first)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return None,
        }
    }
    Some(match labels {
        Some(labels) => ctx.labelled(labels),
        None => ctx,
    })
}
