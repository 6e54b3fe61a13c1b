//! Dynamic loss scaling for 16-bit gradients, with PyTorch's `GradScaler` rules: the
//! backward pass starts from the loss scale instead of 1 so that small gradients survive
//! 16-bit storage; the gradients are divided by it before the update; a step whose
//! gradients hold an infinity or a NaN is skipped and the scale backs off; after
//! `growth_interval` good steps in a row the scale grows.

use crate::tensor::TensorData;
use crate::weights::Weights;
use serde::{Deserialize, Serialize};

/// A dynamic loss scaler and its counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    /// The current scale.
    pub scale: f64,
    /// Factor applied after `growth_interval` good steps.
    pub growth_factor: f64,
    /// Factor applied after an overflow.
    pub backoff_factor: f64,
    /// Good steps in a row before the scale grows.
    pub growth_interval: u64,
    /// Good steps since the last change.
    pub good_steps: u64,
    /// Steps skipped because a gradient overflowed.
    pub skipped: u64,
    /// Times the scale grew.
    pub growths: u64,
    /// The largest scale: the scale is fed to the device like any value, so under 16-bit
    /// storage it must itself fit (2^15); growth stops there.
    pub max_scale: f64,
    /// The largest finite value of the gradients' storage (65504 for 16-bit floats): a
    /// gradient that reaches it counts as an overflow too, since a device may saturate an
    /// out-of-range store instead of writing an infinity. None: only non-finite values.
    pub storage_max: Option<f32>,
}

impl Default for LossScaler {
    /// PyTorch's defaults: scale 2^16, growth ×2 every 2000 good steps, back-off ×0.5.
    fn default() -> Self {
        LossScaler {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            good_steps: 0,
            skipped: 0,
            growths: 0,
            max_scale: f64::INFINITY,
            storage_max: None,
        }
    }
}

impl LossScaler {
    /// Divides the gradients by the scale they were computed with. Returns false (and
    /// backs off) when any gradient is not finite: the step must then be skipped.
    pub fn unscale(&mut self, grads: &mut Weights) -> bool {
        let max = self.storage_max.unwrap_or(f32::INFINITY);
        let finite = grads.values().all(|g| match &g.data {
            TensorData::F32(v) => v.iter().all(|x| x.is_finite() && x.abs() < max),
            _ => true,
        });
        if !finite {
            self.scale *= self.backoff_factor;
            self.skipped += 1;
            self.good_steps = 0;
            return false;
        }
        let inverse = 1.0 / self.scale;
        for g in grads.values_mut() {
            if let TensorData::F32(v) = &mut g.data {
                v.iter_mut()
                    .for_each(|x| *x = (f64::from(*x) * inverse) as f32);
            }
        }
        self.good_steps += 1;
        if self.good_steps >= self.growth_interval {
            let grown = self.scale * self.growth_factor;
            if grown.is_finite() && grown <= self.max_scale {
                self.scale = grown;
                self.growths += 1;
            }
            self.good_steps = 0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    fn grads(v: f32) -> Weights {
        Weights::from([("w".to_string(), Tensor::f32(vec![2], vec![v, 2.0 * v]))])
    }

    #[test]
    fn overflow_skips_and_backs_off_then_growth_resumes() {
        let mut s = LossScaler {
            growth_interval: 2,
            ..LossScaler::default()
        };
        let mut g = grads(65536.0);
        assert!(s.unscale(&mut g));
        assert_eq!(g["w"].as_f32().unwrap(), &[1.0, 2.0]);
        let mut bad = grads(f32::INFINITY);
        assert!(!s.unscale(&mut bad));
        assert_eq!((s.scale, s.skipped, s.good_steps), (32768.0, 1, 0));
        let mut nan = grads(f32::NAN);
        assert!(!s.unscale(&mut nan));
        assert_eq!(s.scale, 16384.0);
        assert!(s.unscale(&mut grads(1.0)));
        assert!(s.unscale(&mut grads(1.0)));
        assert_eq!((s.scale, s.growths), (32768.0, 1));
        // A saturated 16-bit store counts as an overflow.
        s.storage_max = Some(65504.0);
        assert!(!s.unscale(&mut grads(32752.0)));
        assert_eq!(s.skipped, 3);
    }
}
