//! A tunnel after its `200` / SOCKS5 success reply: the SNI gate (design section 6), then
//! the relay, or TLS termination. Shared by CONNECT and SOCKS5 so both tunnel kinds enforce
//! the same rules; the tunnel's [`Opened`](super::close::Opened) writes its close record.
//!
//! The SNI gate runs for tunnels to port 443 when the grant's `sni_check` is on: it reads
//! the client's first bytes (bounded by [`sni::MAX_HELLO`] and the request-head timeout),
//! and applies the one SNI rule ([`policy::check_sni`]) to the ClientHello. This refuses
//! domain fronting (CONNECT to an allowed host, SNI of another). Bytes that are not TLS at
//! all are refused too (an unreadable ClientHello, design section 6); a grant that needs
//! another protocol on 443 sets `sni_check = false`. On other ports the client's first
//! bytes are inspected only when the client speaks first: a TLS ClientHello gets the same
//! rule (fronting cannot move to 8443), anything else passes as an opaque tunnel, and a
//! server that speaks first (SSH, SMTP) is never waited on. A client that stays silent
//! first is waited on for as long as a tunnel may be idle (`timeouts.idle_tunnel`), so
//! silence cannot carry a ClientHello past the rule. A refusal resets the client's TCP
//! connection: it has seen its `200`, and must not take the end for the origin's. The
//! bytes read are forwarded unchanged or, when the grant terminates TLS for the target,
//! replayed into the terminating acceptor (`crate::terminate`), which applies the same
//! SNI rule to what it accepts.

use std::sync::Arc;

use policy::{Target, check_sni};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::TargetLabel;
use super::establish::Connected;
use super::record;
use crate::denial::{Cause, Denial};
use crate::relay::{RelayOutcome, Sock, relay, socket_of};
use crate::reuse::Leg;
use crate::route::UpstreamStream;
use crate::shared::Shared;
use crate::sni::{self, Hello};
use crate::vocab::CloseReason;

/// The port whose tunnels carry TLS by convention (RFC 9110 section 4.2.2).
const HTTPS_PORT: u16 = 443;

/// TLS record content type `handshake` (RFC 8446 section 5.1).
const TLS_HANDSHAKE: u8 = 0x16;

/// Runs one allowed tunnel to completion and writes its close record. `early` holds bytes
/// the client sent after its request and that were already read (they come first in the
/// tunnel). After the SNI gate, a target matching the grant's `tls_terminate` is handed to
/// [`crate::terminate::terminate`] (with the ClientHello bytes the gate read); any other tunnel
/// is relayed.
pub(crate) async fn run<C>(
    mut client: C,
    early: Vec<u8>,
    connected: Connected,
    target: &Target,
    shared: Arc<Shared>,
) where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let grant = connected.opened.ctx().authority.as_ref().map(|a| &a.grant);
    let sni_check = grant.is_some_and(policy::Grant::sni_check);
    let terminate = grant.is_some_and(|g| g.terminates_tls(target));
    let mut prefix = early;
    let flags = (sni_check, terminate);
    let gate = gate(
        &mut client,
        &connected.stream,
        target,
        &shared,
        &mut prefix,
        flags,
    );
    let gate = tokio::select! {
        g = gate => g,
        () = connected.closing.cancelled() => {
            // A cut, never an end the client could take for the origin's.
            cut(&client, &connected.stream);
            connected.opened.finish(RelayOutcome::ended(CloseReason::Shutdown));
            return;
        }
    };
    match gate {
        Some(Gate::Pass(read)) => prefix = read,
        Some(Gate::Closed) => {
            connected
                .opened
                .finish(RelayOutcome::ended(CloseReason::ClientClosed));
            return;
        }
        Some(Gate::Quiet) => {
            // An idle timeout cuts as the relay's does.
            cut(&client, &connected.stream);
            connected
                .opened
                .finish(RelayOutcome::ended(CloseReason::IdleTimeout));
            return;
        }
        Some(Gate::Deny(denial)) => {
            // The client has seen its `200`: the refusal is a reset, not an end it could
            // take for the origin's.
            cut(&client, &connected.stream);
            let label = TargetLabel::from(target);
            let opened = connected.opened;
            record::deny(&shared, opened.ctx(), opened.protocol(), &label, denial);
            opened.finish(RelayOutcome::ended(CloseReason::SniMismatch));
            return;
        }
        None => {}
    }
    if terminate {
        // Boxed: termination is rare and its future is large.
        Box::pin(crate::terminate::terminate(
            client, prefix, connected, target, shared,
        ))
        .await;
        return;
    }
    let Connected {
        stream,
        opened,
        closing,
        ..
    } = connected;
    // Only a terminated tunnel is ever given a reused upstream connection.
    let Some(mut upstream) = stream.into_stream() else {
        opened.finish(RelayOutcome::ended(CloseReason::Error));
        return;
    };
    if !prefix.is_empty() && upstream.write_all(&prefix).await.is_err() {
        opened.finish(RelayOutcome::ended(CloseReason::Error));
        return;
    }
    // Per authority: closes on revocation (after the grace) and on shutdown.
    // Bytes reach `mediator_bytes_total` while the tunnel is open, not only at its close:
    // the client's first bytes (read before the relay) at once.
    opened.progress(prefix.len() as u64, 0);
    let progress = |up, down| opened.progress(up, down);
    let mut outcome = relay(
        client,
        upstream,
        shared.timeouts.idle_tunnel,
        closing,
        Some(&progress),
    )
    .await;
    outcome.up += prefix.len() as u64;
    opened.finish(outcome);
}

/// The SNI gate of a tunnel whose grant checks SNI (`None`: no gate applies). On 443 the
/// first bytes must be a ClientHello. On other ports (not for a terminated tunnel, whose
/// acceptor reads the ClientHello itself) the client's first bytes are looked at only if
/// it speaks first (server-speaks-first protocols such as SSH or SMTP must not wait on
/// us). The gate waits on the client (bounded by the request-head timeout); the caller
/// ends it at once on a shutdown or revocation. `prefix` holds the bytes read before;
/// what passes the gate is in [`Gate::Pass`].
async fn gate<C: AsyncRead + Unpin>(
    client: &mut C,
    upstream: &Leg,
    target: &Target,
    shared: &Arc<Shared>,
    prefix: &mut Vec<u8>,
    (sni_check, terminate): (bool, bool),
) -> Option<Gate> {
    if sni_check && target.port == HTTPS_PORT {
        // Boxed: the gate's state is large and plain tunnels should not carry it.
        let read = std::mem::take(prefix);
        return Some(Box::pin(sni_gate(client, target, shared, read, true)).await);
    }
    // A reused upstream connection is a terminated tunnel's.
    let upstream = match upstream.stream() {
        Some(stream) if sni_check && !terminate => stream,
        _ => return None,
    };
    let first = if prefix.is_empty() {
        client_first(client, upstream, shared).await
    } else {
        First::Client(std::mem::take(prefix))
    };
    match first {
        First::Client(bytes) if bytes.first() == Some(&TLS_HANDSHAKE) => {
            Some(Box::pin(sni_gate(client, target, shared, bytes, false)).await)
        }
        First::Client(bytes) => Some(Gate::Pass(bytes)),
        First::Closed => Some(Gate::Closed),
        First::Quiet => Some(Gate::Quiet),
        First::Server => None,
    }
}

/// Who spoke first on a tunnel to a port other than 443.
enum First {
    /// The client sent these bytes first.
    Client(Vec<u8>),
    /// The client closed before sending anything.
    Closed,
    /// The server spoke first: the client's bytes are not a ClientHello to check.
    Server,
    /// Nobody spoke for `timeouts.idle_tunnel`.
    Quiet,
}

/// The most [`client_first`] reads in its one read, in bytes.
const FIRST_READ: usize = 512;

async fn client_first<C: AsyncRead + Unpin>(
    client: &mut C,
    upstream: &UpstreamStream,
    shared: &Shared,
) -> First {
    // Small and inline: a tunnel whose client waits for the server (SSH, SMTP) holds this
    // for up to the request-head timeout, and a heap buffer would cost every such tunnel
    // its size. A ClientHello longer than this is read on by the SNI gate; other bytes
    // are simply relayed after it.
    let mut chunk = [0u8; FIRST_READ];
    tokio::select! {
        biased;
        r = client.read(&mut chunk) => match r {
            Ok(0) | Err(_) => First::Closed,
            Ok(n) => First::Client(chunk[..n].to_vec()),
        },
        _ = upstream.readable() => First::Server,
        // Not the request-head timeout: a client that stays silent that long and then
        // sends a ClientHello must still meet the SNI rule, so the wait lasts as long as
        // a tunnel may stay idle.
        () = tokio::time::sleep(shared.timeouts.idle_tunnel) => First::Quiet,
    }
}

enum Gate {
    /// Forward these bytes, then relay.
    Pass(Vec<u8>),
    /// The client closed before sending anything.
    Closed,
    /// Nobody spoke before the idle timeout.
    Quiet,
    /// Refuse: `sni_mismatch`.
    Deny(Denial),
}

/// Reads (after `buf`, bytes already read) until the ClientHello is complete and applies
/// the SNI rule. `strict` (port 443): bytes that are not TLS are a denial; otherwise they
/// pass.
async fn sni_gate<C: AsyncRead + Unpin>(
    client: &mut C,
    target: &Target,
    shared: &Shared,
    mut buf: Vec<u8>,
    strict: bool,
) -> Gate {
    let deadline = tokio::time::Instant::now() + shared.timeouts.request_head;
    let mut chunk = [0u8; 4096];
    let deny = |detail: String| {
        Gate::Deny(Denial::sni_mismatch(detail, target).with_cause(Cause::AfterReply))
    };
    loop {
        // Off 443 a stream is held to the SNI rule only if it really starts like a TLS
        // record (RFC 8446 section 5.1: type 22, legacy version 0x03 0x00..=0x04): a binary
        // protocol whose first byte happens to be 0x16 passes as an opaque tunnel.
        if !strict && !plausible_tls_record(&buf) {
            return Gate::Pass(buf);
        }
        match sni::inspect(&buf) {
            Hello::NeedMore => {}
            // Design section 6: on 443 an unreadable ClientHello is a denial; plaintext
            // there could carry a fronted Host to the allowed host's address unchecked.
            Hello::NotTls if !strict => return Gate::Pass(buf),
            Hello::NotTls => {
                return deny(format!(
                    "the tunnel to port {} did not start with a TLS ClientHello; \
                     set sni_check = false in the grant to allow other protocols on 443",
                    target.port
                ));
            }
            Hello::Malformed(why) => return deny(format!("unreadable TLS ClientHello: {why}")),
            Hello::Complete { server_names, ech } => {
                return match check_sni(&server_names, target) {
                    Ok(()) => Gate::Pass(buf),
                    Err(why) if ech => deny(format!("{why} (ECH outer name)")),
                    Err(why) => deny(why.to_string()),
                };
            }
        }
        let want = chunk
            .len()
            .min(sni::MAX_HELLO.saturating_sub(buf.len()).max(1));
        match tokio::time::timeout_at(deadline, client.read(&mut chunk[..want])).await {
            Err(_) => {
                return deny("no complete TLS ClientHello before the request-head timeout".into());
            }
            Ok(Ok(0)) if buf.is_empty() => return Gate::Closed,
            Ok(Ok(0)) => return deny("the client closed in the middle of its ClientHello".into()),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Ok(Err(_)) => return Gate::Closed,
        }
    }
}

/// Whether `buf` (the first bytes of a tunnel) can still be the start of a TLS handshake
/// record: content type 22, then major version 3 and a minor version of at most 4.
fn plausible_tls_record(buf: &[u8]) -> bool {
    buf.first().is_none_or(|&t| t == TLS_HANDSHAKE)
        && buf.get(1).is_none_or(|&major| major == 3)
        && buf.get(2).is_none_or(|&minor| minor <= 4)
}

/// Makes the coming close of both sockets a reset where they are TCP
/// ([`Sock::reset_on_close`]), as the relay's cuts are: neither side may take the end for
/// the other's. A reused upstream connection (`crate::reuse`) is only dropped: its
/// origin saw no byte of this tunnel.
fn cut<C: 'static>(client: &C, upstream: &Leg) {
    if let Some(sock) = socket_of(client) {
        sock.reset_on_close();
    }
    if let Some(stream) = upstream.stream() {
        Sock::Tcp(stream.tcp()).reset_on_close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plausible_tls_record_is_held_to_the_sni_rule_off_443() {
        assert!(plausible_tls_record(&[]));
        assert!(plausible_tls_record(&[0x16, 0x03, 0x01]));
        assert!(!plausible_tls_record(&[0x16, 0x02]));
        assert!(!plausible_tls_record(&[0x16, 0x03, 0x05]));
        assert!(!plausible_tls_record(b"SSH-2.0"));
    }
}
