//! Loading a graph file and its weights for the commands, with errors naming the file:
//! regular files only, within a size limit, checked before reading.

use crate::files::{read_bounded, read_text_bounded};
use anyhow::{Context, Result};
use sluice_engine::graph::Graph;
use sluice_engine::limits::Limits;
use sluice_engine::weights::{self, Weights};
use sluice_engine::Problems;
use std::path::Path;

/// Largest weights (safetensors) file read, in bytes.
const MAX_WEIGHTS_BYTES: u64 = 8 << 30;

/// A graph file (at most `--max-document-bytes`): its problems, or the typed graph
/// checked against `limits`.
pub fn graph(path: &Path, limits: &Limits) -> Result<Result<Graph, Problems>> {
    let max = u64::try_from(limits.max_document_bytes).unwrap_or(u64::MAX);
    let text = read_text_bounded(path, max).with_context(|| {
        format!(
            "cannot read {} (graph files are read up to --max-document-bytes)",
            path.display()
        )
    })?;
    Ok(sluice_engine::load_graph_with(&text, limits))
}

/// A graph file's typed graph, or `None` after printing every problem to stderr.
pub fn graph_or_report(path: &Path, limits: &Limits) -> Result<Option<Graph>> {
    Ok(match graph(path, limits)? {
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
