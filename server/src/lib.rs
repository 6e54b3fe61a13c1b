//! Sluice's command line and server as a library: the `sluice` binary is a thin shell
//! around [`main`]. `cli` has one module per command, `serve` the axum server, `worker`
//! `sluice worker`, `limits` the engine's limits as flags, `rates` the kept calibrations
//! of devices, `tuning` the kept matmul tunings, `npy` reading and writing `.npy` files.
//! The wire types both ends of the API speak live in the `sluice-api` crate; every rule
//! about graphs, plans and runs comes from the engine.

pub mod cli;
pub mod files;
pub mod limits;
pub mod npy;
pub mod rates;
pub mod serve;
pub mod tuning;
pub mod worker;

use clap::Parser;
use std::process::ExitCode;

/// Parses the command line, sets up logging and runs the command.
pub fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // Commands that print to a pipe exit quietly when it closes (`sluice ops | head`);
    // the server and the worker keep the default of ignoring SIGPIPE, so a client that
    // hangs up mid-response cannot kill them.
    #[cfg(unix)]
    if !args.is_service() {
        // SAFETY: restoring the default SIGPIPE disposition before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                .unwrap_or_else(|_| "warn,wgpu_hal=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    tuning::install();
    match cli::dispatch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
