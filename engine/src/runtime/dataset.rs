//! What every way of running a dataset shares: the run configuration and its checks, the
//! plan options it implies on a set of devices, cutting a dataset into micro-batches
//! along axis 0 of its batched inputs, concatenating the outputs back, and the report.

use super::gpu::GpuContext;
use super::plan::{HalfStorage, PlanOptions, Precision};
use super::RunError;
use crate::graph::Graph;
use crate::shape::Dim;
use crate::telemetry::{metrics, Event, TimingSource};
use crate::tensor::{Tensor, TensorData};
use serde::Serialize;
use std::collections::HashMap;

/// How to run.
#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    /// Samples per batch.
    pub batch: usize,
    /// Micro-batches per batch (M).
    pub microbatches: usize,
    /// Pipeline stages (S).
    pub stages: usize,
    /// Prefetch slots (K).
    pub prefetch: usize,
    /// Fuse elementwise chains and epilogues.
    pub fuse: bool,
    /// Partition stages by measured pass times instead of the cost model.
    pub profile: bool,
    /// Numeric precision.
    pub precision: Precision,
    /// 16-bit storage (None: native `f16` where the adapter has `shader-f16`, else packed).
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
            return Err(RunError::Input {
                name: "configuration".into(),
                message: "batch, micro-batches, stages and prefetch must all be at least 1".into(),
            });
        }
        if !self.batch.is_multiple_of(self.microbatches) {
            return Err(RunError::Input {
                name: "micro-batches".into(),
                message: format!(
                    "batch {} does not split into {} equal micro-batches",
                    self.batch, self.microbatches
                ),
            });
        }
        Ok(self.batch / self.microbatches)
    }
}

/// The result of running a dataset.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Outputs, concatenated over micro-batches along axis 0 (batched outputs).
    #[serde(skip)]
    pub outputs: Vec<(String, Tensor)>,
    /// Events of the run.
    pub events: Vec<Event>,
    /// Derived metrics.
    pub metrics: metrics::Metrics,
    /// Source of compute times.
    pub timing: TimingSource,
    /// Micro-batches run.
    pub micro_batches: usize,
}

impl RunReport {
    /// The report of a finished run: each micro-batch's outputs joined in order, and the
    /// metrics of its events over `samples` samples.
    pub fn assemble(
        graph: &Graph,
        config: &RunConfig,
        per_mb: &[Vec<(String, Tensor)>],
        events: Vec<Event>,
        samples: usize,
        timing: TimingSource,
    ) -> Result<RunReport, RunError> {
        let outputs = concat_outputs(graph, per_mb)?;
        let metrics = metrics::compute(&events, config.stages, config.microbatches, samples);
        Ok(RunReport {
            outputs,
            events,
            metrics,
            timing,
            micro_batches: per_mb.len(),
        })
    }
}

/// Plan options for a configuration on these devices. The 16-bit storage path is the one
/// asked for, or else (auto) packed unless every device has `shader-f16` and `faster`
/// (a measurement, where the caller can afford one) picks native `f16` on each device;
/// precision `f16` needs `shader-f16`.
pub fn plan_options(
    config: &RunConfig,
    devices: &[GpuContext],
    faster: &mut dyn FnMut(&GpuContext) -> Result<HalfStorage, RunError>,
) -> Result<PlanOptions, RunError> {
    let all_f16 = devices.iter().all(|c| c.adapter.shader_f16);
    let missing = || {
        let names: Vec<&str> = devices
            .iter()
            .filter(|c| !c.adapter.shader_f16)
            .map(|c| c.adapter.name.as_str())
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
                if faster(d)? == HalfStorage::Packed {
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

/// The graph with every symbolic dimension bound to `n` samples.
pub fn bind(graph: &Graph, n: usize) -> Result<Graph, RunError> {
    let bindings: HashMap<String, usize> = graph.symbols().into_iter().map(|s| (s, n)).collect();
    graph.bind(&bindings).map_err(|p| RunError::Input {
        name: "batch".into(),
        message: format!("with {n} samples per micro-batch: {p}"),
    })
}

/// Whether a graph input has the batch (a symbol) on axis 0.
pub fn batched(graph: &Graph, name: &str) -> bool {
    graph
        .doc
        .inputs
        .get(name)
        .is_some_and(|d| matches!(d.shape.first(), Some(Dim::Sym(_))))
}

/// The number of samples in a dataset: the common axis-0 length of its batched inputs
/// (`default` when none is batched).
pub fn samples(
    graph: &Graph,
    data: &HashMap<String, Tensor>,
    default: usize,
) -> Result<usize, RunError> {
    let mut n: Option<usize> = None;
    for (name, t) in data {
        if batched(graph, name) {
            let rows = t.shape.first().copied().unwrap_or(0);
            if n.is_some_and(|m| m != rows) {
                return Err(RunError::Input {
                    name: name.clone(),
                    message: format!(
                        "has {rows} samples but other inputs have {}",
                        n.unwrap_or(0)
                    ),
                });
            }
            n = Some(rows);
        }
    }
    Ok(n.unwrap_or(default))
}

/// Samples [from, to) of a dataset: batched inputs cut along axis 0, the others whole.
pub fn slice(
    graph: &Graph,
    data: &HashMap<String, Tensor>,
    from: usize,
    to: usize,
) -> HashMap<String, Tensor> {
    data.iter()
        .map(|(k, t)| {
            let v = if batched(graph, k) {
                rows(t, from, to)
            } else {
                t.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

/// Rows [from, to) of a tensor along axis 0.
pub fn rows(t: &Tensor, from: usize, to: usize) -> Tensor {
    let row: usize = t.shape[1..].iter().product();
    let mut shape = t.shape.clone();
    shape[0] = to - from;
    let (a, b) = (from * row, to * row);
    let data = match &t.data {
        TensorData::F32(v) => TensorData::F32(v[a..b].to_vec()),
        TensorData::I32(v) => TensorData::I32(v[a..b].to_vec()),
        TensorData::Bool(v) => TensorData::Bool(v[a..b].to_vec()),
    };
    Tensor { shape, data }
}

/// Concatenates tensors of one dtype along axis 0.
pub fn concat_rows(parts: &[&Tensor]) -> Tensor {
    /// Every part's values of the type `pick` takes, in order, copied once.
    fn join<'a, T: Clone + 'a>(
        parts: &[&'a Tensor],
        pick: impl Fn(&'a TensorData) -> Option<&'a [T]>,
    ) -> Vec<T> {
        let mut out = Vec::new();
        for t in parts {
            out.extend_from_slice(pick(&t.data).unwrap_or(&[]));
        }
        out
    }
    let mut shape = parts[0].shape.clone();
    shape[0] = parts.iter().map(|t| t.shape[0]).sum();
    let data = match &parts[0].data {
        TensorData::F32(_) => TensorData::F32(join(parts, |d| match d {
            TensorData::F32(v) => Some(v),
            _ => None,
        })),
        TensorData::I32(_) => TensorData::I32(join(parts, |d| match d {
            TensorData::I32(v) => Some(v),
            _ => None,
        })),
        TensorData::Bool(_) => TensorData::Bool(join(parts, |d| match d {
            TensorData::Bool(v) => Some(v),
            _ => None,
        })),
    };
    Tensor { shape, data }
}

/// Joins the outputs of each micro-batch: outputs with the batch on axis 0 are
/// concatenated along it, the others are taken from the first micro-batch.
pub fn concat_outputs(
    graph: &Graph,
    per_mb: &[Vec<(String, Tensor)>],
) -> Result<Vec<(String, Tensor)>, RunError> {
    let Some(first) = per_mb.first() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (k, (name, t0)) in first.iter().enumerate() {
        let symbolic = graph
            .outputs
            .iter()
            .find(|o| &o.name == name)
            .is_some_and(|o| {
                matches!(
                    graph.dag[o.node].outputs[o.port].shape.first(),
                    Some(Dim::Sym(_))
                )
            });
        if symbolic && !t0.shape.is_empty() {
            let parts: Vec<&Tensor> = per_mb
                .iter()
                .map(|outs| {
                    outs.get(k).map(|(_, t)| t).ok_or_else(|| {
                        RunError::Internal(format!("output '{name}' missing from a micro-batch"))
                    })
                })
                .collect::<Result<_, _>>()?;
            out.push((name.clone(), concat_rows(&parts)));
        } else {
            out.push((name.clone(), t0.clone()));
        }
    }
    Ok(out)
}

/// Orders a pipeline's values of one micro-batch as the graph's outputs.
pub fn graph_outputs(
    graph: &Graph,
    values: &HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>, RunError> {
    graph
        .outputs
        .iter()
        .map(|o| {
            values
                .get(&o.name)
                .cloned()
                .map(|t| (o.name.clone(), t))
                .ok_or_else(|| {
                    RunError::Internal(format!("output '{}' missing from the pipeline", o.name))
                })
        })
        .collect()
}

/// The dataset of a run without uploaded inputs: `batch` samples of seeded random inputs
/// (the same on every machine and in browsers for the same graph, batch and seed).
pub fn seeded(graph: &Graph, batch: usize, seed: u64) -> Result<HashMap<String, Tensor>, RunError> {
    super::random_inputs(&bind(graph, batch)?, seed)
}
