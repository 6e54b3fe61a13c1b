//! Gradient family: backward operators where composing forward operators would be slow or
//! impossible (`unary_grad`: dy times a unary operator's derivative at x, one pass;
//! `softmax_grad`, `log_softmax_grad`: one sum along the axis, then one pass;
//! `gather_grad`: gather's scatter-add, written as a gather over the indices; the
//! backwards of the windowed conv family — `conv2d_grad_input` (a transposed
//! convolution), `conv2d_grad_filter`, `max_pool2d_grad`, `avg_pool2d_grad`,
//! `conv_transpose2d_grad_input` (conv2d of dy with the weight as an input) — each written
//! per output element as a sum over the windows that meet it, so no kernel scatters). The
//! rules that emit them are in each family file (`fn grad`, over
//! [`super::backward::GradContext`]).

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec};
use super::backward::GradContext;
use super::conv::{window, ConvOp, Window, AVG_POOL_ATTRS, MAX_POOL_ATTRS};
use super::elementwise::{read_unary, Unary};
use super::{
    broadcast_batch, need_f32, product, widen, Arity, Capabilities, IndexInput, OpSchema,
    TensorType,
};
use crate::dtype::DType;
use crate::shape::{broadcast, show, Dim};

/// Family tag.
pub const FAMILY: &str = "gradient";

/// The unary operators `unary_grad` differentiates.
pub const UNARIES: &[&str] = &[
    "relu",
    "sigmoid",
    "tanh",
    "gelu",
    "exp",
    "log",
    "sqrt",
    "erf",
    "clip",
    "leaky_relu",
    "elu",
    "selu",
    "softplus",
    "softsign",
    "hard_sigmoid",
    "hard_swish",
    "silu",
    "swish",
    "mish",
    "abs",
    "neg",
    "reciprocal",
    "sin",
    "cos",
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
    optional(
        "alpha",
        AttrKind::Float,
        "null",
        "leaky_relu's, elu's, selu's, hard_sigmoid's or swish's alpha (absent: the forward operator's default).",
    ),
    optional("beta", AttrKind::Float, "null", "hard_sigmoid's beta (absent: 0.5)."),
    optional("gamma", AttrKind::Float, "null", "selu's gamma (absent: ONNX's default)."),
];

const SOFTMAX_GRAD_ATTRS: &[AttrSpec] = &[optional(
    "axis",
    AttrKind::Int,
    "-1",
    "The forward operator's axis.",
)];

const CONV_GRAD_ATTRS: &[AttrSpec] = &[
    super::conv::KERNEL_SIZE,
    super::conv::STRIDES,
    super::conv::PADS,
    super::conv::DILATIONS,
    optional("groups", AttrKind::Int, "1", "conv2d's channel groups."),
];

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
    OpSchema {
        name: "conv2d_grad_input",
        family: FAMILY,
        doc: "dx of conv2d: dy convolved back through the weight (a transposed convolution), x's shape.",
        inputs: Arity::Fixed(&["x", "weight", "dy"]),
        outputs: &["dx"],
        attrs: CONV_GRAD_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "conv_transpose2d_grad_input",
        family: FAMILY,
        doc: "dx of conv_transpose2d: dy convolved with the weight (conv2d with the weight as an input), x's shape.",
        inputs: Arity::Fixed(&["x", "weight", "dy"]),
        outputs: &["dx"],
        attrs: CONV_GRAD_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "conv2d_grad_filter",
        family: FAMILY,
        doc: "The weight gradient of conv2d: x against dy summed over samples and positions, [OC, C/groups, kh, kw].",
        inputs: Arity::Fixed(&["x", "dy"]),
        outputs: &["dweight"],
        attrs: CONV_GRAD_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "max_pool2d_grad",
        family: FAMILY,
        doc: "dx of max_pool2d: each window's dy to its first maximum, summed where windows overlap.",
        inputs: Arity::Fixed(&["x", "dy"]),
        outputs: &["dx"],
        attrs: MAX_POOL_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "avg_pool2d_grad",
        family: FAMILY,
        doc: "dx of avg_pool2d: each window's dy / its divisor spread over its inputs, summed where windows overlap.",
        inputs: Arity::Fixed(&["x", "dy"]),
        outputs: &["dx"],
        attrs: AVG_POOL_ATTRS,
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
    /// `conv2d_grad_input`: conv2d's dx.
    ConvGradInput {
        /// conv2d's window (no ceil mode).
        window: Window,
        /// conv2d's groups.
        groups: usize,
    },
    /// `conv_transpose2d_grad_input`: conv_transpose2d's dx, conv2d of dy with the
    /// weight.
    ConvTransposeGradInput {
        /// The window conv_transpose2d computes with (its begin pads).
        window: Window,
        /// Groups.
        groups: usize,
    },
    /// `conv2d_grad_filter`: conv2d's weight gradient.
    ConvGradFilter {
        /// conv2d's window (no ceil mode).
        window: Window,
        /// conv2d's groups.
        groups: usize,
    },
    /// `max_pool2d_grad`: max_pool2d's dx.
    MaxPoolGrad(Window),
    /// `avg_pool2d_grad`: avg_pool2d's dx.
    AvgPoolGrad {
        /// avg_pool2d's window.
        window: Window,
        /// avg_pool2d's divisor counts padding.
        count_include_pad: bool,
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
        "conv2d_grad_input" | "conv2d_grad_filter" | "conv_transpose2d_grad_input" => {
            let window = window(r, false);
            let groups = r.size("groups", 1);
            return Some(match name {
                "conv2d_grad_input" => GradOp::ConvGradInput { window, groups },
                "conv2d_grad_filter" => GradOp::ConvGradFilter { window, groups },
                _ => GradOp::ConvTransposeGradInput { window, groups },
            });
        }
        "max_pool2d_grad" => return Some(GradOp::MaxPoolGrad(window(r, true))),
        "avg_pool2d_grad" => {
            return Some(GradOp::AvgPoolGrad {
                window: window(r, true),
                count_include_pad: r.bool("count_include_pad"),
            })
        }
        _ => return None,
    }
    let op = r.choice("op");
    // "relu" is the fallback after a problem was recorded.
    let unary = read_unary(&op, r).unwrap_or(Unary::Relu);
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
            GradOp::ConvGradInput { .. } => "conv2d_grad_input",
            GradOp::ConvGradFilter { .. } => "conv2d_grad_filter",
            GradOp::ConvTransposeGradInput { .. } => "conv_transpose2d_grad_input",
            GradOp::MaxPoolGrad(_) => "max_pool2d_grad",
            GradOp::AvgPoolGrad { .. } => "avg_pool2d_grad",
        }
    }

    /// The forward operator of a conv-family backward, with `out_channels` output
    /// channels (`None` for the other backwards).
    pub fn forward(&self, out_channels: usize) -> Option<ConvOp> {
        match self {
            GradOp::ConvGradInput { window, groups }
            | GradOp::ConvGradFilter { window, groups } => Some(ConvOp::Conv2d {
                window: window.clone(),
                out_channels,
                groups: *groups,
                bias: false,
            }),
            GradOp::MaxPoolGrad(w) => Some(ConvOp::MaxPool(w.clone())),
            GradOp::AvgPoolGrad {
                window,
                count_include_pad,
            } => Some(ConvOp::AvgPool {
                window: window.clone(),
                count_include_pad: *count_include_pad,
            }),
            _ => None,
        }
    }

    /// Checks what parsing guarantees, for operators that arrive already parsed: a
    /// conv-family backward's window and groups as its forward operator's, and a unary
    /// operator's attributes valid.
    pub fn validate(&self) -> Result<(), String> {
        if let GradOp::UnaryGrad(u) = self {
            u.validate().map_err(|e| format!("unary_grad: {e}"))?;
        }
        // Any multiple of the groups stands for the output channels here (groups of 0
        // are refused by the forward operator's check).
        let groups = match self {
            GradOp::ConvGradInput { groups, .. } | GradOp::ConvGradFilter { groups, .. } => *groups,
            GradOp::ConvTransposeGradInput { .. } => {
                return self
                    .as_conv2d(self.groups())
                    .validate()
                    .map_err(|e| format!("{}: {e}", self.name()));
            }
            _ => 1,
        };
        match self.forward(groups.max(1)) {
            Some(f) => f.validate().map_err(|e| format!("{}: {e}", self.name())),
            None => Ok(()),
        }
    }

    /// Multiply-adds of a convolution's backward, as its forward's (2 FLOPs each); a
    /// pooling backward reads a window per element. `None` for the one-pass backwards.
    pub fn flops(&self, inputs: &[Vec<usize>], outputs: &[Vec<usize>]) -> Option<u64> {
        let (x, out) = (inputs.first()?, outputs.first()?);
        let dy = inputs.last()?;
        match self {
            GradOp::ConvGradInput { window, groups }
            | GradOp::ConvGradFilter { window, groups } => {
                let c = x.get(1).copied().unwrap_or(1) / (*groups).max(1);
                let k = widen(window.kernel[0]).saturating_mul(widen(window.kernel[1]));
                Some(
                    2u64.saturating_mul(product(dy))
                        .saturating_mul(widen(c))
                        .saturating_mul(k),
                )
            }
            GradOp::MaxPoolGrad(w) | GradOp::AvgPoolGrad { window: w, .. } => {
                let k = widen(w.kernel[0]).saturating_mul(widen(w.kernel[1]));
                Some(product(out).saturating_mul(k).saturating_mul(k))
            }
            GradOp::ConvTransposeGradInput { window, groups } => {
                let c = dy.get(1).copied().unwrap_or(1) / (*groups).max(1);
                let k = widen(window.kernel[0]).saturating_mul(widen(window.kernel[1]));
                Some(
                    2u64.saturating_mul(product(x))
                        .saturating_mul(widen(c))
                        .saturating_mul(k),
                )
            }
            _ => None,
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
        if matches!(
            self,
            GradOp::ConvGradInput { .. }
                | GradOp::ConvGradFilter { .. }
                | GradOp::MaxPoolGrad(_)
                | GradOp::AvgPoolGrad { .. }
        ) {
            return self.window_infer(inputs);
        }
        if let GradOp::ConvTransposeGradInput { .. } = self {
            return self.transpose_infer(inputs);
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
        if let Some(f) = self.forward(1) {
            return self.window_batch(&f, batch).map(|b| vec![b]);
        }
        if let GradOp::ConvTransposeGradInput { .. } = self {
            let f = self.as_conv2d(self.groups());
            return self.window_batch(&f, batch).map(|b| vec![b]);
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

impl GradOp {
    /// The groups of a convolution backward (1 for the others).
    pub fn groups(&self) -> usize {
        match self {
            GradOp::ConvGradInput { groups, .. }
            | GradOp::ConvGradFilter { groups, .. }
            | GradOp::ConvTransposeGradInput { groups, .. } => *groups,
            _ => 1,
        }
    }

    /// `conv_transpose2d_grad_input` as the conv2d it computes (weight given as an input),
    /// with `out_channels` output channels (x's).
    pub fn as_conv2d(&self, out_channels: usize) -> ConvOp {
        let (window, groups) = match self {
            GradOp::ConvTransposeGradInput { window, groups } => (window.clone(), *groups),
            _ => (
                Window {
                    kernel: [1, 1],
                    strides: [1, 1],
                    pads: [0; 4],
                    dilations: [1, 1],
                    ceil_mode: false,
                },
                1,
            ),
        };
        ConvOp::Conv2d {
            window,
            out_channels,
            groups,
            bias: false,
        }
    }

    /// `conv_transpose2d_grad_input`'s type: x's, once conv2d over dy with the window
    /// gives x's shape and the weight is conv_transpose2d's [C, OC/groups, kh, kw].
    fn transpose_infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        let (x, weight, dy) = (&inputs[0], &inputs[1], &inputs[2]);
        for (what, t) in [("x", x), ("weight", weight), ("dy", dy)] {
            need_f32(name, what, t)?;
        }
        let (Some(c), Some(oc)) = (
            x.shape.get(1).and_then(Dim::known),
            dy.shape.get(1).and_then(Dim::known),
        ) else {
            return Err(format!(
                "{name} needs 4-D x and dy with known channels, got {} and {}",
                show(&x.shape),
                show(&dy.shape)
            ));
        };
        let conv = self.as_conv2d(c);
        conv.validate().map_err(|e| format!("{name}: {e}"))?;
        let y = conv
            .infer(std::slice::from_ref(dy))
            .map_err(|e| format!("{name}: {e}"))?;
        if y[0].shape != x.shape || x.shape.len() != 4 {
            return Err(format!(
                "{name}: conv2d over dy {} gives {}, not x's {}",
                show(&dy.shape),
                show(&y[0].shape),
                show(&x.shape)
            ));
        }
        let ConvOp::Conv2d { window, groups, .. } = &conv else {
            return Err("internal: not a conv2d".into());
        };
        let w: Vec<Dim> = [c, oc / groups, window.kernel[0], window.kernel[1]]
            .iter()
            .map(|&d| Dim::Known(d))
            .collect();
        if weight.shape != w {
            return Err(format!(
                "{name}: weight {} is not conv_transpose2d's {}",
                show(&weight.shape),
                show(&w)
            ));
        }
        Ok(vec![x.clone()])
    }

    /// A conv-family backward's type: dy must be the forward operator's output on x (and
    /// `conv2d_grad_input`'s weight conv2d's weight); dx has x's type, the weight gradient
    /// `[OC, C/groups, kh, kw]`.
    fn window_infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        let (x, dy) = (&inputs[0], &inputs[inputs.len() - 1]);
        need_f32(name, "x", x)?;
        need_f32(name, "dy", dy)?;
        let conv = matches!(
            self,
            GradOp::ConvGradInput { .. } | GradOp::ConvGradFilter { .. }
        );
        let oc = if conv {
            match dy.shape.get(1).and_then(Dim::known) {
                Some(oc) if dy.shape.len() == 4 => oc,
                _ => {
                    return Err(format!(
                        "{name} needs a 4-D dy with known channels, got {}",
                        show(&dy.shape)
                    ))
                }
            }
        } else {
            1
        };
        let forward = self.forward(oc).ok_or("internal: no forward operator")?;
        forward.validate().map_err(|e| format!("{name}: {e}"))?;
        let y = forward
            .infer(std::slice::from_ref(x))
            .map_err(|e| format!("{name}: {e}"))?;
        if y[0].shape != dy.shape {
            return Err(format!(
                "{name}: dy {} is not {}'s output {} on x {}",
                show(&dy.shape),
                forward.name(),
                show(&y[0].shape),
                show(&x.shape)
            ));
        }
        let filter = match &forward {
            ConvOp::Conv2d { window, groups, .. } => {
                let c = x.shape[1].known().ok_or("conv2d needs known channels")?;
                let dims = [oc, c / groups, window.kernel[0], window.kernel[1]];
                Some(dims.iter().map(|&d| Dim::Known(d)).collect::<Vec<_>>())
            }
            _ => None,
        };
        match (self, filter) {
            (GradOp::ConvGradInput { .. }, Some(w)) => {
                let weight = &inputs[1];
                need_f32(name, "weight", weight)?;
                if weight.shape != w {
                    return Err(format!(
                        "{name}: weight {} is not conv2d's {}",
                        show(&weight.shape),
                        show(&w)
                    ));
                }
                Ok(vec![x.clone()])
            }
            (GradOp::ConvGradFilter { .. }, Some(w)) => Ok(vec![TensorType::f32(w)]),
            _ => Ok(vec![x.clone()]),
        }
    }

    /// A conv-family backward's batch rule: as its forward operator's on x and dy (which
    /// must agree); the weight gradient sums over the samples, so any batch couples, and
    /// so does a batched weight.
    fn window_batch(
        &self,
        forward: &ConvOp,
        batch: &[Option<usize>],
    ) -> Result<Option<usize>, String> {
        let name = self.name();
        let (bx, bdy) = (batch[0], batch[batch.len() - 1]);
        if batch.len() == 3 && batch[1].is_some() {
            return Err(format!(
                "{name} sums over the weight, which carries the batch"
            ));
        }
        let b = match (bx, bdy) {
            (Some(a), Some(d)) if a != d => {
                return Err(format!(
                    "{name} pairs x's batch (axis {a}) with dy's (axis {d}): every sample meets every other"
                ))
            }
            (a, d) => a.or(d),
        };
        if let (GradOp::ConvGradFilter { .. }, Some(_)) = (self, b) {
            return Err(format!(
                "{name} sums over the samples and positions, and x carries the batch"
            ));
        }
        let t = TensorType::f32(Vec::new());
        let out = forward.batch(std::slice::from_ref(&t), &[b], std::slice::from_ref(&t))?;
        Ok(out[0])
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
    use crate::ops::testing::{couples, rule, tensor};
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
    fn conv_backwards_follow_their_forward_operators() {
        let conv = json!({ "kernel_size": [3, 3], "pads": [1, 1] });
        let (x, w, dy) = (
            ("N,3,8,8", Some(0)),
            ("4,3,3,3", None),
            ("N,4,8,8", Some(0)),
        );
        let r = rule("conv2d_grad_input", conv.clone(), &[x, w, dy]);
        assert_eq!(r, Ok(vec![Some(0)]));
        couples(
            rule("conv2d_grad_filter", conv, &[x, dy]),
            &["conv2d_grad_filter sums over the samples"],
        );
        let pool = json!({ "kernel_size": [2, 2], "strides": [2, 2] });
        let r = rule(
            "max_pool2d_grad",
            pool.clone(),
            &[("4,N,8,8", Some(1)), ("4,N,4,4", Some(1))],
        );
        assert_eq!(r, Ok(vec![Some(1)]));
        couples(
            rule(
                "avg_pool2d_grad",
                pool,
                &[("4,3,8,8", Some(2)), ("4,3,4,4", Some(2))],
            ),
            &["slides its window along axis 2"],
        );
    }

    #[test]
    fn a_conv_backward_checks_dy_and_the_weight_against_its_forward() {
        let infer = |op: &str, attrs: serde_json::Value, inputs: &[&str]| {
            let attrs = attrs.as_object().cloned().unwrap_or_default();
            let types: Vec<_> = inputs.iter().map(|t| tensor(t)).collect();
            crate::ops::parse(op, &attrs).unwrap().infer(&types)
        };
        let conv = json!({ "kernel_size": [3, 3], "strides": [2, 2], "groups": 2 });
        let out = infer("conv2d_grad_filter", conv.clone(), &["2,4,9,9", "2,6,4,4"]).unwrap();
        assert_eq!(out[0], tensor("6,2,3,3"));
        let e = infer("conv2d_grad_filter", conv.clone(), &["2,4,9,9", "2,6,5,5"]).unwrap_err();
        assert!(e.contains("is not conv2d's output [2, 6, 4, 4]"), "{e}");
        let e = infer(
            "conv2d_grad_input",
            conv,
            &["2,4,9,9", "6,4,3,3", "2,6,4,4"],
        )
        .unwrap_err();
        assert!(
            e.contains("weight [6, 4, 3, 3] is not conv2d's [6, 2, 3, 3]"),
            "{e}"
        );
        let pool = json!({ "kernel_size": [2, 2], "ceil_mode": true, "strides": [2, 2] });
        let out = infer("max_pool2d_grad", pool.clone(), &["1,2,5,5", "1,2,3,3"]).unwrap();
        assert_eq!(out[0], tensor("1,2,5,5"));
        assert!(infer("avg_pool2d_grad", pool, &["1,2,5,5", "1,2,2,2"]).is_err());
        // Groups of 0 arriving already parsed are refused, not divided by.
        let op = super::GradOp::ConvGradFilter {
            window: crate::ops::conv::Window {
                kernel: [1, 1],
                strides: [1, 1],
                pads: [0; 4],
                dilations: [1, 1],
                ceil_mode: false,
            },
            groups: 0,
        };
        assert!(op.validate().is_err());
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
