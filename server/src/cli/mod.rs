//! Command-line interface: argument definitions and dispatch to one module per command.

mod autotune;
mod bench;
mod devices;
mod load;
mod onnx;
mod ops;
mod plan;
mod report;
mod run;
mod train;
mod validate;

use sluice_engine::exec::device::Device as ExecDevice;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use sluice_engine::gpu::PassTiming;
use std::path::PathBuf;
use std::process::ExitCode;

/// Sluice: a dataflow engine that keeps GPUs busy.
#[derive(Parser, Debug)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `--output-dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputDtype {
    /// float32 files.
    F32,
    /// float16 files.
    F16,
}

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The best GPU adapter (or `SLUICE_ADAPTER`).
    Gpu,
    /// The fast CPU device: multi-threaded GEMM and fused units, the reference elsewhere.
    Cpu,
    /// The CPU reference implementation (the oracle every device is tested against).
    Reference,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the API (and the editor, when built) with an in-process worker.
    Serve(crate::serve::ServeArgs),
    /// Join a server as a remote GPU worker.
    Worker(crate::worker::WorkerArgs),
    /// Run a graph (or a dataset through it) and print its outputs.
    Run(RunArgs),
    /// Train a graph with a training section on a dataset (.npy arrays or CSV).
    Train(TrainArgs),
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
        /// The engine's limits on graphs.
        #[command(flatten)]
        limits: crate::limits::LimitArgs,
    },
    /// List GPU adapters with their features and limits, and the measured rates the
    /// stage partitioner uses (calibrated once per adapter and kept).
    Devices {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Measure the rates again instead of using the kept calibration.
        #[arg(long)]
        recalibrate: bool,
    },
    /// Show the matmul kernels the autotuner chose for each adapter and problem class,
    /// with every variant it tried and its time (the cache compiles read and fill).
    Autotune {
        /// Print JSON (the cache file's contents).
        #[arg(long)]
        json: bool,
        /// Delete the cache, so that the next compiles measure again.
        #[arg(long)]
        clear: bool,
    },
    /// Import an ONNX model: write a graph file and its weights (safetensors).
    Import {
        /// The `.onnx` model (external data files are read from its folder).
        model: PathBuf,
        /// Folder for MODEL.json and MODEL.safetensors (default: here).
        #[arg(short, long)]
        out: Option<PathBuf>,
        /// A size for one of the model's named dimensions, NAME=SIZE (repeatable): for
        /// models whose operators need a size the model leaves open. The others stay
        /// symbols (the batch).
        #[arg(long = "dim", value_name = "NAME=SIZE")]
        dims: Vec<String>,
        /// Replace files that exist.
        #[arg(long)]
        force: bool,
        /// The engine's limits on graphs.
        #[command(flatten)]
        limits: crate::limits::LimitArgs,
    },
    /// Export a graph (or an ONNX model) with its weights as an ONNX model.
    Export {
        /// Graph file (its weights file or seed is used) or `.onnx` model.
        graph: PathBuf,
        /// The `.onnx` file to write.
        #[arg(short, long)]
        out: PathBuf,
        /// Replace the file if it exists.
        #[arg(long)]
        force: bool,
        /// The engine's limits on graphs.
        #[command(flatten)]
        limits: crate::limits::LimitArgs,
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
    /// Micro-batches in flight per device: the host uploads this many ahead of compute.
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// Turn off fusion of elementwise chains and epilogues (to measure its gain).
    #[arg(long)]
    pub no_fuse: bool,
    /// Partition stages by measured pass times (one profiling run) instead of the cost model.
    #[arg(long)]
    pub profile: bool,
    /// Numeric precision: f32; mixed (f16 storage, f32 accumulation and norms); f16 (f16
    /// arithmetic too, needs shader-f16).
    #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
    pub precision: PrecisionArg,
    /// How 16-bit floats are stored: native f16 (needs shader-f16), packed pairs in u32
    /// (every adapter), or auto (native where available).
    #[arg(long, value_enum, default_value_t = HalfArg::Auto)]
    pub f16_storage: HalfArg,
    /// Where to run: the GPU (one device per stage), the fast CPU device or the CPU
    /// reference (one CPU device per stage, through the same batching and pipelines).
    #[arg(long, value_enum, default_value_t = Device::Gpu)]
    pub device: Device,
    /// Which micro-batches the GPU times pass by pass with timestamp queries: `every`,
    /// `off`, or a number n (the first two, then one in n; the default is 16). Each
    /// timestamp can cost the device a wait; untimed micro-batches report the latest
    /// measured pass times.
    #[arg(long, value_parser = parse_pass_timing, value_name = "every|off|N")]
    pub pass_timing: Option<PassTiming>,
    /// The same as `--pass-timing off`: a micro-batch's events come from host completion
    /// times (what per-pass telemetry costs is the difference).
    #[arg(long, conflicts_with = "pass_timing")]
    pub no_pass_timing: bool,
    /// The engine's limits on graphs and runs.
    #[command(flatten)]
    pub limits: crate::limits::LimitArgs,
}

/// `--pass-timing`: `every`, `off`, or how many micro-batches one timed one stands for.
fn parse_pass_timing(text: &str) -> Result<PassTiming, String> {
    match text {
        "every" => Ok(PassTiming::Every),
        "off" => Ok(PassTiming::Off),
        n => match n.parse::<u32>() {
            Ok(1) => Ok(PassTiming::Every),
            Ok(n) if n >= 2 => Ok(PassTiming::Sampled(n)),
            _ => Err(format!(
                "'{text}' is not 'every', 'off' or a whole number of micro-batches from 1 up"
            )),
        },
    }
}

/// `--precision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// f32 everywhere.
    F32,
    /// f16 storage and f16 accumulation.
    F16,
    /// f16 storage, f32 accumulation.
    Mixed,
}

impl PrecisionArg {
    /// The engine's precision.
    pub fn engine(self) -> sluice_engine::plan::Precision {
        use sluice_engine::plan::Precision;
        match self {
            PrecisionArg::F32 => Precision::F32,
            PrecisionArg::F16 => Precision::F16,
            PrecisionArg::Mixed => Precision::Mixed,
        }
    }
}

/// `--f16-storage`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum HalfArg {
    /// Native where the adapter has shader-f16, else packed.
    Auto,
    /// WGSL f16 arrays.
    Native,
    /// f16 pairs packed in u32.
    Packed,
}

impl HalfArg {
    /// The engine's choice (None = auto).
    pub fn engine(self) -> Option<sluice_engine::plan::HalfStorage> {
        use sluice_engine::plan::HalfStorage;
        match self {
            HalfArg::Auto => None,
            HalfArg::Native => Some(HalfStorage::Native),
            HalfArg::Packed => Some(HalfStorage::Packed),
        }
    }
}

/// Checks that a run's counts are at least 1 (the engine's limits bound them above).
pub fn check_counts(
    batch: usize,
    microbatches: usize,
    stages: usize,
    prefetch: usize,
) -> Result<()> {
    for (flag, value) in [
        ("--batch", batch),
        ("--microbatches", microbatches),
        ("--stages", stages),
        ("--prefetch", prefetch),
    ] {
        if value == 0 {
            anyhow::bail!("{flag} must be at least 1");
        }
    }
    Ok(())
}

impl ExecArgs {
    /// Checks the settings and the graph's inputs at `samples` samples (a whole dataset)
    /// against the engine's limits, before anything is allocated.
    pub fn check(&self, graph: &sluice_engine::Graph, samples: usize) -> Result<()> {
        check_counts(self.batch, self.microbatches, self.stages, self.prefetch)?;
        sluice_engine::exec::check_run(graph, &self.config(), Some(samples), &self.limits.0)?;
        Ok(())
    }

    /// The engine's run configuration.
    pub fn config(&self) -> sluice_engine::exec::RunConfig {
        sluice_engine::exec::RunConfig {
            batch: self.batch,
            microbatches: self.microbatches,
            stages: self.stages,
            prefetch: self.prefetch,
            fuse: !self.no_fuse,
            profile: self.profile,
            precision: self.precision.engine(),
            half: self.f16_storage.engine(),
        }
    }

    /// Which micro-batches the GPU times pass by pass.
    pub fn pass_timing(&self) -> PassTiming {
        if self.no_pass_timing {
            PassTiming::Off
        } else {
            self.pass_timing.unwrap_or(PassTiming::DEFAULT)
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
    /// number of samples on axis 0 (a dataset). Every input must be given unless
    /// --seed-inputs is.
    #[arg(long = "input", value_name = "NAME=FILE")]
    pub inputs: Vec<String>,
    /// Fill the inputs not given with seeded random values (class labels and indices
    /// inside their valid range), and say which: a run on made-up inputs, for trying a
    /// graph out.
    #[arg(long)]
    pub seed_inputs: bool,
    /// Element type of the written .npy files.
    #[arg(long, value_enum, default_value_t = OutputDtype::F32)]
    pub output_dtype: OutputDtype,
    /// Write each output as DIR/NAME.npy.
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Seed of the values --seed-inputs generates.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Write a Chrome trace (Perfetto) of the run.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

/// Arguments of `sluice train`. Settings not given come from the graph's training
/// section, then from the defaults.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Graph file with a "training" section.
    pub graph: PathBuf,
    /// Training data: INPUT=FILE.npy for each graph input it feeds (sample axis 0), or one
    /// FILE.csv (features feed --csv-features, labels --csv-labels).
    #[arg(long, value_name = "INPUT=FILE.npy|FILE.csv", required = true, num_args = 1..)]
    pub data: Vec<String>,
    /// Validation data, as --data (default: --val-fraction of --data, split with --seed).
    #[arg(long, value_name = "INPUT=FILE.npy|FILE.csv", num_args = 1..)]
    pub val: Option<Vec<String>>,
    /// Fraction of --data held out for validation when --val is not given.
    #[arg(long, default_value_t = 0.2)]
    pub val_fraction: f64,
    /// Passes over the training data (default: the training section's, else 10).
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Samples per step (default: the training section's, else 32). A partial last
    /// batch of an epoch is dropped.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Micro-batches per step: gradients are accumulated over them.
    #[arg(long, default_value_t = 1)]
    pub microbatches: usize,
    /// Pipeline stages, each on its own device: the joint forward + backward graph is
    /// cut so that a layer's forward and backward passes share a stage.
    #[arg(long, default_value_t = 1)]
    pub stages: usize,
    /// How pipeline stages order a step's micro-batches: 1f1b (stashes bounded by the
    /// stage count) or gpipe (every forward, then every backward).
    #[arg(long, default_value = "1f1b")]
    pub schedule: sluice_engine::exec::schedule::TrainSchedule,
    /// Samples per evaluation pass over the validation data.
    #[arg(long, default_value_t = 256)]
    pub eval_batch: usize,
    /// Optimiser: sgd, adam or adamw (default: the training section's).
    #[arg(long)]
    pub optimizer: Option<String>,
    /// Learning rate.
    #[arg(long)]
    pub lr: Option<f64>,
    /// SGD momentum.
    #[arg(long)]
    pub momentum: Option<f64>,
    /// SGD with Nesterov momentum.
    #[arg(long)]
    pub nesterov: bool,
    /// Weight decay (L2 for SGD and Adam, decoupled for AdamW).
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Clip the gradients' global L2 norm.
    #[arg(long)]
    pub clip_grad_norm: Option<f64>,
    /// Seed of the validation split, the per-epoch shuffles and the dropout masks.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Numeric precision of the devices' storage (weights stay f32 masters).
    #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
    pub precision: PrecisionArg,
    /// How 16-bit floats are stored.
    #[arg(long, value_enum, default_value_t = HalfArg::Auto)]
    pub f16_storage: HalfArg,
    /// Turn off fusion.
    #[arg(long)]
    pub no_fuse: bool,
    /// Where to train: the GPU, the fast CPU device or the CPU reference.
    #[arg(long, value_enum, default_value_t = Device::Gpu)]
    pub device: Device,
    /// Write a checkpoint (weights, optimiser state, progress) to DIR after every epoch.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// Resume from a checkpoint folder: continue after its last epoch, up to --epochs.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Where to write the trained weights (default: GRAPH.trained.safetensors here).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Append one JSON line of metrics per epoch to FILE.
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,
    /// CSV: the graph input the feature columns feed.
    #[arg(long, default_value = "x")]
    pub csv_features: String,
    /// CSV: the graph input the label column feeds.
    #[arg(long, default_value = "labels")]
    pub csv_labels: String,
    /// CSV: the label column, by name or index from 0 (default: the last).
    #[arg(long)]
    pub label_column: Option<String>,
    /// CSV: the first line is data, not a header.
    #[arg(long)]
    pub no_header: bool,
    /// Print one JSON line per epoch instead of text.
    #[arg(long)]
    pub json: bool,
    /// The engine's limits on graphs, runs and datasets.
    #[command(flatten)]
    pub limits: crate::limits::LimitArgs,
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
    /// Seed of the random inputs (a benchmark runs on seeded inputs, and says so).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
    /// Write a Chrome trace (Perfetto) of the measured batches.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Keep this input on the device (repeatable): uploaded once before the warm-up and
    /// left out of every measured batch, which then is a run of its own reading the kept
    /// value (device-resident inputs).
    #[arg(long, value_name = "INPUT")]
    pub keep: Vec<String>,
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
    /// Numeric precision.
    #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
    pub precision: PrecisionArg,
    /// 16-bit storage for `f16`/`mixed` (auto plans packed, which every adapter runs).
    #[arg(long, value_enum, default_value_t = HalfArg::Auto)]
    pub f16_storage: HalfArg,
    /// Also show the WGSL passes the GPU backend lowers each step to (with `--json`:
    /// their sources).
    #[arg(long)]
    pub kernels: bool,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    /// Plan the joint forward + backward graph of this loss output (an f32 scalar): the
    /// gradients of every weight on a path to it become extra outputs.
    #[arg(long, value_name = "LOSS")]
    pub train: Option<String>,
    /// The engine's limits on graphs and runs.
    #[command(flatten)]
    pub limits: crate::limits::LimitArgs,
}

/// The devices a run uses, one per stage: GPU devices (with the adapter's calibrated
/// rates when the run is pipelined), fast CPU devices or CPU reference devices.
pub fn open_devices(
    device: Device,
    stages: usize,
    pass_timing: PassTiming,
) -> Result<Vec<Box<dyn ExecDevice>>> {
    Ok(match device {
        Device::Cpu => (0..stages)
            .map(|_| Box::new(sluice_engine::cpu::CpuDevice::fast()) as Box<dyn ExecDevice>)
            .collect(),
        Device::Reference => (0..stages)
            .map(|_| Box::new(sluice_engine::cpu::CpuDevice::new()) as Box<dyn ExecDevice>)
            .collect(),
        Device::Gpu => {
            let mut devices = pollster::block_on(sluice_engine::gpu::GpuDevice::open_many(stages))?;
            for d in &mut devices {
                d.pass_timing = pass_timing;
                if stages > 1 {
                    d.rates = Some(crate::rates::rates_for(&d.ctx, false)?);
                }
            }
            devices
                .into_iter()
                .map(|d| Box::new(d) as Box<dyn ExecDevice>)
                .collect()
        }
    })
}

impl Cli {
    /// Whether the command is a long-running service (`serve`, `worker`).
    pub fn is_service(&self) -> bool {
        matches!(self.command, Command::Serve(_) | Command::Worker(_))
    }
}

/// Runs a parsed command line.
pub fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => crate::serve::serve(&args),
        Command::Worker(args) => crate::worker::worker(&args),
        Command::Run(args) => run::run(&args),
        Command::Train(args) => train::train(&args),
        Command::Bench(args) => bench::bench(&args),
        Command::Plan(args) => plan::plan(&args),
        Command::Validate {
            graph,
            json,
            limits,
        } => validate::validate(&graph, json, &limits.0),
        Command::Devices { json, recalibrate } => devices::devices(json, recalibrate),
        Command::Autotune { json, clear } => autotune::show(json, clear),
        Command::Import {
            model,
            out,
            dims,
            force,
            limits,
        } => onnx::import(&model, out.as_deref(), &dims, force, &limits.0),
        Command::Export {
            graph,
            out,
            force,
            limits,
        } => onnx::export(&graph, &out, force, &limits.0),
        Command::Ops { json } => ops::ops(json),
    }
}
