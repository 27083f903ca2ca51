//! The SOCKS5 front-end (RFC 1928, with RFC 1929 username/password authentication).
//!
//! A small codec of our own rather than a library server: the handshake has to be
//! interleaved with our pipeline (the method set depends on the channel, RFC 1929
//! credentials resolve to an authority with a constant-time hash comparison, domain names
//! go through our canonicaliser, and the REP code comes from the decision reason), and
//! every step must be bounded by the request-head timeout. Only CONNECT is served; BIND
//! and UDP ASSOCIATE get REP 0x07.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use policy::{Reason, Target, canonicalize_host};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::pipeline::{Ctx, Denial, Shared, TargetLabel, escape_raw};

/// RFC 1928 section 3: protocol version.
const VER: u8 = 0x05;
/// RFC 1928 section 3: no authentication required.
const METHOD_NONE: u8 = 0x00;
/// RFC 1928 section 3: username/password (RFC 1929).
const METHOD_USERPASS: u8 = 0x02;
/// RFC 1928 section 3: no acceptable methods.
const METHOD_NO_ACCEPTABLE: u8 = 0xFF;
/// RFC 1928 section 4: CONNECT.
const CMD_CONNECT: u8 = 0x01;
/// RFC 1928 section 5: address types.
const ATYP_IPV4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_IPV6: u8 = 0x04;
/// RFC 1928 section 6: reply codes.
const REP_SUCCEEDED: u8 = 0x00;
const REP_GENERAL_FAILURE: u8 = 0x01;
const REP_COMMAND_NOT_SUPPORTED: u8 = 0x07;
const REP_ATYP_NOT_SUPPORTED: u8 = 0x08;

/// A SOCKS5 request target as sent on the wire, before canonicalisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireAddr {
    /// ATYP 0x01.
    V4(Ipv4Addr),
    /// ATYP 0x04.
    V6(Ipv6Addr),
    /// ATYP 0x03: raw bytes (1..=255).
    Domain(Vec<u8>),
}

/// Protocol failures while reading a SOCKS5 handshake.
#[derive(Debug, thiserror::Error)]
pub enum SocksError {
    /// I/O error or early EOF.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer did not speak SOCKS5.
    #[error("protocol: {0}")]
    Protocol(&'static str),
}

/// Serves one SOCKS5 connection (the first byte, 0x05, has not been consumed); the
/// handshake must be done by `deadline` (the connection's request-head timeout).
pub async fn serve<S>(mut io: S, shared: Arc<Shared>, mut ctx: Ctx, deadline: tokio::time::Instant)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let head = tokio::time::timeout_at(deadline, handshake(&mut io, &shared, &mut ctx)).await;
    let (target, _label) = match head {
        Err(_) => return, // request-head timeout: close silently, nothing was asked.
        Ok(Err(e)) => {
            tracing::debug!("SOCKS5 handshake failed: {e}");
            return;
        }
        Ok(Ok(None)) => return, // already answered (denied)
        Ok(Ok(Some(t))) => t,
    };
    let Some(authority) = ctx.authority.clone() else {
        return;
    };
    let connected = match shared
        .establish(&ctx, &authority.grant, "socks5", &target)
        .await
    {
        Ok(c) => c,
        Err(denial) => {
            let _ = reply(&mut io, denial.socks_rep, None).await;
            return;
        }
    };
    let bound = connected.stream.local_addr().ok();
    if reply(&mut io, REP_SUCCEEDED, bound).await.is_err() {
        return;
    }
    crate::tunnel::run(io, Vec::new(), connected, &target, shared, &ctx, "socks5").await;
}

/// Runs method negotiation, authentication and the request. Returns the canonical target,
/// or `None` when the connection was already answered with a failure.
async fn handshake<S>(
    io: &mut S,
    shared: &Shared,
    ctx: &mut Ctx,
) -> Result<Option<(Target, TargetLabel)>, SocksError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // Method selection (RFC 1928 section 3).
    let mut hdr = [0u8; 2];
    io.read_exact(&mut hdr).await?;
    if hdr[0] != VER {
        return Err(SocksError::Protocol("not SOCKS5"));
    }
    let mut methods = vec![0u8; usize::from(hdr[1])];
    io.read_exact(&mut methods).await?;
    let on_unix = ctx.authority.is_some();
    let chosen = if on_unix && methods.contains(&METHOD_NONE) {
        METHOD_NONE
    } else if methods.contains(&METHOD_USERPASS) {
        METHOD_USERPASS
    } else {
        io.write_all(&[VER, METHOD_NO_ACCEPTABLE]).await?;
        let denial = Denial::new(
            Reason::BadCredential,
            "SOCKS5 client offered no username/password method (RFC 1929)",
            "connect with a user name (the authority) and password (its token)",
        );
        shared.deny_early(ctx, None, "socks5", &TargetLabel::default(), denial);
        return Ok(None);
    };
    io.write_all(&[VER, chosen]).await?;

    if chosen == METHOD_USERPASS {
        // RFC 1929 section 2.
        let mut b = [0u8; 2];
        io.read_exact(&mut b).await?;
        if b[0] != 0x01 {
            return Err(SocksError::Protocol("bad RFC 1929 version"));
        }
        let mut user = vec![0u8; usize::from(b[1])];
        io.read_exact(&mut user).await?;
        let mut plen = [0u8; 1];
        io.read_exact(&mut plen).await?;
        let mut pass = vec![0u8; usize::from(plen[0])];
        io.read_exact(&mut pass).await?;
        if !on_unix {
            let result = match std::str::from_utf8(&user) {
                Ok(name) => shared.authenticate(name, &pass),
                Err(_) => Err(Denial::new(
                    Reason::UnknownAuthority,
                    "user name is not UTF-8",
                    "use the authority name as user name",
                )),
            };
            match result {
                Ok(a) => ctx.authority = Some(a),
                Err(denial) => {
                    io.write_all(&[0x01, 0x01]).await?;
                    shared.deny_early(ctx, None, "socks5", &TargetLabel::default(), denial);
                    return Ok(None);
                }
            }
        }
        // On a Unix socket the channel is the identity; credentials are ignored.
        io.write_all(&[0x01, 0x00]).await?;
    }

    // Request (RFC 1928 section 4).
    let mut req = [0u8; 4];
    io.read_exact(&mut req).await?;
    if req[0] != VER {
        return Err(SocksError::Protocol("bad request version"));
    }
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
        _ => {
            reply(io, REP_ATYP_NOT_SUPPORTED, None).await?;
            return Ok(None);
        }
    };
    let mut port = [0u8; 2];
    io.read_exact(&mut port).await?;
    let port = u16::from_be_bytes(port);
    let name = ctx.authority.as_ref().map(|a| a.grant.name().to_owned());

    if req[1] != CMD_CONNECT {
        reply(io, REP_COMMAND_NOT_SUPPORTED, None).await?;
        return Ok(None);
    }
    let raw_label = TargetLabel {
        host: Some(match &wire {
            WireAddr::V4(a) => a.to_string(),
            WireAddr::V6(a) => a.to_string(),
            WireAddr::Domain(d) => escape_raw(d),
        }),
        port: Some(port),
    };
    match to_target(&wire, port) {
        Ok(target) => {
            let label = TargetLabel::from(&target);
            Ok(Some((target, label)))
        }
        Err(why) => {
            let denial = Denial::new(
                Reason::MalformedTarget,
                why,
                "use a canonical host name or address and a port in 1..=65535",
            );
            let denial = shared.deny_early(ctx, name.as_deref(), "socks5", &raw_label, denial);
            reply(io, denial.socks_rep, None).await?;
            Ok(None)
        }
    }
}

/// Canonicalises a wire address: domain names go through the same canonicaliser as every
/// other front-end; port 0 is malformed.
pub fn to_target(wire: &WireAddr, port: u16) -> Result<Target, String> {
    if port == 0 {
        return Err("port 0".into());
    }
    let host = match wire {
        WireAddr::V4(a) => canonicalize_host(&a.to_string()),
        WireAddr::V6(a) => canonicalize_host(&a.to_string()),
        WireAddr::Domain(d) => match std::str::from_utf8(d) {
            Ok(s) => canonicalize_host(s),
            Err(_) => return Err(format!("domain name is not UTF-8: {}", escape_raw(d))),
        },
    }
    .map_err(|e| e.to_string())?;
    Ok(Target { host, port })
}

/// Writes a reply (RFC 1928 section 6) with BND.ADDR/BND.PORT (zeros when unknown).
async fn reply<S: AsyncWrite + Unpin>(
    io: &mut S,
    rep: u8,
    bound: Option<SocketAddr>,
) -> std::io::Result<()> {
    let rep = if rep > 0x08 { REP_GENERAL_FAILURE } else { rep };
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
    io.write_all(&out).await?;
    io.flush().await
}
