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

/// Whether `v` beats the running maximum `best`: NaN beats every number and nothing beats
/// NaN, so the first NaN (or, among numbers, the first maximum) is kept.
fn beats<F: Float>(v: F, best: F) -> bool {
    !best.is_nan() && (v.is_nan() || v > best)
}

/// Maximum (NaN-propagating) or index of the first maximum of `x` over `axes`.
fn max<T: Host>(x: &T, axes: &[usize], keepdims: bool, arg: bool) -> Result<T, String> {
    let n_out = crate::shape::numel(&out_shape(x.shape(), axes, true))?;
    let mut best: Vec<Option<(T::F, usize)>> = vec![None; n_out];
    each(x, axes, |o, r, v| match best[o] {
        Some((b, _)) if !beats(v, b) => {}
        _ => best[o] = Some((v, r)),
    })?;
    if best.iter().any(Option::is_none) {
        return Err("a maximum over an empty axis has no value".into());
    }
    let shape = out_shape(x.shape(), axes, keepdims);
    let best = best.into_iter().flatten();
    Ok(if arg {
        let idx = best
            .map(|(_, r)| i32::try_from(r).map_err(|_| format!("index {r} exceeds i32")))
            .collect::<Result<_, _>>()?;
        T::from_ints(shape, idx)
    } else {
        T::from_floats(shape, best.map(|(v, _)| v).collect())
    })
}

/// Evaluates a reduction.
pub fn eval<T: Host>(op: &ReduceOp, x: &T) -> Result<T, String> {
    let axes = op.axes(x.shape().len())?;
    match op.kind {
        ReduceKind::Sum => reduce(x, &axes, false, op.keepdims),
        ReduceKind::Mean => reduce(x, &axes, true, op.keepdims),
        ReduceKind::Max => max(x, &axes, op.keepdims, false),
        ReduceKind::ArgMax => max(x, &axes, op.keepdims, true),
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
        super::eval(&r, &x).unwrap()
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
}
