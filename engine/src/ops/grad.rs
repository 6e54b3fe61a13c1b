//! Gradient family: backward operators where composing forward operators would be slow or
//! impossible (`unary_grad`: dy times a unary operator's derivative at x, one pass;
//! `softmax_grad`, `log_softmax_grad`: one sum along the axis, then one pass;
//! `gather_grad`: gather's scatter-add, written as a gather over the indices). The
//! rules that emit them are in each family file (`fn grad`, over
//! [`super::backward::GradContext`]).

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec};
use super::backward::GradContext;
use super::elementwise::Unary;
use super::{broadcast_batch, need_f32, Arity, Capabilities, IndexInput, OpSchema, TensorType};
use crate::dtype::DType;
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
    OpSchema {
        name: "gather_grad",
        family: FAMILY,
        doc: "dx of gather: dy added into x's shape at the indices along an axis (scatter-add).",
        inputs: Arity::Fixed(&["x", "indices", "dy"]),
        outputs: &["dx"],
        attrs: &[optional("axis", AttrKind::Int, "0", "gather's axis.")],
        params: &[],
    },
];

/// A parsed gradient-family operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum GradOp {
    /// `unary_grad`: dy × f′(x).
    UnaryGrad(Unary),
    /// `gather_grad` along an axis.
    GatherGrad {
        /// gather's axis.
        axis: i64,
    },
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
        "gather_grad" => {
            return Some(GradOp::GatherGrad {
                axis: r.int("axis"),
            })
        }
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
            GradOp::GatherGrad { .. } => "gather_grad",
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
        if let GradOp::GatherGrad { axis } = self {
            return gather_grad_infer(*axis, inputs);
        }
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
        if let GradOp::GatherGrad { axis } = self {
            return gather_grad_batch(*axis, inputs, batch).map(|b| vec![b]);
        }
        let b = broadcast_batch(self.name(), inputs, batch, rank)?;
        if let (GradOp::SoftmaxGrad { axis, .. }, Some(b)) = (self, b) {
            if crate::shape::axis(*axis, rank)? == b {
                return Err(format!("{} along axis {b}, the batch axis", self.name()));
            }
        }
        Ok(vec![b])
    }

    /// `gather_grad` reads input 1 as indices into input 0.
    pub fn index_input(&self) -> Option<IndexInput> {
        match self {
            GradOp::GatherGrad { axis } => Some(IndexInput {
                indices: 1,
                data: 0,
                axis: *axis,
                non_negative: false,
            }),
            _ => None,
        }
    }

    /// Gradient rule: backward operators are not differentiated again (no second order).
    pub(crate) fn grad(&self, _g: &mut dyn GradContext) -> Result<(), String> {
        Err(format!(
            "{} has no gradient (no second derivatives)",
            self.name()
        ))
    }
}

/// `gather_grad`'s type: x's, once dy is checked to be gather's output
/// (x[..axis] ++ indices ++ x[axis + 1..]).
fn gather_grad_infer(axis: i64, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
    let (x, indices, dy) = (&inputs[0], &inputs[1], &inputs[2]);
    need_f32("gather_grad", "x", x)?;
    need_f32("gather_grad", "dy", dy)?;
    if indices.dtype != DType::I32 {
        return Err(format!("gather_grad needs i32 indices, got {indices}"));
    }
    let a = crate::shape::existing_axis(axis, x.shape.len())?;
    let mut want = x.shape[..a].to_vec();
    want.extend(indices.shape.iter().cloned());
    want.extend(x.shape[a + 1..].iter().cloned());
    if dy.shape != want {
        return Err(format!(
            "gather_grad: dy {} is not gather's output {}",
            show(&dy.shape),
            show(&want)
        ));
    }
    Ok(vec![x.clone()])
}

/// `gather_grad`'s batch rule: dx sums dy over the indices' axes, so a batch among them
/// (an embedding's gradient over the samples) couples; elsewhere it is x's axis.
fn gather_grad_batch(
    axis: i64,
    inputs: &[TensorType],
    batch: &[Option<usize>],
) -> Result<Option<usize>, String> {
    let a = crate::shape::existing_axis(axis, inputs[0].shape.len())?;
    let ri = inputs[1].shape.len();
    let couples = |what: &str| {
        format!("gather_grad sums over the indices' axes, and {what} carries the batch")
    };
    if batch[1].is_some() {
        return Err(couples("the indices"));
    }
    let from_dy = match batch[2] {
        Some(b) if b >= a && b < a + ri => return Err(couples("dy along an indexed axis")),
        Some(b) if b < a => Some(b),
        Some(b) => Some(b + 1 - ri),
        None => None,
    };
    match (batch[0], from_dy) {
        (Some(x), Some(d)) if x != d => Err(format!(
            "gather_grad pairs x's batch (axis {x}) with dy's (axis {d}): every sample meets every other"
        )),
        (Some(_), _) if batch[0] == Some(a) => Err(couples("x along the gathered axis")),
        (x, d) => Ok(x.or(d)),
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule};
    use serde_json::json;

    #[test]
    fn batch_rules_follow_the_forward_operators() {
        let ug = json!({ "op": "relu" });
        let r = rule("unary_grad", ug, &[("N,4", Some(0)), ("N,4", Some(0))]);
        assert_eq!(r, Ok(vec![Some(0)]));
        let sg = |axis: i64| json!({ "axis": axis });
        let pair = [("N,4", Some(0)), ("N,4", Some(0))];
        assert_eq!(rule("softmax_grad", sg(-1), &pair), Ok(vec![Some(0)]));
        couples(
            rule("log_softmax_grad", sg(0), &pair),
            &["log_softmax_grad along axis 0"],
        );
    }

    #[test]
    fn an_embedding_gradient_sums_over_the_samples() {
        let gg = |axis: i64| json!({ "axis": axis });
        // x [V, d] unbatched, indices [N, T] and dy [N, T, d] batched: dx sums samples.
        couples(
            rule(
                "gather_grad",
                gg(0),
                &[("9,4", None), ("i32:N,3", Some(0)), ("N,3,4", Some(0))],
            ),
            &["gather_grad", "indices"],
        );
        // Gathering along axis 1 of batched rows keeps the batch on axis 0.
        let r = rule(
            "gather_grad",
            gg(1),
            &[("N,9", Some(0)), ("i32:3", None), ("N,3", Some(0))],
        );
        assert_eq!(r, Ok(vec![Some(0)]));
    }
}
