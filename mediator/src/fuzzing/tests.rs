//! Every checked-in corpus file replayed through its target, on stable, in `cargo test`.

use super::*;
use crate::conn::Ctx;
use crate::decision_log::Peer;
use crate::front::socks::handshake;

/// `fuzz/corpus/<target>/`, from this crate's directory.
fn corpus(target: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// Every checked-in corpus file, through its target's function: a regression of a
/// parser or of a property fails here, on stable, without the fuzzer.
#[test]
fn every_corpus_file_replays_cleanly() {
    let mut replayed = Vec::new();
    for (target, run) in TARGETS {
        let dir = corpus(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{} is empty", dir.display());
        for file in &files {
            let data = std::fs::read(file).unwrap();
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{target}: {} fails", file.display());
        }
        replayed.push((*target, files.len()));
    }
    assert_eq!(replayed.len(), TARGETS.len(), "{replayed:?}");
}

/// Each target has its cargo-fuzz binary, and nothing else is there.
#[test]
fn every_target_has_a_fuzz_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/fuzz_targets");
    let mut binaries: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    binaries.sort();
    let mut want: Vec<String> = TARGETS.iter().map(|(t, _)| format!("{t}.rs")).collect();
    want.sort();
    assert_eq!(binaries, want);
}

/// The SOCKS5 fixture reaches the request: the right credential gives a target, a
/// wrong one none (so the corpus exercises both sides of authentication).
#[test]
fn the_socks5_fixture_authenticates() {
    let request = [
        5, 1, 0, 3, 11, b'e', b'x', b'a', b'm', b'p', b'l', b'e', b'.', b'c', b'o', b'm', 1, 187,
    ];
    let run = |pass: &[u8]| {
        let mut sent = vec![0, 5, 1, 2, 1, 7];
        sent.extend_from_slice(AUTHORITY.as_bytes());
        sent.push(u8::try_from(pass.len()).unwrap());
        sent.extend_from_slice(pass);
        sent.extend_from_slice(&request);
        let fx = fixture();
        let mut ctx = Ctx::new(
            1,
            Peer::Embedded,
            None,
            fx.shared.limiter.admit(
                0,
                crate::limits::Door::Channel,
                &tokio_util::sync::CancellationToken::new(),
                || {},
            ),
        );
        fx.runtime.block_on(async {
            use tokio::io::AsyncWriteExt;
            let (mut client, mut server) = tokio::io::duplex(64 * 1024);
            client.write_all(&sent[1..]).await.unwrap();
            client.shutdown().await.unwrap();
            handshake(&mut server, &fx.shared, &mut ctx).await.unwrap()
        })
    };
    assert_eq!(
        run(TOKEN.as_bytes()).map(|t| t.to_string()),
        Some("example.com:443".into())
    );
    assert_eq!(run(b"wrong!"), None);
}
