//! `sluice import` (an ONNX model → a graph file and its safetensors weights) and
//! `sluice export` (a graph or model → an ONNX model). Neither replaces an existing file
//! unless asked to (`--force`).

use super::load;
use crate::files::write_path_durably;
use anyhow::{bail, Context, Result};
use sluice_engine::limits::Limits;
use sluice_engine::train::checkpoint;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Refuses to replace `path` unless `force`.
fn check_free(path: &Path, force: bool) -> Result<()> {
    if path.exists() && !force {
        bail!("{} exists; pass --force to replace it", path.display());
    }
    Ok(())
}

/// `NAME=SIZE` pairs.
fn parse_dims(pairs: &[String]) -> Result<BTreeMap<String, usize>> {
    pairs
        .iter()
        .map(|p| {
            let (name, size) = p
                .split_once('=')
                .with_context(|| format!("--dim {p}: expected NAME=SIZE"))?;
            let size: usize = size
                .parse()
                .with_context(|| format!("--dim {p}: '{size}' is not a size"))?;
            Ok((name.to_string(), size))
        })
        .collect()
}

/// Runs `sluice import`.
pub fn import(
    model: &Path,
    out: Option<&Path>,
    dims: &[String],
    force: bool,
    limits: &Limits,
) -> Result<ExitCode> {
    let imported = load::import_with_dims(model, limits, &parse_dims(dims)?)?;
    let stem = model
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "model".into());
    let dir = out
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let graph_path = dir.join(format!("{stem}.json"));
    let weights_name = format!("{stem}.safetensors");
    let weights_path = dir.join(&weights_name);
    check_free(&graph_path, force)?;
    check_free(&weights_path, force)?;
    let mut doc = imported.doc;
    if doc.name.is_empty() || doc.name == "imported" {
        doc.name = stem.clone();
    }
    doc.params.file = Some(weights_name);
    // The written graph must load as it is: build it before writing anything.
    let graph = sluice_engine::Graph::build_with(doc.clone(), limits)
        .map_err(|p| anyhow::anyhow!("the imported graph does not check: {p}"))?;
    let count: usize = imported.weights.values().map(|t| t.len()).sum();
    write_path_durably(
        &weights_path,
        &checkpoint::encode_weights(&imported.weights)?,
    )?;
    let text = serde_json::to_string_pretty(&doc)?;
    write_path_durably(&graph_path, text.as_bytes())?;
    println!(
        "imported {} (opset {}, {} ONNX nodes, {} folded at import) → {}: {} nodes; {} weights ({count} values) in {}",
        model.display(),
        imported.opset,
        imported.onnx_nodes,
        imported.folded,
        graph_path.display(),
        graph.doc.nodes.len(),
        imported.weights.len(),
        weights_path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Runs `sluice export`.
pub fn export(graph_path: &Path, out: &Path, force: bool, limits: &Limits) -> Result<ExitCode> {
    check_free(out, force)?;
    let Some(graph) = load::graph_or_report(graph_path, limits)? else {
        return Ok(ExitCode::FAILURE);
    };
    let weights = load::weights(graph_path, &graph)?;
    let bytes = sluice_engine::onnx::export(&graph, &weights)
        .with_context(|| format!("cannot export {}", graph_path.display()))?;
    write_path_durably(out, &bytes)?;
    println!(
        "exported {} → {} ({} nodes, {} bytes)",
        graph_path.display(),
        out.display(),
        graph.doc.nodes.len(),
        bytes.len()
    );
    Ok(ExitCode::SUCCESS)
}
