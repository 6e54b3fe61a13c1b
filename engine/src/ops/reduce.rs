//! Reduce family: `reduce_sum` and `reduce_mean` over any axes, with or without kept
//! dimensions. Kernels: `shaders/reduce.wgsl` (a thread per output for short reductions, a
//! workgroup tree per output for long ones).

use super::attrs::{optional, AttrKind, AttrReader, AttrSpec};
use super::backward::GradContext;
use super::{need_f32, Arity, OpSchema, TensorType};
use crate::shape::{self, Dim};

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

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    OpSchema {
        name: "reduce_sum",
        family: FAMILY,
        doc: "Sum over axes.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: ATTRS,
        params: &[],
    },
    OpSchema {
        name: "reduce_mean",
        family: FAMILY,
        doc: "Mean over axes.",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: ATTRS,
        params: &[],
    },
];

/// A parsed reduction.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReduceOp {
    /// Mean instead of sum.
    pub mean: bool,
    /// Axes (None: all).
    pub axes: Option<Vec<i64>>,
    /// Keep reduced axes as size 1.
    pub keepdims: bool,
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<ReduceOp> {
    let mean = match name {
        "reduce_sum" => false,
        "reduce_mean" => true,
        _ => return None,
    };
    Some(ReduceOp {
        mean,
        axes: r.opt_ints("axes"),
        keepdims: r.bool("keepdims"),
    })
}

/// Resolves reduction axes to a sorted set of distinct non-negative axes.
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
    Ok(out)
}

impl ReduceOp {
    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        if self.mean {
            "reduce_mean"
        } else {
            "reduce_sum"
        }
    }

    /// Output type.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        need_f32(self.name(), "input", &inputs[0])?;
        let x = &inputs[0].shape;
        let axes = resolve_axes(&self.axes, x.len())?;
        let mut out = Vec::new();
        for (i, d) in x.iter().enumerate() {
            if !axes.contains(&i) {
                out.push(d.clone());
            } else if self.keepdims {
                out.push(Dim::Known(1));
            }
        }
        Ok(vec![TensorType::f32(out)])
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
        let axes = resolve_axes(&self.axes, inputs[0].shape.len())?;
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

    /// Gradient rule: dy with the reduced axes restored as size 1, broadcast back to the
    /// input's shape (divided by the count for a mean).
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        if !g.needs(0) {
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
        let dk = if self.mean {
            let count = axes
                .iter()
                .try_fold(1usize, |a, &i| a.checked_mul(xs[i]))
                .ok_or_else(|| format!("the reduced size of {xs:?} overflows"))?;
            g.scale(&dk, 1.0 / count.max(1) as f32)?
        } else {
            dk
        };
        let dx = g.expand(&dk, &xs)?;
        g.input_grad(0, dx)
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule};
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
}
