//! `sluice validate`: inferred shapes per node, or every problem with a non-zero exit.

use super::load;
use anyhow::Result;
use serde_json::json;
use sluice_engine::graph::NodeKind;
use std::path::Path;
use std::process::ExitCode;

/// Runs the command.
pub fn validate(path: &Path, as_json: bool) -> Result<ExitCode> {
    let graph = match load::graph(path)? {
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
        nodes.push((n.id.clone(), op, outputs, n.params.len()));
    }
    if as_json {
        let list: Vec<_> = nodes
            .iter()
            .map(|(id, op, outs, params)| json!({ "id": id, "op": op, "outputs": outs, "params": params }))
            .collect();
        println!(
            "{}",
            json!({ "valid": true, "name": graph.doc.name, "nodes": list })
        );
    } else {
        println!(
            "{}: valid graph '{}' ({} nodes)",
            path.display(),
            graph.doc.name,
            nodes.len()
        );
        for (id, op, outs, params) in nodes {
            let w = if params > 0 {
                format!("  ({params} weights)")
            } else {
                String::new()
            };
            println!("  {id:<20} {op:<16} -> {}{w}", outs.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}
