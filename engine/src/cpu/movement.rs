//! CPU reference of the movement family: views keep the data, copies index it. Every
//! index is computed in `i64` from checked offsets and read with a bounds check, so a
//! wrong shape is an error, never a panic.

use super::{unravel, Float, Host};
use crate::ops::movement::{permutation, MovementOp, PadMode};
use crate::shape;

/// Builds a tensor of `shape` whose element i is element `pick(i)` of `src`.
fn gather_elems<T: Host>(
    src: &T,
    shape: Vec<usize>,
    pick: impl Fn(usize) -> Option<usize>,
) -> Result<T, String> {
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
    match (src.floats(), src.ints(), src.bools()) {
        (Some(v), _, _) => Ok(T::from_floats(shape, take(v, n, pick)?)),
        (_, Some(v), _) => Ok(T::from_ints(shape, take(v, n, pick)?)),
        (_, _, Some(v)) => Ok(T::from_bools(shape, take(v, n, pick)?)),
        _ => Err("a tensor holds no elements of a known type".into()),
    }
}

/// Strides (in elements) as `i64`.
fn signed(strides: &[usize]) -> Result<Vec<i64>, String> {
    strides
        .iter()
        .map(|&s| i64::try_from(s).map_err(|_| format!("stride {s} is too large")))
        .collect()
}

/// Evaluates a movement operator.
pub fn eval<T: Host>(op: &MovementOp, inputs: &[&T], out: &[Vec<usize>]) -> Result<Vec<T>, String> {
    let (Some(x), Some(o)) = (inputs.first().copied(), out.first().cloned()) else {
        return Err("a movement needs an input and an output shape".into());
    };
    let xs = shape::strides(x.shape())?;
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
        MovementOp::Blocks { .. } => {
            let (domain, src) = op.block_view(&shape::known(x.shape()))?;
            let src = signed(&src)?;
            vec![gather_elems(x, o, |i| {
                let mut idx = vec![0; domain.len()];
                unravel(i, &domain, &mut idx);
                idx.iter().zip(&src).try_fold(0usize, |acc, (&c, &s)| {
                    usize::try_from(s).ok()?.checked_mul(c)?.checked_add(acc)
                })
            })?]
        }
        MovementOp::Pad {
            mode,
            constant_value,
            ..
        } => vec![pad(
            x,
            &o,
            &op.pad_pairs(x.shape().len())?,
            *mode,
            *constant_value,
        )?],
        MovementOp::Reshape { .. }
        | MovementOp::Flatten { .. }
        | MovementOp::Squeeze { .. }
        | MovementOp::Unsqueeze { .. }
        | MovementOp::Identity { .. } => vec![x.reshaped(o)],
        MovementOp::Transpose { perm } => {
            let p = permutation(perm, x.shape().len())?;
            let xs = signed(&xs)?;
            vec![strided(p.iter().map(|&i| xs[i]).collect(), 0)?]
        }
        MovementOp::Expand { .. } => {
            vec![strided(
                signed(&shape::broadcast_strides(x.shape(), &o)?)?,
                0,
            )?]
        }
        MovementOp::Slice { .. } => {
            // Element j of the output along a sliced axis is start + j*step of the input.
            let (base, src) = op.slice_offsets(x.shape())?;
            vec![strided(src, base)?]
        }
        MovementOp::Concat { axis } => {
            let a = shape::existing_axis(*axis, x.shape().len())?;
            let mut pieces: Vec<(usize, usize, Vec<usize>)> = Vec::new();
            let mut offset = 0usize;
            for (k, t) in inputs.iter().enumerate() {
                pieces.push((offset, k, shape::strides(t.shape())?));
                let len = t
                    .shape()
                    .get(a)
                    .copied()
                    .ok_or("concat input lacks the axis")?;
                offset = offset.checked_add(len).ok_or("concat length overflows")?;
            }
            let n = shape::numel(&o)?;
            let all: Vec<Vec<T::F>> = inputs.iter().map(|t| t.to_floats()).collect();
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
            if x.floats().is_none() {
                return Err("concat of non-f32 tensors is not supported on the CPU".into());
            }
            vec![T::from_floats(o, values)]
        }
        MovementOp::Split { axis, .. } => {
            let a = shape::existing_axis(*axis, x.shape().len())?;
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
            let a = shape::existing_axis(*axis, x.shape().len())?;
            let len = x.shape()[a];
            let Some(indices) = inputs.get(1).and_then(|t| t.ints()) else {
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
            let inner = shape::numel(&x.shape()[a + 1..])?.max(1);
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

/// `pad`: element i of the output is the input element its position maps to along every
/// axis ([`PadMode::source`]), or the constant when one axis maps outside.
fn pad<T: Host>(
    x: &T,
    out: &[usize],
    pairs: &[(i64, i64)],
    mode: PadMode,
    constant: f32,
) -> Result<T, String> {
    let dims = x.shape();
    let n = shape::numel(out)?;
    let mut idx = vec![0; out.len()];
    let mut sources = Vec::with_capacity(n);
    for i in 0..n {
        unravel(i, out, &mut idx);
        let mut offset = Some(0usize);
        for (a, (&o, &(begin, _))) in idx.iter().zip(pairs).enumerate() {
            let len = i64::try_from(dims[a]).map_err(|_| "axis too long")?;
            let p = i64::try_from(o).map_err(|_| "axis too long")? - begin;
            offset = match (offset, mode.source(p, len)) {
                (Some(off), Some(s)) => Some(
                    off.checked_mul(dims[a])
                        .and_then(|v| v.checked_add(usize::try_from(s).ok()?))
                        .ok_or("pad offsets overflow")?,
                ),
                _ => None,
            };
        }
        sources.push(offset);
    }
    fn fill<V: Copy>(v: &[V], sources: &[Option<usize>], c: V) -> Result<Vec<V>, String> {
        sources
            .iter()
            .map(|s| match s {
                Some(j) => v
                    .get(*j)
                    .copied()
                    .ok_or_else(|| "pad reads outside the input".into()),
                None => Ok(c),
            })
            .collect()
    }
    match (x.floats(), x.ints()) {
        (Some(v), _) => Ok(T::from_floats(
            out.to_vec(),
            fill(v, &sources, T::F::from_f32(constant))?,
        )),
        // Rust's `as`: truncation toward zero, saturating.
        (_, Some(v)) => Ok(T::from_ints(
            out.to_vec(),
            fill(v, &sources, constant as i32)?,
        )),
        _ => Err("pad takes f32 or i32 tensors".into()),
    }
}
