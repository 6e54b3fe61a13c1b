//! CPU reference of the elementwise family, with numpy broadcasting.

use super::unravel;
use crate::ops::elementwise::{Binary, ElementwiseOp, Unary};
use crate::shape::{broadcast_strides, numel};
use crate::tensor::Tensor;

/// erf with the same 1.5e-7 approximation family as the kernel, in f64.
pub fn erf(x: f32) -> f32 {
    let x = f64::from(x);
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-x * x).exp();
    (if x >= 0.0 { y } else { -y }) as f32
}

/// One unary operator.
pub fn unary(u: Unary, x: f32) -> f32 {
    match u {
        Unary::Relu => x.max(0.0),
        Unary::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Unary::Tanh => x.tanh(),
        Unary::Gelu { tanh: false } => 0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2)),
        Unary::Gelu { tanh: true } => {
            0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh())
        }
        Unary::Exp => x.exp(),
        Unary::Log => x.ln(),
        Unary::Sqrt => x.sqrt(),
        Unary::Erf => erf(x),
        Unary::Clip { min, max } => {
            let mut v = x;
            if let Some(lo) = min {
                v = v.max(lo);
            }
            if let Some(hi) = max {
                v = v.min(hi);
            }
            v
        }
    }
}

/// One binary operator.
pub fn binary(b: Binary, x: f32, y: f32) -> f32 {
    match b {
        Binary::Add => x + y,
        Binary::Sub => x - y,
        Binary::Mul => x * y,
        Binary::Div => x / y,
        Binary::Pow => x.powf(y),
        Binary::Max => x.max(y),
        Binary::Min => x.min(y),
    }
}

/// Evaluates an elementwise operator into an output of shape `out`; every input must
/// broadcast to it.
pub fn eval(op: &ElementwiseOp, inputs: &[&Tensor], out: &[usize]) -> Result<Tensor, String> {
    let n = numel(out)?;
    let strides: Vec<Vec<usize>> = inputs
        .iter()
        .map(|t| broadcast_strides(&t.shape, out))
        .collect::<Result<_, _>>()?;
    let vals: Vec<Vec<f32>> = inputs.iter().map(|t| t.to_f32_vec()).collect();
    let mut idx = vec![0; out.len()];
    let mut data = Vec::with_capacity(n);
    for i in 0..n {
        unravel(i, out, &mut idx);
        let arg = |k: usize| -> Result<f32, String> {
            let off = idx
                .iter()
                .zip(strides.get(k).ok_or("an operand is missing")?)
                .try_fold(0usize, |acc, (a, b)| a.checked_mul(*b)?.checked_add(acc));
            off.and_then(|off| vals.get(k)?.get(off).copied())
                .ok_or_else(|| format!("operand {k} does not broadcast to {out:?}"))
        };
        data.push(match op {
            ElementwiseOp::Unary(u) => unary(*u, arg(0)?),
            ElementwiseOp::Binary(b) => binary(*b, arg(0)?, arg(1)?),
            ElementwiseOp::Where => {
                if arg(0)? != 0.0 {
                    arg(1)?
                } else {
                    arg(2)?
                }
            }
        });
    }
    Ok(Tensor::f32(out.to_vec(), data))
}
