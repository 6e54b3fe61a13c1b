//! Loss family: `softmax_cross_entropy`, `nll_loss`, `mse_loss` and `bce_with_logits`,
//! each with PyTorch's definition and its `reduction` ("mean", "sum" or "none"). Kernels:
//! `shaders/loss.wgsl` (one invocation per loss element, then one workgroup summing them
//! for "mean" and "sum"); losses compute and sum in f32 under every precision.
//!
//! The class losses take logits or log-probabilities `[..., C]` (the class axis is the
//! last) and i32 labels `[...]`, the same shape without it. Labels index the class axis:
//! labels that come from a graph input are checked on the host before upload, and the CPU
//! reference refuses an out-of-range label; a label computed inside the graph cannot be
//! checked there, and the GPU gives NaN for its element instead of reading past the row.
//! `mse_loss` and `bce_with_logits` take two f32 tensors of one shape (no broadcasting).
//!
//! "mean" and "sum" give a rank-0 `[]` result and combine every sample, so they couple the
//! batch; "none" gives the per-element losses and keeps the batch axis.

use super::attrs::{optional, AttrKind, AttrReader, AttrSpec};
use super::backward::GradContext;
use super::{need_f32, Arity, IndexInput, OpSchema, TensorType};
use crate::dtype::DType;
use crate::shape::{show, Dim};

/// Family tag.
pub const FAMILY: &str = "loss";

const REDUCTION: AttrSpec = optional(
    "reduction",
    AttrKind::Choice(&["mean", "sum", "none"]),
    "\"mean\"",
    "\"mean\" or \"sum\" over every element (a [] result), or \"none\" (the per-element losses).",
);

const CE_ATTRS: &[AttrSpec] = &[
    REDUCTION,
    optional(
        "label_smoothing",
        AttrKind::Float,
        "0.0",
        "ε in [0, 1]: loss = (1 − ε)·(−log p[label]) + ε·mean over classes of (−log p).",
    ),
];

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    OpSchema {
        name: "softmax_cross_entropy",
        family: FAMILY,
        doc: "Cross entropy of softmax(logits) [..., C] against i32 class labels [...] (PyTorch's cross_entropy, class axis last).",
        inputs: Arity::Fixed(&["logits", "labels"]),
        outputs: &["loss"],
        attrs: CE_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "nll_loss",
        family: FAMILY,
        doc: "Negative log likelihood −log_probs[..., label] of log-probabilities [..., C] and i32 labels [...].",
        inputs: Arity::Fixed(&["log_probs", "labels"]),
        outputs: &["loss"],
        attrs: &[REDUCTION],
        params: &[],
    },
    OpSchema {
        name: "mse_loss",
        family: FAMILY,
        doc: "Squared error (prediction − target)² of two f32 tensors of one shape.",
        inputs: Arity::Fixed(&["prediction", "target"]),
        outputs: &["loss"],
        attrs: &[REDUCTION],
        params: &[],
    },
    OpSchema {
        name: "bce_with_logits",
        family: FAMILY,
        doc: "Binary cross entropy of sigmoid(logits) against targets of one shape: max(x, 0) − x·t + log(1 + exp(−|x|)).",
        inputs: Arity::Fixed(&["logits", "targets"]),
        outputs: &["loss"],
        attrs: &[REDUCTION],
        params: &[],
    },
];

/// How the per-element losses are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reduction {
    /// Their mean, a rank-0 result.
    Mean,
    /// Their sum, a rank-0 result.
    Sum,
    /// Not combined.
    None,
}

/// Which loss.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    /// Softmax cross entropy with label smoothing ε.
    SoftmaxCrossEntropy {
        /// ε in [0, 1].
        label_smoothing: f32,
    },
    /// Negative log likelihood.
    Nll,
    /// Squared error.
    Mse,
    /// Binary cross entropy on logits.
    BceWithLogits,
}

/// A parsed loss.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossOp {
    /// Which loss.
    pub kind: LossKind,
    /// How elements are combined.
    pub reduction: Reduction,
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<LossOp> {
    let kind = match name {
        "softmax_cross_entropy" => {
            let eps = r.float("label_smoothing");
            if !(0.0..=1.0).contains(&eps) {
                r.reject(
                    "label_smoothing",
                    format!("label_smoothing must be in [0, 1], got {eps}"),
                );
            }
            LossKind::SoftmaxCrossEntropy {
                label_smoothing: eps,
            }
        }
        "nll_loss" => LossKind::Nll,
        "mse_loss" => LossKind::Mse,
        "bce_with_logits" => LossKind::BceWithLogits,
        _ => return None,
    };
    let reduction = match r.choice("reduction").as_str() {
        "sum" => Reduction::Sum,
        "none" => Reduction::None,
        _ => Reduction::Mean,
    };
    Some(LossOp { kind, reduction })
}

impl Reduction {
    /// The attribute value.
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Mean => "mean",
            Reduction::Sum => "sum",
            Reduction::None => "none",
        }
    }
}

impl LossOp {
    /// Gradient rule, from PyTorch's definitions. With `w` the weight of each element's
    /// loss (dy/count for "mean", dy for "sum", dy per element for "none"):
    /// softmax cross entropy: (softmax(x) − ((1−ε)·one_hot(y) + ε/C))·w; NLL:
    /// −one_hot(y)·w; MSE: ±2(p − t)·w; BCE with logits: (σ(x) − t)·w for the logits and
    /// −x·w for the targets. Labels are indices: no gradient.
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        let dy = g.dy()?;
        let x = g.input(0)?;
        let xs = g.shape(&x)?;
        // The weight of each element's loss, broadcastable against the per-element grads
        // (for the class losses: against [..., C]).
        let classes = matches!(
            self.kind,
            LossKind::SoftmaxCrossEntropy { .. } | LossKind::Nll
        );
        let rows: Vec<usize> = if classes {
            xs[..xs.len().saturating_sub(1)].to_vec()
        } else {
            xs.clone()
        };
        let count = rows
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| format!("the loss's element count of {xs:?} overflows"))?;
        let w = match self.reduction {
            Reduction::Mean => g.scale(&dy, 1.0 / count.max(1) as f32)?,
            Reduction::Sum => dy,
            Reduction::None if classes => {
                let mut shape = rows.clone();
                shape.push(1);
                g.reshape(&dy, &shape)?
            }
            Reduction::None => dy,
        };
        match self.kind {
            LossKind::SoftmaxCrossEntropy { label_smoothing } => {
                if !g.needs(0) {
                    return Ok(());
                }
                let c = xs.last().copied().unwrap_or(1);
                let labels = g.input(1)?;
                let p = g.emit("softmax", serde_json::json!({ "axis": -1 }), &[&x])?;
                let hot = g.emit("one_hot", serde_json::json!({ "depth": c }), &[&labels])?;
                let mut target = g.scale(&hot, 1.0 - label_smoothing)?;
                if label_smoothing > 0.0 {
                    let spread = g.scalar(label_smoothing / c.max(1) as f32)?;
                    target = g.binary("add", &target, &spread)?;
                }
                let diff = g.binary("sub", &p, &target)?;
                let dx = g.binary("mul", &diff, &w)?;
                g.input_grad_unbroadcast(0, &dx)
            }
            LossKind::Nll => {
                if !g.needs(0) {
                    return Ok(());
                }
                let c = xs.last().copied().unwrap_or(1);
                let labels = g.input(1)?;
                let hot = g.emit("one_hot", serde_json::json!({ "depth": c }), &[&labels])?;
                let neg = g.scale(&hot, -1.0)?;
                let dx = g.binary("mul", &neg, &w)?;
                g.input_grad_unbroadcast(0, &dx)
            }
            LossKind::Mse => {
                let t = g.input(1)?;
                let diff = g.binary("sub", &x, &t)?;
                let twice = g.scale(&diff, 2.0)?;
                let dp = g.binary("mul", &twice, &w)?;
                if g.needs(1) {
                    let dt = g.scale(&dp, -1.0)?;
                    g.input_grad_unbroadcast(1, &dt)?;
                }
                g.input_grad_unbroadcast(0, &dp)
            }
            LossKind::BceWithLogits => {
                let t = g.input(1)?;
                if g.needs(0) {
                    let s = g.emit("sigmoid", serde_json::json!({}), &[&x])?;
                    let diff = g.binary("sub", &s, &t)?;
                    let dx = g.binary("mul", &diff, &w)?;
                    g.input_grad_unbroadcast(0, &dx)?;
                }
                if g.needs(1) {
                    let negx = g.scale(&x, -1.0)?;
                    let dt = g.binary("mul", &negx, &w)?;
                    g.input_grad_unbroadcast(1, &dt)?;
                }
                Ok(())
            }
        }
    }

    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self.kind {
            LossKind::SoftmaxCrossEntropy { .. } => "softmax_cross_entropy",
            LossKind::Nll => "nll_loss",
            LossKind::Mse => "mse_loss",
            LossKind::BceWithLogits => "bce_with_logits",
        }
    }

    /// Whether input 1 holds class labels indexing the last axis of input 0.
    pub fn has_labels(&self) -> bool {
        matches!(
            self.kind,
            LossKind::SoftmaxCrossEntropy { .. } | LossKind::Nll
        )
    }

    /// The labels of the class losses index the class axis and must be non-negative.
    pub fn index_input(&self) -> Option<IndexInput> {
        self.has_labels().then_some(IndexInput {
            indices: 1,
            data: 0,
            axis: -1,
            non_negative: true,
        })
    }

    /// Checks what parsing guarantees (the smoothing in [0, 1]).
    pub fn validate(&self) -> Result<(), String> {
        match self.kind {
            LossKind::SoftmaxCrossEntropy { label_smoothing }
                if !(0.0..=1.0).contains(&label_smoothing) =>
            {
                Err(format!(
                    "softmax_cross_entropy: label_smoothing {label_smoothing} is outside [0, 1]"
                ))
            }
            _ => Ok(()),
        }
    }

    /// Output type: `[]` for "mean" and "sum", the per-element shape for "none".
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        let (a, b) = (&inputs[0], &inputs[1]);
        let which = self.schema_inputs();
        need_f32(name, which[0], a)?;
        let elements = if self.has_labels() {
            if b.dtype != DType::I32 {
                return Err(format!("'{name}' needs i32 labels, got {b}"));
            }
            let Some((classes, rows)) = a.shape.split_last() else {
                return Err(format!(
                    "'{name}' needs {} with a class axis, got {a}",
                    which[0]
                ));
            };
            if *classes == Dim::Known(0) {
                return Err(format!(
                    "'{name}' needs at least one class, got {} {}",
                    which[0],
                    show(&a.shape)
                ));
            }
            if b.shape != rows {
                return Err(format!(
                    "'{name}' needs labels of shape {} ({} {} without its class axis), got {}",
                    show(rows),
                    which[0],
                    show(&a.shape),
                    show(&b.shape)
                ));
            }
            rows.to_vec()
        } else {
            need_f32(name, which[1], b)?;
            if a.shape != b.shape {
                return Err(format!(
                    "'{name}' needs {} and {} of one shape, got {} and {}",
                    which[0],
                    which[1],
                    show(&a.shape),
                    show(&b.shape)
                ));
            }
            a.shape.clone()
        };
        let shape = match self.reduction {
            Reduction::None => elements,
            Reduction::Mean | Reduction::Sum => Vec::new(),
        };
        Ok(vec![TensorType::f32(shape)])
    }

    fn schema_inputs(&self) -> [&'static str; 2] {
        match self.kind {
            LossKind::SoftmaxCrossEntropy { .. } => ["logits", "labels"],
            LossKind::Nll => ["log_probs", "labels"],
            LossKind::Mse => ["prediction", "target"],
            LossKind::BceWithLogits => ["logits", "targets"],
        }
    }

    /// Batch rule: both inputs' batch axes must be the same element axis (for the class
    /// losses, not the class axis); "none" keeps it, "mean" and "sum" combine the samples.
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        _outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let name = self.name();
        if self.has_labels() {
            let classes = inputs[0].shape.len().saturating_sub(1);
            if batch[0] == Some(classes) {
                return Err(format!(
                    "{name} along axis {classes}, the class axis and the batch axis"
                ));
            }
        }
        let axis = match (batch[0], batch[1]) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "{name} pairs the batch of input 0 along axis {a} with the batch of input 1 along axis {b}: every sample meets every other"
                ))
            }
            (a, b) => a.or(b),
        };
        match (self.reduction, axis) {
            (Reduction::None, _) | (_, None) => Ok(vec![axis]),
            (r, Some(a)) => Err(format!(
                "{name} with reduction \"{}\" over axis {a}, the batch axis",
                r.name()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule, tensor};
    use crate::ops::{parse, TensorType};
    use serde_json::{json, Value};

    fn infer(op: &str, attrs: Value, inputs: &[&str]) -> Result<Vec<TensorType>, String> {
        let op = parse(op, attrs.as_object().unwrap()).map_err(|e| format!("{e:?}"))?;
        let types: Vec<TensorType> = inputs.iter().map(|t| tensor(t)).collect();
        op.infer(&types)
    }

    #[test]
    fn class_losses_need_labels_shaped_like_the_rows() {
        let ce = |attrs, a, b| infer("softmax_cross_entropy", attrs, &[a, b]);
        assert_eq!(ce(json!({}), "N,10", "i32:N").unwrap()[0], tensor(""));
        assert_eq!(
            ce(json!({ "reduction": "none" }), "N,3,10", "i32:N,3").unwrap()[0],
            tensor("N,3")
        );
        assert_eq!(
            ce(json!({ "reduction": "none" }), "10", "i32:").unwrap()[0],
            tensor("")
        );
        let e = ce(json!({}), "N,10", "i32:N,10").unwrap_err();
        assert!(
            e.contains("labels of shape [N] (logits [N, 10] without its class axis), got [N, 10]"),
            "{e}"
        );
        let e = ce(json!({}), "N,10", "N").unwrap_err();
        assert!(e.contains("needs i32 labels, got f32 [N]"), "{e}");
        assert!(ce(json!({}), "", "i32:").is_err());
        assert!(ce(json!({}), "3,0", "i32:3").is_err());
        let e = infer("nll_loss", json!({}), &["i32:4,2", "i32:4"]).unwrap_err();
        assert!(e.contains("f32 log_probs"), "{e}");
        for bad in [json!(-0.1), json!(1.5), json!("x")] {
            assert!(ce(json!({ "label_smoothing": bad }), "2,3", "i32:2").is_err());
        }
        assert!(ce(json!({ "reduction": "avg" }), "2,3", "i32:2").is_err());
    }

    #[test]
    fn pair_losses_need_one_shape() {
        let mse = |attrs, a, b| infer("mse_loss", attrs, &[a, b]);
        assert_eq!(
            mse(json!({ "reduction": "sum" }), "N,3", "N,3").unwrap()[0],
            tensor("")
        );
        assert_eq!(
            mse(json!({ "reduction": "none" }), "N,3", "N,3").unwrap()[0],
            tensor("N,3")
        );
        let e = mse(json!({}), "N,3", "3").unwrap_err();
        assert!(
            e.contains("prediction and target of one shape, got [N, 3] and [3]"),
            "{e}"
        );
        let e = infer("bce_with_logits", json!({}), &["2", "i32:2"]).unwrap_err();
        assert!(e.contains("f32 targets"), "{e}");
    }

    #[test]
    fn mean_and_sum_couple_the_batch_and_none_keeps_it() {
        for op in ["softmax_cross_entropy", "nll_loss"] {
            couples(
                rule(op, json!({}), &[("N,5", Some(0)), ("i32:N", Some(0))]),
                &[op, "reduction \"mean\" over axis 0, the batch axis"],
            );
            couples(
                rule(
                    op,
                    json!({ "reduction": "sum" }),
                    &[("N,5", Some(0)), ("i32:N", Some(0))],
                ),
                &["reduction \"sum\""],
            );
            assert_eq!(
                rule(
                    op,
                    json!({ "reduction": "none" }),
                    &[("N,5", Some(0)), ("i32:N", Some(0))]
                ),
                Ok(vec![Some(0)])
            );
            assert_eq!(
                rule(
                    op,
                    json!({ "reduction": "none" }),
                    &[("3,N,5", Some(1)), ("i32:3,N", Some(1))]
                ),
                Ok(vec![Some(1)])
            );
            couples(
                rule(
                    op,
                    json!({ "reduction": "none" }),
                    &[("4,N", Some(1)), ("i32:4", None)],
                ),
                &[op, "the class axis"],
            );
        }
        for op in ["mse_loss", "bce_with_logits"] {
            couples(
                rule(op, json!({}), &[("N,2", Some(0)), ("N,2", Some(0))]),
                &[op, "over axis 0, the batch axis"],
            );
            assert_eq!(
                rule(
                    op,
                    json!({ "reduction": "none" }),
                    &[("N,2", Some(0)), ("N,2", Some(0))]
                ),
                Ok(vec![Some(0)])
            );
            assert_eq!(
                rule(
                    op,
                    json!({ "reduction": "none" }),
                    &[("2,3", None), ("2,3", None)]
                ),
                Ok(vec![None])
            );
        }
    }
}
