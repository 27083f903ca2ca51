//! Readiness notification to the service manager (`sd_notify(3)`, `Type=notify`): `READY=1`
//! once every listener is bound, `RELOADING=1` ... `READY=1` around a reload, `STOPPING=1`
//! when the shutdown begins, each with a `STATUS=` line for `systemctl status`.
//!
//! Without `NOTIFY_SOCKET` in the environment (not started by systemd, or by a unit of
//! another type) every call does nothing. A notification that cannot be sent is reported
//! on stderr and changes nothing else: the mediator serves either way.

use sd_notify::NotifyState;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify the service manager (NOTIFY_SOCKET): {e}");
    }
}

/// Every listener is bound and every configured authority is live: `READY=1`, with
/// `status` (the `ready` line) as `STATUS=`.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload (SIGHUP or a changed config file) begins: `RELOADING=1` with the monotonic
/// clock (systemd 253 and newer require it). Follow with [`reloaded`].
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(e) => tracing::warn!("cannot read the monotonic clock for RELOADING=1: {e}"),
    }
}

/// The reload is over (applied or refused): `READY=1` again, with `status` (what it did).
pub fn reloaded(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// The shutdown begins (listeners stop, live connections drain): `STOPPING=1`.
pub fn stopping() {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status("shutting down: draining live connections"),
    ]);
}
