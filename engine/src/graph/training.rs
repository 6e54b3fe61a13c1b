//! The graph file's optional `training` section: which output is the loss, which metrics
//! to report, and the optimiser and schedule defaults a trainer starts from (a command
//! line may override each). Decoded field by field like the rest of the document, every
//! problem reported with its path; the ranges of the hyper-parameters are checked here,
//! once, for every front.

use super::problem::{Collector, Problem};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The `training` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingDoc {
    /// The graph output that is the loss (an f32 scalar).
    pub loss: String,
    /// Metrics reported per epoch besides the loss.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<Metric>,
    /// The optimiser and its hyper-parameters.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// Samples per step, when the file suggests one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    /// Passes over the training data, when the file suggests a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<usize>,
}

/// A metric computed from a graph output and a labels input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metric {
    /// What is measured.
    pub kind: MetricKind,
    /// The graph output it reads (class scores for accuracy).
    pub output: String,
    /// The graph input holding the labels.
    pub labels: String,
}

/// The metrics a trainer knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricKind {
    /// Fraction of samples whose highest score (last axis) is at their i32 label.
    Accuracy,
}

/// The update rule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Rule {
    /// Stochastic gradient descent, optionally with (Nesterov) momentum; weight decay is
    /// added to the gradient (L2).
    Sgd {
        /// Momentum factor (0: none).
        momentum: f64,
        /// Nesterov momentum (needs momentum > 0).
        nesterov: bool,
    },
    /// Adam; weight decay is added to the gradient (L2).
    Adam {
        /// Decay of the first moment.
        beta1: f64,
        /// Decay of the second moment.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
    },
    /// AdamW: Adam with decoupled weight decay (the weights shrink by lr·decay first).
    #[serde(rename = "adamw")]
    AdamW {
        /// Decay of the first moment.
        beta1: f64,
        /// Decay of the second moment.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
    },
}

/// How the learning rate changes with the step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", deny_unknown_fields)]
pub enum LrSchedule {
    /// The base rate throughout.
    #[default]
    Constant,
    /// The base rate times `gamma` every `step_size` steps.
    Step {
        /// Steps between decays.
        step_size: u64,
        /// Factor per decay.
        gamma: f64,
    },
    /// Linear warm-up from lr/warmup to lr over `warmup` steps, then a half cosine down to
    /// `min_lr` at step `total` (and `min_lr` after).
    Cosine {
        /// Warm-up steps (0: none).
        #[serde(default)]
        warmup: u64,
        /// The step at which the rate reaches `min_lr`.
        total: u64,
        /// The final rate.
        #[serde(default)]
        min_lr: f64,
    },
}

/// An optimiser's configuration. In a file:
/// `{"kind": "adamw", "lr": 0.001, "weight_decay": 0.01, "beta1": 0.9, "clip_grad_norm": 1,
/// "schedule": {"kind": "cosine", "warmup": 100, "total": 2000}}`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerConfig {
    /// The update rule.
    pub rule: Rule,
    /// Base learning rate.
    pub lr: f64,
    /// Weight decay (L2 for SGD and Adam, decoupled for AdamW).
    pub weight_decay: f64,
    /// Clip the gradients' global L2 norm to this (None: no clipping).
    pub clip_grad_norm: Option<f64>,
    /// Learning-rate schedule.
    pub schedule: LrSchedule,
}

impl Default for OptimizerConfig {
    /// Plain SGD at 0.01, no decay, no clipping, constant rate.
    fn default() -> Self {
        OptimizerConfig {
            rule: Rule::Sgd {
                momentum: 0.0,
                nesterov: false,
            },
            lr: 0.01,
            weight_decay: 0.0,
            clip_grad_norm: None,
            schedule: LrSchedule::Constant,
        }
    }
}

impl OptimizerConfig {
    /// The configuration of an optimiser by name (`sgd`, `adam`, `adamw`) with its
    /// defaults: PyTorch's (Adam's betas 0.9/0.999, eps 1e-8), learning rate 0.01 for SGD
    /// and 0.001 for Adam and AdamW, AdamW's weight decay 0.01.
    pub fn named(kind: &str) -> Result<OptimizerConfig, String> {
        let adam = (0.9, 0.999, 1e-8);
        let (rule, lr, weight_decay) = match kind {
            "sgd" => (
                Rule::Sgd {
                    momentum: 0.0,
                    nesterov: false,
                },
                0.01,
                0.0,
            ),
            "adam" => (
                Rule::Adam {
                    beta1: adam.0,
                    beta2: adam.1,
                    eps: adam.2,
                },
                0.001,
                0.0,
            ),
            "adamw" => (
                Rule::AdamW {
                    beta1: adam.0,
                    beta2: adam.1,
                    eps: adam.2,
                },
                0.001,
                0.01,
            ),
            other => {
                return Err(format!(
                    "unknown optimizer '{other}' (known: sgd, adam, adamw)"
                ))
            }
        };
        Ok(OptimizerConfig {
            rule,
            lr,
            weight_decay,
            ..OptimizerConfig::default()
        })
    }

    /// The rule's name as written in files.
    pub fn kind(&self) -> &'static str {
        match self.rule {
            Rule::Sgd { .. } => "sgd",
            Rule::Adam { .. } => "adam",
            Rule::AdamW { .. } => "adamw",
        }
    }

    /// Sets one hyper-parameter by name (a file field or a command-line flag), checking
    /// that the rule has it. Ranges are checked by [`OptimizerConfig::check`].
    pub fn set(&mut self, field: &str, value: f64) -> Result<(), String> {
        match (field, &mut self.rule) {
            ("lr", _) => self.lr = value,
            ("weight_decay", _) => self.weight_decay = value,
            ("clip_grad_norm", _) => self.clip_grad_norm = Some(value),
            ("momentum", Rule::Sgd { momentum, .. }) => *momentum = value,
            ("beta1", Rule::Adam { beta1, .. } | Rule::AdamW { beta1, .. }) => *beta1 = value,
            ("beta2", Rule::Adam { beta2, .. } | Rule::AdamW { beta2, .. }) => *beta2 = value,
            ("eps", Rule::Adam { eps, .. } | Rule::AdamW { eps, .. }) => *eps = value,
            _ => {
                return Err(format!(
                    "'{field}' is not a setting of {} (it has: {})",
                    self.kind(),
                    self.fields().join(", ")
                ))
            }
        }
        Ok(())
    }

    /// The numeric settings of its rule.
    fn fields(&self) -> Vec<&'static str> {
        let mut v = vec!["lr", "weight_decay", "clip_grad_norm"];
        match self.rule {
            Rule::Sgd { .. } => v.extend(["momentum", "nesterov"]),
            Rule::Adam { .. } | Rule::AdamW { .. } => v.extend(["beta1", "beta2", "eps"]),
        }
        v
    }

    /// Checks every hyper-parameter's range; the error names the setting.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let finite_at_least = |setting: &'static str, v: f64, min: f64| {
            if v.is_finite() && v >= min {
                Ok(())
            } else {
                Err((setting, format!("{v} must be a number of at least {min}")))
            }
        };
        finite_at_least("lr", self.lr, 0.0)?;
        finite_at_least("weight_decay", self.weight_decay, 0.0)?;
        if let Some(c) = self.clip_grad_norm {
            if !(c.is_finite() && c > 0.0) {
                return Err(("clip_grad_norm", format!("{c} must be a positive number")));
            }
        }
        match self.rule {
            Rule::Sgd { momentum, nesterov } => {
                finite_at_least("momentum", momentum, 0.0)?;
                if nesterov && momentum <= 0.0 {
                    return Err(("nesterov", "Nesterov momentum needs momentum > 0".into()));
                }
            }
            Rule::Adam { beta1, beta2, eps } | Rule::AdamW { beta1, beta2, eps } => {
                for (setting, b) in [("beta1", beta1), ("beta2", beta2)] {
                    if !(0.0..1.0).contains(&b) {
                        return Err((setting, format!("{b} must be in [0, 1)")));
                    }
                }
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(("eps", format!("{eps} must be a positive number")));
                }
            }
        }
        match self.schedule {
            LrSchedule::Constant => {}
            LrSchedule::Step { step_size, gamma } => {
                if step_size == 0 {
                    return Err(("step_size", "must be at least 1".into()));
                }
                finite_at_least("gamma", gamma, 0.0)?;
            }
            LrSchedule::Cosine {
                warmup,
                total,
                min_lr,
            } => {
                if total <= warmup {
                    return Err((
                        "total",
                        format!("{total} must be above the warm-up's {warmup} steps"),
                    ));
                }
                finite_at_least("min_lr", min_lr, 0.0)?;
            }
        }
        Ok(())
    }

    /// The learning rate of step `step` (counted from 0).
    pub fn lr_at(&self, step: u64) -> f64 {
        match self.schedule {
            LrSchedule::Constant => self.lr,
            LrSchedule::Step { step_size, gamma } => {
                let decays = i32::try_from(step / step_size.max(1)).unwrap_or(i32::MAX);
                self.lr * gamma.powi(decays)
            }
            LrSchedule::Cosine {
                warmup,
                total,
                min_lr,
            } => {
                if step < warmup {
                    self.lr * (step + 1) as f64 / warmup as f64
                } else if step >= total {
                    min_lr
                } else {
                    let progress = (step - warmup) as f64 / (total - warmup) as f64;
                    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                    min_lr + (self.lr - min_lr) * cosine
                }
            }
        }
    }

    /// Decodes `{"kind": ..., settings..., "schedule": {...}}`, every problem reported
    /// under `path`.
    fn decode(value: &Value, path: &str, p: &mut Collector) -> Option<OptimizerConfig> {
        let Some(obj) = value.as_object() else {
            p.push(Problem::at(
                path,
                "must be an object such as {\"kind\": \"adamw\", \"lr\": 0.001}",
            ));
            return None;
        };
        let kind = match obj.get("kind") {
            None => "sgd",
            Some(Value::String(s)) => s.as_str(),
            Some(_) => {
                p.push(Problem::at(format!("{path}.kind"), "must be a string"));
                return None;
            }
        };
        let mut config = match OptimizerConfig::named(kind) {
            Ok(c) => c,
            Err(e) => {
                p.push(Problem::at(format!("{path}.kind"), e));
                return None;
            }
        };
        let mut ok = true;
        for (key, v) in obj {
            let at = format!("{path}.{}", super::limits::echo(key));
            match (key.as_str(), v) {
                ("kind", _) => {}
                ("schedule", v) => match LrSchedule::deserialize(v) {
                    Ok(s) => config.schedule = s,
                    Err(e) => {
                        p.push(Problem::at(at, format!("invalid: {e}")));
                        ok = false;
                    }
                },
                ("nesterov", Value::Bool(b)) => match &mut config.rule {
                    Rule::Sgd { nesterov, .. } => *nesterov = *b,
                    _ => {
                        p.push(Problem::at(at, format!("not a setting of {kind}")));
                        ok = false;
                    }
                },
                (_, Value::Number(n)) => {
                    if let Err(e) = n
                        .as_f64()
                        .ok_or("not a number".to_string())
                        .and_then(|x| config.set(key, x))
                    {
                        p.push(Problem::at(at, e));
                        ok = false;
                    }
                }
                _ => {
                    p.push(Problem::at(
                        at,
                        format!(
                            "unknown or mistyped setting (settings of {kind}: {}, schedule)",
                            config.fields().join(", ")
                        ),
                    ));
                    ok = false;
                }
            }
        }
        if let Err((setting, message)) = config.check() {
            p.push(Problem::at(format!("{path}.{setting}"), message));
            ok = false;
        }
        ok.then_some(config)
    }
}

impl Serialize for OptimizerConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut obj = match serde_json::to_value(self.rule) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        obj.insert("lr".into(), self.lr.into());
        obj.insert("weight_decay".into(), self.weight_decay.into());
        if let Some(c) = self.clip_grad_norm {
            obj.insert("clip_grad_norm".into(), c.into());
        }
        if self.schedule != LrSchedule::Constant {
            if let Ok(v) = serde_json::to_value(self.schedule) {
                obj.insert("schedule".into(), v);
            }
        }
        Value::Object(obj).serialize(s)
    }
}

impl<'de> Deserialize<'de> for OptimizerConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        let mut p = Collector::new(8);
        let config = OptimizerConfig::decode(&value, "optimizer", &mut p);
        match config {
            Some(c) if p.is_empty() => Ok(c),
            _ => {
                let lines: Vec<String> = p.finish().iter().map(|p| p.to_string()).collect();
                Err(serde::de::Error::custom(lines.join("; ")))
            }
        }
    }
}

/// Decodes the `training` section, reporting every problem under `training`.
pub(crate) fn decode(value: &Value, p: &mut Collector) -> Option<TrainingDoc> {
    let Some(obj) = value.as_object() else {
        p.push(Problem::at(
            "training",
            "must be an object with at least \"loss\"",
        ));
        return None;
    };
    let mut ok = true;
    for key in obj.keys() {
        if !["loss", "metrics", "optimizer", "batch", "epochs"].contains(&key.as_str()) {
            p.push(Problem::at(
                format!("training.{}", super::limits::echo(key)),
                "unknown field (known: loss, metrics, optimizer, batch, epochs)",
            ));
            ok = false;
        }
    }
    let loss = match obj.get("loss") {
        Some(Value::String(s)) => s.clone(),
        _ => {
            p.push(Problem::at(
                "training.loss",
                "must name the graph output that is the loss",
            ));
            ok = false;
            String::new()
        }
    };
    let metrics = match obj.get("metrics") {
        None => Vec::new(),
        Some(v) => Vec::<Metric>::deserialize(v).unwrap_or_else(|e| {
            p.push(Problem::at("training.metrics", format!("invalid: {e}")));
            ok = false;
            Vec::new()
        }),
    };
    let optimizer = match obj.get("optimizer") {
        None => OptimizerConfig::default(),
        Some(v) => OptimizerConfig::decode(v, "training.optimizer", p).unwrap_or_else(|| {
            ok = false;
            OptimizerConfig::default()
        }),
    };
    let mut count = |key: &str| -> Option<usize> {
        let v = obj.get(key)?;
        match v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
        {
            Some(n) => Some(n),
            None => {
                p.push(Problem::at(
                    format!("training.{key}"),
                    "must be a positive integer",
                ));
                ok = false;
                None
            }
        }
    };
    let batch = count("batch");
    let epochs = count("epochs");
    ok.then_some(TrainingDoc {
        loss,
        metrics,
        optimizer,
        batch,
        epochs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problems(v: Value) -> Vec<String> {
        let mut p = Collector::new(50);
        decode(&v, &mut p);
        p.finish().iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn a_full_section_decodes_with_defaults_filled_in() {
        let mut p = Collector::new(10);
        let t = decode(
            &json!({
                "loss": "loss",
                "metrics": [{"kind": "accuracy", "output": "logits", "labels": "labels"}],
                "optimizer": {"kind": "adamw", "lr": 0.002, "clip_grad_norm": 1.0,
                              "schedule": {"kind": "cosine", "warmup": 10, "total": 100}},
                "batch": 64, "epochs": 5
            }),
            &mut p,
        )
        .unwrap();
        assert!(p.is_empty());
        assert_eq!(t.optimizer.kind(), "adamw");
        assert_eq!(t.optimizer.lr, 0.002);
        assert_eq!(t.optimizer.weight_decay, 0.01);
        assert_eq!(t.optimizer.clip_grad_norm, Some(1.0));
        assert_eq!((t.batch, t.epochs), (Some(64), Some(5)));
        // It survives a round trip through its JSON form.
        let back: TrainingDoc = serde_json::from_value(serde_json::to_value(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let found = problems(json!({
            "optimizer": {"kind": "sgd", "beta1": 0.9, "lr": -1},
            "metrics": [{"kind": "recall", "output": "y", "labels": "l"}],
            "epochs": 0, "lossy": 1
        }));
        let all = found.join("\n");
        for want in [
            "training.loss",
            "training.optimizer.beta1: 'beta1' is not a setting of sgd",
            "training.optimizer.lr",
            "training.metrics",
            "training.epochs",
            "training.lossy",
        ] {
            assert!(all.contains(want), "missing '{want}' in:\n{all}");
        }
        let all = problems(json!({"loss": "l", "optimizer": {"kind": "lion"}})).join("\n");
        assert!(all.contains("unknown optimizer 'lion'"), "{all}");
        let all = problems(json!({"loss": "l", "optimizer": {"kind": "sgd", "nesterov": true}}));
        assert!(all.join("\n").contains("momentum > 0"), "{all:?}");
        let all = problems(
            json!({"loss": "l", "optimizer": {"schedule": {"kind": "cosine", "total": 0}}}),
        );
        assert!(
            all.join("\n").contains("training.optimizer.total"),
            "{all:?}"
        );
    }

    #[test]
    fn schedules_give_their_rates() {
        let step = OptimizerConfig {
            lr: 1.0,
            schedule: LrSchedule::Step {
                step_size: 2,
                gamma: 0.5,
            },
            ..OptimizerConfig::default()
        };
        let rates: Vec<f64> = (0..5).map(|s| step.lr_at(s)).collect();
        assert_eq!(rates, [1.0, 1.0, 0.5, 0.5, 0.25]);
        let cosine = OptimizerConfig {
            lr: 1.0,
            schedule: LrSchedule::Cosine {
                warmup: 2,
                total: 6,
                min_lr: 0.0,
            },
            ..OptimizerConfig::default()
        };
        let rates: Vec<f64> = (0..8).map(|s| cosine.lr_at(s)).collect();
        let want = [0.5, 1.0, 1.0, 0.853_553, 0.5, 0.146_447, 0.0, 0.0];
        for (r, w) in rates.iter().zip(want) {
            assert!((r - w).abs() < 1e-6, "{rates:?}");
        }
    }
}
