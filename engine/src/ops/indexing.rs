//! Indexing family: operators that compute where each output element comes from, or which
//! output elements an update lands on, from index tensors or from positions —
//! `gather_elements`, `scatter_elements`, `gather_nd`, `scatter_nd`, `tile`, `trilu` — and
//! the generators that read no tensor data at all, `range`, `shape`, `constant_of_shape`.
//! Kernels: `shaders/indexing.wgsl`, one invocation per output element (scatters gather
//! their updates, so no two invocations write one element and no atomics are needed).
//!
//! `gather` stays in the movement family: its indices pick whole slices, a strided copy.
//! These operators index element by element (or by tuples of coordinates), and the
//! scatters combine values, so they share their own kernel generator.
//!
//! Indices are i32 and negative ones count from the end of their axis (ONNX). An index
//! outside its axis is an error on the CPU; on the GPU a gather clamps it into the axis
//! and a scatter skips its update, so no kernel reads or writes out of bounds.
//! `gather_elements` and `scatter_elements` declare their indices
//! ([`IndexInput`]) so graph inputs holding them are checked on the host before upload.

use super::attrs::{optional, required, AttrKind, AttrReader, MAX_SIZE};
use super::backward::GradContext;
use super::{Arity, IndexInput, OpSchema, TensorType};
use crate::dtype::DType;
use crate::shape::{self, show, Dim, Shape};
use serde_json::json;

/// Family tag.
pub const FAMILY: &str = "indexing";

const REDUCTIONS: &[&str] = &["none", "add", "mul", "max", "min"];

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    OpSchema {
        name: "gather_elements",
        family: FAMILY,
        doc: "y[i][j][k] = data[indices[i][j][k]][j][k] along an axis (ONNX GatherElements); y has the indices' shape.",
        inputs: Arity::Fixed(&["data", "indices"]),
        outputs: &["y"],
        attrs: &[optional(
            "axis",
            AttrKind::Int,
            "0",
            "Axis the indices index (negative counts from the end).",
        )],
        params: &[],
    },
    OpSchema {
        name: "scatter_elements",
        family: FAMILY,
        doc: "data with updates[i][j][k] combined into element [indices[i][j][k]][j][k] along an axis (ONNX ScatterElements).",
        inputs: Arity::Fixed(&["data", "indices", "updates"]),
        outputs: &["y"],
        attrs: &[
            optional(
                "axis",
                AttrKind::Int,
                "0",
                "Axis the indices index (negative counts from the end).",
            ),
            optional(
                "reduction",
                AttrKind::Choice(REDUCTIONS),
                "\"none\"",
                "How an update combines with the element: replace it, add, mul, max, min.",
            ),
        ],
        params: &[],
    },
    OpSchema {
        name: "gather_nd",
        family: FAMILY,
        doc: "Slices of data addressed by the last axis of indices, tuples of leading coordinates (ONNX GatherND).",
        inputs: Arity::Fixed(&["data", "indices"]),
        outputs: &["y"],
        attrs: &[optional(
            "batch_dims",
            AttrKind::Int,
            "0",
            "Leading axes data and indices share, gathered sample by sample.",
        )],
        params: &[],
    },
    OpSchema {
        name: "scatter_nd",
        family: FAMILY,
        doc: "data with update slices combined into the slices the last axis of indices addresses (ONNX ScatterND).",
        inputs: Arity::Fixed(&["data", "indices", "updates"]),
        outputs: &["y"],
        attrs: &[optional(
            "reduction",
            AttrKind::Choice(REDUCTIONS),
            "\"none\"",
            "How an update combines with the slice: replace it, add, mul, max, min.",
        )],
        params: &[],
    },
    OpSchema {
        name: "tile",
        family: FAMILY,
        doc: "The input repeated along every axis (ONNX Tile).",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: &[required(
            "repeats",
            AttrKind::Ints,
            "Copies along each axis (one per axis, each at least 0).",
        )],
        params: &[],
    },
    OpSchema {
        name: "trilu",
        family: FAMILY,
        doc: "The upper or lower triangle of the last two axes, the rest zero (ONNX Trilu).",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: &[
            optional(
                "upper",
                AttrKind::Bool,
                "true",
                "Keep the upper triangle (false: the lower).",
            ),
            optional(
                "k",
                AttrKind::Int,
                "0",
                "Diagonal offset: positive moves it up and right.",
            ),
        ],
        params: &[],
    },
    OpSchema {
        name: "range",
        family: FAMILY,
        doc: "start, start + delta, … up to limit (excluded), as f32 or i32 (ONNX Range).",
        inputs: Arity::Fixed(&[]),
        outputs: &["y"],
        attrs: &[
            required("start", AttrKind::Float, "First value."),
            required("limit", AttrKind::Float, "Bound, excluded."),
            required("delta", AttrKind::Float, "Step, not 0."),
            optional(
                "dtype",
                AttrKind::Choice(&["f32", "i32"]),
                "\"f32\"",
                "Element type (i32 values must be integers).",
            ),
        ],
        params: &[],
    },
    OpSchema {
        name: "shape",
        family: FAMILY,
        doc: "The input's dimensions from start to end, as i32 (ONNX Shape).",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["shape"],
        attrs: &[
            optional(
                "start",
                AttrKind::Int,
                "0",
                "First axis (negative counts from the end; clamped to the rank).",
            ),
            optional(
                "end",
                AttrKind::Int,
                "null",
                "Axis after the last (negative counts from the end; clamped; all when absent).",
            ),
        ],
        params: &[],
    },
    OpSchema {
        name: "constant_of_shape",
        family: FAMILY,
        doc: "A tensor of a shape filled with one value (ONNX ConstantOfShape).",
        inputs: Arity::Fixed(&[]),
        outputs: &["y"],
        attrs: &[
            required("shape", AttrKind::Ints, "Shape (sizes at least 0)."),
            optional("value", AttrKind::Float, "0", "The value."),
            optional(
                "dtype",
                AttrKind::Choice(&["f32", "i32"]),
                "\"f32\"",
                "Element type (an i32 value must be an integer).",
            ),
        ],
        params: &[],
    },
];

/// How a scatter combines an update with the element it lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reduction {
    /// The update replaces the element (the last of several updates wins).
    None,
    /// Sum.
    Add,
    /// Product.
    Mul,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

/// A parsed indexing operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexingOp {
    /// `gather_elements`.
    GatherElements {
        /// Indexed axis (negative counts from the end).
        axis: i64,
    },
    /// `scatter_elements`.
    ScatterElements {
        /// Indexed axis (negative counts from the end).
        axis: i64,
        /// How updates combine.
        reduction: Reduction,
    },
    /// `gather_nd`.
    GatherNd {
        /// Leading axes shared by data and indices.
        batch_dims: usize,
    },
    /// `scatter_nd`.
    ScatterNd {
        /// How updates combine.
        reduction: Reduction,
    },
    /// `tile`.
    Tile {
        /// Copies along each axis.
        repeats: Vec<usize>,
    },
    /// `trilu`.
    Trilu {
        /// Upper triangle (else lower).
        upper: bool,
        /// Diagonal offset.
        k: i64,
    },
    /// `range`.
    Range {
        /// First value.
        start: f32,
        /// Bound, excluded.
        limit: f32,
        /// Step.
        delta: f32,
        /// f32 or i32.
        dtype: DType,
    },
    /// `shape`.
    Shape {
        /// First axis.
        start: i64,
        /// Axis after the last (None: the rank).
        end: Option<i64>,
    },
    /// `constant_of_shape`.
    ConstantOfShape {
        /// Shape.
        shape: Vec<usize>,
        /// The value.
        value: f32,
        /// f32 or i32.
        dtype: DType,
    },
}

fn reduction(r: &mut AttrReader) -> Reduction {
    match r.choice("reduction").as_str() {
        "add" => Reduction::Add,
        "mul" => Reduction::Mul,
        "max" => Reduction::Max,
        "min" => Reduction::Min,
        _ => Reduction::None,
    }
}

fn dtype(r: &mut AttrReader) -> DType {
    if r.choice("dtype") == "i32" {
        DType::I32
    } else {
        DType::F32
    }
}

/// Sizes from an attribute list, each in 0..=MAX_SIZE (a problem names the attribute).
fn sizes(r: &mut AttrReader, name: &str) -> Vec<usize> {
    let list = r.ints(name);
    let mut out = Vec::with_capacity(list.len());
    for v in list {
        match usize::try_from(v) {
            Ok(s) if v <= MAX_SIZE => out.push(s),
            _ => {
                r.reject(
                    name,
                    format!("{name} entries must be in 0..={MAX_SIZE}, got {v}"),
                );
                return Vec::new();
            }
        }
    }
    out
}

/// Whether `v` is an integer an i32 holds exactly.
fn is_i32(v: f32) -> bool {
    v == v.trunc() && v.abs() <= 2_147_483_520.0
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<IndexingOp> {
    Some(match name {
        "gather_elements" => IndexingOp::GatherElements {
            axis: r.int("axis"),
        },
        "scatter_elements" => IndexingOp::ScatterElements {
            axis: r.int("axis"),
            reduction: reduction(r),
        },
        "gather_nd" => {
            let b = r.int("batch_dims");
            let batch_dims = match usize::try_from(b) {
                Ok(b) if b <= 64 => b,
                _ => {
                    r.reject(
                        "batch_dims",
                        format!("batch_dims must be in 0..=64, got {b}"),
                    );
                    0
                }
            };
            IndexingOp::GatherNd { batch_dims }
        }
        "scatter_nd" => IndexingOp::ScatterNd {
            reduction: reduction(r),
        },
        "tile" => IndexingOp::Tile {
            repeats: sizes(r, "repeats"),
        },
        "trilu" => {
            let upper = r.bool("upper");
            let k = r.int("k");
            if k.unsigned_abs() > MAX_SIZE.unsigned_abs() {
                r.reject("k", format!("k must be within ±{MAX_SIZE}, got {k}"));
            }
            IndexingOp::Trilu { upper, k }
        }
        "range" => {
            let (start, limit, delta) = (r.float("start"), r.float("limit"), r.float("delta"));
            let dtype = dtype(r);
            for (what, v) in [("start", start), ("limit", limit), ("delta", delta)] {
                if !v.is_finite() || dtype == DType::I32 && !is_i32(v) {
                    r.reject(
                        what,
                        format!("{what} must be a finite number (an i32 integer for dtype i32), got {v}"),
                    );
                }
            }
            if delta == 0.0 {
                r.reject("delta", "delta must not be 0");
            }
            IndexingOp::Range {
                start,
                limit,
                delta,
                dtype,
            }
        }
        "shape" => IndexingOp::Shape {
            start: r.int("start"),
            end: r.opt_int("end"),
        },
        "constant_of_shape" => {
            let shape = sizes(r, "shape");
            let value = r.float("value");
            let dtype = dtype(r);
            if dtype == DType::I32 && !is_i32(value) {
                r.reject(
                    "value",
                    format!("an i32 value must be an integer, got {value}"),
                );
            }
            IndexingOp::ConstantOfShape {
                shape,
                value,
                dtype,
            }
        }
        _ => return None,
    })
}

/// The number of elements of `range` (ONNX: max(ceil((limit − start) / delta), 0)),
/// computed in f64.
pub fn range_len(start: f32, limit: f32, delta: f32) -> Result<usize, String> {
    let n = ((f64::from(limit) - f64::from(start)) / f64::from(delta))
        .ceil()
        .max(0.0);
    if !n.is_finite() || n > MAX_SIZE as f64 {
        return Err(format!(
            "range from {start} to {limit} by {delta} has too many elements"
        ));
    }
    Ok(n as usize)
}

/// `shape`'s [start, end) axes of a tensor of rank `rank`, clamped as ONNX says.
pub fn shape_axes(start: i64, end: Option<i64>, rank: usize) -> (usize, usize) {
    let r = i64::try_from(rank).unwrap_or(i64::MAX);
    let clamp = |v: i64| {
        let v = if v < 0 { v.saturating_add(r) } else { v };
        usize::try_from(v.clamp(0, r)).unwrap_or(0)
    };
    let (s, e) = (clamp(start), clamp(end.unwrap_or(r)));
    (s, e.max(s))
}

fn need_data(op: &str, which: &str, t: &TensorType) -> Result<(), String> {
    if matches!(t.dtype, DType::F32 | DType::I32) {
        Ok(())
    } else {
        Err(format!("'{op}' needs f32 or i32 {which}, got {t}"))
    }
}

fn need_indices(op: &str, t: &TensorType) -> Result<(), String> {
    if t.dtype == DType::I32 {
        Ok(())
    } else {
        Err(format!("'{op}' needs i32 indices, got {t}"))
    }
}

/// A dimension's known size, or an error naming what needs it.
fn known(d: &Dim, what: &str) -> Result<usize, String> {
    match d {
        Dim::Known(n) => Ok(*n),
        Dim::Sym(s) => Err(format!("{what} must be known, got the symbolic size {s}")),
    }
}

/// Two dimensions that must be equal (symbolic ones by name).
fn same_dim(a: &Dim, b: &Dim) -> bool {
    a == b
}

impl IndexingOp {
    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self {
            IndexingOp::GatherElements { .. } => "gather_elements",
            IndexingOp::ScatterElements { .. } => "scatter_elements",
            IndexingOp::GatherNd { .. } => "gather_nd",
            IndexingOp::ScatterNd { .. } => "scatter_nd",
            IndexingOp::Tile { .. } => "tile",
            IndexingOp::Trilu { .. } => "trilu",
            IndexingOp::Range { .. } => "range",
            IndexingOp::Shape { .. } => "shape",
            IndexingOp::ConstantOfShape { .. } => "constant_of_shape",
        }
    }

    /// The lengths of the operator's list attributes, by name.
    pub fn lists(&self) -> Vec<(&'static str, usize)> {
        match self {
            IndexingOp::Tile { repeats } => vec![("repeats", repeats.len())],
            IndexingOp::ConstantOfShape { shape, .. } => vec![("shape", shape.len())],
            _ => Vec::new(),
        }
    }

    /// Checks what parsing guarantees, for operators that arrive already parsed.
    pub fn validate(&self) -> Result<(), String> {
        let max = usize::try_from(MAX_SIZE).unwrap_or(usize::MAX);
        let name = self.name();
        match self {
            IndexingOp::Tile { repeats: s } | IndexingOp::ConstantOfShape { shape: s, .. }
                if s.iter().any(|&v| v > max) =>
            {
                Err(format!("{name}: a size of {s:?} is out of range"))
            }
            IndexingOp::GatherNd { batch_dims } if *batch_dims > 64 => Err(format!(
                "gather_nd: batch_dims {batch_dims} is out of range"
            )),
            IndexingOp::Trilu { k, .. } if k.unsigned_abs() > MAX_SIZE.unsigned_abs() => {
                Err(format!("trilu: k {k} is out of range"))
            }
            IndexingOp::Range {
                start,
                limit,
                delta,
                dtype,
            } => {
                let ok = [start, limit, delta]
                    .iter()
                    .all(|v| v.is_finite() && (*dtype != DType::I32 || is_i32(**v)));
                if !ok || *delta == 0.0 || *dtype == DType::Bool {
                    return Err(format!(
                        "range: start {start}, limit {limit}, delta {delta} ({dtype}) are out of range"
                    ));
                }
                range_len(*start, *limit, *delta).map(|_| ())
            }
            IndexingOp::ConstantOfShape { value, dtype, .. }
                if *dtype == DType::Bool || *dtype == DType::I32 && !is_i32(*value) =>
            {
                Err(format!(
                    "constant_of_shape: value {value} does not fit {dtype}"
                ))
            }
            _ => Ok(()),
        }
    }

    /// `gather_elements` and `scatter_elements` read input 1 as indices into input 0
    /// along their axis.
    pub fn index_input(&self) -> Option<IndexInput> {
        match self {
            IndexingOp::GatherElements { axis } | IndexingOp::ScatterElements { axis, .. } => {
                Some(IndexInput {
                    indices: 1,
                    data: 0,
                    axis: *axis,
                    non_negative: false,
                })
            }
            _ => None,
        }
    }

    /// Output types. Shapes must agree where ONNX says they do; `tile` and `gather_nd`
    /// need known sizes where they compute with them, and `shape` gives the input's
    /// (possibly symbolic) dimensions only at run time, so its output has a known length.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        let typed = |shape: Shape, dtype: DType| Ok(vec![TensorType { shape, dtype }]);
        match self {
            IndexingOp::GatherElements { axis } | IndexingOp::ScatterElements { axis, .. } => {
                let (data, idx) = (&inputs[0], &inputs[1]);
                need_data(name, "data", data)?;
                need_indices(name, idx)?;
                let a = shape::existing_axis(*axis, data.shape.len())?;
                if idx.shape.len() != data.shape.len() {
                    return Err(format!(
                        "{name}: indices {} must have the rank of data {}",
                        show(&idx.shape),
                        show(&data.shape)
                    ));
                }
                for (d, (i, x)) in idx.shape.iter().zip(&data.shape).enumerate() {
                    let fits = match (i, x) {
                        (Dim::Known(i), Dim::Known(x)) => d == a || i <= x,
                        _ => d == a || same_dim(i, x),
                    };
                    if !fits {
                        return Err(format!(
                            "{name}: indices {} exceed data {} along axis {d}",
                            show(&idx.shape),
                            show(&data.shape)
                        ));
                    }
                }
                if let IndexingOp::ScatterElements { .. } = self {
                    let upd = &inputs[2];
                    if upd.dtype != data.dtype || upd.shape != idx.shape {
                        return Err(format!(
                            "scatter_elements: updates {upd} must have data's dtype and the indices' shape {}",
                            show(&idx.shape)
                        ));
                    }
                    return typed(data.shape.clone(), data.dtype);
                }
                typed(idx.shape.clone(), data.dtype)
            }
            IndexingOp::GatherNd { batch_dims } => {
                let (data, idx) = (&inputs[0], &inputs[1]);
                need_data(name, "data", data)?;
                let m = nd_depth(name, data, idx, *batch_dims)?;
                for d in 0..*batch_dims {
                    if !same_dim(&data.shape[d], &idx.shape[d]) {
                        return Err(format!(
                            "gather_nd: data {} and indices {} differ along batch axis {d}",
                            show(&data.shape),
                            show(&idx.shape)
                        ));
                    }
                }
                let mut out: Shape = idx.shape[..idx.shape.len() - 1].to_vec();
                out.extend(data.shape[batch_dims + m..].iter().cloned());
                typed(out, data.dtype)
            }
            IndexingOp::ScatterNd { .. } => {
                let (data, idx, upd) = (&inputs[0], &inputs[1], &inputs[2]);
                need_data(name, "data", data)?;
                let m = nd_depth(name, data, idx, 0)?;
                let mut want: Shape = idx.shape[..idx.shape.len() - 1].to_vec();
                want.extend(data.shape[m..].iter().cloned());
                if upd.dtype != data.dtype || upd.shape != want {
                    return Err(format!(
                        "scatter_nd: updates {upd} must be {} {}",
                        data.dtype,
                        show(&want)
                    ));
                }
                typed(data.shape.clone(), data.dtype)
            }
            IndexingOp::Tile { repeats } => {
                let x = &inputs[0];
                need_data(name, "input", x)?;
                if repeats.len() != x.shape.len() {
                    return Err(format!(
                        "tile: repeats {repeats:?} must have one entry per axis of {x}"
                    ));
                }
                let mut out = Vec::with_capacity(repeats.len());
                for (d, &r) in x.shape.iter().zip(repeats) {
                    out.push(match (d, r) {
                        (d, 1) => d.clone(),
                        (d, r) => {
                            let n = known(d, "a tiled dimension")?;
                            Dim::Known(
                                n.checked_mul(r)
                                    .ok_or_else(|| format!("tile: {n} × {r} overflows"))?,
                            )
                        }
                    });
                }
                typed(out, x.dtype)
            }
            IndexingOp::Trilu { .. } => {
                let x = &inputs[0];
                need_data(name, "input", x)?;
                if x.shape.len() < 2 {
                    return Err(format!("trilu needs at least 2 axes, got {x}"));
                }
                Ok(vec![x.clone()])
            }
            IndexingOp::Range {
                start,
                limit,
                delta,
                dtype,
            } => typed(vec![Dim::Known(range_len(*start, *limit, *delta)?)], *dtype),
            IndexingOp::Shape { start, end } => {
                let (s, e) = shape_axes(*start, *end, inputs[0].shape.len());
                typed(vec![Dim::Known(e - s)], DType::I32)
            }
            IndexingOp::ConstantOfShape { shape, dtype, .. } => {
                typed(shape.iter().map(|&d| Dim::Known(d)).collect(), *dtype)
            }
        }
    }

    /// Batch rule. Element-wise gathers and scatters keep a batch axis that data,
    /// indices (and updates) share, off the indexed axis; `gather_nd` keeps one among its
    /// `batch_dims` or in the slices it copies; `scatter_nd` one in the slices it updates;
    /// `tile` and `trilu` one they do not repeat or mask along. `shape` couples when it
    /// reads the batch axis's length (a micro-batch would read its own); every other
    /// combination couples, naming the axis.
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let name = self.name();
        let one = |b: Option<usize>| Ok(vec![b]);
        match self {
            IndexingOp::GatherElements { axis } | IndexingOp::ScatterElements { axis, .. } => {
                let a = shape::existing_axis(*axis, inputs[0].shape.len())?;
                let first = batch.iter().flatten().next().copied();
                match first {
                    Some(b) if b == a => {
                        Err(format!("{name} indexes along axis {a}, the batch axis"))
                    }
                    Some(b) if batch.iter().all(|x| *x == Some(b)) => one(Some(b)),
                    _ => Err(format!(
                        "{name} needs data, indices{} batched along one axis, got {batch:?}: otherwise samples meet",
                        if inputs.len() == 3 { " and updates" } else { "" }
                    )),
                }
            }
            IndexingOp::GatherNd { batch_dims } => {
                let m = nd_depth(name, &inputs[0], &inputs[1], *batch_dims)?;
                let q = inputs[1].shape.len();
                match (batch[0], batch[1]) {
                    (Some(b), Some(i)) if b == i && b < *batch_dims => one(Some(b)),
                    (Some(b), None) if b >= batch_dims + m => {
                        one(Some(b + q - 1 - batch_dims - m))
                    }
                    (None, Some(i)) if i + 1 < q && *batch_dims == 0 => one(Some(i)),
                    _ => Err(format!(
                        "{name} with data batched on {:?} and indices on {:?}: the indices address samples",
                        batch[0], batch[1]
                    )),
                }
            }
            IndexingOp::ScatterNd { .. } => {
                let m = nd_depth(name, &inputs[0], &inputs[1], 0)?;
                let q = inputs[1].shape.len();
                match (batch[0], batch[1], batch[2]) {
                    (Some(b), None, Some(u)) if b >= m && u == b + q - 1 - m => one(Some(b)),
                    _ => Err(format!(
                        "{name} with data, indices and updates batched on {batch:?}: the indices address samples"
                    )),
                }
            }
            IndexingOp::Tile { repeats } => match batch[0] {
                Some(b) if repeats.get(b) != Some(&1) => {
                    Err(format!("{name} repeats axis {b}, the batch axis"))
                }
                b => one(b),
            },
            IndexingOp::Trilu { .. } => match batch[0] {
                Some(b) if b + 2 >= inputs[0].shape.len() => Err(format!(
                    "{name} masks by position along axis {b}, the batch axis"
                )),
                b => one(b),
            },
            IndexingOp::Shape { start, end } => {
                let (s, e) = shape_axes(*start, *end, inputs[0].shape.len());
                match batch[0] {
                    Some(b) if (s..e).contains(&b) => Err(format!(
                        "{name} reads the length of axis {b}, the batch axis"
                    )),
                    _ => one(None),
                }
            }
            IndexingOp::Range { .. } | IndexingOp::ConstantOfShape { .. } => {
                Ok(vec![None; outputs.len()])
            }
        }
    }

    /// Gradient rule. `gather_elements`: dy scattered (added) back into zeros of data's
    /// shape; `gather_nd` (batch_dims 0): likewise with `scatter_nd`. Scatters with
    /// reduction none: data's gradient is dy with the overwritten elements zeroed (a
    /// scatter of zeros), the updates' is dy gathered at the indices; with add: data's is
    /// dy, the updates' the same gather; other reductions have none. `tile`: dy summed
    /// over the copies; `trilu`: dy masked the same way. Indices, `range`, `shape` and
    /// `constant_of_shape` have none.
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        let name = self.name();
        match self {
            IndexingOp::GatherElements { axis } => {
                if !g.needs(0) {
                    return Ok(());
                }
                let (x, idx, dy) = (g.input(0)?, g.input(1)?, g.dy()?);
                let zeros = g.zeros(&g.shape(&x)?)?;
                let dx = g.emit(
                    "scatter_elements",
                    json!({ "axis": axis, "reduction": "add" }),
                    &[&zeros, &idx, &dy],
                )?;
                g.input_grad(0, dx)
            }
            IndexingOp::GatherNd { batch_dims } => {
                if !g.needs(0) {
                    return Ok(());
                }
                if *batch_dims != 0 {
                    return Err(format!(
                        "gather_nd has no gradient with batch_dims {batch_dims} (only 0)"
                    ));
                }
                let (x, idx, dy) = (g.input(0)?, g.input(1)?, g.dy()?);
                let zeros = g.zeros(&g.shape(&x)?)?;
                let dx = g.emit(
                    "scatter_nd",
                    json!({ "reduction": "add" }),
                    &[&zeros, &idx, &dy],
                )?;
                g.input_grad(0, dx)
            }
            IndexingOp::ScatterElements { reduction, .. } | IndexingOp::ScatterNd { reduction } => {
                if !g.needs(0) && !g.needs(2) {
                    return Ok(());
                }
                if !matches!(reduction, Reduction::None | Reduction::Add) {
                    return Err(format!(
                        "{name} has a gradient only with reduction none or add"
                    ));
                }
                let (idx, dy) = (g.input(1)?, g.dy()?);
                let (gather, attrs) = match self {
                    IndexingOp::ScatterElements { axis, .. } => {
                        ("gather_elements", json!({ "axis": axis }))
                    }
                    _ => ("gather_nd", json!({})),
                };
                if g.needs(0) {
                    let dd = if *reduction == Reduction::Add {
                        dy.clone()
                    } else {
                        let upd = g.input(2)?;
                        let zeros = g.zeros(&g.shape(&upd)?)?;
                        let mut a = attrs.clone();
                        if let Some(o) = a.as_object_mut() {
                            o.remove("batch_dims");
                            o.insert("reduction".into(), json!("none"));
                        }
                        g.emit(name, a, &[&dy, &idx, &zeros])?
                    };
                    g.input_grad(0, dd)?;
                }
                if g.needs(2) {
                    let du = g.emit(gather, attrs, &[&dy, &idx])?;
                    g.input_grad(2, du)?;
                }
                Ok(())
            }
            IndexingOp::Tile { repeats } => {
                if !g.needs(0) {
                    return Ok(());
                }
                let (x, dy) = (g.input(0)?, g.dy()?);
                let xs = g.shape(&x)?;
                let mut split = Vec::with_capacity(2 * xs.len());
                let mut axes = Vec::new();
                for (d, (&n, &r)) in xs.iter().zip(repeats).enumerate() {
                    split.push(r);
                    split.push(n);
                    if r != 1 {
                        axes.push(2 * d);
                    }
                }
                let v = g.reshape(&dy, &split)?;
                let s = g.sum(&v, &axes, false)?;
                let dx = g.reshape(&s, &xs)?;
                g.input_grad(0, dx)
            }
            IndexingOp::Trilu { upper, k } => {
                if !g.needs(0) {
                    return Ok(());
                }
                let dy = g.dy()?;
                let dx = g.emit("trilu", json!({ "upper": upper, "k": k }), &[&dy])?;
                g.input_grad(0, dx)
            }
            IndexingOp::Range { .. } | IndexingOp::ConstantOfShape { .. } => Ok(()),
            IndexingOp::Shape { .. } => Ok(()),
        }
    }
}

/// The depth m of `gather_nd`/`scatter_nd`'s index tuples (the indices' last dimension),
/// checked: i32 indices of rank at least 1 + batch_dims, 1 ≤ m ≤ rank(data) − batch_dims.
fn nd_depth(
    op: &str,
    data: &TensorType,
    idx: &TensorType,
    batch_dims: usize,
) -> Result<usize, String> {
    need_indices(op, idx)?;
    let (r, q) = (data.shape.len(), idx.shape.len());
    if q < batch_dims + 1 || r < batch_dims + 1 {
        return Err(format!(
            "{op}: data {} and indices {} need more than batch_dims {batch_dims} axes",
            show(&data.shape),
            show(&idx.shape)
        ));
    }
    let m = known(&idx.shape[q - 1], "the indices' last dimension")?;
    if m == 0 || m > r - batch_dims {
        return Err(format!(
            "{op}: index tuples of length {m} for data {} (at most {} after batch_dims {batch_dims}, at least 1)",
            show(&data.shape),
            r - batch_dims
        ));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {

    #[test]
    fn trilu_k_of_i64_min_is_refused_not_an_overflow() {
        let attrs = serde_json::json!({ "k": i64::MIN });
        let err = crate::ops::parse("trilu", attrs.as_object().unwrap()).unwrap_err();
        assert!(err.iter().any(|(a, _)| a == "k"), "{err:?}");
    }

    use crate::ops::testing::{couples, rule, tensor};
    use serde_json::json;

    fn infer(
        op: &str,
        attrs: serde_json::Value,
        inputs: &[&str],
    ) -> Result<Vec<crate::ops::TensorType>, String> {
        let op = crate::ops::parse(op, attrs.as_object().unwrap()).map_err(|e| format!("{e:?}"))?;
        op.infer(&inputs.iter().map(|t| tensor(t)).collect::<Vec<_>>())
    }

    #[test]
    fn shapes_follow_onnx() {
        let y = infer("gather_elements", json!({ "axis": 1 }), &["3,4", "i32:2,5"]).unwrap();
        assert_eq!(y[0], tensor("2,5"));
        assert!(infer("gather_elements", json!({}), &["3,4", "i32:2,5"]).is_err());
        let y = infer(
            "gather_nd",
            json!({ "batch_dims": 1 }),
            &["2,3,4", "i32:2,1"],
        )
        .unwrap();
        assert_eq!(y[0], tensor("2,4"));
        let y = infer("gather_nd", json!({}), &["2,3,4", "i32:5,2"]).unwrap();
        assert_eq!(y[0], tensor("5,4"));
        assert!(infer("gather_nd", json!({}), &["2,3", "i32:5,3"]).is_err());
        let y = infer("scatter_nd", json!({}), &["4,4,4", "i32:2,1", "2,4,4"]).unwrap();
        assert_eq!(y[0], tensor("4,4,4"));
        assert!(infer("scatter_nd", json!({}), &["4,4,4", "i32:2,1", "2,4"]).is_err());
        let y = infer("tile", json!({ "repeats": [1, 3] }), &["N,2"]).unwrap();
        assert_eq!(y[0], tensor("N,6"));
        assert!(infer("tile", json!({ "repeats": [2, 1] }), &["N,2"]).is_err());
        assert!(infer("tile", json!({ "repeats": [2] }), &["3,2"]).is_err());
        let y = infer(
            "range",
            json!({ "start": 10, "limit": 4, "delta": -3, "dtype": "i32" }),
            &[],
        )
        .unwrap();
        assert_eq!(y[0], tensor("i32:2"));
        let y = infer("shape", json!({ "start": -2 }), &["N,3,4"]).unwrap();
        assert_eq!(y[0], tensor("i32:2"));
        let y = infer("shape", json!({ "start": 2, "end": 1 }), &["N,3,4"]).unwrap();
        assert_eq!(y[0], tensor("i32:0"));
        let y = infer(
            "constant_of_shape",
            json!({ "shape": [2, 0], "value": 3, "dtype": "i32" }),
            &[],
        )
        .unwrap();
        assert_eq!(y[0], tensor("i32:2,0"));
        assert!(infer("trilu", json!({}), &["3"]).is_err());
    }

    #[test]
    fn bad_attributes_are_errors_naming_them() {
        let bad = |op: &str, attrs: serde_json::Value, name: &str| {
            let e = crate::ops::parse(op, attrs.as_object().unwrap()).unwrap_err();
            assert!(e.iter().any(|(a, _)| a == name), "{op}: {e:?}");
        };
        bad(
            "range",
            json!({ "start": 0, "limit": 3, "delta": 0 }),
            "delta",
        );
        bad(
            "range",
            json!({ "start": 0.5, "limit": 3, "delta": 1, "dtype": "i32" }),
            "start",
        );
        bad("tile", json!({ "repeats": [-1] }), "repeats");
        bad("gather_nd", json!({ "batch_dims": -1 }), "batch_dims");
        bad("scatter_nd", json!({ "reduction": "mean" }), "reduction");
        bad(
            "constant_of_shape",
            json!({ "shape": [2], "value": 0.5, "dtype": "i32" }),
            "value",
        );
        bad("trilu", json!({ "k": 1_000_000_000_000i64 }), "k");
    }

    #[test]
    fn batch_rules() {
        assert_eq!(
            rule(
                "gather_elements",
                json!({ "axis": 1 }),
                &[("N,4", Some(0)), ("i32:N,2", Some(0))]
            ),
            Ok(vec![Some(0)])
        );
        couples(
            rule(
                "gather_elements",
                json!({ "axis": 0 }),
                &[("N,4", Some(0)), ("i32:N,4", Some(0))],
            ),
            &["axis 0, the batch axis"],
        );
        couples(
            rule("shape", json!({}), &[("N,4", Some(0))]),
            &["length of axis 0"],
        );
        assert_eq!(
            rule("shape", json!({ "start": 1 }), &[("N,4", Some(0))]),
            Ok(vec![None])
        );
        couples(
            rule("tile", json!({ "repeats": [2, 1] }), &[("3,4", Some(0))]),
            &["repeats axis 0"],
        );
        assert_eq!(
            rule("tile", json!({ "repeats": [1, 2] }), &[("N,4", Some(0))]),
            Ok(vec![Some(0)])
        );
        couples(rule("trilu", json!({}), &[("N,4", Some(0))]), &["axis 0"]);
        assert_eq!(
            rule("trilu", json!({}), &[("N,4,4", Some(0))]),
            Ok(vec![Some(0)])
        );
        assert_eq!(
            rule(
                "gather_nd",
                json!({}),
                &[("5,N", Some(1)), ("i32:3,1", None)]
            ),
            Ok(vec![Some(1)])
        );
        assert_eq!(
            rule(
                "scatter_nd",
                json!({}),
                &[("5,N", Some(1)), ("i32:3,1", None), ("3,N", Some(1))]
            ),
            Ok(vec![Some(1)])
        );
    }
}
