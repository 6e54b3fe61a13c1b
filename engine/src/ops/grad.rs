//! Gradient family: backward operators where composing forward operators would be slow or
//! impossible (`unary_grad`: dy times a unary operator's derivative at x, one pass;
//! `softmax_grad`, `log_softmax_grad`: one sum along the axis, then one pass). The
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

const SOFTMAX_GRAD_ATTRS: &[AttrSpec] = &[optional(
    "axis",
    AttrKind::Int,
    "-1",
    "The forward operator's axis.",
)];

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    OpSchema {
        name: "unary_grad",
        family: FAMILY,
        doc: "dy × f′(x) for a unary operator f (the backward of relu, gelu, clip, ...).",
        inputs: Arity::Fixed(&["x", "dy"]),
        outputs: &["dx"],
        attrs: UNARY_GRAD_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "softmax_grad",
        family: FAMILY,
        doc: "y × (dy − Σ dy·y) along an axis: the backward of softmax from its output y.",
        inputs: Arity::Fixed(&["y", "dy"]),
        outputs: &["dx"],
        attrs: SOFTMAX_GRAD_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "log_softmax_grad",
        family: FAMILY,
        doc: "dy − exp(y) × Σ dy along an axis: the backward of log_softmax from its output y.",
        inputs: Arity::Fixed(&["y", "dy"]),
        outputs: &["dx"],
        attrs: SOFTMAX_GRAD_ATTRS,
        params: &[],
    },
];

/// A parsed gradient-family operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum GradOp {
    /// `unary_grad`: dy × f′(x).
    UnaryGrad(Unary),
    /// `softmax_grad` or `log_softmax_grad`.
    SoftmaxGrad {
        /// The forward operator's axis.
        axis: i64,
        /// log_softmax's.
        log: bool,
    },
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<GradOp> {
    match name {
        "unary_grad" => {}
        "softmax_grad" | "log_softmax_grad" => {
            return Some(GradOp::SoftmaxGrad {
                axis: r.int("axis"),
                log: name == "log_softmax_grad",
            })
        }
        _ => return None,
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
            GradOp::SoftmaxGrad { log: false, .. } => "softmax_grad",
            GradOp::SoftmaxGrad { log: true, .. } => "log_softmax_grad",
        }
    }

    /// `unary_grad` is pointwise: it fuses with other pointwise operators.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            pointwise: matches!(self, GradOp::UnaryGrad(_)),
            ..Capabilities::default()
        }
    }

    /// Output type: the broadcast of x and dy; for the softmax backwards, y's type (dy
    /// must have it too).
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        need_f32(name, "input 0", &inputs[0])?;
        need_f32(name, "dy", &inputs[1])?;
        if let GradOp::SoftmaxGrad { axis, .. } = self {
            if inputs[0].shape != inputs[1].shape {
                return Err(format!(
                    "{name}: y {} and dy {} differ",
                    show(&inputs[0].shape),
                    show(&inputs[1].shape)
                ));
            }
            crate::shape::existing_axis(*axis, inputs[0].shape.len())?;
            return Ok(vec![inputs[0].clone()]);
        }
        let shape = broadcast(&inputs[0].shape, &inputs[1].shape).map_err(|_| {
            format!(
                "{name}: x {} and dy {} do not broadcast",
                show(&inputs[0].shape),
                show(&inputs[1].shape)
            )
        })?;
        Ok(vec![TensorType::f32(shape)])
    }

    /// Batch rule: elementwise, as the binary operators; the softmax backwards couple
    /// along their axis, as softmax does.
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let rank = outputs[0].shape.len();
        let b = broadcast_batch(self.name(), inputs, batch, rank)?;
        if let (GradOp::SoftmaxGrad { axis, .. }, Some(b)) = (self, b) {
            if crate::shape::axis(*axis, rank)? == b {
                return Err(format!("{} along axis {b}, the batch axis", self.name()));
            }
        }
        Ok(vec![b])
    }

    /// Gradient rule: backward operators are not differentiated again (no second order).
    pub(crate) fn grad(&self, _g: &mut dyn GradContext) -> Result<(), String> {
        Err(format!(
            "{} has no gradient (no second derivatives)",
            self.name()
        ))
    }
}
