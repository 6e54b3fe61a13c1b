//! Conv/pool family (and `resize`): `conv2d` (stride, padding, dilation, groups, bias),
//! `conv_transpose2d` (ONNX ConvTranspose: also output_padding and output_shape),
//! `max_pool2d`, `avg_pool2d` (ceil mode, count_include_pad) and `global_avg_pool`, all
//! NCHW. Kernels: `shaders/conv.wgsl`; `global_avg_pool` uses the reduce kernel and
//! `conv_transpose2d` conv2d's input-gradient kernel (`shaders/grad.wgsl`), which is the
//! transposed convolution, gathering over the taps that reach each output (no atomics).
//! `resize` (ONNX Resize, nearest and linear, any rank) reads per-axis tap tables the host
//! computes in f64, so the CPU and every kernel pick the same input elements; its
//! gradient multiplies by each axis's interpolation matrix, transposed.
//!
//! One-dimensional convolution and pooling are the same operators on [N, C, L] inputs with
//! one-entry window attributes (`kernel_size: [k]`, `strides: [s]`, `dilations: [d]`,
//! `pads: [begin, end]`): the input is [N, C, 1, L] and the window [1, k] (conv2d's weight
//! is then [OC, C/groups, k]). `global_avg_pool` averages every axis after C.

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec};
use super::backward::GradContext;
use super::{
    need_f32, product, widen, Anchor, Arity, Capabilities, Init, OpSchema, ParamSpec, TensorType,
};
use crate::shape::{show, Dim};
use serde_json::json;

/// Family tag.
pub const FAMILY: &str = "conv";

/// The window attributes of conv2d, the pools and their gradients: one integer for every
/// axis or one per axis ([`AttrKind::PerAxis`]).
pub(crate) const KERNEL_SIZE: AttrSpec = required(
    "kernel_size",
    AttrKind::PerAxis(2),
    "[kh, kw], or k for both.",
);
/// The window's step along each axis.
pub(crate) const STRIDES: AttrSpec = optional(
    "strides",
    AttrKind::PerAxis(2),
    "[1, 1]",
    "[sh, sw], or s for both.",
);
/// Padding around the input, per side.
pub(crate) const PADS: AttrSpec = optional(
    "pads",
    AttrKind::PerAxis(4),
    "[0, 0, 0, 0]",
    "[top, left, bottom, right], [ph, pw], or p for every side.",
);
/// Spacing between the window's taps.
pub(crate) const DILATIONS: AttrSpec = optional(
    "dilations",
    AttrKind::PerAxis(2),
    "[1, 1]",
    "[dh, dw], or d for both.",
);

const CONV_ATTRS: &[AttrSpec] = &[
    required("out_channels", AttrKind::Int, "Output channels."),
    KERNEL_SIZE,
    STRIDES,
    PADS,
    DILATIONS,
    optional(
        "groups",
        AttrKind::Int,
        "1",
        "Channel groups (depthwise when = channels).",
    ),
    optional("bias", AttrKind::Bool, "true", "Add a learned bias."),
];
const CONV_TRANSPOSE_ATTRS: &[AttrSpec] = &[
    required(
        "out_channels",
        AttrKind::Int,
        "Output channels (the weight's second dimension × groups).",
    ),
    required("kernel_size", AttrKind::PerAxis(2), "[kh, kw], or k for both ([k] for 1-D)."),
    STRIDES,
    optional(
        "pads",
        AttrKind::PerAxis(4),
        "[0, 0, 0, 0]",
        "[top, left, bottom, right], [ph, pw], or p for every side, taken off the full output.",
    ),
    DILATIONS,
    optional("groups", AttrKind::Int, "1", "Channel groups."),
    optional(
        "output_padding",
        AttrKind::PerAxis(2),
        "[0, 0]",
        "Added to the output's end along each axis (below the stride or dilation), or one for both.",
    ),
    optional(
        "output_shape",
        AttrKind::Ints,
        "null",
        "[OH, OW]: the output size; pads are then derived as ONNX does (NOTSET).",
    ),
    optional("bias", AttrKind::Bool, "true", "Add a learned bias."),
];
const RESIZE_ATTRS: &[AttrSpec] = &[
    optional(
        "mode",
        AttrKind::Choice(&["nearest", "linear", "cubic"]),
        "\"nearest\"",
        "Interpolation (cubic is not supported).",
    ),
    optional(
        "scales",
        AttrKind::Floats,
        "null",
        "Scale per axis of `axes` (or of x).",
    ),
    optional(
        "sizes",
        AttrKind::Ints,
        "null",
        "Output size per axis of `axes` (or of x); exactly one of scales and sizes.",
    ),
    optional(
        "axes",
        AttrKind::Ints,
        "null",
        "Resized axes; every axis when absent.",
    ),
    optional(
        "coordinate_transformation_mode",
        AttrKind::Choice(&[
            "half_pixel",
            "half_pixel_symmetric",
            "pytorch_half_pixel",
            "align_corners",
            "asymmetric",
            "tf_crop_and_resize",
        ]),
        "\"half_pixel\"",
        "How an output coordinate maps to the input (tf_crop_and_resize is not supported).",
    ),
    optional(
        "nearest_mode",
        AttrKind::Choice(&["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]),
        "\"round_prefer_floor\"",
        "Rounding of nearest mode.",
    ),
    optional(
        "keep_aspect_ratio_policy",
        AttrKind::Choice(&["stretch", "not_larger", "not_smaller"]),
        "\"stretch\"",
        "With sizes: one scale for every axis, the smallest (not_larger) or largest.",
    ),
    optional(
        "antialias",
        AttrKind::Int,
        "0",
        "Must be 0 (antialiasing is not supported).",
    ),
    optional(
        "exclude_outside",
        AttrKind::Int,
        "0",
        "Cubic only; must be 0.",
    ),
    optional(
        "cubic_coeff_a",
        AttrKind::Float,
        "-0.75",
        "Cubic only (ignored).",
    ),
    optional(
        "extrapolation_value",
        AttrKind::Float,
        "0",
        "tf_crop_and_resize only (ignored).",
    ),
];
/// max_pool2d's attributes (also `max_pool2d_grad`'s).
pub(crate) const MAX_POOL_ATTRS: &[AttrSpec] = &[
    KERNEL_SIZE,
    STRIDES,
    PADS,
    DILATIONS,
    optional(
        "ceil_mode",
        AttrKind::Bool,
        "false",
        "Round the output size up.",
    ),
];
/// avg_pool2d's attributes (also `avg_pool2d_grad`'s).
pub(crate) const AVG_POOL_ATTRS: &[AttrSpec] = &[
    KERNEL_SIZE,
    STRIDES,
    PADS,
    DILATIONS,
    optional(
        "ceil_mode",
        AttrKind::Bool,
        "false",
        "Round the output size up.",
    ),
    optional(
        "count_include_pad",
        AttrKind::Bool,
        "false",
        "Count padding in the divisor.",
    ),
];

const fn op(
    name: &'static str,
    doc: &'static str,
    attrs: &'static [AttrSpec],
    params: &'static [&'static str],
) -> OpSchema {
    OpSchema {
        name,
        family: FAMILY,
        doc,
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs,
        params,
    }
}

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    op(
        "conv2d",
        "2-D convolution over NCHW input; weight [OC, C/groups, kh, kw].",
        CONV_ATTRS,
        &["weight", "bias"],
    ),
    op(
        "conv_transpose2d",
        "2-D transposed convolution over NCHW input (ONNX ConvTranspose); weight [C, OC/groups, kh, kw].",
        CONV_TRANSPOSE_ATTRS,
        &["weight", "bias"],
    ),
    op(
        "resize",
        "Resizes axes by nearest or (multi)linear interpolation (ONNX Resize).",
        RESIZE_ATTRS,
        &[],
    ),
    op(
        "max_pool2d",
        "2-D max pooling over NCHW input.",
        MAX_POOL_ATTRS,
        &[],
    ),
    op(
        "avg_pool2d",
        "2-D average pooling over NCHW input.",
        AVG_POOL_ATTRS,
        &[],
    ),
    op(
        "global_avg_pool",
        "Mean over H and W: [N, C, H, W] → [N, C, 1, 1].",
        &[],
        &[],
    ),
];

/// Window geometry shared by convolution and pooling.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Window {
    /// [kh, kw]
    pub kernel: [usize; 2],
    /// [sh, sw]
    pub strides: [usize; 2],
    /// [top, left, bottom, right]
    pub pads: [usize; 4],
    /// [dh, dw]
    pub dilations: [usize; 2],
    /// Round output size up.
    pub ceil_mode: bool,
}

/// A parsed conv/pool operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ConvOp {
    /// conv2d
    Conv2d {
        /// Window.
        window: Window,
        /// Output channels.
        out_channels: usize,
        /// Groups.
        groups: usize,
        /// Bias.
        bias: bool,
    },
    /// conv_transpose2d
    ConvTranspose2d {
        /// Window; its pads are taken off the full output (ignored with `output_shape`).
        window: Window,
        /// Output channels.
        out_channels: usize,
        /// Groups.
        groups: usize,
        /// Bias.
        bias: bool,
        /// Added to the output's end, [h, w].
        output_padding: [usize; 2],
        /// The output's spatial size, when given.
        output_shape: Option<[usize; 2]>,
    },
    /// max_pool2d
    MaxPool(Window),
    /// avg_pool2d
    AvgPool {
        /// Window.
        window: Window,
        /// Count padding in the divisor.
        count_include_pad: bool,
    },
    /// global_avg_pool
    GlobalAvgPool,
    /// resize
    Resize(Resize),
}

/// A parsed `resize`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Resize {
    /// Linear (false: nearest).
    pub linear: bool,
    /// Scales per resized axis.
    pub scales: Option<Vec<f32>>,
    /// Sizes per resized axis.
    pub sizes: Option<Vec<i64>>,
    /// Resized axes (all when absent).
    pub axes: Option<Vec<i64>>,
    /// coordinate_transformation_mode.
    pub coordinates: String,
    /// nearest_mode.
    pub nearest: String,
    /// keep_aspect_ratio_policy.
    pub policy: String,
}

/// Where output index `o` of a resized axis reads: two input indices and the weight of
/// the second (0 for nearest).
pub type Tap = (usize, usize, f32);

impl Resize {
    /// The output shape and each axis's table of taps, from the input shape, in f64 as
    /// ONNX's reference computes them.
    pub fn plan(&self, dims: &[usize]) -> Result<(Vec<usize>, Vec<Vec<Tap>>), String> {
        let rank = dims.len();
        let axes: Vec<usize> = match &self.axes {
            Some(list) => list
                .iter()
                .map(|&a| crate::shape::existing_axis(a, rank))
                .collect::<Result<_, _>>()?,
            None => (0..rank).collect(),
        };
        let n = self
            .scales
            .as_ref()
            .map(Vec::len)
            .or(self.sizes.as_ref().map(Vec::len))
            .unwrap_or(0);
        if n != axes.len() {
            return Err(format!(
                "resize has {n} scales or sizes for {} axes",
                axes.len()
            ));
        }
        let mut scale = vec![1f64; rank];
        let mut out = dims.to_vec();
        match (&self.scales, &self.sizes) {
            (Some(sc), None) => {
                for (k, &a) in axes.iter().enumerate() {
                    let f = f64::from(sc[k]);
                    if f <= 0.0 {
                        return Err(format!("resize scales must be positive, got {sc:?}"));
                    }
                    scale[a] = f;
                    out[a] = (dims[a] as f64 * f).floor() as usize;
                }
            }
            (None, Some(sz)) => {
                let ratios: Vec<f64> = axes
                    .iter()
                    .enumerate()
                    .map(|(k, &a)| sz[k] as f64 / dims[a].max(1) as f64)
                    .collect();
                let pick = match self.policy.as_str() {
                    "not_larger" => ratios.iter().copied().reduce(f64::min),
                    "not_smaller" => ratios.iter().copied().reduce(f64::max),
                    _ => None,
                };
                for (k, &a) in axes.iter().enumerate() {
                    if sz[k] <= 0 || sz[k] > super::attrs::MAX_SIZE {
                        return Err(format!("resize sizes must be positive, got {sz:?}"));
                    }
                    match pick {
                        Some(r) => {
                            scale[a] = r;
                            out[a] = (r * dims[a] as f64).round_ties_even() as usize;
                        }
                        None => {
                            scale[a] = ratios[k];
                            out[a] = sz[k] as usize;
                        }
                    }
                }
            }
            _ => return Err("resize takes exactly one of scales and sizes".into()),
        }
        let mut taps = Vec::with_capacity(rank);
        for a in 0..rank {
            if out[a] > super::attrs::MAX_SIZE as usize {
                return Err(format!("resize output size {} is too large", out[a]));
            }
            taps.push(
                (0..out[a])
                    .map(|o| self.tap(o, dims[a], out[a], scale[a]))
                    .collect(),
            );
        }
        Ok((out, taps))
    }

    /// Gradient rule: resizing is linear and separable, so dx is dy multiplied, along
    /// each resized axis, by the transpose of that axis's interpolation matrix (a
    /// constant [out, in] holding each tap's weight): the axis moved last, a matmul, and
    /// moved back. Axes the resize leaves alone are skipped.
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        if !g.needs(0) {
            return Ok(());
        }
        let dy = g.dy()?;
        let x = g.input(0)?;
        let xs = g.shape(&x)?;
        let (out, taps) = self.plan(&xs)?;
        let rank = xs.len();
        let mut v = dy;
        for a in 0..rank {
            let unchanged = out[a] == xs[a]
                && taps[a]
                    .iter()
                    .enumerate()
                    .all(|(o, &(lo, _, w))| lo == o && w == 0.0);
            if unchanged {
                continue;
            }
            let (n_out, n_in) = (out[a], xs[a]);
            let size = n_out
                .checked_mul(n_in)
                .filter(|&n| n <= super::constant::MAX_ELEMENTS)
                .ok_or_else(|| {
                    format!(
                        "resize's gradient along axis {a} needs a {n_out}×{n_in} matrix, over {} elements",
                        super::constant::MAX_ELEMENTS
                    )
                })?;
            let mut m = vec![0f32; size];
            for (o, &(lo, hi, w)) in taps[a].iter().enumerate() {
                m[o * n_in + lo] += 1.0 - w;
                m[o * n_in + hi] += w;
            }
            let c = g.emit(
                "constant",
                json!({ "value": m, "shape": [n_out, n_in] }),
                &[],
            )?;
            let mut perm: Vec<usize> = (0..rank).filter(|&k| k != a).collect();
            perm.push(a);
            let mut inverse = vec![0usize; rank];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            let t = g.emit("transpose", json!({ "perm": perm }), &[&v])?;
            let t = g.emit("matmul", json!({}), &[&t, &c])?;
            v = g.emit("transpose", json!({ "perm": inverse }), &[&t])?;
        }
        g.input_grad(0, v)
    }

    /// The taps of output index `o` along an axis of `len` resized to `out` by `scale`.
    fn tap(&self, o: usize, len: usize, out: usize, scale: f64) -> Tap {
        let x = o as f64;
        // ONNX's resized length is the unrounded scale × length.
        let resized = scale * len as f64;
        let x = match self.coordinates.as_str() {
            "asymmetric" => x / scale,
            "align_corners" if resized == 1.0 => 0.0,
            "align_corners" => x * (len as f64 - 1.0) / (resized - 1.0),
            "pytorch_half_pixel" if resized <= 1.0 => 0.0,
            "half_pixel_symmetric" => {
                let adjustment = out as f64 / (scale * len as f64);
                let offset = len as f64 / 2.0 * (1.0 - adjustment);
                offset + (x + 0.5) / scale - 0.5
            }
            _ => (x + 0.5) / scale - 0.5,
        };
        let last = len.saturating_sub(1) as f64;
        if self.linear {
            let x = x.clamp(0.0, last);
            let lo = x.floor();
            let hi = (lo + 1.0).min(last);
            (lo as usize, hi as usize, (x - lo) as f32)
        } else {
            let floor = x.floor();
            let frac = x - floor;
            let i = match self.nearest.as_str() {
                "floor" => floor,
                "ceil" => x.ceil(),
                "round_prefer_ceil" if frac == 0.5 => x.ceil(),
                "round_prefer_ceil" => x.round(),
                _ if frac == 0.5 => floor,
                _ => x.round(),
            };
            let i = i.clamp(0.0, last) as usize;
            (i, i, 0.0)
        }
    }
}

/// Largest kernel size, stride, dilation or padding (2^20).
pub const MAX_WINDOW: usize = 1 << 20;

/// Reads a window list: two integers (a single one stands for both), or one for a 1-D
/// window (then [1, v]); absent optional lists take the schema's 2-D default, which is
/// [1, 1].
fn pair(r: &mut AttrReader, name: &str, min: i64, one_d: bool) -> [usize; 2] {
    let v = r.per_axis(name);
    let want = if one_d { 1 } else { 2 };
    let is_default = v == [1, 1] && name != "kernel_size";
    if (v.len() != want && !is_default) || v.iter().any(|&x| x < min || x > MAX_WINDOW as i64) {
        r.reject(
            name,
            format!(
                "{name} must be {} integer{} in {min}..={MAX_WINDOW} (as kernel_size), got {v:?}",
                want,
                if one_d { "" } else { "s" }
            ),
        );
        return [min.max(1) as usize; 2];
    }
    match v.as_slice() {
        [a] => [1, *a as usize],
        [a, b, ..] => [*a as usize, *b as usize],
        [] => [1, 1],
    }
}

/// Reads a window's attributes (`ceil_mode` only when `ceil`). A one-entry
/// `kernel_size` makes a 1-D window ([1, k]); its other lists then have one entry too,
/// and `pads` is [begin, end]. A single integer is the 2-D shorthand (the same on both
/// axes, `pads` on every side).
pub(crate) fn window(r: &mut AttrReader, ceil: bool) -> Window {
    let one_d = r.per_axis("kernel_size").len() == 1;
    let kernel = pair(r, "kernel_size", 1, one_d);
    let strides = pair(r, "strides", 1, one_d);
    let dilations = pair(r, "dilations", 1, one_d);
    let p = r.per_axis("pads");
    let p = match p.as_slice() {
        [a, b] if one_d => vec![0, *a, 0, *b],
        [0, 0, 0, 0] if one_d => vec![0; 4],
        _ if one_d => {
            r.reject(
                "pads",
                format!("a 1-D window's pads must be [begin, end], got {p:?}"),
            );
            vec![0; 4]
        }
        _ => p,
    };
    let pads = match p.as_slice() {
        [a, b] if *a >= 0 && *b >= 0 && *a <= MAX_WINDOW as i64 && *b <= MAX_WINDOW as i64 => {
            [*a as usize, *b as usize, *a as usize, *b as usize]
        }
        [a, b, c, d] if p.iter().all(|&x| (0..=MAX_WINDOW as i64).contains(&x)) => {
            [*a as usize, *b as usize, *c as usize, *d as usize]
        }
        _ => {
            r.reject(
                "pads",
                format!(
                    "pads must be [top, left, bottom, right] or [ph, pw] of integers in 0..={MAX_WINDOW}, got {p:?}"
                ),
            );
            [0; 4]
        }
    };
    Window {
        kernel,
        strides,
        pads,
        dilations,
        ceil_mode: ceil && r.bool("ceil_mode"),
    }
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<ConvOp> {
    Some(match name {
        "conv2d" => {
            let w = window(r, false);
            let oc = r.size("out_channels", 1);
            let groups = r.size("groups", 1);
            if !oc.is_multiple_of(groups) {
                r.reject(
                    "groups",
                    format!("groups must divide out_channels ({oc}), got {groups}"),
                );
            }
            ConvOp::Conv2d {
                window: w,
                out_channels: oc,
                groups,
                bias: r.bool("bias"),
            }
        }
        "conv_transpose2d" => {
            let one_d = r.per_axis("kernel_size").len() == 1;
            let w = window(r, false);
            let oc = r.size("out_channels", 1);
            let groups = r.size("groups", 1);
            if !oc.is_multiple_of(groups) {
                r.reject(
                    "groups",
                    format!("groups must divide out_channels ({oc}), got {groups}"),
                );
            }
            let mut spatial = |name: &str, min: i64| -> Option<[usize; 2]> {
                let v = if name == "output_shape" {
                    r.opt_ints(name)?
                } else {
                    r.opt_per_axis(name)?
                };
                let ok = v.iter().all(|&x| (min..=MAX_WINDOW as i64).contains(&x));
                match v.as_slice() {
                    [a] if one_d && ok => Some([if min == 0 { 0 } else { 1 }, *a as usize]),
                    [0, 0] if one_d && min == 0 => Some([0, 0]),
                    [a, b] if !one_d && ok => Some([*a as usize, *b as usize]),
                    _ => {
                        r.reject(
                            name,
                            format!(
                                "{name} must have one integer in {min}..={MAX_WINDOW} per axis of kernel_size, got {v:?}"
                            ),
                        );
                        None
                    }
                }
            };
            let output_padding = spatial("output_padding", 0).unwrap_or([0, 0]);
            let output_shape = spatial("output_shape", 1);
            for a in 0..2 {
                if output_padding[a] >= w.strides[a].max(w.dilations[a]) {
                    r.reject(
                        "output_padding",
                        format!(
                            "output_padding must be below the stride or the dilation, got {output_padding:?}"
                        ),
                    );
                    break;
                }
            }
            ConvOp::ConvTranspose2d {
                window: w,
                out_channels: oc,
                groups,
                bias: r.bool("bias"),
                output_padding,
                output_shape,
            }
        }
        "max_pool2d" => ConvOp::MaxPool(window(r, true)),
        "avg_pool2d" => ConvOp::AvgPool {
            window: window(r, true),
            count_include_pad: r.bool("count_include_pad"),
        },
        "global_avg_pool" => ConvOp::GlobalAvgPool,
        "resize" => {
            let mode = r.choice("mode");
            if mode == "cubic" {
                r.reject(
                    "mode",
                    "resize: cubic interpolation is not supported (nearest, linear)",
                );
            }
            let coordinates = r.choice("coordinate_transformation_mode");
            if coordinates == "tf_crop_and_resize" {
                r.reject(
                    "coordinate_transformation_mode",
                    "resize: tf_crop_and_resize (a region of interest) is not supported",
                );
            }
            if r.int("antialias") != 0 {
                r.reject(
                    "antialias",
                    "resize: antialiasing is not supported; antialias must be 0",
                );
            }
            if r.int("exclude_outside") != 0 {
                r.reject(
                    "exclude_outside",
                    "resize: exclude_outside applies to cubic mode, which is not supported",
                );
            }
            r.float("cubic_coeff_a");
            r.float("extrapolation_value");
            let sizes = r.opt_ints("sizes");
            let scales = r.floats("scales");
            let scales = (!scales.is_empty()).then_some(scales);
            if sizes.is_some() == scales.is_some() {
                r.reject("scales", "resize takes exactly one of scales and sizes");
            }
            ConvOp::Resize(Resize {
                linear: mode == "linear",
                scales,
                sizes,
                axes: r.opt_ints("axes"),
                coordinates,
                nearest: r.choice("nearest_mode"),
                policy: r.choice("keep_aspect_ratio_policy"),
            })
        }
        _ => return None,
    })
}

impl Window {
    /// Output size along one spatial axis (ONNX rules, including ceil mode), computed
    /// with checked arithmetic: a window or padding too large to count is an error.
    pub fn out_size(&self, input: usize, axis: usize) -> Result<usize, String> {
        let get = |v: &[usize], i: usize| v.get(i).copied().ok_or("axis out of range");
        let (k, d) = (get(&self.kernel, axis)?, get(&self.dilations, axis)?);
        let (s, before, after) = (
            get(&self.strides, axis)?.max(1),
            get(&self.pads, axis)?,
            get(&self.pads, axis + 2)?,
        );
        let overflow = || format!("the window or padding along axis {axis} is too large");
        let span = k
            .saturating_sub(1)
            .checked_mul(d)
            .and_then(|x| x.checked_add(1))
            .ok_or_else(overflow)?;
        let padded = input
            .checked_add(before)
            .and_then(|x| x.checked_add(after))
            .ok_or_else(overflow)?;
        let Some(room) = padded.checked_sub(span) else {
            return Err(format!(
                "window span {span} exceeds the padded input size {padded}"
            ));
        };
        let mut out = if self.ceil_mode {
            room.div_ceil(s) + 1
        } else {
            room / s + 1
        };
        // In ceil mode, the last window must start inside the input or the leading padding.
        let last_start = (out - 1).checked_mul(s).ok_or_else(overflow)?;
        if self.ceil_mode && last_start >= input.saturating_add(before) {
            out -= 1;
        }
        Ok(out)
    }
}

impl ConvOp {
    /// Checks what parsing guarantees, for operators that arrive already parsed (a plan
    /// from a server): window sizes within [`MAX_WINDOW`], channels and groups at least 1
    /// with groups dividing the output channels.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(w) = self.window() {
            let sizes = w.kernel.iter().chain(&w.strides).chain(&w.dilations);
            if sizes.clone().any(|&x| x == 0 || x > MAX_WINDOW)
                || w.pads.iter().any(|&x| x > MAX_WINDOW)
            {
                return Err(format!("{}: window {w:?} is out of range", self.name()));
            }
        }
        if let ConvOp::ConvTranspose2d {
            window,
            output_padding,
            output_shape,
            ..
        } = self
        {
            let bad_padding =
                (0..2).any(|a| output_padding[a] >= window.strides[a].max(window.dilations[a]));
            let bad_shape =
                output_shape.is_some_and(|s| s.iter().any(|&d| d == 0 || d > MAX_WINDOW));
            if bad_padding || bad_shape {
                return Err(format!(
                    "conv_transpose2d: output_padding {output_padding:?} or output_shape {output_shape:?} out of range"
                ));
            }
        }
        if let ConvOp::Conv2d {
            out_channels,
            groups,
            ..
        }
        | ConvOp::ConvTranspose2d {
            out_channels,
            groups,
            ..
        } = self
        {
            let max = usize::try_from(super::attrs::MAX_SIZE).unwrap_or(usize::MAX);
            if *groups == 0
                || *out_channels == 0
                || *out_channels > max
                || out_channels % groups != 0
            {
                return Err(format!(
                    "{}: {out_channels} output channels in {groups} groups",
                    self.name()
                ));
            }
        }
        Ok(())
    }

    /// A convolution takes scalar epilogues; pooling takes none.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            anchor: matches!(self, ConvOp::Conv2d { .. }).then_some(Anchor {
                row_operands: false,
            }),
            ..Capabilities::default()
        }
    }

    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self {
            ConvOp::Conv2d { .. } => "conv2d",
            ConvOp::ConvTranspose2d { .. } => "conv_transpose2d",
            ConvOp::MaxPool(_) => "max_pool2d",
            ConvOp::AvgPool { .. } => "avg_pool2d",
            ConvOp::GlobalAvgPool => "global_avg_pool",
            ConvOp::Resize(_) => "resize",
        }
    }

    /// The window of a convolution or windowed pooling.
    pub fn window(&self) -> Option<&Window> {
        match self {
            ConvOp::Conv2d { window, .. }
            | ConvOp::ConvTranspose2d { window, .. }
            | ConvOp::MaxPool(window)
            | ConvOp::AvgPool { window, .. } => Some(window),
            ConvOp::GlobalAvgPool | ConvOp::Resize(_) => None,
        }
    }

    /// Output type.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let x = &inputs[0];
        need_f32(self.name(), "input", x)?;
        if let ConvOp::Resize(r) = self {
            let Some(dims) = crate::shape::concrete(&x.shape) else {
                return Err(format!(
                    "resize needs a known shape, got {}",
                    show(&x.shape)
                ));
            };
            let (out, _) = r.plan(&dims)?;
            let shape = x
                .shape
                .iter()
                .zip(out)
                .zip(&dims)
                .map(|((d, o), &i)| if o == i { d.clone() } else { Dim::Known(o) })
                .collect();
            return Ok(vec![TensorType::f32(shape)]);
        }
        if let ConvOp::GlobalAvgPool = self {
            if x.shape.len() < 3 {
                return Err(format!(
                    "global_avg_pool needs [N, C, ...] with at least one spatial axis, got {}",
                    show(&x.shape)
                ));
            }
            let mut out = x.shape.clone();
            for d in &mut out[2..] {
                *d = Dim::Known(1);
            }
            return Ok(vec![TensorType::f32(out)]);
        }
        let one_d = x.shape.len() == 3;
        if one_d && !self.window().is_some_and(Window::is_1d) {
            return Err(format!(
                "{} on a 3-D input [N, C, L] needs a 1-D window (one-entry kernel_size, strides and dilations, pads [begin, end]), got {:?}",
                self.name(),
                self.window()
            ));
        }
        let s = &as_2d(&x.shape, Dim::Known(1));
        if s.len() != 4 {
            return Err(format!(
                "{} needs a 4-D input [N, C, H, W] (or 3-D [N, C, L]), got {}",
                self.name(),
                show(&x.shape)
            ));
        }
        let mut out = s.clone();
        let (Some(h), Some(w)) = (s[2].known(), s[3].known()) else {
            return Err(format!(
                "{} needs known H and W, got {}",
                self.name(),
                show(s)
            ));
        };
        if let ConvOp::ConvTranspose2d {
            out_channels,
            groups,
            ..
        } = self
        {
            let Some(c) = s[1].known() else {
                return Err(format!(
                    "conv_transpose2d needs a known channel count, got {}",
                    show(s)
                ));
            };
            if c.checked_rem(*groups) != Some(0) {
                return Err(format!(
                    "groups {groups} does not divide the {c} input channels"
                ));
            }
            let (size, _) = self.transpose_geometry([h, w])?;
            out[1] = Dim::Known(*out_channels);
            out[2] = Dim::Known(size[0]);
            out[3] = Dim::Known(size[1]);
            if one_d {
                out.remove(2);
            }
            return Ok(vec![TensorType::f32(out)]);
        }
        let win = self.window().ok_or("no window")?;
        out[2] = Dim::Known(win.out_size(h, 0)?);
        out[3] = Dim::Known(win.out_size(w, 1)?);
        if let ConvOp::Conv2d {
            out_channels,
            groups,
            ..
        } = self
        {
            let Some(c) = s[1].known() else {
                return Err(format!(
                    "conv2d needs a known channel count, got {}",
                    show(s)
                ));
            };
            if c.checked_rem(*groups) != Some(0) {
                return Err(format!(
                    "groups {groups} does not divide the {c} input channels"
                ));
            }
            out[1] = Dim::Known(*out_channels);
        }
        if one_d {
            out.remove(2);
        }
        Ok(vec![TensorType::f32(out)])
    }

    /// Batch rule (NCHW): the batch stays on axis 0; pooling also keeps it on the channel
    /// axis 1 (each channel is pooled alone), which conv2d sums over; H and W couple (the
    /// window slides over them, and global_avg_pool averages them).
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let name = self.name();
        if let (ConvOp::Resize(_), Some(b)) = (self, batch[0]) {
            if inputs[0].shape.get(b) != outputs[0].shape.get(b) {
                return Err(format!("{name} resizes axis {b}, the batch axis"));
            }
            return Ok(vec![Some(b)]);
        }
        match (self, batch[0]) {
            (_, None) => Ok(vec![None]),
            (_, Some(0)) => Ok(vec![Some(0)]),
            (ConvOp::Conv2d { .. } | ConvOp::ConvTranspose2d { .. }, Some(1)) => Err(format!(
                "{name} sums over the channel axis 1, the batch axis"
            )),
            (_, Some(1)) => Ok(vec![Some(1)]),
            (ConvOp::GlobalAvgPool, Some(a)) => {
                Err(format!("{name} averages over axis {a}, the batch axis"))
            }
            (_, Some(a)) => Err(format!(
                "{name} slides its window along axis {a}, the batch axis"
            )),
        }
    }

    /// Weights of `conv2d` ([OC, C/groups, kh, kw]) and `conv_transpose2d` ([C,
    /// OC/groups, kh, kw]), without the kh axis on 1-D inputs, and their biases [OC].
    pub fn params(&self, inputs: &[TensorType]) -> Result<Vec<ParamSpec>, String> {
        let (ConvOp::Conv2d {
            window,
            out_channels,
            groups,
            bias,
        }
        | ConvOp::ConvTranspose2d {
            window,
            out_channels,
            groups,
            bias,
            ..
        }) = self
        else {
            return Ok(Vec::new());
        };
        let c = inputs
            .first()
            .and_then(|x| x.shape.get(1))
            .and_then(Dim::known)
            .unwrap_or(1);
        let g = *groups.max(&1);
        let (lead, per_group) = match self {
            ConvOp::ConvTranspose2d { .. } => (c, out_channels / g),
            _ => (*out_channels, c / g),
        };
        let fan_in = per_group
            .checked_mul(window.kernel[0])
            .and_then(|x| x.checked_mul(window.kernel[1]))
            .ok_or_else(|| {
                format!(
                    "{} fan-in of {per_group} channels and kernel {:?} overflows",
                    self.name(),
                    window.kernel
                )
            })?;
        let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
        let mut shape = vec![lead, per_group, window.kernel[0], window.kernel[1]];
        if inputs.first().is_some_and(|x| x.shape.len() == 3) {
            shape.remove(2);
        }
        let mut v = vec![ParamSpec {
            name: "weight",
            shape,
            init: Init::Uniform(bound),
        }];
        if *bias {
            v.push(ParamSpec {
                name: "bias",
                shape: vec![*out_channels],
                init: Init::Uniform(bound),
            });
        }
        Ok(v)
    }

    /// conv_transpose2d's output size on an input of spatial size `hw` and the window
    /// its kernels use: ONNX's full output s·(in − 1) + output_padding + span, less the
    /// pads; with `output_shape`, that size and the pads ONNX derives (total = full −
    /// output_shape, begin = total − ⌊total/2⌋, end = ⌊total/2⌋, a negative end
    /// extending the output with zeros' worth of taps). The window's begin pads say
    /// where each output position reads; its end pads are clamped at 0.
    pub fn transpose_geometry(&self, hw: [usize; 2]) -> Result<([usize; 2], Window), String> {
        let ConvOp::ConvTranspose2d {
            window,
            output_padding,
            output_shape,
            ..
        } = self
        else {
            return Err("internal: not a transposed convolution".into());
        };
        let mut win = window.clone();
        let mut size = [0; 2];
        for a in 0..2 {
            let overflow = || format!("conv_transpose2d: the output along axis {a} overflows");
            let span = (window.kernel[a] - 1)
                .checked_mul(window.dilations[a])
                .and_then(|x| x.checked_add(1))
                .ok_or_else(overflow)?;
            let full = hw[a]
                .saturating_sub(1)
                .checked_mul(window.strides[a])
                .and_then(|x| x.checked_add(output_padding[a]))
                .and_then(|x| x.checked_add(span))
                .ok_or_else(overflow)?;
            match output_shape {
                Some(os) => {
                    let total = i64::try_from(full).map_err(|_| overflow())? - os[a] as i64;
                    let (begin, end) = (total - total.div_euclid(2), total.div_euclid(2));
                    win.pads[a] = usize::try_from(begin).map_err(|_| {
                        format!(
                            "conv_transpose2d: output_shape {os:?} is more than one past the full output along axis {a}"
                        )
                    })?;
                    win.pads[a + 2] = usize::try_from(end.max(0)).map_err(|_| overflow())?;
                    size[a] = os[a];
                }
                None => {
                    size[a] = full
                        .checked_sub(window.pads[a])
                        .and_then(|x| x.checked_sub(window.pads[a + 2]))
                        .filter(|&x| x > 0)
                        .ok_or_else(|| {
                            format!(
                                "conv_transpose2d: pads {:?} leave no output along axis {a} (full size {full})",
                                window.pads
                            )
                        })?;
                }
            }
        }
        Ok((size, win))
    }

    /// Multiply-adds of a convolution, counted as 2 FLOPs (saturating: a cost, never a
    /// size).
    pub fn flops(&self, inputs: &[Vec<usize>], outputs: &[Vec<usize>]) -> u64 {
        let out = outputs.first().map_or(0, |o| product(o));
        let x = inputs.first().map(Vec::as_slice).unwrap_or_default();
        let window = |w: &Window| widen(w.kernel[0]).saturating_mul(widen(w.kernel[1]));
        match self {
            ConvOp::Conv2d {
                window: w, groups, ..
            } => {
                let c = x.get(1).copied().unwrap_or(1) / (*groups).max(1);
                2u64.saturating_mul(out)
                    .saturating_mul(widen(c))
                    .saturating_mul(window(w))
            }
            ConvOp::ConvTranspose2d {
                window: w,
                out_channels,
                groups,
                ..
            } => 2u64
                .saturating_mul(product(x))
                .saturating_mul(widen(out_channels / (*groups).max(1)))
                .saturating_mul(window(w)),
            ConvOp::GlobalAvgPool => product(x),
            ConvOp::Resize(_) => out.saturating_mul(4),
            ConvOp::MaxPool(w) | ConvOp::AvgPool { window: w, .. } => out.saturating_mul(window(w)),
        }
    }
}

/// A 3-D shape [N, C, L] as the 4-D [N, C, 1, L] the kernels compute on; other shapes
/// unchanged.
pub fn as_2d<D: Clone>(shape: &[D], one: D) -> Vec<D> {
    let mut s = shape.to_vec();
    if s.len() == 3 {
        s.insert(2, one);
    }
    s
}

impl Window {
    /// Whether the window is one-dimensional: a window of 1 along H with no stride,
    /// dilation or padding there.
    pub fn is_1d(&self) -> bool {
        self.kernel[0] == 1
            && self.strides[0] == 1
            && self.dilations[0] == 1
            && self.pads[0] == 0
            && self.pads[2] == 0
    }

    /// The window as attributes (`ceil_mode` only when `ceil`, as the operator reads it).
    fn attrs(&self, ceil: bool) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("kernel_size".into(), json!(self.kernel));
        m.insert("strides".into(), json!(self.strides));
        m.insert("pads".into(), json!(self.pads));
        m.insert("dilations".into(), json!(self.dilations));
        if ceil {
            m.insert("ceil_mode".into(), json!(self.ceil_mode));
        }
        m
    }
}

impl ConvOp {
    /// Gradient rule: conv2d's dx is `conv2d_grad_input` (dy back through the weight),
    /// its weight gradient `conv2d_grad_filter` and its bias gradient dy summed over N, H
    /// and W; the windowed poolings have `max_pool2d_grad` and `avg_pool2d_grad`;
    /// global_avg_pool spreads dy / (H·W) over the window. conv_transpose2d: dx is
    /// `conv_transpose2d_grad_input` (conv2d of dy with the weight), the weight's
    /// gradient `conv2d_grad_filter` of dy against x, the bias's dy summed. 1-D operators use the same
    /// backwards on [N, C, 1, L] views of x and dy (and the weight [OC, C/groups, 1, k]).
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        if let ConvOp::Resize(r) = self {
            return r.grad(g);
        }
        let dy = g.dy()?;
        let x = g.input(0)?;
        let xs = g.shape(&x)?;
        if let ConvOp::GlobalAvgPool = self {
            if !g.needs(0) {
                return Ok(());
            }
            let area = xs
                .get(2..)
                .unwrap_or_default()
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| format!("the window of {xs:?} overflows"))?;
            let d = g.scale(&dy, 1.0 / area.max(1) as f32)?;
            let dx = g.expand(&d, &xs)?;
            return g.input_grad(0, dx);
        }
        // 1-D: the backward operators run on the [N, C, 1, L] views.
        let x4 = g.reshape(&x, &as_2d(&xs, 1))?;
        let dys = g.shape(&dy)?;
        let dy4 = g.reshape(&dy, &as_2d(&dys, 1))?;
        let (x, dy) = (x4.as_str(), dy4.as_str());
        match self {
            ConvOp::Conv2d {
                window,
                groups,
                bias,
                ..
            } => {
                let mut attrs = window.attrs(false);
                attrs.insert("groups".into(), json!(groups));
                let attrs = serde_json::Value::Object(attrs);
                if g.needs(0) {
                    let w = g.param("weight")?;
                    let ws = g.shape(&w)?;
                    let w4 = g.reshape(&w, &as_2d(&ws, 1))?;
                    let dx = g.emit("conv2d_grad_input", attrs.clone(), &[x, &w4, dy])?;
                    let dx = g.reshape(&dx, &xs)?;
                    g.input_grad(0, dx)?;
                }
                let dw = g.emit("conv2d_grad_filter", attrs, &[x, dy])?;
                let mut ws = g.shape(&dw)?;
                if xs.len() == 3 {
                    ws.remove(2);
                }
                let dw = g.reshape(&dw, &ws)?;
                g.param_grad("weight", dw)?;
                if *bias {
                    let db = g.sum(dy, &[0, 2, 3], false)?;
                    g.param_grad("bias", db)?;
                }
                Ok(())
            }
            ConvOp::ConvTranspose2d { groups, bias, .. } => {
                let xs4 = g.shape(x)?;
                let (_, window) = self.transpose_geometry([xs4[2], xs4[3]])?;
                let mut attrs = window.attrs(false);
                attrs.insert("groups".into(), json!(groups));
                let attrs = serde_json::Value::Object(attrs);
                if g.needs(0) {
                    let w = g.param("weight")?;
                    let ws = g.shape(&w)?;
                    let w4 = g.reshape(&w, &as_2d(&ws, 1))?;
                    let dx = g.emit("conv_transpose2d_grad_input", attrs.clone(), &[x, &w4, dy])?;
                    let dx = g.reshape(&dx, &xs)?;
                    g.input_grad(0, dx)?;
                }
                // The weight's gradient is conv2d's with the roles of x and dy swapped:
                // conv2d over dy (C_out channels) with this window gives x's positions.
                let dw = g.emit("conv2d_grad_filter", attrs, &[dy, x])?;
                let mut ws = g.shape(&dw)?;
                if xs.len() == 3 {
                    ws.remove(2);
                }
                let dw = g.reshape(&dw, &ws)?;
                g.param_grad("weight", dw)?;
                if *bias {
                    let db = g.sum(dy, &[0, 2, 3], false)?;
                    g.param_grad("bias", db)?;
                }
                Ok(())
            }
            _ if !g.needs(0) => Ok(()),
            ConvOp::MaxPool(window) => {
                let attrs = serde_json::Value::Object(window.attrs(true));
                let dx = g.emit("max_pool2d_grad", attrs, &[x, dy])?;
                let dx = g.reshape(&dx, &xs)?;
                g.input_grad(0, dx)
            }
            ConvOp::AvgPool {
                window,
                count_include_pad,
            } => {
                let mut attrs = window.attrs(true);
                attrs.insert("count_include_pad".into(), json!(count_include_pad));
                let attrs = serde_json::Value::Object(attrs);
                let dx = g.emit("avg_pool2d_grad", attrs, &[x, dy])?;
                let dx = g.reshape(&dx, &xs)?;
                g.input_grad(0, dx)
            }
            ConvOp::GlobalAvgPool | ConvOp::Resize(_) => Err("internal: handled above".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{couples, rule};
    use serde_json::json;

    #[test]
    fn windows_and_padding_that_overflow_are_errors() {
        let w = Window {
            kernel: [MAX_WINDOW, 3],
            strides: [1, 1],
            pads: [usize::MAX, 0, usize::MAX, 0],
            dilations: [MAX_WINDOW, 1],
            ceil_mode: true,
        };
        assert!(w.out_size(8, 0).is_err());
        let op = ConvOp::MaxPool(w);
        assert!(op.validate().is_err());
        let x = TensorType::f32(vec![
            Dim::Known(1),
            Dim::Known(1),
            Dim::Known(8),
            Dim::Known(8),
        ]);
        assert!(op.infer(std::slice::from_ref(&x)).is_err());
        // Groups of 0 arriving in a plan are refused, not divided by.
        let conv = ConvOp::Conv2d {
            window: Window {
                kernel: [1, 1],
                strides: [1, 1],
                pads: [0; 4],
                dilations: [1, 1],
                ceil_mode: false,
            },
            out_channels: 2,
            groups: 0,
            bias: true,
        };
        assert!(conv.validate().is_err());
        assert!(conv.infer(&[x]).is_err());
        // Pads past the window limit are refused at parse.
        let attrs = json!({ "out_channels": 1, "kernel_size": [1, 1], "pads": [1u64 << 40, 0] });
        assert!(crate::ops::parse("conv2d", attrs.as_object().unwrap()).is_err());
    }

    #[test]
    fn one_dimensional_windows_take_three_dimensional_inputs() {
        let parse =
            |op: &str, attrs: serde_json::Value| crate::ops::parse(op, attrs.as_object().unwrap());
        let x = |text: &str| crate::ops::testing::tensor(text);
        let conv = parse(
            "conv2d",
            json!({ "out_channels": 4, "kernel_size": [3], "strides": [2], "pads": [1, 2] }),
        )
        .unwrap();
        // (10 + 1 + 2 - 3) / 2 + 1 = 6.
        let y = conv.infer(&[x("N,3,10")]).unwrap();
        assert_eq!(show(&y[0].shape), "[N, 4, 6]");
        let w = conv.params(&[x("N,3,10")]).unwrap();
        assert_eq!(w[0].shape, vec![4, 3, 3]);
        // The same window on [N, C, 1, L] gives the 4-D weight.
        assert_eq!(
            conv.params(&[x("N,3,1,10")]).unwrap()[0].shape,
            vec![4, 3, 1, 3]
        );
        // A 2-D window refuses a 3-D input; 1-D lists must all have one entry.
        let pool = parse("max_pool2d", json!({ "kernel_size": [2, 2] })).unwrap();
        assert!(pool
            .infer(&[x("1,3,10")])
            .unwrap_err()
            .contains("1-D window"));
        let e = parse(
            "max_pool2d",
            json!({ "kernel_size": [2], "strides": [1, 2] }),
        );
        assert_eq!(e.unwrap_err()[0].0, "strides");
        let e = parse(
            "avg_pool2d",
            json!({ "kernel_size": [2], "pads": [1, 1, 1, 1] }),
        );
        assert_eq!(e.unwrap_err()[0].0, "pads");
        let g = parse("global_avg_pool", json!({})).unwrap();
        assert_eq!(
            show(&g.infer(&[x("N,3,5,6,7")]).unwrap()[0].shape),
            "[N, 3, 1, 1, 1]"
        );
        assert!(g.infer(&[x("N,3")]).is_err());
        couples(
            rule(
                "max_pool2d",
                json!({ "kernel_size": [3] }),
                &[("4,3,9", Some(2))],
            ),
            &["max_pool2d slides its window along axis 2"],
        );
    }

    #[test]
    fn resize_plans_on_hand_checked_numbers() {
        let plan = |attrs: serde_json::Value, dims: &[usize]| {
            let Ok(crate::ops::Op::Conv(ConvOp::Resize(r))) =
                crate::ops::parse("resize", attrs.as_object().unwrap())
            else {
                panic!("resize parses");
            };
            r.plan(dims).unwrap()
        };
        // Linear ×2, half_pixel: output 1 sits at input 0.25; output 0 clamps to 0.
        let (out, taps) = plan(json!({ "scales": [2.0], "mode": "linear" }), &[3]);
        assert_eq!(out, vec![6]);
        assert_eq!(taps[0][0], (0, 1, 0.0));
        assert_eq!(taps[0][1], (0, 1, 0.25));
        assert_eq!(taps[0][5], (2, 2, 0.0));
        // Nearest ×3, asymmetric, floor: 0, 0, 0, 1, 1, 1.
        let attrs = json!({ "sizes": [6], "coordinate_transformation_mode": "asymmetric",
                            "nearest_mode": "floor" });
        let (_, taps) = plan(attrs, &[2]);
        let picks: Vec<usize> = taps[0].iter().map(|t| t.0).collect();
        assert_eq!(picks, vec![0, 0, 0, 1, 1, 1]);
        // not_larger keeps the aspect ratio: [4, 6] into at most [2, 6] is [2, 3].
        let attrs = json!({ "sizes": [2, 6], "keep_aspect_ratio_policy": "not_larger" });
        assert_eq!(plan(attrs, &[4, 6]).0, vec![2, 3]);
        // Refused: both or neither of scales and sizes, cubic, antialias.
        for (attrs, name) in [
            (json!({ "scales": [2.0], "sizes": [3] }), "scales"),
            (json!({}), "scales"),
            (json!({ "scales": [2.0], "mode": "cubic" }), "mode"),
            (json!({ "scales": [2.0], "antialias": 1 }), "antialias"),
        ] {
            let e = crate::ops::parse("resize", attrs.as_object().unwrap()).unwrap_err();
            assert_eq!(e[0].0, name);
        }
        couples(
            rule(
                "resize",
                json!({ "scales": [2.0, 1.0] }),
                &[("4,3", Some(0))],
            ),
            &["resize resizes axis 0, the batch axis"],
        );
        assert_eq!(
            rule(
                "resize",
                json!({ "scales": [2.0], "axes": [1] }),
                &[("4,3", Some(0))]
            ),
            Ok(vec![Some(0)])
        );
    }

    #[test]
    fn conv_and_pooling_keep_the_sample_axis() {
        let conv = json!({ "out_channels": 2, "kernel_size": [3, 3] });
        assert_eq!(
            rule("conv2d", conv.clone(), &[("N,3,8,8", Some(0))]),
            Ok(vec![Some(0)])
        );
        couples(
            rule("conv2d", conv, &[("4,3,8,8", Some(1))]),
            &["conv2d", "channel axis 1, the batch axis"],
        );
        let pool = json!({ "kernel_size": [2, 2], "strides": [2, 2] });
        assert_eq!(
            rule("max_pool2d", pool.clone(), &[("4,N,8,8", Some(1))]),
            Ok(vec![Some(1)])
        );
        couples(
            rule("avg_pool2d", pool, &[("4,3,8,8", Some(2))]),
            &["avg_pool2d slides its window along axis 2"],
        );
        assert_eq!(
            rule("global_avg_pool", json!({}), &[("N,3,8,8", Some(0))]),
            Ok(vec![Some(0)])
        );
        couples(
            rule("global_avg_pool", json!({}), &[("4,3,N,8", Some(2))]),
            &["global_avg_pool averages over axis 2, the batch axis"],
        );
    }
}
