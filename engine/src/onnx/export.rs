//! Sluice → ONNX: a built graph and its weights written as a model other runtimes load.
//! The mapping mirrors the importer's: the ONNX name is the Sluice name in CamelCase
//! (with the importer's exceptions), attributes keep their names, attributes that ONNX
//! takes as inputs become initialisers, weights become initialisers. Operators with no
//! ONNX counterpart (training-only ones) are refused, each named.

use super::import::{CONST_INPUTS, NAMES, RENAMES, WEIGHT_INPUTS};
use super::proto::{
    attribute_type, data_type, AttributeProto, Dimension, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, TensorShapeProto, TypeProto, TypeTensor, ValueInfoProto,
};
use super::tensor::encode;
use crate::dtype::DType;
use crate::graph::{Graph, NodeKind};
use crate::ops::attrs::{per_axis_list, AttrKind};
use crate::ops::{self, TensorType};
use crate::shape::Dim;
use crate::tensor::Tensor;
use crate::weights::Weights;
use prost::Message;
use serde_json::Value as Json;

/// The opset exported models declare at least (raised when an operator needs a newer
/// one).
pub const BASE_OPSET: i64 = 18;

/// Why a graph cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Operators with no ONNX form, each named with its node.
    #[error("cannot export: {}", .0.join("; "))]
    Unsupported(Vec<String>),
    /// A weight the graph declares is missing.
    #[error("cannot export: weight '{0}' is missing")]
    MissingWeight(String),
}

/// Operators whose ONNX form needs a newer opset than [`BASE_OPSET`].
const MIN_OPSETS: &[(&str, i64)] = &[
    ("gelu", 20),
    ("group_norm", 21),
    ("rms_norm", 23),
    ("attention", 23),
];

/// Sluice operators with no ONNX counterpart.
const NOT_EXPORTED: &[&str] = &["dropout_train"];

/// The model's bytes: the graph for inference (a training graph's loss outputs, and the
/// nodes and inputs only they use, are left out).
pub fn export(graph: &Graph, weights: &Weights) -> Result<Vec<u8>, ExportError> {
    match inference_graph(graph)? {
        Some(pruned) => export_graph(&pruned, weights),
        None => export_graph(graph, weights),
    }
}

/// The graph an export writes when it differs from `graph`: without its loss outputs and
/// what only they use (`None` when the graph has no loss output).
pub fn inference_graph(graph: &Graph) -> Result<Option<Graph>, ExportError> {
    inference_doc(graph)
        .map(|doc| {
            Graph::build_with(doc, &graph.limits)
                .map_err(|p| ExportError::Unsupported(vec![p.to_string()]))
        })
        .transpose()
}

/// The document without its loss outputs and what only they use (`None` when the graph
/// has no loss output).
fn inference_doc(graph: &Graph) -> Option<crate::graph::GraphDoc> {
    let is_loss = |ix: petgraph::stable_graph::NodeIndex| matches!(&graph.dag[ix].kind, NodeKind::Op(op) if op.schema().family == "loss");
    if !graph.outputs.iter().any(|o| is_loss(o.node)) {
        return None;
    }
    let kept: Vec<_> = graph.outputs.iter().filter(|o| !is_loss(o.node)).collect();
    let mut needed = std::collections::HashSet::new();
    let mut stack: Vec<_> = kept.iter().map(|o| o.node).collect();
    while let Some(ix) = stack.pop() {
        if needed.insert(ix) {
            stack.extend(graph.node_inputs(ix).into_iter().map(|(src, _)| src));
        }
    }
    let ids: std::collections::HashSet<&str> =
        needed.iter().map(|&ix| graph.dag[ix].id.as_str()).collect();
    let mut doc = graph.doc.clone();
    doc.outputs = kept.iter().map(|o| o.name.clone()).collect();
    doc.nodes.retain(|n| ids.contains(n.id.as_str()));
    doc.inputs.retain(|name, _| ids.contains(name.as_str()));
    doc.layout.retain(|id, _| ids.contains(id.as_str()));
    doc.stages.retain(|id, _| ids.contains(id.as_str()));
    doc.training = None;
    Some(doc)
}

fn export_graph(graph: &Graph, weights: &Weights) -> Result<Vec<u8>, ExportError> {
    let mut w = Writer {
        weights,
        nodes: Vec::new(),
        initializers: Vec::new(),
        problems: Vec::new(),
        opset: BASE_OPSET,
        counter: 0,
    };
    for &ix in &graph.order {
        let node = &graph.dag[ix];
        if let NodeKind::Op(op) = &node.kind {
            if is_empty_constant(&node.kind) {
                continue; // written as an omitted optional input ("") where it is used
            }
            let inputs: Vec<String> = graph
                .node_inputs(ix)
                .into_iter()
                .map(|(src, port)| {
                    if is_empty_constant(&graph.dag[src].kind) {
                        String::new()
                    } else {
                        value_name(&graph.dag[src].id, port)
                    }
                })
                .collect();
            let attrs = graph
                .doc
                .nodes
                .iter()
                .find(|n| n.id == node.id)
                .map(|n| n.attrs.clone())
                .unwrap_or_default();
            w.node(&node.id, op, inputs, &attrs, &node.outputs);
        }
    }
    if !w.problems.is_empty() {
        return Err(ExportError::Unsupported(w.problems));
    }
    let inputs = graph
        .inputs
        .iter()
        .map(|(name, ix)| value_info(name, &graph.dag[*ix].outputs[0]))
        .collect();
    let outputs = graph
        .outputs
        .iter()
        .map(|o| {
            let node = &graph.dag[o.node];
            value_info(&value_name(&node.id, o.port), &node.outputs[o.port])
        })
        .collect();
    let model = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: w.opset,
        }],
        producer_name: "sluice".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: String::new(),
        graph: Some(GraphProto {
            node: w.nodes,
            name: if graph.doc.name.is_empty() {
                "sluice".into()
            } else {
                graph.doc.name.clone()
            },
            initializer: w.initializers,
            doc_string: String::new(),
            input: inputs,
            output: outputs,
            value_info: Vec::new(),
        }),
    };
    Ok(model.encode_to_vec())
}

/// Whether a node is a zero-element constant: what the importer writes for an omitted
/// optional input that comes before a given one.
fn is_empty_constant(kind: &NodeKind) -> bool {
    matches!(kind, NodeKind::Op(op) if op.constant_value().is_some_and(|t| t.is_empty()))
}

/// The ONNX value name of a node's output.
fn value_name(id: &str, port: usize) -> String {
    if port == 0 {
        id.to_string()
    } else {
        format!("{id}:{port}")
    }
}

fn value_info(name: &str, ty: &TensorType) -> ValueInfoProto {
    let dim = ty
        .shape
        .iter()
        .map(|d| match d {
            Dim::Known(v) => Dimension {
                dim_value: Some(*v as i64),
                dim_param: None,
            },
            Dim::Sym(s) => Dimension {
                dim_value: None,
                dim_param: Some(s.clone()),
            },
        })
        .collect();
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeTensor {
                elem_type: onnx_type(ty.dtype),
                shape: Some(TensorShapeProto { dim }),
            }),
        }),
        doc_string: String::new(),
    }
}

fn onnx_type(dtype: DType) -> i32 {
    match dtype {
        DType::F32 => data_type::FLOAT,
        DType::I32 => data_type::INT32,
        DType::Bool => data_type::BOOL,
    }
}

/// The ONNX name of a Sluice operator.
pub fn onnx_name(op: &str) -> String {
    if let Some((o, _)) = NAMES.iter().find(|(_, s)| *s == op) {
        return (*o).to_string();
    }
    op.split('_')
        .map(|part| {
            let mut c = part.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

struct Writer<'a> {
    weights: &'a Weights,
    nodes: Vec<NodeProto>,
    initializers: Vec<super::proto::TensorProto>,
    problems: Vec<String>,
    opset: i64,
    counter: usize,
}

impl Writer<'_> {
    /// Adds an initialiser and returns its name.
    fn init(&mut self, hint: &str, tensor: &Tensor) -> String {
        self.counter += 1;
        let name = format!("{hint}__{}", self.counter);
        self.initializers.push(encode(&name, tensor));
        name
    }

    fn ints(&mut self, hint: &str, values: &[i64]) -> String {
        self.counter += 1;
        let name = format!("{hint}__{}", self.counter);
        self.initializers.push(super::proto::TensorProto {
            dims: vec![values.len() as i64],
            data_type: data_type::INT64,
            name: name.clone(),
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ..Default::default()
        });
        name
    }

    fn push(
        &mut self,
        op_type: &str,
        inputs: Vec<String>,
        outputs: Vec<String>,
        attrs: Vec<AttributeProto>,
    ) {
        self.nodes.push(NodeProto {
            input: inputs,
            output: outputs,
            name: String::new(),
            op_type: op_type.to_string(),
            domain: String::new(),
            attribute: attrs,
            doc_string: String::new(),
        });
    }

    fn weight(&mut self, id: &str, key: &str) -> Option<String> {
        match self.weights.get(key) {
            Some(t) => Some(self.init(
                &format!("{id}.{}", key.rsplit('.').next().unwrap_or(key)),
                t,
            )),
            None => {
                self.problems
                    .push(ExportError::MissingWeight(key.to_string()).to_string());
                None
            }
        }
    }

    fn node(
        &mut self,
        id: &str,
        op: &ops::Op,
        inputs: Vec<String>,
        attrs: &serde_json::Map<String, Json>,
        outputs: &[TensorType],
    ) {
        let name = op.name();
        if NOT_EXPORTED.contains(&name) || matches!(op.schema().family, "grad" | "loss") {
            self.problems.push(format!(
                "node '{id}': {name} has no ONNX form (it is a training operator)"
            ));
            return;
        }
        if let Some((_, v)) = MIN_OPSETS.iter().find(|(o, _)| *o == name) {
            self.opset = self.opset.max(*v);
        }
        let outs: Vec<String> = (0..outputs.len()).map(|k| value_name(id, k)).collect();
        match name {
            "constant" => {
                if let Some(t) = op.constant_value() {
                    let init = self.init(id, t);
                    self.push("Identity", vec![init], outs, vec![]);
                }
                return;
            }
            "param" => {
                if let Some(key) = op.param_key() {
                    if let Some(init) = self.weight(id, key) {
                        self.push("Identity", vec![init], outs, vec![]);
                    }
                }
                return;
            }
            "dropout" | "identity" => {
                self.push("Identity", inputs, outs, vec![]);
                return;
            }
            "linear" => {
                let Some(w) = self.weight(id, &format!("{id}.weight")) else {
                    return;
                };
                if attrs.get("bias").and_then(Json::as_bool) == Some(false) {
                    self.push("MatMul", vec![inputs[0].clone(), w], outs, vec![]);
                } else {
                    let Some(b) = self.weight(id, &format!("{id}.bias")) else {
                        return;
                    };
                    let mid = format!("{id}__matmul");
                    self.push(
                        "MatMul",
                        vec![inputs[0].clone(), w],
                        vec![mid.clone()],
                        vec![],
                    );
                    self.push("Add", vec![mid, b], outs, vec![]);
                }
                return;
            }
            _ => {}
        }
        let op_type = onnx_name(name);
        let schema = op.schema();
        let mut onnx_inputs = inputs;
        // Weights as initialiser inputs.
        if let Some((_, slots)) = WEIGHT_INPUTS.iter().find(|(o, _)| *o == op_type) {
            for w in slots.iter().skip(1).flatten() {
                let key = format!("{id}.{w}");
                if self.weights.contains_key(&key) {
                    if let Some(init) = self.weight(id, &key) {
                        onnx_inputs.push(init);
                    }
                } else if *w != "bias" {
                    self.problems
                        .push(ExportError::MissingWeight(key).to_string());
                }
            }
        }
        // Attributes ONNX takes as inputs.
        let const_inputs: Vec<&(&str, usize, &str)> = CONST_INPUTS
            .iter()
            .filter(|(o, _, _)| *o == op_type)
            .filter(|(o, _, a)| !(*o == "Clip" && self.opset < 11 && (*a == "min" || *a == "max")))
            .collect();
        let mut out_attrs = Vec::new();
        for (key, value) in attrs {
            if value.is_null() {
                continue;
            }
            if const_inputs.iter().any(|(_, _, a)| a == key) {
                continue;
            }
            let onnx_key = RENAMES
                .iter()
                .find(|(o, _, s)| *o == op_type && s == key)
                .map_or(key.clone(), |(_, from, _)| (*from).to_string());
            let kind = schema.attrs.iter().find(|s| s.name == key).map(|s| s.kind);
            // ONNX has no shorthand: a per-axis value is written as its full list.
            let full = match kind {
                Some(AttrKind::PerAxis(len)) => per_axis_list(value, len).map(Json::from),
                _ => None,
            };
            // Two pads on a 2-D window are [ph, pw] on both sides; ONNX lists all four.
            let full = match (key.as_str(), full.as_ref().unwrap_or(value).as_array()) {
                ("pads", Some(p)) if p.len() == 2 && !one_d_window(attrs) => {
                    Some(Json::from(vec![
                        p[0].clone(),
                        p[1].clone(),
                        p[0].clone(),
                        p[1].clone(),
                    ]))
                }
                _ => full,
            };
            match attribute(&onnx_key, full.as_ref().unwrap_or(value), kind) {
                Some(a) => out_attrs.push(a),
                None => self
                    .problems
                    .push(format!("node '{id}': attribute '{key}' has no ONNX form")),
            }
        }
        for (_, index, attr) in const_inputs {
            while onnx_inputs.len() < *index {
                onnx_inputs.push(String::new());
            }
            let Some(value) = attrs.get(*attr).filter(|v| !v.is_null()) else {
                continue;
            };
            let kind = schema
                .attrs
                .iter()
                .find(|s| s.name == *attr)
                .map(|s| s.kind);
            let name = match (kind, value) {
                (Some(AttrKind::Float), v) => {
                    let x = v.as_f64().unwrap_or(0.0) as f32;
                    self.init(&format!("{id}.{attr}"), &Tensor::f32(vec![], vec![x]))
                }
                (Some(AttrKind::Floats), Json::Array(a)) => {
                    let x: Vec<f32> = a
                        .iter()
                        .filter_map(Json::as_f64)
                        .map(|v| v as f32)
                        .collect();
                    self.init(&format!("{id}.{attr}"), &Tensor::f32(vec![x.len()], x))
                }
                (_, Json::Array(a)) => {
                    let x: Vec<i64> = a.iter().filter_map(Json::as_i64).collect();
                    self.ints(&format!("{id}.{attr}"), &x)
                }
                (_, v) => {
                    let x = v.as_i64().unwrap_or(0);
                    self.counter += 1;
                    let name = format!("{id}.{attr}__{}", self.counter);
                    self.initializers.push(super::proto::TensorProto {
                        dims: vec![],
                        data_type: data_type::INT64,
                        name: name.clone(),
                        raw_data: x.to_le_bytes().to_vec(),
                        ..Default::default()
                    });
                    name
                }
            };
            if onnx_inputs.len() == *index {
                onnx_inputs.push(name);
            } else {
                onnx_inputs[*index] = name;
            }
        }
        while onnx_inputs.last().is_some_and(String::is_empty) {
            onnx_inputs.pop();
        }
        // Operator-specific spellings.
        match name {
            "conv2d" | "conv_transpose2d" => {
                out_attrs.retain(|a| a.name != "out_channels" && a.name != "bias");
            }
            "batch_norm" => out_attrs.retain(|a| a.name != "momentum"),
            "cast" => {
                let to_attr = |to: i32| AttributeProto {
                    name: "to".into(),
                    r#type: attribute_type::INT,
                    i: i64::from(to),
                    ..Default::default()
                };
                let to = match attrs.get("to").and_then(Json::as_str) {
                    Some("i32") => data_type::INT32,
                    Some("bool") => data_type::BOOL,
                    // A rounding to a 16-bit float kept as f32: a Cast to it, then one
                    // back to FLOAT.
                    Some(half @ ("f16" | "bf16")) => {
                        let t = if half == "f16" {
                            data_type::FLOAT16
                        } else {
                            data_type::BFLOAT16
                        };
                        let rounded = format!("{id}.{half}");
                        let x = std::mem::take(&mut onnx_inputs);
                        self.push("Cast", x, vec![rounded.clone()], vec![to_attr(t)]);
                        onnx_inputs = vec![rounded];
                        data_type::FLOAT
                    }
                    _ => data_type::FLOAT,
                };
                out_attrs.retain(|a| a.name != "to");
                out_attrs.push(to_attr(to));
            }
            "reduce_sum" | "reduce_mean" | "reduce_max" | "reduce_min" | "reduce_prod"
            | "reduce_l2"
                if attrs
                    .get("axes")
                    .and_then(Json::as_array)
                    .is_some_and(Vec::is_empty) =>
            {
                out_attrs.push(AttributeProto {
                    name: "noop_with_empty_axes".into(),
                    r#type: attribute_type::INT,
                    i: 1,
                    ..Default::default()
                });
            }
            "split" => {
                if let Some(n) = attrs.get("num_outputs").and_then(Json::as_i64) {
                    out_attrs.retain(|a| a.name != "num_outputs");
                    out_attrs.push(AttributeProto {
                        name: "num_outputs".into(),
                        r#type: attribute_type::INT,
                        i: n,
                        ..Default::default()
                    });
                } else if !attrs.contains_key("sizes") {
                    out_attrs.push(AttributeProto {
                        name: "num_outputs".into(),
                        r#type: attribute_type::INT,
                        i: outputs.len() as i64,
                        ..Default::default()
                    });
                }
            }
            "one_hot" => {
                let depth = attrs.get("depth").and_then(Json::as_i64).unwrap_or(1);
                let d = self.ints(&format!("{id}.depth"), &[depth]);
                let v = self.init(
                    &format!("{id}.values"),
                    &Tensor::f32(vec![2], vec![0.0, 1.0]),
                );
                out_attrs.retain(|a| a.name != "depth");
                onnx_inputs.push(d);
                onnx_inputs.push(v);
            }
            "avg_pool2d" if attrs.get("dilations").is_some() => {
                self.opset = self.opset.max(19);
            }
            _ => {}
        }
        self.push(&op_type, onnx_inputs, outs, out_attrs);
    }
}

/// A Sluice attribute as an ONNX one (bools as 0/1 integers).
/// Whether a node's window is 1-D: a one-entry `kernel_size` (whose `pads` are then
/// [begin, end], as ONNX's 1-D pads are).
fn one_d_window(attrs: &serde_json::Map<String, Json>) -> bool {
    attrs
        .get("kernel_size")
        .and_then(Json::as_array)
        .is_some_and(|k| k.len() == 1)
}

fn attribute(name: &str, value: &Json, kind: Option<AttrKind>) -> Option<AttributeProto> {
    let mut a = AttributeProto {
        name: name.to_string(),
        ..Default::default()
    };
    match value {
        Json::Bool(b) => {
            a.r#type = attribute_type::INT;
            a.i = i64::from(*b);
        }
        Json::Number(n) => {
            if kind == Some(AttrKind::Float)
                || (n.as_i64().is_none() && kind != Some(AttrKind::Int))
            {
                a.r#type = attribute_type::FLOAT;
                a.f = n.as_f64()? as f32;
            } else {
                a.r#type = attribute_type::INT;
                a.i = n.as_i64()?;
            }
        }
        Json::String(s) => {
            a.r#type = attribute_type::STRING;
            a.s = s.as_bytes().to_vec();
        }
        Json::Array(items) => {
            if kind == Some(AttrKind::Floats) || items.iter().any(|v| v.as_i64().is_none()) {
                a.r#type = attribute_type::FLOATS;
                a.floats = items
                    .iter()
                    .map(|v| v.as_f64().map(|x| x as f32))
                    .collect::<Option<_>>()?;
            } else {
                a.r#type = attribute_type::INTS;
                a.ints = items.iter().map(Json::as_i64).collect::<Option<_>>()?;
            }
        }
        _ => return None,
    }
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_single_integer_window_is_written_as_full_onnx_lists() {
        let doc = json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 1, 8, 8] } },
            "nodes": [
                { "id": "c", "op": "conv2d", "inputs": ["x"],
                  "attrs": { "out_channels": 2, "kernel_size": 3, "pads": 1, "strides": 2 } },
                { "id": "p", "op": "max_pool2d", "inputs": ["c"], "attrs": { "kernel_size": 2 } }
            ],
            "outputs": ["p"]
        });
        let graph = crate::graph::load_graph(&doc.to_string()).unwrap();
        let weights = crate::weights::init_weights(&graph, 1);
        let bytes = export(&graph, &weights).unwrap();
        let model = ModelProto::decode(bytes.as_slice()).unwrap();
        let nodes = model.graph.unwrap().node;
        let ints = |op: &str, name: &str| {
            let node = nodes.iter().find(|n| n.op_type == op).unwrap();
            let a = node.attribute.iter().find(|a| a.name == name).unwrap();
            assert_eq!(a.r#type, attribute_type::INTS, "{op}.{name}");
            a.ints.clone()
        };
        assert_eq!(ints("Conv", "kernel_shape"), vec![3, 3]);
        assert_eq!(ints("Conv", "pads"), vec![1, 1, 1, 1]);
        assert_eq!(ints("Conv", "strides"), vec![2, 2]);
        assert_eq!(ints("MaxPool", "kernel_shape"), vec![2, 2]);
    }

    #[test]
    fn two_pads_on_a_2d_window_are_written_as_four() {
        let doc = json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 1, 8, 8] } },
            "nodes": [
                { "id": "c", "op": "conv2d", "inputs": ["x"],
                  "attrs": { "out_channels": 2, "kernel_size": [3, 3], "pads": [1, 2] } }
            ],
            "outputs": ["c"]
        });
        let graph = crate::graph::load_graph(&doc.to_string()).unwrap();
        let weights = crate::weights::init_weights(&graph, 1);
        let model = ModelProto::decode(export(&graph, &weights).unwrap().as_slice()).unwrap();
        let conv = model
            .graph
            .unwrap()
            .node
            .into_iter()
            .find(|n| n.op_type == "Conv")
            .unwrap();
        let pads = conv.attribute.iter().find(|a| a.name == "pads").unwrap();
        assert_eq!(pads.ints, vec![1, 2, 1, 2], "[top, left, bottom, right]");
    }
}
