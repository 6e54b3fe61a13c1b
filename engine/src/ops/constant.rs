//! `constant`: a tensor given in the graph file, uploaded once with the weights.

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec};
use super::{Arity, OpSchema, TensorType};
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
