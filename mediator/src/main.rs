//! The `mediator` binary: run (SIGHUP reloads the authorities, SIGUSR1 reopens the
//! decision log), check a config, explain a decision, run the demo, hash a token, probe a
//! running mediator's health, print shell completions and man pages.

use std::io::{Read, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sha2::{Digest, Sha256};

/// Attributable egress mediator.
#[derive(Debug, Parser)]
#[command(
    name = "mediator",
    version = mediator::service::VERSION,
    long_version = mediator::service::LONG_VERSION,
    about
)]
struct Cli {
    /// Configuration file (mediator.toml); required unless a subcommand says otherwise.
    #[arg(long, short = 'c', global = true)]
    config: Option<PathBuf>,
    /// Reload when the config file's content changes (it is read every 2 s), as SIGHUP
    /// does: for a config mounted from a Kubernetes ConfigMap.
    #[arg(long)]
    watch_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum RegistryAction {
    /// List the stored authorities (name, generation, created, expires, allow entries,
    /// whether a token is set; never a token) and the records that cannot be read.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate the configuration, print every problem with its location, and exit.
    Check,
    /// On loopback only: start an origin and a mediator with an embedded example config,
    /// send allowed and denied requests, and print what each client saw beside the
    /// decision log.
    Demo,
    /// Read a token on standard input and print its SHA-256 in hex (for `token_sha256`).
    HashToken,
    /// The authority registry (`[registry]`): what it holds, read without changing it.
    Registry {
        /// What to do.
        #[command(subcommand)]
        action: RegistryAction,
    },
    /// Print the CA certificate (PEM) that TLS termination issues leaves from, creating
    /// the CA in `[tls] ca_dir` if it is absent: for the trust stores of children.
    CaCert,
    /// Explain the decision for one authority and target with the same code as live
    /// traffic. Exit status 0 when allowed, 1 when denied, 2 on error.
    Explain {
        /// The authority whose grant decides.
        #[arg(long)]
        authority: String,
        /// HOST[:PORT] (IPv6 in brackets); the port defaults to 443.
        target: String,
        /// Also resolve the name with the configured resolver and vet every address, as
        /// live traffic does (without it: the name decision alone, nothing resolved).
        #[arg(long)]
        resolve: bool,
        /// The name decision alone (the default; kept for scripts that pass it).
        #[arg(long, hide = true, conflicts_with = "resolve")]
        no_resolve: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the smallest `[[authority]]` table that would have allowed one authority's
    /// `not_in_allowlist` and `port_not_allowed` denials, read from a decision log (or
    /// the shim's `--report`); address-class denials stay denied and are listed as
    /// comments.
    Suggest {
        /// The authority whose denials count.
        #[arg(long)]
        authority: String,
        /// The decision log or report; `-` or absent: standard input.
        log: Option<PathBuf>,
    },
    /// Ask a running mediator's admin API `/healthz` (or `/readyz`): exit 0 on 200, 1
    /// otherwise. For container health checks and probes (the image has no curl).
    Health {
        /// The admin API: `ip:port`, or the path of its Unix socket. Default: `[listen]
        /// admin` (else `admin_socket`) of --config.
        #[arg(long, value_name = "ADDR")]
        admin: Option<String>,
        /// Ask `/readyz` (accepting new connections) instead of `/healthz` (alive).
        #[arg(long)]
        ready: bool,
        /// Give up after this many seconds.
        #[arg(long, value_name = "SECS", default_value_t = 3)]
        timeout: u64,
    },
    /// Print a shell completion script to standard output.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page mediator(1) (roff) to standard output; with --out-dir, write it
    /// and one page per subcommand (mediator-check.1, ...) there instead.
    Man {
        /// Directory to write the pages into.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(mediator::service::journal::JournalStderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MEDIATOR_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,mediator::control=info")
            }),
        )
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            mediator::say!(Error, "mediator: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[expect(clippy::too_many_lines, reason = "one match arm per subcommand")]
fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Some(Command::Health {
            admin,
            ready,
            timeout,
        }) => health(admin, cli.config, ready, timeout),
        Some(Command::Completions { shell }) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "mediator", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Man { out_dir }) => {
            let cmd = <Cli as clap::CommandFactory>::command();
            match out_dir {
                Some(dir) => {
                    std::fs::create_dir_all(&dir)
                        .with_context(|| format!("cannot create {}", dir.display()))?;
                    clap_mangen::generate_to(cmd, &dir)
                        .with_context(|| format!("cannot write man pages to {}", dir.display()))?;
                }
                None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Suggest { authority, log }) => {
            let text = match log.filter(|p| p.as_os_str() != "-") {
                Some(p) => std::fs::read_to_string(&p)
                    .with_context(|| format!("cannot read {}", p.display()))?,
                None => {
                    let mut t = String::new();
                    std::io::stdin().read_to_string(&mut t)?;
                    t
                }
            };
            match mediator::suggest::suggest(&text, &authority) {
                Ok(out) => {
                    print!("{out}");
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    mediator::say!(Error, "mediator suggest: {e}");
                    Ok(ExitCode::from(2))
                }
            }
        }
        Some(Command::HashToken) => {
            let mut token = Vec::new();
            std::io::stdin().read_to_end(&mut token)?;
            // A trailing newline from `echo` is almost never part of the token.
            if token.last() == Some(&b'\n') {
                token.pop();
            }
            if token.is_empty() {
                anyhow::bail!("the token is empty; an empty token would accept an empty password");
            }
            println!("{}", hex::encode(Sha256::digest(&token)));
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Demo) => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(mediator::demo::run())?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Explain {
            authority,
            target,
            resolve,
            no_resolve: _,
            json,
        }) => {
            let path = cli.config.context("--config FILE is required")?;
            let config = match mediator::config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    mediator::say!(Error, "{:#}", anyhow::Error::from(e));
                    return Ok(ExitCode::from(2));
                }
            };
            let rt = tokio::runtime::Runtime::new()?;
            let e = rt.block_on(mediator::explain::explain(
                &config, &authority, &target, resolve,
            ))?;
            let upstream = (config.upstream.mode == policy::config::UpstreamMode::System)
                .then(|| system_upstream(&config).unwrap_or_else(|e| e));
            if json {
                let mut v = serde_json::to_value(&e)?;
                if let (Some(line), Some(obj)) = (&upstream, v.as_object_mut()) {
                    obj.insert("upstream".into(), line.clone().into());
                }
                emit(&format!("{}\n", serde_json::to_string_pretty(&v)?))?;
            } else {
                let mut text = mediator::explain::render_text(&e);
                if let Some(line) = &upstream {
                    text.push_str(&format!("{line}\n"));
                }
                emit(&text)?;
            }
            Ok(if e.decision == policy::Verdict::Allow {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Some(Command::Registry {
            action: RegistryAction::List { json },
        }) => {
            let path = cli.config.context("--config FILE is required")?;
            let config = match mediator::config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    mediator::say!(Error, "{:#}", anyhow::Error::from(e));
                    return Ok(ExitCode::from(1));
                }
            };
            let rt = tokio::runtime::Runtime::new()?;
            match rt.block_on(mediator::registry_listing(&config)) {
                Ok(listing) if json => {
                    emit(&format!("{}\n", serde_json::to_string_pretty(&listing)?))?;
                }
                Ok(listing) => emit(&listing.render_text())?,
                Err(e) => {
                    mediator::say!(Error, "{}: {:#}", path.display(), anyhow::Error::from(e));
                    return Ok(ExitCode::from(1));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::CaCert) => {
            let path = cli.config.context("--config FILE is required")?;
            let config = match mediator::config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    mediator::say!(Error, "{:#}", anyhow::Error::from(e));
                    return Ok(ExitCode::from(1));
                }
            };
            let dir = config
                .tls
                .ca_dir
                .with_context(|| format!("{}: no [tls] ca_dir is configured", path.display()))?;
            let ca = mediator::tls::load_ca(&dir)?;
            print!("{}", ca.cert_pem());
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Check) => {
            let path = cli.config.context("--config FILE is required")?;
            match mediator::config::load(&path) {
                Ok(cfg) => {
                    // What a start would load too: the CA, the PAC, credential files.
                    let rt = tokio::runtime::Runtime::new()?;
                    let notes = match rt.block_on(mediator::check_resources(&cfg)) {
                        Ok(notes) => notes,
                        Err(e) => {
                            mediator::say!(
                                Error,
                                "{}: {:#}",
                                path.display(),
                                anyhow::Error::from(e)
                            );
                            mediator::say!(
                                Error,
                                "mediator: the configuration is valid, but a start would fail"
                            );
                            return Ok(ExitCode::from(1));
                        }
                    };
                    let n = cfg.authorities.len();
                    let mut text = format!(
                        "{}: OK ({n} {})\n",
                        path.display(),
                        if n == 1 { "authority" } else { "authorities" }
                    );
                    for note in notes {
                        text.push_str(&format!("{note}\n"));
                    }
                    for w in &cfg.warnings {
                        text.push_str(&format!("warning: {w}\n"));
                    }
                    for a in &cfg.authorities {
                        for c in &a.credentials {
                            text.push_str(&format!(
                                "credential: authority {:?}: {} for {} from {} (loaded)\n",
                                a.grant.name(),
                                c.header(),
                                c.host(),
                                c.source
                            ));
                        }
                    }
                    text.push_str(&format!("limits: {}\n", mediator::limits_of(&cfg)));
                    if cfg.upstream.mode == policy::config::UpstreamMode::System {
                        match system_upstream(&cfg) {
                            Ok(line) => text.push_str(&format!("{line}\n")),
                            Err(e) => {
                                mediator::say!(Error, "{e}");
                                return Ok(ExitCode::from(1));
                            }
                        }
                    }
                    emit(&text)?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    mediator::say!(Error, "{:#}", anyhow::Error::from(e));
                    Ok(ExitCode::from(1))
                }
            }
        }
        None => {
            let path = cli
                .config
                .context("--config FILE is required (or try `mediator demo`)")?;
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read config {}", path.display()))?;
            let config = match mediator::config::parse(&text, &path.display().to_string()) {
                Ok(c) => c,
                Err(e) => {
                    mediator::say!(Error, "{:#}", anyhow::Error::from(e));
                    mediator::say!(
                        Error,
                        "mediator: refusing to start: the configuration has errors"
                    );
                    return Ok(ExitCode::from(1));
                }
            };
            for w in &config.warnings {
                mediator::say!(Warning, "mediator: warning: {w}");
            }
            let rt = tokio::runtime::Runtime::new()?;
            let (log, broken) = rt.block_on(serve(config, text, path, cli.watch_config))?;
            // Connections still running after the shutdown grace are dropped with the
            // runtime: each still writes its close record, which must reach the log
            // before the process exits.
            drop(rt);
            log.flush();
            Ok(if broken.is_some() {
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

/// Writes `text` to stdout. A reader that has gone (`mediator check | head -1`) ends the
/// output quietly: what it wanted it has read.
///
/// # Errors
/// Any other write error.
fn emit(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::from(e).context("cannot write to stdout"))
        }
        _ => Ok(()),
    }
}

/// `upstream: system: <source>: <what it said> -> <routing>`, or why it cannot be used.
// A `String` error: the line `check` prints, success or failure.
fn system_upstream(cfg: &policy::config::Config) -> Result<String, String> {
    mediator::route::system::summary(&cfg.upstream.system, &|k| std::env::var(k).ok())
        .map(|s| format!("upstream: system: {s}"))
        .map_err(|e| format!("upstream: system: {e}"))
}

/// `mediator health`: the admin address from `--admin` or the config; exit 0 on 200.
fn health(
    admin: Option<String>,
    config: Option<PathBuf>,
    ready: bool,
    timeout: u64,
) -> anyhow::Result<ExitCode> {
    use mediator::service::health::{AdminAddr, Probe, probe};
    let addr = match (admin, config) {
        (Some(a), _) => AdminAddr::parse(&a)?,
        (None, Some(path)) => {
            let listen = mediator::config::load(&path)?.listen;
            match (listen.admin, listen.admin_socket) {
                (Some(a), _) => AdminAddr::Tcp(a),
                (None, Some(p)) => AdminAddr::Unix(p),
                (None, None) => anyhow::bail!(
                    "{}: no [listen] admin or admin_socket to ask",
                    path.display()
                ),
            }
        }
        (None, None) => anyhow::bail!("give --admin ADDR or --config FILE"),
    };
    let which = if ready { Probe::Ready } else { Probe::Health };
    match probe(&addr, which, std::time::Duration::from_secs(timeout)) {
        Ok(a) if a.status == 200 => {
            println!("{addr} {}: {} {}", which.path(), a.status, a.body);
            Ok(ExitCode::SUCCESS)
        }
        Ok(a) => {
            mediator::say!(
                Info,
                "mediator: {addr} {}: {} {}",
                which.path(),
                a.status,
                a.body
            );
            Ok(ExitCode::from(1))
        }
        Err(e) => {
            mediator::say!(Error, "mediator: {addr} {}: {e}", which.path());
            Ok(ExitCode::from(1))
        }
    }
}

/// Runs the mediator until SIGTERM, SIGINT or SIGQUIT (SIGHUP reloads, SIGUSR1 reopens the
/// decision log, SIGUSR2 is ignored; SIGPIPE is ignored by the Rust runtime, so a closed
/// stdout is a write error, not a kill) or until a write to the decision log fails;
/// returns its decision log, for the last flush, and that failure.
async fn serve(
    config: policy::config::Config,
    text: String,
    path: PathBuf,
    watch_config: bool,
) -> anyhow::Result<(mediator::DecisionLog, Option<String>)> {
    use mediator::service::{notify, watch};
    use tokio::signal::unix::{SignalKind, signal};
    let socket_dir = config.listen.socket_dir.clone();
    // Handlers first: a signal that arrives right after the ready line must not kill
    // the process with its default action (leaving socket files behind).
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut quit = signal(SignalKind::quit())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    let running = mediator::start(config, mediator::Options::default()).await?;
    running.set_baseline(&text);
    let show = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let ready = format!(
        "ready tcp={} admin={} socket_dir={} {}",
        show(running.tcp_addr().map(|a| a.to_string())),
        show(running.admin_addr().map(|a| a.to_string())),
        show(socket_dir.map(|d| d.display().to_string())),
        running.limits(),
    );
    mediator::say!(Info, "{ready}");
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
                mediator::say!(Error,
                    "mediator: the decision log cannot be written ({e}); stopping, since no decision may go unrecorded"
                );
                broken = Some(e);
                break;
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = quit.recv() => break,
            _ = hup.recv() => {
                reload(&running, &path);
                // The file just read is the baseline now: no second reload for it.
                if let Some(w) = watch.as_mut() {
                    w.changed();
                }
            }
            _ = usr1.recv() => reopen(running.log()).await,
            _ = usr2.recv() => mediator::say!(Warning,
                "mediator: SIGUSR2 ignored (SIGHUP reloads, SIGUSR1 reopens the decision log)"
            ),
            _ = tick.tick(), if watch.is_some() => {
                if watch.as_mut().is_some_and(watch::ConfigWatch::changed) {
                    mediator::say!(Info, "mediator: {} changed; reloading", path.display());
                    reload(&running, &path);
                }
            }
        }
    }
    mediator::say!(Info, "mediator: shutting down");
    notify::stopping();
    running.shutdown().await;
    Ok((log, broken))
}

/// SIGUSR1 (logrotate): reopen the decision log file by its path; every line goes to the
/// old file or the new one, none is lost.
async fn reopen(log: &mediator::DecisionLog) {
    let log = log.clone();
    match tokio::task::spawn_blocking(move || log.reopen()).await {
        Ok(Ok(mediator::Reopened::File(p))) => {
            mediator::say!(Info, "mediator: decision log reopened: {}", p.display());
        }
        Ok(Ok(mediator::Reopened::NotAFile)) => {
            mediator::say!(
                Info,
                "mediator: SIGUSR1: the decision log is not a file; nothing to reopen"
            );
        }
        Ok(Err(e)) => mediator::say!(
            Error,
            "mediator: cannot reopen the decision log ({:#}); still writing to the file it had",
            anyhow::Error::from(e)
        ),
        Err(e) => mediator::say!(Error, "mediator: cannot reopen the decision log: {e}"),
    }
}

/// SIGHUP: re-read and validate the file; apply it only when it is valid as a whole. The
/// service manager is told a reload runs (`RELOADING=1`, then `READY=1`).
fn reload(running: &mediator::Running, path: &std::path::Path) {
    mediator::service::notify::reloading();
    let status = reload_file(running, path);
    mediator::service::notify::reloaded(&status);
}

/// Reloads from `path`; returns the service status to report (`systemctl status` shows
/// it): `ready (reloaded)`, or that the reload failed and what still runs.
fn reload_file(running: &mediator::Running, path: &std::path::Path) -> String {
    let parsed = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config {}: {e}", path.display()))
        .and_then(|text| {
            mediator::config::parse_on(&text, &path.display().to_string(), running.node())
                .map(|c| (c, text))
                .map_err(|e| e.to_string())
        });
    match parsed {
        Err(why) => {
            running.reload_failed();
            mediator::say!(
                Error,
                "mediator: reload failed; the running authorities are unchanged:\n{why}"
            );
            "ready (reload failed: the running authorities are unchanged; see the log)".to_owned()
        }
        Ok((config, text)) => {
            let r = match running.reload(config, &text) {
                Ok(r) => r,
                Err(refused) => {
                    mediator::say!(Error, "mediator: reload failed: {refused}");
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
            mediator::say!(
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
                names(r.unchanged),
                names(r.failed.iter().map(|(n, _)| n.clone()).collect()),
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
                format!(
                    "ready (reload partly failed: {}; see the log)",
                    names(r.failed.iter().map(|(n, _)| n.clone()).collect())
                )
            }
        }
    }
}
