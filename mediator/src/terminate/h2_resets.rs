//! The HTTP/2 requests of a terminated tunnel that the HTTP/2 layer (the `h2` crate under
//! hyper) refuses itself, before any service sees them, so that nothing could answer or
//! log them; [`ResetWatch`] reads the frame headers the mediator's own HTTP/2 server
//! writes to the client (RFC 9113 section 4.1) and reports each, so that the tunnel logs
//! a decision line for it:
//! - `RST_STREAM` (type `0x3`) with `PROTOCOL_ERROR` (`0x1`, IANA "HTTP/2 Error Code"
//!   registry): a malformed request (an `:authority` or `:path` that is not URI syntax, a
//!   missing `:method`; RFC 9113 section 8.1.1). hyper itself never resets a server stream
//!   with that code (it uses `INTERNAL_ERROR`, `CANCEL`, `NO_ERROR`).
//! - `RST_STREAM` with `REFUSED_STREAM` (`0x7`): the connection had as many streams open
//!   as the mediator's `SETTINGS_MAX_CONCURRENT_STREAMS`; the client may retry it.
//! - A `HEADERS` frame with `END_STREAM` whose header block holds one field and that opens
//!   the answers on a stream above every stream answered so far: the `431` the HTTP/2
//!   layer sends for a header list over `SETTINGS_MAX_HEADER_LIST_SIZE` (RFC 9113 section
//!   6.5.2; `[limits] request_head_bytes`). Every answer that comes from the mediator's
//!   service carries at least `:status` and `date` (hyper adds it); trailers come on a
//!   stream already answered. Only the block's structure is walked (RFC 7541 section 6:
//!   how many fields), never its strings or the dynamic table.
//!
//! It reads only what the mediator writes, never the client's bytes, changes no byte, and
//! holds at most one frame header (9 bytes), 8 payload bytes and one stream identifier of
//! state.

use std::io::{self, IoSlice};

use crate::tap::Tap;

/// `HEADERS` (RFC 9113 section 6.2).
const HEADERS: u8 = 0x1;
/// `CONTINUATION` (RFC 9113 section 6.10).
const CONTINUATION: u8 = 0x9;
/// `RST_STREAM` (RFC 9113 section 6.4).
const RST_STREAM: u8 = 0x3;
/// `HEADERS` flags (RFC 9113 section 6.2): `END_STREAM`, `END_HEADERS`, `PADDED`,
/// `PRIORITY`.
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// `PROTOCOL_ERROR` and `REFUSED_STREAM` (RFC 9113 section 7).
const PROTOCOL_ERROR: u32 = 0x1;
const REFUSED_STREAM: u32 = 0x7;
/// A frame header: length (24 bits), type, flags, stream identifier (31 bits).
const HEAD: usize = 9;
/// The payload bytes kept of a frame that may be a refusal: an `RST_STREAM`'s 4, or a
/// one-field header block (`:status 431`: at most 1 + 1 + 3 bytes; a table size update
/// may come first).
const KEPT: usize = 8;

/// A request the HTTP/2 layer refused on its own, by stream identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Reset with `PROTOCOL_ERROR`: a malformed request.
    Malformed(u32),
    /// Reset with `REFUSED_STREAM`: over the concurrent streams limit.
    Refused(u32),
    /// Answered `431`: its header list is over the limit.
    TooLarge(u32),
}

/// What is told of each refused request.
pub(crate) type OnReset = Box<dyn FnMut(Refusal) + Send>;

/// The watch on an I/O stream's written HTTP/2 frames (the stream `Tapped` with it) for
/// the HTTP/2 layer's own refusals; `on_reset` is called with each. Without a callback
/// (an HTTP/1.1 connection) the stream only passes bytes through.
pub(crate) struct ResetWatch {
    watch: Option<(FrameScan, OnReset)>,
}

impl ResetWatch {
    /// A watch when `on_reset` is given.
    pub(crate) fn new(on_reset: Option<OnReset>) -> Self {
        Self {
            watch: on_reset.map(|f| (FrameScan::default(), f)),
        }
    }

    fn saw(&mut self, bufs: &[IoSlice<'_>], mut written: usize) {
        let Some((scan, on_reset)) = &mut self.watch else {
            return;
        };
        for buf in bufs {
            if written == 0 {
                break;
            }
            let n = written.min(buf.len());
            scan.feed(&buf[..n], on_reset);
            written -= n;
        }
    }
}

impl Tap for ResetWatch {
    fn write(&mut self, bufs: &[IoSlice<'_>], polled: io::Result<usize>) -> io::Result<usize> {
        if let Ok(n) = polled {
            self.saw(bufs, n);
        }
        polled
    }
}

/// Where the watch is in the written frame sequence (the server's side of an HTTP/2
/// connection starts with a frame: its preface is a `SETTINGS` frame, RFC 9113 section
/// 3.4).
#[derive(Debug, Default)]
struct FrameScan {
    head: [u8; HEAD],
    /// Bytes of `head` seen; `HEAD` while in a payload.
    head_len: usize,
    /// Payload bytes of the current frame still to come.
    left: usize,
    /// The current frame may be a refusal: its first payload bytes, and how many.
    kept: Option<([u8; KEPT], usize)>,
    /// The highest stream a `HEADERS` frame was written on.
    answered: u32,
}

impl FrameScan {
    /// Reads `bytes`, the next written ones, calling `on_reset` for each refusal.
    fn feed(&mut self, mut bytes: &[u8], on_reset: &mut dyn FnMut(Refusal)) {
        while !bytes.is_empty() {
            if self.head_len < HEAD {
                let n = (HEAD - self.head_len).min(bytes.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
                self.head_len += n;
                bytes = &bytes[n..];
                if self.head_len == HEAD {
                    self.left = self.len();
                    self.kept = self.may_refuse().then_some(([0; KEPT], 0));
                    if self.left == 0 {
                        self.finish(on_reset);
                    }
                }
                continue;
            }
            let n = self.left.min(bytes.len());
            if let Some((kept, have)) = &mut self.kept {
                let take = n.min(KEPT - *have);
                kept[*have..*have + take].copy_from_slice(&bytes[..take]);
                *have += take;
            }
            self.left -= n;
            bytes = &bytes[n..];
            if self.left == 0 {
                self.finish(on_reset);
            }
        }
    }

    fn len(&self) -> usize {
        let h = &self.head;
        usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2])
    }

    fn stream(&self) -> u32 {
        let h = &self.head;
        u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff
    }

    /// Whether the frame whose header was read may be a refusal (its payload is kept).
    fn may_refuse(&self) -> bool {
        let (kind, flags, len) = (self.head[3], self.head[4], self.len());
        match kind {
            RST_STREAM => len == 4,
            HEADERS => {
                flags & (END_STREAM | END_HEADERS) == END_STREAM | END_HEADERS
                    && flags & (PADDED | PRIORITY) == 0
                    && len <= KEPT
                    && self.stream() > self.answered
            }
            _ => false,
        }
    }

    /// The frame ended: reports it if it is a refusal.
    fn finish(&mut self, on_reset: &mut dyn FnMut(Refusal)) {
        let (kind, stream) = (self.head[3], self.stream());
        if let Some((kept, have)) = self.kept.take() {
            let payload = &kept[..have];
            match kind {
                RST_STREAM => match u32::from_be_bytes([kept[0], kept[1], kept[2], kept[3]]) {
                    PROTOCOL_ERROR => on_reset(Refusal::Malformed(stream)),
                    REFUSED_STREAM => on_reset(Refusal::Refused(stream)),
                    _ => {}
                },
                _ if fields(payload) == Some(1) => on_reset(Refusal::TooLarge(stream)),
                _ => {}
            }
        }
        if kind == HEADERS || kind == CONTINUATION {
            self.answered = self.answered.max(stream);
        }
        self.head_len = 0;
    }
}

/// How many header fields an HPACK header block holds (RFC 7541 section 6: indexed
/// fields, literals with or without indexing or never indexed; a dynamic table size
/// update is no field), or `None` when it is not a whole block. The strings are skipped,
/// never decoded.
fn fields(mut block: &[u8]) -> Option<usize> {
    let mut n = 0;
    while let Some(&first) = block.first() {
        block = if first & 0x80 != 0 {
            n += 1;
            int(block, 7)?.1
        } else if first & 0xc0 == 0x40 {
            n += 1;
            literal(block, 6)?
        } else if first & 0xe0 == 0x20 {
            int(block, 5)?.1
        } else {
            n += 1;
            literal(block, 4)?
        };
    }
    Some(n)
}

/// A literal field (RFC 7541 section 6.2) whose name index has a `prefix`-bit prefix: the
/// rest of the block after it.
fn literal(block: &[u8], prefix: u32) -> Option<&[u8]> {
    let (name, rest) = int(block, prefix)?;
    let rest = if name == 0 { string(rest)? } else { rest };
    string(rest)
}

/// A string literal (RFC 7541 section 5.2): the rest of the block after it.
fn string(block: &[u8]) -> Option<&[u8]> {
    let (len, rest) = int(block, 7)?;
    rest.get(len..)
}

/// An integer with a `prefix`-bit prefix (RFC 7541 section 5.1), and the rest of the
/// block; `None` when cut short or over 2^28 (no block kept here is that long).
fn int(block: &[u8], prefix: u32) -> Option<(usize, &[u8])> {
    let max = (1usize << prefix) - 1;
    let (&first, mut rest) = block.split_first()?;
    let mut value = usize::from(first) & max;
    if value < max {
        return Some((value, rest));
    }
    for shift in (0..28).step_by(7) {
        let (&b, more) = rest.split_first()?;
        rest = more;
        value += (usize::from(b) & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some((value, rest));
        }
    }
    None
}

/// The refusals in `bytes`, fed to one scan in writes of `step` bytes (at least one):
/// what the fuzz target compares.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn resets_in(bytes: &[u8], step: usize) -> Vec<Refusal> {
    let mut scan = FrameScan::default();
    let mut found = Vec::new();
    for chunk in bytes.chunks(step.max(1)) {
        scan.feed(chunk, &mut |r| found.push(r));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn protocol_error_resets_are_found_however_the_writes_are_split() {
        let mut bytes = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]); // SETTINGS
        bytes.extend(frame(0x4, 0x1, 0, &[])); // SETTINGS ack, empty
        bytes.extend(frame(0x1, 0x4, 1, &[0x88])); // HEADERS :status 200
        bytes.extend(frame(0x0, 0x1, 1, &[0x03; 300])); // DATA, whose bytes look like resets
        bytes.extend(frame(RST_STREAM, 0, 3, &1u32.to_be_bytes())); // PROTOCOL_ERROR
        bytes.extend(frame(RST_STREAM, 0, 5, &8u32.to_be_bytes())); // CANCEL
        bytes.extend(frame(RST_STREAM, 0, 7, &1u32.to_be_bytes()));
        bytes.extend(frame(0x7, 0, 0, &[0, 0, 0, 7, 0, 0, 0, 1])); // GOAWAY, not a reset
        for step in [1, 2, 3, 4, 5, 9, 13, 64, bytes.len()] {
            let mut scan = FrameScan::default();
            let mut found = Vec::new();
            for chunk in bytes.chunks(step) {
                scan.feed(chunk, &mut |s| found.push(s));
            }
            assert_eq!(
                found,
                [Refusal::Malformed(3), Refusal::Malformed(7)],
                "writes of {step} bytes"
            );
        }
    }

    #[test]
    fn refused_streams_and_the_layers_own_431_are_found() {
        let end = END_STREAM | END_HEADERS;
        let mut bytes = frame(HEADERS, END_HEADERS, 1, &[0x88, 0xbe]); // 200, date
        bytes.extend(frame(HEADERS, end, 1, &[0x40, 0x01, b'x', 0x01, b'y'])); // trailers
        bytes.extend(frame(HEADERS, end, 3, &[0x88, 0xbe])); // 200, date: the service's
        // `:status 431`, literal with incremental indexing (name 8), Huffman value.
        bytes.extend(frame(HEADERS, end, 5, &[0x48, 0x82, 0x64, 0x02]));
        bytes.extend(frame(RST_STREAM, 0, 7, &REFUSED_STREAM.to_be_bytes()));
        // The same 431 again, now from the dynamic table, after a table size update.
        bytes.extend(frame(HEADERS, end, 9, &[0x3f, 0x01, 0xbe]));
        bytes.extend(frame(HEADERS, end, 11, &[0x48, 0x82])); // cut short: no block
        for step in [1, 2, 5, 9, bytes.len()] {
            assert_eq!(
                resets_in(&bytes, step),
                [
                    Refusal::TooLarge(5),
                    Refusal::Refused(7),
                    Refusal::TooLarge(9)
                ],
                "writes of {step} bytes"
            );
        }
    }

    #[test]
    fn hpack_blocks_are_counted_not_decoded() {
        assert_eq!(fields(&[0x88]), Some(1));
        assert_eq!(fields(&[0x88, 0xbe, 0x0f, 0x10, 0x01, b'a']), Some(3));
        assert_eq!(fields(&[0x00, 0x01, b'n', 0x01, b'v']), Some(1));
        assert_eq!(fields(&[0x20]), Some(0));
        assert_eq!(fields(&[0x00, 0x05, b'n']), None);
        assert_eq!(fields(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff]), None);
    }

    #[test]
    fn vectored_writes_count_only_what_was_written() {
        let reset = frame(RST_STREAM, 0, 9, &1u32.to_be_bytes());
        let mut found = Vec::new();
        let mut watch = ResetWatch::new(Some(Box::new(|_| {}) as OnReset));
        let (a, b) = reset.split_at(6);
        // The first write took 10 bytes of the two buffers; the rest follows.
        watch.saw(&[IoSlice::new(a), IoSlice::new(b)], 10);
        let Some((scan, _)) = &mut watch.watch else {
            panic!("watched");
        };
        scan.feed(&reset[10..], &mut |s| found.push(s));
        assert_eq!(found, [Refusal::Malformed(9)]);
    }
}
