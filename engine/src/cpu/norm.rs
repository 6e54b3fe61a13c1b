//! CPU reference of the normalisation family.

use super::{floats, Float, Host};
use crate::ops::norm::NormOp;
use crate::shape;

/// Evaluates softmax, log-softmax, the row-wise norms (layer, RMS, instance, group) or
/// batch norm.
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
        NormOp::LayerNorm { .. }
        | NormOp::RmsNorm { .. }
        | NormOp::InstanceNorm { .. }
        | NormOp::GroupNorm { .. } => {
            let rows = op
                .rows(dims)?
                .ok_or("internal: not a row-wise normalisation")?;
            let scale = floats(params[0])?;
            let bias = if rows.bias {
                Some(floats(params[1])?)
            } else {
                None
            };
            let len = rows.len;
            for (row, chunk) in v.chunks(len.max(1)).enumerate() {
                let mean = if rows.center {
                    chunk.iter().map(|&x| x.to_f64()).sum::<f64>() / len as f64
                } else {
                    0.0
                };
                let var = chunk
                    .iter()
                    .map(|&x| (x.to_f64() - mean).powi(2))
                    .sum::<f64>()
                    / len as f64;
                let inv = 1.0 / (var + f64::from(op.epsilon())).sqrt();
                for (j, &x) in chunk.iter().enumerate() {
                    let i = row * len + j;
                    let p = (i / rows.param_div) % rows.param_mod;
                    let shift = bias.map_or(T::F::ZERO, |b| b[p]);
                    out[i] = T::F::from_f64((x.to_f64() - mean) * inv) * scale[p] + shift;
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

#[cfg(test)]
mod tests {
    use crate::ops::{parse, Op};
    use crate::tensor::Tensor;
    use serde_json::{json, Value};

    fn run(op: &str, attrs: Value, x: Tensor, params: &[Tensor]) -> Vec<f32> {
        let Ok(Op::Norm(n)) = parse(op, attrs.as_object().unwrap()) else {
            panic!("{op} is a normalisation");
        };
        let params: Vec<&Tensor> = params.iter().collect();
        super::eval(&n, &x, &params).unwrap().to_f32_vec()
    }

    fn close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{got:?} != {want:?}");
        }
    }

    #[test]
    fn row_norms_on_hand_checked_numbers() {
        // RMS of [3, 4] is √12.5; scale [1, 2].
        let x = Tensor::f32(vec![1, 2], vec![3.0, 4.0]);
        let r = 12.5f32.sqrt();
        let y = run(
            "rms_norm",
            json!({ "epsilon": 0.0 }),
            x,
            &[Tensor::f32(vec![2], vec![1.0, 2.0])],
        );
        close(&y, &[3.0 / r, 8.0 / r]);
        // Instance norm: channel 0 is [1, 3] (mean 2, std 1), channel 1 [5, 5] (std 0:
        // the bias alone); scale [2, 1], bias [0, 7].
        let x = Tensor::f32(vec![1, 2, 2], vec![1.0, 3.0, 5.0, 5.0]);
        let (scale, bias) = (
            Tensor::f32(vec![2], vec![2.0, 1.0]),
            Tensor::f32(vec![2], vec![0.0, 7.0]),
        );
        let y = run(
            "instance_norm",
            json!({ "epsilon": 0.0 }),
            x.clone(),
            &[scale.clone(), bias.clone()],
        );
        close(&y[..2], &[-2.0, 2.0]);
        assert!(y[2..].iter().all(|v| v.is_nan()), "0/0 with epsilon 0");
        // Group norm with one group: all four values [1, 3, 5, 5] (mean 3.5, variance
        // 2.75), weights still per channel.
        let y = run(
            "group_norm",
            json!({ "num_groups": 1, "epsilon": 0.0 }),
            x,
            &[scale, bias],
        );
        let s = 2.75f32.sqrt();
        close(&y, &[-5.0 / s, -1.0 / s, 1.5 / s + 7.0, 1.5 / s + 7.0]);
    }

    #[test]
    fn bad_group_counts_and_stash_types_are_errors_naming_the_attribute() {
        let attrs = |v: Value| v.as_object().unwrap().clone();
        let e = parse("group_norm", &attrs(json!({ "num_groups": 0 }))).unwrap_err();
        assert_eq!(e[0].0, "num_groups");
        let e = parse("rms_norm", &attrs(json!({ "stash_type": 10 }))).unwrap_err();
        assert_eq!(e[0].0, "stash_type");
        let op = parse("group_norm", &attrs(json!({ "num_groups": 4 }))).unwrap();
        let x = crate::ops::TensorType::f32(crate::shape::known(&[2, 6, 3]));
        assert!(op.infer(&[x]).unwrap_err().contains("does not divide"));
    }
}
