//! Movement (reindex) family: operators where each output element is one input element.
//! Views (`reshape`, `flatten`, `squeeze`, `unsqueeze`, `identity`, `dropout`) alias their
//! input's buffer; `transpose`, `slice`, `expand`, `concat`, `split`, `depth_to_space` and
//! `space_to_depth` are strided copies, `gather` an indexed copy and `pad` a copy whose
//! outside elements are a constant or reflect, repeat or wrap the input's
//! (`shaders/movement.wgsl`).

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec, MAX_SIZE};
use super::backward::GradContext;
use super::{broadcast_batch, Arity, Capabilities, IndexInput, OpSchema, TensorType};
use crate::dtype::DType;
use crate::shape::{self, broadcast, show, Dim, Product, Shape};
use serde_json::json;

/// Family tag.
pub const FAMILY: &str = "movement";

const fn one(name: &'static str, doc: &'static str, attrs: &'static [AttrSpec]) -> OpSchema {
    OpSchema {
        name,
        family: FAMILY,
        doc,
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs,
        params: &[],
    }
}

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    one(
        "reshape",
        "Same elements, new shape; 0 copies the input dimension, -1 is inferred.",
        &[
            required("shape", AttrKind::Ints, "Target shape."),
            optional(
                "allowzero",
                AttrKind::Bool,
                "false",
                "Treat 0 as a real zero size.",
            ),
        ],
    ),
    one(
        "flatten",
        "Flattens to 2-D: [prod(dims before axis), prod(dims from axis)].",
        &[optional(
            "axis",
            AttrKind::Int,
            "1",
            "First axis of the second dimension.",
        )],
    ),
    one(
        "squeeze",
        "Removes axes of size 1.",
        &[optional(
            "axes",
            AttrKind::Ints,
            "null",
            "Axes to remove (all of size 1 when absent).",
        )],
    ),
    one(
        "unsqueeze",
        "Inserts axes of size 1.",
        &[required(
            "axes",
            AttrKind::Ints,
            "Positions of the new axes in the output.",
        )],
    ),
    one("identity", "Passes its input through.", &[]),
    one(
        "dropout",
        "Identity at inference.",
        &[optional(
            "ratio",
            AttrKind::Float,
            "0.5",
            "Drop probability in training (unused at inference).",
        )],
    ),
    one(
        "transpose",
        "Permutes axes.",
        &[optional(
            "perm",
            AttrKind::Ints,
            "null",
            "Output axis i is input axis perm[i] (reversed when absent).",
        )],
    ),
    OpSchema {
        name: "concat",
        family: FAMILY,
        doc: "Joins inputs along an axis.",
        inputs: Arity::Variadic(1),
        outputs: &["y"],
        attrs: &[required("axis", AttrKind::Int, "Axis to join along.")],
        params: &[],
    },
    OpSchema {
        name: "split",
        family: FAMILY,
        doc: "Splits along an axis into parts (outputs `node:0`, `node:1`, ...).",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["parts"],
        attrs: &[
            optional("axis", AttrKind::Int, "0", "Axis to split."),
            optional("sizes", AttrKind::Ints, "null", "Size of each part."),
            optional(
                "num_outputs",
                AttrKind::Int,
                "null",
                "Number of equal parts (last may be smaller).",
            ),
        ],
        params: &[],
    },
    one(
        "slice",
        "Takes start:end:step along axes (negative values count from the end).",
        &[
            required("starts", AttrKind::Ints, "Start per axis."),
            required("ends", AttrKind::Ints, "End (exclusive) per axis, clamped."),
            optional("axes", AttrKind::Ints, "null", "Axes (0.. when absent)."),
            optional(
                "steps",
                AttrKind::Ints,
                "null",
                "Steps (1 when absent; negative reverses).",
            ),
        ],
    ),
    one(
        "expand",
        "Broadcasts to a shape (numpy rules, both ways).",
        &[required("shape", AttrKind::Ints, "Target shape.")],
    ),
    one(
        "pad",
        "Pads (or, with negative pads, crops) axes: a constant, the mirror image without the edge (reflect), the edge repeated or the other end (wrap).",
        &[
            required(
                "pads",
                AttrKind::Ints,
                "All begins then all ends (ONNX layout), one pair per axis of `axes`.",
            ),
            optional(
                "mode",
                AttrKind::Choice(&["constant", "reflect", "edge", "wrap"]),
                "\"constant\"",
                "What the padding holds.",
            ),
            optional(
                "constant_value",
                AttrKind::Float,
                "0",
                "The padding in constant mode (truncated for i32 inputs).",
            ),
            optional(
                "axes",
                AttrKind::Ints,
                "null",
                "Padded axes (negative count from the end); every axis when absent.",
            ),
        ],
    ),
    one(
        "depth_to_space",
        "Moves blocks of channels into space: [N, C, H, W] → [N, C/b², H·b, W·b].",
        &[
            required("blocksize", AttrKind::Int, "Block size b."),
            optional(
                "mode",
                AttrKind::Choice(&["DCR", "CRD"]),
                "\"DCR\"",
                "Channel order: depth-column-row or column-row-depth.",
            ),
        ],
    ),
    one(
        "space_to_depth",
        "Moves b×b blocks of space into channels: [N, C, H, W] → [N, C·b², H/b, W/b].",
        &[
            required("blocksize", AttrKind::Int, "Block size b."),
            optional(
                "mode",
                AttrKind::Choice(&["DCR", "CRD"]),
                "\"DCR\"",
                "Channel order (the inverse of depth_to_space's with the same mode).",
            ),
        ],
    ),
    OpSchema {
        name: "gather",
        family: FAMILY,
        doc: "Takes entries of x at i32 indices along an axis.",
        inputs: Arity::Fixed(&["x", "indices"]),
        outputs: &["y"],
        attrs: &[optional("axis", AttrKind::Int, "0", "Axis indexed.")],
        params: &[],
    },
];

/// Most parts a split may have.
pub const MAX_SPLIT_PARTS: usize = 1024;

/// A parsed movement operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum MovementOp {
    /// reshape
    Reshape {
        /// Target shape with 0 and -1 markers.
        shape: Vec<i64>,
        /// 0 is a real size.
        allowzero: bool,
    },
    /// flatten
    Flatten {
        /// Split axis.
        axis: i64,
    },
    /// squeeze
    Squeeze {
        /// Axes or all size-1.
        axes: Option<Vec<i64>>,
    },
    /// unsqueeze
    Unsqueeze {
        /// Output positions.
        axes: Vec<i64>,
    },
    /// identity (and dropout, the identity at inference, when `dropout` is set).
    Identity {
        /// Written as `dropout` in the file, with this drop probability in training.
        dropout: Option<f32>,
    },
    /// transpose
    Transpose {
        /// Permutation.
        perm: Option<Vec<i64>>,
    },
    /// concat
    Concat {
        /// Axis.
        axis: i64,
    },
    /// split
    Split {
        /// Axis.
        axis: i64,
        /// Explicit part sizes, or `parts` equal ones.
        sizes: Option<Vec<i64>>,
        /// Number of parts.
        parts: usize,
    },
    /// slice
    Slice {
        /// Starts.
        starts: Vec<i64>,
        /// Ends.
        ends: Vec<i64>,
        /// Axes.
        axes: Option<Vec<i64>>,
        /// Steps.
        steps: Option<Vec<i64>>,
    },
    /// expand
    Expand {
        /// Target shape.
        shape: Vec<i64>,
    },
    /// gather
    Gather {
        /// Axis.
        axis: i64,
    },
    /// pad
    Pad {
        /// Begins then ends, one pair per padded axis.
        pads: Vec<i64>,
        /// What the padding holds.
        mode: PadMode,
        /// The padding in constant mode.
        constant_value: f32,
        /// Padded axes (all when absent).
        axes: Option<Vec<i64>>,
    },
    /// depth_to_space (`to_space`) or space_to_depth.
    Blocks {
        /// depth_to_space.
        to_space: bool,
        /// Block size.
        blocksize: usize,
        /// Column-row-depth channel order (false: depth-column-row).
        crd: bool,
    },
}

/// What `pad` puts outside the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PadMode {
    /// A constant.
    Constant,
    /// The input mirrored about its first and last elements (not repeating them).
    Reflect,
    /// The first and last elements repeated.
    Edge,
    /// The input repeated (the other end continues).
    Wrap,
}

impl PadMode {
    /// The mode's number in kernels' info words.
    pub fn code(self) -> u32 {
        match self {
            PadMode::Constant => 0,
            PadMode::Reflect => 1,
            PadMode::Edge => 2,
            PadMode::Wrap => 3,
        }
    }

    /// The input position that output position `p` (in input coordinates: output index
    /// minus the leading pad) reads along an axis of length `len`; `None` for the
    /// constant.
    pub fn source(self, p: i64, len: i64) -> Option<i64> {
        if (0..len).contains(&p) {
            return Some(p);
        }
        match self {
            PadMode::Constant => None,
            _ if len <= 0 => None,
            PadMode::Edge => Some(p.clamp(0, len - 1)),
            PadMode::Wrap => Some(p.rem_euclid(len)),
            PadMode::Reflect if len == 1 => Some(0),
            PadMode::Reflect => {
                let period = 2 * (len - 1);
                let q = p.rem_euclid(period);
                Some(if q >= len { period - q } else { q })
            }
        }
    }
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<MovementOp> {
    Some(match name {
        "reshape" => MovementOp::Reshape {
            shape: r.ints("shape"),
            allowzero: r.bool("allowzero"),
        },
        "flatten" => MovementOp::Flatten {
            axis: r.int("axis"),
        },
        "squeeze" => MovementOp::Squeeze {
            axes: r.opt_ints("axes"),
        },
        "unsqueeze" => MovementOp::Unsqueeze {
            axes: r.ints("axes"),
        },
        "identity" => MovementOp::Identity { dropout: None },
        "dropout" => {
            let ratio = r.float("ratio");
            if !(0.0..1.0).contains(&ratio) {
                r.reject("ratio", format!("ratio must be in [0, 1), got {ratio}"));
            }
            MovementOp::Identity {
                dropout: Some(ratio),
            }
        }
        "transpose" => MovementOp::Transpose {
            perm: r.opt_ints("perm"),
        },
        "concat" => MovementOp::Concat {
            axis: r.int("axis"),
        },
        "split" => {
            let axis = r.int("axis");
            let sizes = r.opt_ints("sizes");
            let num = r.opt_int("num_outputs");
            let parts = match (&sizes, num) {
                (Some(s), None)
                    if !s.is_empty() && s.len() <= MAX_SPLIT_PARTS && s.iter().all(|&x| x >= 0) =>
                {
                    s.len()
                }
                (None, Some(n)) if (1..=MAX_SPLIT_PARTS as i64).contains(&n) => n as usize,
                (Some(_), Some(_)) => {
                    r.reject("sizes", "give either sizes or num_outputs, not both");
                    1
                }
                (None, None) => {
                    r.reject("sizes", "split needs sizes or num_outputs");
                    1
                }
                (Some(_), None) => {
                    r.reject(
                        "sizes",
                        "sizes must be a non-empty list of non-negative integers",
                    );
                    1
                }
                (None, Some(n)) => {
                    r.reject(
                        "num_outputs",
                        format!("num_outputs must be in 1..=1024, got {n}"),
                    );
                    1
                }
            };
            MovementOp::Split { axis, sizes, parts }
        }
        "slice" => MovementOp::Slice {
            starts: r.ints("starts"),
            ends: r.ints("ends"),
            axes: r.opt_ints("axes"),
            steps: r.opt_ints("steps"),
        },
        "expand" => MovementOp::Expand {
            shape: r.ints("shape"),
        },
        "gather" => MovementOp::Gather {
            axis: r.int("axis"),
        },
        "pad" => {
            let pads = r.ints("pads");
            if let Some(bad) = pads.iter().find(|p| p.unsigned_abs() > MAX_SIZE as u64) {
                r.reject(
                    "pads",
                    format!("pads must be within ±{MAX_SIZE}, got {bad}"),
                );
            }
            let mode = match r.choice("mode").as_str() {
                "reflect" => PadMode::Reflect,
                "edge" => PadMode::Edge,
                "wrap" => PadMode::Wrap,
                _ => PadMode::Constant,
            };
            let axes = r.opt_ints("axes");
            let pairs = axes.as_ref().map(Vec::len);
            if !pads.len().is_multiple_of(2) || pairs.is_some_and(|n| n * 2 != pads.len()) {
                r.reject(
                    "pads",
                    format!(
                        "pads must hold a begin and an end for each padded axis{}, got {} values",
                        pairs.map_or(String::new(), |n| format!(" ({n} axes)")),
                        pads.len()
                    ),
                );
            }
            MovementOp::Pad {
                pads,
                mode,
                constant_value: r.float("constant_value"),
                axes,
            }
        }
        "depth_to_space" | "space_to_depth" => MovementOp::Blocks {
            to_space: name == "depth_to_space",
            blocksize: r.size("blocksize", 1),
            crd: r.choice("mode") == "CRD",
        },
        _ => return None,
    })
}

/// One sliced axis: (axis, start, step, output length); `start` is clamped into the axis.
pub type SliceAxis = (usize, usize, i64, usize);

impl MovementOp {
    /// Reshapes and identities are views of their input; the rest copy.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            view: matches!(
                self,
                MovementOp::Reshape { .. }
                    | MovementOp::Flatten { .. }
                    | MovementOp::Squeeze { .. }
                    | MovementOp::Unsqueeze { .. }
                    | MovementOp::Identity { .. }
            ),
            ..Capabilities::default()
        }
    }

    /// `gather` reads input 1 as indices into input 0.
    pub fn index_input(&self) -> Option<IndexInput> {
        match self {
            MovementOp::Gather { axis } => Some(IndexInput {
                indices: 1,
                data: 0,
                axis: *axis,
                non_negative: false,
            }),
            _ => None,
        }
    }

    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self {
            MovementOp::Reshape { .. } => "reshape",
            MovementOp::Flatten { .. } => "flatten",
            MovementOp::Squeeze { .. } => "squeeze",
            MovementOp::Unsqueeze { .. } => "unsqueeze",
            MovementOp::Identity { dropout: None } => "identity",
            MovementOp::Identity { dropout: Some(_) } => "dropout",
            MovementOp::Transpose { .. } => "transpose",
            MovementOp::Concat { .. } => "concat",
            MovementOp::Split { .. } => "split",
            MovementOp::Slice { .. } => "slice",
            MovementOp::Expand { .. } => "expand",
            MovementOp::Gather { .. } => "gather",
            MovementOp::Pad { .. } => "pad",
            MovementOp::Blocks { to_space: true, .. } => "depth_to_space",
            MovementOp::Blocks {
                to_space: false, ..
            } => "space_to_depth",
        }
    }

    /// Number of outputs.
    pub fn num_outputs(&self) -> usize {
        match self {
            MovementOp::Split { parts, .. } => *parts,
            _ => 1,
        }
    }

    /// Output types.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let x = &inputs[0];
        let dims = &x.shape;
        let same = |shape: Shape| {
            Ok(vec![TensorType {
                shape,
                dtype: x.dtype,
            }])
        };
        match self {
            MovementOp::Reshape { shape, allowzero } => {
                same(reshape_target(dims, shape, *allowzero)?)
            }
            MovementOp::Flatten { axis } => {
                let r = dims.len() as i64;
                if *axis < -r || *axis > r {
                    return Err(format!("axis {axis} is out of range for rank {r}"));
                }
                let a = if *axis < 0 { axis + r } else { *axis } as usize;
                let p = |d: &[Dim]| Product::of(d).map(|p| p.to_dim()).ok_or("size overflows");
                same(vec![p(&dims[..a])?, p(&dims[a..])?])
            }
            MovementOp::Squeeze { axes } => {
                let remove: Vec<usize> = match axes {
                    None => (0..dims.len())
                        .filter(|&i| dims[i] == Dim::Known(1))
                        .collect(),
                    Some(list) => {
                        let mut v = Vec::new();
                        for &a in list {
                            let i = shape::existing_axis(a, dims.len())?;
                            if dims[i] != Dim::Known(1) {
                                return Err(format!(
                                    "cannot squeeze axis {a} of size {} in {}",
                                    dims[i],
                                    show(dims)
                                ));
                            }
                            v.push(i);
                        }
                        v
                    }
                };
                same(
                    dims.iter()
                        .enumerate()
                        .filter(|(i, _)| !remove.contains(i))
                        .map(|(_, d)| d.clone())
                        .collect(),
                )
            }
            MovementOp::Unsqueeze { axes } => {
                let rank = dims.len() + axes.len();
                let mut at = Vec::new();
                for &a in axes {
                    let i = shape::axis(a, rank)?;
                    if at.contains(&i) {
                        return Err(format!("axes {axes:?} repeat axis {a}"));
                    }
                    at.push(i);
                }
                let mut rest = dims.iter();
                same(
                    (0..rank)
                        .map(|i| {
                            if at.contains(&i) {
                                Dim::Known(1)
                            } else {
                                rest.next().cloned().unwrap_or(Dim::Known(1))
                            }
                        })
                        .collect(),
                )
            }
            MovementOp::Identity { .. } => same(dims.clone()),
            MovementOp::Transpose { perm } => {
                let p = permutation(perm, dims.len())?;
                same(p.iter().map(|&i| dims[i].clone()).collect())
            }
            MovementOp::Concat { axis } => {
                let a = shape::existing_axis(*axis, dims.len())?;
                let mut total = 0usize;
                for (k, t) in inputs.iter().enumerate() {
                    if t.dtype != x.dtype {
                        return Err(format!(
                            "input {k} is {} but input 0 is {}",
                            t.dtype, x.dtype
                        ));
                    }
                    if t.shape.len() != dims.len()
                        || t.shape
                            .iter()
                            .zip(dims)
                            .enumerate()
                            .any(|(i, (u, v))| i != a && u != v)
                    {
                        return Err(format!(
                            "input {k} has shape {} but input 0 has {}: all dimensions except axis {a} must match",
                            show(&t.shape),
                            show(dims)
                        ));
                    }
                    let p = Product::of(&t.shape[a..a + 1]).ok_or("overflow")?;
                    if !p.syms.is_empty() {
                        return Err(format!(
                            "concat along symbolic dimension {} is not supported",
                            t.shape[a]
                        ));
                    }
                    total = total.checked_add(p.coeff).ok_or_else(|| {
                        format!("concat along axis {a}: the total length overflows")
                    })?;
                }
                let mut out = dims.clone();
                out[a] = Dim::Known(total);
                same(out)
            }
            MovementOp::Split { axis, .. } => {
                let a = shape::existing_axis(*axis, dims.len())?;
                let Some(len) = dims[a].known() else {
                    return Err(format!(
                        "split along symbolic dimension {} is not supported",
                        dims[a]
                    ));
                };
                let sizes = self.split_sizes(len)?;
                Ok(sizes
                    .into_iter()
                    .map(|s| {
                        let mut d = dims.clone();
                        d[a] = Dim::Known(s);
                        TensorType {
                            shape: d,
                            dtype: x.dtype,
                        }
                    })
                    .collect())
            }
            MovementOp::Slice { .. } => {
                let mut out = dims.clone();
                for (a, _, _, len) in self.slice_axes(dims)? {
                    out[a] = Dim::Known(len);
                }
                same(out)
            }
            MovementOp::Expand { shape } => {
                let target: Vec<Dim> = shape
                    .iter()
                    .map(|&d| {
                        usize::try_from(d)
                            .map(Dim::Known)
                            .map_err(|_| format!("expand shape {shape:?} has a negative size"))
                    })
                    .collect::<Result<_, _>>()?;
                same(broadcast(dims, &target).map_err(|e| format!("cannot expand: {e}"))?)
            }
            MovementOp::Gather { axis } => {
                let idx = &inputs[1];
                if idx.dtype != DType::I32 {
                    return Err(format!("gather indices must be i32, got {idx}"));
                }
                let a = shape::existing_axis(*axis, dims.len())?;
                let mut out: Shape = dims[..a].to_vec();
                out.extend(idx.shape.iter().cloned());
                out.extend(dims[a + 1..].iter().cloned());
                same(out)
            }
            MovementOp::Pad { mode, .. } => {
                if !matches!(x.dtype, DType::F32 | DType::I32) {
                    return Err(format!("pad needs an f32 or i32 input, got {x}"));
                }
                let mut out = dims.clone();
                for (a, (begin, end)) in self.pad_pairs(dims.len())?.into_iter().enumerate() {
                    if begin == 0 && end == 0 {
                        continue;
                    }
                    let Some(len) = dims[a].known() else {
                        return Err(format!(
                            "pad needs a known size on padded axis {a}, got {}",
                            show(dims)
                        ));
                    };
                    if len == 0 && *mode != PadMode::Constant {
                        return Err(format!(
                            "pad cannot take {mode:?} padding from the empty axis {a}"
                        ));
                    }
                    let size = i64::try_from(len)
                        .ok()
                        .and_then(|l| l.checked_add(begin)?.checked_add(end))
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| {
                            format!("pads {begin}, {end} leave axis {a} of size {len} with a negative size")
                        })?;
                    out[a] = Dim::Known(size);
                }
                same(out)
            }
            MovementOp::Blocks { to_space, .. } => {
                let (d, _) = self.block_view(dims)?;
                let chw = if *to_space {
                    [d[1], d[2] * d[3], d[4] * d[5]]
                } else {
                    [d[1] * d[2] * d[3], d[4], d[5]]
                };
                let mut out = dims.clone();
                for (k, size) in chw.into_iter().enumerate() {
                    out[k + 1] = Dim::Known(size);
                }
                same(out)
            }
        }
    }

    /// `pad`'s (begin, end) for every axis of a rank (0, 0 for axes not padded); an error
    /// for an axis out of range or repeated.
    pub fn pad_pairs(&self, rank: usize) -> Result<Vec<(i64, i64)>, String> {
        let MovementOp::Pad { pads, axes, .. } = self else {
            return Err("internal: not a pad".into());
        };
        let axes: Vec<usize> = match axes {
            Some(list) => list
                .iter()
                .map(|&a| shape::existing_axis(a, rank))
                .collect::<Result<_, _>>()?,
            None => (0..rank).collect(),
        };
        if pads.len() != 2 * axes.len() {
            return Err(format!(
                "pad has {} pads for {} axes: a begin and an end each",
                pads.len(),
                axes.len()
            ));
        }
        let mut pairs = vec![(0, 0); rank];
        let mut seen = vec![false; rank];
        for (k, &a) in axes.iter().enumerate() {
            if std::mem::replace(&mut seen[a], true) {
                return Err(format!("pad axes repeat axis {a}"));
            }
            pairs[a] = (pads[k], pads[k + axes.len()]);
        }
        Ok(pairs)
    }

    /// `depth_to_space` and `space_to_depth` as a strided copy: the output viewed as six
    /// axes (the copy's domain, row-major like the output) and the input strides along
    /// them. depth_to_space reads x as [N, b, b, C', H, W] (DCR) or [N, C', b, b, H, W]
    /// (CRD) into [N, C', H, b, W, b]; space_to_depth reads x as [N, C, H', b, W', b] into
    /// [N, b, b, C, H', W'] (DCR) or [N, C, b, b, H', W'] (CRD). Needs known C (H and W
    /// for space_to_depth) divisible by the block; N may be symbolic (counted as 1 here).
    pub fn block_view(&self, dims: &[Dim]) -> Result<(Vec<usize>, Vec<usize>), String> {
        let MovementOp::Blocks {
            to_space,
            blocksize: b,
            crd,
        } = *self
        else {
            return Err("internal: not a block rearrangement".into());
        };
        let name = self.name();
        if dims.len() != 4 {
            return Err(format!("{name} needs [N, C, H, W], got {}", show(dims)));
        }
        let known = |k: usize| {
            dims[k]
                .known()
                .ok_or_else(|| format!("{name} needs known C, H and W, got {}", show(dims)))
        };
        let n = dims[0].known().unwrap_or(1);
        let (c, h, w) = (known(1)?, known(2)?, known(3)?);
        let bb = b.checked_mul(b).ok_or("blocksize overflows")?;
        // The input as six axes and the permutation taking it to the output's six.
        let (view, perm): ([usize; 6], [usize; 6]) = if to_space {
            if c % bb != 0 {
                return Err(format!(
                    "{name}: {c} channels are not a multiple of blocksize² = {bb}"
                ));
            }
            if crd {
                ([n, c / bb, b, b, h, w], [0, 1, 4, 2, 5, 3])
            } else {
                ([n, b, b, c / bb, h, w], [0, 3, 4, 1, 5, 2])
            }
        } else {
            if h % b != 0 || w % b != 0 {
                return Err(format!(
                    "{name}: H {h} and W {w} must be multiples of the blocksize {b}"
                ));
            }
            let perm = if crd {
                [0, 1, 3, 5, 2, 4]
            } else {
                [0, 3, 5, 1, 2, 4]
            };
            ([n, c, h / b, b, w / b, b], perm)
        };
        let strides = shape::strides(&view)?;
        Ok((
            perm.iter().map(|&i| view[i]).collect(),
            perm.iter().map(|&i| strides[i]).collect(),
        ))
    }

    /// Batch rule: views and reshapes keep a batch whose samples stay one block along one
    /// axis ([`view_batch`]); transpose moves it; expand aligns it (numpy); concat, split
    /// and slice along it couple, as does gather indexing it; batched indices land at
    /// `axis + i`, and a batched x indexed by batched indices couples.
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let name = self.name();
        let dims = &inputs[0].shape;
        let along = |a: usize| format!("{name} along axis {a}, the batch axis");
        let one = |axis: Option<usize>| Ok(vec![axis; outputs.len()]);
        match self {
            MovementOp::Reshape { .. }
            | MovementOp::Flatten { .. }
            | MovementOp::Squeeze { .. }
            | MovementOp::Unsqueeze { .. } => match batch[0] {
                Some(b) => one(Some(view_batch(name, dims, b, &outputs[0].shape)?)),
                None => one(None),
            },
            MovementOp::Identity { .. } => one(batch[0]),
            MovementOp::Transpose { perm } => {
                let p = permutation(perm, dims.len())?;
                one(batch[0].and_then(|b| p.iter().position(|&i| i == b)))
            }
            MovementOp::Concat { axis } => {
                let a = shape::axis(*axis, dims.len())?;
                if batch.contains(&Some(a)) {
                    return Err(along(a));
                }
                if batch.iter().any(Option::is_none) {
                    return Err(format!(
                        "{name} joins batched and unbatched inputs along axis {a}"
                    ));
                }
                one(broadcast_batch(name, inputs, batch, dims.len())?)
            }
            MovementOp::Split { axis, .. } => {
                let a = shape::axis(*axis, dims.len())?;
                match batch[0] {
                    Some(b) if b == a => Err(along(a)),
                    other => one(other),
                }
            }
            MovementOp::Slice { .. } => {
                // Slices that keep a whole symbolic axis (0, open end, step 1) are not listed.
                let sliced = self.slice_axes(dims)?;
                match batch[0] {
                    Some(b) if sliced.iter().any(|s| s.0 == b) => Err(along(b)),
                    other => one(other),
                }
            }
            MovementOp::Expand { .. } => one(broadcast_batch(
                name,
                inputs,
                batch,
                outputs[0].shape.len(),
            )?),
            MovementOp::Gather { axis } => {
                let a = shape::existing_axis(*axis, dims.len())?;
                let index_rank = inputs.get(1).map_or(0, |t| t.shape.len());
                match (batch[0], batch.get(1).copied().flatten()) {
                    (Some(_), Some(_)) => Err(format!(
                        "{name} indexes batched x with batched indices: every sample's indices reach every sample"
                    )),
                    (Some(b), None) if b == a => Err(format!(
                        "{name} indexes along axis {a}, the batch axis"
                    )),
                    (Some(b), None) if b < a => one(Some(b)),
                    (Some(b), None) => one((b + index_rank).checked_sub(1)),
                    (None, Some(i)) => one(Some(a + i)),
                    (None, None) => one(None),
                }
            }
            MovementOp::Pad { .. } => {
                let pairs = self.pad_pairs(dims.len())?;
                match batch[0] {
                    Some(b) if pairs.get(b).is_some_and(|&p| p != (0, 0)) => Err(format!(
                        "{name} pads axis {b}, the batch axis, adding or dropping samples"
                    )),
                    other => one(other),
                }
            }
            MovementOp::Blocks { .. } => match batch[0] {
                Some(0) | None => one(batch[0]),
                Some(b) => Err(format!(
                    "{name} moves elements across axis {b}, the batch axis"
                )),
            },
        }
    }

    /// The lengths of the operator's list attributes, by name.
    pub fn lists(&self) -> Vec<(&'static str, usize)> {
        let len = |v: &Option<Vec<i64>>| v.as_ref().map_or(0, Vec::len);
        match self {
            MovementOp::Reshape { shape, .. } | MovementOp::Expand { shape } => {
                vec![("shape", shape.len())]
            }
            MovementOp::Squeeze { axes } => vec![("axes", len(axes))],
            MovementOp::Unsqueeze { axes } => vec![("axes", axes.len())],
            MovementOp::Transpose { perm } => vec![("perm", len(perm))],
            MovementOp::Split { sizes, .. } => vec![("sizes", len(sizes))],
            MovementOp::Slice {
                starts,
                ends,
                axes,
                steps,
            } => vec![
                ("starts", starts.len()),
                ("ends", ends.len()),
                ("axes", len(axes)),
                ("steps", len(steps)),
            ],
            MovementOp::Pad { pads, axes, .. } => vec![("pads", pads.len()), ("axes", len(axes))],
            MovementOp::Flatten { .. }
            | MovementOp::Identity { .. }
            | MovementOp::Concat { .. }
            | MovementOp::Gather { .. }
            | MovementOp::Blocks { .. } => Vec::new(),
        }
    }

    /// Checks what parsing guarantees beyond list lengths: a split has 1 to
    /// [`MAX_SPLIT_PARTS`] parts, one per size when sizes are given.
    pub fn validate(&self) -> Result<(), String> {
        if let MovementOp::Pad {
            pads,
            constant_value,
            ..
        } = self
        {
            if pads.iter().any(|p| p.unsigned_abs() > MAX_SIZE as u64)
                || !constant_value.is_finite()
            {
                return Err(format!(
                    "pad: pads {pads:?} or constant {constant_value} out of range"
                ));
            }
        }
        if let MovementOp::Blocks { blocksize, .. } = self {
            if *blocksize == 0 || *blocksize > MAX_SIZE as usize {
                return Err(format!("{}: blocksize {blocksize}", self.name()));
            }
        }
        if let MovementOp::Split { sizes, parts, .. } = self {
            let sizes_fit = sizes.as_ref().is_none_or(|s| s.len() == *parts);
            if *parts == 0 || *parts > MAX_SPLIT_PARTS || !sizes_fit {
                return Err(format!("split into {parts} parts with sizes {sizes:?}"));
            }
        }
        Ok(())
    }

    /// Sizes of the parts of a split of an axis of length `len`.
    pub fn split_sizes(&self, len: usize) -> Result<Vec<usize>, String> {
        let MovementOp::Split { sizes, parts, .. } = self else {
            return Ok(vec![len]);
        };
        match sizes {
            Some(s) => {
                let v: Vec<usize> = s
                    .iter()
                    .map(|&x| usize::try_from(x))
                    .collect::<Result<_, _>>()
                    .map_err(|_| format!("split sizes {s:?} must be non-negative"))?;
                let total = v.iter().try_fold(0usize, |a, &x| a.checked_add(x));
                if v.len() != *parts || total != Some(len) {
                    return Err(format!(
                        "split sizes {s:?} do not add up to the axis length {len}"
                    ));
                }
                Ok(v)
            }
            None => {
                if *parts == 0 {
                    return Err("split needs at least one part".into());
                }
                let chunk = len.div_ceil(*parts);
                let before_last = chunk.checked_mul(parts - 1);
                if *parts > 1 && len > 0 && before_last.is_none_or(|b| b >= len) {
                    return Err(format!(
                        "cannot split length {len} into {parts} non-empty parts"
                    ));
                }
                Ok((0..*parts)
                    .map(|i| {
                        let start = i.checked_mul(chunk).unwrap_or(len);
                        chunk.min(len.saturating_sub(start))
                    })
                    .collect())
            }
        }
    }

    /// The resolved slice per axis (ONNX clamping rules), computed in 128-bit integers so
    /// that starts, ends and steps at the `i64` extremes and axes of any length clamp
    /// instead of overflowing.
    pub fn slice_axes(&self, dims: &[Dim]) -> Result<Vec<SliceAxis>, String> {
        let MovementOp::Slice {
            starts,
            ends,
            axes,
            steps,
        } = self
        else {
            return Ok(Vec::new());
        };
        let n = starts.len();
        if ends.len() != n
            || axes.as_ref().is_some_and(|a| a.len() != n)
            || steps.as_ref().is_some_and(|s| s.len() != n)
        {
            return Err(format!(
                "starts, ends, axes and steps must have the same length ({n} starts)"
            ));
        }
        let mut out = Vec::new();
        let mut seen = Vec::new();
        for (k, (&start, &end)) in starts.iter().zip(ends).enumerate() {
            let a = match axes {
                Some(list) => shape::existing_axis(list[k], dims.len())?,
                None if k < dims.len() => k,
                None => return Err(format!("{n} starts for a tensor of rank {}", dims.len())),
            };
            if seen.contains(&a) {
                return Err(format!("axis {a} is sliced twice"));
            }
            seen.push(a);
            let step = steps.as_ref().map_or(1, |s| s[k]);
            if step == 0 {
                return Err("slice step must not be 0".into());
            }
            let Some(d) = dims[a].known() else {
                if start == 0 && end >= i64::from(i32::MAX) && step == 1 {
                    continue;
                }
                return Err(format!(
                    "slicing symbolic dimension {} needs start 0, step 1 and an open end",
                    dims[a]
                ));
            };
            let d = i128::try_from(d).map_err(|_| format!("axis length {d} is too large"))?;
            let (mut s, mut e, step128) = (i128::from(start), i128::from(end), i128::from(step));
            if s < 0 {
                s += d;
            }
            if e < 0 {
                e += d;
            }
            let (s, e) = if step > 0 {
                (s.clamp(0, d), e.clamp(0, d))
            } else {
                (s.clamp(0, (d - 1).max(0)), e.clamp(-1, (d - 1).max(-1)))
            };
            let len = if d == 0 {
                0
            } else if step > 0 {
                if e > s {
                    (e - s + step128 - 1) / step128
                } else {
                    0
                }
            } else if s > e {
                (s - e - step128 - 1) / (-step128)
            } else {
                0
            };
            let fit =
                |v: i128| usize::try_from(v).map_err(|_| format!("slice of axis {a} overflows"));
            out.push((a, fit(s)?, step, fit(len)?));
        }
        Ok(out)
    }

    /// Where a slice of a tensor of concrete shape `dims` reads its input, in input
    /// elements: the offset of its first element and, per axis, the step between
    /// neighbours along it (0 along sliced axes of length 1 or less, whose step never
    /// matters). Checked: an offset that does not fit is an error.
    pub fn slice_offsets(&self, dims: &[usize]) -> Result<(i64, Vec<i64>), String> {
        let strides = shape::strides(dims)?;
        let wide = |v: usize| i128::try_from(v).unwrap_or(i128::MAX);
        let mut src: Vec<i128> = strides.iter().map(|&s| wide(s)).collect();
        let mut base = 0i128;
        for (a, start, step, len) in self.slice_axes(&shape::known(dims))? {
            let stride = wide(strides[a]);
            base = base
                .checked_add(wide(start).saturating_mul(stride))
                .ok_or("slice offsets overflow")?;
            src[a] = if len <= 1 {
                0
            } else {
                i128::from(step).saturating_mul(stride)
            };
        }
        let fit = |v: i128| i64::try_from(v).map_err(|_| "slice offsets overflow".to_string());
        Ok((
            fit(base)?,
            src.into_iter().map(fit).collect::<Result<_, _>>()?,
        ))
    }
}

/// The permutation of a transpose (reversed axes when absent), checked.
pub fn permutation(perm: &Option<Vec<i64>>, rank: usize) -> Result<Vec<usize>, String> {
    let p: Vec<usize> = match perm {
        None => (0..rank).rev().collect(),
        Some(list) => list
            .iter()
            .map(|&a| shape::axis(a, rank))
            .collect::<Result<_, _>>()?,
    };
    let mut sorted = p.clone();
    sorted.sort_unstable();
    if sorted != (0..rank).collect::<Vec<_>>() {
        return Err(format!("perm {perm:?} is not a permutation of 0..{rank}"));
    }
    Ok(p)
}

/// Where the batch of a view or reshape lands. A sample's elements form, inside each block
/// of everything before input axis `a`, one contiguous run along `a`; they still do in the
/// output at axis `b` when the dimensions before `b` multiply to the same product as those
/// before `a` (so the blocks line up) and dimension `b` holds exactly one symbolic factor
/// (a fixed number of rows per sample). Anything else splits samples apart: coupled.
pub fn view_batch(op: &str, input: &[Dim], a: usize, output: &[Dim]) -> Result<usize, String> {
    let apart = || {
        format!(
            "{op} {} → {} moves samples apart (the batch axis was {a})",
            show(input),
            show(output)
        )
    };
    let before = Product::of(input.get(..a).ok_or_else(apart)?).ok_or_else(apart)?;
    for b in 0..output.len() {
        let (Some(prefix), Some(dim)) = (Product::of(&output[..b]), Product::of(&output[b..b + 1]))
        else {
            return Err(apart());
        };
        if prefix == before && dim.syms.len() == 1 {
            return Ok(b);
        }
    }
    Err(apart())
}

/// The target shape of a reshape (0 copies, -1 inferred), checked against the element count.
pub fn reshape_target(dims: &[Dim], target: &[i64], allowzero: bool) -> Result<Shape, String> {
    let total = Product::of(dims).ok_or("input size overflows")?;
    let mut out: Vec<Option<Dim>> = Vec::new();
    let mut infer_at = None;
    for (i, &t) in target.iter().enumerate() {
        match t {
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(None);
            }
            -1 => return Err(format!("shape {target:?} has more than one -1")),
            0 if !allowzero => match dims.get(i) {
                Some(d) => out.push(Some(d.clone())),
                None => {
                    return Err(format!(
                        "shape {target:?} copies dimension {i} (0) but the input has rank {}",
                        dims.len()
                    ))
                }
            },
            t if t >= 0 => out
                .push(Some(Dim::Known(usize::try_from(t).map_err(|_| {
                    format!("shape {target:?}: size {t} is too large")
                })?))),
            _ => return Err(format!("shape {target:?} has an invalid size {t}")),
        }
    }
    let known: Vec<Dim> = out.iter().flatten().cloned().collect();
    let have = Product::of(&known).ok_or("target size overflows")?;
    let mismatch = || {
        format!(
            "cannot reshape {} ({} elements) to {target:?}",
            show(dims),
            total.to_dim()
        )
    };
    match infer_at {
        Some(i) => {
            let rest = total.divide(&have).ok_or_else(mismatch)?;
            out[i] = Some(rest.to_dim());
        }
        None if have != total => return Err(mismatch()),
        None => {}
    }
    Ok(out.into_iter().flatten().collect())
}

/// `v`'s `len` entries along axis `a` spread `k` apart with zeros between them: `span` =
/// (len − 1)·k + 1 entries (a strided slice's gradient before its padding).
fn spread(
    g: &mut dyn GradContext,
    v: &str,
    a: usize,
    len: usize,
    k: usize,
    span: usize,
) -> Result<String, String> {
    let mut s = g.shape(v)?;
    s.insert(a + 1, 1);
    let column = g.reshape(v, &s)?;
    s[a + 1] = k - 1;
    let zeros = g.zeros(&s)?;
    let wide = g.emit("concat", json!({ "axis": a + 1 }), &[&column, &zeros])?;
    s.remove(a + 1);
    s[a] = len
        .checked_mul(k)
        .ok_or_else(|| format!("slice along axis {a}: the span overflows"))?;
    let flat = g.reshape(&wide, &s)?;
    g.emit(
        "slice",
        json!({ "starts": [0], "ends": [span], "axes": [a] }),
        &[&flat],
    )
}

impl MovementOp {
    /// Gradient rule. Views: dy reshaped back; transpose: the inverse permutation; concat:
    /// slices of dy; split: the parts' gradients concatenated (zeros for parts none
    /// reaches); slice: dy spread `step` apart (reversed for a negative step) and padded
    /// with zeros; expand: broadcasting undone; gather: `gather_grad` (a scatter-add);
    /// depth_to_space and space_to_depth: each other with the same block and mode; pad:
    /// see [`MovementOp::pad_grad`].
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        if !g.needs(0) && !matches!(self, MovementOp::Concat { .. }) {
            return Ok(());
        }
        let x = g.input(0)?;
        let xs = g.shape(&x)?;
        let rank = xs.len();
        let dx = match self {
            MovementOp::Reshape { .. }
            | MovementOp::Flatten { .. }
            | MovementOp::Squeeze { .. }
            | MovementOp::Unsqueeze { .. }
            | MovementOp::Identity { .. } => {
                let dy = g.dy()?;
                g.reshape(&dy, &xs)?
            }
            MovementOp::Transpose { perm } => {
                let p = permutation(perm, rank)?;
                let mut inverse = vec![0usize; rank];
                for (i, &a) in p.iter().enumerate() {
                    *inverse
                        .get_mut(a)
                        .ok_or("internal: permutation out of range")? = i;
                }
                let dy = g.dy()?;
                g.emit("transpose", json!({ "perm": inverse }), &[&dy])?
            }
            MovementOp::Concat { axis } => {
                let dy = g.dy()?;
                let a = shape::existing_axis(*axis, rank)?;
                let mut offset = 0usize;
                for k in 0.. {
                    let Ok(input) = g.input(k) else { break };
                    let len = *g
                        .shape(&input)?
                        .get(a)
                        .ok_or("internal: concat ranks differ")?;
                    let end = offset.checked_add(len).ok_or("concat length overflows")?;
                    if g.needs(k) {
                        let part = g.emit(
                            "slice",
                            json!({ "starts": [offset], "ends": [end], "axes": [a] }),
                            &[&dy],
                        )?;
                        g.input_grad(k, part)?;
                    }
                    offset = end;
                }
                return Ok(());
            }
            MovementOp::Split { axis, .. } => {
                let a = shape::existing_axis(*axis, rank)?;
                let sizes = self.split_sizes(xs[a])?;
                let mut parts = Vec::new();
                for (k, &len) in sizes.iter().enumerate() {
                    let part = match g.output_grad(k) {
                        Some(d) => d,
                        None => {
                            let mut s = xs.clone();
                            s[a] = len;
                            g.zeros(&s)?
                        }
                    };
                    parts.push(part);
                }
                let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                g.emit("concat", json!({ "axis": a }), &refs)?
            }
            MovementOp::Slice { .. } => {
                let dims: Vec<Dim> = xs.iter().map(|&d| Dim::Known(d)).collect();
                let axes = self.slice_axes(&dims)?;
                if axes.iter().any(|&(_, _, _, len)| len == 0) {
                    // Nothing was taken: x's gradient is zero.
                    let dx = g.zeros(&xs)?;
                    return g.input_grad(0, dx);
                }
                let mut v = g.dy()?;
                for (a, start, step, len) in axes {
                    let overflow = || format!("slice along axis {a}: the span overflows");
                    let k = usize::try_from(step.unsigned_abs()).map_err(|_| overflow())?;
                    // dy's entries land k apart from `first`, in reverse for a negative step.
                    let span = (len - 1)
                        .checked_mul(k)
                        .and_then(|x| x.checked_add(1))
                        .ok_or_else(overflow)?;
                    let first = if step > 0 {
                        start
                    } else {
                        start.checked_sub(span - 1).ok_or_else(overflow)?
                    };
                    if step < 0 {
                        let end = -i64::try_from(len).map_err(|_| overflow())? - 1;
                        v = g.emit(
                            "slice",
                            json!({ "starts": [-1], "ends": [end], "axes": [a], "steps": [-1] }),
                            &[&v],
                        )?;
                    }
                    if k > 1 {
                        v = spread(g, &v, a, len, k, span)?;
                    }
                    let after = xs[a]
                        .checked_sub(first)
                        .and_then(|r| r.checked_sub(span))
                        .ok_or("internal: slice past its axis")?;
                    let mut pieces = Vec::new();
                    for (size, middle) in [(first, false), (span, true), (after, false)] {
                        if middle {
                            pieces.push(v.clone());
                        } else if size > 0 {
                            let mut s = g.shape(&v)?;
                            s[a] = size;
                            pieces.push(g.zeros(&s)?);
                        }
                    }
                    if pieces.len() > 1 {
                        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
                        v = g.emit("concat", json!({ "axis": a }), &refs)?;
                    }
                }
                v
            }
            MovementOp::Expand { .. } => {
                let dy = g.dy()?;
                g.unbroadcast(&dy, &xs)?
            }
            MovementOp::Gather { axis } => {
                let indices = g.input(1)?;
                let dy = g.dy()?;
                let a = shape::existing_axis(*axis, rank)?;
                g.emit("gather_grad", json!({ "axis": a }), &[&x, &indices, &dy])?
            }
            MovementOp::Pad { .. } => return self.pad_grad(g, &xs),
            MovementOp::Blocks {
                to_space,
                blocksize,
                crd,
            } => {
                let dy = g.dy()?;
                let inverse = if *to_space {
                    "space_to_depth"
                } else {
                    "depth_to_space"
                };
                let mode = if *crd { "CRD" } else { "DCR" };
                g.emit(
                    inverse,
                    json!({ "blocksize": blocksize, "mode": mode }),
                    &[&dy],
                )?
            }
        };
        g.input_grad(0, dx)
    }
}

impl MovementOp {
    /// pad's gradient. Constant mode: dy cropped by the opposite pads (a pad with the
    /// pads negated: cropped elements had zero gradient). The other modes add, axis by
    /// axis, each padding region's gradient onto the input elements it copied: edge sums
    /// a region onto the end element, reflect reverses it onto the elements after (or
    /// before) the end one, wrap moves it to the other end; a region longer than what it
    /// copies (reflect: the axis less one; wrap: the axis) and negative pads are refused.
    fn pad_grad(&self, g: &mut dyn GradContext, xs: &[usize]) -> Result<(), String> {
        let MovementOp::Pad { mode, .. } = self else {
            return Err("internal: not a pad".into());
        };
        let pairs = self.pad_pairs(xs.len())?;
        let dy = g.dy()?;
        if *mode == PadMode::Constant {
            let begins: Vec<i64> = pairs.iter().map(|p| -p.0).collect();
            let ends: Vec<i64> = pairs.iter().map(|p| -p.1).collect();
            let pads: Vec<i64> = begins.into_iter().chain(ends).collect();
            let dx = g.emit("pad", json!({ "pads": pads }), &[&dy])?;
            return g.input_grad(0, dx);
        }
        let mut v = dy;
        for (a, &(begin, end)) in pairs.iter().enumerate() {
            if begin == 0 && end == 0 {
                continue;
            }
            let len = xs[a];
            let too_long = |p: i64| match mode {
                PadMode::Reflect => p >= len as i64,
                PadMode::Wrap => p > len as i64,
                _ => false,
            };
            if begin < 0 || end < 0 || too_long(begin) || too_long(end) {
                return Err(format!(
                    "pad's gradient in {mode:?} mode needs pads within 0..{} on axis {a}, got {begin}, {end}",
                    if *mode == PadMode::Reflect { len } else { len + 1 }
                ));
            }
            let (b, e) = (begin as usize, end as usize);
            let total = (b + len + e) as i64;
            let slice = |g: &mut dyn GradContext, v: &str, from: usize, to: usize, rev: bool| {
                // Reversed: from to − 1 down to from (an end of −total − 1 is before 0).
                let (starts, ends, steps) = match (rev, from) {
                    (true, 0) => (to as i64 - 1, -total - 1, -1),
                    (true, _) => (to as i64 - 1, from as i64 - 1, -1),
                    (false, _) => (from as i64, to as i64, 1),
                };
                g.emit(
                    "slice",
                    json!({ "starts": [starts], "ends": [ends], "axes": [a], "steps": [steps] }),
                    &[v],
                )
            };
            // Zero-pad a piece along the axis to land at `at` of the input's length.
            let place = |g: &mut dyn GradContext, v: &str, at: usize, size: usize| {
                let after = len - at - size;
                let mut pads = vec![0i64; 2];
                pads[0] = at as i64;
                pads[1] = after as i64;
                g.emit("pad", json!({ "pads": pads, "axes": [a] }), &[v])
            };
            let mut acc = slice(g, &v, b, b + len, false)?;
            for (start, size, left) in [(0, b, true), (b + len, e, false)] {
                if size == 0 {
                    continue;
                }
                let piece = match mode {
                    PadMode::Edge => {
                        let region = slice(g, &v, start, start + size, false)?;
                        let s = g.sum(&region, &[a], true)?;
                        place(g, &s, if left { 0 } else { len - 1 }, 1)?
                    }
                    PadMode::Reflect => {
                        let region = slice(g, &v, start, start + size, true)?;
                        let at = if left { 1 } else { len - 1 - size };
                        place(g, &region, at, size)?
                    }
                    _ => {
                        let region = slice(g, &v, start, start + size, false)?;
                        let at = if left { len - size } else { 0 };
                        place(g, &region, at, size)?
                    }
                };
                acc = g.binary("add", &acc, &piece)?;
            }
            v = acc;
        }
        g.input_grad(0, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{couples, rule};
    use proptest::prelude::*;
    use serde_json::json;

    /// ONNX slicing by brute force: walk from the clamped start by `step` while short of
    /// the clamped end.
    fn slice_model(d: usize, start: i64, end: i64, step: i64) -> (usize, usize) {
        let d = d as i128;
        let (mut s, mut e, st) = (start as i128, end as i128, step as i128);
        if s < 0 {
            s += d;
        }
        if e < 0 {
            e += d;
        }
        let (s, e) = if st > 0 {
            (s.clamp(0, d), e.clamp(0, d))
        } else {
            (s.clamp(0, (d - 1).max(0)), e.clamp(-1, d - 1))
        };
        let mut n = 0;
        let mut i = s;
        while d > 0 && ((st > 0 && i < e) || (st < 0 && i > e)) {
            n += 1;
            i += st;
        }
        (s as usize, n)
    }

    fn extreme() -> impl Strategy<Value = i64> {
        prop_oneof![
            -8i64..8,
            Just(i64::MIN),
            Just(i64::MAX),
            Just(i64::MIN + 1),
            Just(i64::MAX - 1),
            Just(i64::from(i32::MAX)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(600))]

        #[test]
        fn slices_agree_with_brute_force(
            d in 0usize..7,
            start in extreme(),
            end in extreme(),
            step in extreme().prop_filter("non-zero", |s| *s != 0),
        ) {
            let op = MovementOp::Slice {
                starts: vec![start],
                ends: vec![end],
                axes: None,
                steps: Some(vec![step]),
            };
            let got = op.slice_axes(&[Dim::Known(d)]).unwrap();
            let (s, n) = slice_model(d, start, end, step);
            prop_assert_eq!(got, vec![(0, s, step, n)]);
            // Offsets stay inside the input whatever the step.
            let (base, src) = op.slice_offsets(&[d]).unwrap();
            if n > 0 {
                let last = base as i128 + (n as i128 - 1) * src[0] as i128;
                prop_assert!(base >= 0 && (base as usize) < d && last >= 0 && (last as usize) < d);
            }
        }

        #[test]
        fn reshapes_agree_with_a_model(
            dims in proptest::collection::vec(0usize..5, 0..4),
            target in proptest::collection::vec(-1i64..6, 0..4),
        ) {
            let total: usize = dims.iter().product();
            let input = shape::known(&dims);
            let got = reshape_target(&input, &target, true);
            let known: Vec<i64> = target.iter().copied().filter(|&t| t != -1).collect();
            let inferred = target.iter().filter(|&&t| t == -1).count();
            let fixed: usize = known.iter().map(|&t| t as usize).product();
            let want: Option<Vec<usize>> = match inferred {
                0 if fixed == total => Some(known.iter().map(|&t| t as usize).collect()),
                1 if fixed != 0 && total.is_multiple_of(fixed) => Some(
                    target.iter().map(|&t| if t == -1 { total / fixed } else { t as usize }).collect(),
                ),
                _ => None,
            };
            match want {
                Some(w) if inferred == 1 && fixed == 0 => prop_assert!(got.is_err() || got == Ok(shape::known(&w))),
                Some(w) => prop_assert_eq!(got, Ok(shape::known(&w))),
                None => prop_assert!(got.is_err()),
            }
        }

        #[test]
        fn broadcasting_agrees_with_a_model(
            a in proptest::collection::vec(1usize..4, 0..4),
            b in proptest::collection::vec(1usize..4, 0..4),
        ) {
            let rank = a.len().max(b.len());
            let pad = |v: &[usize]| {
                let mut p = vec![1; rank - v.len()];
                p.extend_from_slice(v);
                p
            };
            let (pa, pb) = (pad(&a), pad(&b));
            let want: Option<Vec<usize>> = pa
                .iter()
                .zip(&pb)
                .map(|(&x, &y)| match (x, y) {
                    (x, y) if x == y => Some(x),
                    (1, y) => Some(y),
                    (x, 1) => Some(x),
                    _ => None,
                })
                .collect();
            let got = shape::broadcast(&shape::known(&a), &shape::known(&b)).ok();
            prop_assert_eq!(got, want.map(|w| shape::known(&w)));
        }
    }

    #[test]
    fn slicing_axes_of_two_to_the_63_and_more_clamps() {
        let huge = usize::MAX;
        let op = MovementOp::Slice {
            starts: vec![-3],
            ends: vec![-1],
            axes: None,
            steps: Some(vec![1]),
        };
        assert_eq!(
            op.slice_axes(&[Dim::Known(huge)]).unwrap(),
            vec![(0, huge - 3, 1, 2)]
        );
        // An end of i64::MAX is not open on an axis longer than it.
        let op = MovementOp::Slice {
            starts: vec![-1],
            ends: vec![i64::MAX],
            axes: None,
            steps: Some(vec![1]),
        };
        assert_eq!(
            op.slice_axes(&[Dim::Known(huge)]).unwrap(),
            vec![(0, huge - 1, 1, 0)]
        );
        let op = MovementOp::Slice {
            starts: vec![0],
            ends: vec![i64::MAX],
            axes: None,
            steps: Some(vec![2]),
        };
        let len = op.slice_axes(&[Dim::Known(1 << 63)]).unwrap()[0].3;
        assert_eq!(len, (i64::MAX as usize).div_ceil(2));
    }

    #[test]
    fn concat_and_split_totals_that_overflow_are_errors() {
        let t = |n: usize| TensorType::f32(vec![Dim::Known(n), Dim::Known(2)]);
        let concat = MovementOp::Concat { axis: 0 };
        let e = concat.infer(&[t(usize::MAX), t(2)]).unwrap_err();
        assert!(e.contains("overflows"), "{e}");
        let split = MovementOp::Split {
            axis: 0,
            sizes: Some(vec![i64::MAX, i64::MAX, 4]),
            parts: 3,
        };
        assert!(split.infer(&[t(6)]).is_err());
        let parts = MovementOp::Split {
            axis: 0,
            sizes: None,
            parts: 0,
        };
        assert!(parts.infer(&[t(6)]).is_err() && parts.validate().is_err());
    }

    #[test]
    fn reshapes_keep_a_batch_whose_samples_stay_one_block() {
        let reshape = |shape, x| rule("reshape", json!({ "shape": shape }), &[x]);
        // [N,16,4,4] → [N,256]
        assert_eq!(
            rule("flatten", json!({ "axis": 1 }), &[("N,16,4,4", Some(0))]),
            Ok(vec![Some(0)])
        );
        assert_eq!(
            reshape(json!([0, 256]), ("N,16,4,4", Some(0))),
            Ok(vec![Some(0)])
        );
        // [N,4] → [4N] and back, [N,4] → [2N,2]
        assert_eq!(reshape(json!([-1]), ("N,4", Some(0))), Ok(vec![Some(0)]));
        assert_eq!(reshape(json!([-1, 4]), ("N*4", Some(0))), Ok(vec![Some(0)]));
        assert_eq!(reshape(json!([-1, 2]), ("N,4", Some(0))), Ok(vec![Some(0)]));
        // A batch behind a fixed leading axis stays behind it.
        assert_eq!(
            reshape(json!([4, -1]), ("4,N,3", Some(1))),
            Ok(vec![Some(1)])
        );
        assert_eq!(
            rule("unsqueeze", json!({ "axes": [0] }), &[("N,4", Some(0))]),
            Ok(vec![Some(1)])
        );
        assert_eq!(
            rule("squeeze", json!({}), &[("1,N,1,4", Some(1))]),
            Ok(vec![Some(0)])
        );
        assert_eq!(
            rule("dropout", json!({}), &[("4,N", Some(1))]),
            Ok(vec![Some(1)])
        );
    }

    #[test]
    fn reshapes_that_split_samples_apart_couple() {
        let reshape = |shape, x| rule("reshape", json!({ "shape": shape }), &[x]);
        couples(
            reshape(json!([2, -1]), ("N,4", Some(0))),
            &["reshape", "[N, 4] → [2, N*2]", "moves samples apart"],
        );
        // transpose [N,4] → [4,N], then [4N]: samples strided.
        couples(
            reshape(json!([-1]), ("4,N", Some(1))),
            &["moves samples apart"],
        );
        couples(
            rule("flatten", json!({ "axis": 0 }), &[("4,N", Some(1))]),
            &["flatten"],
        );
    }

    #[test]
    fn transpose_moves_and_expand_aligns_the_batch() {
        let t = |perm, x| rule("transpose", json!({ "perm": perm }), &[x]);
        assert_eq!(t(json!([1, 0]), ("N,4", Some(0))), Ok(vec![Some(1)]));
        assert_eq!(t(json!([2, 0, 1]), ("4,N,3", Some(1))), Ok(vec![Some(2)]));
        assert_eq!(
            rule("transpose", json!({}), &[("N,3,4", Some(0))]),
            Ok(vec![Some(2)])
        );
        assert_eq!(
            rule("expand", json!({ "shape": [3, 1, 4] }), &[("N,1", Some(0))]),
            Ok(vec![Some(1)])
        );
    }

    #[test]
    fn concat_split_and_slice_couple_only_along_the_batch_axis() {
        let concat = |axis, a, b| rule("concat", json!({ "axis": axis }), &[a, b]);
        assert_eq!(
            concat(1, ("N,4", Some(0)), ("N,2", Some(0))),
            Ok(vec![Some(0)])
        );
        // Rules are positional: a known size stands in for the batch to check the rule.
        couples(
            concat(0, ("3,4", Some(0)), ("2,4", Some(0))),
            &["concat along axis 0, the batch axis"],
        );
        couples(concat(1, ("3,4", Some(0)), ("3,2", None)), &["unbatched"]);
        let split = rule(
            "split",
            json!({ "axis": 1, "num_outputs": 2 }),
            &[("N,4", Some(0))],
        );
        assert_eq!(split, Ok(vec![Some(0), Some(0)]));
        couples(
            rule(
                "split",
                json!({ "axis": 0, "num_outputs": 2 }),
                &[("4,4", Some(0))],
            ),
            &["split along axis 0, the batch axis"],
        );
        let slice = |attrs, x| rule("slice", attrs, &[x]);
        let cols = json!({ "starts": [1], "ends": [3], "axes": [1] });
        assert_eq!(slice(cols, ("N,4", Some(0))), Ok(vec![Some(0)]));
        // Keeping the whole symbolic axis is no slice at all.
        let all = json!({ "starts": [0], "ends": [i64::MAX], "axes": [0] });
        assert_eq!(slice(all, ("N,4", Some(0))), Ok(vec![Some(0)]));
        let rows = json!({ "starts": [0], "ends": [2], "axes": [0] });
        couples(slice(rows, ("8,4", Some(0))), &["slice along axis 0"]);
    }

    #[test]
    fn pad_modes_map_positions_as_numpy_does() {
        // Axis [a b c d] (len 4) at positions -3..7.
        let map = |m: PadMode| (-3..7).map(|p| m.source(p, 4)).collect::<Vec<_>>();
        let some = |v: &[i64]| v.iter().map(|&i| Some(i)).collect::<Vec<_>>();
        assert_eq!(map(PadMode::Reflect), some(&[3, 2, 1, 0, 1, 2, 3, 2, 1, 0]));
        assert_eq!(map(PadMode::Edge), some(&[0, 0, 0, 0, 1, 2, 3, 3, 3, 3]));
        assert_eq!(map(PadMode::Wrap), some(&[1, 2, 3, 0, 1, 2, 3, 0, 1, 2]));
        let c = map(PadMode::Constant);
        assert_eq!(c[3..7], some(&[0, 1, 2, 3])[..]);
        assert!(c[..3].iter().chain(&c[7..]).all(Option::is_none));
        assert_eq!(PadMode::Reflect.source(-2, 1), Some(0));
    }

    #[test]
    fn pad_and_block_shapes_and_errors() {
        let infer = |op: &str, attrs: serde_json::Value, x: &str| {
            let op =
                crate::ops::parse(op, attrs.as_object().unwrap()).map_err(|e| e[0].0.clone())?;
            op.infer(&[crate::ops::testing::tensor(x)])
                .map(|t| show(&t[0].shape))
        };
        // Without axes, the pads must cover every axis (checked against the rank).
        let e = infer("pad", json!({ "pads": [1, -1, 2, 3] }), "N,3,4").unwrap_err();
        assert!(e.contains("4 pads for 3 axes"), "{e}");
        assert_eq!(
            infer("pad", json!({ "pads": [1, 2, 3], "axes": [0] }), "3"),
            Err("pads".into())
        );
        assert_eq!(
            infer(
                "pad",
                json!({ "pads": [1, -1, 2, 3], "axes": [1, -1] }),
                "N,3,4"
            )
            .unwrap(),
            "[N, 6, 6]"
        );
        assert!(infer("pad", json!({ "pads": [0, -5], "axes": [1] }), "2,3").is_err());
        assert!(infer("pad", json!({ "pads": [1, 1], "axes": [0, 0] }), "2,3").is_err());
        assert!(infer(
            "pad",
            json!({ "pads": [1, 0], "mode": "edge", "axes": [1] }),
            "2,0"
        )
        .is_err());
        assert_eq!(
            infer("depth_to_space", json!({ "blocksize": 2 }), "N,8,2,3").unwrap(),
            "[N, 2, 4, 6]"
        );
        assert_eq!(
            infer(
                "space_to_depth",
                json!({ "blocksize": 2, "mode": "CRD" }),
                "N,2,4,6"
            )
            .unwrap(),
            "[N, 8, 2, 3]"
        );
        assert!(infer("depth_to_space", json!({ "blocksize": 3 }), "1,8,2,3").is_err());
        assert!(infer("space_to_depth", json!({ "blocksize": 4 }), "1,8,2,3").is_err());
        assert_eq!(
            infer("space_to_depth", json!({ "blocksize": 0 }), "1,8,2,3"),
            Err("blocksize".into())
        );
        assert_eq!(
            infer("pad", json!({ "pads": [0, 0], "mode": "mirror" }), "1,8"),
            Err("mode".into())
        );
    }

    #[test]
    fn pad_couples_only_when_it_pads_the_batch_axis() {
        assert_eq!(
            rule("pad", json!({ "pads": [0, 1, 0, 2] }), &[("N,4", Some(0))]),
            Ok(vec![Some(0)])
        );
        couples(
            rule(
                "pad",
                json!({ "pads": [1, 1], "axes": [0] }),
                &[("4,3", Some(0))],
            ),
            &["pad pads axis 0, the batch axis"],
        );
        assert_eq!(
            rule(
                "depth_to_space",
                json!({ "blocksize": 2 }),
                &[("N,4,2,2", Some(0))]
            ),
            Ok(vec![Some(0)])
        );
        couples(
            rule(
                "space_to_depth",
                json!({ "blocksize": 2 }),
                &[("2,3,4,4", Some(2))],
            ),
            &["space_to_depth", "axis 2"],
        );
    }

    #[test]
    fn gather_follows_x_or_the_indices() {
        let g = |axis, x, i| rule("gather", json!({ "axis": axis }), &[x, i]);
        // An embedding lookup: batched indices into a fixed table.
        assert_eq!(
            g(0, ("10,4", None), ("i32:N,3", Some(0))),
            Ok(vec![Some(0)])
        );
        assert_eq!(
            g(1, ("10,4", None), ("i32:3,N", Some(1))),
            Ok(vec![Some(2)])
        );
        // Batched x indexed along another axis.
        assert_eq!(g(1, ("N,4", Some(0)), ("i32:2,3", None)), Ok(vec![Some(0)]));
        assert_eq!(g(0, ("4,N", Some(1)), ("i32:2,3", None)), Ok(vec![Some(2)]));
        assert_eq!(g(0, ("4,N", Some(1)), ("i32:", None)), Ok(vec![Some(0)]));
        couples(
            g(0, ("N,4", Some(0)), ("i32:3", None)),
            &["gather indexes along axis 0, the batch axis"],
        );
        couples(
            g(1, ("N,4", Some(0)), ("i32:N", Some(0))),
            &["batched indices"],
        );
    }
}
