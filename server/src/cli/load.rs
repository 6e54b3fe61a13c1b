//! Loading a graph file and its weights for the commands, with errors naming the file.

use anyhow::{Context, Result};
use sluice_engine::graph::Graph;
use sluice_engine::weights::{self, Weights};
use sluice_engine::Problems;
use std::path::Path;

/// Largest graph file read, in bytes.
const MAX_GRAPH_BYTES: u64 = 64 << 20;

/// A graph file: its problems, or the typed graph.
pub fn graph(path: &Path) -> Result<Result<Graph, Problems>> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if meta.len() > MAX_GRAPH_BYTES {
        anyhow::bail!(
            "{} is {} bytes, over the {MAX_GRAPH_BYTES}-byte limit for graph files",
            path.display(),
            meta.len()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {} as UTF-8 text", path.display()))?;
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
            let bytes = std::fs::read(&wpath)
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
