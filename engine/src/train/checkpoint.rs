//! Checkpoints: what resuming a run exactly needs, as bytes (the CLI writes them as a
//! folder of three files). The weights are an ordinary safetensors weights file (keys
//! `node.param`, f32), which `sluice run` accepts as `params.file`; the optimiser's moment
//! buffers are a second safetensors file (keys `first:KEY`, `second:KEY`); the progress
//! (format, epochs done, steps, seed, optimiser settings) is JSON. Reading checks every
//! tensor against the graph's weights before it is kept.

use super::optim::{Moments, OptimizerState};
use crate::graph::training::OptimizerConfig;
use crate::graph::{Graph, Limit};
use crate::tensor::{Tensor, TensorData};
use crate::weights::{self, Weights};
use safetensors::tensor::TensorView;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The format tag of a checkpoint's progress file.
pub const FORMAT: &str = "sluice/checkpoint@1";

/// Errors reading or writing a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file of the checkpoint is damaged or does not fit the graph.
    #[error("checkpoint {file}: {message}")]
    Invalid {
        /// Which file (`params.safetensors`, `optimizer.safetensors`, `progress.json`).
        file: &'static str,
        /// What is wrong.
        message: String,
    },
}

fn invalid(file: &'static str, message: impl Into<String>) -> CheckpointError {
    CheckpointError::Invalid {
        file,
        message: message.into(),
    }
}

/// Where training stood when the checkpoint was taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Progress {
    /// Always [`FORMAT`].
    pub format: String,
    /// Epochs completed.
    pub epochs_done: usize,
    /// Optimiser steps taken.
    pub steps: u64,
    /// The data seed (shuffling and the validation split).
    pub seed: u64,
    /// The optimiser's settings (a resumed run must use the same).
    pub optimizer: OptimizerConfig,
}

/// The file names of a checkpoint folder.
pub const PARAMS_FILE: &str = "params.safetensors";
/// The optimiser state's file name.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// The progress file's name.
pub const PROGRESS_FILE: &str = "progress.json";

/// Weights as a safetensors file (f32, keys sorted).
pub fn encode_weights(params: &Weights) -> Result<Vec<u8>, CheckpointError> {
    let tensors: BTreeMap<&String, (&Tensor, Vec<u8>)> =
        params.iter().map(|(k, t)| (k, (t, f32_bytes(t)))).collect();
    encode(
        PARAMS_FILE,
        tensors
            .iter()
            .map(|(k, (t, bytes))| (k.to_string(), t.shape.clone(), bytes.as_slice())),
    )
}

/// The optimiser's moment buffers as a safetensors file; the step count is in
/// [`Progress`].
pub fn encode_state(state: &OptimizerState, params: &Weights) -> Result<Vec<u8>, CheckpointError> {
    let mut entries = Vec::new();
    for (key, m) in &state.moments {
        let shape = params
            .get(key)
            .map(|p| p.shape.clone())
            .ok_or_else(|| invalid(OPTIMIZER_FILE, format!("moments of unknown weight '{key}'")))?;
        for (which, v) in [("first", &m.first), ("second", &m.second)] {
            if !v.is_empty() {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                entries.push((format!("{which}:{key}"), shape.clone(), bytes));
            }
        }
    }
    encode(
        OPTIMIZER_FILE,
        entries
            .iter()
            .map(|(k, s, b)| (k.clone(), s.clone(), b.as_slice())),
    )
}

/// Progress as JSON.
pub fn encode_progress(progress: &Progress) -> Vec<u8> {
    serde_json::to_vec_pretty(progress).unwrap_or_default()
}

/// Reads a checkpoint's three files against `graph`: the weights must be exactly the
/// graph's, the moments must belong to its weights with their shapes, the progress must
/// be this format.
pub fn decode(
    graph: &Graph,
    params: &[u8],
    optimizer: &[u8],
    progress: &[u8],
) -> Result<(Weights, OptimizerState, Progress), CheckpointError> {
    let weights = weights::load_safetensors(graph, params)
        .map_err(|e| invalid(PARAMS_FILE, e.to_string()))?;
    let limit = usize::try_from(graph.limits.get(Limit::MaxDocumentBytes)).unwrap_or(usize::MAX);
    if progress.len() > limit {
        return Err(invalid(
            PROGRESS_FILE,
            format!("{} bytes, over max_document_bytes {limit}", progress.len()),
        ));
    }
    let progress: Progress =
        serde_json::from_slice(progress).map_err(|e| invalid(PROGRESS_FILE, e.to_string()))?;
    if progress.format != FORMAT {
        return Err(invalid(
            PROGRESS_FILE,
            format!("format '{}' is not '{FORMAT}'", progress.format),
        ));
    }
    let file = safetensors::SafeTensors::deserialize(optimizer)
        .map_err(|e| invalid(OPTIMIZER_FILE, e.to_string()))?;
    let mut moments: BTreeMap<String, Moments> = BTreeMap::new();
    for (name, view) in file.tensors() {
        let (which, key) = name
            .split_once(':')
            .filter(|(w, _)| *w == "first" || *w == "second")
            .ok_or_else(|| invalid(OPTIMIZER_FILE, format!("unexpected tensor '{name}'")))?;
        let param = weights.get(key).ok_or_else(|| {
            invalid(
                OPTIMIZER_FILE,
                format!("'{name}' belongs to no weight of the graph"),
            )
        })?;
        if view.dtype() != safetensors::Dtype::F32
            || view.shape() != param.shape.as_slice()
            || view.data().len() != param.len().saturating_mul(4)
        {
            return Err(invalid(
                OPTIMIZER_FILE,
                format!(
                    "'{name}' is {:?} {:?}; the weight is f32 {:?}",
                    view.dtype(),
                    view.shape(),
                    param.shape
                ),
            ));
        }
        let values: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let m = moments.entry(key.to_string()).or_default();
        if which == "first" {
            m.first = values;
        } else {
            m.second = values;
        }
    }
    let state = OptimizerState {
        step: progress.steps,
        moments,
    };
    Ok((weights, state, progress))
}

fn f32_bytes(t: &Tensor) -> Vec<u8> {
    match &t.data {
        TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        _ => Vec::new(),
    }
}

fn encode<'a>(
    file: &'static str,
    entries: impl Iterator<Item = (String, Vec<usize>, &'a [u8])>,
) -> Result<Vec<u8>, CheckpointError> {
    let views = entries
        .map(|(k, shape, bytes)| {
            TensorView::new(safetensors::Dtype::F32, shape, bytes)
                .map(|v| (k, v))
                .map_err(|e| invalid(file, e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::tensor::serialize(views, None).map_err(|e| invalid(file, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::load_graph;
    use crate::train::optim::Optimizer;

    fn graph() -> Graph {
        load_graph(
            r#"{ "format": "sluice/graph@1", "inputs": { "x": { "shape": ["N", 3] } },
                 "nodes": [{ "id": "fc", "op": "linear", "inputs": ["x"],
                             "attrs": { "out_features": 2 } }],
                 "outputs": ["fc"], "params": { "seed": 1 } }"#,
        )
        .unwrap()
    }

    #[test]
    fn a_checkpoint_round_trips_and_resumes_the_optimiser() {
        let g = graph();
        let mut params = weights::init_weights(&g, 1);
        let config = OptimizerConfig::named("adamw").unwrap();
        let mut opt = Optimizer::new(config).unwrap();
        let grads: Weights = params
            .iter()
            .map(|(k, t)| (k.clone(), Tensor::full(t.shape.clone(), 0.5)))
            .collect();
        opt.step(&mut params, &grads).unwrap();
        let progress = Progress {
            format: FORMAT.into(),
            epochs_done: 2,
            steps: opt.state().step,
            seed: 7,
            optimizer: config,
        };
        let (p, s, pr) = decode(
            &g,
            &encode_weights(&params).unwrap(),
            &encode_state(opt.state(), &params).unwrap(),
            &encode_progress(&progress),
        )
        .unwrap();
        assert_eq!(p, params);
        assert_eq!(&s, opt.state());
        assert_eq!(pr, progress);
    }

    #[test]
    fn damaged_or_foreign_files_are_refused_naming_the_file() {
        let g = graph();
        let params = weights::init_weights(&g, 1);
        let good_p = encode_weights(&params).unwrap();
        let progress = encode_progress(&Progress {
            format: FORMAT.into(),
            epochs_done: 0,
            steps: 0,
            seed: 0,
            optimizer: OptimizerConfig::default(),
        });
        let empty = encode_state(&OptimizerState::default(), &params).unwrap();
        let e = decode(&g, b"junk", &empty, &progress)
            .unwrap_err()
            .to_string();
        assert!(e.contains(PARAMS_FILE), "{e}");
        let e = decode(&g, &good_p, b"junk", &progress)
            .unwrap_err()
            .to_string();
        assert!(e.contains(OPTIMIZER_FILE), "{e}");
        let e = decode(&g, &good_p, &empty, b"{}").unwrap_err().to_string();
        assert!(e.contains(PROGRESS_FILE), "{e}");
        // Moments of the wrong shape.
        let bytes = [0u8; 4];
        let view = TensorView::new(safetensors::Dtype::F32, vec![1], &bytes).unwrap();
        let wrong = safetensors::tensor::serialize([("first:fc.weight", view)], None).unwrap();
        let e = decode(&g, &good_p, &wrong, &progress)
            .unwrap_err()
            .to_string();
        assert!(e.contains("first:fc.weight"), "{e}");
    }
}
