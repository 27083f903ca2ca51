//! A Java KeyStore (JKS) of trusted certificates, for the JVM's trust store: Java reads
//! no CA variable, and its `javax.net.ssl.trustStore` must be a key store (JKS or
//! PKCS #12), not a PEM bundle.
//!
//! The format is OpenJDK's `sun.security.provider.JavaKeyStore`, version 2: the magic
//! `0xFEEDFEED`, the version, the entry count, then per entry the tag 2 (a trusted
//! certificate), the alias (Java's `writeUTF`: a 16-bit length and the bytes), the creation
//! time in milliseconds, the certificate type `X.509`, the DER length and bytes; then a
//! SHA-1 digest over the UTF-16 bytes of the store password, the words
//! `Mighty Aphrodite` and everything before it. The password is [`PASSWORD`], Java's
//! default for its own `cacerts`; a JVM given no password reads the store without
//! checking the digest.

use sha1::{Digest, Sha1};

/// The store's password (Java's default for `cacerts`): it only keys the integrity digest.
pub(crate) const PASSWORD: &str = "changeit";

/// The JKS file holding `certificates` (DER) as trusted-certificate entries, created at
/// `millis` (milliseconds since the Unix epoch).
pub(crate) fn trust_store(certificates: &[Vec<u8>], millis: u64) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0xFEED_FEEDu32.to_be_bytes());
    out.extend_from_slice(&2u32.to_be_bytes());
    let count = u32::try_from(certificates.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_be_bytes());
    for (i, der) in certificates.iter().take(count as usize).enumerate() {
        out.extend_from_slice(&2u32.to_be_bytes());
        write_utf(&mut out, &format!("shim-{i}"));
        out.extend_from_slice(&millis.to_be_bytes());
        write_utf(&mut out, "X.509");
        // A certificate is far below 4 GiB; one that is not is left out as empty.
        let len = u32::try_from(der.len()).unwrap_or(0);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&der[..len as usize]);
    }
    let mut digest = Sha1::new();
    for unit in PASSWORD.encode_utf16() {
        digest.update(unit.to_be_bytes());
    }
    digest.update(b"Mighty Aphrodite");
    digest.update(&out);
    out.extend_from_slice(&digest.finalize());
    out
}

/// Java's `DataOutput.writeUTF` for ASCII text: a 16-bit length, then the bytes.
fn write_utf(out: &mut Vec<u8>, s: &str) {
    let len = u16::try_from(s.len()).unwrap_or(0);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&s.as_bytes()[..usize::from(len)]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_javas_and_the_digest_covers_it() {
        let store = trust_store(&[vec![0x30, 0x03, 1, 2, 3], vec![0x30, 0]], 7);
        let (body, digest) = store.split_at(store.len() - 20);
        assert_eq!(
            &body[..12],
            &[0xFE, 0xED, 0xFE, 0xED, 0, 0, 0, 2, 0, 0, 0, 2]
        );
        // Entry 1: tag, alias "shim-0", time 7, "X.509", length 5, the bytes.
        let mut entry = vec![0, 0, 0, 2, 0, 6];
        entry.extend_from_slice(b"shim-0");
        entry.extend_from_slice(&7u64.to_be_bytes());
        entry.extend_from_slice(&[0, 5]);
        entry.extend_from_slice(b"X.509");
        entry.extend_from_slice(&[0, 0, 0, 5, 0x30, 0x03, 1, 2, 3]);
        assert_eq!(&body[12..12 + entry.len()], &entry[..]);
        let mut d = Sha1::new();
        d.update(b"\0c\0h\0a\0n\0g\0e\0i\0t");
        d.update(b"Mighty Aphrodite");
        d.update(body);
        assert_eq!(digest, &d.finalize()[..]);
    }
}
