//! Unit tests of `sni`.

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
