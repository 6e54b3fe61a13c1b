//! How to run, and the rules every front (CLI, server, editor) shares about it: the
//! configuration and its checks, which configurations batch semantics allow, the plan
//! options a configuration implies on a set of devices (the 16-bit storage policy), and
//! the report of a run.

use super::device::Device;
use crate::error::RunError;
use crate::graph::{BatchSemantics, Graph};
use crate::limits::{footprint, Footprint, Limit, Limits};
use crate::plan::{HalfStorage, PlanOptions, Precision};
use crate::telemetry::{metrics, Event, TimingSource};
use crate::tensor::Tensor;
use serde::{Deserialize, Serialize};

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
}
