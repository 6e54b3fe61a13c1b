//! Gradient family: backward operators where composing forward operators would be slow or
//! impossible (`unary_grad`: dy times a unary operator's derivative at x, one pass). The
//! rules that emit them are in each family file (`fn grad`, over
//! [`super::backward::GradContext`]).

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec};
use super::backward::GradContext;
use super::elementwise::Unary;
use super::{broadcast_batch, need_f32, Arity, Capabilities, OpSchema, TensorType};
use crate::shape::{broadcast, show};

/// Family tag.
pub const FAMILY: &str = "gradient";

/// The unary operators `unary_grad` differentiates.
pub const UNARIES: &[&str] = &[
    "relu", "sigmoid", "tanh", "gelu", "exp", "log", "sqrt", "erf", "clip",
];

const UNARY_GRAD_ATTRS: &[AttrSpec] = &[
    required("op", AttrKind::Choice(UNARIES), "The unary operator."),
    optional(
        "approximate",
        AttrKind::Choice(&["none", "tanh"]),
        "\"none\"",
        "gelu's form, as in the forward operator.",
    ),
    optional("min", AttrKind::Float, "null", "clip's lower bound."),
    optional("max", AttrKind::Float, "null", "clip's upper bound."),
];

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[OpSchema {
    name: "unary_grad",
    family: FAMILY,
    doc: "dy × f′(x) for a unary operator f (the backward of relu, gelu, clip, ...).",
    inputs: Arity::Fixed(&["x", "dy"]),
    outputs: &["dx"],
    attrs: UNARY_GRAD_ATTRS,
    params: &[],
}];

/// A parsed gradient-family operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum GradOp {
    /// `unary_grad`: dy × f′(x).
    UnaryGrad(Unary),
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<GradOp> {
    if name != "unary_grad" {
        return None;
    }
    let unary = match r.choice("op").as_str() {
        "sigmoid" => Unary::Sigmoid,
        "tanh" => Unary::Tanh,
        "gelu" => Unary::Gelu {
            tanh: r.choice("approximate") == "tanh",
        },
        "exp" => Unary::Exp,
        "log" => Unary::Log,
        "sqrt" => Unary::Sqrt,
        "erf" => Unary::Erf,
        "clip" => Unary::Clip {
            min: r.opt_float("min"),
            max: r.opt_float("max"),
        },
        // "relu", and the fallback after a problem was recorded.
        _ => Unary::Relu,
    };
    Some(GradOp::UnaryGrad(unary))
}

impl GradOp {
    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self {
            GradOp::UnaryGrad(_) => "unary_grad",
        }
    }

    /// `unary_grad` is pointwise: it fuses with other pointwise operators.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            pointwise: true,
            ..Capabilities::default()
        }
    }

    /// Output type: the broadcast of x and dy.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        need_f32(name, "x", &inputs[0])?;
        need_f32(name, "dy", &inputs[1])?;
        let shape = broadcast(&inputs[0].shape, &inputs[1].shape).map_err(|_| {
            format!(
                "{name}: x {} and dy {} do not broadcast",
                show(&inputs[0].shape),
                show(&inputs[1].shape)
            )
        })?;
        Ok(vec![TensorType::f32(shape)])
    }

    /// Batch rule: elementwise, as the binary operators.
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let rank = outputs[0].shape.len();
        Ok(vec![broadcast_batch(self.name(), inputs, batch, rank)?])
    }

    /// Gradient rule: backward operators are not differentiated again (no second order).
    pub(crate) fn grad(&self, _g: &mut dyn GradContext) -> Result<(), String> {
        Err(format!(
            "{} has no gradient (no second derivatives)",
            self.name()
        ))
    }
}
