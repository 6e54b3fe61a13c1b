//! CPU reference of the reduce family.

use super::{floats, unravel, Float, Host};
use crate::ops::reduce::{ReduceKind, ReduceOp};

/// The shape of a reduction's result: reduced axes kept as 1, or dropped.
fn out_shape(dims: &[usize], axes: &[usize], keepdims: bool) -> Vec<usize> {
    dims.iter()
        .enumerate()
        .filter(|(i, _)| keepdims || !axes.contains(i))
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect()
}

/// Calls `visit(output index, position along the reduced axes, value)` for every element
/// of `x`, in row-major order (so positions come in increasing order per output).
fn each<T: Host>(
    x: &T,
    axes: &[usize],
    mut visit: impl FnMut(usize, usize, T::F),
) -> Result<usize, String> {
    let data = floats(x)?;
    let dims = x.shape();
    let kept: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let reduced: Vec<usize> = axes.iter().map(|&a| dims[a]).collect();
    let out_strides = crate::shape::strides(&kept)?;
    let red_strides = crate::shape::strides(&reduced)?;
    let mut idx = vec![0; dims.len()];
    for (i, &v) in data.iter().enumerate() {
        unravel(i, dims, &mut idx);
        let (mut o, mut r) = (0, 0);
        for (d, &c) in idx.iter().enumerate() {
            match axes.iter().position(|&a| a == d) {
                Some(k) => r += c * red_strides[k],
                None => o += c * out_strides[d],
            }
        }
        visit(o, r, v);
    }
    crate::shape::numel(&kept)
}

/// Sum (or mean) of `x` over sorted `axes`, keeping them as size 1 when `keepdims`.
pub fn reduce<T: Host>(x: &T, axes: &[usize], mean: bool, keepdims: bool) -> Result<T, String> {
    let n_out = crate::shape::numel(&out_shape(x.shape(), axes, true))?;
    let mut acc = vec![0.0f64; n_out];
    each(x, axes, |o, _, v| acc[o] += v.to_f64())?;
    let count: usize = axes.iter().map(|&a| x.shape()[a]).product();
    let scale = if mean && count > 0 {
        1.0 / count as f64
    } else {
        1.0
    };
    Ok(T::from_floats(
        out_shape(x.shape(), axes, keepdims),
        acc.iter().map(|&s| T::F::from_f64(s * scale)).collect(),
    ))
}

/// Whether `v` beats the running best `best` of a maximum (a minimum when `min`): NaN
/// beats every number and nothing but a later NaN (when `last`) beats NaN; ties go to the
/// later element when `last`, else the earlier one stays.
fn beats<F: Float>(v: F, best: F, min: bool, last: bool) -> bool {
    if best.is_nan() {
        return last && v.is_nan();
    }
    if v.is_nan() {
        return true;
    }
    match (min, last) {
        (false, false) => v > best,
        (false, true) => v >= best,
        (true, false) => v < best,
        (true, true) => v <= best,
    }
}

/// Maximum or minimum (NaN-propagating) or the index of the first (`last`: last) one of
/// `x` over `axes`. An empty slice has minimum +∞; a maximum or an index of one is an
/// error.
fn extreme<T: Host>(
    x: &T,
    axes: &[usize],
    op: &ReduceOp,
    min: bool,
    arg: bool,
) -> Result<T, String> {
    let n_out = crate::shape::numel(&out_shape(x.shape(), axes, true))?;
    let last = op.select_last_index;
    let mut best: Vec<Option<(T::F, usize)>> = vec![None; n_out];
    each(x, axes, |o, r, v| match best[o] {
        Some((b, _)) if !beats(v, b, min, last) => {}
        _ => best[o] = Some((v, r)),
    })?;
    let shape = out_shape(x.shape(), axes, op.keepdims);
    if arg {
        let idx = best
            .iter()
            .map(|b| {
                let (_, r) = b.ok_or("an index over an empty axis has no value")?;
                i32::try_from(r).map_err(|_| format!("index {r} exceeds i32"))
            })
            .collect::<Result<_, String>>()?;
        return Ok(T::from_ints(shape, idx));
    }
    let values = best
        .iter()
        .map(|b| match (b, min) {
            (Some((v, _)), _) => Ok(*v),
            (None, true) => Ok(-T::F::NEG_INFINITY),
            (None, false) => Err("a maximum over an empty axis has no value".to_string()),
        })
        .collect::<Result<_, String>>()?;
    Ok(T::from_floats(shape, values))
}

/// Product (`l2`: square root of the sum of squares) of `x` over `axes`, in f64.
fn fold<T: Host>(x: &T, axes: &[usize], keepdims: bool, l2: bool) -> Result<T, String> {
    let n_out = crate::shape::numel(&out_shape(x.shape(), axes, true))?;
    let mut acc = vec![if l2 { 0.0f64 } else { 1.0 }; n_out];
    each(x, axes, |o, _, v| {
        let v = v.to_f64();
        if l2 {
            acc[o] += v * v;
        } else {
            acc[o] *= v;
        }
    })?;
    Ok(T::from_floats(
        out_shape(x.shape(), axes, keepdims),
        acc.iter()
            .map(|&s| T::F::from_f64(if l2 { s.sqrt() } else { s }))
            .collect(),
    ))
}

/// (outer, length, inner) of `dims` around axis `a`.
fn around(dims: &[usize], a: usize) -> Result<(usize, usize, usize), String> {
    Ok((
        crate::shape::numel(&dims[..a])?,
        dims[a],
        crate::shape::numel(&dims[a + 1..])?,
    ))
}

/// The cumulative sums of `v` (outer × len × inner) along the middle axis, of any type
/// with a zero and an addition.
fn scan<V: Copy>(
    v: &[V],
    (outer, len, inner): (usize, usize, usize),
    exclusive: bool,
    reverse: bool,
    zero: V,
    add: impl Fn(V, V) -> V,
) -> Vec<V> {
    let mut out = vec![zero; v.len()];
    for o in 0..outer {
        for r in 0..inner {
            let mut acc = zero;
            for step in 0..len {
                let j = if reverse { len - 1 - step } else { step };
                let i = (o * len + j) * inner + r;
                if exclusive {
                    out[i] = acc;
                    acc = add(acc, v[i]);
                } else {
                    acc = add(acc, v[i]);
                    out[i] = acc;
                }
            }
        }
    }
    out
}

/// `cumsum` along axis `a`: floats summed in f64, i32 wrapping.
fn cumsum<T: Host>(x: &T, a: usize, exclusive: bool, reverse: bool) -> Result<T, String> {
    let dims = around(x.shape(), a)?;
    let shape = x.shape().to_vec();
    if let Some(v) = x.ints() {
        let out = scan(v, dims, exclusive, reverse, 0i32, i32::wrapping_add);
        return Ok(T::from_ints(shape, out));
    }
    let v: Vec<f64> = floats(x)?.iter().map(|f| f.to_f64()).collect();
    let out = scan(&v, dims, exclusive, reverse, 0.0, |p, q| p + q);
    Ok(T::from_floats(
        shape,
        out.into_iter().map(T::F::from_f64).collect(),
    ))
}

/// Whether element `(v, i)` ranks before `(w, j)` in `top_k`'s order: the larger
/// (`largest`) or smaller value first, NaN beyond every number, ties to the lower index.
fn ranks_before<V: PartialOrd>(
    (v, i, v_nan): (V, usize, bool),
    (w, j, w_nan): (V, usize, bool),
    largest: bool,
) -> bool {
    match (v_nan, w_nan) {
        (true, true) => i < j,
        (true, false) => true,
        (false, true) => false,
        _ if v == w => i < j,
        _ => (v > w) == largest,
    }
}

/// The `k` best elements of every slice of `v` (outer × len × inner) along the middle
/// axis, best first, and their indices.
fn select<V: Copy + PartialOrd>(
    v: &[V],
    (outer, len, inner): (usize, usize, usize),
    k: usize,
    largest: bool,
    is_nan: impl Fn(V) -> bool,
) -> Result<(Vec<V>, Vec<i32>), String> {
    let n = outer * k * inner;
    let (mut sources, mut indices) = (vec![0usize; n], vec![0i32; n]);
    let mut order: Vec<usize> = Vec::with_capacity(len);
    for o in 0..outer {
        for r in 0..inner {
            let at = |j: usize| {
                let x = v[(o * len + j) * inner + r];
                (x, j, is_nan(x))
            };
            order.clear();
            order.extend(0..len);
            order.sort_by(|&i, &j| {
                if ranks_before(at(i), at(j), largest) {
                    std::cmp::Ordering::Less
                } else if ranks_before(at(j), at(i), largest) {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            });
            for (rank, &j) in order.iter().take(k).enumerate() {
                let out = (o * k + rank) * inner + r;
                indices[out] = i32::try_from(j).map_err(|_| format!("index {j} exceeds i32"))?;
                sources[out] = (o * len + j) * inner + r;
            }
        }
    }
    Ok((sources.into_iter().map(|s| v[s]).collect(), indices))
}

/// `top_k` along axis `a` of f32 or i32 `x`.
fn top_k<T: Host>(x: &T, a: usize, k: usize, largest: bool) -> Result<Vec<T>, String> {
    let dims = around(x.shape(), a)?;
    if k > dims.1 {
        return Err(format!("top_k: k {k} is above the axis length {}", dims.1));
    }
    let mut shape = x.shape().to_vec();
    shape[a] = k;
    let (values, indices) = if let Some(v) = x.ints() {
        let (values, indices) = select(v, dims, k, largest, |_| false)?;
        (T::from_ints(shape.clone(), values), indices)
    } else {
        let (values, indices) = select(floats(x)?, dims, k, largest, Float::is_nan)?;
        (T::from_floats(shape.clone(), values), indices)
    };
    Ok(vec![values, T::from_ints(shape, indices)])
}

/// Evaluates a reduction (two outputs for `top_k`, one otherwise).
pub fn eval<T: Host>(op: &ReduceOp, x: &T) -> Result<Vec<T>, String> {
    let axes = op.axes(x.shape().len())?;
    let one = |t: Result<T, String>| t.map(|t| vec![t]);
    match op.kind {
        ReduceKind::Sum => one(reduce(x, &axes, false, op.keepdims)),
        ReduceKind::Mean => one(reduce(x, &axes, true, op.keepdims)),
        ReduceKind::Max => one(extreme(x, &axes, op, false, false)),
        ReduceKind::Min => one(extreme(x, &axes, op, true, false)),
        ReduceKind::ArgMax => one(extreme(x, &axes, op, false, true)),
        ReduceKind::ArgMin => one(extreme(x, &axes, op, true, true)),
        ReduceKind::Prod => one(fold(x, &axes, op.keepdims, false)),
        ReduceKind::L2 => one(fold(x, &axes, op.keepdims, true)),
        ReduceKind::CumSum { exclusive, reverse } => one(cumsum(x, axes[0], exclusive, reverse)),
        ReduceKind::TopK { k, largest } => top_k(x, axes[0], k, largest),
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::{parse, Op};
    use crate::tensor::{Tensor, TensorData};
    use serde_json::json;

    fn run(op: &str, attrs: serde_json::Value, x: Tensor) -> Tensor {
        let Ok(Op::Reduce(r)) = parse(op, attrs.as_object().unwrap()) else {
            panic!("{op} is a reduction");
        };
        super::eval(&r, &x).unwrap().remove(0)
    }

    #[test]
    fn argmax_takes_the_first_of_ties_and_the_first_nan() {
        let nan = f32::NAN;
        let x = Tensor::f32(
            vec![4, 3],
            vec![
                1.0, 5.0, 5.0, nan, 2.0, nan, -1.0, -1.0, -3.0, 7.0, nan, 9.0,
            ],
        );
        let y = run("argmax", json!({}), x.clone());
        assert_eq!(y.shape, vec![4]);
        assert_eq!(y.data, TensorData::I32(vec![1, 0, 0, 1]));
        let y = run("argmax", json!({ "axis": 0, "keepdims": true }), x);
        assert_eq!(y.shape, vec![1, 3]);
        assert_eq!(y.data, TensorData::I32(vec![1, 3, 1]));
    }

    #[test]
    fn reduce_max_propagates_nan_and_keeps_infinities() {
        let x = Tensor::f32(
            vec![2, 3],
            vec![1.0, f32::NAN, 3.0, f32::NEG_INFINITY, -2.0, -7.5],
        );
        let y = run(
            "reduce_max",
            json!({ "axes": [1], "keepdims": false }),
            x.clone(),
        );
        let v = y.as_f32().unwrap();
        assert!(v[0].is_nan());
        assert_eq!(v[1], -2.0);
        let y = run("reduce_max", json!({ "axes": [0] }), x.clone());
        assert_eq!(y.shape, vec![1, 3]);
        assert!(y.as_f32().unwrap()[1].is_nan());
        assert_eq!(y.as_f32().unwrap()[0], 1.0);
        assert_eq!(y.as_f32().unwrap()[2], 3.0);
        let all = run("reduce_max", json!({ "keepdims": false }), x);
        assert_eq!(all.shape, Vec::<usize>::new());
    }

    fn run_all(op: &str, attrs: serde_json::Value, x: Tensor) -> Vec<Tensor> {
        let Ok(Op::Reduce(r)) = parse(op, attrs.as_object().unwrap()) else {
            panic!("{op} is a reduction");
        };
        super::eval(&r, &x).unwrap()
    }

    #[test]
    fn min_prod_and_l2_by_hand() {
        let x = Tensor::f32(vec![2, 3], vec![1.0, -2.0, 3.0, 4.0, 0.5, -0.5]);
        let y = run(
            "reduce_min",
            json!({ "axes": [1], "keepdims": false }),
            x.clone(),
        );
        assert_eq!(y.as_f32().unwrap(), &[-2.0, -0.5]);
        let y = run("reduce_prod", json!({ "axes": [0] }), x.clone());
        assert_eq!(y.shape, vec![1, 3]);
        assert_eq!(y.as_f32().unwrap(), &[4.0, -1.0, -1.5]);
        let y = run("reduce_l2", json!({ "axes": [-1], "keepdims": false }), x);
        let v = y.as_f32().unwrap();
        assert!((v[0] - 14f32.sqrt()).abs() < 1e-6 && (v[1] - 16.5f32.sqrt()).abs() < 1e-6);
        // Over an empty slice: ONNX's +inf, 1 and 0.
        let empty = Tensor::f32(vec![2, 0], Vec::new());
        let y = run("reduce_min", json!({ "axes": [1] }), empty.clone());
        assert_eq!(y.as_f32().unwrap(), &[f32::INFINITY, f32::INFINITY]);
        let y = run("reduce_prod", json!({ "axes": [1] }), empty.clone());
        assert_eq!(y.as_f32().unwrap(), &[1.0, 1.0]);
        let y = run("reduce_l2", json!({ "axes": [1] }), empty);
        assert_eq!(y.as_f32().unwrap(), &[0.0, 0.0]);
    }

    #[test]
    fn argmin_takes_the_first_or_last_of_ties() {
        let x = Tensor::f32(
            vec![2, 4],
            vec![3.0, 1.0, 1.0, 2.0, f32::NAN, 0.0, f32::NAN, -1.0],
        );
        let y = run("argmin", json!({ "axis": 1 }), x.clone());
        assert_eq!(y.shape, vec![2, 1]);
        assert_eq!(y.data, TensorData::I32(vec![1, 0]));
        let y = run(
            "argmin",
            json!({ "axis": 1, "select_last_index": true }),
            x.clone(),
        );
        assert_eq!(y.data, TensorData::I32(vec![2, 2]));
        let y = run("argmax", json!({ "axis": 0, "select_last_index": true }), x);
        assert_eq!(y.data, TensorData::I32(vec![1, 0, 1, 0]));
    }

    #[test]
    fn cumsum_inclusive_exclusive_and_reversed() {
        let x = Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let y = run("cumsum", json!({ "axis": 1 }), x.clone());
        assert_eq!(y.as_f32().unwrap(), &[1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
        let y = run("cumsum", json!({ "axis": 0, "exclusive": true }), x.clone());
        assert_eq!(y.as_f32().unwrap(), &[0.0, 0.0, 0.0, 1.0, 2.0, 3.0]);
        let y = run(
            "cumsum",
            json!({ "axis": -1, "reverse": true, "exclusive": true }),
            x,
        );
        assert_eq!(y.as_f32().unwrap(), &[5.0, 3.0, 0.0, 11.0, 6.0, 0.0]);
        let i = Tensor {
            shape: vec![3],
            data: TensorData::I32(vec![i32::MAX, 1, 2]),
        };
        let y = run("cumsum", json!({ "axis": 0 }), i);
        assert_eq!(
            y.data,
            TensorData::I32(vec![i32::MAX, i32::MIN, i32::MIN + 2])
        );
    }

    #[test]
    fn top_k_orders_best_first_and_breaks_ties_by_index() {
        let x = Tensor::f32(vec![2, 4], vec![1.0, 3.0, 3.0, 2.0, 0.0, -1.0, 5.0, -1.0]);
        let y = run_all("top_k", json!({ "k": 3 }), x.clone());
        assert_eq!(y[0].as_f32().unwrap(), &[3.0, 3.0, 2.0, 5.0, 0.0, -1.0]);
        assert_eq!(y[1].data, TensorData::I32(vec![1, 2, 3, 2, 0, 1]));
        let y = run_all("top_k", json!({ "k": 1, "axis": 0, "largest": false }), x);
        assert_eq!(y[0].shape, vec![1, 4]);
        assert_eq!(y[0].as_f32().unwrap(), &[0.0, -1.0, 3.0, -1.0]);
        assert_eq!(y[1].data, TensorData::I32(vec![1, 1, 0, 1]));
        let big = 16_777_217;
        let x = Tensor {
            shape: vec![4],
            data: TensorData::I32(vec![big - 1, big, -5, big]),
        };
        let y = run_all("top_k", json!({ "k": 3 }), x);
        assert_eq!(y[0].data, TensorData::I32(vec![big, big, big - 1]));
        assert_eq!(y[1].data, TensorData::I32(vec![1, 3, 0]));
    }
}
