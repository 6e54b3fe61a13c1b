//! Matmul family: `matmul` (numpy semantics: batched, broadcast, 1-D promotion) and
//! `linear` (x · weight + bias, weight stored [in, out]). Kernels: `shaders/matmul.wgsl`.

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec};
use super::backward::{GradContext, Ref};
use super::{need_f32, Arity, Init, OpSchema, ParamSpec, TensorType};
use crate::shape::{broadcast, broadcast_strides, numel, show, Dim};
use serde_json::json;

/// Family tag.
pub const FAMILY: &str = "matmul";

const LINEAR_ATTRS: &[AttrSpec] = &[
    required("out_features", AttrKind::Int, "Size of each output row."),
    optional("bias", AttrKind::Bool, "true", "Add a learned bias."),
];

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    OpSchema {
        name: "matmul",
        family: FAMILY,
        doc: "Matrix product with numpy semantics: batched over leading axes, broadcasting them.",
        inputs: Arity::Fixed(&["a", "b"]),
        outputs: &["y"],
        attrs: &[],
        params: &[],
    },
    OpSchema {
        name: "linear",
        family: FAMILY,
        doc: "Fully connected layer: y = x · weight + bias, weight [in, out].",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: LINEAR_ATTRS,
        params: &["weight", "bias"],
    },
];

/// A parsed matmul-family operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum MatMulOp {
    /// `matmul`.
    MatMul,
    /// `linear`.
    Linear {
        /// Output features.
        out_features: usize,
        /// Whether a bias is added.
        bias: bool,
    },
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<MatMulOp> {
    match name {
        "matmul" => return Some(MatMulOp::MatMul),
        "linear" => {}
        _ => return None,
    }
    Some(MatMulOp::Linear {
        out_features: r.size("out_features", 1),
        bias: r.bool("bias"),
    })
}

/// The logical shapes of a matmul after 1-D promotion: (batch dims of a, of b, M, K, K of b, N).
struct Operands<'a> {
    a_batch: &'a [Dim],
    b_batch: &'a [Dim],
    m: Option<&'a Dim>,
    k_a: &'a Dim,
    k_b: &'a Dim,
    n: Option<&'a Dim>,
}

fn operands<'a>(a: &'a [Dim], b: &'a [Dim]) -> Result<Operands<'a>, String> {
    if a.is_empty() || b.is_empty() {
        return Err("matmul needs inputs of rank 1 or more".into());
    }
    let (a_batch, m, k_a) = if a.len() == 1 {
        (&a[..0], None, &a[0])
    } else {
        (&a[..a.len() - 2], Some(&a[a.len() - 2]), &a[a.len() - 1])
    };
    let (b_batch, k_b, n) = if b.len() == 1 {
        (&b[..0], &b[0], None)
    } else {
        (&b[..b.len() - 2], &b[b.len() - 2], Some(&b[b.len() - 1]))
    };
    Ok(Operands {
        a_batch,
        b_batch,
        m,
        k_a,
        k_b,
        n,
    })
}

impl MatMulOp {
    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self {
            MatMulOp::MatMul => "matmul",
            MatMulOp::Linear { .. } => "linear",
        }
    }

    /// Output types.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        for (t, which) in inputs.iter().zip(["a", "b"]) {
            need_f32(self.name(), which, t)?;
        }
        match self {
            MatMulOp::MatMul => {
                let (a, b) = (&inputs[0].shape, &inputs[1].shape);
                let o = operands(a, b)?;
                if o.k_a != o.k_b {
                    return Err(format!(
                        "inner dimensions differ: a {} has K = {}, b {} has K = {}",
                        show(a),
                        o.k_a,
                        show(b),
                        o.k_b
                    ));
                }
                let mut out = broadcast(o.a_batch, o.b_batch)
                    .map_err(|e| format!("batch dimensions: {e}"))?;
                out.extend(o.m.cloned());
                out.extend(o.n.cloned());
                Ok(vec![TensorType::f32(out)])
            }
            MatMulOp::Linear { out_features, .. } => {
                let x = &inputs[0].shape;
                match x.last() {
                    None => Err("linear needs an input of rank 1 or more".into()),
                    Some(Dim::Sym(s)) => Err(format!(
                        "linear needs a known last dimension (in_features), got '{s}' in {}",
                        show(x)
                    )),
                    Some(Dim::Known(0)) => Err(format!(
                        "linear needs at least one input feature, got a last dimension of 0 in {}",
                        show(x)
                    )),
                    Some(Dim::Known(_)) => {
                        let mut out = x.clone();
                        out.pop();
                        out.push(Dim::Known(*out_features));
                        Ok(vec![TensorType::f32(out)])
                    }
                }
            }
        }
    }

    /// Batch rule: a batch on a's rows (M) or leading axes, or on b's columns (N) or
    /// leading axes, lands on the matching output axis; a batch on a contracted axis (K)
    /// couples (xᵀx sums over samples), and so do two batches landing on different output
    /// axes (x·yᵀ pairs every sample with every other). `linear` keeps any axis but the
    /// last, which it contracts.
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        _outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let name = self.name();
        let contracts =
            |which: &str, a: usize| format!("{name} contracts axis {a} of {which}, the batch axis");
        if let MatMulOp::Linear { .. } = self {
            let rank = inputs[0].shape.len();
            return match batch[0] {
                Some(a) if a + 1 == rank => Err(contracts("x", a)),
                other => Ok(vec![other]),
            };
        }
        let (a, b) = (&inputs[0].shape, &inputs[1].shape);
        let o = operands(a, b)?;
        let lead = o.a_batch.len().max(o.b_batch.len());
        let m_out = o.m.map(|_| lead);
        let n_out = o.n.map(|_| lead + usize::from(o.m.is_some()));
        // Output axis of a's axis i, or the contraction.
        let from_a = |i: usize| -> Result<usize, String> {
            if i < o.a_batch.len() {
                Ok(lead - o.a_batch.len() + i)
            } else if i + 1 == a.len() {
                Err(contracts("a", i))
            } else {
                m_out.ok_or_else(|| contracts("a", i))
            }
        };
        let from_b = |i: usize| -> Result<usize, String> {
            if i < o.b_batch.len() {
                Ok(lead - o.b_batch.len() + i)
            } else if i + 1 == b.len() && b.len() >= 2 {
                n_out.ok_or_else(|| contracts("b", i))
            } else {
                Err(contracts("b", i))
            }
        };
        let on_a = batch[0].map(from_a).transpose()?;
        let on_b = batch[1].map(from_b).transpose()?;
        match (on_a, on_b) {
            (Some(x), Some(y)) if x != y => Err(format!(
                "{name} pairs the batch of a (output axis {x}) with the batch of b (output axis {y}): every sample meets every other"
            )),
            (x, y) => Ok(vec![x.or(y)]),
        }
    }

    /// Weights of `linear`.
    pub fn params(&self, inputs: &[TensorType]) -> Result<Vec<ParamSpec>, String> {
        let MatMulOp::Linear { out_features, bias } = self else {
            return Ok(Vec::new());
        };
        let fan_in = inputs[0].shape.last().and_then(Dim::known).unwrap_or(1);
        let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
        let mut specs = vec![ParamSpec {
            name: "weight",
            shape: vec![fan_in, *out_features],
            init: Init::Uniform(bound),
        }];
        if *bias {
            specs.push(ParamSpec {
                name: "bias",
                shape: vec![*out_features],
                init: Init::Uniform(bound),
            });
        }
        Ok(specs)
    }

    /// Gradient rule. `linear`: dx = dy·Wᵀ, dW = xᵀ·dy over every row, db = dy summed
    /// over every row. `matmul`: da = dy·bᵀ, db = aᵀ·dy on the 1-D-promoted operands,
    /// with broadcast batch axes summed back.
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        let dy = g.dy()?;
        let x = g.input(0)?;
        let xs = g.shape(&x)?;
        let ys = g.shape(&dy)?;
        match self {
            MatMulOp::Linear { bias, .. } => {
                let (Some(&in_f), Some(&out_f)) = (xs.last(), ys.last()) else {
                    return Err("linear needs inputs of rank 1 or more".into());
                };
                if g.needs(0) {
                    let w = g.param("weight")?;
                    let wt = g.emit("transpose", json!({ "perm": [1, 0] }), &[&w])?;
                    let dx = g.emit("matmul", json!({}), &[&dy, &wt])?;
                    g.input_grad(0, dx)?;
                }
                let rows = checked_product(&xs[..xs.len() - 1])?;
                let x2 = g.reshape(&x, &[rows, in_f])?;
                let dy2 = g.reshape(&dy, &[rows, out_f])?;
                let xt = g.emit("transpose", json!({ "perm": [1, 0] }), &[&x2])?;
                let dw = g.emit("matmul", json!({}), &[&xt, &dy2])?;
                g.param_grad("weight", dw)?;
                if *bias {
                    let lead: Vec<usize> = (0..ys.len() - 1).collect();
                    let db = g.sum(&dy, &lead, false)?;
                    g.param_grad("bias", db)?;
                }
                Ok(())
            }
            MatMulOp::MatMul => {
                let b = g.input(1)?;
                let bs = g.shape(&b)?;
                let (Some(&k), Some(&kb)) = (xs.last(), bs.get(bs.len().saturating_sub(2))) else {
                    return Err("matmul needs inputs of rank 1 or more".into());
                };
                let a2s = if xs.len() == 1 {
                    vec![1, k]
                } else {
                    xs.clone()
                };
                let b2s = if bs.len() == 1 {
                    vec![kb, 1]
                } else {
                    bs.clone()
                };
                let problem = batched_problem(&a2s, &b2s)?;
                let (ba, bb) = (&a2s[..a2s.len() - 2], &b2s[..b2s.len() - 2]);
                let mut y2s = broadcast_dims(ba, bb)?;
                y2s.extend([problem.m, problem.n]);
                let dy2 = g.reshape(&dy, &y2s)?;
                if g.needs(0) {
                    let b2 = g.reshape(&b, &b2s)?;
                    let bt = transpose_last2(g, &b2, b2s.len())?;
                    let da = g.emit("matmul", json!({}), &[&dy2, &bt])?;
                    let da = g.unbroadcast(&da, &a2s)?;
                    let da = g.reshape(&da, &xs)?;
                    g.input_grad(0, da)?;
                }
                if g.needs(1) {
                    let a2 = g.reshape(&x, &a2s)?;
                    let at = transpose_last2(g, &a2, a2s.len())?;
                    let db = g.emit("matmul", json!({}), &[&at, &dy2])?;
                    let db = g.unbroadcast(&db, &b2s)?;
                    let db = g.reshape(&db, &bs)?;
                    g.input_grad(1, db)?;
                }
                Ok(())
            }
        }
    }

    /// 2·M·N·K per product (saturating: a cost, never a size).
    pub fn flops(&self, inputs: &[Vec<usize>], outputs: &[Vec<usize>]) -> u64 {
        let k = inputs
            .first()
            .and_then(|a| a.last())
            .map_or(1, |&k| super::widen(k));
        let out = outputs.first().map_or(0, |o| super::product(o));
        2u64.saturating_mul(k).saturating_mul(out)
    }
}

/// The product of concrete sizes, checked.
fn checked_product(dims: &[usize]) -> Result<usize, String> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("the product of {dims:?} overflows"))
}

/// numpy broadcasting of two concrete batch shapes.
fn broadcast_dims(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let rank = a.len().max(b.len());
    (0..rank)
        .map(|i| {
            let da = (i + a.len()).checked_sub(rank).map_or(1, |j| a[j]);
            let db = (i + b.len()).checked_sub(rank).map_or(1, |j| b[j]);
            match (da, db) {
                (x, y) if x == y || y == 1 => Ok(x),
                (1, y) => Ok(y),
                _ => Err(format!("batch dimensions {a:?} and {b:?} do not broadcast")),
            }
        })
        .collect()
}

/// `v` (of rank `rank` ≥ 2) with its last two axes swapped.
fn transpose_last2(g: &mut dyn GradContext, v: &str, rank: usize) -> Result<Ref, String> {
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(rank - 2, rank - 1);
    g.emit("transpose", json!({ "perm": perm }), &[v])
}

/// A batched matmul problem: sizes and per-batch element offsets of A and B.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// (A offset, B offset) of each batch, in elements.
    pub offsets: Vec<(usize, usize)>,
}

/// The batched problem of numpy matmul on concrete shapes (offsets checked).
pub fn batched_problem(a: &[usize], b: &[usize]) -> Result<Problem, String> {
    let a2: Vec<usize> = match a {
        [] => return Err("matmul needs inputs of rank 1 or more".into()),
        [k] => vec![1, *k],
        _ => a.to_vec(),
    };
    let b2: Vec<usize> = match b {
        [] => return Err("matmul needs inputs of rank 1 or more".into()),
        [k] => vec![*k, 1],
        _ => b.to_vec(),
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let n = b2[b2.len() - 1];
    let (ab, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let rank = ab.len().max(bb.len());
    let mut out_batch = vec![1; rank];
    for i in 0..rank {
        let da = if i + ab.len() >= rank {
            ab[i + ab.len() - rank]
        } else {
            1
        };
        let db = if i + bb.len() >= rank {
            bb[i + bb.len() - rank]
        } else {
            1
        };
        out_batch[i] = da.max(db);
    }
    let sa = broadcast_strides(ab, &out_batch)?;
    let sb = broadcast_strides(bb, &out_batch)?;
    let count = numel(&out_batch)?;
    let overflow = || format!("matmul of {a:?} and {b:?} overflows");
    let (mk, kn) = (
        m.checked_mul(k).ok_or_else(overflow)?,
        k.checked_mul(n).ok_or_else(overflow)?,
    );
    let mut offsets = Vec::with_capacity(count);
    for idx in 0..count {
        let (mut rem, mut oa, mut ob) = (idx, 0usize, 0usize);
        for d in (0..rank).rev() {
            let len = out_batch[d].max(1);
            let c = rem % len;
            rem /= len;
            oa = c
                .checked_mul(sa[d])
                .and_then(|x| x.checked_add(oa))
                .ok_or_else(overflow)?;
            ob = c
                .checked_mul(sb[d])
                .and_then(|x| x.checked_add(ob))
                .ok_or_else(overflow)?;
        }
        let offset = oa.checked_mul(mk).zip(ob.checked_mul(kn));
        offsets.push(offset.ok_or_else(overflow)?);
    }
    Ok(Problem { m, n, k, offsets })
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule};
    use crate::ops::TensorType;
    use crate::shape::Dim;
    use serde_json::json;

    #[test]
    fn matmul_keeps_rows_columns_and_leading_axes() {
        let m = |a, b| rule("matmul", json!({}), &[a, b]);
        assert_eq!(m(("N,4", Some(0)), ("4,8", None)), Ok(vec![Some(0)]));
        assert_eq!(m(("3,4", None), ("4,N", Some(1))), Ok(vec![Some(1)]));
        // 1-D promotion: a vector times batched columns, batched rows times a vector.
        assert_eq!(m(("4", None), ("4,N", Some(1))), Ok(vec![Some(0)]));
        assert_eq!(m(("N,4", Some(0)), ("4", None)), Ok(vec![Some(0)]));
        // Leading axes, broadcast against fewer or size-1 leading axes of the other side.
        assert_eq!(m(("N,3,4", Some(0)), ("4,5", None)), Ok(vec![Some(0)]));
        assert_eq!(m(("N,1,3,4", Some(0)), ("7,4,5", None)), Ok(vec![Some(0)]));
        assert_eq!(m(("5,3,4", None), ("N,1,4,2", Some(0))), Ok(vec![Some(0)]));
        // Both batched on the same leading axis: a product per sample.
        assert_eq!(m(("N,3,4", Some(0)), ("N,4,5", Some(0))), Ok(vec![Some(0)]));
    }

    #[test]
    fn matmul_couples_contractions_and_pairings() {
        let m = |a, b| rule("matmul", json!({}), &[a, b]);
        // xᵀx: the batch is a's K and b's K.
        couples(
            m(("4,N", Some(1)), ("N,4", Some(0))),
            &["matmul", "axis 1 of a"],
        );
        couples(
            m(("4,N", Some(1)), ("N,4", None)),
            &["contracts axis 1 of a"],
        );
        couples(
            m(("3,N", None), ("N,4", Some(0))),
            &["contracts axis 0 of b"],
        );
        couples(m(("N", Some(0)), ("N,4", None)), &["contracts axis 0 of a"]);
        // x·yᵀ: every sample paired with every other.
        couples(
            m(("N,4", Some(0)), ("4,N", Some(1))),
            &["output axis 0", "output axis 1"],
        );
    }

    #[test]
    fn linear_keeps_every_axis_but_the_last() {
        let l = |x| rule("linear", json!({ "out_features": 3 }), &[x]);
        assert_eq!(l(("N,4", Some(0))), Ok(vec![Some(0)]));
        assert_eq!(l(("2,N,4", Some(1))), Ok(vec![Some(1)]));
        couples(l(("2,4", Some(1))), &["linear", "axis 1"]);
    }

    #[test]
    fn linear_without_input_features_is_refused() {
        // Found by the plan fuzzer: x [N, 0] reached the GPU lowering, which counted no
        // rows (0 / 0) and would have left the output unwritten.
        let op = crate::ops::parse("linear", json!({ "out_features": 5 }).as_object().unwrap())
            .expect("parses");
        let x = TensorType::f32(vec![Dim::Sym("N".into()), Dim::Known(0)]);
        let e = op.infer(&[x]).unwrap_err();
        assert!(e.contains("at least one input feature"), "{e}");
    }
}
