//! A PROXY protocol v2 header in front of a connection on an authority's Unix socket: how
//! the shim (outside the sandbox) hands the mediator the invocation labels of what it
//! carries (design section 20, `crate::labels`) before the client's bytes.
//!
//! The header is HAProxy's binary PROXY protocol, version 2
//! (<https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt>), parsed with the `ppp`
//! crate. Its 12-byte signature (`\r\n\r\n\0\r\nQUIT\n`) cannot start an HTTP request or a
//! SOCKS5 greeting, so a connection without it is read as before. The command should be
//! `LOCAL` with family `UNSPEC` (the addresses, if any, are ignored: who is asking is the
//! socket and `SO_PEERCRED`). Application TLVs in the custom range (section 2.2.8):
//!
//! | type | value |
//! |---|---|
//! | `0xE0` | the invocation id (at most once) |
//! | `0xE1` | one tag, `KEY=VALUE` (once per tag) |
//!
//! Any other type of the custom range `0xE0..=0xEF` is refused (it could only be a newer
//! shim's, and a label never goes unread); the registered types (`0x01..=0x30`, such as
//! NOOP padding) are ignored. Bounded: a header over [`MAX_HEADER`] bytes is refused
//! before it is read, and the labels' own bounds apply (`Labels`).
//!
//! Only the first bytes of a connection may be a header, and only on an authority's Unix
//! socket; the shared TCP listener never reads one.

use bytes::{Buf, BytesMut};
use ppp::v2::{AddressFamily, Header, PROTOCOL_PREFIX, ParseError, TypeLengthValues};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::labels::{Labels, MAX_HEADER, TLV_INVOCATION, TLV_TAG};

/// What a buffer's first bytes are.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// Not a PROXY v2 header: the client's own bytes.
    Absent,
    /// The start of a header: read more.
    Incomplete,
    /// A whole header of `len` bytes, with its labels.
    Header {
        /// Its length, to be taken off the buffer.
        len: usize,
        /// What its TLVs said.
        labels: Labels,
    },
    /// A header that is refused: why.
    Refused(String),
}

/// Whether `buf` may start with a header (its first bytes are the signature's).
pub(crate) fn may_start(buf: &[u8]) -> bool {
    let n = buf.len().min(PROTOCOL_PREFIX.len());
    n > 0 && buf[..n] == PROTOCOL_PREFIX[..n]
}

/// Parses the header at the start of `buf`.
pub(crate) fn parse(buf: &[u8]) -> Parsed {
    if !may_start(buf) {
        return Parsed::Absent;
    }
    // Bytes 14..16: the length of what follows the 16-byte fixed part.
    if let Some(len) = buf.get(14..16) {
        let total = 16 + usize::from(u16::from_be_bytes([len[0], len[1]]));
        if total > MAX_HEADER {
            return Parsed::Refused(format!(
                "the PROXY protocol v2 header is {total} bytes; at most {MAX_HEADER} are taken"
            ));
        }
    }
    let header = match Header::try_from(buf) {
        Ok(h) => h,
        Err(ParseError::Incomplete(_) | ParseError::Partial(..)) => return Parsed::Incomplete,
        Err(e) => return Parsed::Refused(format!("PROXY protocol v2 header: {e}")),
    };
    let mut labels = Labels::default();
    // With family UNSPEC there are no addresses and what follows the fixed part is TLVs
    // (the specification, section 2.2); `ppp` counts it all as address bytes, so its TLVs
    // are read from there.
    let tlvs = if header.address_family() == AddressFamily::Unspecified {
        TypeLengthValues::from(header.address_bytes())
    } else {
        header.tlvs()
    };
    for tlv in tlvs {
        let tlv = match tlv {
            Ok(t) => t,
            Err(e) => return Parsed::Refused(format!("PROXY protocol v2 header: {e}")),
        };
        let taken = match tlv.kind {
            TLV_INVOCATION => labels.set_invocation(&tlv.value),
            TLV_TAG => labels.add_tag(&tlv.value),
            0xE2..=0xEF => {
                return Parsed::Refused(format!(
                    "PROXY protocol v2 header: TLV type {:#04x} is not one the mediator reads ({TLV_INVOCATION:#04x} invocation, {TLV_TAG:#04x} tag)",
                    tlv.kind
                ));
            }
            _ => Ok(()),
        };
        if let Err(e) = taken {
            return Parsed::Refused(format!("PROXY protocol v2 header: {e}"));
        }
    }
    Parsed::Header {
        len: header.len(),
        labels,
    }
}

/// How reading a header ended, when it gave no labels.
#[derive(Debug)]
pub(crate) enum NotTaken {
    /// The client closed (or the deadline passed) before the header was whole.
    Closed,
    /// The header is refused: why.
    Refused(String),
}

/// Reads the header that `buf` (the connection's first bytes) starts with, by `deadline`,
/// takes it off `buf` and returns its labels. `Ok(None)`: `buf` holds no header.
///
/// # Errors
/// [`NotTaken`]: the client went away, or the header is refused.
pub(crate) async fn take<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    deadline: tokio::time::Instant,
) -> Result<Option<Labels>, NotTaken> {
    loop {
        match parse(buf) {
            Parsed::Absent => return Ok(None),
            Parsed::Refused(why) => return Err(NotTaken::Refused(why)),
            Parsed::Header { len, labels } => {
                buf.advance(len);
                return Ok(Some(labels));
            }
            Parsed::Incomplete => match tokio::time::timeout_at(deadline, io.read_buf(buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return Err(NotTaken::Closed),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ppp::v2::{Addresses, Builder, Command, Protocol, Version};

    /// A LOCAL header with `tlvs`, as a shim writes it.
    fn header(tlvs: &[(u8, &[u8])]) -> Vec<u8> {
        let mut b = Builder::with_addresses(
            Version::Two | Command::Local,
            Protocol::Unspecified,
            Addresses::Unspecified,
        );
        for (kind, value) in tlvs {
            b = b.write_tlv(*kind, value).unwrap();
        }
        b.build().unwrap()
    }

    #[test]
    fn the_header_a_shim_writes_reads_back() {
        let labels = Labels::new(Some("inv-1"), ["tool=call_9", "a=b"]).unwrap();
        let wire = labels.proxy_v2_header().unwrap();
        assert_eq!(
            parse(&wire),
            Parsed::Header {
                len: wire.len(),
                labels
            }
        );
    }

    #[test]
    fn a_header_gives_its_labels_and_leaves_the_client_bytes() {
        let mut wire = header(&[
            (TLV_INVOCATION, b"inv-7"),
            (TLV_TAG, b"tool=call_1"),
            (0x04, b"\0\0"), // NOOP: ignored
            (TLV_TAG, b"step=2"),
        ]);
        let len = wire.len();
        wire.extend_from_slice(b"CONNECT a.test:443 HTTP/1.1\r\n\r\n");
        let Parsed::Header { len: got, labels } = parse(&wire) else {
            panic!("{:?}", parse(&wire));
        };
        assert_eq!(got, len);
        assert_eq!(labels.invocation.as_deref(), Some("inv-7"));
        assert_eq!(labels.tags.len(), 2);
        assert_eq!(labels.tags["step"], "2");
        // Every cut of it is incomplete, never refused or taken for client bytes.
        for cut in 1..len {
            assert_eq!(parse(&wire[..cut]), Parsed::Incomplete, "{cut}");
        }
    }

    #[test]
    fn client_bytes_are_not_a_header() {
        for first in [
            &b"CONNECT a:1 HTTP/1.1\r\n"[..],
            b"\x05\x01\x00",
            b"\r\nGET",
        ] {
            assert_eq!(parse(first), Parsed::Absent, "{first:?}");
        }
    }

    #[test]
    fn bad_headers_are_refused() {
        let big = vec![b'v'; MAX_HEADER];
        let rows: Vec<(Vec<u8>, &str)> = vec![
            (header(&[(0xE5, b"x")]), "TLV type 0xe5"),
            (header(&[(TLV_TAG, b"no-equals")]), "KEY=VALUE"),
            (
                header(&[(TLV_INVOCATION, b"a"), (TLV_INVOCATION, b"b")]),
                "twice",
            ),
            (header(&[(TLV_TAG, &big)]), "at most 8192"),
        ];
        for (wire, expected) in rows {
            let Parsed::Refused(why) = parse(&wire) else {
                panic!("{expected}: {:?}", parse(&wire));
            };
            assert!(why.contains(expected), "{why}");
        }
        // Version 1 in a v2 signature.
        let mut v1 = header(&[]);
        v1[12] = 0x11;
        assert!(matches!(parse(&v1), Parsed::Refused(_)));
    }
}
