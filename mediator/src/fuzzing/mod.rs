//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz), one function per target,
//! each taking the fuzzer's bytes: the parsers that face untrusted input, called exactly
//! as the mediator calls them, plus the properties each must keep. A function returns
//! quietly for every input; a panic (a parser's, or a broken property's `assert!`) is a
//! finding.
//!
//! Compiled with the cargo feature `fuzzing` (the fuzz crate enables it) and in this
//! crate's own tests, which replay every file of `fuzz/corpus/<target>/` through the
//! same function, so that the checked-in corpus runs in `cargo test` on the stable
//! toolchain. Not a public API: nothing else may use it.
//!
//! Never does I/O beyond in-memory pipes (`tokio::io::duplex`): no socket, no file, no
//! name resolution.

// Harness code: a setup failure or a broken property must panic, that is how the fuzzer
// (and the replay test) sees it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod config;
mod heads;
mod names;
mod rules;
mod wire;

pub use config::{admin_json, ask_answer, config, kioslaverc};
pub use heads::{basic, h2_resets, http_head, negotiate_offer, upgrade};
pub use names::{host, pac_answer, pattern, suggest};
pub use rules::{placeholder, request_rule};
pub use wire::{client_hello, proxy_v2, socks5};

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::control::registry::RegistryMetrics;
use crate::control::registry::memory::Memory;
use crate::control::{Control, Setup};
use crate::shared::Shared;
use crate::testing;
use http::Uri;
use policy::{Target, parse_authority_form};

/// The name of the one authority of the fuzzing mediator (TCP credential
/// `agent-a:secret`; the SOCKS5 seeds carry it).
pub const AUTHORITY: &str = "agent-a";
/// The token of [`AUTHORITY`].
pub const TOKEN: &str = "secret";

/// One fuzz target: it takes the fuzzer's bytes and panics on a finding.
pub type FuzzTarget = fn(&[u8]);

/// The fuzz targets: every name has a function here, a cargo-fuzz binary in
/// `fuzz/fuzz_targets/<name>.rs` and a corpus in `fuzz/corpus/<name>/`.
pub const TARGETS: &[(&str, FuzzTarget)] = &[
    ("host", host),
    ("pattern", pattern),
    ("http_head", http_head),
    ("basic", basic),
    ("socks5", socks5),
    ("client_hello", client_hello),
    ("pac_answer", pac_answer),
    ("config", config),
    ("admin_json", admin_json),
    ("request_rule", request_rule),
    ("upgrade", upgrade),
    ("placeholder", placeholder),
    ("suggest", suggest),
    ("negotiate_offer", negotiate_offer),
    ("kioslaverc", kioslaverc),
    ("h2_resets", h2_resets),
    ("proxy_v2", proxy_v2),
    ("ask_answer", ask_answer),
];

/// `t`'s text parses back to `t`.
fn canonical_target(t: &Target) {
    assert_eq!(
        parse_authority_form(&t.to_string()).ok().as_ref(),
        Some(t),
        "{t}"
    );
}

/// The target of a CONNECT request whose request target parsed as `uri`, as the CONNECT
/// front-end takes it (authority-form only), or `None` when it is not authority-form.
fn connect_target(uri: &Uri) -> Option<Result<Target, policy::PolicyError>> {
    match uri.authority() {
        Some(a) if uri.scheme().is_none() && uri.path_and_query().is_none() => {
            Some(parse_authority_form(a.as_str()))
        }
        _ => None,
    }
}

/// The mediator the stateful targets run against, built once per process.
struct Fixture {
    runtime: tokio::runtime::Runtime,
    shared: Arc<Shared>,
    control: Arc<Control>,
    authority: Arc<policy::config::Authority>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Fixture {
    /// Drops the decision-log lines written so far (a fuzzing run writes millions).
    fn forget(&self) {
        self.shared.log.flush();
        self.lines.lock().unwrap().clear();
    }
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let lines = Arc::default();
        let shared = testing::shared(Arc::clone(&lines));
        let registry_metrics = RegistryMetrics::new(&shared.metrics).unwrap();
        let control = Control::new(
            Arc::clone(&shared),
            Setup {
                socket_dir: None,
                tcp: None,
                revoke_grace: Duration::ZERO,
                global_deny: Vec::new(),
                store: Arc::new(Memory::default()),
                registry_metrics,
                audit: crate::audit::Auditor::new(&shared.metrics).unwrap(),
            },
        );
        let table = format!(
            "[[authority]]\nname = \"{AUTHORITY}\"\ntoken_sha256 = \"{}\"\nallow = [\"example.com\"]\n",
            hex::encode(Sha256::digest(TOKEN.as_bytes()))
        );
        let authority = policy::config::parse(&table, "<fuzz>")
            .unwrap()
            .authorities
            .remove(0);
        let live = {
            let _enter = runtime.enter();
            control.add(authority).ok().unwrap()
        };
        Fixture {
            authority: Arc::clone(&live.authority),
            runtime,
            shared,
            control,
            lines,
        }
    })
}

#[cfg(test)]
mod tests {

    use super::*;

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
            5, 1, 0, 3, 11, b'e', b'x', b'a', b'm', b'p', b'l', b'e', b'.', b'c', b'o', b'm', 1,
            187,
        ];
        let run = |pass: &[u8]| {
            let mut sent = vec![0, 5, 1, 2, 1, 7];
            sent.extend_from_slice(AUTHORITY.as_bytes());
            sent.push(u8::try_from(pass.len()).unwrap());
            sent.extend_from_slice(pass);
            sent.extend_from_slice(&request);
            // On the TCP listener, as the channel byte 0 picks.
            wire::socks5_handshake(fixture(), false, &sent[1..])
                .1
                .unwrap()
        };
        assert_eq!(
            run(TOKEN.as_bytes()).map(|t| t.to_string()),
            Some("example.com:443".into())
        );
        assert_eq!(run(b"wrong!"), None);
    }
}
