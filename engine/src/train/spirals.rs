//! The spirals dataset: points on interleaved spiral arms in the plane, one arm per class,
//! for training small classifiers. Drawn from the engine's SplitMix64 stream with only
//! IEEE-754 arithmetic (sine and cosine are computed here, not by the platform's maths
//! library, whose last bits differ between systems), so the same parameters give the same
//! bytes everywhere. `assets/datasets/spirals/` holds [`Spirals::SHIPPED`], written by
//! `cargo run -p sluice-engine --example spirals`.

use super::data::{DataError, Dataset, FEATURES, LABELS};
use crate::graph::limits::{Limit, Limits, Widen};
use crate::rng::Rng;
use crate::tensor::{Tensor, TensorData};
use std::f64::consts::TAU;

/// The largest turns and noise a spirals dataset takes (angles stay finite and exact
/// enough to reduce).
const MAX_ANGLE: f64 = 1000.0;

/// How a spirals dataset is drawn. Sample `i` of class `k` (of `K`) lies at radius
/// `r = 0.1 + 0.9·t` and angle `2πk/K + 2π·turns·t + noise·(2u − 1)`, where
/// `t = (i + ½) / per_class` and `u` is uniform in [0, 1): features f32 `[K·per_class, 2]`
/// (`r·cos, r·sin`), labels i32 `[K·per_class]`, class by class.
#[derive(Debug, Clone, PartialEq)]
pub struct Spirals {
    /// Classes, one arm each (at least 2).
    pub classes: usize,
    /// Samples per class (at least 1).
    pub per_class: usize,
    /// Turns each arm makes from the centre outwards.
    pub turns: f64,
    /// Largest change of a sample's angle, in radians (the change is uniform).
    pub noise: f64,
    /// The seed of the stream `Rng::for_name(seed, "spirals")`.
    pub seed: u64,
}

impl Spirals {
    /// The dataset in `assets/datasets/spirals/`: 3 classes of 300 samples, one turn,
    /// angles moved by up to 0.2 radians.
    pub const SHIPPED: Spirals = Spirals {
        classes: 3,
        per_class: 300,
        turns: 1.0,
        noise: 0.2,
        seed: 13,
    };

    /// The dataset, its size checked against `limits` before anything is allocated.
    pub fn generate(&self, limits: &Limits) -> Result<Dataset, DataError> {
        let invalid = |m: String| Err(DataError::Invalid(format!("spirals: {m}")));
        if self.classes < 2 || i32::try_from(self.classes).is_err() {
            return invalid(format!(
                "{} classes (at least 2, at most {})",
                self.classes,
                i32::MAX
            ));
        }
        if self.per_class == 0 {
            return invalid("no samples per class".into());
        }
        let within = |x: f64| x.abs() <= MAX_ANGLE;
        if !(within(self.turns) && within(self.noise) && self.noise >= 0.0) {
            return invalid(format!(
                "turns {} and noise {} must lie within ±{MAX_ANGLE}, the noise not negative",
                self.turns, self.noise
            ));
        }
        let samples = self.classes.checked_mul(self.per_class);
        limits.check(
            Limit::MaxDatasetRows,
            "the spirals dataset",
            "samples",
            samples.map(Widen::widen),
        )?;
        let elements = samples.and_then(|n| n.checked_mul(2));
        limits.check(
            Limit::MaxTensorElements,
            "the spirals dataset's features",
            "elements",
            elements.map(Widen::widen),
        )?;
        let (samples, elements) = (samples.unwrap_or(0), elements.unwrap_or(0));
        let mut rng = Rng::for_name(self.seed, "spirals");
        let mut xy = Vec::with_capacity(elements);
        let mut labels = Vec::with_capacity(samples);
        let n = self.per_class as f64;
        for (k, class) in (0..self.classes).zip(0i32..) {
            let start = TAU * k as f64 / self.classes as f64;
            for i in 0..self.per_class {
                let t = (i as f64 + 0.5) / n;
                let r = 0.1 + 0.9 * t;
                let angle =
                    start + TAU * self.turns * t + self.noise * (2.0 * unit(&mut rng) - 1.0);
                let (sin, cos) = sin_cos(angle);
                xy.push((r * cos) as f32);
                xy.push((r * sin) as f32);
                labels.push(class);
            }
        }
        Dataset::new(
            vec![
                (FEATURES.into(), Tensor::f32(vec![samples, 2], xy)),
                (
                    LABELS.into(),
                    Tensor {
                        shape: vec![samples],
                        data: TensorData::I32(labels),
                    },
                ),
            ],
            limits,
        )
    }
}

/// A float uniform in [0, 1) with 53 random bits (exact).
fn unit(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// The sine and cosine of `x` from IEEE-754 operations alone: `x` reduced to [−π, π] by
/// whole turns, then Taylor series to the 27th power (errors below 1e−15 there).
fn sin_cos(x: f64) -> (f64, f64) {
    let x = x - TAU * (x / TAU).round();
    let x2 = x * x;
    let (mut sin, mut cos) = (x, 1.0);
    let (mut s, mut c) = (x, 1.0);
    for n in 1..=13 {
        let m = 2.0 * f64::from(n);
        c *= -x2 / ((m - 1.0) * m);
        s *= -x2 / (m * (m + 1.0));
        cos += c;
        sin += s;
    }
    (sin, cos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npy;

    #[test]
    fn the_shipped_files_are_regenerated_byte_for_byte() {
        let data = Spirals::SHIPPED.generate(&Limits::default()).unwrap();
        let bytes = |name: &str| npy::to_bytes(data.get(name).unwrap()).unwrap();
        let again = "regenerate it with `cargo run -p sluice-engine --example spirals`";
        assert!(
            bytes(FEATURES) == include_bytes!("../../../assets/datasets/spirals/features.npy"),
            "features.npy differs: {again}"
        );
        assert!(
            bytes(LABELS) == include_bytes!("../../../assets/datasets/spirals/labels.npy"),
            "labels.npy differs: {again}"
        );
        assert_eq!(data.samples(), 900);
        data.check_labels(LABELS, 3).unwrap();
    }

    #[test]
    fn sine_and_cosine_match_the_platforms_closely() {
        for i in -2000..2000 {
            let x = f64::from(i) * 0.01;
            let (s, c) = sin_cos(x);
            assert!((s - x.sin()).abs() < 1e-14, "sin {x}");
            assert!((c - x.cos()).abs() < 1e-14, "cos {x}");
        }
    }

    #[test]
    fn sizes_are_checked_before_anything_is_drawn() {
        let huge = Spirals {
            per_class: usize::MAX,
            ..Spirals::SHIPPED
        };
        let e = huge.generate(&Limits::default()).unwrap_err().to_string();
        assert!(e.contains("max_dataset_rows"), "{e}");
        let one = Spirals {
            classes: 1,
            ..Spirals::SHIPPED
        };
        assert!(one.generate(&Limits::default()).is_err());
        let nan = Spirals {
            noise: f64::NAN,
            ..Spirals::SHIPPED
        };
        assert!(nan.generate(&Limits::default()).is_err());
    }
}
