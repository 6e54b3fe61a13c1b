//! Limits on what a run may ask for, checked before any work: the one place the CLI, the
//! server, workers and the editor take them from.

use crate::graph::Graph;
use crate::shape::Dim;

/// Largest batch a run may ask for.
pub const MAX_BATCH: usize = 65_536;
/// Most micro-batches per batch.
pub const MAX_MICROBATCHES: usize = 1024;
/// Most pipeline stages.
pub const MAX_STAGES: usize = 16;
/// Most prefetch slots.
pub const MAX_PREFETCH: usize = 16;
/// Largest graph a served run may have, in nodes.
pub const MAX_RUN_NODES: usize = 10_000;
/// Largest input tensor of a served run, in elements.
pub const MAX_INPUT_ELEMENTS: usize = 1 << 26;

/// Checks a graph against the run limits at a batch size, before planning: its node count
/// and the elements of every input with the batch bound.
pub fn check_run(graph: &Graph, batch: usize) -> Result<(), String> {
    if graph.doc.nodes.len() > MAX_RUN_NODES {
        return Err(format!(
            "{} nodes exceed the limit of {MAX_RUN_NODES}",
            graph.doc.nodes.len()
        ));
    }
    for (name, decl) in &graph.doc.inputs {
        let mut n: usize = 1;
        for d in &decl.shape {
            let v = match d {
                Dim::Known(k) => *k,
                Dim::Sym(_) => batch,
            };
            n = n.saturating_mul(v);
        }
        if n > MAX_INPUT_ELEMENTS {
            return Err(format!(
                "input '{name}' would hold {n} elements, over the limit of {MAX_INPUT_ELEMENTS}"
            ));
        }
    }
    Ok(())
}
