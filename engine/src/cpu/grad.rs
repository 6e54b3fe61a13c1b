//! CPU reference of the gradient family.

use super::elementwise::{erf, sigmoid, softplus};
use super::{floats, unravel, Float, Host};
use crate::ops::elementwise::{Unary, HARD_SWISH_ALPHA};
use crate::ops::grad::GradOp;
use crate::shape;
use crate::shape::{broadcast_strides, numel};

/// f′(x) of a unary operator.
pub fn derivative<F: Float>(u: Unary, x: F) -> F {
    let (half, one, zero) = (F::from_f32(0.5), F::ONE, F::ZERO);
    // √(2/π), as the forward spells it.
    let sqrt_2_over_pi = F::from_f32(0.797_884_6);
    match u {
        Unary::Relu => {
            if x > zero {
                one
            } else {
                zero
            }
        }
        Unary::Sigmoid => {
            let s = one / (one + (-x).exp());
            s * (one - s)
        }
        Unary::Tanh => {
            let t = x.tanh();
            one - t * t
        }
        Unary::Gelu { tanh: false } => {
            let cdf = half * (one + erf(x / F::SQRT_2));
            let pdf = (-half * x * x).exp() * (half * F::FRAC_2_SQRT_PI / F::SQRT_2);
            cdf + x * pdf
        }
        Unary::Gelu { tanh: true } => {
            let c = F::from_f32(0.044715);
            let t = (sqrt_2_over_pi * (x + c * x * x * x)).tanh();
            let du = sqrt_2_over_pi * (one + F::from_f32(3.0) * c * x * x);
            half * (one + t) + half * x * (one - t * t) * du
        }
        Unary::Exp => x.exp(),
        Unary::Log => one / x,
        Unary::Sqrt => half / x.sqrt(),
        Unary::Erf => F::FRAC_2_SQRT_PI * (-x * x).exp(),
        Unary::Clip { min, max } => {
            let above = min.is_none_or(|lo| x >= F::from_f32(lo));
            let below = max.is_none_or(|hi| x <= F::from_f32(hi));
            if above && below {
                one
            } else {
                zero
            }
        }
        Unary::LeakyRelu { alpha } => {
            if x < zero {
                F::from_f32(alpha)
            } else {
                one
            }
        }
        Unary::Elu { alpha } => {
            if x < zero {
                F::from_f32(alpha) * x.exp()
            } else {
                one
            }
        }
        Unary::Selu { alpha, gamma } => {
            let g = F::from_f32(gamma);
            if x > zero {
                g
            } else {
                g * F::from_f32(alpha) * x.exp()
            }
        }
        Unary::Softplus => sigmoid(x),
        Unary::Softsign => {
            let d = one + x.abs();
            one / (d * d)
        }
        Unary::HardSigmoid { alpha, beta } => {
            let v = F::from_f32(alpha) * x + F::from_f32(beta);
            if v > zero && v < one {
                F::from_f32(alpha)
            } else {
                zero
            }
        }
        Unary::HardSwish => {
            let a = F::from_f32(HARD_SWISH_ALPHA);
            let v = a * x + half;
            if v < zero {
                zero
            } else if v > one {
                one
            } else {
                (a + a) * x + half
            }
        }
        Unary::Silu => swish_derivative(x, one),
        Unary::Swish { alpha } => swish_derivative(x, F::from_f32(alpha)),
        Unary::Mish => {
            let t = softplus(x).tanh();
            t + x * sigmoid(x) * (one - t * t)
        }
        Unary::Abs => {
            if x > zero {
                one
            } else if x < zero {
                -one
            } else {
                zero
            }
        }
        Unary::Neg => -one,
        Unary::Reciprocal => -one / (x * x),
        Unary::Sin => x.cos(),
        Unary::Cos => -x.sin(),
        // Step functions (their rules emit zeros without unary_grad).
        Unary::Sign | Unary::Floor | Unary::Ceil | Unary::Round => zero,
    }
}

/// d/dx of x·sigmoid(αx): s + αx·s(1 − s) with s = sigmoid(αx).
fn swish_derivative<F: Float>(x: F, alpha: F) -> F {
    let s = sigmoid(alpha * x);
    s + alpha * x * s * (F::ONE - s)
}

/// Evaluates a gradient-family operator into an output of shape `out`.
pub fn eval<T: Host>(op: &GradOp, inputs: &[&T], out: &[usize]) -> Result<T, String> {
    if let GradOp::GatherGrad { axis } = op {
        return gather_grad(*axis, inputs);
    }
    if let (GradOp::ConvTransposeGradInput { .. }, [_, weight, dy]) = (op, inputs) {
        // conv2d of dy with the weight, at x's shape.
        let conv = op.as_conv2d(out.get(1).copied().unwrap_or(1));
        return super::conv::eval(&conv, *dy, &[*weight], out);
    }
    if op.forward(1).is_some() {
        return super::conv_grad::eval(op, inputs, out);
    }
    let [x, dy] = inputs else {
        return Err(format!("{} takes two inputs", op.name()));
    };
    let u = match op {
        GradOp::UnaryGrad(u) => u,
        GradOp::SoftmaxGrad { axis, log } => return softmax_grad(*axis, *log, *x, *dy),
        _ => return Err(format!("internal: {} is not unary", op.name())),
    };
    let n = numel(out)?;
    let sx = broadcast_strides(x.shape(), out)?;
    let sd = broadcast_strides(dy.shape(), out)?;
    let (xv, dv) = (x.to_floats(), dy.to_floats());
    let mut idx = vec![0; out.len()];
    let mut data = Vec::with_capacity(n);
    for i in 0..n {
        unravel(i, out, &mut idx);
        let at = |s: &[usize], v: &[T::F]| -> Result<T::F, String> {
            idx.iter()
                .zip(s)
                .try_fold(0usize, |acc, (a, b)| a.checked_mul(*b)?.checked_add(acc))
                .and_then(|o| v.get(o).copied())
                .ok_or_else(|| format!("an operand does not broadcast to {out:?}"))
        };
        data.push(derivative(*u, at(&sx, &xv)?) * at(&sd, &dv)?);
    }
    Ok(T::from_floats(out.to_vec(), data))
}

/// softmax: y·(dy − Σ dy·y); log_softmax: dy − exp(y)·Σ dy, sums along `axis` in f64.
fn softmax_grad<T: Host>(axis: i64, log: bool, y: &T, dy: &T) -> Result<T, String> {
    let (yv, dv) = (floats(y)?, floats(dy)?);
    let dims = y.shape();
    let a = shape::existing_axis(axis, dims.len())?;
    let len = dims[a];
    let inner: usize = dims[a + 1..].iter().product();
    let outer: usize = dims[..a].iter().product();
    let mut out = vec![T::F::ZERO; yv.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * len * inner + j * inner + i;
            let s: f64 = (0..len)
                .map(|j| {
                    let d = dv[at(j)].to_f64();
                    if log {
                        d
                    } else {
                        d * yv[at(j)].to_f64()
                    }
                })
                .sum();
            let s = T::F::from_f64(s);
            for j in 0..len {
                let (y, d) = (yv[at(j)], dv[at(j)]);
                out[at(j)] = if log { d - y.exp() * s } else { y * (d - s) };
            }
        }
    }
    Ok(T::from_floats(dims.to_vec(), out))
}

/// dx[o, k, r] = Σ over j with indices[j] = k of dy[o, j, r] (negative indices count from
/// the end; out-of-range ones add nothing, as the GPU kernel does).
fn gather_grad<T: Host>(axis: i64, inputs: &[&T]) -> Result<T, String> {
    let [x, indices, dy] = inputs else {
        return Err("gather_grad takes x, indices and dy".into());
    };
    let Some(idx) = indices.ints() else {
        return Err("gather_grad indices must be i32".into());
    };
    let dv = floats(*dy)?;
    let dims = x.shape();
    let a = shape::existing_axis(axis, dims.len())?;
    let len = dims[a];
    let inner = numel(&dims[a + 1..])?;
    let outer = numel(&dims[..a])?;
    let mut out = vec![T::F::ZERO; numel(dims)?];
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
                    *d += *v;
                }
            }
        }
    }
    Ok(T::from_floats(dims.to_vec(), out))
}
