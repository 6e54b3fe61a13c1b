//! CPU reference of the gradient family.

use super::elementwise::erf;
use super::unravel;
use crate::ops::elementwise::Unary;
use crate::ops::grad::GradOp;
use crate::shape::{broadcast_strides, numel};
use crate::tensor::Tensor;

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
    let GradOp::UnaryGrad(u) = op;
    let [x, dy] = inputs else {
        return Err("unary_grad takes x and dy".into());
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
