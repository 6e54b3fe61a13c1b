//! Normalisation family: `softmax`, `log_softmax` (any axis), `layer_norm` (over the
//! trailing axes from `axis`, learned scale and bias), `batch_norm` (running statistics as
//! weights; training steps replace it by a composition normalising with the batch's
//! statistics, `train::trainer`). Kernels: `shaders/norm.wgsl`.

use super::attrs::{optional, AttrKind, AttrReader, AttrSpec};
use super::backward::{GradContext, Ref};
use super::{need_f32, Arity, Init, OpSchema, ParamSpec, TensorType};
use crate::shape::{self, show, Dim};
use serde_json::json;

/// Family tag.
pub const FAMILY: &str = "normalisation";

const SOFTMAX_ATTRS: &[AttrSpec] = &[optional(
    "axis",
    AttrKind::Int,
    "-1",
    "Axis to normalise along.",
)];
const LN_ATTRS: &[AttrSpec] = &[
    optional(
        "axis",
        AttrKind::Int,
        "-1",
        "First normalised axis; all later axes are normalised too.",
    ),
    optional("epsilon", AttrKind::Float, "1e-5", "Added to the variance."),
];
const BN_ATTRS: &[AttrSpec] = &[
    optional("epsilon", AttrKind::Float, "1e-5", "Added to the variance."),
    optional(
        "momentum",
        AttrKind::Float,
        "0.1",
        "Training: weight of a step's batch statistics in the running ones, in [0, 1].",
    ),
];

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    OpSchema {
        name: "softmax",
        family: FAMILY,
        doc: "exp(x) / sum(exp(x)) along an axis.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: SOFTMAX_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "log_softmax",
        family: FAMILY,
        doc: "log(softmax(x)) along an axis, computed stably.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: SOFTMAX_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "layer_norm",
        family: FAMILY,
        doc: "Normalises over the axes from `axis` on, then scales and shifts.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: LN_ATTRS,
        params: &["scale", "bias"],
    },
    OpSchema {
        name: "batch_norm",
        family: FAMILY,
        doc: "Batch norm over channel axis 1: running mean and variance in inference, the batch's statistics in training steps.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: BN_ATTRS,
        params: &["scale", "bias", "mean", "var"],
    },
];

/// A parsed normalisation operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum NormOp {
    /// softmax or log-softmax.
    Softmax {
        /// Axis.
        axis: i64,
        /// log-softmax.
        log: bool,
    },
    /// Layer norm.
    LayerNorm {
        /// First normalised axis.
        axis: i64,
        /// Epsilon.
        epsilon: f32,
    },
    /// Batch norm.
    BatchNorm {
        /// Epsilon.
        epsilon: f32,
        /// How much of a training step's batch statistics goes into the running ones
        /// (PyTorch's `momentum`); inference ignores it.
        momentum: f32,
    },
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<NormOp> {
    Some(match name {
        "softmax" | "log_softmax" => NormOp::Softmax {
            axis: r.int("axis"),
            log: name == "log_softmax",
        },
        "layer_norm" => NormOp::LayerNorm {
            axis: r.int("axis"),
            epsilon: r.float("epsilon"),
        },
        "batch_norm" => {
            let momentum = r.float("momentum");
            if !(0.0..=1.0).contains(&momentum) {
                r.reject(
                    "momentum",
                    format!("momentum must be within [0, 1], got {momentum}"),
                );
            }
            NormOp::BatchNorm {
                epsilon: r.float("epsilon"),
                momentum,
            }
        }
        _ => return None,
    })
}

impl NormOp {
    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self {
            NormOp::Softmax { log: false, .. } => "softmax",
            NormOp::Softmax { log: true, .. } => "log_softmax",
            NormOp::LayerNorm { .. } => "layer_norm",
            NormOp::BatchNorm { .. } => "batch_norm",
        }
    }

    /// Output type (same as the input).
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let x = &inputs[0];
        need_f32(self.name(), "input", x)?;
        match self {
            NormOp::Softmax { axis, .. } => {
                shape::existing_axis(*axis, x.shape.len())?;
            }
            NormOp::LayerNorm { axis, .. } => {
                shape::axis(*axis, x.shape.len())?;
            }
            NormOp::BatchNorm { .. } => {
                if x.shape.len() < 2 {
                    return Err(format!(
                        "batch_norm needs [N, C, ...], got {}",
                        show(&x.shape)
                    ));
                }
            }
        }
        Ok(vec![x.clone()])
    }

    /// Batch rule: softmax and log_softmax couple along the batch axis (they divide by a
    /// sum over it); layer_norm couples when the batch axis is among its normalised axes
    /// [axis, rank); batch_norm uses running statistics, so it is per element except along
    /// the channel axis 1, whose weights a symbolic size would pair with batch positions.
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        _outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let Some(b) = batch[0] else {
            return Ok(vec![None]);
        };
        let rank = inputs[0].shape.len();
        let name = self.name();
        match self {
            NormOp::Softmax { axis, .. } => {
                if shape::axis(*axis, rank)? == b {
                    return Err(format!("{name} along axis {b}, the batch axis"));
                }
            }
            NormOp::LayerNorm { axis, .. } => {
                let first = shape::axis(*axis, rank)?;
                if b >= first {
                    return Err(format!(
                        "{name} over axes {first}..{rank}, which include axis {b}, the batch axis"
                    ));
                }
            }
            NormOp::BatchNorm { .. } => {
                if b == 1 {
                    return Err(format!(
                        "{name} takes per-channel statistics along axis 1, the batch axis"
                    ));
                }
            }
        }
        Ok(vec![Some(b)])
    }

    /// Gradient rule. softmax, log_softmax: `softmax_grad`, `log_softmax_grad` from the
    /// output y. Composed: layer_norm: the normalised x̂ recomputed, dx = (dx̂ − mean dx̂ − x̂·mean
    /// dx̂·x̂)/σ with dx̂ = dy·scale, dscale = Σ dy·x̂ and dbias = Σ dy over the leading axes;
    /// batch_norm (running statistics): dx = dy·scale/σ, dscale and dbias summed over every
    /// axis but the channels, and no gradient for the statistics.
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        let dy = g.dy()?;
        let x = g.input(0)?;
        let xs = g.shape(&x)?;
        let rank = xs.len();
        match self {
            NormOp::Softmax { axis, log } => {
                if !g.needs(0) {
                    return Ok(());
                }
                let a = shape::existing_axis(*axis, rank)?;
                let y = g.output(0)?;
                let op = if *log {
                    "log_softmax_grad"
                } else {
                    "softmax_grad"
                };
                let dx = g.emit(op, json!({ "axis": a }), &[&y, &dy])?;
                g.input_grad(0, dx)
            }
            NormOp::LayerNorm { axis, epsilon } => {
                let a = shape::axis(*axis, rank)?;
                let norm: Vec<usize> = (a..rank).collect();
                let lead: Vec<usize> = (0..a).collect();
                let mean = |g: &mut dyn GradContext, v: &str| -> Result<Ref, String> {
                    g.emit(
                        "reduce_mean",
                        json!({ "axes": norm, "keepdims": true }),
                        &[v],
                    )
                };
                let mu = mean(g, &x)?;
                let xc = g.binary("sub", &x, &mu)?;
                let sq = g.binary("mul", &xc, &xc)?;
                let var = mean(g, &sq)?;
                let rstd = inverse_sqrt(g, &var, *epsilon)?;
                let xhat = g.binary("mul", &xc, &rstd)?;
                let t = g.binary("mul", &dy, &xhat)?;
                let dscale = g.sum(&t, &lead, false)?;
                g.param_grad("scale", dscale)?;
                let dbias = g.sum(&dy, &lead, false)?;
                g.param_grad("bias", dbias)?;
                if g.needs(0) {
                    let scale = g.param("scale")?;
                    let dxhat = g.binary("mul", &dy, &scale)?;
                    let m1 = mean(g, &dxhat)?;
                    let t = g.binary("mul", &dxhat, &xhat)?;
                    let m2 = mean(g, &t)?;
                    let t = g.binary("mul", &xhat, &m2)?;
                    let d = g.binary("sub", &dxhat, &m1)?;
                    let d = g.binary("sub", &d, &t)?;
                    let dx = g.binary("mul", &d, &rstd)?;
                    g.input_grad(0, dx)?;
                }
                Ok(())
            }
            NormOp::BatchNorm { epsilon, .. } => {
                let c = *xs.get(1).ok_or("batch_norm needs [N, C, ...]")?;
                let mut bshape = vec![c];
                bshape.resize(rank - 1, 1);
                let others: Vec<usize> = (0..rank).filter(|&i| i != 1).collect();
                let var = g.param("var")?;
                let rstd = inverse_sqrt(g, &var, *epsilon)?;
                let rstd = g.reshape(&rstd, &bshape)?;
                let mean = g.param("mean")?;
                let mean = g.reshape(&mean, &bshape)?;
                let xc = g.binary("sub", &x, &mean)?;
                let xhat = g.binary("mul", &xc, &rstd)?;
                let t = g.binary("mul", &dy, &xhat)?;
                let dscale = g.sum(&t, &others, false)?;
                g.param_grad("scale", dscale)?;
                let dbias = g.sum(&dy, &others, false)?;
                g.param_grad("bias", dbias)?;
                if g.needs(0) {
                    let scale = g.param("scale")?;
                    let scale = g.reshape(&scale, &bshape)?;
                    let f = g.binary("mul", &scale, &rstd)?;
                    let dx = g.binary("mul", &dy, &f)?;
                    g.input_grad(0, dx)?;
                }
                Ok(())
            }
        }
    }

    /// Weights: layer-norm scale/bias of the normalised shape; batch-norm per-channel stats.
    pub fn params(&self, inputs: &[TensorType]) -> Result<Vec<ParamSpec>, String> {
        let x = &inputs[0].shape;
        let known = |dims: &[Dim]| -> Result<Vec<usize>, String> {
            shape::concrete(dims).ok_or_else(|| {
                format!(
                    "{} needs known sizes on its normalised axes, got {}",
                    self.name(),
                    show(x)
                )
            })
        };
        let spec = |name, shape: &Vec<usize>, init| ParamSpec {
            name,
            shape: shape.clone(),
            init,
        };
        match self {
            NormOp::Softmax { .. } => Ok(Vec::new()),
            NormOp::LayerNorm { axis, .. } => {
                let s = known(&x[shape::axis(*axis, x.len())?..])?;
                Ok(vec![
                    spec("scale", &s, Init::Ones),
                    spec("bias", &s, Init::Zeros),
                ])
            }
            NormOp::BatchNorm { .. } => {
                let c = known(&x[1..2])?;
                Ok(vec![
                    spec("scale", &c, Init::Ones),
                    spec("bias", &c, Init::Zeros),
                    spec("mean", &c, Init::Zeros),
                    spec("var", &c, Init::Ones),
                ])
            }
        }
    }
}

/// 1 / √(v + ε).
fn inverse_sqrt(g: &mut dyn GradContext, v: &str, epsilon: f32) -> Result<Ref, String> {
    let e = g.scalar(epsilon)?;
    let t = g.binary("add", v, &e)?;
    let s = g.emit("sqrt", json!({}), &[&t])?;
    let one = g.scalar(1.0)?;
    g.binary("div", &one, &s)
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule};
    use serde_json::json;

    #[test]
    fn softmax_couples_along_the_batch_axis_only() {
        couples(
            rule("softmax", json!({ "axis": 0 }), &[("N,4", Some(0))]),
            &["softmax along axis 0, the batch axis"],
        );
        couples(
            rule("log_softmax", json!({ "axis": -1 }), &[("4,N", Some(1))]),
            &["log_softmax along axis 1"],
        );
        assert_eq!(
            rule("softmax", json!({}), &[("N,4", Some(0))]),
            Ok(vec![Some(0)])
        );
    }

    #[test]
    fn layer_norm_couples_when_it_normalises_the_batch_axis() {
        let ln = |axis, x| rule("layer_norm", json!({ "axis": axis }), &[x]);
        assert_eq!(ln(-1, ("N,8,4", Some(0))), Ok(vec![Some(0)]));
        assert_eq!(ln(1, ("N,8,4", Some(0))), Ok(vec![Some(0)]));
        couples(
            ln(0, ("N,4", Some(0))),
            &["layer_norm", "axis 0, the batch axis"],
        );
        couples(ln(-1, ("4,N", Some(1))), &["axes 1..2", "axis 1"]);
    }

    #[test]
    fn batch_norm_with_running_statistics_is_per_sample() {
        let bn = |x| rule("batch_norm", json!({}), &[x]);
        assert_eq!(bn(("N,3,4,4", Some(0))), Ok(vec![Some(0)]));
        assert_eq!(bn(("2,3,N,4", Some(2))), Ok(vec![Some(2)]));
        couples(bn(("2,N,4,4", Some(1))), &["batch_norm", "axis 1"]);
    }
}
