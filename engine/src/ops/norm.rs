//! Normalisation family: `softmax`, `log_softmax` (any axis), `layer_norm` (over the
//! trailing axes from `axis`, learned scale and bias), `rms_norm` (ONNX
//! RMSNormalization: the trailing axes scaled by their root mean square, learned scale),
//! `instance_norm` (per sample and channel over the spatial axes) and `group_norm` (per
//! sample and channel group), both with per-channel scale and bias, `batch_norm` (running
//! statistics as weights; training steps replace it by a composition normalising with the
//! batch's statistics, `train::trainer`). Kernels: `shaders/norm.wgsl`.
//!
//! Where ONNX passes scale and bias as inputs, these operators declare them as weights
//! `<node>.scale` and `<node>.bias`, as `layer_norm` and `batch_norm` do.

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec};
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
const RMS_ATTRS: &[AttrSpec] = &[
    optional(
        "axis",
        AttrKind::Int,
        "-1",
        "First normalised axis; all later axes are normalised too.",
    ),
    optional(
        "epsilon",
        AttrKind::Float,
        "1e-5",
        "Added to the mean square.",
    ),
    optional(
        "stash_type",
        AttrKind::Int,
        "1",
        "Precision of the statistics (ONNX: 1 = float32, the only one supported).",
    ),
];
const INSTANCE_ATTRS: &[AttrSpec] = &[optional(
    "epsilon",
    AttrKind::Float,
    "1e-5",
    "Added to the variance.",
)];
const GROUP_ATTRS: &[AttrSpec] = &[
    required(
        "num_groups",
        AttrKind::Int,
        "Channel groups; must divide the channels.",
    ),
    optional("epsilon", AttrKind::Float, "1e-5", "Added to the variance."),
    optional(
        "stash_type",
        AttrKind::Int,
        "1",
        "Precision of the statistics (ONNX: 1 = float32, the only one supported).",
    ),
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
        name: "rms_norm",
        family: FAMILY,
        doc: "x / √(mean(x²) + ε) over the axes from `axis` on, times a learned scale (ONNX RMSNormalization).",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: RMS_ATTRS,
        params: &["scale"],
    },
    OpSchema {
        name: "instance_norm",
        family: FAMILY,
        doc: "Normalises each sample's channel over the spatial axes [N, C, ...], then per-channel scale and bias.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: INSTANCE_ATTRS,
        params: &["scale", "bias"],
    },
    OpSchema {
        name: "group_norm",
        family: FAMILY,
        doc: "Normalises each sample's channel groups over their channels and spatial axes, then per-channel scale and bias (ONNX GroupNormalization, opset 21).",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: GROUP_ATTRS,
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
    /// RMS norm.
    RmsNorm {
        /// First normalised axis.
        axis: i64,
        /// Epsilon.
        epsilon: f32,
    },
    /// Instance norm.
    InstanceNorm {
        /// Epsilon.
        epsilon: f32,
    },
    /// Group norm.
    GroupNorm {
        /// Channel groups.
        num_groups: usize,
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
        "rms_norm" => {
            stash_type(r);
            NormOp::RmsNorm {
                axis: r.int("axis"),
                epsilon: r.float("epsilon"),
            }
        }
        "instance_norm" => NormOp::InstanceNorm {
            epsilon: r.float("epsilon"),
        },
        "group_norm" => {
            stash_type(r);
            NormOp::GroupNorm {
                num_groups: r.size("num_groups", 1),
                epsilon: r.float("epsilon"),
            }
        }
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

/// Reads ONNX's `stash_type`: statistics are computed in f32 (f64 in the CPU reference's
/// f64 runs), which is ONNX's 1.
fn stash_type(r: &mut AttrReader) {
    let t = r.int("stash_type");
    if t != 1 {
        r.reject(
            "stash_type",
            format!("stash_type must be 1 (statistics in float32), got {t}"),
        );
    }
}

/// How a row-wise normalisation (layer, RMS, instance and group norm) cuts its input:
/// `rows` contiguous rows of `len` elements, each normalised alone; element `i` takes
/// weight element `(i / param_div) % param_mod`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    /// Number of rows.
    pub rows: usize,
    /// Elements per row.
    pub len: usize,
    /// Divisor of the element index giving the weight index (before the modulo).
    pub param_div: usize,
    /// Number of weight elements.
    pub param_mod: usize,
    /// The mean is subtracted (false: RMS norm).
    pub center: bool,
    /// A bias is added (false: RMS norm).
    pub bias: bool,
}

impl NormOp {
    /// The row layout of a row-wise normalisation on a concrete input shape; `None` for
    /// softmax and batch norm.
    pub fn rows(&self, dims: &[usize]) -> Result<Option<Rows>, String> {
        let n = shape::numel(dims)?;
        let per_channel = |dims: &[usize], groups: usize| -> Result<Rows, String> {
            let (Some(&c), Some(spatial)) = (dims.get(1), dims.get(2..)) else {
                return Err(format!("{} needs [N, C, ...], got {dims:?}", self.name()));
            };
            let inner = shape::numel(spatial)?;
            let rows = dims[0]
                .checked_mul(groups)
                .ok_or("the number of rows overflows")?;
            Ok(Rows {
                rows,
                len: n.checked_div(rows).unwrap_or(0),
                param_div: inner.max(1),
                param_mod: c.max(1),
                center: true,
                bias: true,
            })
        };
        let trailing = |axis: i64, center: bool| -> Result<Rows, String> {
            let a = shape::axis(axis, dims.len())?;
            let len = shape::numel(&dims[a..])?;
            Ok(Rows {
                rows: n.checked_div(len).unwrap_or(0),
                len,
                param_div: 1,
                param_mod: len.max(1),
                center,
                bias: center,
            })
        };
        Ok(Some(match self {
            NormOp::Softmax { .. } | NormOp::BatchNorm { .. } => return Ok(None),
            NormOp::LayerNorm { axis, .. } => trailing(*axis, true)?,
            NormOp::RmsNorm { axis, .. } => trailing(*axis, false)?,
            NormOp::InstanceNorm { .. } => per_channel(dims, dims.get(1).copied().unwrap_or(1))?,
            NormOp::GroupNorm { num_groups, .. } => per_channel(dims, *num_groups)?,
        }))
    }

    /// Epsilon of a normalisation (0 for softmax).
    pub fn epsilon(&self) -> f32 {
        match self {
            NormOp::Softmax { .. } => 0.0,
            NormOp::LayerNorm { epsilon, .. }
            | NormOp::RmsNorm { epsilon, .. }
            | NormOp::InstanceNorm { epsilon }
            | NormOp::GroupNorm { epsilon, .. }
            | NormOp::BatchNorm { epsilon, .. } => *epsilon,
        }
    }

    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self {
            NormOp::Softmax { log: false, .. } => "softmax",
            NormOp::Softmax { log: true, .. } => "log_softmax",
            NormOp::LayerNorm { .. } => "layer_norm",
            NormOp::RmsNorm { .. } => "rms_norm",
            NormOp::InstanceNorm { .. } => "instance_norm",
            NormOp::GroupNorm { .. } => "group_norm",
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
            NormOp::LayerNorm { axis, .. } | NormOp::RmsNorm { axis, .. } => {
                shape::axis(*axis, x.shape.len())?;
            }
            NormOp::InstanceNorm { .. } | NormOp::GroupNorm { .. } => {
                if x.shape.len() < 2 {
                    return Err(format!(
                        "{} needs [N, C, ...], got {}",
                        self.name(),
                        show(&x.shape)
                    ));
                }
                if let NormOp::GroupNorm { num_groups, .. } = self {
                    let Some(c) = x.shape[1].known() else {
                        return Err(format!(
                            "group_norm needs a known channel count, got {}",
                            show(&x.shape)
                        ));
                    };
                    if c % num_groups != 0 {
                        return Err(format!(
                            "group_norm: num_groups {num_groups} does not divide the {c} channels"
                        ));
                    }
                }
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
            NormOp::LayerNorm { axis, .. } | NormOp::RmsNorm { axis, .. } => {
                let first = shape::axis(*axis, rank)?;
                if b >= first {
                    return Err(format!(
                        "{name} over axes {first}..{rank}, which include axis {b}, the batch axis"
                    ));
                }
            }
            NormOp::InstanceNorm { .. } if b == 1 => {
                return Err(format!(
                    "{name} takes per-channel weights along axis 1, the batch axis"
                ));
            }
            NormOp::InstanceNorm { .. } | NormOp::GroupNorm { .. } if b >= 1 => {
                return Err(format!(
                    "{name} normalises over axis {b}, the batch axis, with others"
                ));
            }
            NormOp::InstanceNorm { .. } | NormOp::GroupNorm { .. } => {}
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
    /// output y. Composed: the row-wise norms (layer, RMS, instance, group) recompute the
    /// normalised x̂ on their rows, dx = (dx̂ − mean dx̂ − x̂·mean dx̂·x̂)/σ with dx̂ =
    /// dy·scale (RMS norm: without the mean dx̂ term, σ the root mean square), dscale =
    /// Σ dy·x̂ and dbias = Σ dy over the axes the weights do not span;
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
            NormOp::LayerNorm { .. }
            | NormOp::RmsNorm { .. }
            | NormOp::InstanceNorm { .. }
            | NormOp::GroupNorm { .. } => self.row_grad(g, &x, &dy, &xs),
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
            NormOp::RmsNorm { axis, .. } => {
                let s = known(&x[shape::axis(*axis, x.len())?..])?;
                Ok(vec![spec("scale", &s, Init::Ones)])
            }
            NormOp::InstanceNorm { .. } | NormOp::GroupNorm { .. } => {
                let c = known(x.get(1..2).unwrap_or_default())?;
                Ok(vec![
                    spec("scale", &c, Init::Ones),
                    spec("bias", &c, Init::Zeros),
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

impl NormOp {
    /// The composed gradient of a row-wise normalisation (see [`NormOp::grad`]): the
    /// input viewed as [rows, len], the statistics recomputed per row.
    fn row_grad(
        &self,
        g: &mut dyn GradContext,
        x: &str,
        dy: &str,
        xs: &[usize],
    ) -> Result<(), String> {
        let rows = self
            .rows(xs)?
            .ok_or("internal: not a row-wise normalisation")?;
        let rank = xs.len();
        // The axes the weights do not span, and the weights' shape broadcast against x.
        let (others, wshape): (Vec<usize>, Vec<usize>) = match self {
            NormOp::InstanceNorm { .. } | NormOp::GroupNorm { .. } => {
                let mut w = vec![xs[1]];
                w.resize(rank - 1, 1);
                ((0..rank).filter(|&i| i != 1).collect(), w)
            }
            NormOp::LayerNorm { axis, .. } | NormOp::RmsNorm { axis, .. } => {
                let a = shape::axis(*axis, rank)?;
                ((0..a).collect(), xs[a..].to_vec())
            }
            NormOp::Softmax { .. } | NormOp::BatchNorm { .. } => {
                return Err("internal: not a row-wise normalisation".into())
            }
        };
        let flat = [rows.rows, rows.len];
        let mean = |g: &mut dyn GradContext, v: &str| -> Result<Ref, String> {
            g.emit(
                "reduce_mean",
                json!({ "axes": [1], "keepdims": true }),
                &[v],
            )
        };
        let xr = g.reshape(x, &flat)?;
        let xc = if rows.center {
            let mu = mean(g, &xr)?;
            g.binary("sub", &xr, &mu)?
        } else {
            xr
        };
        let sq = g.binary("mul", &xc, &xc)?;
        let var = mean(g, &sq)?;
        let rstd = inverse_sqrt(g, &var, self.epsilon())?;
        let xhat_rows = g.binary("mul", &xc, &rstd)?;
        let xhat = g.reshape(&xhat_rows, xs)?;
        let t = g.binary("mul", dy, &xhat)?;
        let dscale = g.sum(&t, &others, false)?;
        g.param_grad("scale", dscale)?;
        if rows.bias {
            let dbias = g.sum(dy, &others, false)?;
            g.param_grad("bias", dbias)?;
        }
        if g.needs(0) {
            let scale = g.param("scale")?;
            let scale = g.reshape(&scale, &wshape)?;
            let dxhat = g.binary("mul", dy, &scale)?;
            let dxhat = g.reshape(&dxhat, &flat)?;
            let t = g.binary("mul", &dxhat, &xhat_rows)?;
            let m2 = mean(g, &t)?;
            let t = g.binary("mul", &xhat_rows, &m2)?;
            let mut d = g.binary("sub", &dxhat, &t)?;
            if rows.center {
                let m1 = mean(g, &dxhat)?;
                d = g.binary("sub", &d, &m1)?;
            }
            let dx = g.binary("mul", &d, &rstd)?;
            let dx = g.reshape(&dx, xs)?;
            g.input_grad(0, dx)?;
        }
        Ok(())
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
    fn instance_and_group_norm_keep_the_sample_axis_only() {
        for (op, attrs) in [
            ("instance_norm", json!({})),
            ("group_norm", json!({ "num_groups": 3 })),
        ] {
            assert_eq!(
                rule(op, attrs.clone(), &[("N,3,4,4", Some(0))]),
                Ok(vec![Some(0)])
            );
            couples(
                rule(op, attrs.clone(), &[("2,3,N", Some(2))]),
                &[op, "axis 2"],
            );
        }
        couples(
            rule("instance_norm", json!({}), &[("2,N,4", Some(1))]),
            &["per-channel weights along axis 1"],
        );
        couples(
            rule("rms_norm", json!({}), &[("4,N", Some(1))]),
            &["rms_norm", "axis 1"],
        );
    }

    #[test]
    fn batch_norm_with_running_statistics_is_per_sample() {
        let bn = |x| rule("batch_norm", json!({}), &[x]);
        assert_eq!(bn(("N,3,4,4", Some(0))), Ok(vec![Some(0)]));
        assert_eq!(bn(("2,3,N,4", Some(2))), Ok(vec![Some(2)]));
        couples(bn(("2,N,4,4", Some(1))), &["batch_norm", "axis 1"]);
    }
}
