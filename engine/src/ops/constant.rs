//! `constant`: a tensor given in the graph file, uploaded once with the weights; `param`:
//! a weight read by key as a value (what backward nodes use to read a forward weight).

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec};
use super::{Arity, Init, OpSchema, ParamSpec, TensorType};
use crate::shape::known;
use crate::tensor::Tensor;

/// Family tag.
pub const FAMILY: &str = "constant";

const ATTRS: &[AttrSpec] = &[
    required("value", AttrKind::Floats, "The elements, row-major."),
    optional(
        "shape",
        AttrKind::Ints,
        "null",
        "Shape (a 1-D list of the values when absent; [] for a scalar).",
    ),
];

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[OpSchema {
    name: "constant",
    family: FAMILY,
    doc: "A constant f32 tensor given in the graph file.",
    inputs: Arity::Fixed(&[]),
    outputs: &["y"],
    attrs: ATTRS,
    params: &[],
}];

/// Largest constant accepted in a graph file, in elements.
pub const MAX_ELEMENTS: usize = 1 << 20;

/// A parsed constant.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ConstantOp {
    /// The tensor.
    pub value: Tensor,
}

/// Parses attributes: the values must fill the shape exactly.
pub fn parse(r: &mut AttrReader) -> ConstantOp {
    let values = r.floats("value");
    let shape: Vec<usize> = match r.opt_ints("shape") {
        None => vec![values.len()],
        Some(s) if s.iter().all(|&d| (0..=MAX_ELEMENTS as i64).contains(&d)) => {
            s.iter().map(|&d| d as usize).collect()
        }
        Some(s) => {
            r.reject(
                "shape",
                format!("shape {s:?} has a negative or oversized dimension"),
            );
            vec![values.len()]
        }
    };
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if n != Some(values.len()) || values.len() > MAX_ELEMENTS {
        r.reject(
            "value",
            format!(
                "{} values do not fill shape {shape:?} (at most {MAX_ELEMENTS} elements)",
                values.len()
            ),
        );
        return ConstantOp {
            value: Tensor::f32(vec![0], vec![]),
        };
    }
    ConstantOp {
        value: Tensor::f32(shape, values),
    }
}

impl ConstantOp {
    /// Its type.
    pub fn infer(&self, _inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        Ok(vec![TensorType::f32(known(&self.value.shape))])
    }

    /// Batch rule: a constant never depends on the batch.
    pub fn batch(
        &self,
        _inputs: &[TensorType],
        _batch: &[Option<usize>],
        outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        Ok(vec![None; outputs.len()])
    }
}

/// Schemas of `param`, in the constant family (a tensor that comes from outside the
/// graph's dataflow: the weights, not the file).
pub const PARAM_SCHEMAS: &[OpSchema] = &[OpSchema {
    name: "param",
    family: FAMILY,
    doc: "The weight stored under `key` (another node's `node.param`), read as a value.",
    inputs: Arity::Fixed(&[]),
    outputs: &["y"],
    attrs: PARAM_ATTRS,
    params: &["value"],
}];

const PARAM_ATTRS: &[AttrSpec] = &[
    required(
        "key",
        AttrKind::Text,
        "The weight's key, such as \"fc1.weight\".",
    ),
    required("shape", AttrKind::Ints, "The weight's shape."),
];

/// A parsed `param`: the weight stored under `key`, of shape `shape`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ParamOp {
    /// The weight's key (`node.param`).
    pub key: String,
    /// Its shape.
    pub shape: Vec<usize>,
}

/// Parses a `param`'s attributes: a non-empty key and a shape of sizes.
pub fn parse_param(r: &mut AttrReader) -> ParamOp {
    let key = r.text("key");
    if key.is_empty() {
        r.reject("key", "a param needs a non-empty key");
    }
    let dims = r.ints("shape");
    let max = super::attrs::MAX_SIZE;
    let shape = if dims.iter().all(|&d| (0..=max).contains(&d)) {
        dims.iter()
            .filter_map(|&d| usize::try_from(d).ok())
            .collect()
    } else {
        r.reject(
            "shape",
            format!("shape {dims:?} has a negative or oversized dimension"),
        );
        Vec::new()
    };
    ParamOp { key, shape }
}

impl ParamOp {
    /// Its type: the weight's.
    pub fn infer(&self, _inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        Ok(vec![TensorType::f32(known(&self.shape))])
    }

    /// The one weight it reads (its key is [`ParamOp::key`], not `node.value`).
    pub fn params(&self) -> Vec<ParamSpec> {
        let fan_in = self.shape.first().copied().unwrap_or(1).max(1);
        vec![ParamSpec {
            name: "value",
            shape: self.shape.clone(),
            init: Init::Uniform(1.0 / (fan_in as f32).sqrt()),
        }]
    }
}
