//! Bounded waits. Nothing in the suite sleeps and hopes: every wait is for a condition,
//! checked every [`POLL_INTERVAL`] until a deadline, and a wait that times out says what
//! it waited for and what it saw instead.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// How often a wait checks its condition again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Calls `probe` every [`POLL_INTERVAL`] until it returns `Some`, and returns that value.
/// `probe` runs at least once, and once more at the deadline.
///
/// # Errors
/// An error of `probe`, at once; or no `Some` within `timeout`: the message is
/// `describe()`, called then (so it can show the state at the deadline).
pub async fn wait_for<T>(
    timeout: Duration,
    mut probe: impl FnMut() -> Result<Option<T>>,
    describe: impl FnOnce() -> String,
) -> Result<T> {
    retry_for(timeout, async || probe(), describe).await
}

/// Waits until `cond` holds.
///
/// # Errors
/// `cond` still false after `timeout`; the message names `what`.
pub async fn wait_until(
    timeout: Duration,
    what: &str,
    mut cond: impl FnMut() -> bool,
) -> Result<()> {
    wait_for(
        timeout,
        || Ok(cond().then_some(())),
        || format!("{what}: not so"),
    )
    .await
}

/// Repeats the async `attempt` every [`POLL_INTERVAL`] until it returns `Some` (for a
/// condition that takes a request to observe, e.g. "the refreshed PAC is in use").
///
/// # Errors
/// An error of `attempt`, at once; or no `Some` within `timeout`: the message is
/// `describe()`, called then.
pub async fn retry_for<T>(
    timeout: Duration,
    mut attempt: impl AsyncFnMut() -> Result<Option<T>>,
    describe: impl FnOnce() -> String,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let late = Instant::now() >= deadline;
        if let Some(value) = attempt().await? {
            return Ok(value);
        }
        if late {
            bail!("{} (waited {timeout:?})", describe());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
