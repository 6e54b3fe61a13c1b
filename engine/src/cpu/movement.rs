//! CPU reference of the movement family: views keep the data, copies index it. Every
//! index is computed in `i64` from checked offsets and read with a bounds check, so a
//! wrong shape is an error, never a panic.

use super::unravel;
use crate::ops::movement::{permutation, MovementOp};
use crate::shape;
use crate::tensor::{Tensor, TensorData};

/// Builds a tensor of `shape` whose element i is element `pick(i)` of `src`.
fn gather_elems(
    src: &Tensor,
    shape: Vec<usize>,
    pick: impl Fn(usize) -> Option<usize>,
) -> Result<Tensor, String> {
    let n = shape::numel(&shape)?;
    fn take<T: Copy>(
        v: &[T],
        n: usize,
        pick: impl Fn(usize) -> Option<usize>,
    ) -> Result<Vec<T>, String> {
        (0..n)
            .map(|i| {
                pick(i)
                    .and_then(|j| v.get(j).copied())
                    .ok_or_else(|| format!("element {i} reads outside the input"))
            })
            .collect()
    }
    let data = match &src.data {
        TensorData::F32(v) => TensorData::F32(take(v, n, pick)?),
        TensorData::I32(v) => TensorData::I32(take(v, n, pick)?),
        TensorData::Bool(v) => TensorData::Bool(take(v, n, pick)?),
    };
    Ok(Tensor { shape, data })
}

/// Strides (in elements) as `i64`.
fn signed(strides: &[usize]) -> Result<Vec<i64>, String> {
    strides
        .iter()
        .map(|&s| i64::try_from(s).map_err(|_| format!("stride {s} is too large")))
        .collect()
}

/// Evaluates a movement operator.
pub fn eval(
    op: &MovementOp,
    inputs: &[&Tensor],
    out: &[Vec<usize>],
) -> Result<Vec<Tensor>, String> {
    let (Some(x), Some(o)) = (inputs.first().copied(), out.first().cloned()) else {
        return Err("a movement needs an input and an output shape".into());
    };
    let xs = shape::strides(&x.shape)?;
    let strided = |src_strides: Vec<i64>, base: i64| {
        let dims = o.clone();
        gather_elems(x, o.clone(), move |i| {
            let mut idx = vec![0; dims.len()];
            unravel(i, &dims, &mut idx);
            let offset = idx
                .iter()
                .zip(&src_strides)
                .try_fold(base, |acc, (&c, &s)| {
                    i64::try_from(c).ok()?.checked_mul(s)?.checked_add(acc)
                })?;
            usize::try_from(offset).ok()
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
            let xs = signed(&xs)?;
            vec![strided(p.iter().map(|&i| xs[i]).collect(), 0)?]
        }
        MovementOp::Expand { .. } => {
            vec![strided(
                signed(&shape::broadcast_strides(&x.shape, &o)?)?,
                0,
            )?]
        }
        MovementOp::Slice { .. } => {
            // Element j of the output along a sliced axis is start + j*step of the input.
            let (base, src) = op.slice_offsets(&x.shape)?;
            vec![strided(src, base)?]
        }
        MovementOp::Concat { axis } => {
            let a = shape::existing_axis(*axis, x.shape.len())?;
            let mut pieces: Vec<(usize, usize, Vec<usize>)> = Vec::new();
            let mut offset = 0usize;
            for (k, t) in inputs.iter().enumerate() {
                pieces.push((offset, k, shape::strides(&t.shape)?));
                let len = t
                    .shape
                    .get(a)
                    .copied()
                    .ok_or("concat input lacks the axis")?;
                offset = offset.checked_add(len).ok_or("concat length overflows")?;
            }
            let n = shape::numel(&o)?;
            let all: Vec<Vec<f32>> = inputs.iter().map(|t| t.to_f32_vec()).collect();
            let mut values = Vec::with_capacity(n);
            let mut idx = vec![0; o.len()];
            for i in 0..n {
                unravel(i, &o, &mut idx);
                let (start, k, strides) = pieces
                    .iter()
                    .rev()
                    .find(|(s, _, _)| idx[a] >= *s)
                    .ok_or("concat output outside its inputs")?;
                let mut local = idx.clone();
                local[a] -= start;
                let off = local
                    .iter()
                    .zip(strides)
                    .try_fold(0usize, |acc, (c, s)| c.checked_mul(*s)?.checked_add(acc));
                let value = off
                    .and_then(|off| all.get(*k)?.get(off))
                    .ok_or("concat reads outside an input")?;
                values.push(*value);
            }
            let t = Tensor::f32(o, values);
            vec![match x.data {
                TensorData::F32(_) => t,
                _ => return Err("concat of non-f32 tensors is not supported on the CPU".into()),
            }]
        }
        MovementOp::Split { axis, .. } => {
            let a = shape::existing_axis(*axis, x.shape.len())?;
            let src = signed(&xs)?;
            let mut offset = 0usize;
            let mut parts = Vec::new();
            for shape_j in out {
                let base = offset
                    .checked_mul(xs[a])
                    .and_then(|b| i64::try_from(b).ok())
                    .ok_or("split offsets overflow")?;
                let dims = shape_j.clone();
                let src = src.clone();
                parts.push(gather_elems(x, shape_j.clone(), move |i| {
                    let mut idx = vec![0; dims.len()];
                    unravel(i, &dims, &mut idx);
                    let offset = idx.iter().zip(&src).try_fold(base, |acc, (&c, &s)| {
                        i64::try_from(c).ok()?.checked_mul(s)?.checked_add(acc)
                    })?;
                    usize::try_from(offset).ok()
                })?);
                let len = shape_j
                    .get(a)
                    .copied()
                    .ok_or("split output lacks the axis")?;
                offset = offset.checked_add(len).ok_or("split offsets overflow")?;
            }
            parts
        }
        MovementOp::Gather { axis } => {
            let a = shape::existing_axis(*axis, x.shape.len())?;
            let len = x.shape[a];
            let Some(TensorData::I32(indices)) = inputs.get(1).map(|t| &t.data) else {
                return Err("gather indices must be i32".into());
            };
            let mut resolved = Vec::with_capacity(indices.len());
            for &k in indices {
                let kk = if k < 0 {
                    i64::from(k) + i64::try_from(len).unwrap_or(i64::MAX)
                } else {
                    i64::from(k)
                };
                match usize::try_from(kk) {
                    Ok(r) if r < len => resolved.push(r),
                    _ => {
                        return Err(format!(
                            "gather index {k} is out of range for axis length {len}"
                        ))
                    }
                }
            }
            let inner = shape::numel(&x.shape[a + 1..])?.max(1);
            let count = resolved.len().max(1);
            vec![gather_elems(x, o, |i| {
                let r = i % inner;
                let j = (i / inner) % count;
                let outer = i / inner.checked_mul(count)?;
                outer
                    .checked_mul(len)?
                    .checked_add(*resolved.get(j)?)?
                    .checked_mul(inner)?
                    .checked_add(r)
            })?]
        }
    })
}
