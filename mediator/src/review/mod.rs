//! `mediator diff` and `mediator test` (design section 21): a reviewer's tools for a
//! change of policy before it ships.
//!
//! - `diff` ([`diff()`]): two configuration files, or a running mediator's authorities
//!   (`--admin`) and a file, reviewed by `policy::review`; the text or JSON of
//!   `render.rs`; exit status 0 unchanged, 1 changed without widening, 3 widened.
//! - `test` ([`test()`]): `[[expect]]` assertions judged by `mediator explain`'s steps
//!   (`crate::explain`, the steps of live traffic) with resolution stubbed by the file's
//!   `hosts` (`expect.rs`); exit status 0 when every expectation holds, 1 otherwise.
//!
//! Both exit 2 when they cannot run ([`Error`]): a configuration that does not validate
//! (every problem with its location, as `mediator check` prints them), an expectations
//! file that does not read, an admin API that cannot be reached or refuses (`remote.rs`).
//! Neither reads a credential's secret, nor reaches anything but the admin API it is
//! given.

mod expect;
mod remote;
mod render;

use std::path::{Path, PathBuf};

use policy::config::Config;
use policy::review::{Outcome, Side};

use crate::error::Error;

pub use remote::TOKEN_ENV;

/// `mediator diff`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct DiffArgs {
    /// Take OLD from a running mediator's admin API (`http://127.0.0.1:9901`,
    /// `127.0.0.1:9901`, or its socket's path): the authorities it serves now. Its token,
    /// when it needs one, is read from the environment variable MEDIATOR_ADMIN_TOKEN.
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// OLD NEW: two configuration files; with --admin, NEW alone.
    #[arg(value_name = "FILE", num_args = 1..=2, required = true)]
    pub files: Vec<PathBuf>,
}

/// `mediator test`'s arguments (the configuration is the global `--config`).
#[derive(Debug, Clone, clap::Args)]
pub struct TestArgs {
    /// Judge with the authorities a running mediator serves (its admin API, as for
    /// `diff --admin`) instead of --config.
    #[arg(long, value_name = "URL", conflicts_with = "config")]
    pub admin: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// The expectations: TOML with `[[expect]]` tables and an optional `hosts` table.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// What `diff` or `test` prints on standard output, and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The text (or JSON) to print.
    pub text: String,
    /// The exit status: `diff` 0, 1 or 3; `test` 0 or 1.
    pub code: u8,
}

/// The exit status of a review's outcome: 0 unchanged, 1 changed without widening, 3
/// widened (2 is "could not run").
pub fn exit_code(outcome: Outcome) -> u8 {
    match outcome {
        Outcome::Unchanged => 0,
        Outcome::Narrowed => 1,
        Outcome::Widened => 3,
    }
}

/// `mediator diff`: reviews NEW against OLD (a file, or `--admin`).
///
/// # Errors
/// [`Error::ReadConfig`] or [`Error::Config`] (every problem with its location) for a
/// file; [`Error::Review`] for wrong arguments or an admin API that cannot be asked.
pub fn diff(args: &DiffArgs) -> Result<Report, Error> {
    let (old, new_path, old_label) = match (&args.admin, args.files.as_slice()) {
        (Some(url), [new]) => (remote::fetch(url)?.side(), new, format!("{url} (running)")),
        (None, [old, new]) => (
            Side::of_config(&read_config(old)?),
            new,
            old.display().to_string(),
        ),
        (Some(_), _) => {
            return Err(Error::review(
                "with --admin give one file, NEW: OLD is what the running mediator serves",
            ));
        }
        (None, _) => {
            return Err(Error::review(
                "give two files, OLD and NEW (or --admin URL and NEW)",
            ));
        }
    };
    let new = Side::of_config(&read_config(new_path)?);
    let review = policy::review::diff(&old, &new)?;
    let code = exit_code(review.outcome);
    let labels = render::Labels {
        old: &old_label,
        new: &new_path.display().to_string(),
    };
    let text = if args.json {
        render::json(&review, &labels, code)
    } else {
        render::text(&review, &labels, code)
    };
    Ok(Report { text, code })
}

/// `mediator test`: judges the expectations of `args.file` under `config` (or
/// `--admin`).
///
/// # Errors
/// As [`diff()`], and [`Error::Review`] when the expectations file does not read (an
/// unknown key is named).
pub fn test(args: &TestArgs, config: Option<&Path>) -> Result<Report, Error> {
    let expectations = expect::read(&args.file)?;
    let (config, against) = match (&args.admin, config) {
        (Some(url), _) => (remote::fetch(url)?.config()?, format!("{url} (running)")),
        (None, Some(path)) => (read_config(path)?, path.display().to_string()),
        (None, None) => {
            return Err(Error::review(
                "give the policy to test: --config FILE, or --admin URL",
            ));
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let results = runtime.block_on(expect::judge(&config, &expectations));
    let failed = results.iter().filter(|r| !r.passed()).count();
    let text = if args.json {
        expect::json(&results, &args.file, &against)
    } else {
        expect::text(&results, &args.file, &against)
    };
    Ok(Report {
        text,
        code: u8::from(failed > 0),
    })
}

/// Reads and validates a configuration file, as `mediator check` does but without
/// loading the credentials' secrets (a reviewer's machine has none).
fn read_config(path: &Path) -> Result<Config, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(policy::config::parse(&text, &path.display().to_string())?)
}
