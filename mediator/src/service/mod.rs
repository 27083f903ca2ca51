//! Running the mediator as a service (design section 16): what a service manager, a
//! container runtime or an operator needs beside the proxy itself. The version string with
//! its git revision, the `mediator health` probe (the image has no curl), readiness
//! notification to systemd, and the config-file watch (reload on change, for a
//! Kubernetes ConfigMap). None of it takes a decision or touches a connection.

pub mod health;
pub mod journal;
pub mod notify;
pub mod watch;

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
