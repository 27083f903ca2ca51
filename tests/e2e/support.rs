//! The one place this test binary names the binary under test: Cargo builds `mediator`
//! before this test target and passes its path at compile time
//! (`CARGO_BIN_EXE_mediator`); the support crate gets it from here, never by building or
//! searching.

use std::path::Path;

use anyhow::Result;
use e2e::{Fixture, MediatorBuilder, agent_a_spec};

/// The `mediator` binary Cargo built for this test target.
pub(crate) fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_mediator"))
}

/// A configuration builder for [`bin`].
pub(crate) fn mediator() -> MediatorBuilder {
    MediatorBuilder::new(bin())
}

/// The default fixture: `agent-a` (token `TOKEN_A`) may reach `origin.test` on any port,
/// with `allow_private = ["127.0.0.0/8"]` so the loopback origin passes.
pub(crate) async fn agent_a() -> Result<Fixture> {
    Fixture::start(mediator().authority(agent_a_spec())).await
}
