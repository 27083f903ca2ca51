//! A raw HTTP/2 client for requests no HTTP library will send (RFC 9113): it writes the
//! connection preface, an empty `SETTINGS` frame and one `HEADERS` frame whose header
//! block the test encodes itself (HPACK, RFC 7541: [`hpack_literal`] and the static-table
//! indices), then reads frames until the server answers or resets that stream.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The client connection preface (RFC 9113 section 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the server did with the request's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEnd {
    /// It answered with a `HEADERS` frame (the header block is not decoded).
    Answered,
    /// It reset the stream with this error code (`1`: `PROTOCOL_ERROR`).
    Reset(u32),
    /// It closed the connection with `GOAWAY` and this error code.
    GoAway(u32),
}

/// An HPACK literal header field without indexing whose name is static-table entry
/// `name_index` (`1`: `:authority`, `4`: `:path`), with a raw value shorter than 127 bytes
/// (RFC 7541 section 6.2.2).
///
/// # Panics
/// When `value` is 127 bytes or longer, or `name_index` is 15 or more (tests only).
pub fn hpack_literal(name_index: u8, value: &[u8]) -> Vec<u8> {
    assert!(name_index < 15 && value.len() < 127, "short literals only");
    let mut out = vec![name_index, u8::try_from(value.len()).unwrap_or(0)];
    out.extend_from_slice(value);
    out
}

/// An HPACK literal header field without indexing with a new name (RFC 7541 section
/// 6.2.2), raw (not Huffman) strings of any length (section 5.1 integers).
pub fn hpack_literal_new_name(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = vec![0x00];
    for s in [name, value] {
        hpack_int(s.len(), &mut out);
        out.extend_from_slice(s);
    }
    out
}

/// `n` as an HPACK integer with a 7-bit prefix and the Huffman bit clear (RFC 7541
/// section 5.1).
fn hpack_int(mut n: usize, out: &mut Vec<u8>) {
    if n < 127 {
        out.push(u8::try_from(n).unwrap_or(0));
        return;
    }
    out.push(127);
    n -= 127;
    while n >= 128 {
        out.push(u8::try_from(n % 128).unwrap_or(0) | 0x80);
        n /= 128;
    }
    out.push(u8::try_from(n).unwrap_or(0));
}

/// `:method GET`, `:scheme https`, `:path /` (static-table indices 2, 7 and 4), then
/// `:authority` set to `authority` as it is: a request header block for [`send_headers`].
pub fn get_with_authority(authority: &[u8]) -> Vec<u8> {
    let mut block = vec![0x82, 0x87, 0x84];
    block.extend(hpack_literal(1, authority));
    block
}

/// Sends `block` as stream 1 (`END_STREAM | END_HEADERS`, split into `CONTINUATION`
/// frames when longer than 16,384 bytes) on `io`, which speaks HTTP/2
/// already (TLS with ALPN `h2`), and reads frames until the server answers or resets that
/// stream or the connection, within 10 s.
///
/// # Errors
/// I/O failure, a closed connection, or no answer in time.
pub async fn send_headers<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    block: &[u8],
) -> Result<StreamEnd> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    // HEADERS, then CONTINUATION frames, each within the default SETTINGS_MAX_FRAME_SIZE
    // (16,384 bytes); END_HEADERS on the last.
    let pieces: Vec<&[u8]> = block.chunks(16_384).collect();
    let last = pieces.len().saturating_sub(1);
    for (i, piece) in pieces.iter().enumerate() {
        let (kind, end_stream) = if i == 0 { (0x1, 0x1) } else { (0x9, 0) };
        let end_headers = if i == last { 0x4 } else { 0 };
        out.extend(frame(kind, end_stream | end_headers, 1, piece));
    }
    io.write_all(&out).await?;
    io.flush().await?;
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let mut head = [0u8; 9];
            io.read_exact(&mut head)
                .await
                .context("reading a frame header")?;
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            io.read_exact(&mut payload)
                .await
                .context("reading a frame")?;
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let code = |at: usize| {
                payload
                    .get(at..at + 4)
                    .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            };
            match (head[3], stream) {
                (0x1, 1) => return Ok(StreamEnd::Answered),
                (0x3, 1) => return Ok(StreamEnd::Reset(code(0))),
                (0x7, _) => return Ok(StreamEnd::GoAway(code(4))),
                // SETTINGS: acknowledge it, as a client must (RFC 9113 section 6.5.3).
                (0x4, 0) if head[4] & 0x1 == 0 => {
                    io.write_all(&frame(0x4, 0x1, 0, &[])).await?;
                }
                _ => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| bail!("no answer on stream 1 within 10 s"))
}

/// Opens `count` streams (1, 3, 5...) on `io` with `block` as their header block
/// (`END_HEADERS`, never `END_STREAM`: each request's body stays open), then reads frames
/// until the server resets one with `REFUSED_STREAM` (code 7), within 10 s; returns that
/// stream.
///
/// # Errors
/// I/O failure, a closed connection, or no such reset in time.
pub async fn open_streams<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    count: u32,
    block: &[u8],
) -> Result<u32> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    for i in 0..count {
        out.extend(frame(0x1, 0x4, 2 * i + 1, block));
    }
    io.write_all(&out).await?;
    io.flush().await?;
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let mut head = [0u8; 9];
            io.read_exact(&mut head)
                .await
                .context("reading a frame header")?;
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            io.read_exact(&mut payload)
                .await
                .context("reading a frame")?;
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            match head[3] {
                0x3 if payload == 7u32.to_be_bytes() => return Ok(stream),
                0x7 => bail!("GOAWAY before any REFUSED_STREAM"),
                0x4 if head[4] & 0x1 == 0 => {
                    io.write_all(&frame(0x4, 0x1, 0, &[])).await?;
                }
                _ => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| bail!("no REFUSED_STREAM within 10 s"))
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(0).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}
