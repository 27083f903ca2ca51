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
                    Err(why) => Hello::Malformed(why),
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
fn parse_client_hello(message: &[u8]) -> Result<(Vec<String>, bool), String> {
    let body = message.get(HANDSHAKE_HEADER..).unwrap_or_default();
    let Ok((rest, hello)) = parse_tls_handshake_client_hello(body) else {
        return Err("ClientHello body truncated or malformed (RFC 8446 section 4.1.2)".into());
    };
    // tls-parser leaves an extension block whose length disagrees with the message
    // unparsed; nothing may follow the extensions.
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes in the ClientHello not covered by its extensions block (RFC 8446 \
             section 4.1.2)",
            rest.len()
        ));
    }
    parse_extensions(hello.ext.unwrap_or_default())
}

/// Walks the extension block (RFC 8446 section 4.2) strictly: every extension must be
/// complete and no type may repeat. Only `server_name` is parsed; ECH is noted.
///
/// Not `tls_parser::parse_tls_client_hello_extensions`: it stops silently at the first
/// extension it cannot parse (so a `server_name` behind it would go unseen) and fails on
/// contents it does not know, which are none of our business.
fn parse_extensions(mut block: &[u8]) -> Result<(Vec<String>, bool), String> {
    let mut seen = HashSet::new();
    let mut server_names = Vec::new();
    let mut ech = false;
    while !block.is_empty() {
        let (ext_type, data, rest) = split_extension(block)
            .ok_or("truncated extension in the ClientHello (RFC 8446 section 4.2)")?;
        if !seen.insert(ext_type) {
            return Err(format!(
                "extension {ext_type:#06x} appears twice (RFC 8446 section 4.2)"
            ));
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
fn parse_server_names(data: &[u8]) -> Result<Vec<String>, String> {
    let ([l0, l1], list) = data
        .split_first_chunk::<2>()
        .map(|(l, list)| (*l, list))
        .ok_or("server_name extension too short (RFC 6066 section 3)")?;
    if usize::from(u16::from_be_bytes([l0, l1])) != list.len() {
        return Err(
            "server_name list length does not match the extension (RFC 6066 section 3)".into(),
        );
    }
    if list.is_empty() {
        return Err("empty server_name list (RFC 6066 section 3)".into());
    }
    let mut names = Vec::new();
    let mut rest = list;
    while !rest.is_empty() {
        let Ok((after, (name_type, name))) = parse_tls_extension_sni_hostname(rest) else {
            return Err("truncated ServerName entry (RFC 6066 section 3)".into());
        };
        if name_type != SNIType::HostName {
            return Err(format!(
                "server name of unknown type {} (RFC 6066 section 3 defines only host_name(0))",
                name_type.0
            ));
        }
        if name.is_empty() {
            return Err("empty host_name (RFC 6066 section 3)".into());
        }
        let Ok(name) = std::str::from_utf8(name) else {
            return Err("host_name is not UTF-8 (RFC 6066 section 3: ASCII)".into());
        };
        if !name.is_ascii() {
            return Err("host_name is not ASCII (RFC 6066 section 3)".into());
        }
        names.push(name.to_owned());
        rest = after;
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- builder: real ClientHello bytes -------------------------------------------

    fn u16b(n: usize) -> [u8; 2] {
        u16::try_from(n).unwrap().to_be_bytes()
    }

    /// One extension: type || u16 length || data.
    fn ext(ext_type: u16, data: &[u8]) -> Vec<u8> {
        let mut v = ext_type.to_be_bytes().to_vec();
        v.extend(u16b(data.len()));
        v.extend(data);
        v
    }

    /// server_name extension with `host_name` entries `names`.
    fn sni(names: &[&[u8]]) -> Vec<u8> {
        sni_typed(&names.iter().map(|n| (0, *n)).collect::<Vec<_>>())
    }

    /// server_name extension with explicit (name_type, name) entries.
    fn sni_typed(entries: &[(u8, &[u8])]) -> Vec<u8> {
        let mut list = Vec::new();
        for (t, n) in entries {
            list.push(*t);
            list.extend(u16b(n.len()));
            list.extend(*n);
        }
        let mut data = u16b(list.len()).to_vec();
        data.extend(list);
        ext(EXT_SERVER_NAME, &data)
    }

    /// supported_versions (TLS 1.3, 1.2), supported_groups, signature_algorithms and a
    /// key_share with a 1200-byte fake post-quantum share plus an X25519 share.
    fn common_exts() -> Vec<u8> {
        let mut v = ext(0x002b, &[4, 0x03, 0x04, 0x03, 0x03]);
        v.extend(ext(0x000a, &[0, 6, 0x11, 0xec, 0x00, 0x1d, 0x00, 0x17]));
        v.extend(ext(0x000d, &[0, 4, 0x04, 0x03, 0x08, 0x04]));
        let mut shares = Vec::new();
        shares.extend([0x11, 0xec]);
        shares.extend(u16b(1200));
        shares.extend((0..1200).map(|i| (i * 7 % 251) as u8));
        shares.extend([0x00, 0x1d]);
        shares.extend(u16b(32));
        shares.extend([0x42; 32]);
        let mut data = u16b(shares.len()).to_vec();
        data.extend(shares);
        v.extend(ext(0x0033, &data));
        v
    }

    /// ClientHello body: version, random, session id, cipher suites, compression,
    /// extensions (the raw extension bytes `exts`).
    fn body(exts: &[u8]) -> Vec<u8> {
        let mut b = vec![0x03, 0x03];
        b.extend([0x5a; 32]);
        b.push(32);
        b.extend([0xa5; 32]);
        b.extend([0, 6, 0x13, 0x01, 0x13, 0x02, 0x13, 0x03]);
        b.extend([1, 0]);
        b.extend(u16b(exts.len()));
        b.extend(exts);
        b
    }

    /// Handshake message: type || u24 length || body.
    fn handshake(msg_type: u8, body: &[u8]) -> Vec<u8> {
        let len = u32::try_from(body.len()).unwrap().to_be_bytes();
        let mut m = vec![msg_type, len[1], len[2], len[3]];
        m.extend(body);
        m
    }

    /// A ClientHello message with `sni` (already an extension, or empty) and optionally ECH.
    fn hello(sni_ext: &[u8], ech: bool) -> Vec<u8> {
        let mut exts = sni_ext.to_vec();
        exts.extend(common_exts());
        if ech {
            // ECHClientHello (outer): type, cipher suite, config id, enc, payload.
            let ech = [0, 0, 1, 0, 1, 7, 0, 4, 1, 2, 3, 4, 0, 3, 9, 9, 9];
            exts.extend(ext(EXT_ECH, &ech));
        }
        handshake(CLIENT_HELLO, &body(&exts))
    }

    /// One record of content type `t`.
    fn record(t: u8, payload: &[u8]) -> Vec<u8> {
        let mut r = vec![t, 0x03, 0x01];
        r.extend(u16b(payload.len()));
        r.extend(payload);
        r
    }

    /// `msg` as handshake records with fragment sizes `sizes`, the remainder in one last
    /// record (if any).
    fn records(msg: &[u8], sizes: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = msg;
        for &n in sizes {
            let (a, b) = rest.split_at(n);
            out.extend(record(HANDSHAKE, a));
            rest = b;
        }
        if !rest.is_empty() {
            out.extend(record(HANDSHAKE, rest));
        }
        out
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn is_malformed(h: &Hello) -> bool {
        matches!(h, Hello::Malformed(_))
    }

    // ---- complete hellos ------------------------------------------------------------

    #[test]
    fn complete_hellos() {
        const EX: &[&str] = &["example.test"];
        let one = hello(&sni(&[b"example.test"]), false);
        let two = hello(&sni(&[b"example.test", b"other.test"]), false);
        let ech = hello(&sni(&[b"example.test"]), true);
        let raw = hello(&sni(&[b"Example.TEST."]), false);
        let ones = vec![1; one.len()];
        let cases: Vec<(&str, Vec<u8>, &[&str], bool)> = vec![
            ("single record", records(&one, &[]), EX, false),
            ("no sni", records(&hello(&[], false), &[]), &[], false),
            ("two records", records(&one, &[700]), EX, false),
            (
                "three records, 1-byte first",
                records(&one, &[1, 600]),
                EX,
                false,
            ),
            (
                "three records, 1-byte middle",
                records(&one, &[100, 1]),
                EX,
                false,
            ),
            (
                "handshake header split 2+2",
                records(&one, &[2, 2]),
                EX,
                false,
            ),
            ("1-byte records throughout", records(&one, &ones), EX, false),
            (
                "two host names",
                records(&two, &[]),
                &["example.test", "other.test"],
                false,
            ),
            ("ech", records(&ech, &[]), EX, true),
            ("ech, split", records(&ech, &[50, 1000]), EX, true),
            (
                "ech without sni",
                records(&hello(&[], true), &[]),
                &[],
                true,
            ),
            (
                "raw case and dot kept",
                records(&raw, &[]),
                &["Example.TEST."],
                false,
            ),
        ];
        for (what, bytes, want, want_ech) in cases {
            assert_eq!(
                inspect(&bytes),
                Hello::Complete {
                    server_names: names(want),
                    ech: want_ech
                },
                "{what}"
            );
        }
    }

    #[test]
    fn hello_is_over_one_kib() {
        // The fake post-quantum share makes the hello realistic in size.
        assert!(hello(&sni(&[b"example.test"]), false).len() > 1300);
    }

    #[test]
    fn no_extensions_at_all() {
        let mut b = body(&[]);
        b.truncate(b.len() - 2); // drop the (empty) extensions length: a TLS 1.0-style hello
        let bytes = records(&handshake(CLIENT_HELLO, &b), &[]);
        assert_eq!(
            inspect(&bytes),
            Hello::Complete {
                server_names: vec![],
                ech: false
            }
        );
    }

    #[test]
    fn bytes_after_the_hello_are_ignored() {
        let mut bytes = records(&hello(&sni(&[b"example.test"]), false), &[300]);
        bytes.extend(record(20, &[1])); // middlebox-compat change_cipher_spec
        bytes.extend(record(23, &[0xee; 40])); // early data
        assert_eq!(
            inspect(&bytes),
            Hello::Complete {
                server_names: names(&["example.test"]),
                ech: false
            }
        );
    }

    #[test]
    fn large_hello_over_max_size_records() {
        // ~40 KiB of padding (extension 21): three full 2^14 records, still under MAX_HELLO.
        let mut exts = sni(&[b"big.test"]);
        exts.extend(ext(21, &vec![0; 40_000]));
        let msg = handshake(CLIENT_HELLO, &body(&exts));
        let bytes = records(&msg, &[MAX_FRAGMENT, MAX_FRAGMENT]);
        assert_eq!(
            inspect(&bytes),
            Hello::Complete {
                server_names: names(&["big.test"]),
                ech: false
            }
        );
    }

    // ---- prefixes ---------------------------------------------------------------------

    #[test]
    fn every_proper_prefix_needs_more() {
        let one = sni(&[b"example.test"]);
        let msg = hello(&one, true);
        for (what, bytes) in [
            ("single", records(&msg, &[])),
            ("two", records(&msg, &[700])),
            ("three with 1-byte", records(&msg, &[3, 1, 500])),
            ("no sni", records(&hello(&[], false), &[])),
        ] {
            for n in 0..bytes.len() {
                assert_eq!(inspect(&bytes[..n]), Hello::NeedMore, "{what}: prefix {n}");
            }
            assert!(
                matches!(inspect(&bytes), Hello::Complete { .. }),
                "{what}: complete"
            );
        }
    }

    // ---- not TLS -----------------------------------------------------------------------

    #[test]
    fn not_tls() {
        let cases: [&[u8]; 6] = [
            b"GET / HTTP/1.1\r\nHost: example.test\r\n\r\n",
            b"G",
            b"SSH-2.0-OpenSSH_9.6\r\n",
            b"\x00\x00\x00\x00",
            b"\x13\x03\x01",
            b"\x19\x03\x01\x00\x05",
        ];
        for bytes in cases {
            assert_eq!(inspect(bytes), Hello::NotTls, "{bytes:?}");
        }
    }

    // ---- malformed -----------------------------------------------------------------------

    /// Asserts that `bytes` are `Malformed` with a reason containing `why`.
    fn assert_malformed(bytes: &[u8], why: &str) {
        let got = inspect(bytes);
        assert!(
            matches!(&got, Hello::Malformed(m) if m.contains(why)),
            "want Malformed(..{why}..), got {got:?}"
        );
    }

    #[test]
    fn malformed_records() {
        let mut trailing = hello(&sni(&[b"example.test"]), false);
        trailing.push(0); // one byte past the ClientHello, in the same record
        let garbage_body = handshake(CLIENT_HELLO, &[0xff; 64]);
        let server_hello = handshake(2, &body(&[]));
        // (reason fragment, bytes)
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("SSLv2", vec![0x80, 0x2e, 0x01, 0x03, 0x01]),
            ("change_cipher_spec (content type 20)", record(20, &[1])),
            ("alert (content type 21)", record(21, &[2, 40])),
            ("application_data (content type 23)", record(23, b"hello")),
            ("application_data (content type 23)", vec![23]),
            ("heartbeat (content type 24)", record(24, &[1, 0, 0])),
            ("type 255, not ClientHello", record(HANDSHAKE, &[0xff; 64])),
            ("type 2, not ClientHello", records(&server_hello, &[])),
            ("body truncated or malformed", records(&garbage_body, &[])),
            ("version major 2", vec![22, 2, 0, 0, 5]),
            ("version major 71", vec![22, 0x47]),
            ("empty handshake record", vec![22, 3, 1, 0, 0]),
            ("over 2^14", vec![22, 3, 1, 0x40, 0x01]),
            ("record boundary", records(&trailing, &[])),
        ];
        for (why, bytes) in cases {
            assert_malformed(&bytes, why);
        }
    }

    #[test]
    fn malformed_extensions() {
        let mut dup_sni = sni(&[b"a.test"]);
        dup_sni.extend(sni(&[b"b.test"]));
        let mut dup_other = ext(0x002b, &[2, 3, 4]);
        dup_other.extend(ext(0x002b, &[2, 3, 4]));
        let mut sni_trailing = sni(&[b"a.test"]);
        sni_trailing[3] += 1; // extension data one byte longer ...
        sni_trailing.push(0); // ... with a byte after the list
        let unknown_type = sni_typed(&[(0, b"a.test"), (7, b"x")]);
        // (reason fragment, extension block of an otherwise valid ClientHello)
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("truncated extension", vec![0, 0x2b, 0, 9, 1]),
            ("truncated extension", vec![0, 0x2b, 0]),
            ("0x0000 appears twice", dup_sni),
            ("0x002b appears twice", dup_other),
            ("not ASCII", sni(&["bücher.test".as_bytes()])),
            ("not UTF-8", sni(&[b"a\xff.test"])),
            ("empty host_name", sni(&[b""])),
            ("empty server_name list", ext(0, &[0, 0])),
            ("too short", ext(0, &[])),
            ("unknown type 7", unknown_type),
            ("list length does not match", ext(0, &[0, 9, 0, 0, 1, b'a'])),
            ("list length does not match", sni_trailing),
            ("truncated ServerName", ext(0, &[0, 4, 0, 0, 9, b'a'])),
        ];
        for (why, exts) in cases {
            assert_malformed(&records(&handshake(CLIENT_HELLO, &body(&exts)), &[]), why);
        }

        // An extensions length one more than the bytes that follow.
        let exts = sni(&[b"example.test"]);
        let mut b = body(&exts);
        let at = b.len() - exts.len() - 1;
        b[at] += 1;
        let bytes = records(&handshake(CLIENT_HELLO, &b), &[]);
        assert_malformed(&bytes, "not covered by its extensions");
    }

    #[test]
    fn interleaved_records() {
        let msg = hello(&sni(&[b"example.test"]), false);
        for t in [20u8, 21, 23, 24, 0x47] {
            let mut bytes = record(HANDSHAKE, &msg[..100]);
            bytes.extend(record(t, &[1]));
            bytes.extend(record(HANDSHAKE, &msg[100..]));
            let got = inspect(&bytes);
            assert!(is_malformed(&got), "type {t}: {got:?}");
            // Decided as soon as the interloper's type byte is in.
            assert!(is_malformed(&inspect(&bytes[..106])), "type {t}");
            assert_eq!(inspect(&bytes[..105]), Hello::NeedMore, "type {t}");
        }
    }

    // ---- size limit ----------------------------------------------------------------------

    #[test]
    fn claimed_70_kib_handshake() {
        let bytes = [22, 3, 1, 0x40, 0x00, 1, 0x01, 0x18, 0x00, 3, 3];
        for n in 0..9 {
            assert_eq!(inspect(&bytes[..n]), Hello::NeedMore, "prefix {n}");
        }
        for n in 9..=bytes.len() {
            assert!(is_malformed(&inspect(&bytes[..n])), "prefix {n}");
        }
        // Same claim with the handshake header spread over 1-byte records.
        let spread = records(&[1, 0x01, 0x18, 0x00], &[1, 1, 1]);
        assert_eq!(inspect(&spread[..spread.len() - 1]), Hello::NeedMore);
        assert!(is_malformed(&inspect(&spread)));
    }

    #[test]
    fn never_unbounded_need_more() {
        // A ClientHello that claims 60000 bytes (allowed) but arrives in 1-byte records:
        // six bytes of input per byte of message never fit in MAX_HELLO.
        let mut msg = handshake(CLIENT_HELLO, &vec![0; 60_000]);
        msg.truncate(MAX_HELLO / 6 + 10);
        let bytes = records(&msg, &vec![1; msg.len()]);
        assert!(bytes.len() > MAX_HELLO);
        for n in (0..MAX_HELLO).step_by(4099).chain([MAX_HELLO - 1]) {
            assert_eq!(inspect(&bytes[..n]), Hello::NeedMore, "prefix {n}");
        }
        for n in [MAX_HELLO, MAX_HELLO + 1, bytes.len()] {
            assert!(is_malformed(&inspect(&bytes[..n])), "prefix {n}");
        }

        // A record that would end past MAX_HELLO is refused at its header.
        let mut msg = handshake(CLIENT_HELLO, &vec![0; 60_000]);
        msg.truncate(4 + 8500);
        let mut bytes = records(&msg, &vec![1; msg.len()]);
        let at = bytes.len();
        bytes.extend([22, 3, 1, 0x40, 0x00]);
        assert!(at + 5 + MAX_FRAGMENT > MAX_HELLO);
        assert_eq!(inspect(&bytes[..at + 4]), Hello::NeedMore);
        assert!(is_malformed(&inspect(&bytes)));

        // Any input of MAX_HELLO bytes or more gets a final answer.
        let junk = vec![22u8; MAX_HELLO];
        assert!(is_malformed(&inspect(&junk)));
    }

    // ---- real client ----------------------------------------------------------------------

    /// First flight of `openssl s_client -connect 127.0.0.1:PORT -servername
    /// example.test` (OpenSSL 3.0.19), captured with a plain TCP listener.
    const OPENSSL_HELLO: &str = "\
        16030101390100013503036e086c9e0128cf7ac07b460a06b7c77ae115122e6891a5437ad964938b\
        5f383a201c6d8a5607a9389ec7ee85091c1e17764d6d948408e3aa9e284c768c23fe3434003e1302\
        13031301c02cc030009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039\
        c009c0130033009d009c003d003c0035002f00ff010000ae00000011000f00000c6578616d706c65\
        2e74657374000b000403000102000a00160014001d0017001e0019001801000101010201030104\
        002300000016000000170000000d002a0028040305030603080708080809080a080b080408050806\
        040105010601030303010302040205020602002b0009080304030303020301002d00020101003300\
        260024001d00201f9343eab5bdf9a19f7db12d9c3491f1e60d9fd71e4f186f42ef3b387e952b68";

    #[test]
    fn openssl_capture() {
        let bytes = hex::decode(OPENSSL_HELLO).unwrap();
        let want = Hello::Complete {
            server_names: names(&["example.test"]),
            ech: false,
        };
        assert_eq!(inspect(&bytes), want);
        for n in 0..bytes.len() {
            assert_eq!(inspect(&bytes[..n]), Hello::NeedMore, "prefix {n}");
        }
        // The same handshake message re-fragmented into 7-byte records.
        let msg = &bytes[RECORD_HEADER..];
        let refragmented = records(msg, &vec![7; msg.len() / 7]);
        assert_eq!(inspect(&refragmented), want);
    }
}
