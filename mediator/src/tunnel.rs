//! A tunnel after its `200` / SOCKS5 success reply: the SNI gate (design section 6), then
//! the relay, then the close record. Shared by CONNECT and SOCKS5 so both tunnel kinds
//! enforce the same rules.
//!
//! The SNI gate runs for tunnels to port 443 when the grant's `sni_check` is on: it reads
//! the client's first bytes (bounded by [`sni::MAX_HELLO`] and the request-head timeout),
//! and requires the TLS ClientHello's SNI, canonicalised, to equal the tunnel host. This
//! refuses domain fronting (CONNECT to an allowed host, SNI of another). Bytes that are not
//! TLS at all are refused too (an unreadable ClientHello, design section 6); a grant that
//! needs another protocol on 443 sets `sni_check = false`. On other ports the client's
//! first bytes are inspected only when the client speaks first: a TLS ClientHello gets
//! the same SNI rule (fronting cannot move to 8443), anything else passes as an opaque
//! tunnel, and a server that speaks first (SSH, SMTP) is never waited on. The bytes read are forwarded unchanged, or, when
//! the grant terminates TLS for the target, replayed into the terminating acceptor
//! (`crate::tls`), which then serves the requests inside instead of relaying bytes.

use std::sync::Arc;

use policy::{Reason, Target, canonicalize_host};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::pipeline::{Connected, Ctx, Denial, Shared, TargetLabel};
use crate::relay::{RelayOutcome, relay};
use crate::sni::{self, Hello};

/// The port whose tunnels carry TLS by convention (RFC 9110 section 4.2.2).
const HTTPS_PORT: u16 = 443;

/// Runs one allowed tunnel to completion and writes its close record. `early` holds bytes
/// the client sent after its request and that were already read (they come first in the
/// tunnel). After the SNI gate, a target matching the grant's `tls_terminate` is handed to
/// [`crate::tls::terminate`] (with the ClientHello bytes the gate read); any other tunnel
/// is relayed.
pub async fn run<C>(
    mut client: C,
    early: Vec<u8>,
    connected: Connected,
    target: &Target,
    shared: Arc<Shared>,
    ctx: &Ctx,
    protocol: &'static str,
) where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let label = TargetLabel::from(target);
    let sni_check = ctx.authority.as_ref().is_some_and(|a| a.grant.sni_check());
    let terminate = ctx
        .authority
        .as_ref()
        .is_some_and(|a| a.grant.terminates_tls(target));
    let mut prefix = early;
    // On 443 the first bytes must be a ClientHello. On other ports the client's first
    // bytes are looked at only if it speaks first (server-speaks-first protocols such as
    // SSH or SMTP must not wait on us): a TLS handshake is held to the same SNI rule, so
    // fronting cannot move to 8443; anything else passes as an opaque tunnel.
    // The gate waits on the client (bounded by the request-head timeout); a shutdown or
    // revocation in the meantime ends the tunnel at once, with its close record.
    let mut closing = connected.closing.clone();
    let upstream_ref = &connected.stream;
    let gate = async {
        if sni_check && target.port == HTTPS_PORT {
            // Boxed: the gate's state is large and plain tunnels should not carry it.
            let read = std::mem::take(&mut prefix);
            Some(Box::pin(sni_gate(&mut client, target, &shared, read, true)).await)
        } else if sni_check && !terminate {
            let first = if prefix.is_empty() {
                client_first(&mut client, upstream_ref, &shared).await
            } else {
                First::Client(std::mem::take(&mut prefix))
            };
            match first {
                First::Client(bytes) if bytes.first() == Some(&TLS_HANDSHAKE) => {
                    Some(Box::pin(sni_gate(&mut client, target, &shared, bytes, false)).await)
                }
                First::Client(bytes) => Some(Gate::Pass(bytes)),
                First::Closed => Some(Gate::Closed),
                First::ServerOrQuiet => None,
            }
        } else {
            None
        }
    };
    let gate = tokio::select! {
        g = gate => g,
        () = crate::listener::wait_true(&mut closing) => {
            let outcome = RelayOutcome::ended("shutdown");
            shared.log_close(ctx, protocol, &label, connected.opened, outcome);
            return;
        }
    };
    if let Some(gate) = gate {
        match gate {
            Gate::Pass(read) => prefix = read,
            Gate::Closed => {
                let outcome = RelayOutcome::ended("client_closed");
                shared.log_close(ctx, protocol, &label, connected.opened, outcome);
                return;
            }
            Gate::Deny(denial) => {
                let name = ctx.authority.as_ref().map(|a| a.grant.name().to_owned());
                shared.deny_early(ctx, name.as_deref(), protocol, &label, denial);
                let outcome = RelayOutcome::ended("sni_mismatch");
                shared.log_close(ctx, protocol, &label, connected.opened, outcome);
                return;
            }
        }
    }
    if terminate {
        // Boxed: termination is rare and its future is large.
        Box::pin(crate::tls::terminate(
            client, prefix, connected, target, shared, ctx, protocol,
        ))
        .await;
        return;
    }
    let mut upstream = connected.stream;
    if !prefix.is_empty() && upstream.write_all(&prefix).await.is_err() {
        let outcome = RelayOutcome::ended("error");
        shared.log_close(ctx, protocol, &label, connected.opened, outcome);
        return;
    }
    let mut outcome = relay(
        client,
        upstream,
        shared.timeouts.idle_tunnel,
        // Per authority: closes on revocation (after the grace) and on shutdown.
        connected.closing.clone(),
    )
    .await;
    outcome.up += prefix.len() as u64;
    shared.log_close(ctx, protocol, &label, connected.opened, outcome);
}

/// TLS record content type `handshake` (RFC 8446 section 5.1).
const TLS_HANDSHAKE: u8 = 0x16;

/// Who spoke first on a tunnel to a port other than 443.
enum First {
    /// The client sent these bytes first.
    Client(Vec<u8>),
    /// The client closed before sending anything.
    Closed,
    /// The server spoke first, or nobody did within the request-head timeout.
    ServerOrQuiet,
}

async fn client_first<C: AsyncRead + Unpin>(
    client: &mut C,
    upstream: &tokio::net::TcpStream,
    shared: &Shared,
) -> First {
    let mut chunk = vec![0u8; 4096];
    tokio::select! {
        biased;
        r = client.read(&mut chunk) => match r {
            Ok(0) | Err(_) => First::Closed,
            Ok(n) => {
                chunk.truncate(n);
                First::Client(chunk)
            }
        },
        _ = upstream.readable() => First::ServerOrQuiet,
        () = tokio::time::sleep(shared.timeouts.request_head) => First::ServerOrQuiet,
    }
}

enum Gate {
    /// Forward these bytes, then relay.
    Pass(Vec<u8>),
    /// The client closed before sending anything.
    Closed,
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
        Gate::Deny(Denial::new(
            Reason::SniMismatch,
            detail,
            format!(
                "the TLS server name (SNI) must equal the tunnel host {}; connect to the host you name",
                target.host
            ),
        ))
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
            Hello::ClientHello { server_names, ech } => {
                return match check_names(&server_names, target) {
                    Ok(()) => Gate::Pass(buf),
                    Err(why) if ech => deny(format!("{why} (ECH outer name)")),
                    Err(why) => deny(why),
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

/// The SNI rule: exactly one name equal (canonically) to a name target; none, or none but
/// the same literal, for an IP-literal target.
fn check_names(names: &[String], target: &Target) -> Result<(), String> {
    match names {
        [] if target.host.ip().is_some() => Ok(()),
        [] => Err(format!(
            "the ClientHello has no SNI; the tunnel is to {}",
            target.host
        )),
        [one] => match canonicalize_host(one) {
            Ok(h) if h == target.host => Ok(()),
            Ok(h) => Err(format!(
                "SNI {h} does not match the tunnel host {}",
                target.host
            )),
            Err(e) => Err(format!("SNI is not a valid host: {e}")),
        },
        _ => Err(format!(
            "the ClientHello names {} servers; one is allowed",
            names.len()
        )),
    }
}
