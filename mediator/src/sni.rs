//! Reads the server name (SNI, RFC 6066 section 3) out of the first bytes a client sends
//! through a CONNECT tunnel, so that a tunnel to port 443 can be held to the host it was
//! granted for: the caller compares the ClientHello's `server_name` with the CONNECT host.
//!
//! [`inspect`] is fed every byte read from the client so far and answers one [`Hello`]:
//! more bytes needed, not TLS at all, a complete ClientHello (its host names and whether it
//! offers Encrypted Client Hello), or malformed TLS. The ClientHello is reassembled from as
//! many handshake records as the client split it into (RFC 8446 section 5.1: post-quantum
//! key shares push some ClientHellos past one record, and an attacker can fragment on
//! purpose), bounded by [`MAX_HELLO`] bytes of input.
//!
//! What this module must never do:
//! - I/O of any kind: it is pure; reading, timeouts and forwarding belong to the caller.
//! - Change, consume or buffer the bytes: the caller forwards exactly what it read.
//! - Decrypt, terminate or answer TLS.
//! - Interpret a name: names come back raw (no lowercasing, IDNA or trailing-dot handling);
//!   the comparison with the CONNECT host is the caller's decision.
//! - Ask for unbounded input: it never answers [`Hello::NeedMore`] once
//!   `buf.len() >= MAX_HELLO`.
//! - Panic, whatever the bytes.

use std::collections::HashSet;

use tls_parser::{
    SNIType, parse_tls_extension_sni_hostname, parse_tls_handshake_client_hello,
    parse_tls_record_header,
};

/// The most bytes of tunnel input [`inspect`] will look at: a ClientHello (record headers
/// included) that does not fit is [`Hello::Malformed`]. Real ClientHellos, even with
/// post-quantum key shares, are a few KiB.
pub(crate) const MAX_HELLO: usize = 64 * 1024;

/// TLS content type `handshake` (RFC 8446 section 5.1).
const HANDSHAKE: u8 = 22;
/// First byte of an SSLv2-compatible ClientHello (RFC 5246 appendix E.2): two-byte
/// header with the top bit set.
const SSL2_FIRST: u8 = 0x80;
/// Handshake message type `client_hello` (RFC 8446 section 4).
const CLIENT_HELLO: u8 = 1;
/// TLSPlaintext.length limit, 2^14 (RFC 8446 section 5.1).
const MAX_FRAGMENT: usize = 1 << 14;
/// TLSPlaintext header: type (1), legacy_record_version (2), length (2).
const RECORD_HEADER: usize = 5;
/// Handshake header: msg_type (1), length (3).
const HANDSHAKE_HEADER: usize = 4;
/// Extension type `server_name` (RFC 6066 section 3).
const EXT_SERVER_NAME: u16 = 0x0000;
/// Extension type `encrypted_client_hello` (draft-ietf-tls-esni).
const EXT_ECH: u16 = 0xfe0d;

/// Result of inspecting the first bytes of a tunnel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Hello {
    /// More bytes are needed: what was read so far is a proper prefix of a ClientHello.
    /// Never returned once the input is [`MAX_HELLO`] bytes or longer, so a caller that
    /// buffers at most [`MAX_HELLO`] bytes always gets a final answer.
    NeedMore,
    /// The bytes are not TLS: the first byte is neither a TLS content type (20..=24,
    /// RFC 8446 section 5.1) nor the SSLv2 marker 0x80: an opaque, non-TLS tunnel. The
    /// first byte alone decides.
    NotTls,
    /// A complete ClientHello (RFC 8446 section 4.1.2).
    Complete {
        /// The `host_name` entries of the `server_name` extension (RFC 6066 section 3), as
        /// sent (ASCII, not lowercased, in order); empty when there is no such extension.
        /// RFC 6066 allows one name; more than one is returned as is for the caller to
        /// refuse.
        server_names: Vec<String>,
        /// Whether the ClientHello carries an `encrypted_client_hello` extension (type
        /// 0xfe0d, draft-ietf-tls-esni). With real ECH, `server_names` is the outer,
        /// public name and the name actually wanted is encrypted. But clients also send
        /// "GREASE" ECH (draft-ietf-tls-esni section 6.2; Chrome does when it has no ECH
        /// config for the server), indistinguishable by design, in which case
        /// `server_names` is the real name: `true` alone does not mean the name is hidden.
        ech: bool,
    },
    /// TLS (the first byte is a TLS content type or 0x80), but not a readable ClientHello.
    /// The string says why, for the log. Covers: an SSLv2-compatible hello; a first record
    /// that is not a handshake (change_cipher_spec, alert, application_data, heartbeat);
    /// a non-handshake record interleaved with the ClientHello's fragments; a record
    /// header that is invalid (major version not 3, length 0 or over 2^14); a first
    /// handshake message that is not a ClientHello; a ClientHello not ending on a record
    /// boundary (RFC 8446 section 5.1); more than [`MAX_HELLO`] bytes of input needed; a
    /// malformed ClientHello body or extension block; a duplicated extension (RFC 8446
    /// section 4.2, which covers a duplicated `server_name`); a malformed `server_name`
    /// extension (empty list, unknown name type, empty, non-UTF-8 or non-ASCII name).
    Malformed(String),
}

/// Why a complete ClientHello message cannot be read (its text goes into
/// [`Hello::Malformed`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum HelloError {
    #[error("ClientHello body truncated or malformed (RFC 8446 section 4.1.2)")]
    Body,
    #[error(
        "{0} bytes in the ClientHello not covered by its extensions block (RFC 8446 section 4.1.2)"
    )]
    Trailing(usize),
    #[error("truncated extension in the ClientHello (RFC 8446 section 4.2)")]
    TruncatedExtension,
    #[error("extension {0:#06x} appears twice (RFC 8446 section 4.2)")]
    Repeated(u16),
    #[error("server_name extension too short (RFC 6066 section 3)")]
    SniTooShort,
    #[error("server_name list length does not match the extension (RFC 6066 section 3)")]
    SniLength,
    #[error("empty server_name list (RFC 6066 section 3)")]
    SniEmptyList,
    #[error("truncated ServerName entry (RFC 6066 section 3)")]
    SniTruncated,
    #[error("server name of unknown type {0} (RFC 6066 section 3 defines only host_name(0))")]
    SniType(u8),
    #[error("empty host_name (RFC 6066 section 3)")]
    SniEmptyName,
    #[error("host_name is not UTF-8 (RFC 6066 section 3: ASCII)")]
    SniNotUtf8,
    #[error("host_name is not ASCII (RFC 6066 section 3)")]
    SniNotAscii,
}

/// Inspects `buf`, all bytes read from the client so far (from the first), and says
/// whether they begin with a complete TLS ClientHello and which server names it carries.
///
/// Pure, and linear in the number of records (the ClientHello is copied only once
/// complete): call it again with the longer buffer after each read while it answers
/// [`Hello::NeedMore`]. Bytes after the ClientHello (early data, a change_cipher_spec) are
/// ignored. Each record must be a handshake record of at most 2^14 bytes with
/// `legacy_record_version` major byte 3 (RFC 8446 section 5.1); the handshake messages'
/// concatenation must start with a ClientHello (type 1, 24-bit length) that ends exactly
/// at a record boundary.
#[expect(
    clippy::too_many_lines,
    reason = "the TLS record walk (RFC 8446 section 5.1) in one loop; ceiling 115 lines"
)]
pub(crate) fn inspect(buf: &[u8]) -> Hello {
    match buf.first() {
        None => return Hello::NeedMore,
        Some(&HANDSHAKE) => {}
        Some(&SSL2_FIRST) => {
            return malformed(
                "SSLv2-compatible ClientHello (first byte 0x80, RFC 5246 appendix E.2): \
                 it has no extensions, hence no SNI",
            );
        }
        Some(&t @ 20..=24) => {
            return malformed(format!(
                "first record is {} (content type {t}), not a handshake",
                content_type_name(t)
            ));
        }
        Some(_) => return Hello::NotTls,
    }

    // Fragments of the handshake stream, in order, as far as they are present in `buf`.
    let mut fragments: Vec<&[u8]> = Vec::new();
    // Handshake bytes present so far (sum of the fragment lengths).
    let mut have = 0usize;
    // Length of the ClientHello message (header included), once its header is complete.
    let mut total: Option<usize> = None;
    let mut pos = 0usize;
    loop {
        let rest = buf.get(pos..).unwrap_or_default();
        let Some(&content_type) = rest.first() else {
            return need_more(buf);
        };
        if content_type != HANDSHAKE {
            return malformed(format!(
                "{} record (content type {content_type}) at byte {pos}, before the \
                 ClientHello is complete",
                content_type_name(content_type)
            ));
        }
        if let Some(&major) = rest.get(1)
            && major != 3
        {
            return malformed(format!(
                "record at byte {pos} has version major {major}, not 3 (RFC 8446 section 5.1)"
            ));
        }
        if rest.len() < RECORD_HEADER {
            return need_more(buf);
        }
        let len = match parse_tls_record_header(rest) {
            Ok((_, header)) => usize::from(header.len),
            Err(_) => return malformed(format!("unreadable record header at byte {pos}")),
        };
        if len == 0 {
            return malformed(format!(
                "empty handshake record at byte {pos} (RFC 8446 section 5.1)"
            ));
        }
        if len > MAX_FRAGMENT {
            return malformed(format!(
                "record of {len} bytes at byte {pos}, over 2^14 (RFC 8446 section 5.1)"
            ));
        }
        let end = pos + RECORD_HEADER + len;
        if end > MAX_HELLO {
            return too_long();
        }
        let fragment = rest
            .get(RECORD_HEADER..rest.len().min(RECORD_HEADER + len))
            .unwrap_or_default();
        let before = have;
        have += fragment.len();
        fragments.push(fragment);

        if total.is_none() && have >= HANDSHAKE_HEADER {
            let mut header = fragments.iter().flat_map(|f| f.iter().copied());
            let (Some(msg_type), Some(l0), Some(l1), Some(l2)) =
                (header.next(), header.next(), header.next(), header.next())
            else {
                return malformed("internal: handshake header not gathered");
            };
            if msg_type != CLIENT_HELLO {
                return malformed(format!(
                    "first handshake message is type {msg_type}, not ClientHello (1)"
                ));
            }
            let body = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
            let message = HANDSHAKE_HEADER + body;
            // At least one record header precedes the message.
            if RECORD_HEADER + message > MAX_HELLO {
                return malformed(format!(
                    "ClientHello of {message} bytes, over the {MAX_HELLO}-byte limit"
                ));
            }
            total = Some(message);
        }
        if let Some(total) = total {
            if before + len > total {
                return malformed(
                    "record carries bytes past the end of the ClientHello (RFC 8446 \
                     section 5.1: a ClientHello ends on a record boundary)",
                );
            }
            if fragment.len() == len && have == total {
                return match parse_client_hello(&fragments.concat()) {
                    Ok((server_names, ech)) => Hello::Complete { server_names, ech },
                    Err(why) => Hello::Malformed(why.to_string()),
                };
            }
        }
        if fragment.len() < len {
            return need_more(buf);
        }
        pos = end;
    }
}

/// `NeedMore`, unless `buf` already holds [`MAX_HELLO`] bytes.
fn need_more(buf: &[u8]) -> Hello {
    if buf.len() >= MAX_HELLO {
        too_long()
    } else {
        Hello::NeedMore
    }
}

fn too_long() -> Hello {
    malformed(format!(
        "ClientHello not complete within {MAX_HELLO} bytes of input"
    ))
}

fn malformed(why: impl Into<String>) -> Hello {
    Hello::Malformed(why.into())
}

/// Name of a TLS content type (RFC 8446 section 5.1, RFC 6520 for heartbeat).
fn content_type_name(t: u8) -> &'static str {
    match t {
        20 => "change_cipher_spec",
        21 => "alert",
        22 => "handshake",
        23 => "application_data",
        24 => "heartbeat",
        _ => "non-TLS",
    }
}

/// Parses a complete ClientHello message (handshake header included): its server names
/// and whether it offers ECH.
fn parse_client_hello(message: &[u8]) -> Result<(Vec<String>, bool), HelloError> {
    let body = message.get(HANDSHAKE_HEADER..).unwrap_or_default();
    let Ok((rest, hello)) = parse_tls_handshake_client_hello(body) else {
        return Err(HelloError::Body);
    };
    // tls-parser leaves an extension block whose length disagrees with the message
    // unparsed; nothing may follow the extensions.
    if !rest.is_empty() {
        return Err(HelloError::Trailing(rest.len()));
    }
    parse_extensions(hello.ext.unwrap_or_default())
}

/// Walks the extension block (RFC 8446 section 4.2) strictly: every extension must be
/// complete and no type may repeat. Only `server_name` is parsed; ECH is noted.
///
/// Not `tls_parser::parse_tls_client_hello_extensions`: it stops silently at the first
/// extension it cannot parse (so a `server_name` behind it would go unseen) and fails on
/// contents it does not know, which are none of our business.
fn parse_extensions(mut block: &[u8]) -> Result<(Vec<String>, bool), HelloError> {
    let mut seen = HashSet::new();
    let mut server_names = Vec::new();
    let mut ech = false;
    while !block.is_empty() {
        let (ext_type, data, rest) =
            split_extension(block).ok_or(HelloError::TruncatedExtension)?;
        if !seen.insert(ext_type) {
            return Err(HelloError::Repeated(ext_type));
        }
        match ext_type {
            EXT_SERVER_NAME => server_names = parse_server_names(data)?,
            EXT_ECH => ech = true,
            _ => {}
        }
        block = rest;
    }
    Ok((server_names, ech))
}

/// Splits `extension_type (2) || extension_data<0..2^16-1>` off the front of `block`.
fn split_extension(block: &[u8]) -> Option<(u16, &[u8], &[u8])> {
    let (&[t0, t1, l0, l1], rest) = block.split_first_chunk::<4>()?;
    let len = usize::from(u16::from_be_bytes([l0, l1]));
    let data = rest.get(..len)?;
    let rest = rest.get(len..)?;
    Some((u16::from_be_bytes([t0, t1]), data, rest))
}

/// Parses `server_name` extension data, a `ServerNameList` (RFC 6066 section 3):
/// `ServerName server_name_list<1..2^16-1>`, each `name_type (1) || HostName<1..2^16-1>`.
/// Only `host_name(0)` is defined; an entry of another type cannot be delimited by a
/// reader that does not know it, so it is an error, as are an empty list, trailing bytes,
/// an empty name and a name that is not ASCII.
fn parse_server_names(data: &[u8]) -> Result<Vec<String>, HelloError> {
    let ([l0, l1], list) = data
        .split_first_chunk::<2>()
        .map(|(l, list)| (*l, list))
        .ok_or(HelloError::SniTooShort)?;
    if usize::from(u16::from_be_bytes([l0, l1])) != list.len() {
        return Err(HelloError::SniLength);
    }
    if list.is_empty() {
        return Err(HelloError::SniEmptyList);
    }
    let mut names = Vec::new();
    let mut rest = list;
    while !rest.is_empty() {
        let Ok((after, (name_type, name))) = parse_tls_extension_sni_hostname(rest) else {
            return Err(HelloError::SniTruncated);
        };
        if name_type != SNIType::HostName {
            return Err(HelloError::SniType(name_type.0));
        }
        if name.is_empty() {
            return Err(HelloError::SniEmptyName);
        }
        let Ok(name) = std::str::from_utf8(name) else {
            return Err(HelloError::SniNotUtf8);
        };
        if !name.is_ascii() {
            return Err(HelloError::SniNotAscii);
        }
        names.push(name.to_owned());
        rest = after;
    }
    Ok(names)
}

#[cfg(test)]
#[path = "sni_tests.rs"]
mod tests;
