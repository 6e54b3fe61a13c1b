//! CPU reference of the normalisation family.

use super::{floats, Float, Host};
use crate::ops::norm::NormOp;
use crate::shape;

/// Evaluates softmax, log-softmax, layer norm or batch norm.
pub fn eval<T: Host>(op: &NormOp, x: &T, params: &[&T]) -> Result<T, String> {
    let v = floats(x)?;
    let dims = x.shape();
    let mut out = vec![T::F::ZERO; v.len()];
    match op {
        NormOp::Softmax { axis, log } => {
            let a = shape::existing_axis(*axis, dims.len())?;
            let len = dims[a];
            let inner: usize = dims[a + 1..].iter().product();
            let outer: usize = dims[..a].iter().product();
            for o in 0..outer {
                for i in 0..inner {
                    let at = |j: usize| o * len * inner + j * inner + i;
                    let m = (0..len)
                        .map(|j| v[at(j)])
                        .fold(T::F::NEG_INFINITY, T::F::max);
                    let s: f64 = (0..len).map(|j| (v[at(j)] - m).exp().to_f64()).sum();
                    for j in 0..len {
                        let d = v[at(j)] - m;
                        out[at(j)] = if *log {
                            d - T::F::from_f64(s).ln()
                        } else {
                            T::F::from_f64(d.exp().to_f64() / s)
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
                let mean = chunk.iter().map(|&x| x.to_f64()).sum::<f64>() / len as f64;
                let var = chunk
                    .iter()
                    .map(|&x| (x.to_f64() - mean).powi(2))
                    .sum::<f64>()
                    / len as f64;
                let inv = 1.0 / (var + f64::from(*epsilon)).sqrt();
                for (j, &x) in chunk.iter().enumerate() {
                    out[row * len + j] =
                        T::F::from_f64((x.to_f64() - mean) * inv) * scale[j] + bias[j];
                }
            }
        }
        NormOp::BatchNorm { epsilon, .. } => {
            let c = dims[1];
            let inner: usize = dims[2..].iter().product();
            let p: Vec<&[T::F]> = params
                .iter()
                .map(|t| floats(*t))
                .collect::<Result<_, _>>()?;
            let epsilon = T::F::from_f32(*epsilon);
            for (i, &x) in v.iter().enumerate() {
                let ch = (i / inner.max(1)) % c.max(1);
                out[i] = (x - p[2][ch]) / (p[3][ch] + epsilon).sqrt() * p[0][ch] + p[1][ch];
            }
        }
    }
    Ok(T::from_floats(dims.to_vec(), out))
}
