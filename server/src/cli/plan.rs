//! `sluice plan`: the device-neutral execution plan per stage — steps (operators, fused
//! units) with the values they read and write, the buffer of every tensor, planned and
//! naive memory, predicted cost — and, with `--kernels`, the WGSL passes the GPU backend
//! lowers each step to. With `--train LOSS`, the plan of the joint forward + backward
//! graph (`sluice_engine::autodiff`), whose extra outputs are the weights' gradients.

use super::{load, report::mib, PlanArgs};
use anyhow::{bail, Result};
use serde_json::json;
use sluice_engine::exec::dataset::bind;
use sluice_engine::exec::session::partition_for;
use sluice_engine::gpu::program::{lower_plan, Buffer};
use sluice_engine::plan::cost::Rates;
use sluice_engine::plan::{stages, HalfStorage, Plan, PlanOptions, Work};
use std::process::ExitCode;

/// The rates the plan is partitioned with: the default adapter's kept calibration, else
/// assumed ones (said so).
fn rates() -> (Rates, &'static str) {
    let kept = pollster::block_on(sluice_engine::gpu::GpuContext::new())
        .ok()
        .and_then(|ctx| crate::rates::kept(&ctx));
    match kept {
        Some(r) => (r, "calibrated rates of the default adapter"),
        None => (
            Rates::ASSUMED,
            "assumed rates (run `sluice devices` to calibrate)",
        ),
    }
}

/// Runs the command.
pub fn plan(args: &PlanArgs) -> Result<ExitCode> {
    let Some(graph) = load::graph_or_report(&args.graph, &args.limits.0)? else {
        return Ok(ExitCode::FAILURE);
    };
    super::check_counts(args.batch, args.microbatches, args.stages, 1)?;
    if !args.batch.is_multiple_of(args.microbatches) {
        bail!("--batch must be a positive multiple of --microbatches");
    }
    let config = sluice_engine::exec::RunConfig {
        batch: args.batch,
        microbatches: args.microbatches,
        stages: args.stages,
        ..sluice_engine::exec::RunConfig::default()
    };
    sluice_engine::exec::check_run(&graph, &config, None, &args.limits.0)?;
    let micro = args.batch / args.microbatches;
    let bound = bind(&graph, micro)?;
    let (bound, gradients) = match &args.train {
        Some(_) if args.microbatches > 1 => bail!(
            "--train sums weight gradients over the whole batch: micro-batches would each \
             give their own (use --microbatches 1)"
        ),
        Some(loss) => {
            let joint = sluice_engine::autodiff::backward(&bound, loss)?;
            let names: Vec<(String, String)> =
                joint.params.into_iter().map(|g| (g.of, g.output)).collect();
            (joint.graph, names)
        }
        None => (bound, Vec::new()),
    };
    let options = PlanOptions {
        fuse: !args.no_fuse,
        precision: args.precision.engine(),
        half: args.f16_storage.engine().unwrap_or(HalfStorage::Packed),
    };
    let (plans, summary, rates_used) = if args.stages > 1 {
        let (rates, source) = rates();
        let part = partition_for(&bound, args.stages, &rates, &options)?;
        let specs = stages::split(&bound, &part)?;
        let plans = specs
            .iter()
            .map(|s| Plan::with_options(&s.graph, options))
            .collect::<Result<Vec<_>, _>>()?;
        (plans, Some(stages::summary(&bound, &part)), Some(source))
    } else {
        (vec![Plan::with_options(&bound, options)?], None, None)
    };
    let semantics = graph.batch_semantics();
    if args.json {
        let kernels = if args.kernels {
            Some(
                plans
                    .iter()
                    .map(lower_plan)
                    .collect::<Result<Vec<_>, _>>()?,
            )
        } else {
            None
        };
        println!(
            "{}",
            json!({ "graph": graph.doc.name, "micro_batch": micro, "stages": plans, "partition": summary,
                    "partition_rates": rates_used, "gpu_programs": kernels, "gradients": gradients,
                    "batch": { "inputs": semantics.inputs, "outputs": semantics.outputs, "couplings": semantics.couplings } })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "plan of '{}' for micro-batches of {micro}, fusion {}",
        graph.doc.name,
        if args.no_fuse { "off" } else { "on" }
    );
    if let Some(loss) = &args.train {
        println!(
            "joint forward + backward graph of loss '{loss}': {} nodes, {} weight gradients",
            bound.doc.nodes.len(),
            gradients.len()
        );
        for (key, output) in &gradients {
            println!("  {key} -> output '{output}'");
        }
    }
    for (s, p) in plans.iter().enumerate() {
        println!(
            "stage {s}: {} steps, {:.3} GFLOP, planned peak {:.2} MiB (naive {:.2} MiB, {:.0}%), weights {:.2} MiB",
            p.steps.len(),
            p.total_flops() as f64 / 1e9,
            mib(p.memory.planned_bytes),
            mib(p.memory.naive_bytes),
            100.0 * p.memory.planned_bytes as f64 / p.memory.naive_bytes.max(1) as f64,
            mib(p.memory.weight_bytes)
        );
        let program = if args.kernels {
            Some(lower_plan(p)?)
        } else {
            None
        };
        for (i, step) in p.steps.iter().enumerate() {
            let value = |v: usize| format!("{}(buf{})", p.values[v].name, p.values[v].buffer);
            let reads: Vec<String> = step
                .inputs
                .iter()
                .chain(&step.params)
                .map(|&v| value(v))
                .collect();
            let writes: Vec<String> = step.outputs.iter().map(|&v| value(v)).collect();
            let what = match &step.work {
                Work::Op(op) => op.name().to_string(),
                Work::Fused(expr) => format!("fused {}", expr.op_names().join("+")),
                Work::Epilogue { anchor, expr, .. } => {
                    format!("{} + {}", anchor.name(), expr.op_names().join("+"))
                }
                Work::Prologue { reducer, expr } => {
                    format!("{} of {}", reducer.name(), expr.op_names().join("+"))
                }
            };
            let in_place = if step.in_place.is_some() {
                " (in place)"
            } else {
                ""
            };
            println!(
                "  {i:>3} {:<28} {:<30} {:>9.3} MFLOP  reads {}  writes {}{in_place}",
                step.label(),
                what,
                step.cost.flops as f64 / 1e6,
                reads.join(" "),
                writes.join(" ")
            );
            if let Some(program) = &program {
                for pass in program.passes.iter().filter(|pass| pass.step == i) {
                    let binds: Vec<String> = pass
                        .buffers
                        .iter()
                        .enumerate()
                        .map(|(b, buffer)| match *buffer {
                            Buffer::Value(v) => format!("{}:{}", b + 1, p.values[v].name),
                            Buffer::Scratch(k) => format!("{}:scratch{k}", b + 1),
                            Buffer::Texture(k) => format!("{}:texture{k}", b + 1),
                        })
                        .collect();
                    println!(
                        "        pass {:<32} wg {:?}  0:info {}",
                        pass.kernel.label,
                        pass.kernel.workgroups,
                        binds.join(" ")
                    );
                }
            }
        }
        println!("  buffers:");
        for (b, size) in p.buffers.iter().enumerate() {
            let holders: Vec<&str> = p
                .values
                .iter()
                .filter(|v| v.buffer == b)
                .map(|v| v.name.as_str())
                .collect();
            println!(
                "    buf{b:<3} {:>10.3} KiB  {}",
                *size as f64 / 1024.0,
                holders.join(", ")
            );
        }
    }
    if let Some(s) = summary {
        for (i, nodes) in s.nodes.iter().enumerate() {
            println!(
                "stage {i} nodes: {} (predicted {:.3} ms)",
                nodes.join(", "),
                1e3 * s.partition.stage_costs[i]
            );
        }
        if let Some(source) = rates_used {
            println!("stages placed with {source}");
        }
    }
    match semantics.couplings.first() {
        Some(c) => println!(
            "batch: '{}' couples samples ({}); micro-batching is refused",
            c.node, c.reason
        ),
        None if semantics.batched() => {
            println!("batch: samples stay independent; micro-batching keeps the answer")
        }
        None => println!("batch: the graph has no batch axis"),
    }
    Ok(ExitCode::SUCCESS)
}
