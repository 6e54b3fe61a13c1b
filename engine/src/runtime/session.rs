//! Sessions (native): a graph compiled for a batch configuration — micro-batch size,
//! prefetch ring, fusion, and S pipeline stages — that runs datasets. A dataset holds N
//! samples on axis 0 of each batched input; it is cut into micro-batches of batch/M
//! samples, streamed through the device (S = 1) or the GPipe pipeline (S > 1), and the
//! outputs are concatenated in order. Every run reports its events and metrics.

use super::exec::{ExecOptions, GpuExecutable, TraceContext};
use super::gpu::GpuContext;
use super::partition::Partition;
use super::pipeline::Pipeline;
use super::plan::{HalfStorage, MemorySummary, Plan, PlanOptions, Precision};
use super::stages::{self, StagePlanSummary};
use super::RunError;
use crate::graph::Graph;
use crate::shape::Dim;
use crate::telemetry::{metrics, now_ns, Event, EventKind, TimingSource};
use crate::tensor::{Tensor, TensorData};
use crate::weights::Weights;
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

/// A graph compiled for one configuration.
pub struct Session {
    graph: Graph,
    weights: Weights,
    config: RunConfig,
    micro: usize,
    contexts: Vec<GpuContext>,
    single: Option<GpuExecutable>,
    pipeline: Option<Pipeline>,
    partition: Option<Partition>,
    remainders: HashMap<usize, GpuExecutable>,
    options: PlanOptions,
}

/// Which 16-bit storage runs a matmul-and-activation probe faster on this device, measured
/// once per adapter and driver in this process.
fn faster_half_storage(ctx: &GpuContext) -> Result<HalfStorage, RunError> {
    use std::sync::{Mutex, OnceLock};
    static CHOICES: OnceLock<Mutex<HashMap<String, HalfStorage>>> = OnceLock::new();
    let key = format!("{} {}", ctx.adapter.name, ctx.adapter.driver);
    let cache = CHOICES.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(&h) = cache
        .lock()
        .ok()
        .and_then(|c| c.get(&key).copied())
        .as_ref()
    {
        return Ok(h);
    }
    let doc = crate::graph::doc::decode_value(&serde_json::json!({
        "format": "sluice/graph@1",
        "inputs": { "a": { "shape": [256, 256] }, "b": { "shape": [256, 256] } },
        "nodes": [
            { "id": "c", "op": "matmul", "inputs": ["a", "b"] },
            { "id": "r", "op": "relu", "inputs": ["c"] }
        ],
        "outputs": ["r"]
    }))
    .map_err(|p| RunError::Internal(format!("probe graph: {p:?}")))?;
    let graph = Graph::build(doc).map_err(|p| RunError::Internal(format!("probe graph: {p}")))?;
    let inputs = super::random_inputs(&graph, 0)?;
    let mut best = (HalfStorage::Packed, f64::INFINITY);
    for half in [HalfStorage::Packed, HalfStorage::Native] {
        let options = PlanOptions {
            fuse: true,
            precision: Precision::Mixed,
            half,
        };
        let exe = pollster::block_on(GpuExecutable::new(
            ctx,
            Plan::with_options(&graph, options)?,
            &Weights::new(),
        ))?;
        exe.upload_inputs(&inputs)?;
        pollster::block_on(exe.run_resident(2))?;
        let t = web_time::Instant::now();
        pollster::block_on(exe.run_resident(8))?;
        let secs = t.elapsed().as_secs_f64();
        tracing::info!(?half, ms = secs * 1e3 / 8.0, "16-bit storage probe");
        if secs < best.1 {
            best = (half, secs);
        }
    }
    if let Ok(mut c) = cache.lock() {
        c.insert(key, best.0);
    }
    Ok(best.0)
}

/// Plan options for a configuration on these devices. The 16-bit storage path is the one
/// asked for, or else (auto) packed unless every device has `shader-f16` and a probe
/// measures native `f16` faster there; precision `f16` needs `shader-f16`.
fn plan_options(config: &RunConfig, devices: &[GpuContext]) -> Result<PlanOptions, RunError> {
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
                if faster_half_storage(d)? == HalfStorage::Packed {
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

fn bind(graph: &Graph, n: usize) -> Result<Graph, RunError> {
    let bindings: HashMap<String, usize> = graph.symbols().into_iter().map(|s| (s, n)).collect();
    graph.bind(&bindings).map_err(|p| RunError::Input {
        name: "batch".into(),
        message: format!("with {n} samples per micro-batch: {p}"),
    })
}

/// Whether a graph input has the batch (a symbol) on axis 0.
fn batched(graph: &Graph, name: &str) -> bool {
    graph
        .doc
        .inputs
        .get(name)
        .is_some_and(|d| matches!(d.shape.first(), Some(Dim::Sym(_))))
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

/// Concatenates tensors along axis 0.
pub fn concat_rows(parts: &[&Tensor]) -> Tensor {
    let mut shape = parts[0].shape.clone();
    shape[0] = parts.iter().map(|t| t.shape[0]).sum();
    let data = match &parts[0].data {
        TensorData::F32(_) => TensorData::F32(
            parts
                .iter()
                .flat_map(|t| t.as_f32().unwrap_or(&[]).iter().copied())
                .collect(),
        ),
        TensorData::I32(_) => TensorData::I32(
            parts
                .iter()
                .flat_map(|t| {
                    if let TensorData::I32(v) = &t.data {
                        v.clone()
                    } else {
                        Vec::new()
                    }
                })
                .collect(),
        ),
        TensorData::Bool(_) => TensorData::Bool(
            parts
                .iter()
                .flat_map(|t| {
                    if let TensorData::Bool(v) = &t.data {
                        v.clone()
                    } else {
                        Vec::new()
                    }
                })
                .collect(),
        ),
    };
    Tensor { shape, data }
}

impl Session {
    /// Compiles `graph` (unbound) for `config`.
    pub fn new(graph: &Graph, weights: &Weights, config: &RunConfig) -> Result<Session, RunError> {
        if config.batch == 0
            || config.microbatches == 0
            || config.stages == 0
            || config.prefetch == 0
        {
            return Err(RunError::Input {
                name: "configuration".into(),
                message: "batch, micro-batches, stages and prefetch must all be at least 1".into(),
            });
        }
        if !config.batch.is_multiple_of(config.microbatches) {
            return Err(RunError::Input {
                name: "micro-batches".into(),
                message: format!(
                    "batch {} does not split into {} equal micro-batches",
                    config.batch, config.microbatches
                ),
            });
        }
        let micro = config.batch / config.microbatches;
        let bound = bind(graph, micro)?;
        let mut s = Session {
            graph: graph.clone(),
            weights: weights.clone(),
            config: config.clone(),
            micro,
            contexts: Vec::new(),
            single: None,
            pipeline: None,
            partition: None,
            remainders: HashMap::new(),
            options: PlanOptions::default(),
        };
        if config.stages == 1 {
            let ctx = pollster::block_on(GpuContext::new())?;
            let options = plan_options(config, std::slice::from_ref(&ctx))?;
            s.options = options;
            let exe = pollster::block_on(GpuExecutable::with_options(
                &ctx,
                Plan::with_options(&bound, options)?,
                weights,
                ExecOptions {
                    prefetch: config.prefetch,
                    ..Default::default()
                },
            ))?;
            s.contexts.push(ctx);
            s.single = Some(exe);
        } else {
            s.contexts = pollster::block_on(GpuContext::new_many(config.stages))?;
            let options = plan_options(config, &s.contexts)?;
            s.options = options;
            let costs = if config.profile {
                s.profile(&bound)?
            } else {
                stages::model_costs(&bound)
            };
            let part = stages::choose(&bound, config.stages, &costs)?;
            s.pipeline = Some(Pipeline::new(
                &bound,
                &part,
                &s.contexts,
                weights,
                options,
                config.prefetch,
            )?);
            s.partition = Some(part);
        }
        Ok(s)
    }

    /// Measured seconds per partitioned node: one unfused run on the first device.
    fn profile(&self, bound: &Graph) -> Result<Vec<f64>, RunError> {
        let exe = pollster::block_on(GpuExecutable::new(
            &self.contexts[0],
            Plan::with_options(
                bound,
                PlanOptions {
                    fuse: false,
                    ..self.options
                },
            )?,
            &self.weights,
        ))?;
        let inputs = super::random_inputs(bound, 0)?;
        let trace = TraceContext::new("profile", now_ns());
        // The second run is measured: the first pays for driver shader compilation.
        pollster::block_on(exe.run_stream(std::slice::from_ref(&inputs), &trace, &mut |_| {}))?;
        let r =
            pollster::block_on(exe.run_stream(std::slice::from_ref(&inputs), &trace, &mut |_| {}))?;
        let mut per: HashMap<&str, u64> = HashMap::new();
        for e in r.events.iter().filter(|e| e.kind == EventKind::Compute) {
            *per.entry(e.node.as_str()).or_default() += e.duration_ns();
        }
        Ok(stages::partition_nodes(bound)
            .into_iter()
            .map(|ix| per.get(bound.dag[ix].id.as_str()).copied().unwrap_or(0) as f64 / 1e9)
            .collect())
    }

    /// Samples per micro-batch.
    pub fn micro_batch_size(&self) -> usize {
        self.micro
    }

    /// Names of the devices in use.
    pub fn device_names(&self) -> Vec<String> {
        self.contexts
            .iter()
            .map(|c| format!("{} ({})", c.adapter.name, c.adapter.backend))
            .collect()
    }

    /// The plans of the stages (one when S = 1).
    pub fn plans(&self) -> Vec<&Plan> {
        match (&self.single, &self.pipeline) {
            (Some(e), _) => vec![e.plan()],
            (None, Some(p)) => p.plans(),
            _ => Vec::new(),
        }
    }

    /// Bytes of device buffers allocated by all stages.
    pub fn allocated_bytes(&self) -> u64 {
        let single = self.single.as_ref().map_or(0, |e| e.allocated_bytes());
        let stages = self.pipeline.as_ref().map_or(0, |p| p.allocated_bytes());
        single
            + stages
            + self
                .remainders
                .values()
                .map(|e| e.allocated_bytes())
                .sum::<u64>()
    }

    /// Memory of all stages together.
    pub fn memory(&self) -> MemorySummary {
        let mut m = MemorySummary::default();
        for p in self.plans() {
            m.planned_bytes += p.memory.planned_bytes;
            m.naive_bytes += p.memory.naive_bytes;
            m.weight_bytes += p.memory.weight_bytes;
        }
        m
    }

    /// The stage split, for pipelines.
    pub fn stage_summary(&self) -> Option<StagePlanSummary> {
        let part = self.partition.as_ref()?;
        Some(stages::summary(&bind(&self.graph, self.micro).ok()?, part))
    }

    /// The plan options in force (precision and 16-bit storage chosen for the devices).
    pub fn plan_options(&self) -> PlanOptions {
        self.options
    }

    /// Where compute times come from.
    pub fn timing(&self) -> TimingSource {
        match &self.single {
            Some(e) => e.timing_source(),
            None if self.contexts.iter().all(|c| c.adapter.timestamp_query) => {
                TimingSource::TimestampQueries
            }
            None => TimingSource::HostCompletion,
        }
    }

    /// Runs a dataset: every batched input has the same number of samples on axis 0.
    /// `progress(done, total)` is called per micro-batch.
    pub fn run(
        &mut self,
        data: &HashMap<String, Tensor>,
        run_id: &str,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<RunReport, RunError> {
        self.run_observed(data, run_id, progress, None, None)
    }

    /// [`Session::run`], handing every event to `on_event` as soon as it is known (the
    /// live event stream a server forwards) and stopping early when `cancel` is set.
    pub fn run_observed(
        &mut self,
        data: &HashMap<String, Tensor>,
        run_id: &str,
        progress: &(dyn Fn(usize, usize) + Sync),
        on_event: Option<&(dyn Fn(&Event) + Sync)>,
        cancel: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<RunReport, RunError> {
        let mut n: Option<usize> = None;
        for (name, t) in data {
            if batched(&self.graph, name) {
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
        let n = n.unwrap_or(self.micro);
        let full = n / self.micro;
        let slice = |from: usize, to: usize| -> HashMap<String, Tensor> {
            data.iter()
                .map(|(k, t)| {
                    (
                        k.clone(),
                        if batched(&self.graph, k) {
                            rows(t, from, to)
                        } else {
                            t.clone()
                        },
                    )
                })
                .collect()
        };
        let micro_batches: Vec<HashMap<String, Tensor>> = (0..full)
            .map(|m| slice(m * self.micro, (m + 1) * self.micro))
            .collect();
        let total = full + usize::from(!n.is_multiple_of(self.micro));
        let start = now_ns();
        let observed = TraceContext {
            observer: on_event,
            cancel,
            ..TraceContext::new(run_id, start)
        };
        let mut events = Vec::new();
        let mut per_mb: Vec<Vec<(String, Tensor)>> = Vec::new();
        if let Some(exe) = &self.single {
            let trace = TraceContext {
                first_micro_batch: 0,
                ..observed
            };
            let r = pollster::block_on(
                exe.run_stream(&micro_batches, &trace, &mut |m| progress(m + 1, total)),
            )?;
            events.extend(r.events);
            per_mb = r.outputs;
        } else if let Some(p) = &self.pipeline {
            // One GPipe schedule per batch of M micro-batches: fill, steady state, drain.
            let mut all_values = Vec::new();
            for (b, batch) in micro_batches.chunks(self.config.microbatches).enumerate() {
                let trace = TraceContext {
                    first_micro_batch: b * self.config.microbatches,
                    ..observed
                };
                let r = p.run(batch, &trace, &|m| progress(m + 1, total))?;
                events.extend(r.events);
                all_values.extend(r.values);
            }
            for values in all_values {
                let outs = self
                    .graph
                    .outputs
                    .iter()
                    .map(|o| {
                        values
                            .get(&o.name)
                            .cloned()
                            .map(|t| (o.name.clone(), t))
                            .ok_or_else(|| {
                                RunError::Internal(format!(
                                    "output '{}' missing from the pipeline",
                                    o.name
                                ))
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                per_mb.push(outs);
            }
        }
        if !n.is_multiple_of(self.micro) {
            let rest = n % self.micro;
            if !self.remainders.contains_key(&rest) {
                let bound = bind(&self.graph, rest)?;
                let plan = Plan::with_options(&bound, self.options)?;
                let exe =
                    pollster::block_on(GpuExecutable::new(&self.contexts[0], plan, &self.weights))?;
                self.remainders.insert(rest, exe);
            }
            let exe = &self.remainders[&rest];
            let trace = TraceContext {
                first_micro_batch: full,
                ..observed
            };
            let r = pollster::block_on(exe.run_stream(
                &[slice(full * self.micro, n)],
                &trace,
                &mut |_| progress(total, total),
            ))?;
            events.extend(r.events);
            per_mb.extend(r.outputs);
        }
        let outputs = self.concat_outputs(&per_mb)?;
        let metrics = metrics::compute(&events, self.config.stages, self.config.microbatches, n);
        Ok(RunReport {
            outputs,
            events,
            metrics,
            timing: self.timing(),
            micro_batches: total,
        })
    }

    fn concat_outputs(
        &self,
        per_mb: &[Vec<(String, Tensor)>],
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        let Some(first) = per_mb.first() else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (k, (name, t0)) in first.iter().enumerate() {
            let symbolic = self
                .graph
                .outputs
                .iter()
                .find(|o| &o.name == name)
                .is_some_and(|o| {
                    matches!(
                        self.graph.dag[o.node].outputs[o.port].shape.first(),
                        Some(Dim::Sym(_))
                    )
                });
            if symbolic && !t0.shape.is_empty() {
                let parts: Vec<&Tensor> = per_mb.iter().map(|outs| &outs[k].1).collect();
                out.push((name.clone(), concat_rows(&parts)));
            } else {
                out.push((name.clone(), t0.clone()));
            }
        }
        Ok(out)
    }
}
