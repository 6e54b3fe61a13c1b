//! CPU reference of the loss family, computed in f64 per element and summed in f64.

use super::{floats, Float, Host};
use crate::ops::loss::{LossKind, LossOp, Reduction};

/// log(Σ exp(x)) of a row, with the maximum taken out first.
fn log_sum_exp(row: &[f64]) -> f64 {
    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + row.iter().map(|&x| (x - m).exp()).sum::<f64>().ln()
}

/// The per-element losses.
fn elements<T: Host>(op: &LossOp, a: &T, b: &T) -> Result<Vec<f64>, String> {
    let x = floats(a)?;
    if !op.has_labels() {
        let t = floats(b)?;
        return Ok(x
            .iter()
            .zip(t)
            .map(|(&x, &t)| {
                let (x, t) = (x.to_f64(), t.to_f64());
                match op.kind {
                    LossKind::Mse => (x - t) * (x - t),
                    _ => x.max(0.0) - x * t + (-x.abs()).exp().ln_1p(),
                }
            })
            .collect());
    }
    let Some(labels) = b.ints() else {
        return Err(format!("{} labels must be i32", op.name()));
    };
    let classes = *a.shape().last().ok_or("logits need a class axis")?;
    if classes == 0 {
        return Err(format!("{} needs at least one class", op.name()));
    }
    let mut out = Vec::with_capacity(labels.len());
    for (row, &label) in x.chunks(classes).zip(labels) {
        let y = usize::try_from(label)
            .ok()
            .filter(|&y| y < classes)
            .ok_or_else(|| format!("{}: label {label} is outside [0, {classes})", op.name()))?;
        let row: Vec<f64> = row.iter().map(|&v| v.to_f64()).collect();
        out.push(match op.kind {
            LossKind::SoftmaxCrossEntropy { label_smoothing } => {
                let lse = log_sum_exp(&row);
                let eps = f64::from(label_smoothing);
                let mean_x = row.iter().sum::<f64>() / classes as f64;
                (1.0 - eps) * (lse - row[y]) + eps * (lse - mean_x)
            }
            _ => -row[y],
        });
    }
    Ok(out)
}

/// Evaluates a loss into an output of shape `out` (`[]` unless the reduction is "none").
pub fn eval<T: Host>(op: &LossOp, inputs: &[&T], out: &[usize]) -> Result<T, String> {
    let (a, b) = match inputs {
        [a, b] => (*a, *b),
        _ => return Err(format!("{} takes two inputs", op.name())),
    };
    let losses = elements(op, a, b)?;
    let total = || losses.iter().sum::<f64>();
    let data = match op.reduction {
        Reduction::None => losses.iter().map(|&v| T::F::from_f64(v)).collect(),
        Reduction::Sum => vec![T::F::from_f64(total())],
        // A mean of nothing is NaN, as in PyTorch.
        Reduction::Mean => vec![T::F::from_f64(total() / losses.len() as f64)],
    };
    Ok(T::from_floats(out.to_vec(), data))
}

#[cfg(test)]
mod tests {
    use crate::ops::{parse, Op};
    use crate::tensor::{Tensor, TensorData};
    use serde_json::{json, Value};

    fn run(op: &str, attrs: Value, a: Tensor, b: Tensor) -> Result<Tensor, String> {
        let Ok(Op::Loss(l)) = parse(op, attrs.as_object().unwrap()) else {
            panic!("{op} is a loss");
        };
        let types: Vec<_> = [&a, &b]
            .iter()
            .map(|t| crate::ops::TensorType {
                shape: crate::shape::known(&t.shape),
                dtype: t.dtype(),
            })
            .collect();
        let out = Op::Loss(l.clone()).infer(&types)?;
        let shape = crate::shape::concrete(&out[0].shape).unwrap();
        super::eval(&l, &[&a, &b], &shape)
    }

    fn labels(v: Vec<i32>) -> Tensor {
        Tensor {
            shape: vec![v.len()],
            data: TensorData::I32(v),
        }
    }

    fn close(got: &Tensor, want: &[f64]) {
        let g = got.as_f32().unwrap();
        assert_eq!(g.len(), want.len());
        for (a, b) in g.iter().zip(want) {
            assert!((f64::from(*a) - b).abs() < 1e-5, "{g:?} != {want:?}");
        }
    }

    #[test]
    fn cross_entropy_matches_hand_computed_values() {
        // Row 0: logits [1, 2, 3], label 2: lse = 3 + ln(e^-2 + e^-1 + 1) = 3.407606.
        // Row 1: logits [0, 0, 0], label 0: ln 3 = 1.098612.
        let logits = Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 0.0, 0.0, 0.0]);
        let (l0, l1) = (3.407_605_964 - 3.0, 1.098_612_289);
        let none = run(
            "softmax_cross_entropy",
            json!({ "reduction": "none" }),
            logits.clone(),
            labels(vec![2, 0]),
        )
        .unwrap();
        assert_eq!(none.shape, vec![2]);
        close(&none, &[l0, l1]);
        let mean = run(
            "softmax_cross_entropy",
            json!({}),
            logits.clone(),
            labels(vec![2, 0]),
        )
        .unwrap();
        assert_eq!(mean.shape, Vec::<usize>::new());
        close(&mean, &[(l0 + l1) / 2.0]);
        let sum = run(
            "softmax_cross_entropy",
            json!({ "reduction": "sum" }),
            logits.clone(),
            labels(vec![2, 0]),
        )
        .unwrap();
        close(&sum, &[l0 + l1]);
        // Smoothing 0.3: row 0 adds 0.3 · (lse − mean(x)) = 0.3 · (3.407606 − 2).
        let smooth = run(
            "softmax_cross_entropy",
            json!({ "reduction": "none", "label_smoothing": 0.3 }),
            logits,
            labels(vec![2, 0]),
        )
        .unwrap();
        close(&smooth, &[0.7 * l0 + 0.3 * (3.407_605_964 - 2.0), l1]);
    }

    #[test]
    fn cross_entropy_is_stable_for_large_logits() {
        let logits = Tensor::f32(vec![1, 2], vec![1000.0, 0.0]);
        let l = run("softmax_cross_entropy", json!({}), logits, labels(vec![1])).unwrap();
        close(&l, &[1000.0]);
    }

    #[test]
    fn out_of_range_labels_are_errors() {
        let logits = Tensor::f32(vec![2, 3], vec![0.0; 6]);
        for bad in [3, -1] {
            let e = run(
                "softmax_cross_entropy",
                json!({}),
                logits.clone(),
                labels(vec![0, bad]),
            )
            .unwrap_err();
            assert!(e.contains(&format!("label {bad} is outside [0, 3)")), "{e}");
            assert!(run("nll_loss", json!({}), logits.clone(), labels(vec![bad, 0])).is_err());
        }
    }

    #[test]
    fn nll_mse_and_bce_match_hand_computed_values() {
        let lp = Tensor::f32(vec![2, 2], vec![-0.5, -1.5, -2.0, -0.25]);
        let l = run(
            "nll_loss",
            json!({ "reduction": "none" }),
            lp.clone(),
            labels(vec![1, 0]),
        )
        .unwrap();
        close(&l, &[1.5, 2.0]);
        close(
            &run("nll_loss", json!({}), lp, labels(vec![1, 1])).unwrap(),
            &[0.875],
        );
        let p = Tensor::f32(vec![3], vec![1.0, -2.0, 0.5]);
        let t = Tensor::f32(vec![3], vec![0.0, 1.0, 0.5]);
        close(
            &run("mse_loss", json!({}), p.clone(), t.clone()).unwrap(),
            &[10.0 / 3.0],
        );
        close(
            &run("mse_loss", json!({ "reduction": "sum" }), p, t).unwrap(),
            &[10.0],
        );
        // x = 2, t = 1: log(1 + e^-2) = 0.126928; x = -3, t = 0.25: 0.75 + log(1 + e^-3).
        let x = Tensor::f32(vec![3], vec![2.0, -3.0, 100.0]);
        let t = Tensor::f32(vec![3], vec![1.0, 0.25, 0.0]);
        let l = run("bce_with_logits", json!({ "reduction": "none" }), x, t).unwrap();
        close(&l, &[0.126_928_011, 0.75 + 0.048_587_352, 100.0]);
    }
}
