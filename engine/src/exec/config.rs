//! How to run, and the rules every front (CLI, server, editor) shares about it: the
//! configuration and its checks, which configurations batch semantics allow, the plan
//! options a configuration implies on a set of devices (the 16-bit storage policy), and
//! the report of a run.

use super::device::{Device, TraceContext};
use super::input::Inputs;
use crate::dtype::DType;
use crate::error::RunError;
use crate::graph::{BatchSemantics, Graph, NodeKind, OutputRef};
use crate::limits::{footprint, Footprint, Limit, Limits};
use crate::plan::{HalfStorage, Plan, PlanOptions, Precision};
use crate::telemetry::{metrics, now_ns, Event, TimingSource};
use crate::tensor::Tensor;
use crate::weights::Weights;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

/// How to run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunConfig {
    /// Samples per batch.
    pub batch: usize,
    /// Micro-batches per batch (M).
    pub microbatches: usize,
    /// Pipeline stages (S).
    pub stages: usize,
    /// Prefetch slots (K).
    pub prefetch: usize,
    /// Fuse pointwise chains and epilogues.
    pub fuse: bool,
    /// Partition stages by measured pass times instead of the cost model.
    pub profile: bool,
    /// Numeric precision.
    pub precision: Precision,
    /// 16-bit storage (None: native `f16` where every device has it and measures faster,
    /// else packed).
    pub half: Option<HalfStorage>,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            batch: 1,
            microbatches: 1,
            stages: 1,
            prefetch: 2,
            fuse: true,
            profile: false,
            precision: Precision::F32,
            half: None,
        }
    }
}

impl RunConfig {
    /// Checks the settings and returns the micro-batch size (batch / M).
    pub fn micro_batch_size(&self) -> Result<usize, RunError> {
        if self.batch == 0 || self.microbatches == 0 || self.stages == 0 || self.prefetch == 0 {
            return Err(RunError::Config {
                setting: "configuration".into(),
                message: "batch, micro-batches, stages and prefetch must all be at least 1".into(),
            });
        }
        if !self.batch.is_multiple_of(self.microbatches) {
            return Err(RunError::Config {
                setting: "micro-batches".into(),
                message: format!(
                    "batch {} does not split into {} equal micro-batches",
                    self.batch, self.microbatches
                ),
            });
        }
        Ok(self.batch / self.microbatches)
    }
}

/// Checks a run before anything is compiled, read or generated, the same way on every
/// front: the configuration against the limits (batch, micro-batches, stages, prefetch
/// slots), the graph's node count, and the run's [`Footprint`] on a dataset of `samples`
/// samples (`None`: one batch) — its largest tensor, its host bytes, and its device bytes
/// spread over its stages (each stage's plan is checked exactly when it is compiled).
/// Errors name the limit, the value and the flag that raises it.
pub fn check_run(
    graph: &Graph,
    config: &RunConfig,
    samples: Option<usize>,
    limits: &Limits,
) -> Result<Footprint, RunError> {
    let wide = |v: usize| u64::try_from(v).ok();
    for (limit, what, unit, v) in [
        (Limit::MaxBatch, "the batch", "samples", config.batch),
        (
            Limit::MaxMicrobatches,
            "the micro-batches",
            "micro-batches",
            config.microbatches,
        ),
        (Limit::MaxStages, "the pipeline", "stages", config.stages),
        (Limit::MaxPrefetch, "prefetching", "slots", config.prefetch),
        (Limit::MaxNodes, "the graph", "nodes", graph.doc.nodes.len()),
    ] {
        limits.check(limit, what, unit, wide(v))?;
    }
    let micro = config.micro_batch_size()?;
    let n = samples.unwrap_or(config.batch);
    let in_flight = config
        .prefetch
        .saturating_mul(config.stages)
        .saturating_add(1);
    let f = footprint(graph, n, micro, in_flight)?;
    limits.check(
        Limit::MaxTensorElements,
        format!("tensor '{}'", f.largest.0),
        "elements",
        Some(f.largest.1),
    )?;
    limits.check(
        Limit::MaxHostBytes,
        format!("the run's host memory ({n} samples)"),
        "bytes",
        Some(f.host_bytes),
    )?;
    let per_device = f
        .device_bytes
        .div_ceil(wide(config.stages).unwrap_or(1).max(1));
    limits.check(
        Limit::MaxDeviceBytes,
        format!(
            "the run's device memory (micro-batches of {micro}, {} device(s))",
            config.stages
        ),
        "bytes",
        Some(per_device),
    )?;
    Ok(f)
}

/// Refuses a configuration that would cut the batch where the graph combines samples:
/// more than one micro-batch per batch, or a dataset of `samples` samples (when known)
/// other than exactly one batch. Graphs without a batch axis cannot be cut at all.
pub fn check_batching(
    semantics: &BatchSemantics,
    config: &RunConfig,
    samples: Option<usize>,
) -> Result<(), RunError> {
    if !semantics.batched() {
        if config.microbatches > 1 {
            return Err(RunError::Config {
                setting: "micro-batches".into(),
                message: "the graph has no batch axis (no input has a symbolic dimension), so there is nothing to cut into micro-batches; run with 1 micro-batch".into(),
            });
        }
        return Ok(());
    }
    let Some(c) = semantics.output_coupling() else {
        return Ok(());
    };
    let refused = if config.microbatches > 1 {
        format!(
            "cutting each batch into {} micro-batches would change the answer; run it with 1 micro-batch",
            config.microbatches
        )
    } else {
        match samples {
            Some(n) if n > config.batch => format!(
                "a dataset of {n} samples would run in batches of {} that each combine only their own samples; run it as one batch of {n}",
                config.batch
            ),
            Some(n) if n < config.batch => format!(
                "the run is set up for batches of {} but the dataset holds {n} samples, and padding would change the answer; run it as one batch of {n}",
                config.batch
            ),
            _ => return Ok(()),
        }
    };
    // Other nodes whose coupling also reaches an output are named too.
    let mut others: Vec<String> = Vec::new();
    for (_, b) in &semantics.outputs {
        if let crate::graph::Batch::Coupled { node, .. } = b {
            if *node != c.node && !others.contains(node) {
                others.push(node.clone());
            }
        }
    }
    let refused = if others.is_empty() {
        refused
    } else {
        format!(
            "{refused} (samples are also combined by {})",
            others
                .iter()
                .map(|n| format!("'{n}'"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    Err(RunError::BatchCoupled {
        node: c.node,
        reason: c.reason,
        refused,
    })
}

/// Plan options for a configuration on these devices. The 16-bit storage path is the one
/// asked for, or else (auto) packed unless every device stores `f16` natively and
/// measures it faster; precision `f16` needs native `f16` everywhere.
pub async fn plan_options(
    config: &RunConfig,
    devices: &[Box<dyn Device>],
) -> Result<PlanOptions, RunError> {
    let all_f16 = devices.iter().all(|d| d.native_f16());
    let missing = || {
        let names: Vec<String> = devices
            .iter()
            .filter(|d| !d.native_f16())
            .map(|d| d.name())
            .collect();
        RunError::Unsupported(format!(
            "needs the adapter feature shader-f16, which {} lacks",
            names.join(", ")
        ))
    };
    if config.precision == Precision::F16 && !all_f16 {
        return Err(missing());
    }
    let half = match config.half {
        Some(HalfStorage::Native) if !all_f16 => return Err(missing()),
        Some(h) => h,
        None if config.precision == Precision::F32 || !all_f16 => HalfStorage::Packed,
        None => {
            let mut choice = HalfStorage::Native;
            for d in devices {
                if d.faster_half().await? == HalfStorage::Packed {
                    choice = HalfStorage::Packed;
                }
            }
            choice
        }
    };
    Ok(PlanOptions {
        fuse: config.fuse,
        precision: config.precision,
        half,
    })
}

/// Largest magnitude a value may reach in the calibration pass and still be stored in 16
/// bits: half of f16's largest finite value (65504), a binade of headroom for data larger
/// than the calibrated micro-batch. Values beyond it are kept in f32.
pub const HALF_OVERFLOW_LIMIT: f64 = 65504.0 / 2.0;

/// A value whose every element is smaller in magnitude than this (f16's smallest normal,
/// 2^-14), and not all zero, would be stored as f16 subnormals with fewer than 10 bits of
/// precision (or flushed to zero below 2^-24): it is kept in f32.
pub const HALF_UNDERFLOW_LIMIT: f64 = 6.103_515_625e-5;

/// Operators whose float results the 16-bit storage policy stores in f32 whatever their
/// range, after PyTorch autocast's float32 list: `pow`, `exp`, `log`, `reciprocal`,
/// `softplus`; sums, means, products and norms over axes, `cumsum`; softmax and
/// log-softmax; layer, RMS, instance and group normalisation; the losses.
pub const F32_OPS: &[&str] = &[
    "pow",
    "exp",
    "log",
    "reciprocal",
    "softplus",
    "reduce_sum",
    "reduce_mean",
    "reduce_prod",
    "reduce_l2",
    "cumsum",
    "softmax",
    "log_softmax",
    "layer_norm",
    "rms_norm",
    "instance_norm",
    "group_norm",
    "softmax_cross_entropy",
    "nll_loss",
    "mse_loss",
    "bce_with_logits",
];

/// Why the 16-bit storage policy keeps a value in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeepReason {
    /// Its operator is in [`F32_OPS`].
    Operator,
    /// Its measured largest magnitude is beyond [`HALF_OVERFLOW_LIMIT`].
    Overflow,
    /// Its measured largest magnitude is nonzero and below [`HALF_UNDERFLOW_LIMIT`].
    Underflow,
}

/// A value stored in f32 under 16-bit storage, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeptValue {
    /// The value (`node`, `node:port`, a graph input or a weight key).
    pub value: String,
    /// The node producing it (the input or the node declaring the weight).
    pub node: String,
    /// Its operator (`input`, `param` or `constant` for those).
    pub op: String,
    /// Why it is kept.
    pub reason: KeepReason,
    /// Its largest magnitude where measured (weights and constants always, other values
    /// by the calibration pass).
    pub max_abs: Option<f64>,
}

impl std::fmt::Display for KeptValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let range = self
            .max_abs
            .map_or(String::new(), |m| format!(", measured max |x| {m:.4e}"));
        let why = match self.reason {
            KeepReason::Operator => format!("'{}' computes in f32 (autocast list)", self.op),
            KeepReason::Overflow => format!("beyond ±{HALF_OVERFLOW_LIMIT} would overflow f16"),
            KeepReason::Underflow => {
                format!("every element below {HALF_UNDERFLOW_LIMIT:e} would underflow f16")
            }
        };
        write!(f, "'{}' ({}): {why}{range}", self.value, self.node)
    }
}

/// Whether the value ranges of the 16-bit storage policy were measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Calibration {
    /// Not yet: the session was compiled before its inputs were known and calibrates on
    /// its first run; until then only weights, constants and [`F32_OPS`] are considered.
    Pending,
    /// Measured by an f32 run of the first micro-batch of the first run.
    Measured {
        /// Samples of the micro-batch measured.
        samples: usize,
    },
    /// The calibration pass failed: only weights, constants and [`F32_OPS`] decide.
    Failed {
        /// Why.
        message: String,
    },
}

/// The 16-bit storage policy's decision for one compiled graph: which float values are
/// stored in f32 although the precision stores floats in 16 bits, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HalfPolicy {
    /// Whether activations' ranges were measured.
    pub calibration: Calibration,
    /// The values kept in f32.
    pub kept: Vec<KeptValue>,
}

impl HalfPolicy {
    /// The names of the values kept in f32 (what [`Plan::with_policy`] takes).
    pub fn names(&self) -> BTreeSet<String> {
        self.kept.iter().map(|k| k.value.clone()).collect()
    }

    /// Lines for people: the calibration state, then each kept value.
    pub fn describe(&self) -> Vec<String> {
        let head = match &self.calibration {
            Calibration::Pending => "value ranges not yet calibrated (calibrated on the first run)".to_string(),
            Calibration::Measured { samples } => format!(
                "value ranges calibrated on the first micro-batch ({samples} samples) in f32"
            ),
            Calibration::Failed { message } => format!(
                "value ranges NOT calibrated ({message}): only the operator list, weights and constants decide"
            ),
        };
        std::iter::once(format!("{head}; {} value(s) kept in f32", self.kept.len()))
            .chain(self.kept.iter().map(|k| k.to_string()))
            .collect()
    }
}

/// Largest magnitude of a float tensor (infinity when it holds a non-finite element);
/// `None` for integer and boolean tensors.
fn max_abs(t: &Tensor) -> Option<f64> {
    t.as_f32().map(|v| {
        v.iter().fold(0.0f64, |m, &x| {
            if x.is_finite() {
                m.max(f64::from(x).abs())
            } else {
                f64::INFINITY
            }
        })
    })
}

/// Why a value of largest magnitude `m` cannot be stored in 16 bits, if it cannot.
fn range_reason(m: f64) -> Option<KeepReason> {
    if m > HALF_OVERFLOW_LIMIT {
        Some(KeepReason::Overflow)
    } else if m > 0.0 && m < HALF_UNDERFLOW_LIMIT {
        Some(KeepReason::Underflow)
    } else {
        None
    }
}

/// Value name of a node's output port.
fn value_name(id: &str, port: usize) -> String {
    if port == 0 {
        id.to_string()
    } else {
        format!("{id}:{port}")
    }
}

/// The 16-bit storage policy on a bound graph: float results of [`F32_OPS`], weights and
/// constants whose measured range f16 cannot hold, and — where `ranges` (largest
/// magnitudes by value name, from [`calibrate`]) are given — every other value whose range
/// f16 cannot hold. The same on every front: sessions (CLI, server, editor, workers) plan
/// with it; f32 plans ignore it.
pub fn half_policy(
    bound: &Graph,
    weights: &Weights,
    ranges: Option<&HashMap<String, f64>>,
    calibration: Calibration,
) -> HalfPolicy {
    let mut kept: Vec<KeptValue> = Vec::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut keep = |k: KeptValue| {
        if seen.insert(k.value.clone()) {
            kept.push(k);
        }
    };
    let measured = |name: &str| ranges.and_then(|r| r.get(name).copied());
    for (name, _) in &bound.inputs {
        if let Some(m) = measured(name) {
            if let Some(reason) = range_reason(m) {
                keep(KeptValue {
                    value: name.clone(),
                    node: name.clone(),
                    op: "input".into(),
                    reason,
                    max_abs: Some(m),
                });
            }
        }
    }
    for &ix in &bound.order {
        let node = &bound.dag[ix];
        let NodeKind::Op(op) = &node.kind else {
            continue;
        };
        for p in &node.params {
            let key = node.param_key(p);
            if let Some(m) = weights.get(&key).and_then(max_abs) {
                if let Some(reason) = range_reason(m) {
                    keep(KeptValue {
                        value: key,
                        node: node.id.clone(),
                        op: "param".into(),
                        reason,
                        max_abs: Some(m),
                    });
                }
            }
        }
        for (port, t) in node.outputs.iter().enumerate() {
            if t.dtype != DType::F32 || op.param_key().is_some() {
                continue;
            }
            let value = value_name(&node.id, port);
            let m = match op.constant_value() {
                Some(c) => max_abs(c),
                None => measured(&value),
            };
            let reason = if F32_OPS.contains(&op.name()) && op.constant_value().is_none() {
                Some(KeepReason::Operator)
            } else {
                m.and_then(range_reason)
            };
            if let Some(reason) = reason {
                keep(KeptValue {
                    value,
                    node: node.id.clone(),
                    op: op.name().to_string(),
                    reason,
                    max_abs: m,
                });
            }
        }
    }
    HalfPolicy { calibration, kept }
}

/// The calibration pass of the 16-bit storage policy: the bound graph, unfused and in
/// f32, on `device`, over one micro-batch of `inputs`, every float value read back; returns
/// each value's largest magnitude by name (graph inputs by theirs). Costs one f32 run of
/// one micro-batch and the host memory of its values.
pub async fn calibrate(
    bound: &Graph,
    weights: &Weights,
    device: &dyn Device,
    inputs: Inputs<'_>,
) -> Result<HashMap<String, f64>, RunError> {
    let mut ranges: HashMap<String, f64> = HashMap::new();
    for (name, input) in &inputs {
        let m = match input {
            super::input::Input::Owned(t) => max_abs(t),
            super::input::Input::Rows(rows) => Some(rows.runs().flatten().fold(0.0f64, |m, &x| {
                if x.is_finite() {
                    m.max(f64::from(x).abs())
                } else {
                    f64::INFINITY
                }
            })),
        };
        if let Some(m) = m {
            ranges.insert(name.clone(), m);
        }
    }
    let mut graph = bound.clone();
    let mut outputs: Vec<OutputRef> = Vec::new();
    for &ix in &bound.order {
        let node = &bound.dag[ix];
        let NodeKind::Op(op) = &node.kind else {
            continue;
        };
        if op.constant_value().is_some() || op.param_key().is_some() {
            continue;
        }
        for (port, t) in node.outputs.iter().enumerate() {
            if t.dtype == DType::F32 {
                outputs.push(OutputRef {
                    name: value_name(&node.id, port),
                    node: ix,
                    port,
                });
            }
        }
    }
    graph.outputs = outputs;
    let options = PlanOptions {
        fuse: false,
        precision: Precision::F32,
        half: HalfStorage::Packed,
    };
    let plan = Plan::with_options(&graph, options)?;
    plan.check_limits(&bound.limits)?;
    let mut exe = device.compile(plan, weights, 1).await?;
    let trace = TraceContext::new("calibration", now_ns());
    let mut events = Vec::new();
    exe.submit(0, inputs, &trace, &mut events)?;
    let (_, values) = exe.complete(&trace, &mut events).await?;
    for (name, t) in &values {
        if let Some(m) = max_abs(t) {
            ranges.insert(name.clone(), m);
        }
    }
    Ok(ranges)
}

/// The result of running a dataset.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Outputs, joined over micro-batches along their batch axes.
    #[serde(skip)]
    pub outputs: Vec<(String, Tensor)>,
    /// Events of the run.
    pub events: Vec<Event>,
    /// Derived metrics.
    pub metrics: metrics::Metrics,
    /// Source of compute times.
    pub timing: TimingSource,
    /// Micro-batches run (the last one may have been padded).
    pub micro_batches: usize,
    /// Nanoseconds from the start of the run to the first micro-batch's outputs.
    pub first_result_ns: u64,
    /// Under 16-bit storage, the values the policy kept in f32 and why (`None` in f32).
    pub half_policy: Option<HalfPolicy>,
}
