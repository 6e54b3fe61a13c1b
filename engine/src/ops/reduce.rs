//! Reduce family: `reduce_sum`, `reduce_mean` and `reduce_max` over any axes, with or
//! without kept dimensions, and `argmax` along one axis. Kernels: `shaders/reduce.wgsl` (a
//! thread per output for short reductions, a workgroup tree per output for long ones;
//! `argmax` is a thread per output).
//!
//! NaN: `reduce_max` propagates it (a slice holding a NaN has maximum NaN, as numpy and
//! PyTorch give) and `argmax` counts NaN above every number, so the index of the first NaN
//! wins (PyTorch's and numpy's behaviour); CPU and GPU agree.

use super::attrs::{optional, AttrKind, AttrReader, AttrSpec};
use super::backward::GradContext;
use super::{need_f32, Arity, OpSchema, TensorType};
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
    /// Index of the first maximum along one axis (i32).
    ArgMax,
}

/// A parsed reduction.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReduceOp {
    /// What it computes.
    pub kind: ReduceKind,
    /// Axes (None: all); `argmax` has exactly one.
    pub axes: Option<Vec<i64>>,
    /// Keep reduced axes as size 1.
    pub keepdims: bool,
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<ReduceOp> {
    let kind = match name {
        "reduce_sum" => ReduceKind::Sum,
        "reduce_mean" => ReduceKind::Mean,
        "reduce_max" => ReduceKind::Max,
        "argmax" => {
            return Some(ReduceOp {
                kind: ReduceKind::ArgMax,
                axes: Some(vec![r.int("axis")]),
                keepdims: r.bool("keepdims"),
            })
        }
        _ => return None,
    };
    Some(ReduceOp {
        kind,
        axes: r.opt_ints("axes"),
        keepdims: r.bool("keepdims"),
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
    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self.kind {
            ReduceKind::Sum => "reduce_sum",
            ReduceKind::Mean => "reduce_mean",
            ReduceKind::Max => "reduce_max",
            ReduceKind::ArgMax => "argmax",
        }
    }

    /// The reduced axes of an input of rank `rank`, sorted: for `argmax` its one axis,
    /// which must exist.
    pub fn axes(&self, rank: usize) -> Result<Vec<usize>, String> {
        if self.kind != ReduceKind::ArgMax {
            return resolve_axes(&self.axes, rank);
        }
        match self.axes.as_deref() {
            Some(&[a]) => shape::existing_axis(a, rank).map(|a| vec![a]),
            _ => Err(format!("argmax takes one axis, got {:?}", self.axes)),
        }
    }

    /// Output type: the input without the reduced axes (or with them as 1), f32 or, for
    /// `argmax`, i32. `reduce_max` and `argmax` refuse an empty reduced axis (a maximum of
    /// nothing has no value).
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        need_f32(name, "input", &inputs[0])?;
        let x = &inputs[0].shape;
        let axes = self.axes(x.len())?;
        if matches!(self.kind, ReduceKind::Max | ReduceKind::ArgMax) {
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
        let dtype = if self.kind == ReduceKind::ArgMax {
            DType::I32
        } else {
            DType::F32
        };
        Ok(vec![TensorType { shape: out, dtype }])
    }

    /// Batch rule: reducing the batch axis couples (the sum runs over samples); otherwise
    /// the batch axis stays, moved down by the reduced axes before it unless `keepdims`.
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        _outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let Some(b) = batch[0] else {
            return Ok(vec![None]);
        };
        let axes = self.axes(inputs[0].shape.len())?;
        if axes.contains(&b) {
            return Err(format!("{} over axis {b}, the batch axis", self.name()));
        }
        let dropped = if self.keepdims {
            0
        } else {
            axes.iter().filter(|&&a| a < b).count()
        };
        Ok(vec![Some(b - dropped)])
    }

    /// Gradient rule. Sum and mean: dy with the reduced axes restored as size 1,
    /// broadcast back to the input's shape (divided by the count for a mean). Max: dy
    /// goes to the elements equal to the maximum, shared evenly between ties (as
    /// PyTorch's `amax`). Argmax: an index, piecewise constant, so no gradient flows.
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        if !g.needs(0) || self.kind == ReduceKind::ArgMax {
            return Ok(());
        }
        let dy = g.dy()?;
        let x = g.input(0)?;
        let xs = g.shape(&x)?;
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
            ReduceKind::Max | ReduceKind::ArgMax => {
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
