//! The version the binary reports, with the git revision it was built from (set by the
//! build script `build/revision.rs`). A leaf on the bottom floor: the metrics and the CLI
//! read it; it imports nothing of the crate.

/// `mediator --version`: the package version and the git revision it was built from
/// (`0.1.0 (git 4f20bb9c1a2b)`; `unknown` when built outside a checkout without
/// `GIT_REVISION` set). Set by the build script `build/revision.rs`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("GIT_REVISION_SHORT"),
    ")"
);

/// The full git revision (40 hex digits, or `unknown`) the binary was built from.
pub const GIT_REVISION: &str = env!("GIT_REVISION");

/// `mediator --version` (`-V` prints [`VERSION`] alone): the version, then a line
/// `revision <full git revision>`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("GIT_REVISION_SHORT"),
    ")\nrevision ",
    env!("GIT_REVISION")
);
