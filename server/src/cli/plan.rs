//! `sluice plan`: the execution plan per stage — passes with their bindings (the bind-group
//! layout), the buffer of every tensor, planned and naive memory, predicted cost.

use super::{load, report::mib, PlanArgs};
use anyhow::{bail, Result};
use serde_json::json;
use sluice_engine::runtime::plan::{HalfStorage, Plan, PlanOptions};
use sluice_engine::runtime::stages;
use std::collections::HashMap;
use std::process::ExitCode;

/// Runs the command.
pub fn plan(args: &PlanArgs) -> Result<ExitCode> {
    let Some(graph) = load::graph_or_report(&args.graph)? else {
        return Ok(ExitCode::FAILURE);
    };
    if args.batch == 0 || args.microbatches == 0 || !args.batch.is_multiple_of(args.microbatches) {
        bail!("--batch must be a positive multiple of --microbatches");
    }
    let micro = args.batch / args.microbatches;
    let bindings: HashMap<String, usize> =
        graph.symbols().into_iter().map(|s| (s, micro)).collect();
    let bound = graph.bind(&bindings).map_err(|p| anyhow::anyhow!("{p}"))?;
    let options = PlanOptions {
        fuse: !args.no_fuse,
        precision: args.precision.engine(),
        half: args.f16_storage.engine().unwrap_or(HalfStorage::Packed),
    };
    let (plans, summary) = if args.stages > 1 {
        let part = stages::choose(&bound, args.stages, &stages::model_costs(&bound))?;
        let specs = stages::split(&bound, &part)?;
        let plans = specs
            .iter()
            .map(|s| Plan::with_options(&s.graph, options))
            .collect::<Result<Vec<_>, _>>()?;
        (plans, Some(stages::summary(&bound, &part)))
    } else {
        (vec![Plan::with_options(&bound, options)?], None)
    };
    if args.json {
        println!(
            "{}",
            json!({ "graph": graph.doc.name, "micro_batch": micro, "stages": plans, "partition": summary })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "plan of '{}' for micro-batches of {micro}, fusion {}",
        graph.doc.name,
        if args.no_fuse { "off" } else { "on" }
    );
    for (s, p) in plans.iter().enumerate() {
        println!(
            "stage {s}: {} passes, {:.3} GFLOP, planned peak {:.2} MiB (naive {:.2} MiB, {:.0}%), weights {:.2} MiB",
            p.steps.len(),
            p.total_flops() as f64 / 1e9,
            mib(p.memory.planned_bytes),
            mib(p.memory.naive_bytes),
            100.0 * p.memory.planned_bytes as f64 / p.memory.naive_bytes.max(1) as f64,
            mib(p.memory.weight_bytes)
        );
        for (i, step) in p.steps.iter().enumerate() {
            let binds: Vec<String> = step
                .kernel
                .slots
                .iter()
                .zip(&step.bindings)
                .enumerate()
                .map(|(b, (slot, &v))| {
                    let access = if matches!(slot, sluice_engine::ops::Slot::Output(_)) {
                        "rw"
                    } else {
                        "r"
                    };
                    format!(
                        "{}:{}({access},buf{})",
                        b + 1,
                        p.values[v].name,
                        p.values[v].buffer
                    )
                })
                .collect();
            println!(
                "  {i:>3} {:<36} {:>9.3} MFLOP  wg {:?}  0:info {}",
                step.kernel.label,
                step.cost.flops as f64 / 1e6,
                step.kernel.workgroups,
                binds.join(" ")
            );
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
    }
    Ok(ExitCode::SUCCESS)
}
