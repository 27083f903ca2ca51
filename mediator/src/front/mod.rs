//! The protocol front-ends (design section 6): they translate a wire format to and from
//! the connection's steps (`crate::conn`), and decide nothing themselves. One socket
//! serves both: the first byte `0x05` means SOCKS5 ([`socks`]), anything else HTTP/1.1
//! ([`http`]: CONNECT and absolute-form forwarding). A tunnel whose host's TLS is
//! terminated is served, after its SNI gate, by `crate::terminate`.

pub(crate) mod http;
pub(crate) mod socks;

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use crate::conn::Ctx;
use crate::rewind::Rewind;
use crate::shared::Shared;

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
