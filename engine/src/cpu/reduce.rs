//! CPU reference of the reduce family.

use super::{floats, unravel};
use crate::ops::reduce::{resolve_axes, ReduceOp};
use crate::tensor::Tensor;

/// Sum (or mean) of `x` over sorted `axes`, keeping them as size 1 when `keepdims`.
pub fn reduce(x: &Tensor, axes: &[usize], mean: bool, keepdims: bool) -> Result<Tensor, String> {
    let data = floats(x)?;
    let dims = &x.shape;
    let kept_shape: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let n_out = crate::shape::numel(&kept_shape)?;
    let count: usize = axes.iter().map(|&a| dims[a]).product();
    let mut acc = vec![0.0f64; n_out];
    let out_strides = crate::shape::strides(&kept_shape)?;
    let mut idx = vec![0; dims.len()];
    for (i, &v) in data.iter().enumerate() {
        unravel(i, dims, &mut idx);
        let o: usize = idx
            .iter()
            .enumerate()
            .map(|(d, &c)| {
                if axes.contains(&d) {
                    0
                } else {
                    c * out_strides[d]
                }
            })
            .sum();
        acc[o] += f64::from(v);
    }
    let scale = if mean && count > 0 {
        1.0 / count as f64
    } else {
        1.0
    };
    let shape = if keepdims {
        kept_shape
    } else {
        dims.iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect()
    };
    Ok(Tensor::f32(
        shape,
        acc.iter().map(|&s| (s * scale) as f32).collect(),
    ))
}

/// Evaluates a reduction.
pub fn eval(op: &ReduceOp, x: &Tensor) -> Result<Tensor, String> {
    let axes = resolve_axes(&op.axes, x.shape.len())?;
    reduce(x, &axes, op.mean, op.keepdims)
}
