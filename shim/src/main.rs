//! `shim` binary: parse flags, confine, run, and leave with the command's status.

use std::process::ExitCode;

use clap::Parser;
use shim::{Cli, Settings};

fn main() -> ExitCode {
    match run() {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX)),
        Err(e) => {
            // Every message already names its cause; `{:#}` would repeat it.
            eprintln!("shim: {e}");
            ExitCode::from(shim::EXIT_SHIM_FAILURE as u8)
        }
    }
}

fn run() -> anyhow::Result<i32> {
    let settings = Settings::from_cli(Cli::parse())?;
    Ok(shim::run(&settings)?)
}
