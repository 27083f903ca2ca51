//! One run of the shim, OS-independent: resolve the channel, prepare the CA files, give the
//! [`Job`] to a [`Backend`], serve the proxy listener it hands back (relay to the
//! authority's socket, or the embedded mediator), and write the `--report`.
//!
//! It never confines anything itself and names no backend: the caller picks one. What it
//! can check itself (the channel, the socket's directory, the CA file) it checks before
//! the backend starts.

mod channel;
mod report;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::ca::TrustFiles;
use crate::capture::Addresses;
use crate::cli::{CaptureMode, ChannelSpec, Settings};
use crate::control::{Binding, ControlSocket};
use crate::error::{Error, Result};
use crate::report::Denials;
use crate::sandbox::{Backend, CaptureJob, Job};
use crate::violations::{Sink, Violations};
use channel::{Admin, Channel, Serving};
use report::{ReportFile, write_report};

/// Confine and run `settings.command` with `backend`; returns the status to leave with.
///
/// The CA files (see [`crate::ca`]) are removed before returning, by the backend, which
/// also removes them if the shim itself is killed.
///
/// # Errors
/// Any [`Error`] that stops the sandbox from being built exactly as asked (nothing has run
/// then), the embedded mediator's refusal to start, or a report that cannot be written.
pub(crate) fn run(backend: &impl Backend, settings: &Settings) -> Result<i32> {
    let handover =
        crate::handover::Handover::check(&settings.pass_fd, &settings.listen_fd, |fd| {
            backend.probe_fd(fd)
        })?;
    let channel = Channel::resolve(&settings.channel, settings.control.is_some())?;
    let ca_pem = settings.ca_cert.as_ref().map(crate::ca::load).transpose()?;
    // The mediator's files: the config's and the default locations, masked (checked
    // before anything is made on the host).
    let mediator = mediator_files(backend, settings)?;
    // Bound before the sandbox is built, so that it is masked inside.
    let mut control = settings
        .control
        .as_deref()
        .map(ControlSocket::bind)
        .transpose()?;
    let cache = settings.cache.as_deref().map(cache_dir).transpose()?;
    let (allow_write, mut deny_read, allow_read) = view(
        settings,
        cache.as_ref(),
        control.as_ref(),
        (mediator.masks, mediator.reopen),
    )?;
    let report_file = match &settings.report {
        Some(Some(path)) => Some(ReportFile::open(path)?),
        _ => None,
    };
    let binding = Arc::new(Binding::new(
        channel.first_binding(),
        settings.labels.clone(),
    ));
    let trust = match &ca_pem {
        Some(pem) => Some(TrustFiles::create(pem)?),
        None => None,
    };
    let capture = capture_job(settings.capture);
    let violations = violations(settings)?;
    deny_read.extend(records(&channel, settings, report_file.as_ref()));
    let job = Job {
        handover: &handover,
        command: &settings.command,
        allow_write: &allow_write,
        deny_read: &deny_read,
        allow_read: &allow_read,
        allow_unix_sockets: settings.allow_unix_sockets,
        allow_degraded: &settings.allow_degraded,
        trust: trust.as_ref(),
        capture,
        child_env: &settings.child_env,
        hidden_env: &settings.hidden_env,
        violations: violations.clone(),
        tmp: settings.tmp.as_ref(),
        cache: cache.as_deref(),
    };
    // The run's one list of denials, said on stderr as they happen unless --quiet-denials.
    let denials = Arc::new(Denials::new(settings.live_denials));
    // Socket mode with a known admin API: the run's denials come from there (from now on).
    let admin = Admin::of(&channel, settings);
    // What a client that refuses the mediator's certificate is told (see crate::rejected).
    let told = crate::rejected::Trust {
        bundle: trust.as_ref().map(|t| t.files().bundle),
        program_of: backend.program_of(),
        clients: Arc::default(),
    };
    let mut serving = None;
    let outcome = backend.run(&job, |handoff| {
        let (served, rebinder, asking) = channel.serve(
            handoff,
            capture,
            &denials,
            admin,
            &binding,
            settings.allow_unix_sockets,
            told,
        )?;
        serving = Some(served);
        if let Some(c) = &mut control {
            c.serve(Arc::clone(&binding), rebinder, asking)?;
        }
        Ok(())
    })?;
    drop(control);
    if let Some(v) = &violations {
        v.finish();
    }
    write_report(
        settings,
        report_file.as_ref(),
        (Serving::finish(serving), &outcome),
        (&denials, &binding),
        &mediator.masked,
        violations.as_deref(),
    )?;
    Ok(outcome.exit_status)
}

/// The view's lists, as the job gives them to the backend: the writable roots (with the
/// `--cache` directory), the masked paths (with the `--control` socket, the mediator's
/// `masks` and the caller's cargo registry tokens) and the reads re-opened beneath a mask
/// (with the mediator's `reopen`).
///
/// # Errors
/// What [`deny_read`] returns.
fn view(
    settings: &Settings,
    cache: Option<&PathBuf>,
    control: Option<&ControlSocket>,
    (masks, reopen): (Vec<PathBuf>, Vec<PathBuf>),
) -> Result<(Vec<PathBuf>, Vec<PathBuf>, Vec<PathBuf>)> {
    let mut allow_write = settings.allow_write.clone();
    allow_write.extend(cache.cloned());
    let mut deny_read = deny_read(settings)?;
    deny_read.extend(control.map(|c| c.path().to_owned()));
    deny_read.extend(masks);
    // The caller's cargo registry tokens are not the command's (design section 14).
    deny_read.extend(crate::caches::cargo_credentials(
        std::env::var_os("CARGO_HOME").map(PathBuf::from).as_deref(),
        std::env::var_os("HOME").map(PathBuf::from).as_deref(),
    ));
    let mut allow_read = settings.allow_read.clone();
    allow_read.extend(reopen);
    Ok((allow_write, deny_read, allow_read))
}

/// The run's own records (the decision log, `--violations PATH`, the report file), written
/// from outside, masked inside: the command can neither forge lines in them nor read
/// them, and the shim never opens their paths again after the command could have
/// replaced one.
fn records(
    channel: &Channel,
    settings: &Settings,
    report_file: Option<&ReportFile>,
) -> Vec<PathBuf> {
    [
        channel.decision_log(),
        settings.violations.as_deref().and_then(Sink::named_file),
        report_file.map(ReportFile::path),
    ]
    .into_iter()
    .flatten()
    .filter_map(maskable)
    .collect()
}

/// The mediator's files: the config's and the default locations, settled against the
/// writable roots and the re-opened reads (checked before anything is made on the host);
/// warns when the command would run as the owner of the socket.
fn mediator_files(backend: &impl Backend, settings: &Settings) -> Result<crate::secrets::Settled> {
    let mut mediator_paths = settings.mediator_paths.clone();
    mediator_paths.extend(crate::secrets::defaults(|k| std::env::var_os(k)));
    let mediator =
        crate::secrets::settle(mediator_paths, &settings.allow_write, &settings.allow_read)?;
    if let ChannelSpec::Socket(socket) = &settings.channel {
        crate::secrets::warn_same_owner(socket, backend.command_uid(&settings.allow_degraded));
    }
    Ok(mediator)
}

/// Capture's part of the job: `None` when it is off.
fn capture_job(mode: CaptureMode) -> Option<CaptureJob> {
    match mode {
        CaptureMode::Off => None,
        mode => Some(CaptureJob {
            addrs: Addresses::generate(),
            required: mode == CaptureMode::Required,
        }),
    }
}

/// Filesystem violations: observed when asked for live or in the report.
///
/// # Errors
/// What [`Sink::open`] returns for `--violations`.
fn violations(settings: &Settings) -> Result<Option<Arc<Violations>>> {
    if settings.violations.is_some() || settings.report.is_some() {
        let sink = settings.violations.as_deref().map(Sink::open).transpose()?;
        Ok(Some(Arc::new(Violations::new(sink, settings.live_denials))))
    } else {
        Ok(None)
    }
}

/// `--cache DIR`, made if missing (0700, with its parents) and canonical.
///
/// # Errors
/// [`Error::Path`] when it cannot be made or resolved, [`Error::Usage`] when it is `/`.
fn cache_dir(dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let path_error = |source| Error::Path {
        what: "--cache",
        path: dir.to_owned(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(path_error)?;
    let canonical = std::fs::canonicalize(dir).map_err(path_error)?;
    if canonical == Path::new("/") || !canonical.is_dir() {
        return Err(Error::Usage(format!(
            "--cache {}: name a directory of its own",
            dir.display()
        )));
    }
    Ok(canonical)
}

/// The settings' read-denied paths, plus the directory of the authority's socket: with
/// `--allow-unix-sockets` the command could otherwise connect to any authority's socket
/// there (or the admin socket).
///
/// # Errors
/// [`Error::Usage`] when that directory is `/` (masking it would hide everything).
fn deny_read(settings: &Settings) -> Result<Vec<PathBuf>> {
    let mut deny_read = settings.deny_read.clone();
    if let ChannelSpec::Socket(p) = &settings.channel
        && let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty())
    {
        if std::fs::canonicalize(dir).is_ok_and(|d| d == Path::new("/")) {
            return Err(Error::Usage(format!(
                "the mediator socket {} must be in a directory of its own (it is masked inside the sandbox), not in /",
                p.display()
            )));
        }
        deny_read.push(dir.to_owned());
    }
    Ok(deny_read)
}

/// `path`, canonical, when it is a regular file or a FIFO: what masking one of the run's
/// own records covers. A terminal or `/dev/null` named as one stays as it is (a command
/// may open its terminal by name), and so does a path that cannot be resolved (a pipe
/// named through `/dev/stderr`).
fn maskable(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let canonical = std::fs::canonicalize(path).ok()?;
    let kind = std::fs::metadata(&canonical).ok()?.file_type();
    (kind.is_file() || kind.is_fifo()).then_some(canonical)
}
