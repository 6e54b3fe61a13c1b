//! CPU reference of the normalisation family.

use super::floats;
use crate::ops::norm::NormOp;
use crate::shape;
use crate::tensor::Tensor;

/// Evaluates softmax, log-softmax, layer norm or batch norm.
pub fn eval(op: &NormOp, x: &Tensor, params: &[&Tensor]) -> Result<Tensor, String> {
    let v = floats(x)?;
    let dims = &x.shape;
    let mut out = vec![0.0f32; v.len()];
    match op {
        NormOp::Softmax { axis, log } => {
            let a = shape::existing_axis(*axis, dims.len())?;
            let len = dims[a];
            let inner: usize = dims[a + 1..].iter().product();
            let outer: usize = dims[..a].iter().product();
            for o in 0..outer {
                for i in 0..inner {
                    let at = |j: usize| o * len * inner + j * inner + i;
                    let m = (0..len).map(|j| v[at(j)]).fold(f32::NEG_INFINITY, f32::max);
                    let s: f64 = (0..len).map(|j| f64::from((v[at(j)] - m).exp())).sum();
                    for j in 0..len {
                        let d = v[at(j)] - m;
                        out[at(j)] = if *log {
                            d - (s as f32).ln()
                        } else {
                            (f64::from(d.exp()) / s) as f32
                        };
                    }
                }
            }
        }
        NormOp::LayerNorm { axis, epsilon } => {
            let a = shape::axis(*axis, dims.len())?;
            let len: usize = dims[a..].iter().product();
            let (scale, bias) = (floats(params[0])?, floats(params[1])?);
            for (row, chunk) in v.chunks(len.max(1)).enumerate() {
                let mean = chunk.iter().map(|&x| f64::from(x)).sum::<f64>() / len as f64;
                let var = chunk
                    .iter()
                    .map(|&x| (f64::from(x) - mean).powi(2))
                    .sum::<f64>()
                    / len as f64;
                let inv = 1.0 / (var + f64::from(*epsilon)).sqrt();
                for (j, &x) in chunk.iter().enumerate() {
                    out[row * len + j] = ((f64::from(x) - mean) * inv) as f32 * scale[j] + bias[j];
                }
            }
        }
        NormOp::BatchNorm { epsilon } => {
            let c = dims[1];
            let inner: usize = dims[2..].iter().product();
            let p: Vec<&[f32]> = params.iter().map(|t| floats(t)).collect::<Result<_, _>>()?;
            for (i, &x) in v.iter().enumerate() {
                let ch = (i / inner.max(1)) % c.max(1);
                out[i] = (x - p[2][ch]) / (p[3][ch] + epsilon).sqrt() * p[0][ch] + p[1][ch];
            }
        }
    }
    Ok(Tensor::f32(dims.clone(), out))
}
