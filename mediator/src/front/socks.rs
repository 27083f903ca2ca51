//! The SOCKS5 front-end (RFC 1928, with RFC 1929 username/password authentication).
//!
//! A small codec of our own rather than a library server: the handshake has to be
//! interleaved with the connection's steps (the method set depends on the channel, RFC
//! 1929 credentials resolve to an authority with a constant-time hash comparison, domain
//! names go through our canonicaliser, and the REP code comes from the denial), and every
//! step must be bounded by the request-head timeout. Only CONNECT is served; BIND and UDP
//! ASSOCIATE get REP 0x07. Lengths come from single bytes, so no read is larger than 255
//! bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use policy::{Reason, Target, canonicalize_host};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::conn::establish::establish;
use crate::conn::held::Watch;
use crate::conn::identify::authenticate;
use crate::conn::{Ctx, TargetLabel, record, tunnel};
use crate::denial::{Cause, Denial};
use crate::redact::escape_raw;
use crate::relay::RelayOutcome;
use crate::shared::Shared;
use crate::vocab::{CloseReason, Protocol};

/// RFC 1928 section 3: protocol version.
const VER: u8 = 0x05;
/// RFC 1928 section 3: no authentication required.
const METHOD_NONE: u8 = 0x00;
/// RFC 1928 section 3: username/password (RFC 1929).
const METHOD_USERPASS: u8 = 0x02;
/// RFC 1928 section 3: no acceptable methods.
const METHOD_NO_ACCEPTABLE: u8 = 0xFF;
/// RFC 1929 section 2: the subnegotiation version.
const USERPASS_VER: u8 = 0x01;
/// RFC 1928 section 4: commands.
const CMD_CONNECT: u8 = 0x01;
const CMD_BIND: u8 = 0x02;
const CMD_UDP_ASSOCIATE: u8 = 0x03;
/// RFC 1928 section 5: address types.
const ATYP_IPV4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_IPV6: u8 = 0x04;
/// RFC 1928 section 6: reply codes.
const REP_SUCCEEDED: u8 = 0x00;
const REP_GENERAL_FAILURE: u8 = 0x01;
const REP_ATYP_NOT_SUPPORTED: u8 = 0x08;

/// A SOCKS5 request target as sent on the wire, before canonicalisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WireAddr {
    /// ATYP 0x01.
    V4(Ipv4Addr),
    /// ATYP 0x04.
    V6(Ipv6Addr),
    /// ATYP 0x03: raw bytes (1..=255).
    Domain(Vec<u8>),
}

/// Protocol failures while reading a SOCKS5 handshake.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SocksError {
    /// I/O error or early EOF.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer did not speak SOCKS5.
    #[error("protocol: {0}")]
    Protocol(&'static str),
}

/// Serves one SOCKS5 connection (the first byte, 0x05, has not been consumed); the
/// handshake must be done by `deadline` (the connection's request-head timeout).
pub(crate) async fn serve<S>(
    mut io: S,
    shared: Arc<Shared>,
    mut ctx: Ctx,
    deadline: tokio::time::Instant,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let head = tokio::time::timeout_at(deadline, handshake(&mut io, &shared, &mut ctx)).await;
    let target = match head {
        Err(_) => return, // request-head timeout: close silently, nothing was asked.
        Ok(Err(SocksError::Io(e))) => {
            // The client went away mid-handshake: nothing to answer.
            tracing::debug!("SOCKS5 handshake failed: {e}");
            return;
        }
        Ok(Err(SocksError::Protocol(what))) => {
            // Not SOCKS5 the mediator takes: cut, and logged as every refusal is.
            let denial = Denial::new(
                Reason::BadRequest,
                format!("SOCKS5 handshake refused: {what}"),
                "speak SOCKS5 (RFC 1928) with RFC 1929 username/password authentication",
            );
            record::deny(
                &shared,
                &ctx,
                Protocol::Socks5,
                &TargetLabel::default(),
                denial,
            );
            return;
        }
        Ok(Ok(None)) => return, // already answered (denied)
        Ok(Ok(Some(t))) => t,
    };
    // Held for the host's answer (design section 20), the socket is read: its leaving
    // ends the hold, and what it sends early goes to the tunnel.
    let mut early = Vec::new();
    let watch = Watch::Read {
        io: &mut io,
        early: &mut early,
    };
    let connected = match establish(&shared, &ctx, Protocol::Socks5, &target, watch).await {
        Ok(c) => c,
        Err(denial) => {
            let _ = reply(&mut io, denial.socks_rep(), None).await;
            return;
        }
    };
    let bound = connected.stream.local_addr().ok();
    if reply(&mut io, REP_SUCCEEDED, bound).await.is_err() {
        // The client went away between its request and our answer.
        connected
            .opened
            .finish(RelayOutcome::ended(CloseReason::ClientClosed));
        return;
    }
    tunnel::run(io, early, connected, &target, shared).await;
}

/// The method the mediator picks from the client's offer (RFC 1928 section 3): on a Unix
/// socket the channel is the identity, so "no authentication" is enough; on the TCP
/// listener only username/password (RFC 1929) names an authority.
fn choose_method(on_unix: bool, offered: &[u8]) -> Option<u8> {
    if on_unix && offered.contains(&METHOD_NONE) {
        Some(METHOD_NONE)
    } else if offered.contains(&METHOD_USERPASS) {
        Some(METHOD_USERPASS)
    } else {
        None
    }
}

/// Runs method negotiation, authentication and the request, in wire order. Returns the
/// canonical target, or `None` when the connection was already answered with a failure
/// (its line written).
pub(crate) async fn handshake<S>(
    io: &mut S,
    shared: &Shared,
    ctx: &mut Ctx,
) -> Result<Option<Target>, SocksError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let refused = match method(io, shared, ctx).await? {
        Ok(()) => return request(io, shared, ctx).await,
        Err(denial) => denial,
    };
    record::deny(
        shared,
        ctx,
        Protocol::Socks5,
        &TargetLabel::default(),
        refused,
    );
    Ok(None)
}

/// The first `N` (at least 1) bytes of a message whose first byte is the version `ver`.
///
/// # Errors
/// An I/O error, or `Protocol(wrong)` for another version.
async fn versioned<const N: usize, S>(
    io: &mut S,
    ver: u8,
    wrong: &'static str,
) -> Result<[u8; N], SocksError>
where
    S: AsyncRead + Unpin,
{
    let mut head = [0u8; N];
    io.read_exact(&mut head).await?;
    if head[0] != ver {
        return Err(SocksError::Protocol(wrong));
    }
    Ok(head)
}

/// Method selection (RFC 1928 section 3) and, for username/password, authentication
/// (RFC 1929 section 2): on the TCP listener the user name and password name the
/// authority (set in `ctx`); on a Unix socket the channel is the identity and credentials
/// are ignored. A refusal is answered on the wire; its denial is returned to be logged.
async fn method<S>(
    io: &mut S,
    shared: &Shared,
    ctx: &mut Ctx,
) -> Result<Result<(), Denial>, SocksError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let hdr: [u8; 2] = versioned(io, VER, "not SOCKS5").await?;
    let mut methods = vec![0u8; usize::from(hdr[1])];
    io.read_exact(&mut methods).await?;
    let on_unix = ctx.authority.is_some();
    let Some(chosen) = choose_method(on_unix, &methods) else {
        io.write_all(&[VER, METHOD_NO_ACCEPTABLE]).await?;
        return Ok(Err(Denial::new(
            Reason::BadCredential,
            "SOCKS5 client offered no username/password method (RFC 1929)",
            "connect with a user name (the authority) and password (its token)",
        )
        .with_cause(Cause::CredentialRejected)));
    };
    io.write_all(&[VER, chosen]).await?;
    if chosen != METHOD_USERPASS {
        return Ok(Ok(()));
    }
    let b: [u8; 2] = versioned(io, USERPASS_VER, "bad RFC 1929 version").await?;
    let mut user = vec![0u8; usize::from(b[1])];
    io.read_exact(&mut user).await?;
    let mut plen = [0u8; 1];
    io.read_exact(&mut plen).await?;
    let mut pass = vec![0u8; usize::from(plen[0])];
    io.read_exact(&mut pass).await?;
    if !on_unix {
        let result = match std::str::from_utf8(&user) {
            Ok(name) => authenticate(shared, name, &pass),
            Err(_) => Err(Denial::new(
                Reason::UnknownAuthority,
                "user name is not UTF-8",
                "use the authority name as user name",
            )
            .with_cause(Cause::CredentialRejected)),
        };
        match result {
            Ok(a) => ctx.authority = Some(a),
            Err(denial) => {
                io.write_all(&[USERPASS_VER, 0x01]).await?;
                return Ok(Err(denial));
            }
        }
    }
    io.write_all(&[USERPASS_VER, 0x00]).await?;
    Ok(Ok(()))
}

/// The request (RFC 1928 section 4): `CONNECT` to a canonical target, else a failure
/// answered with the denial's `REP` (and logged).
async fn request<S>(io: &mut S, shared: &Shared, ctx: &Ctx) -> Result<Option<Target>, SocksError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let req: [u8; 4] = versioned(io, VER, "bad request version").await?;
    let wire = match req[3] {
        ATYP_IPV4 => {
            let mut a = [0u8; 4];
            io.read_exact(&mut a).await?;
            WireAddr::V4(Ipv4Addr::from(a))
        }
        ATYP_IPV6 => {
            let mut a = [0u8; 16];
            io.read_exact(&mut a).await?;
            WireAddr::V6(Ipv6Addr::from(a))
        }
        ATYP_DOMAIN => {
            let mut len = [0u8; 1];
            io.read_exact(&mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            io.read_exact(&mut name).await?;
            WireAddr::Domain(name)
        }
        atyp => {
            let denial = Denial::new(
                Reason::MalformedTarget,
                format!("SOCKS5 address type {atyp:#04x} is not supported"),
                "send an IPv4 address (ATYP 0x01), a domain name (0x03) or an IPv6 address (0x04), RFC 1928 section 5",
            )
            .with_cause(Cause::AddressTypeNotSupported);
            return refuse(io, shared, ctx, &TargetLabel::default(), denial).await;
        }
    };
    let mut port = [0u8; 2];
    io.read_exact(&mut port).await?;
    let port = u16::from_be_bytes(port);
    let raw_label = TargetLabel {
        host: Some(match &wire {
            WireAddr::V4(a) => a.to_string(),
            WireAddr::V6(a) => a.to_string(),
            WireAddr::Domain(d) => escape_raw(d),
        }),
        port: Some(port),
    };
    if req[1] != CMD_CONNECT {
        let name = match req[1] {
            CMD_BIND => "BIND",
            CMD_UDP_ASSOCIATE => "UDP ASSOCIATE",
            _ => "unknown",
        };
        let denial = Denial::new(
            Reason::MalformedTarget,
            format!("SOCKS5 command {name} ({:#04x}) is not supported", req[1]),
            "only CONNECT (0x01) is served (RFC 1928 section 4)",
        )
        .with_cause(Cause::CommandNotSupported);
        return refuse(io, shared, ctx, &raw_label, denial).await;
    }
    match to_target(&wire, port) {
        Ok(target) => Ok(Some(target)),
        Err(why) => {
            let denial = Denial::new(
                Reason::MalformedTarget,
                why.to_string(),
                "use a canonical host name or address and a port in 1..=65535",
            );
            refuse(io, shared, ctx, &raw_label, denial).await
        }
    }
}

/// Logs `denial` and answers the request with its `REP`.
async fn refuse<S>(
    io: &mut S,
    shared: &Shared,
    ctx: &Ctx,
    label: &TargetLabel,
    denial: Denial,
) -> Result<Option<Target>, SocksError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let denial = record::deny(shared, ctx, Protocol::Socks5, label, denial);
    reply(io, denial.socks_rep(), None).await?;
    Ok(None)
}

/// Canonicalises a wire address: domain names go through the same canonicaliser as every
/// other front-end; port 0 is malformed.
pub(crate) fn to_target(wire: &WireAddr, port: u16) -> Result<Target, TargetError> {
    if port == 0 {
        return Err(TargetError::PortZero);
    }
    let host = match wire {
        WireAddr::V4(a) => canonicalize_host(&a.to_string()),
        WireAddr::V6(a) => canonicalize_host(&a.to_string()),
        WireAddr::Domain(d) => match std::str::from_utf8(d) {
            Ok(s) => canonicalize_host(s),
            Err(_) => return Err(TargetError::NotUtf8(escape_raw(d))),
        },
    }?;
    Ok(Target { host, port })
}

/// Why a SOCKS5 destination is malformed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TargetError {
    /// DST.PORT 0.
    #[error("port 0")]
    PortZero,
    /// A domain name that is not UTF-8 (shown escaped).
    #[error("domain name is not UTF-8: {0}")]
    NotUtf8(String),
    /// The host is refused by the canonicaliser.
    #[error(transparent)]
    Host(#[from] policy::PolicyError),
}

/// A reply (RFC 1928 section 6) with BND.ADDR/BND.PORT (zeros when unknown).
fn encode_reply(rep: u8, bound: Option<SocketAddr>) -> Vec<u8> {
    let rep = if rep > REP_ATYP_NOT_SUPPORTED {
        REP_GENERAL_FAILURE
    } else {
        rep
    };
    let mut out = Vec::with_capacity(22);
    out.extend_from_slice(&[VER, rep, 0x00]);
    match bound.map(|b| (b.ip(), b.port())) {
        Some((IpAddr::V6(a), p)) => {
            out.push(ATYP_IPV6);
            out.extend_from_slice(&a.octets());
            out.extend_from_slice(&p.to_be_bytes());
        }
        Some((IpAddr::V4(a), p)) => {
            out.push(ATYP_IPV4);
            out.extend_from_slice(&a.octets());
            out.extend_from_slice(&p.to_be_bytes());
        }
        None => out.extend_from_slice(&[ATYP_IPV4, 0, 0, 0, 0, 0, 0]),
    }
    out
}

/// Writes a reply (RFC 1928 section 6).
async fn reply<S: AsyncWrite + Unpin>(
    io: &mut S,
    rep: u8,
    bound: Option<SocketAddr>,
) -> std::io::Result<()> {
    io.write_all(&encode_reply(rep, bound)).await?;
    io.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_method_depends_on_the_channel() {
        assert_eq!(choose_method(true, &[0x00, 0x02]), Some(METHOD_NONE));
        assert_eq!(choose_method(false, &[0x00, 0x02]), Some(METHOD_USERPASS));
        assert_eq!(choose_method(false, &[0x00]), None);
        assert_eq!(choose_method(true, &[0x02]), Some(METHOD_USERPASS));
        assert_eq!(choose_method(true, &[]), None);
    }

    #[test]
    fn wire_addresses_are_canonicalised_or_refused() {
        let t = to_target(&WireAddr::Domain(b"Example.COM.".to_vec()), 443).unwrap();
        assert_eq!(t.to_string(), "example.com:443");
        let t = to_target(&WireAddr::V6("::ffff:192.0.2.1".parse().unwrap()), 80).unwrap();
        assert_eq!(t.host.as_text(), "192.0.2.1");
        assert_eq!(
            to_target(&WireAddr::V4(Ipv4Addr::LOCALHOST), 0)
                .unwrap_err()
                .to_string(),
            "port 0"
        );
        let e = to_target(&WireAddr::Domain(vec![0xff, b'a']), 80)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not UTF-8") && e.contains("\\xff"), "{e}");
        assert!(to_target(&WireAddr::Domain(b"127.1".to_vec()), 80).is_err());
    }

    #[test]
    fn replies_carry_the_bound_address_or_zeros() {
        assert_eq!(encode_reply(0x02, None), [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
        let v4 = encode_reply(0x00, Some("127.0.0.1:258".parse().unwrap()));
        assert_eq!(v4, [5, 0, 0, 1, 127, 0, 0, 1, 1, 2]);
        let v6 = encode_reply(0x00, Some("[::1]:1".parse().unwrap()));
        assert_eq!((v6.len(), v6[3], v6[19], v6[21]), (22, ATYP_IPV6, 1, 1));
        // Codes outside RFC 1928 section 6 become general failure.
        assert_eq!(encode_reply(0x42, None)[1], REP_GENERAL_FAILURE);
    }
}
