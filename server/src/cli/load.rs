//! Loading a graph file and its weights for the commands, with errors naming the file:
//! regular files only, within a size limit, checked before reading.

use crate::files::{read_bounded, read_text_bounded};
use anyhow::{Context, Result};
use sluice_engine::graph::Graph;
use sluice_engine::weights::{self, Weights};
use sluice_engine::Problems;
use std::path::Path;

/// Largest graph file read, in bytes.
const MAX_GRAPH_BYTES: u64 = 64 << 20;
/// Largest weights (safetensors) file read, in bytes.
const MAX_WEIGHTS_BYTES: u64 = 8 << 30;

/// A graph file: its problems, or the typed graph.
pub fn graph(path: &Path) -> Result<Result<Graph, Problems>> {
    let text = read_text_bounded(path, MAX_GRAPH_BYTES)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(sluice_engine::load_graph(&text))
}

/// A graph file's typed graph, or `None` after printing every problem to stderr.
pub fn graph_or_report(path: &Path) -> Result<Option<Graph>> {
    Ok(match graph(path)? {
        Ok(g) => Some(g),
        Err(problems) => {
            report(path, &problems);
            None
        }
    })
}

/// Prints every problem of a graph file to stderr.
pub fn report(path: &Path, problems: &Problems) {
    eprintln!("{}: {}", path.display(), problems.render());
}

/// The graph's weights: from its safetensors file (relative to the graph), else seeded.
pub fn weights(path: &Path, graph: &Graph) -> Result<Weights> {
    match &graph.doc.params.file {
        Some(file) => {
            let base = path.parent().unwrap_or(Path::new("."));
            let wpath = base.join(file);
            let bytes = read_bounded(&wpath, MAX_WEIGHTS_BYTES)
                .with_context(|| format!("cannot read weights file {}", wpath.display()))?;
            weights::load_safetensors(graph, &bytes)
                .with_context(|| format!("in weights file {}", wpath.display()))
        }
        None => Ok(weights::init_weights(
            graph,
            graph.doc.params.seed.unwrap_or(0),
        )),
    }
}
