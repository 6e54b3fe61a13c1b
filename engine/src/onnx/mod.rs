//! ONNX models in and out. [`import`] reads a model's bytes (protobuf, decoded by
//! `prost` into the subset of `onnx.proto` in [`proto`]) into a `sluice/graph@1`
//! document and its weights; [`export`] writes a graph and its weights as an ONNX model
//! that other runtimes load. Like the rest of the engine it parses bytes and touches no
//! files: external tensor data is read through the caller's [`ExternalData`].

pub mod export;
pub mod fold;
pub mod import;
pub mod proto;
pub mod tensor;

pub use export::{export, ExportError};
pub use tensor::{ExternalData, NoExternalData};

use crate::graph::doc::GraphDoc;
use crate::graph::Limits;
use crate::weights::Weights;
use prost::Message;
use std::collections::BTreeMap;

/// An imported model.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The graph document.
    pub doc: GraphDoc,
    /// Its weights by key (`node.param`).
    pub weights: Weights,
    /// The model's standard opset.
    pub opset: i64,
    /// Nodes in the ONNX graph.
    pub onnx_nodes: usize,
    /// ONNX nodes computed at import (constants, shape arithmetic).
    pub folded: usize,
    /// The model's inputs in order: (ONNX name, Sluice input name; they differ where the
    /// ONNX name holds a `:`).
    pub inputs: Vec<(String, String)>,
}

/// Something in a model that Sluice cannot run, with the node it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unsupported {
    /// The node's name (or first output), or the graph input or output.
    pub node: String,
    /// Its ONNX operator ("graph input", "graph output" for those).
    pub op_type: String,
    /// What is not supported, and why.
    pub what: String,
}

/// Why a model cannot be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The bytes are not an ONNX model.
    #[error("not an ONNX model: {0}")]
    Decode(String),
    /// The model as a whole is outside what Sluice reads (opset, size, no graph).
    #[error("{0}")]
    Model(String),
    /// A tensor cannot be read.
    #[error("tensor '{tensor}': {message}")]
    Tensor {
        /// Its name.
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// The model goes over one of the limits while it is imported (a folded constant
    /// over `max_constant_elements`, or more than `max_import_bytes` held): the import
    /// stops there, before anything more is allocated.
    #[error("{0}")]
    Limit(crate::error::LimitError),
    /// The model uses operators or attributes Sluice cannot run: every one of them.
    #[error("{}", render_unsupported(.0))]
    Unsupported(Vec<Unsupported>),
}

fn render_unsupported(list: &[Unsupported]) -> String {
    let mut ops: Vec<&str> = list.iter().map(|u| u.op_type.as_str()).collect();
    ops.sort_unstable();
    ops.dedup();
    let mut out = format!(
        "the model uses {} thing(s) Sluice cannot run (operators: {}):",
        list.len(),
        ops.join(", ")
    );
    for u in list {
        out.push_str(&format!(
            "\n  node '{}' ({}): {}",
            u.node, u.op_type, u.what
        ));
    }
    out
}

/// Imports an ONNX model from its bytes, reading external tensor data through
/// `external`, within `limits` (the model's size is bounded by the caller). Every named
/// dynamic dimension stays a symbol.
pub fn import(
    bytes: &[u8],
    external: &dyn ExternalData,
    limits: &Limits,
) -> Result<Imported, ImportError> {
    import_with_dims(bytes, external, limits, &BTreeMap::new())
}

/// [`import`] with sizes for some of the model's named dimensions (`samples` = 16000):
/// what a model needs whose operators need a size that the model leaves open.
pub fn import_with_dims(
    bytes: &[u8],
    external: &dyn ExternalData,
    limits: &Limits,
    dims: &BTreeMap<String, usize>,
) -> Result<Imported, ImportError> {
    let model = proto::ModelProto::decode(bytes).map_err(|e| ImportError::Decode(e.to_string()))?;
    import::import_model(&model, external, limits, dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MLP: &[u8] = include_bytes!("../../../tests/data/onnx-models/mlp_tiny/model.onnx");

    #[test]
    fn a_real_model_imports() {
        let m = import(MLP, &NoExternalData, &Limits::default()).unwrap();
        assert_eq!(m.opset, 17);
        assert_eq!(m.doc.nodes.len(), 3);
    }

    #[test]
    fn truncated_and_corrupted_models_are_errors_never_panics() {
        let limits = Limits::default();
        for cut in 0..MLP.len() {
            let _ = import(&MLP[..cut], &NoExternalData, &limits);
        }
        let mut rng = crate::rng::Rng::new(7);
        for _ in 0..2000 {
            let mut bytes = MLP.to_vec();
            for _ in 0..1 + (rng.next_u64() % 4) {
                let i = (rng.next_u64() % bytes.len() as u64) as usize;
                bytes[i] = rng.next_u64() as u8;
            }
            let _ = import(&bytes, &NoExternalData, &limits);
        }
    }

    #[test]
    fn malformed_nodes_are_errors_never_panics() {
        let base = proto::ModelProto::decode(MLP).unwrap();
        let limits = Limits::default();
        for (op, inputs, outputs) in [
            ("Identity", vec![], vec!["y"]),
            ("Gemm", vec!["x"], vec!["y"]),
            ("Relu", vec!["x"], vec![]),
            ("Sum", vec![], vec!["y"]),
            ("LRN", vec!["x"], vec!["y"]),
            ("Slice", vec!["x", "", "", "", ""], vec!["y"]),
        ] {
            let mut model = base.clone();
            let graph = model.graph.as_mut().unwrap();
            graph.node.insert(
                0,
                proto::NodeProto {
                    op_type: op.into(),
                    input: inputs.iter().map(|s| s.to_string()).collect(),
                    output: outputs.iter().map(|s| s.to_string()).collect(),
                    ..Default::default()
                },
            );
            let _ = import(&model.encode_to_vec(), &NoExternalData, &limits);
        }
    }

    #[test]
    fn unsupported_operators_are_all_named_once() {
        let mut model = proto::ModelProto::decode(MLP).unwrap();
        let graph = model.graph.as_mut().unwrap();
        for node in &mut graph.node {
            node.op_type = format!("Frobnicate{}", node.op_type);
        }
        let err = import(&model.encode_to_vec(), &NoExternalData, &Limits::default())
            .unwrap_err()
            .to_string();
        // The first node fails, the rest depend on it: one problem, naming the node.
        assert!(err.contains("FrobnicateGemm"), "{err}");
        assert_eq!(err.matches("node '").count(), 1, "{err}");
    }
}
