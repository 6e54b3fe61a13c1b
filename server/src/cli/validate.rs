//! `sluice validate`: inferred shapes per node and which nodes couple the batch, or every
//! problem with a non-zero exit.

use super::load;
use anyhow::Result;
use serde_json::json;
use sluice_engine::graph::NodeKind;
use sluice_engine::limits::Limits;
use std::path::Path;
use std::process::ExitCode;

/// Runs the command.
pub fn validate(path: &Path, as_json: bool, limits: &Limits) -> Result<ExitCode> {
    let graph = match load::graph(path, limits)? {
        Ok(g) => g,
        Err(problems) => {
            if as_json {
                println!("{}", json!({ "valid": false, "problems": problems.0 }));
            } else {
                load::report(path, &problems);
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut nodes = Vec::new();
    for &ix in &graph.order {
        let n = &graph.dag[ix];
        let op = match &n.kind {
            NodeKind::Input => "input",
            NodeKind::Op(op) => op.name(),
        };
        let outputs: Vec<String> = n.outputs.iter().map(|t| t.to_string()).collect();
        nodes.push((n.id.clone(), op, outputs, n.params.len(), &n.batch));
    }
    let semantics = graph.batch_semantics();
    if as_json {
        let list: Vec<_> = nodes
            .iter()
            .map(|(id, op, outs, params, batch)| {
                json!({ "id": id, "op": op, "outputs": outs, "params": params, "batch": batch })
            })
            .collect();
        println!(
            "{}",
            json!({
                "valid": true,
                "name": graph.doc.name,
                "nodes": list,
                "couplings": semantics.couplings,
            })
        );
    } else {
        println!(
            "{}: valid graph '{}' ({} nodes)",
            path.display(),
            graph.doc.name,
            nodes.len()
        );
        for (id, op, outs, params, _) in nodes {
            let w = if params > 0 {
                format!("  ({params} weights)")
            } else {
                String::new()
            };
            println!("  {id:<20} {op:<16} -> {}{w}", outs.join(", "));
        }
        for c in &semantics.couplings {
            println!(
                "  batch: '{}' couples samples ({}): runs with micro-batches, or datasets of another size than one batch, are refused",
                c.node, c.reason
            );
        }
        if semantics.couplings.is_empty() {
            if semantics.batched() {
                println!(
                    "  batch: samples stay independent (micro-batching and pipelining keep the answer)"
                );
            } else {
                println!("  batch: no input has a symbolic batch dimension");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
