//! `sluice`: run, validate and inspect Sluice graphs from the command line.

mod cli;
mod npy;
mod protocol;
mod serve;
mod worker;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Exit quietly when stdout is closed early (`sluice ops | head`), like other CLI tools.
    #[cfg(unix)]
    // SAFETY: restoring the default SIGPIPE disposition before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                .unwrap_or_else(|_| "warn,wgpu_hal=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = cli::Cli::parse();
    match cli::dispatch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
