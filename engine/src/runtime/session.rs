//! Sessions (native): a graph compiled for a batch configuration — micro-batch size,
//! prefetch ring, fusion, and S pipeline stages — that runs datasets. A dataset holds N
//! samples on axis 0 of each batched input; it is cut into micro-batches of batch/M
//! samples, streamed through the device (S = 1) or the GPipe pipeline (S > 1), and the
//! outputs are concatenated in order. Every run reports its events and metrics.

use super::dataset::{self, bind, RunConfig, RunReport};
use super::exec::{ExecOptions, GpuExecutable, TraceContext};
use super::gpu::GpuContext;
use super::partition::Partition;
use super::pipeline::Pipeline;
use super::plan::{HalfStorage, MemorySummary, Plan, PlanOptions, Precision};
use super::stages::{self, StagePlanSummary};
use super::RunError;
use crate::graph::Graph;
use crate::telemetry::{now_ns, Event, EventKind, TimingSource};
use crate::tensor::Tensor;
use crate::weights::Weights;
use std::collections::HashMap;

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

impl Session {
    /// Compiles `graph` (unbound) for `config`.
    pub fn new(graph: &Graph, weights: &Weights, config: &RunConfig) -> Result<Session, RunError> {
        let micro = config.micro_batch_size()?;
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
            let options = dataset::plan_options(
                config,
                std::slice::from_ref(&ctx),
                &mut faster_half_storage,
            )?;
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
            let options = dataset::plan_options(config, &s.contexts, &mut faster_half_storage)?;
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
        let n = dataset::samples(&self.graph, data, self.micro)?;
        let full = n / self.micro;
        let micro_batches: Vec<HashMap<String, Tensor>> = (0..full)
            .map(|m| dataset::slice(&self.graph, data, m * self.micro, (m + 1) * self.micro))
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
                per_mb.push(dataset::graph_outputs(&self.graph, &values)?);
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
                &[dataset::slice(&self.graph, data, full * self.micro, n)],
                &trace,
                &mut |_| progress(total, total),
            ))?;
            events.extend(r.events);
            per_mb.extend(r.outputs);
        }
        RunReport::assemble(&self.graph, &self.config, &per_mb, events, n, self.timing())
    }
}
