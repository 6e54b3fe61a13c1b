//! CPU reference of the movement family: views keep the data, copies index it.

use super::unravel;
use crate::ops::movement::{permutation, MovementOp};
use crate::shape;
use crate::tensor::{Tensor, TensorData};

/// Builds a tensor of `shape` whose element i is element `pick(i)` of `src`.
fn gather_elems(src: &Tensor, shape: Vec<usize>, pick: impl Fn(usize) -> usize) -> Tensor {
    let n: usize = shape.iter().product();
    let data = match &src.data {
        TensorData::F32(v) => TensorData::F32((0..n).map(|i| v[pick(i)]).collect()),
        TensorData::I32(v) => TensorData::I32((0..n).map(|i| v[pick(i)]).collect()),
        TensorData::Bool(v) => TensorData::Bool((0..n).map(|i| v[pick(i)]).collect()),
    };
    Tensor { shape, data }
}

/// Evaluates a movement operator.
pub fn eval(
    op: &MovementOp,
    inputs: &[&Tensor],
    out: &[Vec<usize>],
) -> Result<Vec<Tensor>, String> {
    let x = inputs[0];
    let xs = shape::strides(&x.shape);
    let o = out[0].clone();
    let strided = |src_strides: Vec<i64>, base: i64| {
        let dims = o.clone();
        gather_elems(x, o.clone(), move |i| {
            let mut idx = vec![0; dims.len()];
            unravel(i, &dims, &mut idx);
            (base
                + idx
                    .iter()
                    .zip(&src_strides)
                    .map(|(&c, &s)| c as i64 * s)
                    .sum::<i64>()) as usize
        })
    };
    Ok(match op {
        MovementOp::Reshape { .. }
        | MovementOp::Flatten { .. }
        | MovementOp::Squeeze { .. }
        | MovementOp::Unsqueeze { .. }
        | MovementOp::Identity { .. } => vec![Tensor {
            shape: o,
            data: x.data.clone(),
        }],
        MovementOp::Transpose { perm } => {
            let p = permutation(perm, x.shape.len())?;
            vec![strided(p.iter().map(|&i| xs[i] as i64).collect(), 0)]
        }
        MovementOp::Expand { .. } => {
            vec![strided(
                shape::broadcast_strides(&x.shape, &o)
                    .iter()
                    .map(|&s| s as i64)
                    .collect(),
                0,
            )]
        }
        MovementOp::Slice {
            starts,
            axes,
            steps,
            ..
        } => {
            // Element j of the output along a sliced axis is start + j*step of the input.
            let mut src: Vec<i64> = xs.iter().map(|&s| s as i64).collect();
            let mut base = 0i64;
            let n = starts.len();
            for k in 0..n {
                let a = match axes {
                    Some(list) => shape::axis(list[k], x.shape.len())?,
                    None => k,
                };
                let d = x.shape[a] as i64;
                let step = steps.as_ref().map_or(1, |s| s[k]);
                let mut s = starts[k];
                if s < 0 {
                    s += d;
                }
                let s = if step > 0 {
                    s.clamp(0, d)
                } else {
                    s.clamp(0, (d - 1).max(0))
                };
                base += s * xs[a] as i64;
                src[a] = step * xs[a] as i64;
            }
            vec![strided(src, base)]
        }
        MovementOp::Concat { axis } => {
            let a = shape::axis(*axis, x.shape.len())?;
            let mut pieces: Vec<(usize, usize, &Tensor)> = Vec::new();
            let mut offset = 0;
            for (k, t) in inputs.iter().enumerate() {
                pieces.push((offset, k, t));
                offset += t.shape[a];
            }
            let n: usize = o.iter().product();
            let all: Vec<Vec<f32>> = inputs.iter().map(|t| t.to_f32_vec()).collect();
            let mut values = Vec::with_capacity(n);
            let mut idx = vec![0; o.len()];
            for i in 0..n {
                unravel(i, &o, &mut idx);
                let (start, k, t) = pieces
                    .iter()
                    .rev()
                    .find(|(s, _, _)| idx[a] >= *s)
                    .copied()
                    .unwrap_or(pieces[0]);
                let mut local = idx.clone();
                local[a] -= start;
                let off: usize = local
                    .iter()
                    .zip(shape::strides(&t.shape))
                    .map(|(c, s)| c * s)
                    .sum();
                values.push(all[k][off]);
            }
            let t = Tensor::f32(o, values);
            vec![match x.data {
                TensorData::F32(_) => t,
                _ => return Err("concat of non-f32 tensors is not supported on the CPU".into()),
            }]
        }
        MovementOp::Split { axis, .. } => {
            let a = shape::axis(*axis, x.shape.len())?;
            let mut offset = 0;
            let mut parts = Vec::new();
            for shape_j in out {
                let base = (offset * xs[a]) as i64;
                let dims = shape_j.clone();
                let src: Vec<i64> = xs.iter().map(|&s| s as i64).collect();
                parts.push(gather_elems(x, shape_j.clone(), move |i| {
                    let mut idx = vec![0; dims.len()];
                    unravel(i, &dims, &mut idx);
                    (base
                        + idx
                            .iter()
                            .zip(&src)
                            .map(|(&c, &s)| c as i64 * s)
                            .sum::<i64>()) as usize
                }));
                offset += shape_j[a];
            }
            parts
        }
        MovementOp::Gather { axis } => {
            let a = shape::axis(*axis, x.shape.len())?;
            let len = x.shape[a];
            let TensorData::I32(indices) = &inputs[1].data else {
                return Err("gather indices must be i32".into());
            };
            let mut resolved = Vec::with_capacity(indices.len());
            for &k in indices {
                let kk = if k < 0 { k + len as i32 } else { k };
                if kk < 0 || kk as usize >= len {
                    return Err(format!(
                        "gather index {k} is out of range for axis length {len}"
                    ));
                }
                resolved.push(kk as usize);
            }
            let inner: usize = x.shape[a + 1..].iter().product();
            let count = resolved.len().max(1);
            vec![gather_elems(x, o, |i| {
                let r = i % inner.max(1);
                let j = (i / inner.max(1)) % count;
                let outer = i / (inner.max(1) * count);
                (outer * len + resolved[j]) * inner + r
            })]
        }
    })
}
