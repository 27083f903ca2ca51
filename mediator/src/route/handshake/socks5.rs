//! The SOCKS5 client handshake with a parent (RFC 1928, username/password per RFC
//! 1929), in wire order: the method, the request built from canonical values only, the
//! reply.

use std::net::IpAddr;

use policy::upstream::Credentials;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Dest, HandshakeError};

/// RFC 1928 constants.
const VER: u8 = 0x05;
const METHOD_NONE: u8 = 0x00;
const METHOD_USERPASS: u8 = 0x02;
const METHOD_NO_ACCEPTABLE: u8 = 0xFF;
const ATYP_IPV4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_IPV6: u8 = 0x04;

/// SOCKS5 `CONNECT` through a parent (RFC 1928), with RFC 1929 username/password when
/// credentials are configured. On success the stream is a tunnel to the destination.
///
/// # Errors
/// [`HandshakeError`]: `Broken` when the connection fails or the parent does not speak
/// SOCKS5; `Refused` for an authentication failure or a non-zero `REP`.
pub(crate) async fn socks5_connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    dest: Dest<'_>,
    port: u16,
    creds: Option<&Credentials>,
    parent: &str,
) -> Result<(), HandshakeError> {
    method(stream, creds, parent).await?;
    let req = request(dest, port)?;
    stream.write_all(&req).await.map_err(broken(parent))?;
    reply(stream, dest, port, parent).await
}

/// A connection failure at `parent`.
fn broken(parent: &str) -> impl Fn(std::io::Error) -> HandshakeError + '_ {
    move |e| HandshakeError::Broken(format!("{parent}: {e}"))
}

/// Reads exactly `buf.len()` bytes of `parent`'s answer.
async fn read<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
    parent: &str,
) -> Result<(), HandshakeError> {
    stream.read_exact(buf).await.map_err(broken(parent))?;
    Ok(())
}

/// The greeting, the parent's method choice, and RFC 1929 authentication when it asks
/// for it (only with credentials: without, a demand for them is a refusal).
async fn method<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    creds: Option<&Credentials>,
    parent: &str,
) -> Result<(), HandshakeError> {
    let greeting: &[u8] = if creds.is_some() {
        &[VER, 2, METHOD_NONE, METHOD_USERPASS]
    } else {
        &[VER, 1, METHOD_NONE]
    };
    stream.write_all(greeting).await.map_err(broken(parent))?;
    let mut choice = [0u8; 2];
    read(stream, &mut choice, parent).await?;
    if choice[0] != VER {
        return Err(HandshakeError::Broken(format!(
            "{parent}: not a SOCKS5 server"
        )));
    }
    let refused = |detail: String| {
        Err(HandshakeError::Refused {
            detail,
            next_addr: false,
        })
    };
    match (choice[1], creds) {
        (METHOD_NONE, _) => Ok(()),
        (METHOD_USERPASS, Some(c)) => {
            let (user, pass) = (c.user().as_bytes(), c.password().as_bytes());
            // Lengths are 1..=255 / 0..=255, checked when the credentials were built.
            let (Ok(ulen), Ok(plen)) = (u8::try_from(user.len()), u8::try_from(pass.len())) else {
                return Err(HandshakeError::Broken(
                    "credentials too long for SOCKS5".into(),
                ));
            };
            let mut msg = vec![0x01, ulen];
            msg.extend_from_slice(user);
            msg.push(plen);
            msg.extend_from_slice(pass);
            stream.write_all(&msg).await.map_err(broken(parent))?;
            let mut status = [0u8; 2];
            read(stream, &mut status, parent).await?;
            if status[1] == 0 {
                return Ok(());
            }
            refused(format!(
                "parent {parent} rejected the configured SOCKS5 credentials (RFC 1929 status {})",
                status[1]
            ))
        }
        (METHOD_USERPASS | METHOD_NO_ACCEPTABLE, None) => refused(format!(
            "parent {parent} requires SOCKS5 authentication: configure the parent's credentials"
        )),
        (m, _) => refused(format!(
            "parent {parent} chose no acceptable SOCKS5 method ({m:#04x})"
        )),
    }
}

/// The `CONNECT` request for `dest:port`: an address as itself, a name as a domain name.
fn request(dest: Dest<'_>, port: u16) -> Result<Vec<u8>, HandshakeError> {
    let mut req = vec![VER, 0x01, 0x00];
    let ip = match dest {
        Dest::Ip(ip) => Some(ip),
        Dest::Host(h) => h.ip(),
    };
    match (ip, dest) {
        (Some(IpAddr::V4(v4)), _) => {
            req.push(ATYP_IPV4);
            req.extend_from_slice(&v4.octets());
        }
        (Some(IpAddr::V6(v6)), _) => {
            req.push(ATYP_IPV6);
            req.extend_from_slice(&v6.octets());
        }
        (None, Dest::Host(h)) => {
            let Some(name) = h.name() else {
                return Err(HandshakeError::Broken("empty host".into()));
            };
            // A canonical name is at most 253 bytes.
            let Ok(len) = u8::try_from(name.len()) else {
                return Err(HandshakeError::Broken("name too long for SOCKS5".into()));
            };
            req.push(ATYP_DOMAIN);
            req.push(len);
            req.extend_from_slice(name.as_bytes());
        }
        (None, Dest::Ip(_)) => return Err(HandshakeError::Broken("empty host".into())),
    }
    req.extend_from_slice(&port.to_be_bytes());
    Ok(req)
}

/// The reply: its bound address read and dropped; a non-zero `REP` is a refusal (one
/// about reaching the destination, 3..=6, lets the next vetted address be tried).
async fn reply<S: AsyncRead + Unpin>(
    stream: &mut S,
    dest: Dest<'_>,
    port: u16,
    parent: &str,
) -> Result<(), HandshakeError> {
    let mut head = [0u8; 4];
    read(stream, &mut head, parent).await?;
    if head[0] != VER {
        return Err(HandshakeError::Broken(format!(
            "{parent}: not a SOCKS5 reply"
        )));
    }
    let rest = match head[3] {
        ATYP_IPV4 => 4 + 2,
        ATYP_IPV6 => 16 + 2,
        ATYP_DOMAIN => {
            let mut len = [0u8; 1];
            read(stream, &mut len, parent).await?;
            usize::from(len[0]) + 2
        }
        _ => {
            return Err(HandshakeError::Broken(format!(
                "{parent}: bad SOCKS5 reply address type"
            )));
        }
    };
    let mut bound = vec![0u8; rest];
    read(stream, &mut bound, parent).await?;
    if head[1] == 0 {
        return Ok(());
    }
    let what = match head[1] {
        0x01 => "general failure",
        0x02 => "not allowed by ruleset",
        0x03 => "network unreachable",
        0x04 => "host unreachable",
        0x05 => "connection refused",
        0x06 => "TTL expired",
        0x07 => "command not supported",
        0x08 => "address type not supported",
        _ => "unknown error",
    };
    Err(HandshakeError::Refused {
        detail: format!(
            "parent {parent} answered SOCKS5 REP {:#04x} ({what}) for {}",
            head[1],
            dest.authority(port)
        ),
        next_addr: matches!(head[1], 0x03..=0x06),
    })
}
