//! `sluice bench`: one warm-up batch, then `--reps` batches of seeded random inputs (named
//! in its output) through the configured session; prints throughput, latency, utilisation,
//! bubbles, overlap, memory and the most expensive nodes (`--json`: the same as one
//! document).

use super::{load, report, run::Progress, BenchArgs};
use anyhow::{bail, Context, Result};
use serde_json::json;
use sluice_engine::exec::{RunContext, RunReport, Session, Values};
use sluice_engine::telemetry::{metrics, now_ns};
use std::process::ExitCode;

/// The measured batches with some inputs kept on the device: each batch (fresh seeded
/// values of the other inputs) is a run of its own, and the report joins their events on
/// one clock. The outputs are the first batch's.
fn batch_by_batch(
    session: &mut Session,
    graph: &sluice_engine::Graph,
    args: &BenchArgs,
    kept: &Values,
    ctx: &RunContext<'_>,
) -> Result<RunReport> {
    // Every batch's data is made before the clock starts.
    let batches = (0..args.reps)
        .map(|rep| {
            let seed = args.seed.wrapping_add(1).wrapping_add(rep as u64);
            let mut data = super::run::inputs(graph, &[], Some(seed), args.exec.batch)?.values;
            data.retain(|name, _| !kept.contains_key(name));
            Ok(data)
        })
        .collect::<Result<Vec<_>>>()?;
    let start = now_ns();
    let mut events = Vec::new();
    let mut first: Option<RunReport> = None;
    let mut micro_batches = 0;
    let each = RunContext {
        progress: None,
        ..*ctx
    };
    for (rep, data) in batches.iter().enumerate() {
        let offset = now_ns().saturating_sub(start);
        let mut r = session.run_blocking(data, &each)?;
        if let Some(p) = ctx.progress {
            p(rep + 1, args.reps);
        }
        for mut ev in r.events.drain(..) {
            ev.start_ns = ev.start_ns.saturating_add(offset);
            ev.end_ns = ev.end_ns.saturating_add(offset);
            ev.micro_batch += micro_batches;
            events.push(ev);
        }
        micro_batches += r.micro_batches;
        first.get_or_insert(r);
    }
    let first = first.context("no batch was run")?;
    let samples = args.exec.batch.saturating_mul(args.reps);
    Ok(RunReport {
        metrics: metrics::compute(&events, session.plans().len(), micro_batches, samples),
        events,
        micro_batches,
        ..first
    })
}

/// Runs the command.
pub fn bench(args: &BenchArgs) -> Result<ExitCode> {
    let Some(graph) = load::graph_or_report(&args.graph, &args.exec.limits.0)? else {
        return Ok(ExitCode::FAILURE);
    };
    let e = &args.exec;
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let samples = e
        .batch
        .checked_mul(args.reps)
        .context("--batch times --reps is too large to count")?;
    // The measured batches are one dataset, allocated at once.
    e.check(&graph, samples)?;
    let weights = load::weights(&args.graph, &graph)?;
    let config = e.config();
    let devices = super::open_devices(e.device, config.stages, e.pass_timing())?;
    let mut session = Session::compile_blocking(&graph, &weights, &config, devices)?;
    let warm_inputs = super::run::inputs(&graph, &[], Some(args.seed), e.batch)?;
    let seeded = warm_inputs.seeded;
    let mut warm = warm_inputs.values;
    if !args.keep.is_empty() && e.precision != super::PrecisionArg::F32 {
        bail!("--keep runs every batch on its own and has no f32 comparison: use --precision f32");
    }
    let kept: Values = args
        .keep
        .iter()
        .map(|name| {
            warm.remove(name)
                .map(|t| (name.clone(), t))
                .with_context(|| format!("--keep {name}: the graph has no input '{name}'"))
        })
        .collect::<Result<_>>()?;
    session
        .keep_inputs(&kept)
        .with_context(|| format!("--keep {}", args.keep.join(", ")))?;
    session.run_blocking(&warm, &RunContext::new("warm-up"))?;
    let data = super::run::inputs(&graph, &[], Some(args.seed.wrapping_add(1)), samples)?.values;
    let progress = Progress::new("benchmark");
    let update = |d: usize, t: usize| progress.update(d, t);
    let ctx = RunContext {
        progress: Some(&update),
        ..RunContext::new("bench")
    };
    let report = if kept.is_empty() {
        session.run_blocking(&data, &ctx)?
    } else {
        batch_by_batch(&mut session, &graph, args, &kept, &ctx)?
    };
    progress.finish();
    // Reduced precision is reported next to f32 on the same inputs.
    let baseline = if e.precision != super::PrecisionArg::F32 {
        let cfg = sluice_engine::exec::RunConfig {
            precision: sluice_engine::plan::Precision::F32,
            half: None,
            ..config.clone()
        };
        let devices = super::open_devices(e.device, cfg.stages, e.pass_timing())?;
        let mut s32 = Session::compile_blocking(&graph, &weights, &cfg, devices)?;
        s32.run_blocking(&warm, &RunContext::new("warm-up f32"))?;
        let r32 = s32.run_blocking(&data, &RunContext::new("bench f32"))?;
        let errors = sluice_engine::precision::compare(&r32.outputs, &report.outputs);
        Some((s32, r32, errors))
    } else {
        None
    };
    if let Some(path) = &args.trace {
        report::write_trace(path, &report, &session)?;
    }
    let plan_steps = session.compile_stats().passes;
    let flops: u64 = session
        .plans()
        .iter()
        .fold(0u64, |a, p| a.saturating_add(p.total_flops()))
        .saturating_mul(u64::try_from(report.micro_batches).unwrap_or(u64::MAX));
    let busy: u64 = report
        .metrics
        .devices
        .iter()
        .fold(0u64, |a, d| a.saturating_add(d.busy_ns));
    let checksums: Vec<_> = report
        .outputs
        .iter()
        .map(|(n, t)| json!({ "name": n, "checksum": t.checksum(), "shape": t.shape }))
        .collect();
    if args.json {
        let doc = json!({
            "graph": graph.doc.name,
            "config": config,
            "reps": args.reps,
            "devices": session.device_names(),
            "timing": report.timing,
            "passes_per_micro_batch": plan_steps,
            "metrics": report.metrics,
            "compute_gflops": if busy > 0 { flops as f64 / busy as f64 } else { 0.0 },
            "memory": { "planned_bytes": session.memory().planned_bytes, "naive_bytes": session.memory().naive_bytes,
                        "weight_bytes": session.memory().weight_bytes, "allocated_bytes": session.allocated_bytes() },
            "stages": session.stage_summary(),
            "outputs": checksums,
            "seeded_inputs": seeded,
            "seed": args.seed,
            "precision": e.precision.engine(),
            "f16_storage": (e.precision != super::PrecisionArg::F32).then(|| session.plan_options().half),
            "f32_baseline": baseline.as_ref().map(|(s32, r32, errors)| json!({
                "metrics": r32.metrics,
                "memory": { "planned_bytes": s32.memory().planned_bytes, "weight_bytes": s32.memory().weight_bytes },
                "precision_report": errors,
            })),
        });
        println!("{doc}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "bench '{}': batch {}, {} micro-batch(es), {} stage(s), prefetch {}, fusion {}, {} reps, {} passes per micro-batch",
        graph.doc.name,
        e.batch,
        e.microbatches,
        e.stages,
        e.prefetch,
        if e.no_fuse { "off" } else { "on" },
        args.reps,
        plan_steps
    );
    if let Some(note) = super::run::seeded_note(&seeded, args.seed) {
        println!("  {note}");
    }
    report::print_metrics(&report, &session);
    if busy > 0 {
        println!(
            "  compute:      {:.2} GFLOP/s while busy",
            flops as f64 / busy as f64
        );
    }
    if let Some((s32, r32, errors)) = &baseline {
        let (m, m32) = (session.memory(), s32.memory());
        println!(
            "  side by side:        {:>14} {:>14}",
            e.precision.engine().name(),
            "f32"
        );
        println!(
            "    samples/s          {:>14.1} {:>14.1}",
            report.metrics.throughput, r32.metrics.throughput
        );
        println!(
            "    ms per batch       {:>14.3} {:>14.3}",
            report.metrics.wall_ns as f64 / 1e6 / args.reps as f64,
            r32.metrics.wall_ns as f64 / 1e6 / args.reps as f64
        );
        println!(
            "    planned peak MiB   {:>14.3} {:>14.3}",
            report::mib(m.planned_bytes),
            report::mib(m32.planned_bytes)
        );
        println!(
            "    weight MiB         {:>14.3} {:>14.3}",
            report::mib(m.weight_bytes),
            report::mib(m32.weight_bytes)
        );
        println!(
            "  16-bit storage: {:?}; errors against f32:",
            session.plan_options().half
        );
        super::run::print_precision(errors);
    }
    if let Some(s) = session.stage_summary() {
        for (i, nodes) in s.nodes.iter().enumerate() {
            println!(
                "  stage {i}: {} (predicted {:.3} ms)",
                nodes.join(", "),
                1e3 * s.partition.stage_costs[i]
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
