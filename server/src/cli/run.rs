//! `sluice run`: load weights and inputs (a dataset of any number of samples along the
//! batch axis), run it on the GPU or the CPU device (micro-batched, prefetched, optionally
//! pipelined, through the engine's one execution core), print a summary per output and
//! write .npy files and a trace.

use super::{load, report, RunArgs};
use crate::npy;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use sluice_engine::exec::{dataset, RunContext, Session, Values};
use sluice_engine::graph::Graph;
use sluice_engine::Tensor;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A progress bar that appears only when the work takes more than a second.
pub struct Progress {
    start: Instant,
    bar: Mutex<Option<ProgressBar>>,
    label: &'static str,
}

impl Progress {
    /// A new, hidden progress bar.
    pub fn new(label: &'static str) -> Progress {
        Progress {
            start: Instant::now(),
            bar: Mutex::new(None),
            label,
        }
    }

    /// Reports `done` of `total`.
    pub fn update(&self, done: usize, total: usize) {
        if self.start.elapsed() < Duration::from_secs(1) || total < 2 {
            return;
        }
        let Ok(mut slot) = self.bar.lock() else {
            return;
        };
        let bar = slot.get_or_insert_with(|| {
            let b = ProgressBar::new(total as u64);
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix} [{bar:40}] {pos}/{len} micro-batches ({eta})",
            ) {
                b.set_style(style.progress_chars("=> "));
            }
            b.set_prefix(self.label);
            b
        });
        bar.set_position(done as u64);
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Ok(mut slot) = self.bar.lock() {
            if let Some(b) = slot.take() {
                b.finish_and_clear();
            }
        }
    }
}

/// A run's dataset and the inputs in it that were seeded rather than given.
pub struct Inputs {
    /// Every input of the graph.
    pub values: Values,
    /// The inputs filled with seeded random values, in the graph's order (empty unless
    /// seeding was asked for).
    pub seeded: Vec<String>,
}

/// Reads `--input` files; the inputs not given are filled with seeded random data (of
/// `default_n` samples where no batched input is given) when `seed` is given, and are an
/// error naming them and how to give them when it is not: no input is invented unasked.
pub fn inputs(
    graph: &Graph,
    specs: &[String],
    seed: Option<u64>,
    default_n: usize,
) -> Result<Inputs> {
    let mut given = HashMap::new();
    for spec in specs {
        let Some((name, file)) = spec.split_once('=') else {
            bail!("--input takes NAME=FILE.npy, got '{spec}'");
        };
        if graph.input_type(name).is_none() {
            let known: Vec<&str> = graph.inputs.iter().map(|(n, _)| n.as_str()).collect();
            bail!(
                "--input {name}: the graph has no input '{name}' (inputs: {})",
                known.join(", ")
            );
        }
        let t = npy::read(&PathBuf::from(file)).with_context(|| format!("--input {name}"))?;
        given.insert(name.to_string(), t);
    }
    let seeded = dataset::missing_inputs(graph, &given);
    if let (None, Some(first)) = (seed, seeded.first()) {
        bail!(
            "input '{first}' was not given (inputs not given: {}): pass --input {first}=FILE.npy, \
             or --seed-inputs to fill the inputs not given with seeded random values",
            seeded.join(", ")
        );
    }
    Ok(Inputs {
        values: dataset::complete(graph, given, seed.unwrap_or(0), default_n)?,
        seeded,
    })
}

/// The line that says which inputs hold seeded random values, if any.
pub fn seeded_note(seeded: &[String], seed: u64) -> Option<String> {
    (!seeded.is_empty()).then(|| {
        format!(
            "inputs seeded with random values (seed {seed}), not data: {}",
            seeded.join(", ")
        )
    })
}

/// Runs the command.
pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let Some(graph) = load::graph_or_report(&args.graph, &args.exec.limits.0)? else {
        return Ok(ExitCode::FAILURE);
    };
    let e = &args.exec;
    e.check(&graph, e.batch)?;
    let Inputs {
        values: data,
        seeded,
    } = inputs(
        &graph,
        &args.inputs,
        args.seed_inputs.then_some(args.seed),
        e.batch,
    )?;
    let note = seeded_note(&seeded, args.seed);
    if let Some(note) = &note {
        eprintln!("note: {note} (--seed-inputs)");
    }
    let config = e.config();
    let progress = Progress::new("running");
    let started = Instant::now();
    let devices = super::open_devices(e.device, config.stages, e.pass_timing())?;
    // The weights are sized against the devices before they are made or read.
    sluice_engine::exec::device::check_weights_fit(&graph, config.precision, &devices)?;
    let weights = load::weights(&args.graph, &graph)?;
    let mut session = Session::compile_blocking(&graph, &weights, &config, devices)?;
    let update = |d: usize, t: usize| progress.update(d, t);
    let ctx = RunContext {
        progress: Some(&update),
        ..RunContext::new("run")
    };
    let report = session.run_blocking(&data, &ctx)?;
    progress.finish();
    let precision_report = if e.precision != super::PrecisionArg::F32 {
        let devices = super::open_devices(e.device, config.stages, e.pass_timing())?;
        Some(pollster::block_on(sluice_engine::precision::against_f32(
            &graph,
            &weights,
            &config,
            devices,
            &data,
            &report.outputs,
        ))?)
    } else {
        None
    };
    let half_path = session.plan_options();
    let device_name = session.device_names().join(", ");
    if let Some(path) = &args.trace {
        report::write_trace(path, &report, &session)?;
    }
    let outputs = &report.outputs;
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(dir) = &args.output {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let files = sluice_api::output_files(outputs.iter().map(|(n, _)| n.as_str()));
        for ((_, t), file) in outputs.iter().zip(files) {
            let file = dir.join(format!("{file}.npy"));
            match args.output_dtype {
                super::OutputDtype::F32 => npy::write(&file, t)?,
                super::OutputDtype::F16 => npy::write_f16(&file, t)?,
            }
        }
    }
    let head = |t: &Tensor, n: usize| -> Vec<f32> { t.to_f32_vec().into_iter().take(n).collect() };
    if args.json {
        let outs: Vec<_> = outputs
            .iter()
            .map(|(n, t)| json!({ "name": n, "shape": t.shape, "dtype": t.dtype(), "first": head(t, 8), "checksum": t.checksum() }))
            .collect();
        println!(
            "{}",
            json!({ "graph": graph.doc.name, "batch": e.batch, "device": device_name, "seconds": elapsed,
                    "precision": e.precision.engine(), "f16_storage": (e.precision != super::PrecisionArg::F32).then_some(half_path.half),
                    "outputs": outs, "metrics": report.metrics, "micro_batches": report.micro_batches,
                    "stages": session.stage_summary(), "written_to": args.output,
                    "precision_report": precision_report,
                    "seeded_inputs": seeded, "seed": args.seed_inputs.then_some(args.seed) })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "graph '{}', batch {}, on {device_name}",
        graph.doc.name, e.batch
    );
    if let Some(note) = &note {
        println!("  {note}");
    }
    for (n, t) in outputs {
        let first: Vec<String> = head(t, 6).iter().map(|v| format!("{v:.6}")).collect();
        println!(
            "  {n}: {} {:?}  first [{}]  checksum {:.6}",
            t.dtype(),
            t.shape,
            first.join(", "),
            t.checksum()
        );
    }
    println!("  time: {:.3} ms (compiling included)", elapsed * 1e3);
    let non_finite: usize = outputs.iter().map(|(_, t)| t.non_finite()).sum();
    if non_finite > 0 {
        println!("  warning: {non_finite} output element(s) are NaN or infinite");
    }
    if let Some(errors) = &precision_report {
        println!(
            "  precision {} ({:?} 16-bit storage) against f32 on the same inputs:",
            e.precision.engine().name(),
            half_path.half
        );
        print_precision(errors);
    }
    report::print_metrics(&report, &session);
    match &args.output {
        Some(dir) => println!(
            "  wrote {} .npy file(s) to {}",
            outputs.len(),
            dir.display()
        ),
        None => println!("  (pass --output DIR to write .npy files)"),
    }
    if let Some(t) = &args.trace {
        println!("  trace: {} (open in https://ui.perfetto.dev)", t.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints a precision report.
pub fn print_precision(errors: &[sluice_engine::precision::OutputError]) {
    for err in errors {
        let argmax = err.argmax_agreement.map_or(String::new(), |a| {
            format!(", argmax agreement {:.2}%", 100.0 * a)
        });
        println!(
            "    {}: max abs error {:.3e}, max rel error {:.3e} (elementwise {:.3e}){argmax}, non-finite {}",
            err.name, err.max_abs, err.max_rel, err.max_rel_elementwise, err.non_finite
        );
    }
}
