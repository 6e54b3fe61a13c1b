//! `sluice train`: read a dataset (`.npy` arrays or a CSV table), split off a validation
//! set, and train a graph with a training section through the engine's trainer on the GPU
//! or the CPU device — a progress bar with the loss and samples/s, one line per epoch
//! (training loss, validation loss and metrics), a JSON-lines metrics log, checkpoints
//! after every epoch, and the trained weights as a safetensors file `sluice run` accepts.

use super::{load, open_devices, TrainArgs};
use crate::files::{read_bounded, read_text_bounded};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use sluice_engine::exec::Values;
use sluice_engine::gpu::PassTiming;
use sluice_engine::graph::training::{OptimizerConfig, TrainingDoc};
use sluice_engine::graph::Graph;
use sluice_engine::limits::Limits;
use sluice_engine::train::checkpoint::{self, Progress};
use sluice_engine::train::scaler::LossScaler;
use sluice_engine::train::trainer::{Evaluation, PipelineStats, TrainSettings, Trainer};
use sluice_engine::train::{Batching, DataError, Dataset, Feed};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Runs `sluice train`.
pub fn train(args: &TrainArgs) -> Result<ExitCode> {
    let limits = &args.limits.0;
    let Some(mut graph) = load::graph_or_report(&args.graph, limits)? else {
        return Ok(ExitCode::FAILURE);
    };
    let training = training_section(&graph, args)?;
    graph.doc.training = Some(training.clone());
    let epochs = args.epochs.or(training.epochs).unwrap_or(10);
    let batch = args.batch.or(training.batch).unwrap_or(32);
    let feed = Feed::new(graph.inputs.iter().map(|(n, _)| (n.clone(), n.clone())));
    let data = read_dataset(&args.data, args, limits).context("reading --data")?;
    let (train_set, val_set) = match &args.val {
        Some(val) => (
            data,
            read_dataset(val, args, limits).context("reading --val")?,
        ),
        None => data
            .split(args.val_fraction, args.seed)
            .context("splitting off the validation set (--val-fraction)")?,
    };
    for (what, set) in [("training", &train_set), ("validation", &val_set)] {
        set.check_fits(&graph, &feed)
            .with_context(|| format!("the {what} data does not fit the graph"))?;
        for metric in &training.metrics {
            if let Some(classes) = classes_of(&graph, &metric.output) {
                set.check_labels(&metric.labels, classes)
                    .with_context(|| format!("the {what} labels"))?;
            }
        }
    }
    let settings = TrainSettings {
        batch,
        microbatches: args.microbatches,
        stages: args.stages,
        schedule: args.schedule,
        eval_batch: args.eval_batch,
        precision: args.precision.engine(),
        half: args.f16_storage.engine(),
        fuse: !args.no_fuse,
        // 16-bit gradients underflow without it (PyTorch's GradScaler defaults).
        loss_scaling: (args.precision != super::PrecisionArg::F32).then(LossScaler::default),
        seed: args.seed,
    };
    super::check_counts(batch, args.microbatches, args.stages, 1)?;
    // The pipeline's size against the limits before a device is opened for each stage.
    sluice_engine::exec::check_run(
        &graph,
        &sluice_engine::exec::RunConfig {
            batch,
            microbatches: args.microbatches,
            stages: args.stages,
            ..Default::default()
        },
        None,
        limits,
    )?;
    let weights = load::weights(&args.graph, &graph)?;
    let mut step_devices = open_devices(args.device, args.stages + 1, PassTiming::DEFAULT)?;
    let Some(eval_device) = step_devices.pop() else {
        bail!("no device to train on");
    };
    let device_name = step_devices
        .iter()
        .map(|d| d.name())
        .collect::<Vec<_>>()
        .join(", ");
    let status = |s: &str| eprintln!("{s}…");
    let mut trainer = pollster::block_on(Trainer::on_devices(
        &graph,
        weights,
        settings,
        step_devices,
        eval_device,
        &status,
    ))?;
    let mut first_epoch = 0;
    if let Some(dir) = &args.resume {
        let progress = resume(&graph, &mut trainer, dir, args.seed)?;
        first_epoch = progress.epochs_done;
        eprintln!(
            "resumed from {} after epoch {} (step {})",
            dir.display(),
            progress.epochs_done,
            progress.steps
        );
    }
    let mut log = match &args.metrics {
        Some(path) => {
            crate::files::refuse_non_regular(path).context("--metrics")?;
            Some(std::io::BufWriter::new(
                std::fs::File::create(path)
                    .with_context(|| format!("cannot create metrics log {}", path.display()))?,
            ))
        }
        None => None,
    };
    let val_all = whole(&val_set, &feed)?;
    let batching = Batching {
        drop_last: true,
        ..Batching::new(batch, args.seed)
    };
    let started = Instant::now();
    let mut last_eval = None;
    for epoch in first_epoch..epochs {
        let ep = train_set.epoch(epoch as u64, &batching, &feed)?;
        let bar = bar(ep.batches(), epoch, epochs, args.json);
        let epoch_start = Instant::now();
        let mut loss_sum = 0.0;
        let mut pipeline = PipelineFigures::default();
        let mut step_ms = Vec::with_capacity(ep.batches());
        for k in 0..ep.batches() {
            let b = ep.batch(k)?;
            let step_start = Instant::now();
            let step = pollster::block_on(trainer.step(&b))
                .with_context(|| format!("epoch {}, step {}", epoch + 1, k + 1))?;
            step_ms.push(step_start.elapsed().as_secs_f64() * 1e3);
            // The trainer refuses a non-finite loss unless the loss scaler skipped the
            // step (then it is a skipped step, its loss left out of the epoch's mean).
            if step.loss.is_finite() {
                loss_sum += step.loss;
            }
            if let Some(stats) = trainer.pipeline_stats() {
                pipeline.add(stats);
            }
            let rate = ((k + 1) * batch) as f64 / epoch_start.elapsed().as_secs_f64().max(1e-9);
            if let Some(b) = &bar {
                b.set_position(k as u64 + 1);
                b.set_message(format!("loss {:.4}  {rate:.0} samples/s", step.loss));
            }
        }
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        let seconds = epoch_start.elapsed().as_secs_f64();
        let train_loss = loss_sum / ep.batches().max(1) as f64;
        let samples_per_s = (ep.batches() * batch) as f64 / seconds.max(1e-9);
        let eval = pollster::block_on(trainer.evaluate(&val_all)).context("validation")?;
        let line = json!({
            "epoch": epoch + 1,
            "steps": trainer.optimizer().state().step,
            "train_loss": train_loss,
            "val_loss": eval.loss,
            "metrics": eval.metrics.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "samples_per_s": samples_per_s,
            "seconds": seconds,
            // Each step's wall time (upload, forward, backward, readback, update), for
            // benchmarks, and the device the steps ran on.
            "step_ms": step_ms,
            "device": device_name,
            "lr": trainer.optimizer().config().lr_at(trainer.optimizer().state().step.saturating_sub(1)),
            "loss_scale": trainer.loss_scaler().map(|s| s.scale),
            "skipped_steps": trainer.loss_scaler().map(|s| s.skipped),
            "pipeline": pipeline.json(),
        });
        if let Some(w) = &mut log {
            writeln!(w, "{line}").context("writing the metrics log")?;
            w.flush().context("writing the metrics log")?;
        }
        if args.json {
            println!("{line}");
        } else {
            let scaling = trainer
                .loss_scaler()
                .map(|s| format!("  loss scale {} ({} skipped)", s.scale, s.skipped))
                .unwrap_or_default();
            println!(
                "epoch {:>3}/{epochs}  train loss {train_loss:.4}  val loss {:.4}{}  {samples_per_s:.0} samples/s  {seconds:.1} s{scaling}{}",
                epoch + 1,
                eval.loss,
                metrics_text(&eval),
                pipeline.text()
            );
        }
        if let Some(dir) = &args.checkpoint {
            save_checkpoint(dir, &trainer, epoch + 1, args.seed)?;
        }
        last_eval = Some(eval);
    }
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&args.graph));
    let bytes = checkpoint::encode_weights(trainer.params())?;
    crate::files::write_path_durably(&output, &bytes)
        .with_context(|| format!("cannot write the trained weights to {}", output.display()))?;
    if !args.json {
        let summary = last_eval.map(|e| format!(": val loss {:.4}{}", e.loss, metrics_text(&e)));
        println!(
            "trained {} epochs in {:.1} s{}; weights written to {} (set \"params\": {{\"file\": ...}} to run with them)",
            epochs.saturating_sub(first_epoch),
            started.elapsed().as_secs_f64(),
            summary.unwrap_or_default(),
            output.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// An epoch's pipeline figures: the mean measured bubble over its steps and each stage's
/// peak stash.
#[derive(Default)]
struct PipelineFigures {
    last: Option<PipelineStats>,
    steps: usize,
    bubble_sum: f64,
    peak_stash_bytes: Vec<u64>,
}

impl PipelineFigures {
    fn add(&mut self, stats: &PipelineStats) {
        self.steps += 1;
        self.bubble_sum += stats.bubble;
        self.peak_stash_bytes.resize(
            stats
                .peak_stash_bytes
                .len()
                .max(self.peak_stash_bytes.len()),
            0,
        );
        for (peak, &b) in self
            .peak_stash_bytes
            .iter_mut()
            .zip(&stats.peak_stash_bytes)
        {
            *peak = (*peak).max(b);
        }
        self.last = Some(stats.clone());
    }

    fn bubble(&self) -> f64 {
        self.bubble_sum / self.steps.max(1) as f64
    }

    fn json(&self) -> serde_json::Value {
        match &self.last {
            None => serde_json::Value::Null,
            Some(last) => json!({
                "schedule": last.schedule,
                "stages": last.stages,
                "micro_batches": last.micro_batches,
                "bubble": self.bubble(),
                "ideal_bubble": last.ideal_bubble,
                "peak_stash_bytes": self.peak_stash_bytes,
                "peak_stashed": last.peak_stashed,
            }),
        }
    }

    fn text(&self) -> String {
        match &self.last {
            None => String::new(),
            Some(last) => format!(
                "  {} bubble {:.2} (ideal {:.2}), peak stash {} KiB",
                last.schedule.name(),
                self.bubble(),
                last.ideal_bubble,
                self.peak_stash_bytes.iter().max().copied().unwrap_or(0) / 1024
            ),
        }
    }
}

/// The graph's training section with the command line's overrides applied.
fn training_section(graph: &Graph, args: &TrainArgs) -> Result<TrainingDoc> {
    let Some(mut t) = graph.doc.training.clone() else {
        bail!(
            "{} has no \"training\" section naming its loss (see docs/graph-format.md)",
            args.graph.display()
        );
    };
    let mut o: OptimizerConfig = match &args.optimizer {
        Some(kind) if kind != t.optimizer.kind() => {
            let mut fresh = OptimizerConfig::named(kind).map_err(anyhow::Error::msg)?;
            fresh.schedule = t.optimizer.schedule;
            fresh
        }
        _ => t.optimizer,
    };
    for (flag, value) in [
        ("lr", args.lr),
        ("weight_decay", args.weight_decay),
        ("momentum", args.momentum),
        ("clip_grad_norm", args.clip_grad_norm),
    ] {
        if let Some(v) = value {
            o.set(flag, v)
                .map_err(|e| anyhow::anyhow!("--{}: {e}", flag.replace('_', "-")))?;
        }
    }
    if args.nesterov {
        match &mut o.rule {
            sluice_engine::graph::training::Rule::Sgd { nesterov, .. } => *nesterov = true,
            _ => bail!("--nesterov: only SGD has Nesterov momentum"),
        }
    }
    o.check().map_err(|(setting, message)| {
        anyhow::anyhow!("optimizer setting '{setting}': {message}")
    })?;
    t.optimizer = o;
    Ok(t)
}

/// The class count of a graph output holding scores (its last dimension).
fn classes_of(graph: &Graph, output: &str) -> Option<usize> {
    let o = graph.outputs.iter().find(|o| o.name == output)?;
    graph.dag[o.node].outputs.get(o.port)?.shape.last()?.known()
}

/// A dataset from `--data`/`--val` specs: `INPUT=FILE.npy` (repeatable), or one CSV file
/// whose features feed `--csv-features` and labels `--csv-labels`.
fn read_dataset(specs: &[String], args: &TrainArgs, limits: &Limits) -> Result<Dataset> {
    // One byte past the limit, so the engine's check names the limit and its flag.
    let max = u64::try_from(limits.max_dataset_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    if let [one] = specs {
        if !one.contains('=') && one.ends_with(".csv") {
            let text = read_text_bounded(Path::new(one), max)
                .with_context(|| format!("cannot read {one}"))?;
            let options = sluice_engine::train::CsvOptions {
                header: !args.no_header,
                label: match &args.label_column {
                    None => sluice_engine::train::LabelColumn::Last,
                    Some(c) => match c.parse::<usize>() {
                        Ok(i) => sluice_engine::train::LabelColumn::Index(i),
                        Err(_) => sluice_engine::train::LabelColumn::Name(c.clone()),
                    },
                },
                classes: None,
            };
            let d = Dataset::from_csv(text.as_bytes(), &options, limits)
                .with_context(|| format!("in {one}"))?;
            let take = |name: &str| {
                d.get(name)
                    .cloned()
                    .with_context(|| format!("{one}: no {name} were read"))
            };
            let arrays = vec![
                (
                    args.csv_features.clone(),
                    take(sluice_engine::train::FEATURES)?,
                ),
                (args.csv_labels.clone(), take(sluice_engine::train::LABELS)?),
            ];
            return Dataset::new(arrays, limits).with_context(|| format!("in {one}"));
        }
    }
    let mut files = Vec::new();
    for spec in specs {
        let Some((name, file)) = spec.split_once('=') else {
            bail!("expected INPUT=FILE.npy (or one FILE.csv), got '{spec}'");
        };
        let bytes =
            read_bounded(Path::new(file), max).with_context(|| format!("cannot read {file}"))?;
        files.push((name.to_string(), bytes));
    }
    let named: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    Dataset::from_npy(&named, limits).map_err(|e| {
        // An array's problem names its file.
        let file = match &e {
            DataError::Array { name, .. } | DataError::Npy { name, .. } => specs
                .iter()
                .find_map(|s| s.split_once('=').filter(|(n, _)| n == name))
                .map(|(_, file)| file.to_string()),
            _ => None,
        };
        let e = anyhow::Error::new(e);
        match file {
            Some(file) => e.context(format!("in {file}")),
            None => e,
        }
    })
}

/// Every sample of `set` as one map of graph inputs, in the dataset's order.
fn whole(set: &Dataset, feed: &Feed) -> Result<Values> {
    let batching = Batching {
        shuffle: false,
        ..Batching::new(set.samples(), 0)
    };
    Ok(set.epoch(0, &batching, feed)?.batch(0)?)
}

fn bar(steps: usize, epoch: usize, epochs: usize, quiet: bool) -> Option<ProgressBar> {
    if quiet || steps < 2 {
        return None;
    }
    let b = ProgressBar::new(steps as u64);
    if let Ok(style) =
        ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} steps  {msg}")
    {
        b.set_style(style.progress_chars("=> "));
    }
    b.set_prefix(format!("{}/{epochs}", epoch + 1));
    Some(b)
}

fn metrics_text(e: &Evaluation) -> String {
    e.metrics
        .iter()
        .map(|(k, v)| format!("  val {k} {:.2}%", 100.0 * v))
        .collect()
}

fn default_output(graph: &Path) -> PathBuf {
    let stem = graph
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("graph");
    PathBuf::from(format!("{stem}.trained.safetensors"))
}

/// Writes the three files of a checkpoint into `dir` (each replaced atomically).
fn save_checkpoint(dir: &Path, trainer: &Trainer, epochs_done: usize, seed: u64) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create checkpoint folder {}", dir.display()))?;
    let progress = Progress {
        format: checkpoint::FORMAT.into(),
        epochs_done,
        steps: trainer.optimizer().state().step,
        seed,
        optimizer: *trainer.optimizer().config(),
    };
    for (name, bytes) in [
        (
            checkpoint::PARAMS_FILE,
            checkpoint::encode_weights(trainer.params())?,
        ),
        (
            checkpoint::OPTIMIZER_FILE,
            checkpoint::encode_state(trainer.optimizer().state(), trainer.params())?,
        ),
        (
            checkpoint::PROGRESS_FILE,
            checkpoint::encode_progress(&progress),
        ),
    ] {
        let path = dir.join(name);
        crate::files::write_path_durably(&path, &bytes)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Loads a checkpoint folder into the trainer; the data seed and the optimiser settings
/// must be the ones it was taken with.
fn resume(graph: &Graph, trainer: &mut Trainer, dir: &Path, seed: u64) -> Result<Progress> {
    let read = |name: &str| {
        let path = dir.join(name);
        read_bounded(&path, 8 << 30).with_context(|| format!("cannot read {}", path.display()))
    };
    let (params, state, progress) = checkpoint::decode(
        graph,
        &read(checkpoint::PARAMS_FILE)?,
        &read(checkpoint::OPTIMIZER_FILE)?,
        &read(checkpoint::PROGRESS_FILE)?,
    )?;
    if progress.seed != seed {
        bail!(
            "the checkpoint was taken with --seed {}, not {seed}: resuming would change the data order",
            progress.seed
        );
    }
    if &progress.optimizer != trainer.optimizer().config() {
        bail!(
            "the checkpoint's optimizer settings ({}) differ from this run's ({})",
            serde_json::to_string(&progress.optimizer).unwrap_or_default(),
            serde_json::to_string(trainer.optimizer().config()).unwrap_or_default()
        );
    }
    trainer.restore(params, state)?;
    Ok(progress)
}
