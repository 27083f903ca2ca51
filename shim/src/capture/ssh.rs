//! What a captured SSH client hears when its flow to port 22 is denied (design section
//! 18): the server's identification line (RFC 4253 section 4.2) and one unencrypted
//! binary packet (section 6) holding `SSH_MSG_DISCONNECT` (section 11.1) with reason
//! code 1, `SSH_DISCONNECT_HOST_NOT_ALLOWED_TO_CONNECT`, and the denial's text. OpenSSH
//! prints it ("Received disconnect from ... port 22:1: TEXT"; it shows at most 400
//! bytes, the limit of an operator reason) instead of "Connection reset by peer".

/// The identification line sent first (`SSH-protoversion-softwareversion CR LF`).
const IDENTIFICATION: &[u8] = b"SSH-2.0-egress-mediator\r\n";

/// `SSH_MSG_DISCONNECT` (RFC 4250 section 4.1.2).
const SSH_MSG_DISCONNECT: u8 = 1;

/// `SSH_DISCONNECT_HOST_NOT_ALLOWED_TO_CONNECT` (RFC 4250 section 4.2.2).
const HOST_NOT_ALLOWED_TO_CONNECT: u32 = 1;

/// Most bytes of text carried (OpenSSH prints 400).
const MAX_TEXT: usize = 400;

/// The bytes answering a denied SSH client: the identification line, then the
/// disconnect packet carrying `text` (cut at [`MAX_TEXT`] bytes on a character boundary).
pub(crate) fn disconnect(text: &str) -> Vec<u8> {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = &text.as_bytes()[..end];
    let mut payload = vec![SSH_MSG_DISCONNECT];
    payload.extend_from_slice(&HOST_NOT_ALLOWED_TO_CONNECT.to_be_bytes());
    put_string(&mut payload, text);
    put_string(&mut payload, b""); // language tag
    // packet_length (4) + padding_length (1) + payload + padding: a multiple of 8 (the
    // block size before any cipher), with at least 4 bytes of padding.
    let mut padding = 8 - (5 + payload.len()) % 8;
    if padding < 4 {
        padding += 8;
    }
    let packet_length = 1 + payload.len() + padding;
    let mut out = IDENTIFICATION.to_vec();
    // At most 1 + 4 + 4 + 400 + 4 + 11 bytes: fits a u32.
    out.extend_from_slice(
        &u32::try_from(packet_length)
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    // At most 11.
    out.push(u8::try_from(padding).unwrap_or(u8::MAX));
    out.extend_from_slice(&payload);
    out.extend(std::iter::repeat_n(0u8, padding));
    out
}

/// An SSH `string`: its length as a big-endian `uint32`, then its bytes (RFC 4251 section 5).
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    // Callers pass at most MAX_TEXT bytes.
    out.extend_from_slice(&u32::try_from(s.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packet_is_framed_as_rfc_4253_says() {
        let b = disconnect("paste sites are off limits");
        let rest = b.strip_prefix(IDENTIFICATION).unwrap();
        let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        assert_eq!(rest.len(), 4 + len, "nothing after the packet");
        assert_eq!((4 + len) % 8, 0);
        let padding = rest[4] as usize;
        assert!((4..=11).contains(&padding));
        let payload = &rest[5..4 + len - padding];
        assert_eq!(payload[0], SSH_MSG_DISCONNECT);
        assert_eq!(&payload[1..5], &1u32.to_be_bytes());
        let n = u32::from_be_bytes(payload[5..9].try_into().unwrap()) as usize;
        assert_eq!(&payload[9..9 + n], b"paste sites are off limits");
        assert_eq!(&payload[9 + n..], &[0, 0, 0, 0], "empty language tag");
    }

    #[test]
    fn long_text_is_cut_at_400_bytes_on_a_character() {
        let b = disconnect(&"\u{e9}".repeat(300));
        let rest = b.strip_prefix(IDENTIFICATION).unwrap();
        let n = u32::from_be_bytes(rest[10..14].try_into().unwrap()) as usize;
        assert_eq!(n, 400);
        assert!(std::str::from_utf8(&rest[14..14 + n]).is_ok());
    }
}
