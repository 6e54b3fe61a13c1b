//! Command-line interface: argument definitions and dispatch to one module per command.

mod devices;
mod load;
mod ops;
mod run;
mod validate;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

/// Sluice: a dataflow engine that keeps GPUs busy.
#[derive(Parser, Debug)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The best GPU adapter (or `SLUICE_ADAPTER`).
    Gpu,
    /// The CPU reference implementation.
    Cpu,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a graph and print its outputs.
    Run(RunArgs),
    /// Check a graph: print inferred shapes, or every problem.
    Validate {
        /// Graph file.
        graph: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List GPU adapters with their features and limits.
    Devices {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List operators and their attributes.
    Ops {
        /// Print JSON (the editor palette's data).
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `sluice run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Graph file.
    pub graph: PathBuf,
    /// Batch size: the value of every symbolic dimension.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// An input from a .npy file: NAME=FILE.npy (repeatable). Others are random.
    #[arg(long = "input", value_name = "NAME=FILE")]
    pub inputs: Vec<String>,
    /// Write each output as DIR/NAME.npy.
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Seed for random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = Device::Gpu)]
    pub device: Device,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs a parsed command line.
pub fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(&args),
        Command::Validate { graph, json } => validate::validate(&graph, json),
        Command::Devices { json } => devices::devices(json),
        Command::Ops { json } => ops::ops(json),
    }
}
