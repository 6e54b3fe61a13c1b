//! Precision reports: how far a reduced-precision run's outputs are from the f32 run on
//! the same inputs.
//!
//! - max abs error = max |a − b|;
//! - max rel error = max |a − b| / max |b| (relative to the output's largest magnitude, so
//!   outputs that cross zero, like layer norm, get a meaningful figure);
//! - elementwise rel error = max |a − b| / |b| over elements with |b| ≥ 1e-3;
//! - argmax agreement, for classifier outputs [N, C]: the share of rows whose largest
//!   element is the same;
//! - non-finite: NaN or infinite elements (f16 overflow shows up here, never silently).

use crate::tensor::Tensor;
use serde::Serialize;

/// Errors of one output against its f32 reference.
#[derive(Debug, Clone, Serialize)]
pub struct OutputError {
    /// Output name.
    pub name: String,
    /// max |a − b|.
    pub max_abs: f64,
    /// max |a − b| / max |b|.
    pub max_rel: f64,
    /// max |a − b| / |b| where |b| ≥ 1e-3.
    pub max_rel_elementwise: f64,
    /// Share of rows with the same argmax (2-D outputs).
    pub argmax_agreement: Option<f64>,
    /// NaN or infinite elements in the reduced-precision output.
    pub non_finite: usize,
}

/// Compares `got` with `reference`, output by output (matched by position).
pub fn compare(reference: &[(String, Tensor)], got: &[(String, Tensor)]) -> Vec<OutputError> {
    reference
        .iter()
        .zip(got)
        .map(|((name, b), (_, a))| {
            let (av, bv) = (a.to_f32_vec(), b.to_f32_vec());
            let scale = bv.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
            let mut max_abs = 0.0f64;
            let mut max_rel_el = 0.0f64;
            for (&x, &y) in av.iter().zip(&bv) {
                let d = (f64::from(x) - f64::from(y)).abs();
                let d = if d.is_nan() { f64::INFINITY } else { d };
                max_abs = max_abs.max(d);
                if f64::from(y).abs() >= 1e-3 {
                    max_rel_el = max_rel_el.max(d / f64::from(y).abs());
                }
            }
            let argmax_agreement = (b.shape.len() == 2 && b.shape[1] > 1 && a.shape == b.shape)
                .then(|| {
                    let c = b.shape[1];
                    let rows = b.shape[0].max(1);
                    let am = |v: &[f32], r: usize| {
                        (0..c)
                            .max_by(|&i, &j| v[r * c + i].total_cmp(&v[r * c + j]))
                            .unwrap_or(0)
                    };
                    (0..b.shape[0])
                        .filter(|&r| am(&av, r) == am(&bv, r))
                        .count() as f64
                        / rows as f64
                });
            OutputError {
                name: name.clone(),
                max_abs,
                max_rel: if scale > 0.0 {
                    max_abs / scale
                } else {
                    max_abs
                },
                max_rel_elementwise: max_rel_el,
                argmax_agreement,
                non_finite: a.non_finite(),
            }
        })
        .collect()
}

/// The precision report of a reduced-precision run: the same dataset through an f32
/// session compiled on `devices` (the same configuration otherwise), compared output by
/// output with the run's `outputs`.
pub async fn against_f32(
    graph: &crate::graph::Graph,
    weights: &crate::weights::Weights,
    config: &crate::exec::RunConfig,
    devices: Vec<Box<dyn crate::exec::Device>>,
    data: &crate::exec::Values,
    outputs: &[(String, Tensor)],
) -> Result<Vec<OutputError>, crate::error::RunError> {
    let f32_config = crate::exec::RunConfig {
        precision: crate::plan::Precision::F32,
        half: None,
        ..config.clone()
    };
    let mut session =
        crate::exec::Session::compile(graph, weights, &f32_config, devices, &|_| {}).await?;
    let ctx = crate::exec::RunContext {
        concurrency: crate::exec::Concurrency::OneThread,
        ..crate::exec::RunContext::new("f32 reference")
    };
    let reference = session.run(data, &ctx).await?;
    Ok(compare(&reference.outputs, outputs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_and_argmax() {
        let b = Tensor::f32(vec![2, 3], vec![0.1, 0.7, 0.2, 0.5, 0.3, 0.2]);
        let a = Tensor::f32(vec![2, 3], vec![0.1, 0.69, 0.2, 0.3, 0.5, 0.2]);
        let e = &compare(&[("p".into(), b)], &[("p".into(), a)])[0];
        assert!((e.max_abs - 0.2).abs() < 1e-6);
        assert!((e.max_rel - 0.2 / 0.7).abs() < 1e-6);
        assert_eq!(e.argmax_agreement, Some(0.5));
        assert_eq!(e.non_finite, 0);
    }
}
