//! The `mediator` binary: run (SIGHUP reloads the authorities), check a config, explain a
//! decision, run the demo, hash a token.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sha2::{Digest, Sha256};

/// Attributable egress mediator.
#[derive(Debug, Parser)]
#[command(name = "mediator", version, about)]
struct Cli {
    /// Configuration file (mediator.toml); required unless a subcommand says otherwise.
    #[arg(long, short = 'c', global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate the configuration, print every problem with its location, and exit.
    Check,
    /// On loopback only: start an origin and a mediator with an embedded example config,
    /// send allowed and denied requests, and print what each client saw beside the
    /// decision log.
    Demo,
    /// Read a token on standard input and print its SHA-256 in hex (for `token_sha256`).
    HashToken,
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
        /// Skip resolving: answer with the grant's name decision alone (live traffic also
        /// resolves the name and vets every address; the default does too).
        #[arg(long)]
        no_resolve: bool,
        /// Resolve and vet (the default; kept for scripts that pass it).
        #[arg(long, hide = true, conflicts_with = "no_resolve")]
        resolve: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
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
            eprintln!("mediator: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
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
            no_resolve,
            resolve: _,
            json,
        }) => {
            let path = cli.config.context("--config FILE is required")?;
            let config = match mediator::config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{:#}", anyhow::Error::from(e));
                    return Ok(ExitCode::from(2));
                }
            };
            let rt = tokio::runtime::Runtime::new()?;
            let e = rt.block_on(mediator::explain::explain(
                &config,
                &authority,
                &target,
                !no_resolve,
            ))?;
            let upstream = (config.upstream.mode == policy::config::UpstreamMode::System)
                .then(|| system_upstream(&config).unwrap_or_else(|e| e));
            if json {
                let mut v = serde_json::to_value(&e)?;
                if let (Some(line), Some(obj)) = (&upstream, v.as_object_mut()) {
                    obj.insert("upstream".into(), line.clone().into());
                }
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", mediator::explain::render_text(&e));
                if let Some(line) = &upstream {
                    println!("{line}");
                }
            }
            Ok(if e.decision == policy::Verdict::Allow {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Some(Command::CaCert) => {
            let path = cli.config.context("--config FILE is required")?;
            let config = match mediator::config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{:#}", anyhow::Error::from(e));
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
                            eprintln!("{}: {:#}", path.display(), anyhow::Error::from(e));
                            eprintln!(
                                "mediator: the configuration is valid, but a start would fail"
                            );
                            return Ok(ExitCode::from(1));
                        }
                    };
                    let n = cfg.authorities.len();
                    println!(
                        "{}: OK ({n} {})",
                        path.display(),
                        if n == 1 { "authority" } else { "authorities" }
                    );
                    for note in notes {
                        println!("{note}");
                    }
                    println!("limits: {}", mediator::limits_of(&cfg));
                    if cfg.upstream.mode == policy::config::UpstreamMode::System {
                        match system_upstream(&cfg) {
                            Ok(line) => println!("{line}"),
                            Err(e) => {
                                eprintln!("{e}");
                                return Ok(ExitCode::from(1));
                            }
                        }
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("{:#}", anyhow::Error::from(e));
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
            let config = match policy::config::parse(&text, &path.display().to_string()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{:#}", anyhow::Error::from(e));
                    eprintln!("mediator: refusing to start: the configuration has errors");
                    return Ok(ExitCode::from(1));
                }
            };
            let rt = tokio::runtime::Runtime::new()?;
            let log = rt.block_on(serve(config, text, path))?;
            // Connections still running after the shutdown grace are dropped with the
            // runtime: each still writes its close record, which must reach the log
            // before the process exits.
            drop(rt);
            log.flush();
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `upstream: system: <source>: <what it said> -> <routing>`, or why it cannot be used.
fn system_upstream(cfg: &policy::config::Config) -> Result<String, String> {
    mediator::route::system::summary(&cfg.upstream.system, &|k| std::env::var(k).ok())
        .map(|s| format!("upstream: system: {s}"))
        .map_err(|e| format!("upstream: system: {e}"))
}

/// Runs the mediator until SIGTERM or SIGINT (SIGHUP reloads); returns its decision log,
/// for the last flush.
async fn serve(
    config: policy::config::Config,
    text: String,
    path: PathBuf,
) -> anyhow::Result<mediator::DecisionLog> {
    use tokio::signal::unix::{SignalKind, signal};
    let socket_dir = config.listen.socket_dir.clone();
    // Handlers first: a signal that arrives right after the ready line must not kill
    // the process with its default action (leaving socket files behind).
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let running = mediator::start(config, mediator::Options::default()).await?;
    running.set_baseline(&text);
    let show = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    eprintln!(
        "ready tcp={} admin={} socket_dir={} {}",
        show(running.tcp_addr().map(|a| a.to_string())),
        show(running.admin_addr().map(|a| a.to_string())),
        show(socket_dir.map(|d| d.display().to_string())),
        running.limits(),
    );
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => reload(&running, &path),
        }
    }
    eprintln!("mediator: shutting down");
    let log = running.log().clone();
    running.shutdown().await;
    Ok(log)
}

/// SIGHUP: re-read and validate the file; apply it only when it is valid as a whole.
fn reload(running: &mediator::Running, path: &std::path::Path) {
    let parsed = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config {}: {e}", path.display()))
        .and_then(|text| {
            policy::config::parse(&text, &path.display().to_string())
                .map(|c| (c, text))
                .map_err(|e| e.to_string())
        });
    match parsed {
        Err(why) => {
            eprintln!("mediator: reload failed; the running authorities are unchanged:\n{why}");
        }
        Ok((config, text)) => {
            let r = running.reload(config, &text);
            let names = |v: Vec<String>| {
                if v.is_empty() {
                    "-".to_owned()
                } else {
                    v.join(",")
                }
            };
            eprintln!(
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
        }
    }
}
