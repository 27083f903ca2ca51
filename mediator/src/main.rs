//! The `mediator` binary: run, check a config, run the demo, hash a token.

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
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MEDIATOR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
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
            println!("{}", hex::encode(Sha256::digest(&token)));
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Demo) => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(mediator::demo::run())?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Check) => {
            let path = cli.config.context("--config FILE is required")?;
            match mediator::config::load(&path) {
                Ok(cfg) => {
                    println!(
                        "{}: OK ({} authorities)",
                        path.display(),
                        cfg.authorities.len()
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("{e}");
                    Ok(ExitCode::from(1))
                }
            }
        }
        None => {
            let path = cli
                .config
                .context("--config FILE is required (or try `mediator demo`)")?;
            let config = match mediator::config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    eprintln!("mediator: refusing to start: the configuration has errors");
                    return Ok(ExitCode::from(1));
                }
            };
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(serve(config))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn serve(config: policy::config::Config) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let socket_dir = config.listen.socket_dir.clone();
    let admin = config.listen.admin;
    // Handlers first: a signal that arrives right after the ready line must not kill
    // the process with its default action (leaving socket files behind).
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let running = mediator::start(config, None).await?;
    let show = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    eprintln!(
        "ready tcp={} admin={} socket_dir={}",
        show(running.tcp_addr().map(|a| a.to_string())),
        show(admin.map(|a| a.to_string())),
        show(socket_dir.map(|d| d.display().to_string())),
    );
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => {
                // Never die on SIGHUP; live reload comes with the admin API.
                eprintln!("mediator: SIGHUP: reload is not supported by this build; configuration unchanged");
            }
        }
    }
    eprintln!("mediator: shutting down");
    running.shutdown().await;
    Ok(())
}
