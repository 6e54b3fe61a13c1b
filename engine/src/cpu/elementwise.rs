//! CPU reference of the elementwise family, with numpy broadcasting.

use super::{unravel, Float, Host};
use crate::ops::elementwise::{Binary, ElementwiseOp, Unary};
use crate::shape::{broadcast_strides, numel};

/// erf with the same 1.5e-7 approximation family as the kernel, in f64.
pub fn erf<F: Float>(x: F) -> F {
    let x = x.to_f64();
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-x * x).exp();
    F::from_f64(if x >= 0.0 { y } else { -y })
}

/// One unary operator.
pub fn unary<F: Float>(u: Unary, x: F) -> F {
    let (half, one) = (F::from_f32(0.5), F::ONE);
    match u {
        Unary::Relu => x.max(F::ZERO),
        Unary::Sigmoid => one / (one + (-x).exp()),
        Unary::Tanh => x.tanh(),
        Unary::Gelu { tanh: false } => half * x * (one + erf(x / F::SQRT_2)),
        Unary::Gelu { tanh: true } => {
            let c = F::from_f32(0.044715);
            half * x * (one + (F::from_f32(0.797_884_6) * (x + c * x * x * x)).tanh())
        }
        Unary::Exp => x.exp(),
        Unary::Log => x.ln(),
        Unary::Sqrt => x.sqrt(),
        Unary::Erf => erf(x),
        Unary::Clip { min, max } => {
            let mut v = x;
            if let Some(lo) = min {
                v = v.max(F::from_f32(lo));
            }
            if let Some(hi) = max {
                v = v.min(F::from_f32(hi));
            }
            v
        }
    }
}

/// One binary operator.
pub fn binary<F: Float>(b: Binary, x: F, y: F) -> F {
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
pub fn eval<T: Host>(op: &ElementwiseOp, inputs: &[&T], out: &[usize]) -> Result<T, String> {
    let n = numel(out)?;
    let strides: Vec<Vec<usize>> = inputs
        .iter()
        .map(|t| broadcast_strides(t.shape(), out))
        .collect::<Result<_, _>>()?;
    let vals: Vec<Vec<T::F>> = inputs.iter().map(|t| t.to_floats()).collect();
    let mut idx = vec![0; out.len()];
    let mut data = Vec::with_capacity(n);
    for i in 0..n {
        unravel(i, out, &mut idx);
        let arg = |k: usize| -> Result<T::F, String> {
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
                if arg(0)? != T::F::ZERO {
                    arg(1)?
                } else {
                    arg(2)?
                }
            }
        });
    }
    Ok(T::from_floats(out.to_vec(), data))
}
