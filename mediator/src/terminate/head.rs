//! The first HTTP/1.1 request head inside a terminated tunnel, judged as the proxy judges
//! its own first head ([`preflight`]): a head the mediator does not take (a transfer
//! coding it does not implement, an obs-folded line, a bare CR) or whose target is not a
//! URI is answered with the JSON 400 and a `tls` decision line, where hyper would answer a
//! bare 400 and write no record. An HTTP/2 connection (by ALPN, or by its preface) is not
//! read here.

use tokio::io::{AsyncRead, AsyncWrite};

use super::Env;
use crate::conn::record;
use crate::denial::Denial;
use crate::request::preflight::{Preflight, preflight};
use crate::request::response::{deny_response, write_raw_response};
use crate::rewind::Rewind;
use crate::vocab::{CloseReason, Protocol};

/// The client's connection with its first head (read, judged and passed) replayed in
/// front; or how the tunnel ends: the head was refused (answered, logged), or never came.
pub(super) async fn first<S>(mut client: S, env: &Env) -> Result<Rewind<S>, CloseReason>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let shared = &env.shared;
    let deadline = tokio::time::Instant::now() + shared.timeouts.request_head;
    let (reason, detail) =
        match preflight(&mut client, shared.limits.request_head_bytes, deadline).await {
            Preflight::Pass(head) => return Ok(Rewind::new(head.into_buf(), client)),
            Preflight::Closed => return Err(CloseReason::ClientClosed),
            Preflight::Reject { reason, detail, .. } => (reason, detail),
        };
    let authority = env.standing.authority();
    let ctx = env.ctx.attributed(&authority);
    let denial = Denial::new(
        reason,
        detail,
        format!(
            "send HTTP/1.1 requests for {} with CRLF line ends, no folded header lines, no Transfer-Encoding other than chunked, and a valid request target",
            env.target
        ),
    );
    let denial = record::deny(shared, &ctx, Protocol::Tls, &env.label, denial);
    let resp = deny_response(Some(authority.grant.name()), &env.label, &denial);
    let _ = write_raw_response(&mut client, resp).await;
    Err(CloseReason::Error)
}
