//! CPU reference of the gradient family.

use super::elementwise::erf;
use super::{floats, unravel};
use crate::ops::elementwise::Unary;
use crate::ops::grad::GradOp;
use crate::shape;
use crate::shape::{broadcast_strides, numel};
use crate::tensor::{Tensor, TensorData};

/// 2/√π.
const TWO_OVER_SQRT_PI: f32 = std::f32::consts::FRAC_2_SQRT_PI;
/// √(2/π).
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// f′(x) of a unary operator.
pub fn derivative(u: Unary, x: f32) -> f32 {
    match u {
        Unary::Relu => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Unary::Sigmoid => {
            let s = 1.0 / (1.0 + (-x).exp());
            s * (1.0 - s)
        }
        Unary::Tanh => {
            let t = x.tanh();
            1.0 - t * t
        }
        Unary::Gelu { tanh: false } => {
            let cdf = 0.5 * (1.0 + erf(x / std::f32::consts::SQRT_2));
            let pdf = (-0.5 * x * x).exp() * (0.5 * TWO_OVER_SQRT_PI / std::f32::consts::SQRT_2);
            cdf + x * pdf
        }
        Unary::Gelu { tanh: true } => {
            let t = (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh();
            let du = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
        }
        Unary::Exp => x.exp(),
        Unary::Log => 1.0 / x,
        Unary::Sqrt => 0.5 / x.sqrt(),
        Unary::Erf => TWO_OVER_SQRT_PI * (-x * x).exp(),
        Unary::Clip { min, max } => {
            let above = min.is_none_or(|lo| x >= lo);
            let below = max.is_none_or(|hi| x <= hi);
            if above && below {
                1.0
            } else {
                0.0
            }
        }
    }
}

/// Evaluates a gradient-family operator into an output of shape `out`.
pub fn eval(op: &GradOp, inputs: &[&Tensor], out: &[usize]) -> Result<Tensor, String> {
    if let GradOp::GatherGrad { axis } = op {
        return gather_grad(*axis, inputs);
    }
    if op.forward(1).is_some() {
        return super::conv_grad::eval(op, inputs, out);
    }
    let [x, dy] = inputs else {
        return Err(format!("{} takes two inputs", op.name()));
    };
    let u = match op {
        GradOp::UnaryGrad(u) => u,
        GradOp::SoftmaxGrad { axis, log } => return softmax_grad(*axis, *log, x, dy),
        _ => return Err(format!("internal: {} is not unary", op.name())),
    };
    let n = numel(out)?;
    let sx = broadcast_strides(&x.shape, out)?;
    let sd = broadcast_strides(&dy.shape, out)?;
    let (xv, dv) = (x.to_f32_vec(), dy.to_f32_vec());
    let mut idx = vec![0; out.len()];
    let mut data = Vec::with_capacity(n);
    for i in 0..n {
        unravel(i, out, &mut idx);
        let at = |s: &[usize], v: &[f32]| -> Result<f32, String> {
            idx.iter()
                .zip(s)
                .try_fold(0usize, |acc, (a, b)| a.checked_mul(*b)?.checked_add(acc))
                .and_then(|o| v.get(o).copied())
                .ok_or_else(|| format!("an operand does not broadcast to {out:?}"))
        };
        data.push(derivative(*u, at(&sx, &xv)?) * at(&sd, &dv)?);
    }
    Ok(Tensor::f32(out.to_vec(), data))
}

/// softmax: y·(dy − Σ dy·y); log_softmax: dy − exp(y)·Σ dy, sums along `axis` in f64.
fn softmax_grad(axis: i64, log: bool, y: &Tensor, dy: &Tensor) -> Result<Tensor, String> {
    let (yv, dv) = (floats(y)?, floats(dy)?);
    let dims = &y.shape;
    let a = shape::existing_axis(axis, dims.len())?;
    let len = dims[a];
    let inner: usize = dims[a + 1..].iter().product();
    let outer: usize = dims[..a].iter().product();
    let mut out = vec![0.0f32; yv.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * len * inner + j * inner + i;
            let s: f64 = (0..len)
                .map(|j| {
                    let d = f64::from(dv[at(j)]);
                    if log {
                        d
                    } else {
                        d * f64::from(yv[at(j)])
                    }
                })
                .sum();
            let s = s as f32;
            for j in 0..len {
                let (y, d) = (yv[at(j)], dv[at(j)]);
                out[at(j)] = if log { d - y.exp() * s } else { y * (d - s) };
            }
        }
    }
    Ok(Tensor::f32(dims.clone(), out))
}

/// dx[o, k, r] = Σ over j with indices[j] = k of dy[o, j, r] (negative indices count from
/// the end; out-of-range ones add nothing, as the GPU kernel does).
fn gather_grad(axis: i64, inputs: &[&Tensor]) -> Result<Tensor, String> {
    let [x, indices, dy] = inputs else {
        return Err("gather_grad takes x, indices and dy".into());
    };
    let TensorData::I32(idx) = &indices.data else {
        return Err("gather_grad indices must be i32".into());
    };
    let dv = floats(dy)?;
    let dims = &x.shape;
    let a = shape::existing_axis(axis, dims.len())?;
    let len = dims[a];
    let inner = numel(&dims[a + 1..])?;
    let outer = numel(&dims[..a])?;
    let mut out = vec![0.0f32; numel(dims)?];
    let count = idx.len();
    for o in 0..outer {
        for (j, &k) in idx.iter().enumerate() {
            let k = if k < 0 {
                i64::from(k) + i64::try_from(len).unwrap_or(i64::MAX)
            } else {
                i64::from(k)
            };
            let Some(k) = usize::try_from(k).ok().filter(|&k| k < len) else {
                continue;
            };
            for r in 0..inner {
                let src = (o * count + j) * inner + r;
                let dst = (o * len + k) * inner + r;
                if let (Some(d), Some(v)) = (out.get_mut(dst), dv.get(src)) {
                    *d += v;
                }
            }
        }
    }
    Ok(Tensor::f32(dims.clone(), out))
}
