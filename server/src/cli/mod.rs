//! Command-line interface: argument definitions and dispatch to one module per command.

mod bench;
mod devices;
mod load;
mod ops;
mod plan;
mod report;
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
    /// Run a graph (or a dataset through it) and print its outputs.
    Run(RunArgs),
    /// Measure throughput, latency, utilisation, pipeline bubbles and memory.
    Bench(BenchArgs),
    /// Print the execution plan: passes, buffers, memory, stages.
    Plan(PlanArgs),
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

/// How a graph is executed: batching, pipelining, overlap, fusion.
#[derive(clap::Args, Debug, Clone)]
pub struct ExecArgs {
    /// Samples per batch (every symbolic dimension is bound to batch / microbatches).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Micro-batches per batch.
    #[arg(long, default_value_t = 1)]
    pub microbatches: usize,
    /// Pipeline stages, each on its own device (GPipe schedule).
    #[arg(long, default_value_t = 1)]
    pub stages: usize,
    /// Input staging slots: the host uploads this many micro-batches ahead.
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// Turn off fusion of elementwise chains and epilogues (to measure its gain).
    #[arg(long)]
    pub no_fuse: bool,
    /// Partition stages by measured pass times (one profiling run) instead of the cost model.
    #[arg(long)]
    pub profile: bool,
}

impl ExecArgs {
    /// The engine's run configuration.
    pub fn config(&self) -> sluice_engine::runtime::session::RunConfig {
        sluice_engine::runtime::session::RunConfig {
            batch: self.batch,
            microbatches: self.microbatches,
            stages: self.stages,
            prefetch: self.prefetch,
            fuse: !self.no_fuse,
            profile: self.profile,
        }
    }
}

/// Arguments of `sluice run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Graph file.
    pub graph: PathBuf,
    /// Execution settings.
    #[command(flatten)]
    pub exec: ExecArgs,
    /// An input from a .npy file: NAME=FILE.npy (repeatable). A batched input may hold any
    /// number of samples on axis 0 (a dataset). Inputs not given are random.
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
    /// Write a Chrome trace (Perfetto) of the run.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

/// Arguments of `sluice bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Graph file.
    pub graph: PathBuf,
    /// Execution settings.
    #[command(flatten)]
    pub exec: ExecArgs,
    /// Measured batches (after one warm-up batch).
    #[arg(long, default_value_t = 10)]
    pub reps: usize,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
    /// Write a Chrome trace (Perfetto) of the measured batches.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

/// Arguments of `sluice plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// Graph file.
    pub graph: PathBuf,
    /// Samples per batch.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Micro-batches per batch.
    #[arg(long, default_value_t = 1)]
    pub microbatches: usize,
    /// Pipeline stages.
    #[arg(long, default_value_t = 1)]
    pub stages: usize,
    /// Plan without fusion.
    #[arg(long)]
    pub no_fuse: bool,
    /// Print the plan as JSON (kernel sources included).
    #[arg(long)]
    pub json: bool,
}

/// Runs a parsed command line.
pub fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(&args),
        Command::Bench(args) => bench::bench(&args),
        Command::Plan(args) => plan::plan(&args),
        Command::Validate { graph, json } => validate::validate(&graph, json),
        Command::Devices { json } => devices::devices(json),
        Command::Ops { json } => ops::ops(json),
    }
}
