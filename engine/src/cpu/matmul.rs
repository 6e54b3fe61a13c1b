//! CPU reference of the matmul family.

use super::floats;
use crate::ops::matmul::{batched_problem, MatMulOp, Problem};
use crate::tensor::Tensor;

fn product(p: &Problem, a: &[f32], b: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
    let mut c = Vec::with_capacity(p.offsets.len() * p.m * p.n);
    for &(oa, ob) in &p.offsets {
        for i in 0..p.m {
            for j in 0..p.n {
                let mut acc = 0.0f32;
                for k in 0..p.k {
                    acc += a[oa + i * p.k + k] * b[ob + k * p.n + j];
                }
                c.push(acc + bias.map_or(0.0, |b| b[j]));
            }
        }
    }
    c
}

/// Evaluates `matmul` or `linear`.
pub fn eval(
    op: &MatMulOp,
    inputs: &[&Tensor],
    params: &[&Tensor],
    out: &[Vec<usize>],
) -> Result<Vec<Tensor>, String> {
    let a = floats(inputs[0])?;
    let data = match op {
        MatMulOp::MatMul => {
            let p = batched_problem(&inputs[0].shape, &inputs[1].shape)?;
            product(&p, a, floats(inputs[1])?, None)
        }
        MatMulOp::Linear { out_features, bias } => {
            let k = inputs[0].shape.last().copied().unwrap_or(1);
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
    Ok(vec![Tensor::f32(out[0].clone(), data)])
}
