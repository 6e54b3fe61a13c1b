//! Loading a graph file and its weights for the commands, with errors naming the file:
//! regular files only, within a size limit, checked before reading. An `.onnx` model is
//! imported in memory wherever a graph file is taken.

use crate::files::{read_bounded, read_range, read_text_bounded};
use anyhow::{Context, Result};
use sluice_engine::graph::Graph;
use sluice_engine::limits::Limits;
use sluice_engine::onnx;
use sluice_engine::weights::{self, Weights};
use sluice_engine::Problems;
use std::path::Path;

/// Largest weights (safetensors) file read, in bytes.
const MAX_WEIGHTS_BYTES: u64 = 8 << 30;

/// Largest ONNX model file read, in bytes (its external data files are read separately,
/// each tensor within the limits).
const MAX_MODEL_BYTES: u64 = 2 << 30;

/// Whether a path names an ONNX model (by its extension).
pub fn is_onnx(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// External tensor data of a model: files inside the model's folder, read bounded.
pub struct ModelFolder<'a>(pub &'a Path);

impl onnx::ExternalData for ModelFolder<'_> {
    fn read(&self, location: &str, offset: u64, length: Option<u64>) -> Result<Vec<u8>, String> {
        let base = self.0.canonicalize().map_err(|e| e.to_string())?;
        let path = base
            .join(location)
            .canonicalize()
            .map_err(|e| format!("external data '{location}': {e}"))?;
        if !path.starts_with(&base) {
            return Err(format!(
                "external data '{location}' lies outside the model's folder"
            ));
        }
        // Regular files only (a FIFO or a device would block or never end), the range
        // checked against the file's size before anything is read.
        let length = match length {
            Some(length) => length,
            None => std::fs::metadata(&path)
                .map_err(|e| format!("external data '{location}': {e}"))?
                .len()
                .saturating_sub(offset),
        };
        read_range(&path, offset, length).map_err(|e| format!("external data '{location}': {e}"))
    }
}

/// Imports an ONNX model file.
pub fn import(path: &Path, limits: &Limits) -> Result<onnx::Imported> {
    import_with_dims(path, limits, &Default::default())
}

/// Imports an ONNX model file with sizes for some of its named dimensions.
pub fn import_with_dims(
    path: &Path,
    limits: &Limits,
    dims: &std::collections::BTreeMap<String, usize>,
) -> Result<onnx::Imported> {
    let bytes = read_bounded(path, MAX_MODEL_BYTES)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let folder = path.parent().unwrap_or(Path::new("."));
    let folder = if folder.as_os_str().is_empty() {
        Path::new(".")
    } else {
        folder
    };
    onnx::import_with_dims(&bytes, &ModelFolder(folder), limits, dims)
        .with_context(|| format!("cannot import {}", path.display()))
}

/// A graph file (at most `--max-document-bytes`) or an ONNX model: its problems, or the
/// typed graph checked against `limits`. A model Sluice cannot import is an error.
pub fn graph(path: &Path, limits: &Limits) -> Result<Result<Graph, Problems>> {
    if is_onnx(path) {
        let imported = import(path, limits)?;
        return Ok(Graph::build_with(imported.doc, limits));
    }
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

/// The graph's weights: an ONNX model's initialisers, the graph's safetensors file
/// (relative to the graph), else seeded.
pub fn weights(path: &Path, graph: &Graph) -> Result<Weights> {
    if is_onnx(path) {
        return Ok(import(path, &graph.limits)?.weights);
    }
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
