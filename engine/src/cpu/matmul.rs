//! CPU reference of the matmul family.

use super::{floats, Float, Host};
use crate::ops::matmul::{batched_problem, MatMulOp, Problem};

fn product<F: Float>(p: &Problem, a: &[F], b: &[F], bias: Option<&[F]>) -> Vec<F> {
    let mut c = Vec::with_capacity(p.offsets.len() * p.m * p.n);
    for &(oa, ob) in &p.offsets {
        for i in 0..p.m {
            for j in 0..p.n {
                let mut acc = F::ZERO;
                for k in 0..p.k {
                    acc += a[oa + i * p.k + k] * b[ob + k * p.n + j];
                }
                c.push(acc + bias.map_or(F::ZERO, |b| b[j]));
            }
        }
    }
    c
}

/// Evaluates `matmul` or `linear`.
pub fn eval<T: Host>(
    op: &MatMulOp,
    inputs: &[&T],
    params: &[&T],
    out: &[Vec<usize>],
) -> Result<Vec<T>, String> {
    let a = floats(inputs[0])?;
    let data = match op {
        MatMulOp::MatMul => {
            let p = batched_problem(inputs[0].shape(), inputs[1].shape())?;
            product(&p, a, floats(inputs[1])?, None)
        }
        MatMulOp::Linear { out_features, bias } => {
            let k = inputs[0].shape().last().copied().unwrap_or(1);
            let p = Problem {
                m: a.len() / k.max(1),
                n: *out_features,
                k,
                offsets: vec![(0, 0)],
            };
            let b = if *bias {
                Some(floats(params[1])?)
            } else {
                None
            };
            product(&p, a, floats(params[0])?, b)
        }
    };
    Ok(vec![T::from_floats(out[0].clone(), data)])
}
