//! Sessions on one thread, every GPU wait awaited: what runs in browsers, where the page's
//! event loop drives the device and nothing may block. S = 1 streams the micro-batches
//! through one device's prefetch ring; S > 1 follows the GPipe schedule step by step
//! ([`schedule::gpipe`]), awaiting each step's stages together, each stage on its own
//! device. Results equal the native [`Session`](super::session)'s for the same graph,
//! weights and inputs.

use super::dataset::{self, bind, RunConfig, RunReport};
use super::exec::{ExecOptions, GpuExecutable, TraceContext};
use super::gpu::GpuContext;
use super::plan::{HalfStorage, MemorySummary, Plan};
use super::schedule;
use super::stages::{self, StageSpec};
use super::RunError;
use crate::graph::Graph;
use crate::telemetry::{now_ns, Event, TimingSource};
use crate::tensor::Tensor;
use crate::weights::Weights;
use std::collections::HashMap;

type Values = HashMap<String, Tensor>;

/// How the compiled graph runs: on one device, or as pipeline stages.
enum Compiled {
    Single(Box<GpuExecutable>),
    Stages(Vec<(StageSpec, GpuExecutable)>),
}

/// A graph compiled for one configuration, run without blocking.
pub struct AsyncSession {
    graph: Graph,
    config: RunConfig,
    micro: usize,
    contexts: Vec<GpuContext>,
    compiled: Compiled,
}

impl AsyncSession {
    /// Compiles `graph` (unbound) for `config`: opens one device per stage and builds every
    /// pipeline. 16-bit storage is packed unless native `f16` is asked for (no probe runs).
    /// `progress` hears what is being done, for a status line.
    pub async fn new(
        graph: &Graph,
        weights: &Weights,
        config: &RunConfig,
        progress: &dyn Fn(&str),
    ) -> Result<AsyncSession, RunError> {
        let micro = config.micro_batch_size()?;
        let bound = bind(graph, micro)?;
        let mut contexts = Vec::new();
        for s in 0..config.stages {
            progress(&format!("opening device {} of {}", s + 1, config.stages));
            contexts.push(GpuContext::new().await?);
        }
        let options = dataset::plan_options(config, &contexts, &mut |_| Ok(HalfStorage::Packed))?;
        let compiled = if config.stages == 1 {
            progress("compiling kernels");
            let exe = GpuExecutable::with_options(
                &contexts[0],
                Plan::with_options(&bound, options)?,
                weights,
                ExecOptions {
                    prefetch: config.prefetch,
                    ..Default::default()
                },
            )
            .await?;
            Compiled::Single(Box::new(exe))
        } else {
            let part = stages::choose(&bound, config.stages, &stages::model_costs(&bound))?;
            let mut compiled = Vec::new();
            for (spec, ctx) in stages::split(&bound, &part)?.into_iter().zip(&contexts) {
                progress(&format!(
                    "compiling stage {} of {}",
                    spec.index + 1,
                    config.stages
                ));
                let plan = Plan::with_options(&spec.graph, options)?;
                let opts = ExecOptions {
                    prefetch: 1,
                    device: spec.index,
                    stage: spec.index,
                };
                let exe = GpuExecutable::with_options(ctx, plan, weights, opts).await?;
                compiled.push((spec, exe));
            }
            Compiled::Stages(compiled)
        };
        Ok(AsyncSession {
            graph: graph.clone(),
            config: config.clone(),
            micro,
            contexts,
            compiled,
        })
    }

    /// Names of the devices in use, one per stage.
    pub fn device_names(&self) -> Vec<String> {
        self.contexts
            .iter()
            .map(|c| format!("{} ({})", c.adapter.name, c.adapter.backend))
            .collect()
    }

    fn executables(&self) -> Vec<&GpuExecutable> {
        match &self.compiled {
            Compiled::Single(e) => vec![e],
            Compiled::Stages(s) => s.iter().map(|(_, e)| e).collect(),
        }
    }

    /// Memory of all stages together.
    pub fn memory(&self) -> MemorySummary {
        let mut m = MemorySummary::default();
        for e in self.executables() {
            let p = &e.plan().memory;
            m.planned_bytes += p.planned_bytes;
            m.naive_bytes += p.naive_bytes;
            m.weight_bytes += p.weight_bytes;
        }
        m
    }

    /// Bytes of device buffers allocated by all stages.
    pub fn allocated_bytes(&self) -> u64 {
        self.executables().iter().map(|e| e.allocated_bytes()).sum()
    }

    /// Where compute times come from.
    pub fn timing(&self) -> TimingSource {
        if self
            .executables()
            .iter()
            .all(|e| e.timing_source() == TimingSource::TimestampQueries)
        {
            TimingSource::TimestampQueries
        } else {
            TimingSource::HostCompletion
        }
    }

    /// Runs a dataset whose batched inputs hold a multiple of the micro-batch size of
    /// samples, handing every event to `on_event` as soon as it is known.
    pub async fn run(
        &self,
        data: &HashMap<String, Tensor>,
        run_id: &str,
        on_event: Option<&(dyn Fn(&Event) + Sync)>,
    ) -> Result<RunReport, RunError> {
        let n = dataset::samples(&self.graph, data, self.micro)?;
        if !n.is_multiple_of(self.micro) {
            return Err(RunError::Input {
                name: "batch".into(),
                message: format!(
                    "{n} samples do not split into micro-batches of {}",
                    self.micro
                ),
            });
        }
        let micro_batches: Vec<Values> = (0..n / self.micro)
            .map(|m| dataset::slice(&self.graph, data, m * self.micro, (m + 1) * self.micro))
            .collect();
        let trace = TraceContext {
            observer: on_event,
            ..TraceContext::new(run_id, now_ns())
        };
        let (per_mb, events) = match &self.compiled {
            Compiled::Single(exe) => {
                let r = exe.run_stream(&micro_batches, &trace, &mut |_| {}).await?;
                (r.outputs, r.events)
            }
            Compiled::Stages(stages) => {
                let mut per_mb = Vec::new();
                let mut events = Vec::new();
                for (b, batch) in micro_batches.chunks(self.config.microbatches).enumerate() {
                    let first = b * self.config.microbatches;
                    let values = run_gpipe(stages, batch, first, &trace, &mut events).await?;
                    for v in &values {
                        per_mb.push(dataset::graph_outputs(&self.graph, v)?);
                    }
                }
                (per_mb, events)
            }
        };
        RunReport::assemble(&self.graph, &self.config, &per_mb, events, n, self.timing())
    }
}

/// One GPipe fill and drain over `batch`: at step t, stage s runs micro-batch t − s; the
/// stages of a step are awaited together. Returns every value of each micro-batch.
async fn run_gpipe(
    stages: &[(StageSpec, GpuExecutable)],
    batch: &[Values],
    first: usize,
    base: &TraceContext<'_>,
    events: &mut Vec<Event>,
) -> Result<Vec<Values>, RunError> {
    let mut values: Vec<Values> = batch.to_vec();
    let transferred: Vec<Vec<String>> = stages
        .iter()
        .map(|(spec, _)| {
            spec.transferred_inputs
                .iter()
                .map(|k| k.replace(':', "#"))
                .collect()
        })
        .collect();
    for step in schedule::gpipe(stages.len(), batch.len()) {
        let runs = step.iter().map(|&(s, m)| {
            let (spec, exe) = &stages[s];
            let inputs: Values = spec
                .inputs
                .iter()
                .filter_map(|(name, key)| values[m].get(key).map(|t| (name.clone(), t.clone())))
                .collect();
            let trace = TraceContext {
                first_micro_batch: first + m,
                transferred_inputs: &transferred[s],
                transferred_outputs: &spec.transferred_outputs,
                ..*base
            };
            async move {
                let r = exe
                    .run_stream(std::slice::from_ref(&inputs), &trace, &mut |_| {})
                    .await
                    .map_err(|e| RunError::Op {
                        node: format!("stage {s}"),
                        message: e.to_string(),
                    })?;
                Ok::<_, RunError>((m, r))
            }
        });
        for result in futures_util::future::join_all(runs).await {
            let (m, mut r) = result?;
            events.append(&mut r.events);
            if let Some(outs) = r.outputs.pop() {
                values[m].extend(outs);
            }
        }
    }
    Ok(values)
}
