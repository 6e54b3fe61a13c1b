//! `sluice run`: load weights and inputs (a dataset of any number of samples on axis 0),
//! run batch by batch on the GPU (micro-batched, prefetched, optionally pipelined) or the
//! CPU, print a summary per output and write .npy files and a trace.

use super::{load, report, Device, RunArgs};
use crate::npy;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use sluice_engine::graph::Graph;
use sluice_engine::runtime::session::Session;
use sluice_engine::runtime::{self};
use sluice_engine::shape::Dim;
use sluice_engine::{cpu, Tensor};
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

/// Number of samples the inputs hold (axis 0 of batched inputs), checked for agreement.
fn samples(graph: &Graph, inputs: &HashMap<String, Tensor>) -> Result<Option<usize>> {
    let mut n = None;
    for (name, t) in inputs {
        let batched = graph
            .doc
            .inputs
            .get(name)
            .is_some_and(|d| matches!(d.shape.first(), Some(Dim::Sym(_))));
        if batched {
            let rows = *t.shape.first().context("a batched input needs axis 0")?;
            if let Some(m) = n.filter(|&m| m != rows) {
                bail!("input '{name}' has {rows} samples but another input has {m}");
            }
            n = Some(rows);
        }
    }
    Ok(n)
}

/// Reads `--input` files and fills the rest with seeded random data of `default_n` samples.
pub fn inputs(
    graph: &Graph,
    specs: &[String],
    seed: u64,
    default_n: usize,
) -> Result<HashMap<String, Tensor>> {
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
    let n = samples(graph, &given)?.unwrap_or(default_n);
    if n == 0 {
        bail!("the inputs hold no samples");
    }
    let bindings: HashMap<String, usize> = graph.symbols().into_iter().map(|s| (s, n)).collect();
    let bound = graph
        .bind(&bindings)
        .map_err(|p| anyhow::anyhow!("with {n} samples: {p}"))?;
    let mut all = runtime::random_inputs(&bound, seed)?;
    all.extend(given);
    runtime::check_inputs(&bound, &all)?;
    Ok(all)
}

/// Runs the command.
pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let Some(graph) = load::graph_or_report(&args.graph)? else {
        return Ok(ExitCode::FAILURE);
    };
    let e = &args.exec;
    if e.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let data = inputs(&graph, &args.inputs, args.seed, e.batch)?;
    let weights = load::weights(&args.graph, &graph)?;
    let progress = Progress::new("running");
    let started = Instant::now();
    let mut precision_report = None;
    let mut half_path = sluice_engine::runtime::plan::PlanOptions::default();
    let (outputs, device_name, session_report) = match args.device {
        Device::Cpu => {
            let n = samples(&graph, &data)?.unwrap_or(e.batch);
            let bindings: HashMap<String, usize> =
                graph.symbols().into_iter().map(|s| (s, n)).collect();
            let bound = graph.bind(&bindings).map_err(|p| anyhow::anyhow!("{p}"))?;
            (
                cpu::run(&bound, &weights, &data)?,
                "cpu (reference)".to_string(),
                None,
            )
        }
        Device::Gpu => {
            let mut session = Session::new(&graph, &weights, &e.config())?;
            let report = session.run(&data, "run", &|d, t| progress.update(d, t))?;
            progress.finish();
            if e.precision != super::PrecisionArg::F32 {
                let mut f32_cfg = e.config();
                f32_cfg.precision = sluice_engine::runtime::plan::Precision::F32;
                let reference = Session::new(&graph, &weights, &f32_cfg)?.run(
                    &data,
                    "f32 reference",
                    &|_, _| {},
                )?;
                precision_report = Some(sluice_engine::precision::compare(
                    &reference.outputs,
                    &report.outputs,
                ));
            }
            half_path = session.plan_options();
            let name = session.device_names().join(", ");
            if let Some(path) = &args.trace {
                report::write_trace(path, &report, &session)?;
            }
            (report.outputs.clone(), name, Some((report, session)))
        }
    };
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(dir) = &args.output {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, t) in &outputs {
            let file = dir.join(format!("{}.npy", name.replace([':', '/', '\\'], "_")));
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
        let metrics = session_report
            .as_ref()
            .map(|(r, _)| serde_json::to_value(&r.metrics).unwrap_or_default());
        println!(
            "{}",
            json!({ "graph": graph.doc.name, "batch": e.batch, "device": device_name, "seconds": elapsed,
                    "precision": e.precision.engine(), "f16_storage": (e.precision != super::PrecisionArg::F32).then_some(half_path.half),
                    "outputs": outs, "metrics": metrics, "written_to": args.output,
                    "precision_report": precision_report })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "graph '{}', batch {}, on {device_name}",
        graph.doc.name, e.batch
    );
    for (n, t) in &outputs {
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
    if let Some((r, s)) = &session_report {
        report::print_metrics(r, s);
    }
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
