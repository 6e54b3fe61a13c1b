//! Reduce family: `reduce_sum`, `reduce_mean`, `reduce_max`, `reduce_min`, `reduce_prod`
//! and `reduce_l2` over any axes, with or without kept dimensions; `argmax` and `argmin`
//! along one axis; and the scans and selections along one axis, `cumsum` and `top_k`.
//! Kernels: `shaders/reduce.wgsl` (a thread per output for short reductions, a workgroup
//! tree per output for long ones; `argmax`/`argmin` and `cumsum` are a thread per output,
//! `top_k` a thread per input element, which ranks it in its slice).
//!
//! NaN: `reduce_max` and `reduce_min` propagate it (a slice holding a NaN has maximum and
//! minimum NaN, as numpy and PyTorch give), `argmax` and `argmin` count NaN beyond every
//! number, so the index of the first NaN wins (the last with `select_last_index`;
//! numpy's behaviour), and `top_k` ranks NaN beyond every number too; CPU and GPU agree.
//! Over an empty slice `reduce_min` gives +∞, `reduce_prod` 1 and `reduce_l2` 0 (ONNX's
//! values); `reduce_max`, `argmax`, `argmin` refuse one.

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec, MAX_SIZE};
use super::backward::GradContext;
use super::{need_f32, Arity, Capabilities, OpSchema, TensorType};
use crate::dtype::DType;
use crate::shape::{self, show, Dim};

/// Family tag.
pub const FAMILY: &str = "reduce";

const ATTRS: &[AttrSpec] = &[
    optional(
        "axes",
        AttrKind::Ints,
        "null",
        "Axes to reduce (all when absent; none when []).",
    ),
    optional(
        "keepdims",
        AttrKind::Bool,
        "true",
        "Keep reduced axes with size 1.",
    ),
];

const ARGMAX_ATTRS: &[AttrSpec] = &[
    optional(
        "axis",
        AttrKind::Int,
        "-1",
        "Axis to search (negative counts from the end); it must not be empty.",
    ),
    optional(
        "keepdims",
        AttrKind::Bool,
        "false",
        "Keep the searched axis with size 1.",
    ),
    optional(
        "select_last_index",
        AttrKind::Bool,
        "false",
        "Ties give the last index instead of the first.",
    ),
];

const ARGMIN_ATTRS: &[AttrSpec] = &[
    optional(
        "axis",
        AttrKind::Int,
        "0",
        "Axis to search (negative counts from the end); it must not be empty.",
    ),
    optional(
        "keepdims",
        AttrKind::Bool,
        "true",
        "Keep the searched axis with size 1.",
    ),
    optional(
        "select_last_index",
        AttrKind::Bool,
        "false",
        "Ties give the last index instead of the first.",
    ),
];

const CUMSUM_ATTRS: &[AttrSpec] = &[
    required(
        "axis",
        AttrKind::Int,
        "Axis to sum along (negative counts from the end).",
    ),
    optional(
        "exclusive",
        AttrKind::Bool,
        "false",
        "Leave each element out of its own sum (the first sum is 0).",
    ),
    optional(
        "reverse",
        AttrKind::Bool,
        "false",
        "Sum from the end of the axis towards its start.",
    ),
];

const TOP_K_ATTRS: &[AttrSpec] = &[
    required(
        "k",
        AttrKind::Int,
        "How many elements to select (0 to the axis length).",
    ),
    optional(
        "axis",
        AttrKind::Int,
        "-1",
        "Axis to select along (negative counts from the end).",
    ),
    optional(
        "largest",
        AttrKind::Bool,
        "true",
        "Select the largest elements (false: the smallest).",
    ),
    optional(
        "sorted",
        AttrKind::Bool,
        "true",
        "Return them in order (they are always returned in order: best first).",
    ),
];

const fn reduction(name: &'static str, doc: &'static str) -> OpSchema {
    OpSchema {
        name,
        family: FAMILY,
        doc,
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: ATTRS,
        params: &[],
    }
}

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    reduction("reduce_sum", "Sum over axes."),
    reduction("reduce_mean", "Mean over axes."),
    reduction(
        "reduce_max",
        "Maximum over axes (NaN when a reduced slice holds one; reduced axes must not be empty).",
    ),
    reduction(
        "reduce_min",
        "Minimum over axes (NaN when a reduced slice holds one; +inf over an empty slice).",
    ),
    reduction("reduce_prod", "Product over axes (1 over an empty slice)."),
    reduction(
        "reduce_l2",
        "Euclidean norm over axes: the square root of the sum of squares.",
    ),
    OpSchema {
        name: "argmin",
        family: FAMILY,
        doc: "i32 index of the minimum along an axis; ties give the first index (the last with select_last_index), NaN counts as the minimum.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["indices"],
        attrs: ARGMIN_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "cumsum",
        family: FAMILY,
        doc: "Cumulative sum along an axis (f32 or i32), inclusive or exclusive, forwards or reversed.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: CUMSUM_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "top_k",
        family: FAMILY,
        doc: "The k largest (or smallest) elements (f32 or i32) along an axis, best first, and their i32 indices; ties go to the lower index.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["values", "indices"],
        attrs: TOP_K_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "argmax",
        family: FAMILY,
        doc: "i32 index of the maximum along an axis; ties give the first index, NaN counts as the maximum.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["indices"],
        attrs: ARGMAX_ATTRS,
        params: &[],
    },
];

/// What a reduction computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceKind {
    /// Sum.
    Sum,
    /// Mean.
    Mean,
    /// Maximum, NaN-propagating.
    Max,
    /// Minimum, NaN-propagating.
    Min,
    /// Product.
    Prod,
    /// Square root of the sum of squares.
    L2,
    /// Index of the first (or last) maximum along one axis (i32).
    ArgMax,
    /// Index of the first (or last) minimum along one axis (i32).
    ArgMin,
    /// Cumulative sum along one axis.
    CumSum {
        /// Each element left out of its own sum.
        exclusive: bool,
        /// Summed from the end of the axis.
        reverse: bool,
    },
    /// The `k` best elements along one axis and their indices (two outputs).
    TopK {
        /// How many.
        k: usize,
        /// The largest (else the smallest).
        largest: bool,
    },
}

/// A parsed reduction.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReduceOp {
    /// What it computes.
    pub kind: ReduceKind,
    /// Axes (None: all); `argmax` has exactly one.
    pub axes: Option<Vec<i64>>,
    /// Keep reduced axes as size 1 (`cumsum` and `top_k` keep every axis).
    pub keepdims: bool,
    /// `argmax`/`argmin`: ties give the last index.
    #[serde(default)]
    pub select_last_index: bool,
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<ReduceOp> {
    let kind = match name {
        "reduce_sum" => ReduceKind::Sum,
        "reduce_mean" => ReduceKind::Mean,
        "reduce_max" => ReduceKind::Max,
        "reduce_min" => ReduceKind::Min,
        "reduce_prod" => ReduceKind::Prod,
        "reduce_l2" => ReduceKind::L2,
        "argmax" | "argmin" => {
            return Some(ReduceOp {
                kind: if name == "argmax" {
                    ReduceKind::ArgMax
                } else {
                    ReduceKind::ArgMin
                },
                axes: Some(vec![r.int("axis")]),
                keepdims: r.bool("keepdims"),
                select_last_index: r.bool("select_last_index"),
            })
        }
        "cumsum" => {
            return Some(ReduceOp {
                kind: ReduceKind::CumSum {
                    exclusive: r.bool("exclusive"),
                    reverse: r.bool("reverse"),
                },
                axes: Some(vec![r.int("axis")]),
                keepdims: true,
                select_last_index: false,
            })
        }
        "top_k" => {
            let k = r.int("k");
            let k = match usize::try_from(k) {
                Ok(k) if k <= MAX_SIZE as usize => k,
                _ => {
                    r.reject("k", format!("k must be in 0..={MAX_SIZE}, got {k}"));
                    0
                }
            };
            let axis = r.int("axis");
            let largest = r.bool("largest");
            // Results always come sorted, which `sorted = false` allows too.
            r.bool("sorted");
            return Some(ReduceOp {
                kind: ReduceKind::TopK { k, largest },
                axes: Some(vec![axis]),
                keepdims: true,
                select_last_index: false,
            });
        }
        _ => return None,
    };
    Some(ReduceOp {
        kind,
        axes: r.opt_ints("axes"),
        keepdims: r.bool("keepdims"),
        select_last_index: false,
    })
}

/// Resolves reduction axes to a sorted set of distinct axes below `rank` (axis 0 of a
/// rank-0 tensor, which [`shape::axis`] accepts, reduces nothing).
pub fn resolve_axes(axes: &Option<Vec<i64>>, rank: usize) -> Result<Vec<usize>, String> {
    let mut out = match axes {
        None => (0..rank).collect(),
        Some(list) => list
            .iter()
            .map(|&a| shape::axis(a, rank))
            .collect::<Result<Vec<_>, _>>()?,
    };
    out.sort_unstable();
    let n = out.len();
    out.dedup();
    if out.len() != n {
        return Err(format!("axes {axes:?} repeat an axis"));
    }
    out.retain(|&a| a < rank);
    Ok(out)
}

impl ReduceOp {
    /// The folds over elements take a pointwise prologue; the index, scan and selection
    /// kinds read their input in ways a prologue does not describe.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            prologue: matches!(
                self.kind,
                ReduceKind::Sum
                    | ReduceKind::Mean
                    | ReduceKind::Max
                    | ReduceKind::Min
                    | ReduceKind::Prod
                    | ReduceKind::L2
            ),
            ..Capabilities::default()
        }
    }

    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self.kind {
            ReduceKind::Sum => "reduce_sum",
            ReduceKind::Mean => "reduce_mean",
            ReduceKind::Max => "reduce_max",
            ReduceKind::Min => "reduce_min",
            ReduceKind::Prod => "reduce_prod",
            ReduceKind::L2 => "reduce_l2",
            ReduceKind::ArgMax => "argmax",
            ReduceKind::ArgMin => "argmin",
            ReduceKind::CumSum { .. } => "cumsum",
            ReduceKind::TopK { .. } => "top_k",
        }
    }

    /// Whether the operator works along exactly one axis (`argmax`, `argmin`, `cumsum`,
    /// `top_k`).
    pub fn single_axis(&self) -> bool {
        matches!(
            self.kind,
            ReduceKind::ArgMax
                | ReduceKind::ArgMin
                | ReduceKind::CumSum { .. }
                | ReduceKind::TopK { .. }
        )
    }

    /// Whether the output keeps the input's shape along every axis but the one it works
    /// along (`cumsum`, `top_k`).
    fn along(&self) -> bool {
        matches!(
            self.kind,
            ReduceKind::CumSum { .. } | ReduceKind::TopK { .. }
        )
    }

    /// Number of outputs (`top_k` has values and indices).
    pub fn num_outputs(&self) -> usize {
        if matches!(self.kind, ReduceKind::TopK { .. }) {
            2
        } else {
            1
        }
    }

    /// The reduced axes of an input of rank `rank`, sorted: for the single-axis operators
    /// their one axis, which must exist.
    pub fn axes(&self, rank: usize) -> Result<Vec<usize>, String> {
        if !self.single_axis() {
            return resolve_axes(&self.axes, rank);
        }
        match self.axes.as_deref() {
            Some(&[a]) => shape::existing_axis(a, rank).map(|a| vec![a]),
            _ => Err(format!(
                "{} takes one axis, got {:?}",
                self.name(),
                self.axes
            )),
        }
    }

    /// Output type: the input without the reduced axes (or with them as 1), f32 or, for
    /// `argmax` and `argmin`, i32. `reduce_max`, `argmax` and `argmin` refuse an empty
    /// reduced axis (a maximum of nothing has no value). `cumsum` keeps the input's type
    /// (f32 or i32); `top_k` gives values of the input's type (f32 or i32) and i32
    /// indices with `k` along the axis.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        let x = &inputs[0].shape;
        let axes = self.axes(x.len())?;
        match self.kind {
            ReduceKind::CumSum { .. } => {
                if !matches!(inputs[0].dtype, DType::F32 | DType::I32) {
                    return Err(format!("cumsum needs f32 or i32, got {}", inputs[0]));
                }
                return Ok(vec![inputs[0].clone()]);
            }
            ReduceKind::TopK { k, .. } => {
                if !matches!(inputs[0].dtype, DType::F32 | DType::I32) {
                    return Err(format!("top_k needs f32 or i32, got {}", inputs[0]));
                }
                let a = axes[0];
                if let Dim::Known(len) = x[a] {
                    if k > len {
                        return Err(format!(
                            "top_k: k {k} is above the length {len} of axis {a} of {}",
                            show(x)
                        ));
                    }
                }
                let mut out = x.clone();
                out[a] = Dim::Known(k);
                return Ok(vec![
                    TensorType {
                        shape: out.clone(),
                        dtype: inputs[0].dtype,
                    },
                    TensorType {
                        shape: out,
                        dtype: DType::I32,
                    },
                ]);
            }
            _ => {}
        }
        need_f32(name, "input", &inputs[0])?;
        if matches!(
            self.kind,
            ReduceKind::Max | ReduceKind::ArgMax | ReduceKind::ArgMin
        ) {
            if let Some(&a) = axes.iter().find(|&&a| x[a] == Dim::Known(0)) {
                return Err(format!(
                    "{name} over axis {a} of {}, which is empty: a maximum of nothing has no value",
                    show(x)
                ));
            }
        }
        let mut out = Vec::new();
        for (i, d) in x.iter().enumerate() {
            if !axes.contains(&i) {
                out.push(d.clone());
            } else if self.keepdims {
                out.push(Dim::Known(1));
            }
        }
        let dtype = if matches!(self.kind, ReduceKind::ArgMax | ReduceKind::ArgMin) {
            DType::I32
        } else {
            DType::F32
        };
        Ok(vec![TensorType { shape: out, dtype }])
    }

    /// Batch rule: reducing (scanning, selecting along) the batch axis couples (the sum
    /// runs over samples); otherwise the batch axis stays, moved down by the reduced axes
    /// before it unless `keepdims`.
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let Some(b) = batch[0] else {
            return Ok(vec![None; outputs.len()]);
        };
        let axes = self.axes(inputs[0].shape.len())?;
        if axes.contains(&b) {
            return Err(format!("{} over axis {b}, the batch axis", self.name()));
        }
        let dropped = if self.keepdims || self.along() {
            0
        } else {
            axes.iter().filter(|&&a| a < b).count()
        };
        Ok(vec![Some(b - dropped); outputs.len()])
    }

    /// Gradient rule. Sum and mean: dy with the reduced axes restored as size 1,
    /// broadcast back to the input's shape (divided by the count for a mean). Max and
    /// min: dy goes to the elements equal to the result, shared evenly between ties (as
    /// PyTorch's `amax`/`amin`). Product: dy·y/x, which is not finite where an input is
    /// exactly 0. L2: dy·x/y, and 0 where the norm y is 0 (PyTorch's subgradient).
    /// Cumsum: the cumulative sum of dy the other way along the axis. Top-k: the values'
    /// dy scattered back to the chosen indices (`gather_elements_grad`). Argmax, argmin and
    /// top-k's indices: piecewise constant, so no gradient flows.
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        if !g.needs(0) || matches!(self.kind, ReduceKind::ArgMax | ReduceKind::ArgMin) {
            return Ok(());
        }
        let x = g.input(0)?;
        let xs = g.shape(&x)?;
        match self.kind {
            ReduceKind::CumSum { exclusive, reverse } => {
                let dy = g.dy()?;
                let a = self.axes(xs.len())?[0];
                let dx = g.emit(
                    "cumsum",
                    serde_json::json!({ "axis": a, "exclusive": exclusive, "reverse": !reverse }),
                    &[&dy],
                )?;
                return g.input_grad(0, dx);
            }
            ReduceKind::TopK { .. } => {
                let Some(dy) = g.output_grad(0) else {
                    return Ok(());
                };
                let a = self.axes(xs.len())?[0];
                let indices = g.output(1)?;
                let zeros = g.zeros(&xs)?;
                let dx = g.emit(
                    "scatter_elements",
                    serde_json::json!({ "axis": a, "reduction": "add" }),
                    &[&zeros, &indices, &dy],
                )?;
                return g.input_grad(0, dx);
            }
            _ => {}
        }
        let dy = g.dy()?;
        let axes = resolve_axes(&self.axes, xs.len())?;
        let kept: Vec<usize> = (0..xs.len())
            .map(|i| if axes.contains(&i) { 1 } else { xs[i] })
            .collect();
        let dk = g.reshape(&dy, &kept)?;
        let dx = match self.kind {
            ReduceKind::Sum => g.expand(&dk, &xs)?,
            ReduceKind::Mean => {
                let count = axes
                    .iter()
                    .try_fold(1usize, |a, &i| a.checked_mul(xs[i]))
                    .ok_or_else(|| format!("the reduced size of {xs:?} overflows"))?;
                let dk = g.scale(&dk, 1.0 / count.max(1) as f32)?;
                g.expand(&dk, &xs)?
            }
            ReduceKind::Prod => {
                let y = g.output(0)?;
                let yk = g.reshape(&y, &kept)?;
                let t = g.binary("mul", &dk, &yk)?;
                let te = g.expand(&t, &xs)?;
                g.binary("div", &te, &x)?
            }
            ReduceKind::L2 => {
                let y = g.output(0)?;
                let yk = g.reshape(&y, &kept)?;
                let zero = g.scalar(0.0)?;
                let at_zero = g.emit("equal", serde_json::json!({}), &[&yk, &zero])?;
                let ratio = g.binary("div", &dk, &yk)?;
                let safe = g.emit("where", serde_json::json!({}), &[&at_zero, &zero, &ratio])?;
                let se = g.expand(&safe, &xs)?;
                g.binary("mul", &x, &se)?
            }
            _ => {
                let y = g.output(0)?;
                let yk = g.reshape(&y, &kept)?;
                let ye = g.expand(&yk, &xs)?;
                let hit = g.emit("equal", serde_json::json!({}), &[&x, &ye])?;
                let mask = g.emit("cast", serde_json::json!({ "to": "f32" }), &[&hit])?;
                let ties = g.sum(&mask, &axes, true)?;
                let share = g.binary("div", &dk, &ties)?;
                g.binary("mul", &mask, &share)?
            }
        };
        g.input_grad(0, dx)
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule, tensor};
    use serde_json::json;

    #[test]
    fn reducing_the_batch_axis_couples() {
        couples(
            rule("reduce_sum", json!({ "axes": [0] }), &[("N,4", Some(0))]),
            &["reduce_sum over axis 0, the batch axis"],
        );
        couples(
            rule("reduce_mean", json!({}), &[("N,4", Some(0))]),
            &["reduce_mean over axis 0"],
        );
        couples(
            rule("reduce_mean", json!({ "axes": [-1] }), &[("4,N", Some(1))]),
            &["axis 1, the batch axis"],
        );
    }

    #[test]
    fn other_reductions_shift_the_batch_axis() {
        let r = |attrs, x| rule("reduce_sum", attrs, &[x]);
        assert_eq!(
            r(json!({ "axes": [1] }), ("N,4", Some(0))),
            Ok(vec![Some(0)])
        );
        let drop = json!({ "axes": [0, 1], "keepdims": false });
        assert_eq!(r(drop, ("4,3,N", Some(2))), Ok(vec![Some(0)]));
        let keep = json!({ "axes": [0, 1], "keepdims": true });
        assert_eq!(r(keep, ("4,3,N", Some(2))), Ok(vec![Some(2)]));
        assert_eq!(
            r(json!({ "axes": [] }), ("N,4", Some(0))),
            Ok(vec![Some(0)])
        );
    }

    #[test]
    fn argmax_and_reduce_max_couple_over_the_batch_axis_only() {
        couples(
            rule("argmax", json!({ "axis": 0 }), &[("N,4", Some(0))]),
            &["argmax over axis 0, the batch axis"],
        );
        couples(
            rule("reduce_max", json!({}), &[("N,4", Some(0))]),
            &["reduce_max over axis 0, the batch axis"],
        );
        assert_eq!(
            rule("argmax", json!({}), &[("N,4", Some(0))]),
            Ok(vec![Some(0)])
        );
        assert_eq!(
            rule("argmax", json!({ "axis": 0 }), &[("4,N,3", Some(1))]),
            Ok(vec![Some(0)])
        );
        assert_eq!(
            rule(
                "argmax",
                json!({ "axis": 0, "keepdims": true }),
                &[("4,N", Some(1))]
            ),
            Ok(vec![Some(1)])
        );
    }

    #[test]
    fn argmax_gives_i32_and_refuses_empty_or_missing_axes() {
        let infer = |op: &str, attrs: serde_json::Value, x: &str| {
            let op = crate::ops::parse(op, attrs.as_object().unwrap()).unwrap();
            op.infer(&[tensor(x)])
        };
        let y = infer("argmax", json!({}), "N,5").unwrap();
        assert_eq!(y[0], tensor("i32:N"));
        let y = infer("argmax", json!({ "axis": 1, "keepdims": true }), "2,5,3").unwrap();
        assert_eq!(y[0], tensor("i32:2,1,3"));
        let e = infer("argmax", json!({ "axis": 1 }), "3,0").unwrap_err();
        assert!(e.contains("axis 1 of [3, 0], which is empty"), "{e}");
        let e = infer("reduce_max", json!({}), "0,2").unwrap_err();
        assert!(e.contains("reduce_max over axis 0"), "{e}");
        assert!(infer("argmax", json!({ "axis": 2 }), "3,4").is_err());
        assert!(infer("argmax", json!({}), "").is_err());
        assert!(infer("argmax", json!({}), "i32:3").is_err());
        assert_eq!(
            infer("reduce_max", json!({ "axes": [0] }), "3,0").unwrap()[0],
            tensor("1,0")
        );
    }

    #[test]
    fn scans_and_selections_couple_along_the_batch_axis_only() {
        couples(
            rule("cumsum", json!({ "axis": 0 }), &[("N,4", Some(0))]),
            &["cumsum over axis 0, the batch axis"],
        );
        couples(
            rule("top_k", json!({ "k": 1, "axis": 0 }), &[("N,4", Some(0))]),
            &["top_k over axis 0, the batch axis"],
        );
        couples(
            rule("argmin", json!({}), &[("N,4", Some(0))]),
            &["argmin over axis 0"],
        );
        assert_eq!(
            rule("cumsum", json!({ "axis": -1 }), &[("N,4", Some(0))]),
            Ok(vec![Some(0)])
        );
        assert_eq!(
            rule("top_k", json!({ "k": 2 }), &[("3,N,4", Some(1))]),
            Ok(vec![Some(1), Some(1)])
        );
        assert_eq!(
            rule(
                "argmin",
                json!({ "axis": 0, "keepdims": false }),
                &[("4,N", Some(1))]
            ),
            Ok(vec![Some(0)])
        );
    }

    #[test]
    fn top_k_and_cumsum_types() {
        let infer = |op: &str, attrs: serde_json::Value, x: &str| {
            let op = crate::ops::parse(op, attrs.as_object().unwrap()).unwrap();
            op.infer(&[tensor(x)])
        };
        let y = infer("top_k", json!({ "k": 2 }), "N,5").unwrap();
        assert_eq!(y, vec![tensor("N,2"), tensor("i32:N,2")]);
        let y = infer("top_k", json!({ "k": 2, "axis": 0 }), "i32:3,5").unwrap();
        assert_eq!(y, vec![tensor("i32:2,5"), tensor("i32:2,5")]);
        let e = infer("top_k", json!({ "k": 6 }), "3,5").unwrap_err();
        assert!(e.contains("k 6 is above the length 5"), "{e}");
        assert_eq!(
            infer("cumsum", json!({ "axis": 0 }), "i32:3").unwrap()[0],
            tensor("i32:3")
        );
        assert!(infer("cumsum", json!({ "axis": 0 }), "bool:3").is_err());
        let e = crate::ops::parse("top_k", json!({ "k": -1 }).as_object().unwrap()).unwrap_err();
        assert!(e.iter().any(|(a, _)| a == "k"), "{e:?}");
        let e = crate::ops::parse("cumsum", json!({}).as_object().unwrap()).unwrap_err();
        assert!(e.iter().any(|(a, _)| a == "axis"), "{e:?}");
    }

    #[test]
    fn axis_0_of_a_scalar_reduces_nothing() {
        let infer = |op: &str| {
            let attrs = json!({ "axes": [0], "keepdims": true });
            let op = crate::ops::parse(op, attrs.as_object().unwrap()).unwrap();
            op.infer(&[tensor("")])
        };
        assert_eq!(infer("reduce_sum").unwrap()[0], tensor(""));
        assert_eq!(infer("reduce_max").unwrap()[0], tensor(""));
    }
}
