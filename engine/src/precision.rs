//! Precision reports: how far a reduced-precision run's outputs are from the f32 run on
//! the same inputs.
//!
//! - max abs error = max |a − b|;
//! - max rel error = max |a − b| / max |b| (relative to the output's largest magnitude, so
//!   outputs that cross zero, like layer norm, get a meaningful figure);
//! - elementwise rel error = max |a − b| / |b| over elements with |b| ≥ 1e-3;
//! - argmax agreement, for classifier outputs [N, C]: the share of rows whose largest
//!   element is the same;
//! - non-finite: NaN or infinite elements (f16 overflow shows up here, never silently),
//!   and the elements finite in one run but not in the other.
//!
//! An output is flagged ([`OutputError::flag`]) when its error is beyond what the precision
//! explains: any element finite in one run and not in the other, a max rel error above
//! [`max_rel_tolerance`], or more than [`ARGMAX_FLIP_TOLERANCE`] of a classifier's rows
//! changing their argmax. [`against_f32`] logs a warning for each flagged output.

use crate::plan::Precision;
use crate::tensor::Tensor;
use serde::Serialize;

/// The max rel error (max |a − b| / max |b|) a reduced-precision output may have before it
/// is flagged: 1e-2 for `mixed` (f16 storage, f32 accumulation: a few roundings of 2^-11
/// each, the bound the examples meet on 1,000 inputs), 5e-2 for `f16` (sums accumulate in
/// f16 too), 0 for `f32` (the same computation).
pub fn max_rel_tolerance(precision: Precision) -> f64 {
    match precision {
        Precision::F32 => 0.0,
        Precision::Mixed => 1e-2,
        Precision::F16 => 5e-2,
    }
}

/// The share of a classifier output's rows that may change their argmax before it is
/// flagged: rounding decides genuine near-ties either way, so a few flips are expected.
pub const ARGMAX_FLIP_TOLERANCE: f64 = 0.01;

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
    /// NaN or infinite elements in the f32 reference.
    pub non_finite_f32: usize,
    /// Elements finite in one run and not in the other (either way), or of different
    /// shapes' outputs all of them.
    pub finite_mismatch: usize,
    /// The max rel error tolerated for the precision ([`max_rel_tolerance`]).
    pub tolerance: f64,
    /// Why the output is beyond what the precision explains; `None` when it is within.
    pub flag: Option<String>,
}

/// Compares `got` with `reference`, output by output (matched by position), flagging by
/// the `mixed` tolerance ([`compare_at`] takes the precision).
pub fn compare(reference: &[(String, Tensor)], got: &[(String, Tensor)]) -> Vec<OutputError> {
    compare_at(reference, got, Precision::Mixed)
}

/// Compares `got` (run at `precision`) with its f32 `reference`, output by output
/// (matched by position), flagging errors beyond the precision's tolerance.
pub fn compare_at(
    reference: &[(String, Tensor)],
    got: &[(String, Tensor)],
    precision: Precision,
) -> Vec<OutputError> {
    let tolerance = max_rel_tolerance(precision);
    reference
        .iter()
        .zip(got)
        .map(|((name, b), (_, a))| {
            let (av, bv) = (a.to_f32_vec(), b.to_f32_vec());
            let scale = bv
                .iter()
                .filter(|x| x.is_finite())
                .fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
            let mut max_abs = 0.0f64;
            let mut max_rel_el = 0.0f64;
            let mut finite_mismatch = if a.shape == b.shape { 0 } else { av.len().max(bv.len()) };
            for (&x, &y) in av.iter().zip(&bv) {
                if x.is_finite() != y.is_finite() {
                    finite_mismatch += 1;
                }
                // The same non-finite answer in both runs is no error.
                let same = x == y || x.is_nan() && y.is_nan();
                let d = if same {
                    0.0
                } else {
                    (f64::from(x) - f64::from(y)).abs()
                };
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
            let max_rel = if scale > 0.0 {
                max_abs / scale
            } else {
                max_abs
            };
            let flag = if finite_mismatch > 0 {
                Some(format!(
                    "{finite_mismatch} element(s) finite in one run and not the other ({} non-finite at {}, {} in f32)",
                    a.non_finite(),
                    precision.name(),
                    b.non_finite()
                ))
            } else if max_rel > tolerance {
                Some(format!(
                    "max rel error {max_rel:.3e} is beyond the {} tolerance {tolerance:.0e} (max abs error {max_abs:.3e})",
                    precision.name()
                ))
            } else {
                argmax_agreement
                    .filter(|&agree| 1.0 - agree > ARGMAX_FLIP_TOLERANCE)
                    .map(|agree| {
                        format!(
                            "{:.2}% of rows change their argmax (more than {:.0}%)",
                            100.0 * (1.0 - agree),
                            100.0 * ARGMAX_FLIP_TOLERANCE
                        )
                    })
            };
            OutputError {
                name: name.clone(),
                max_abs,
                max_rel,
                max_rel_elementwise: max_rel_el,
                argmax_agreement,
                non_finite: a.non_finite(),
                non_finite_f32: b.non_finite(),
                finite_mismatch,
                tolerance,
                flag,
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
    let errors = compare_at(&reference.outputs, outputs, config.precision);
    for e in &errors {
        if let Some(flag) = &e.flag {
            tracing::warn!(
                "precision {}: output '{}' is not within tolerance of f32: {flag}",
                config.precision.name(),
                e.name
            );
        }
    }
    Ok(errors)
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
        assert!(e.flag.is_some(), "an error of 0.29 of the scale is flagged");
    }

    #[test]
    fn within_tolerance_is_not_flagged() {
        let b = Tensor::f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let a = Tensor::f32(vec![2, 2], vec![1.001, 2.0, 3.0, 4.0]);
        let e = &compare_at(&[("p".into(), b)], &[("p".into(), a)], Precision::Mixed)[0];
        assert_eq!(e.flag, None);
        assert_eq!(e.finite_mismatch, 0);
    }

    #[test]
    fn non_finite_either_way_is_flagged_and_equal_infinities_are_no_error() {
        let b = Tensor::f32(vec![3], vec![f32::INFINITY, 1.0, 2.0]);
        let a = Tensor::f32(vec![3], vec![f32::INFINITY, f32::NAN, 2.0]);
        let e = &compare(&[("p".into(), b.clone())], &[("p".into(), a)])[0];
        assert_eq!(
            (e.non_finite, e.non_finite_f32, e.finite_mismatch),
            (2, 1, 1)
        );
        assert!(e.flag.as_deref().is_some_and(|f| f.contains("finite")));
        // The same infinity in both runs: no error, nothing to flag.
        let e = &compare(&[("p".into(), b.clone())], &[("p".into(), b)])[0];
        assert_eq!((e.max_abs, e.finite_mismatch), (0.0, 0));
        assert_eq!(e.flag, None);
    }

    #[test]
    fn wrong_but_finite_is_flagged() {
        // Every element −100 where f32 says about 80 (the melspectrogram of issue 34).
        let b = Tensor::f32(vec![4], vec![80.0, 81.0, 79.5, 82.0]);
        let a = Tensor::f32(vec![4], vec![-100.0; 4]);
        let e = &compare(&[("db".into(), b)], &[("db".into(), a)])[0];
        assert_eq!(e.non_finite, 0);
        assert!(e.flag.as_deref().is_some_and(|f| f.contains("tolerance")));
    }
}
