//! Normalisation family: `softmax`, `log_softmax` (any axis), `layer_norm` (over the
//! trailing axes from `axis`, learned scale and bias), `batch_norm` (inference, running
//! statistics as weights). Kernels: `shaders/norm.wgsl`.

use super::attrs::{optional, AttrKind, AttrReader, AttrSpec};
use super::kernel::{dispatch_1d, fill, variant, word, Concrete, Kernel, Lowering, Slot, WG};
use super::{need_f32, Arity, Init, OpSchema, ParamSpec, TensorType};
use crate::shape::{self, show, Dim};

/// Family tag.
pub const FAMILY: &str = "normalisation";
const SHADER: &str = include_str!("../../../shaders/norm.wgsl");

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
const BN_ATTRS: &[AttrSpec] = &[optional(
    "epsilon",
    AttrKind::Float,
    "1e-5",
    "Added to the variance.",
)];

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
        doc: "Inference batch norm over channel axis 1 with running mean and variance.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: BN_ATTRS,
        params: &["scale", "bias", "mean", "var"],
    },
];

/// A parsed normalisation operator.
#[derive(Debug, Clone, PartialEq)]
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
    },
}

/// Parses attributes.
pub fn parse(name: &str, r: &mut AttrReader) -> NormOp {
    match name {
        "softmax" | "log_softmax" => NormOp::Softmax {
            axis: r.int("axis"),
            log: name == "log_softmax",
        },
        "layer_norm" => NormOp::LayerNorm {
            axis: r.int("axis"),
            epsilon: r.float("epsilon"),
        },
        _ => NormOp::BatchNorm {
            epsilon: r.float("epsilon"),
        },
    }
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
            NormOp::Softmax { axis, .. } | NormOp::LayerNorm { axis, .. } => {
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

    /// GPU kernel.
    pub fn lower(&self, inputs: &[Concrete], _outputs: &[Concrete]) -> Result<Lowering, String> {
        let x = &inputs[0].shape;
        let n: usize = x.iter().product();
        let wg = ("WG", WG.to_string());
        let kernel = match self {
            NormOp::Softmax { axis, log } => {
                let a = shape::axis(*axis, x.len())?;
                let len = x[a];
                let inner: usize = x[a + 1..].iter().product();
                let rows = n.checked_div(len).unwrap_or(0);
                let out = if *log { "v - log(s)" } else { "exp(v) / s" };
                Kernel {
                    label: self.name().into(),
                    source: fill(variant(SHADER, "softmax"), &[wg, ("OUT", out.into())]),
                    slots: vec![Slot::Output(0), Slot::Input(0)],
                    info: vec![word(rows)?, word(len)?, word(inner.max(1))?],
                    workgroups: dispatch_1d(rows, WG)?,
                }
            }
            NormOp::LayerNorm { axis, epsilon } => {
                let a = shape::axis(*axis, x.len())?;
                let len: usize = x[a..].iter().product();
                let rows = n.checked_div(len).unwrap_or(0);
                Kernel {
                    label: "layer_norm".into(),
                    source: fill(variant(SHADER, "layer_norm"), &[wg]),
                    slots: vec![
                        Slot::Output(0),
                        Slot::Input(0),
                        Slot::Param(0),
                        Slot::Param(1),
                    ],
                    info: vec![word(rows)?, word(len)?, epsilon.to_bits()],
                    workgroups: dispatch_1d(rows, WG)?,
                }
            }
            NormOp::BatchNorm { epsilon } => {
                let inner: usize = x[2..].iter().product();
                Kernel {
                    label: "batch_norm".into(),
                    source: fill(variant(SHADER, "batch_norm"), &[wg]),
                    slots: vec![
                        Slot::Output(0),
                        Slot::Input(0),
                        Slot::Param(0),
                        Slot::Param(1),
                        Slot::Param(2),
                        Slot::Param(3),
                    ],
                    info: vec![word(n)?, word(x[1])?, word(inner)?, epsilon.to_bits()],
                    workgroups: dispatch_1d(n, WG)?,
                }
            }
        };
        Ok(Lowering::Kernels(vec![kernel]))
    }
}
