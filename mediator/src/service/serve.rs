//! The binary's run as a service: start, say `ready`, then wait for a signal (SIGTERM,
//! SIGINT, SIGQUIT stop; SIGHUP reloads; SIGUSR1 reopens the decision log; SIGUSR2 is
//! ignored), a change of the config file (`--watch-config`), or a decision log that
//! cannot be written (which stops the mediator: no decision may go unrecorded); then
//! the graceful shutdown. The service manager hears of each step (`sd_notify`).

use std::path::{Path, PathBuf};

use policy::config::Config;
use tokio::signal::unix::{SignalKind, signal};

use super::{notify, watch};
use crate::audit::ReloadTrigger;
use crate::decision_log::{DecisionLog, Reopened};
use crate::error::{Error, chain};
use crate::server::{Options, Running, start};

/// Runs the mediator from `config` (read from `path` as `text`) until it is told to stop
/// or its decision log breaks; returns the decision log, for the last flush, and that
/// failure. SIGPIPE is ignored by the Rust runtime, so a closed stdout is a write error,
/// not a kill.
///
/// # Errors
/// The start failed, or a signal handler could not be installed.
pub async fn serve(
    config: Config,
    text: String,
    path: PathBuf,
    watch_config: bool,
) -> Result<(DecisionLog, Option<String>), Error> {
    let socket_dir = config.listen.socket_dir.clone();
    // Handlers first: a signal that arrives right after the ready line must not kill
    // the process with its default action (leaving socket files behind).
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut quit = signal(SignalKind::quit())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    let running = start(config, Options::default()).await?;
    running.set_baseline(&text);
    let show = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let ready = format!(
        "ready tcp={} admin={} socket_dir={} {}",
        show(running.tcp_addr().map(|a| a.to_string())),
        show(running.admin_addr().map(|a| a.to_string())),
        show(socket_dir.map(|d| d.display().to_string())),
        running.limits(),
    );
    crate::say!(Info, "{ready}");
    // `start` returned: every listener is bound and every configured authority is live.
    notify::ready(&ready);
    let mut watch = watch_config.then(|| watch::ConfigWatch::new(&path, &text));
    let mut tick = tokio::time::interval(watch::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let log = running.log().clone();
    let mut broken = None;
    loop {
        tokio::select! {
            e = log.broken() => {
                // Fail closed: a decision that cannot be recorded must not be made.
                crate::say!(Error,
                    "mediator: the decision log cannot be written ({e}); stopping, since no decision may go unrecorded"
                );
                broken = Some(e);
                break;
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = quit.recv() => break,
            _ = hup.recv() => {
                reload(&running, &path, ReloadTrigger::Signal);
                // The file just read is the baseline now: no second reload for it.
                if let Some(w) = watch.as_mut() {
                    w.changed();
                }
            }
            _ = usr1.recv() => reopen(running.log()).await,
            _ = usr2.recv() => crate::say!(Warning,
                "mediator: SIGUSR2 ignored (SIGHUP reloads, SIGUSR1 reopens the decision log)"
            ),
            _ = tick.tick(), if watch.is_some() => {
                if watch.as_mut().is_some_and(watch::ConfigWatch::changed) {
                    crate::say!(Info, "mediator: {} changed; reloading", path.display());
                    reload(&running, &path, ReloadTrigger::Watch);
                }
            }
        }
    }
    crate::say!(Info, "mediator: shutting down");
    notify::stopping();
    running.shutdown().await;
    Ok((log, broken))
}

/// SIGUSR1 (logrotate): reopen the decision log file by its path; every line goes to the
/// old file or the new one, none is lost.
async fn reopen(log: &DecisionLog) {
    let log = log.clone();
    match tokio::task::spawn_blocking(move || log.reopen()).await {
        Ok(Ok(Reopened::File(p))) => {
            crate::say!(Info, "mediator: decision log reopened: {}", p.display());
        }
        Ok(Ok(Reopened::NotAFile)) => {
            crate::say!(
                Info,
                "mediator: SIGUSR1: the decision log is not a file; nothing to reopen"
            );
        }
        Ok(Err(e)) => crate::say!(
            Error,
            "mediator: cannot reopen the decision log ({}); still writing to the file it had",
            chain(&e)
        ),
        Err(e) => crate::say!(Error, "mediator: cannot reopen the decision log: {e}"),
    }
}

/// SIGHUP: re-read and validate the file; apply it only when it is valid as a whole. The
/// service manager is told a reload runs (`RELOADING=1`, then `READY=1`).
fn reload(running: &Running, path: &Path, trigger: ReloadTrigger) {
    notify::reloading();
    let status = reload_file(running, path, trigger);
    notify::reloaded(&status);
}

/// Reloads from `path`; returns the service status to report (`systemctl status` shows
/// it): `ready (reloaded)`, or that the reload failed and what still runs.
fn reload_file(running: &Running, path: &Path, trigger: ReloadTrigger) -> String {
    let parsed = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config {}: {e}", path.display()))
        .and_then(|text| {
            crate::config::parse_on(&text, &path.display().to_string(), running.node())
                .map(|c| (c, text))
                .map_err(|e| e.to_string())
        });
    let (config, text) = match parsed {
        Ok(parsed) => parsed,
        Err(why) => {
            running.reload_failed(trigger, &why);
            crate::say!(
                Error,
                "mediator: reload failed; the running authorities are unchanged:\n{why}"
            );
            return "ready (reload failed: the running authorities are unchanged; see the log)"
                .to_owned();
        }
    };
    let r = match running.reload(config, &text, trigger) {
        Ok(r) => r,
        Err(refused) => {
            crate::say!(Error, "mediator: reload failed: {refused}");
            return "ready (reload refused: a name of the file is held by the registry; the running authorities are unchanged)".to_owned();
        }
    };
    let names = |v: Vec<String>| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.join(",")
        }
    };
    let failed = || names(r.failed.iter().map(|(n, _)| n.clone()).collect());
    crate::say!(
        Error,
        "mediator: reload applied: added={} removed={} changed={} unchanged={} failed={}{}",
        names(r.added.iter().map(|(n, g)| format!("{n}@{g}")).collect()),
        names(r.removed.iter().map(|(n, g)| format!("{n}@{g}")).collect()),
        names(
            r.changed
                .iter()
                .map(|(n, a, b)| format!("{n}@{a}->{b}"))
                .collect()
        ),
        names(r.unchanged.clone()),
        failed(),
        if r.ignored_sections.is_empty() {
            String::new()
        } else {
            format!(
                " (changes to [{}] need a restart and were not applied)",
                r.ignored_sections.join("], [")
            )
        }
    );
    if r.failed.is_empty() {
        "ready (reloaded)".to_owned()
    } else {
        format!("ready (reload partly failed: {}; see the log)", failed())
    }
}
