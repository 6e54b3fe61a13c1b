//! CPU reference of the indexing family. Data is f32 (the float type of the run) or i32;
//! every index is resolved against its axis (negative ones count from the end) and one
//! outside it is an error naming it, never a read or write out of bounds.

use super::{unravel, Float, Host};
use crate::dtype::DType;
use crate::ops::indexing::{range_len, shape_axes, IndexingOp, Reduction};
use crate::shape;
use std::ops::{Add, Mul};

/// A host tensor's elements, of the two types the family handles.
enum Elems<'a, F> {
    Floats(&'a [F]),
    Ints(&'a [i32]),
}

fn elems<T: Host>(t: &T) -> Result<Elems<'_, T::F>, String> {
    match (t.floats(), t.ints()) {
        (Some(v), _) => Ok(Elems::Floats(v)),
        (_, Some(v)) => Ok(Elems::Ints(v)),
        _ => Err(format!("expected f32 or i32 data, got {}", t.dtype())),
    }
}

fn indices<T: Host>(t: &T) -> Result<&[i32], String> {
    t.ints()
        .ok_or_else(|| format!("indices must be i32, got {}", t.dtype()))
}

/// Index `k` resolved against an axis of length `len`.
fn resolve(k: i32, len: usize, what: &str) -> Result<usize, String> {
    let kk = if k < 0 {
        i64::from(k) + i64::try_from(len).unwrap_or(i64::MAX)
    } else {
        i64::from(k)
    };
    match usize::try_from(kk) {
        Ok(r) if r < len => Ok(r),
        _ => Err(format!(
            "{what} index {k} is out of range for axis length {len}"
        )),
    }
}

/// A tensor of `shape` whose element i is element `src[i]` of `x`, or zero for None.
fn pick<T: Host>(x: &T, shape: Vec<usize>, src: &[Option<usize>]) -> Result<T, String> {
    fn take<V: Copy>(v: &[V], src: &[Option<usize>], zero: V) -> Result<Vec<V>, String> {
        src.iter()
            .map(|s| match s {
                Some(j) => v
                    .get(*j)
                    .copied()
                    .ok_or_else(|| format!("element {j} is outside the input")),
                None => Ok(zero),
            })
            .collect()
    }
    Ok(match elems(x)? {
        Elems::Floats(v) => T::from_floats(shape, take(v, src, T::F::ZERO)?),
        Elems::Ints(v) => T::from_ints(shape, take(v, src, 0)?),
    })
}

/// Applies `(target, update)` pairs in order to a copy of `data`.
fn scatter<T: Host>(
    data: &T,
    updates: &T,
    pairs: &[(usize, usize)],
    reduction: Reduction,
) -> Result<T, String> {
    fn apply<V: Copy + PartialOrd + Add<Output = V> + Mul<Output = V>>(
        data: &[V],
        upd: &[V],
        pairs: &[(usize, usize)],
        reduction: Reduction,
        wrap_add: fn(V, V) -> V,
        wrap_mul: fn(V, V) -> V,
    ) -> Result<Vec<V>, String> {
        let mut out = data.to_vec();
        for &(t, u) in pairs {
            let (Some(&a), Some(&b)) = (out.get(t), upd.get(u)) else {
                return Err(format!("update {u} or element {t} is outside its tensor"));
            };
            out[t] = match reduction {
                Reduction::None => b,
                Reduction::Add => wrap_add(a, b),
                Reduction::Mul => wrap_mul(a, b),
                Reduction::Max => {
                    if b > a {
                        b
                    } else {
                        a
                    }
                }
                Reduction::Min => {
                    if b < a {
                        b
                    } else {
                        a
                    }
                }
            };
        }
        Ok(out)
    }
    let shape = data.shape().to_vec();
    Ok(match (elems(data)?, elems(updates)?) {
        (Elems::Floats(d), Elems::Floats(u)) => T::from_floats(
            shape,
            apply(d, u, pairs, reduction, |a, b| a + b, |a, b| a * b)?,
        ),
        (Elems::Ints(d), Elems::Ints(u)) => T::from_ints(
            shape,
            apply(d, u, pairs, reduction, i32::wrapping_add, i32::wrapping_mul)?,
        ),
        _ => return Err("data and updates differ in dtype".into()),
    })
}

/// For each element of indices (of the shape `ishape`, rank of `dshape`), its position in
/// data: the indices' coordinates with the one along `axis` replaced by the index.
fn element_targets(
    dshape: &[usize],
    ishape: &[usize],
    idx: &[i32],
    axis: usize,
    what: &str,
) -> Result<Vec<usize>, String> {
    let ds = shape::strides(dshape)?;
    let mut c = vec![0; ishape.len()];
    idx.iter()
        .enumerate()
        .map(|(i, &k)| {
            unravel(i, ishape, &mut c);
            c[axis] = resolve(k, dshape[axis], what)?;
            Ok(c.iter().zip(&ds).map(|(a, s)| a * s).sum())
        })
        .collect()
}

/// For each index tuple of gather_nd/scatter_nd (batch_dims `b`), the offset of the slice
/// it addresses in data, and the slice's size.
fn nd_targets(
    dshape: &[usize],
    ishape: &[usize],
    idx: &[i32],
    b: usize,
    what: &str,
) -> Result<(Vec<usize>, usize), String> {
    let m = *ishape.last().ok_or("indices have no axes")?;
    let ds = shape::strides(dshape)?;
    let slice = shape::numel(&dshape[b + m..])?;
    let per_batch = shape::numel(&dshape[b..])?;
    let tuples_per_batch = shape::numel(&ishape[b..ishape.len() - 1])?;
    let mut out = Vec::with_capacity(idx.len() / m.max(1));
    for (t, tuple) in idx.chunks(m.max(1)).enumerate() {
        let batch = t.checked_div(tuples_per_batch).unwrap_or(0);
        let mut off = batch * per_batch;
        for (j, &k) in tuple.iter().enumerate() {
            off += resolve(k, dshape[b + j], what)? * ds[b + j];
        }
        out.push(off);
    }
    Ok((out, slice))
}

/// Evaluates an indexing operator; `out` is the inferred output shape.
pub fn eval<T: Host>(op: &IndexingOp, inputs: &[&T], out: &[usize]) -> Result<T, String> {
    let input = |k: usize| {
        inputs
            .get(k)
            .copied()
            .ok_or_else(|| format!("{} lacks input {k}", op.name()))
    };
    let n = shape::numel(out)?;
    match op {
        IndexingOp::GatherElements { axis } => {
            let (x, idx) = (input(0)?, input(1)?);
            let a = shape::existing_axis(*axis, x.shape().len())?;
            let t = element_targets(x.shape(), out, indices(idx)?, a, "gather_elements")?;
            let src: Vec<Option<usize>> = t.into_iter().map(Some).collect();
            pick(x, out.to_vec(), &src)
        }
        IndexingOp::ScatterElements { axis, reduction } => {
            let (x, idx, upd) = (input(0)?, input(1)?, input(2)?);
            let a = shape::existing_axis(*axis, x.shape().len())?;
            let t = element_targets(x.shape(), idx.shape(), indices(idx)?, a, "scatter_elements")?;
            let pairs: Vec<(usize, usize)> =
                t.into_iter().enumerate().map(|(u, t)| (t, u)).collect();
            scatter(x, upd, &pairs, *reduction)
        }
        IndexingOp::GatherNd { batch_dims } => {
            let (x, idx) = (input(0)?, input(1)?);
            let (offsets, slice) = nd_targets(
                x.shape(),
                idx.shape(),
                indices(idx)?,
                *batch_dims,
                "gather_nd",
            )?;
            let mut src = Vec::with_capacity(n);
            for o in offsets {
                src.extend((0..slice).map(|s| Some(o + s)));
            }
            pick(x, out.to_vec(), &src)
        }
        IndexingOp::ScatterNd { reduction } => {
            let (x, idx, upd) = (input(0)?, input(1)?, input(2)?);
            let (offsets, slice) =
                nd_targets(x.shape(), idx.shape(), indices(idx)?, 0, "scatter_nd")?;
            let mut pairs = Vec::with_capacity(offsets.len() * slice);
            for (u, o) in offsets.into_iter().enumerate() {
                pairs.extend((0..slice).map(|s| (o + s, u * slice + s)));
            }
            scatter(x, upd, &pairs, *reduction)
        }
        IndexingOp::Tile { .. } => {
            let x = input(0)?;
            let xd = x.shape();
            let xs = shape::strides(xd)?;
            let mut c = vec![0; out.len()];
            let src: Vec<Option<usize>> = (0..n)
                .map(|i| {
                    unravel(i, out, &mut c);
                    Some(
                        c.iter()
                            .zip(xd)
                            .zip(&xs)
                            .map(|((&a, &d), &s)| (a % d.max(1)) * s)
                            .sum(),
                    )
                })
                .collect();
            pick(x, out.to_vec(), &src)
        }
        IndexingOp::Trilu { upper, k } => {
            let x = input(0)?;
            let r = out.len();
            let (rows, cols) = (out[r - 2].max(1), out[r - 1].max(1));
            let src: Vec<Option<usize>> = (0..n)
                .map(|i| {
                    let (row, col) = ((i / cols) % rows, i % cols);
                    let d = i64::try_from(col).unwrap_or(i64::MAX)
                        - i64::try_from(row).unwrap_or(i64::MAX);
                    let keep = if *upper { d >= *k } else { d <= *k };
                    keep.then_some(i)
                })
                .collect();
            pick(x, out.to_vec(), &src)
        }
        IndexingOp::Range {
            start,
            limit,
            delta,
            dtype,
        } => {
            let len = range_len(*start, *limit, *delta)?;
            if *dtype == DType::I32 {
                // Parsing keeps start and delta integers an i32 holds.
                let (s, d) = (*start as i64, *delta as i64);
                let v = (0..len)
                    .map(|i| {
                        let v = s + d * i64::try_from(i).unwrap_or(i64::MAX);
                        i32::try_from(v).map_err(|_| format!("range value {v} exceeds i32"))
                    })
                    .collect::<Result<_, _>>()?;
                Ok(T::from_ints(vec![len], v))
            } else {
                let (s, d) = (T::F::from_f32(*start), T::F::from_f32(*delta));
                let v = (0..len).map(|i| s + T::F::from_f64(i as f64) * d).collect();
                Ok(T::from_floats(vec![len], v))
            }
        }
        IndexingOp::Shape { start, end } => {
            let x = input(0)?;
            let (s, e) = shape_axes(*start, *end, x.shape().len());
            let v = x.shape()[s..e]
                .iter()
                .map(|&d| i32::try_from(d).map_err(|_| format!("dimension {d} exceeds i32")))
                .collect::<Result<_, _>>()?;
            Ok(T::from_ints(vec![e - s], v))
        }
        IndexingOp::ConstantOfShape { value, dtype, .. } => Ok(if *dtype == DType::I32 {
            // Parsing keeps an i32 value an integer an i32 holds.
            T::from_ints(out.to_vec(), vec![*value as i32; n])
        } else {
            T::from_floats(out.to_vec(), vec![T::F::from_f32(*value); n])
        }),
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::{parse, Op};
    use crate::tensor::{Tensor, TensorData};
    use serde_json::json;

    fn ints(shape: Vec<usize>, v: Vec<i32>) -> Tensor {
        Tensor {
            shape,
            data: TensorData::I32(v),
        }
    }

    fn run(op: &str, attrs: serde_json::Value, inputs: &[&Tensor]) -> Result<Tensor, String> {
        let Ok(Op::Indexing(o)) = parse(op, attrs.as_object().unwrap()) else {
            panic!("{op} is an indexing operator");
        };
        let types: Vec<_> = inputs
            .iter()
            .map(|t| crate::ops::TensorType {
                shape: crate::shape::known(&t.shape),
                dtype: t.dtype(),
            })
            .collect();
        let out = Op::Indexing(o.clone()).infer(&types)?;
        let shape = crate::shape::concrete(&out[0].shape).unwrap();
        super::eval(&o, inputs, &shape)
    }

    #[test]
    fn gathers_by_hand() {
        let x = Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let i = ints(vec![2, 2], vec![2, -3, 0, 1]);
        let y = run("gather_elements", json!({ "axis": 1 }), &[&x, &i]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[3.0, 1.0, 4.0, 5.0]);
        let bad = ints(vec![1, 1], vec![3]);
        let e = run("gather_elements", json!({ "axis": 1 }), &[&x, &bad]).unwrap_err();
        assert!(e.contains("index 3 is out of range"), "{e}");
        let t = ints(vec![2, 2], vec![1, 2, 0, -1]);
        let y = run("gather_nd", json!({}), &[&x, &t]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[6.0, 3.0]);
        let t = ints(vec![2, 1], vec![2, 0]);
        let y = run("gather_nd", json!({ "batch_dims": 1 }), &[&x, &t]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[3.0, 4.0]);
    }

    #[test]
    fn scatters_by_hand() {
        let x = Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let i = ints(vec![1, 2], vec![2, 2]);
        let u = Tensor::f32(vec![1, 2], vec![10.0, 20.0]);
        let y = run(
            "scatter_elements",
            json!({ "axis": 1, "reduction": "add" }),
            &[&x, &i, &u],
        )
        .unwrap();
        assert_eq!(y.as_f32().unwrap(), &[1.0, 2.0, 33.0, 4.0, 5.0, 6.0]);
        let y = run("scatter_elements", json!({ "axis": 1 }), &[&x, &i, &u]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[1.0, 2.0, 20.0, 4.0, 5.0, 6.0]);
        let t = ints(vec![1, 1], vec![-1]);
        let u = Tensor::f32(vec![1, 3], vec![0.5, 7.0, -1.0]);
        let y = run("scatter_nd", json!({ "reduction": "max" }), &[&x, &t, &u]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0, 7.0, 6.0]);
        let y = run("scatter_nd", json!({ "reduction": "mul" }), &[&x, &t, &u]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[1.0, 2.0, 3.0, 2.0, 35.0, -6.0]);
        let far = ints(vec![1, 1], vec![2]);
        assert!(run("scatter_nd", json!({}), &[&x, &far, &u]).is_err());
    }

    #[test]
    fn tile_trilu_and_generators_by_hand() {
        let x = ints(vec![2, 2], vec![1, 2, 3, 4]);
        let y = run("tile", json!({ "repeats": [1, 2] }), &[&x]).unwrap();
        assert_eq!(y.data, TensorData::I32(vec![1, 2, 1, 2, 3, 4, 3, 4]));
        let x = Tensor::f32(vec![3, 3], (1..=9).map(|v| v as f32).collect());
        let y = run("trilu", json!({}), &[&x]).unwrap();
        assert_eq!(
            y.as_f32().unwrap(),
            &[1.0, 2.0, 3.0, 0.0, 5.0, 6.0, 0.0, 0.0, 9.0]
        );
        let y = run("trilu", json!({ "upper": false, "k": -1 }), &[&x]).unwrap();
        assert_eq!(
            y.as_f32().unwrap(),
            &[0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 7.0, 8.0, 0.0]
        );
        let y = run(
            "range",
            json!({ "start": 10, "limit": 4, "delta": -3, "dtype": "i32" }),
            &[],
        )
        .unwrap();
        assert_eq!(y.data, TensorData::I32(vec![10, 7]));
        let y = run(
            "range",
            json!({ "start": 1, "limit": 2, "delta": 0.25 }),
            &[],
        )
        .unwrap();
        assert_eq!(y.as_f32().unwrap(), &[1.0, 1.25, 1.5, 1.75]);
        let y = run("shape", json!({ "start": 1 }), &[&x]).unwrap();
        assert_eq!(y.data, TensorData::I32(vec![3]));
        let y = run(
            "constant_of_shape",
            json!({ "shape": [2], "value": -4, "dtype": "i32" }),
            &[],
        )
        .unwrap();
        assert_eq!(y.data, TensorData::I32(vec![-4, -4]));
    }
}
