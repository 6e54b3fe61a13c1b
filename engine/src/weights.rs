//! Weights: seeded deterministic initialisation, or a safetensors file with keys
//! `node.param` (f32, f16 or bf16), checked against the shapes operators declare. Sizes
//! are bounded before anything is allocated: a built graph's weights are within its
//! limits (`Graph::build` checks every weight's elements and their total bytes), and a
//! safetensors file's header, tensor count and sizes are checked before conversion.

use crate::graph::{Graph, Limit, Limits};
use crate::ops::{Init, ParamSpec};
use crate::rng::Rng;
use crate::shape;
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
    /// The file is over a limit (its header, its tensor count).
    #[error("weights file: {0}")]
    Limit(#[from] crate::error::LimitError),
}

/// Most tensors a weights file may hold per node of the graph (a node declares at most
/// four weights; files may hold a few unused ones besides).
const TENSORS_PER_NODE: u64 = 8;

/// Every declared weight of a graph: (key, spec), in topological order, each key once
/// (several nodes may declare one key — a `param` reading another node's weight — and a
/// built graph gives them one shape; the first declaration's initialisation is used).
pub fn param_specs(graph: &Graph) -> Vec<(String, ParamSpec)> {
    let mut seen = std::collections::HashSet::new();
    graph
        .op_nodes()
        .flat_map(|(_, node, _)| {
            node.params
                .iter()
                .map(move |p| (node.param_key(p), p.clone()))
        })
        .filter(|(key, _)| seen.insert(key.clone()))
        .collect()
}

/// One weight initialised from the seed: the same (seed, key) gives the same values. The
/// spec's size is the caller's to bound (a built graph's are); one whose element count
/// overflows gets no elements.
pub fn init_param(seed: u64, key: &str, spec: &ParamSpec) -> Tensor {
    let n = shape::numel(&spec.shape).unwrap_or(0);
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

/// All weights initialised from a seed. Allocates at most the graph's limits: building it
/// checked every weight's elements (`max_tensor_elements`) and the bytes of all of them
/// (`max_host_bytes`, `max_device_bytes`), so this never needs to refuse.
pub fn init_weights(graph: &Graph, seed: u64) -> Weights {
    param_specs(graph)
        .into_iter()
        .map(|(key, spec)| {
            let t = init_param(seed, &key, &spec);
            (key, t)
        })
        .collect()
}

/// A safetensors file's bytes parsed, after checking its header's length against the file
/// and `limits`' `max_document_bytes` (nothing is read past what the file holds). What a
/// server checks of a weights file stored before the graph that reads it.
pub fn parse_safetensors<'a>(
    bytes: &'a [u8],
    limits: &Limits,
) -> Result<safetensors::SafeTensors<'a>, WeightsError> {
    let header = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| WeightsError::Format("shorter than its 8-byte header length".into()))?;
    let available = u64::try_from(bytes.len() - 8).unwrap_or(u64::MAX);
    if header > available {
        return Err(WeightsError::Format(format!(
            "the header claims {header} bytes but the file has {available} after its length"
        )));
    }
    limits.check(Limit::MaxDocumentBytes, "its header", "bytes", Some(header))?;
    safetensors::SafeTensors::deserialize(bytes).map_err(|e| WeightsError::Format(e.to_string()))
}

/// Checks a safetensors file's bytes against `graph` without converting anything, exactly
/// as [`load_safetensors`] checks them first: what a server checks of weights sent with a
/// run request before it accepts the run.
pub fn check_safetensors(graph: &Graph, bytes: &[u8]) -> Result<(), WeightsError> {
    let file = parse_safetensors(bytes, &graph.limits)?;
    checked_views(graph, &file).map(|_| ())
}

/// Weights from a safetensors file's bytes; every declared weight must be there. Before
/// anything is parsed or converted: the header's length against the file and the
/// graph's `max_document_bytes`, then the tensor count against the graph's nodes, and
/// each tensor's bytes against its declared shape and dtype.
pub fn load_safetensors(graph: &Graph, bytes: &[u8]) -> Result<Weights, WeightsError> {
    let file = parse_safetensors(bytes, &graph.limits)?;
    let mut out = Weights::new();
    for (key, spec, view) in checked_views(graph, &file)? {
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

/// Every declared weight's tensor in a parsed file, checked: the tensor count against
/// the graph's nodes, then each tensor's presence, shape, dtype and bytes.
fn checked_views<'a>(
    graph: &Graph,
    file: &safetensors::SafeTensors<'a>,
) -> Result<Vec<(String, ParamSpec, safetensors::tensor::TensorView<'a>)>, WeightsError> {
    let limits = &graph.limits;
    let nodes = u64::try_from(graph.doc.nodes.len().max(1)).unwrap_or(u64::MAX);
    let count = u64::try_from(file.len()).ok();
    if count.is_none_or(|c| c > nodes.saturating_mul(TENSORS_PER_NODE)) {
        return Err(limits
            .error(
                Limit::MaxNodes,
                format!("{} tensors for a graph of {nodes} nodes", file.len()),
                "tensors",
                count,
            )
            .into());
    }
    let mut views = Vec::new();
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
        let width = match view.dtype() {
            safetensors::Dtype::F32 => 4,
            safetensors::Dtype::F16 | safetensors::Dtype::BF16 => 2,
            other => return Err(WeightsError::Dtype(key, format!("{other:?}"))),
        };
        let want = shape::numel(&spec.shape)
            .ok()
            .and_then(|n| n.checked_mul(width));
        if want != Some(view.data().len()) {
            return Err(WeightsError::Format(format!(
                "tensor '{key}' holds {} bytes, not the {} its shape {:?} needs",
                view.data().len(),
                want.map_or_else(|| "uncountable number".to_string(), |w| w.to_string()),
                spec.shape
            )));
        }
        views.push((key, spec, view));
    }
    Ok(views)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::load_graph;
    use safetensors::tensor::{serialize, TensorView};

    fn graph() -> Graph {
        load_graph(
            r#"{ "format": "sluice/graph@1", "inputs": { "x": { "shape": ["N", 3] } },
                 "nodes": [{ "id": "fc", "op": "linear", "inputs": ["x"],
                             "attrs": { "out_features": 2, "bias": false } }],
                 "outputs": ["fc"] }"#,
        )
        .unwrap()
    }

    /// A safetensors file with a hand-written header and data.
    fn file(header: &str, claimed: Option<u64>, data: &[u8]) -> Vec<u8> {
        let len = claimed.unwrap_or(header.len() as u64);
        let mut out = len.to_le_bytes().to_vec();
        out.extend(header.as_bytes());
        out.extend(data);
        out
    }

    #[test]
    fn a_valid_file_loads() {
        let data = [0u8; 24];
        let view = TensorView::new(safetensors::Dtype::F32, vec![3, 2], &data).unwrap();
        let bytes = serialize([("fc.weight", view)], None).unwrap();
        let w = load_safetensors(&graph(), &bytes).unwrap();
        assert_eq!(w["fc.weight"].shape, vec![3, 2]);
    }

    #[test]
    fn lying_files_are_refused_before_conversion() {
        let g = graph();
        let header = r#"{"fc.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]}}"#;
        assert!(load_safetensors(&g, &file(header, None, &[0; 24])).is_ok());
        let refused = |bytes: &[u8]| load_safetensors(&g, bytes).unwrap_err().to_string();
        // Offsets past the data, sizes that disagree with the shape.
        let past = r#"{"fc.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[0,4000000000]}}"#;
        refused(&file(past, None, &[0; 24]));
        let short = r#"{"fc.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[0,8]}}"#;
        refused(&file(short, None, &[0; 8]));
        let huge = r#"{"fc.weight":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,24]}}"#;
        refused(&file(huge, None, &[0; 24]));
        // Header lengths past the file, over the limit, or absent.
        let e = refused(&file(header, Some(u64::MAX), &[0; 24]));
        assert!(e.contains("header claims"), "{e}");
        assert!(refused(&[1, 2, 3]).contains("8-byte"));
        let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(17 << 20));
        let e = refused(&file(&big, None, &[]));
        assert!(e.contains("max_document_bytes"), "{e}");
        // A dtype Sluice does not take, and far more tensors than the graph has nodes.
        let ints = r#"{"fc.weight":{"dtype":"I64","shape":[3,2],"data_offsets":[0,48]}}"#;
        assert!(refused(&file(ints, None, &[0; 48])).contains("dtype"));
        let many: Vec<String> = (0..100)
            .map(|i| format!(r#""t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#))
            .collect();
        let e = refused(&file(&format!("{{{}}}", many.join(",")), None, &[]));
        assert!(e.contains("tensors"), "{e}");
    }

    #[test]
    fn checking_refuses_what_loading_refuses() {
        let g = graph();
        let header = r#"{"fc.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]}}"#;
        assert!(check_safetensors(&g, &file(header, None, &[0; 24])).is_ok());
        let wide = r#"{"fc.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#;
        let other = r#"{"fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        for bytes in [
            file(wide, None, &[0; 24]),
            file(other, None, &[0; 8]),
            file(header, Some(u64::MAX), &[0; 24]),
        ] {
            let checked = check_safetensors(&g, &bytes).unwrap_err().to_string();
            assert_eq!(
                checked,
                load_safetensors(&g, &bytes).unwrap_err().to_string()
            );
        }
    }
}
