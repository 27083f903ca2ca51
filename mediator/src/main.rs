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
    version = mediator::version::VERSION,
    long_version = mediator::version::LONG_VERSION,
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
    /// Review a change of policy: what NEW widens and narrows against OLD (a file, or a
    /// running mediator's authorities with --admin), per authority and risk class. Exit
    /// status 0 unchanged, 1 changed without widening, 3 widened, 2 on error.
    Diff(mediator::review::DiffArgs),
    /// Check the policy of --config (or --admin) against the `[[expect]]` assertions of
    /// FILE, judged by the steps of live traffic with resolution stubbed by its `hosts`.
    /// Exit status 0 when all hold, 1 when one fails, 2 on error.
    Test(mediator::review::TestArgs),
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
        .with_writer(mediator::journal::JournalStderr)
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

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = cli.config;
    match cli.command {
        Some(Command::Health {
            admin,
            ready,
            timeout,
        }) => health(admin, config, ready, timeout),
        Some(Command::Completions { shell }) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "mediator", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Man { out_dir }) => man(out_dir),
        Some(Command::Suggest { authority, log }) => suggest(&authority, log),
        Some(Command::Diff(args)) => review(mediator::review::diff(&args)),
        Some(Command::Test(args)) => review(mediator::review::test(&args, config.as_deref())),
        Some(Command::HashToken) => hash_token(),
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
        }) => match loaded(config, 2)? {
            Ok((_, config)) => explain(&config, &authority, &target, resolve, json),
            Err(code) => Ok(code),
        },
        Some(Command::Registry {
            action: RegistryAction::List { json },
        }) => match loaded(config, 1)? {
            Ok((path, config)) => registry_list(&path, &config, json),
            Err(code) => Ok(code),
        },
        Some(Command::CaCert) => match loaded(config, 1)? {
            Ok((path, config)) => ca_cert(&path, config),
            Err(code) => Ok(code),
        },
        Some(Command::Check) => match loaded(config, 1)? {
            Ok((path, config)) => check(&path, &config),
            Err(code) => Ok(code),
        },
        None => serve(config, cli.watch_config),
    }
}

/// The configuration of `--config`, loaded with its secrets; when it does not load, its
/// errors said on stderr and the exit status `code` to end with.
///
/// # Errors
/// No `--config` given.
fn loaded(
    path: Option<PathBuf>,
    code: u8,
) -> anyhow::Result<Result<(PathBuf, policy::config::Config), ExitCode>> {
    let path = path.context("--config FILE is required")?;
    match mediator::config::load(&path) {
        Ok(config) => Ok(Ok((path, config))),
        Err(e) => {
            mediator::say!(Error, "{:#}", anyhow::Error::from(e));
            Ok(Err(ExitCode::from(code)))
        }
    }
}

/// `mediator man`: the man page on stdout, or every page into `out_dir`.
fn man(out_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
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

/// `mediator suggest`: the smallest table for `authority`'s denials in `log` (or stdin).
fn suggest(authority: &str, log: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let text = match log.filter(|p| p.as_os_str() != "-") {
        Some(p) => {
            std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?
        }
        None => {
            let mut t = String::new();
            std::io::stdin().read_to_string(&mut t)?;
            t
        }
    };
    match mediator::suggest::suggest(&text, authority) {
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

/// Prints what `diff` or `test` found and returns its exit status; what stopped it goes
/// to stderr, exit 2.
fn review(ran: Result<mediator::review::Report, mediator::Error>) -> anyhow::Result<ExitCode> {
    match ran {
        Ok(report) => {
            emit(&report.text)?;
            Ok(ExitCode::from(report.code))
        }
        Err(e) => {
            mediator::say!(Error, "{:#}", anyhow::Error::from(e));
            Ok(ExitCode::from(2))
        }
    }
}

/// `mediator hash-token`: the SHA-256 (hex) of the token on stdin.
fn hash_token() -> anyhow::Result<ExitCode> {
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

/// `mediator explain`: exit 0 when allowed, 1 when denied.
fn explain(
    config: &policy::config::Config,
    authority: &str,
    target: &str,
    resolve: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    let e = rt.block_on(mediator::explain::explain(
        config, authority, target, resolve,
    ))?;
    let upstream = (config.upstream.mode == policy::config::UpstreamMode::System)
        .then(|| system_upstream(config).unwrap_or_else(|e| e));
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

/// `mediator registry list`.
fn registry_list(
    path: &std::path::Path,
    config: &policy::config::Config,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    match rt.block_on(mediator::registry_listing(config)) {
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

/// `mediator ca-cert`: the CA certificate (PEM), the CA created if absent.
fn ca_cert(path: &std::path::Path, config: policy::config::Config) -> anyhow::Result<ExitCode> {
    let dir = config
        .tls
        .ca_dir
        .with_context(|| format!("{}: no [tls] ca_dir is configured", path.display()))?;
    let ca = mediator::tls::load_ca(&dir)?;
    print!("{}", ca.cert_pem());
    Ok(ExitCode::SUCCESS)
}

/// `mediator check`: what a start would load too (the CA, the PAC, credential files),
/// then a summary.
fn check(path: &std::path::Path, cfg: &policy::config::Config) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    let notes = match rt.block_on(mediator::check_resources(cfg)) {
        Ok(notes) => notes,
        Err(e) => {
            mediator::say!(Error, "{}: {:#}", path.display(), anyhow::Error::from(e));
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
    text.push_str(&format!("limits: {}\n", mediator::limits_of(cfg)));
    if cfg.upstream.mode == policy::config::UpstreamMode::System {
        match system_upstream(cfg) {
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

/// The mediator itself, as a service (`mediator::service::serve`).
fn serve(config: Option<PathBuf>, watch_config: bool) -> anyhow::Result<ExitCode> {
    let path = config.context("--config FILE is required (or try `mediator demo`)")?;
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
    let served = mediator::service::serve::serve(config, text, path, watch_config);
    let (log, broken) = rt.block_on(served)?;
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
        .map_err(|e| format!("upstream: system: {:#}", anyhow::Error::from(e)))
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
