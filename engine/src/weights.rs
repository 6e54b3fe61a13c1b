//! Weights: seeded deterministic initialisation, or a safetensors file with keys
//! `node.param` (f32, f16 or bf16), checked against the shapes operators declare.

use crate::graph::Graph;
use crate::ops::{Init, ParamSpec};
use crate::rng::Rng;
use crate::tensor::Tensor;
use std::collections::HashMap;

/// Weights by key (`fc1.weight`).
pub type Weights = HashMap<String, Tensor>;

/// Errors reading weights.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The file is not valid safetensors.
    #[error("weights file is not valid safetensors: {0}")]
    Format(String),
    /// A declared weight is missing from the file.
    #[error("weights file has no tensor '{0}' (expected shape {1:?})")]
    Missing(String, Vec<usize>),
    /// A weight has the wrong shape.
    #[error("weights file tensor '{key}' has shape {found:?}, but the graph expects {expected:?}")]
    Shape {
        /// The key.
        key: String,
        /// Shape in the file.
        found: Vec<usize>,
        /// Shape the operator declares.
        expected: Vec<usize>,
    },
    /// A weight has an unsupported dtype.
    #[error("weights file tensor '{0}' has dtype {1}; f32, f16 and bf16 are supported")]
    Dtype(String, String),
}

/// Every declared weight of a graph: (key, spec), in topological order.
pub fn param_specs(graph: &Graph) -> Vec<(String, ParamSpec)> {
    graph
        .op_nodes()
        .flat_map(|(_, node, _)| {
            node.params
                .iter()
                .map(move |p| (format!("{}.{}", node.id, p.name), p.clone()))
        })
        .collect()
}

/// One weight initialised from the seed: the same (seed, key) gives the same values.
pub fn init_param(seed: u64, key: &str, spec: &ParamSpec) -> Tensor {
    let n: usize = spec.shape.iter().product();
    let data = match spec.init {
        Init::Zeros => vec![0.0; n],
        Init::Ones => vec![1.0; n],
        Init::Uniform(bound) => {
            let mut rng = Rng::for_name(seed, key);
            (0..n).map(|_| rng.uniform(-bound, bound)).collect()
        }
    };
    Tensor::f32(spec.shape.clone(), data)
}

/// All weights initialised from a seed.
pub fn init_weights(graph: &Graph, seed: u64) -> Weights {
    param_specs(graph)
        .into_iter()
        .map(|(key, spec)| {
            let t = init_param(seed, &key, &spec);
            (key, t)
        })
        .collect()
}

/// Weights from a safetensors file's bytes; every declared weight must be there.
pub fn load_safetensors(graph: &Graph, bytes: &[u8]) -> Result<Weights, WeightsError> {
    let file = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| WeightsError::Format(e.to_string()))?;
    let mut out = Weights::new();
    for (key, spec) in param_specs(graph) {
        let view = file
            .tensor(&key)
            .map_err(|_| WeightsError::Missing(key.clone(), spec.shape.clone()))?;
        if view.shape() != spec.shape.as_slice() {
            return Err(WeightsError::Shape {
                key,
                found: view.shape().to_vec(),
                expected: spec.shape,
            });
        }
        let raw = view.data();
        let data: Vec<f32> = match view.dtype() {
            safetensors::Dtype::F32 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            safetensors::Dtype::F16 => raw
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            safetensors::Dtype::BF16 => raw
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => return Err(WeightsError::Dtype(key, format!("{other:?}"))),
        };
        out.insert(key, Tensor::f32(spec.shape, data));
    }
    Ok(out)
}
