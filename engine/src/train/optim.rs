//! Optimisers: SGD (momentum, Nesterov), Adam and AdamW with weight decay, gradient
//! clipping by global norm and learning-rate schedules (configured by
//! [`OptimizerConfig`], which the graph file's training section owns), with PyTorch's
//! update rules
//! (`torch.optim`, `torch.nn.utils.clip_grad_norm_`) so that a step matches it.
//!
//! Parameters and gradients are host tensors keyed like weights (`fc1.weight`). Each
//! element's update is computed in f64 and stored as f32 (the master weights are f32
//! whatever the storage a device computes in). The state (step count, moment buffers) is
//! plain data: [`Optimizer::state`] and [`Optimizer::restore`] carry it through
//! checkpoints.

use crate::graph::training::{OptimizerConfig, Rule};
use crate::tensor::{Tensor, TensorData};
use crate::weights::Weights;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Errors of an optimiser step or of its configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptimError {
    /// A hyper-parameter is out of its range.
    #[error("optimizer setting '{setting}': {message}")]
    Setting {
        /// The setting (`lr`, `momentum`, ...).
        setting: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A gradient of no parameter, or of another shape than its parameter's.
    #[error("parameter '{key}': {message}")]
    Gradient {
        /// The parameter's key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// Restored state does not fit the parameters.
    #[error("optimizer state: {0}")]
    State(String),
}

/// An optimiser: its configuration and its state.
#[derive(Debug, Clone, PartialEq)]
pub struct Optimizer {
    config: OptimizerConfig,
    state: OptimizerState,
}

/// An optimiser's state: what a checkpoint keeps to resume exactly.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OptimizerState {
    /// Steps taken.
    pub step: u64,
    /// Moment buffers by parameter key: SGD's momentum in `first`; Adam's first and
    /// second moments. Absent until the parameter's first step.
    pub moments: BTreeMap<String, Moments>,
}

/// The moment buffers of one parameter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Moments {
    /// Momentum (SGD) or first moment (Adam).
    pub first: Vec<f32>,
    /// Second moment (Adam); empty for SGD.
    pub second: Vec<f32>,
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The learning rate used.
    pub lr: f64,
    /// The gradients' global L2 norm before clipping.
    pub grad_norm: f64,
    /// Whether clipping scaled the gradients down.
    pub clipped: bool,
}

impl Optimizer {
    /// An optimiser with fresh state; the configuration is checked.
    pub fn new(config: OptimizerConfig) -> Result<Optimizer, OptimError> {
        config
            .check()
            .map_err(|(setting, message)| OptimError::Setting { setting, message })?;
        Ok(Optimizer {
            config,
            state: OptimizerState::default(),
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// Its state.
    pub fn state(&self) -> &OptimizerState {
        &self.state
    }

    /// Replaces its state with one a checkpoint kept: every buffer must fit `params`.
    pub fn restore(&mut self, state: OptimizerState, params: &Weights) -> Result<(), OptimError> {
        let adam = !matches!(self.config.rule, Rule::Sgd { .. });
        for (key, m) in &state.moments {
            let p = params.get(key).ok_or_else(|| {
                OptimError::State(format!("moments for '{key}', which is not a parameter"))
            })?;
            let n = p.len();
            let second = if adam { n } else { 0 };
            if m.first.len() != n || m.second.len() != second {
                return Err(OptimError::State(format!(
                    "'{key}' has moments of {} and {} elements; the parameter needs {n} and {second}",
                    m.first.len(),
                    m.second.len()
                )));
            }
        }
        self.state = state;
        Ok(())
    }

    /// Takes one step: updates every parameter of `params` that has a gradient in
    /// `grads` (same key, same shape), after clipping the global norm when configured.
    /// Parameters without one (weights the loss does not depend on, batch norm's running
    /// statistics) are left alone, as PyTorch leaves those whose `.grad` is None; a
    /// gradient of no parameter is an error.
    pub fn step(
        &mut self,
        params: &mut Weights,
        grads: &Weights,
    ) -> Result<StepReport, OptimError> {
        let mut keys: Vec<&String> = grads.keys().collect();
        keys.sort();
        let mut sum_sq = 0.0f64;
        for key in &keys {
            let p = params.get(*key).ok_or_else(|| OptimError::Gradient {
                key: key.to_string(),
                message: "a gradient of no parameter".into(),
            })?;
            let g = gradient(key, p, grads)?;
            sum_sq += g.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>();
        }
        let grad_norm = sum_sq.sqrt();
        // PyTorch's clip_grad_norm_: scale by max/(norm + 1e-6) when that is below 1.
        let scale = match self.config.clip_grad_norm {
            Some(max) => (max / (grad_norm + 1e-6)).min(1.0),
            None => 1.0,
        };
        let lr = self.config.lr_at(self.state.step);
        // A restored step count can be anything a checkpoint says: it is counted checked.
        let t = self.state.step.checked_add(1).ok_or_else(|| {
            OptimError::State(format!(
                "the step count {} cannot grow past the largest count (2^64 - 1)",
                self.state.step
            ))
        })?;
        self.state.step = t;
        let wd = self.config.weight_decay;
        let keys: Vec<String> = keys.into_iter().cloned().collect();
        for key in keys {
            let g = gradient(&key, &params[&key], grads)?.to_vec();
            let Some(TensorData::F32(p)) = params.get_mut(&key).map(|t| &mut t.data) else {
                return Err(OptimError::Gradient {
                    key,
                    message: "the parameter is not f32".into(),
                });
            };
            let m = self.state.moments.entry(key).or_default();
            match self.config.rule {
                Rule::Sgd { momentum, nesterov } => {
                    let fresh = m.first.is_empty();
                    if momentum > 0.0 && fresh {
                        m.first = vec![0.0; p.len()];
                    }
                    for (i, w) in p.iter_mut().enumerate() {
                        let wv = f64::from(*w);
                        let mut d = f64::from(g[i]) * scale + wd * wv;
                        if momentum > 0.0 {
                            // torch: the buffer starts as the first gradient.
                            let buf = if fresh {
                                d
                            } else {
                                momentum * f64::from(m.first[i]) + d
                            };
                            m.first[i] = buf as f32;
                            d = if nesterov { d + momentum * buf } else { buf };
                        }
                        *w = (wv - lr * d) as f32;
                    }
                }
                Rule::Adam { beta1, beta2, eps } | Rule::AdamW { beta1, beta2, eps } => {
                    let decoupled = matches!(self.config.rule, Rule::AdamW { .. });
                    if m.first.is_empty() {
                        m.first = vec![0.0; p.len()];
                        m.second = vec![0.0; p.len()];
                    }
                    let exp = i32::try_from(t).unwrap_or(i32::MAX);
                    let bc1 = 1.0 - beta1.powi(exp);
                    let bc2 = 1.0 - beta2.powi(exp);
                    for (i, w) in p.iter_mut().enumerate() {
                        let mut wv = f64::from(*w);
                        let mut d = f64::from(g[i]) * scale;
                        if decoupled {
                            wv *= 1.0 - lr * wd;
                        } else {
                            d += wd * wv;
                        }
                        let m1 = beta1 * f64::from(m.first[i]) + (1.0 - beta1) * d;
                        let m2 = beta2 * f64::from(m.second[i]) + (1.0 - beta2) * d * d;
                        m.first[i] = m1 as f32;
                        m.second[i] = m2 as f32;
                        let denom = (m2 / bc2).sqrt() + eps;
                        *w = (wv - lr * (m1 / bc1) / denom) as f32;
                    }
                }
            }
        }
        Ok(StepReport {
            lr,
            grad_norm,
            clipped: scale < 1.0,
        })
    }
}

/// The gradient of parameter `key`, which must have its shape and be f32.
fn gradient<'g>(key: &str, param: &Tensor, grads: &'g Weights) -> Result<&'g [f32], OptimError> {
    let wrong = |message: String| OptimError::Gradient {
        key: key.to_string(),
        message,
    };
    let g = grads
        .get(key)
        .ok_or_else(|| wrong("no gradient was computed for it".into()))?;
    if g.shape != param.shape {
        return Err(wrong(format!(
            "gradient of shape {:?} for a parameter of shape {:?}",
            g.shape, param.shape
        )));
    }
    match &g.data {
        TensorData::F32(v) if v.len() == param.len() => Ok(v),
        _ => Err(wrong(
            "the gradient is not an f32 tensor of its shape".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(key: &str, values: &[f32]) -> Weights {
        Weights::from([(
            key.to_string(),
            Tensor::f32(vec![values.len()], values.to_vec()),
        )])
    }

    fn run(config: OptimizerConfig, p0: &[f32], grads: &[&[f32]]) -> Vec<f32> {
        let mut opt = Optimizer::new(config).unwrap();
        let mut params = one("w", p0);
        for g in grads {
            opt.step(&mut params, &one("w", g)).unwrap();
        }
        params["w"].as_f32().unwrap().to_vec()
    }

    fn close(a: &[f32], b: &[f64]) {
        for (x, y) in a.iter().zip(b) {
            assert!((f64::from(*x) - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn plain_sgd_steps_against_the_gradient() {
        let c = OptimizerConfig {
            lr: 0.1,
            ..OptimizerConfig::default()
        };
        close(&run(c, &[1.0, -2.0], &[&[0.5, -1.0]]), &[0.95, -1.9]);
    }

    #[test]
    fn nesterov_momentum_follows_torch() {
        // torch.optim.SGD([w], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
        // w = 1, gradients 1 then 2, by hand:
        // step 1: d = 1 + 0.01 = 1.01, buf = 1.01, d = 1.01 + 0.9*1.01 = 1.919, w = 0.8081
        // step 2: d = 2 + 0.01*0.8081 = 2.008081, buf = 0.9*1.01 + 2.008081 = 2.917081,
        //         d = 2.008081 + 0.9*2.917081 = 4.6334539, w = 0.8081 - 0.46334539
        let c = OptimizerConfig {
            lr: 0.1,
            weight_decay: 0.01,
            rule: Rule::Sgd {
                momentum: 0.9,
                nesterov: true,
            },
            ..OptimizerConfig::default()
        };
        close(&run(c, &[1.0], &[&[1.0], &[2.0]]), &[0.8081 - 0.463_345_39]);
    }

    #[test]
    fn adam_first_step_moves_by_the_learning_rate() {
        // With bias correction, Adam's first step is lr * g/(|g| + eps) ≈ lr * sign(g).
        let c = OptimizerConfig {
            lr: 0.01,
            rule: Rule::Adam {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            ..OptimizerConfig::default()
        };
        close(&run(c, &[1.0, 1.0], &[&[3.0, -0.5]]), &[0.99, 1.01]);
    }

    #[test]
    fn adamw_decays_the_weights_apart_from_the_gradient() {
        let adam = |rule| OptimizerConfig {
            lr: 0.1,
            weight_decay: 0.5,
            rule,
            ..OptimizerConfig::default()
        };
        let (beta1, beta2, eps) = (0.9, 0.999, 1e-8);
        let adamw = Rule::AdamW { beta1, beta2, eps };
        let l2 = Rule::Adam { beta1, beta2, eps };
        // AdamW: w = 2*(1 - 0.05) - 0.1*sign(g) with g = 0 → the step is 0/(0+eps) = 0.
        let w = run(adam(adamw), &[2.0], &[&[0.0]]);
        close(&w, &[1.9]);
        // Adam (L2): d = 0 + 0.5*2 = 1 → w = 2 - 0.1.
        let w = run(adam(l2), &[2.0], &[&[0.0]]);
        close(&w, &[1.9]);
        // With a gradient they differ: AdamW's decay does not enter the moments.
        let a = run(adam(adamw), &[2.0], &[&[1.0], &[-3.0]]);
        let b = run(adam(l2), &[2.0], &[&[1.0], &[-3.0]]);
        assert!((a[0] - b[0]).abs() > 1e-3, "{a:?} {b:?}");
    }

    #[test]
    fn clipping_scales_the_global_norm_down() {
        let c = OptimizerConfig {
            lr: 1.0,
            clip_grad_norm: Some(1.0),
            ..OptimizerConfig::default()
        };
        let mut opt = Optimizer::new(c).unwrap();
        let mut params = one("a", &[0.0]);
        params.extend(one("b", &[0.0]));
        let mut grads = one("a", &[3.0]);
        grads.extend(one("b", &[4.0]));
        let r = opt.step(&mut params, &grads).unwrap();
        assert!((r.grad_norm - 5.0).abs() < 1e-12 && r.clipped);
        let scale = 1.0 / (5.0 + 1e-6);
        close(params["a"].as_f32().unwrap(), &[-3.0 * scale]);
        close(params["b"].as_f32().unwrap(), &[-4.0 * scale]);
    }

    #[test]
    fn bad_settings_and_gradients_are_refused_by_name() {
        let bad = |c: OptimizerConfig| Optimizer::new(c).unwrap_err().to_string();
        let d = OptimizerConfig::default();
        assert!(bad(OptimizerConfig { lr: f64::NAN, ..d }).contains("'lr'"));
        let nesterov = Rule::Sgd {
            momentum: 0.0,
            nesterov: true,
        };
        assert!(bad(OptimizerConfig {
            rule: nesterov,
            ..d
        })
        .contains("nesterov"));
        let beta = Rule::Adam {
            beta1: 1.0,
            beta2: 0.999,
            eps: 1e-8,
        };
        assert!(bad(OptimizerConfig { rule: beta, ..d }).contains("beta1"));
        let mut opt = Optimizer::new(d).unwrap();
        let mut params = one("w", &[1.0, 2.0]);
        // Without a gradient, a parameter is left alone.
        opt.step(&mut params, &Weights::new()).unwrap();
        assert_eq!(params, one("w", &[1.0, 2.0]));
        let e = opt
            .step(&mut params, &one("v", &[1.0, 2.0]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'v'") && e.contains("no parameter"), "{e}");
        let e = opt
            .step(&mut params, &one("w", &[1.0]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shape"), "{e}");
    }

    #[test]
    fn restored_state_continues_exactly() {
        let c = OptimizerConfig {
            lr: 0.01,
            rule: Rule::AdamW {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            weight_decay: 0.01,
            ..OptimizerConfig::default()
        };
        let grads: [&[f32]; 3] = [&[0.3, -0.2], &[0.1, 0.4], &[-0.5, 0.2]];
        let straight = run(c, &[1.0, 2.0], &grads);
        let mut first = Optimizer::new(c).unwrap();
        let mut params = one("w", &[1.0, 2.0]);
        for g in &grads[..2] {
            first.step(&mut params, &one("w", g)).unwrap();
        }
        let mut resumed = Optimizer::new(c).unwrap();
        resumed.restore(first.state().clone(), &params).unwrap();
        resumed.step(&mut params, &one("w", grads[2])).unwrap();
        assert_eq!(params["w"].as_f32().unwrap(), straight.as_slice());
        let mut wrong = first.state().clone();
        wrong.moments.get_mut("w").unwrap().second.clear();
        assert!(resumed.restore(wrong, &params).is_err());
    }
}
