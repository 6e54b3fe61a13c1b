//! Sessions: a graph compiled for one configuration on a set of devices — one plan per
//! stage, each compiled on its stage's [`Device`] — that runs datasets through the one
//! driver ([`super::driver`]). The same session runs natively (a thread per stage) and in
//! browsers (every stage on the page's thread), on GPUs, on the CPU reference or on
//! remote workers.
//!
//! A dataset holds N samples along each batched input's batch axis. It is cut into
//! micro-batches of batch/M samples (the last one padded) that stream through the stages
//! across batch boundaries, and the outputs are joined back along their batch axes.
//! Configurations that would change the answer (cutting where the graph combines
//! samples) are refused before any work, naming the node.

use super::config::{
    calibrate, check_batching, check_run, half_policy, plan_options, Calibration, HalfPolicy,
    RunConfig, RunReport,
};
use super::dataset::{self, bind, Cutter};
use super::device::{CompileStats, Device, Executable, TraceContext, Values};
use super::driver::{drive, Concurrency, StageRun};
use super::input::{self, Inputs};
use super::schedule::Schedule;
use crate::error::RunError;
use crate::graph::{BatchSemantics, Graph};
use crate::plan::cost::Rates;
use crate::plan::partition::Partition;
use crate::plan::stages::{self, StagePlanSummary};
use crate::plan::{MemorySummary, Plan, PlanOptions, Precision};
use crate::telemetry::{metrics, now_ns, Event, EventKind, TimingSource};
use crate::weights::Weights;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;

/// How one stage's values map to the run's.
#[derive(Debug, Clone)]
struct StageIo {
    /// (input name in the stage's plan, value key in the run).
    inputs: Vec<(String, String)>,
    /// Plan input names whose values come from another stage.
    transferred_inputs: Vec<String>,
    /// Plan output names that only feed later stages.
    transferred_outputs: Vec<String>,
    /// Value keys the run needs after this stage.
    keep: Vec<String>,
}

/// A compiled stage.
struct Stage {
    io: StageIo,
    exe: Box<dyn Executable>,
}

/// What a run is told besides its data.
#[derive(Clone, Copy)]
pub struct RunContext<'a> {
    /// Run id, in events.
    pub run: &'a str,
    /// Called with every event as soon as it is known.
    pub observer: Option<&'a (dyn Fn(&Event) + Sync)>,
    /// Set to stop the run: no further micro-batch starts.
    pub cancel: Option<&'a AtomicBool>,
    /// Called with (micro-batches done, total) as results arrive.
    pub progress: Option<&'a (dyn Fn(usize, usize) + Sync)>,
    /// How the stages run.
    pub concurrency: Concurrency,
}

impl<'a> RunContext<'a> {
    /// A run with nothing to observe, on threads where there are threads.
    pub fn new(run: &'a str) -> RunContext<'a> {
        RunContext {
            run,
            observer: None,
            cancel: None,
            progress: None,
            concurrency: if cfg!(all(feature = "native", not(target_arch = "wasm32"))) {
                Concurrency::ThreadPerStage
            } else {
                Concurrency::OneThread
            },
        }
    }
}

/// A graph compiled for one configuration on its devices.
pub struct Session {
    config: RunConfig,
    micro: usize,
    semantics: BatchSemantics,
    stages: Vec<Stage>,
    /// (graph output name, value key) of every graph output.
    output_keys: Vec<(String, String)>,
    partition: Option<StagePlanSummary>,
    options: PlanOptions,
    device_names: Vec<String>,
    /// Graph inputs kept on the devices ([`Session::keep_inputs`]).
    kept: BTreeSet<String>,
    /// Under 16-bit storage, the values the policy keeps in f32.
    policy: Option<Box<HalfPolicy>>,
    /// What recompiling with a calibrated policy needs, until the first run calibrates.
    uncalibrated: Option<Box<Uncalibrated>>,
}

/// A session under 16-bit storage compiled before its inputs were known: what its first
/// run needs to calibrate the 16-bit storage policy and recompile with it.
struct Uncalibrated {
    graph: Graph,
    weights: Weights,
    devices: Vec<Box<dyn Device>>,
    /// Inputs kept on the devices so far, to keep again after recompiling.
    kept: Values,
}

/// Value keys of a bound graph's outputs: `node` or `node:port`.
fn output_key(graph: &Graph, o: &crate::graph::OutputRef) -> String {
    let id = &graph.dag[o.node].id;
    if o.port == 0 {
        id.clone()
    } else {
        format!("{id}:{}", o.port)
    }
}

impl Session {
    /// Plans `graph` (unbound) for `config` and compiles stage s on `devices[s]` (one
    /// device per stage). Refuses configurations that would change the answer, and runs
    /// over the graph's limits ([`check_run`] first, then each stage's plan, before it
    /// reaches a device). `progress` hears what is being done, for a status line.
    pub async fn compile(
        graph: &Graph,
        weights: &Weights,
        config: &RunConfig,
        devices: Vec<Box<dyn Device>>,
        progress: &dyn Fn(&str),
    ) -> Result<Session, RunError> {
        Session::compile_with_policy(graph, weights, config, devices, progress, None).await
    }

    /// [`Session::compile`] with the 16-bit storage policy given (a calibrated one), or
    /// (`None`) the policy of weights, constants and operators, calibrated at the first run.
    async fn compile_with_policy(
        graph: &Graph,
        weights: &Weights,
        config: &RunConfig,
        devices: Vec<Box<dyn Device>>,
        progress: &dyn Fn(&str),
        policy: Option<HalfPolicy>,
    ) -> Result<Session, RunError> {
        check_run(graph, config, None, &graph.limits)?;
        let micro = config.micro_batch_size()?;
        let semantics = graph.batch_semantics();
        check_batching(&semantics, config, None)?;
        if devices.len() < config.stages {
            return Err(RunError::Config {
                setting: "stages".into(),
                message: format!(
                    "{} stages need {} devices, {} given",
                    config.stages,
                    config.stages,
                    devices.len()
                ),
            });
        }
        let devices: Vec<Box<dyn Device>> = devices.into_iter().take(config.stages).collect();
        let bound = bind(graph, micro)?;
        let options = plan_options(config, &devices).await?;
        let calibrated = policy.is_some();
        let policy = (options.precision != Precision::F32).then(|| {
            policy.unwrap_or_else(|| half_policy(&bound, weights, None, Calibration::Pending))
        });
        let keep_f32 = policy.as_ref().map(HalfPolicy::names).unwrap_or_default();
        let device_names = devices.iter().map(|d| d.name()).collect();
        let mut stages_out = Vec::new();
        let (output_keys, partition) = if config.stages == 1 {
            progress("compiling kernels");
            let plan = Plan::with_policy(&bound, options, &keep_f32)?;
            plan.check_limits(&graph.limits)?;
            let io = StageIo {
                inputs: plan
                    .inputs
                    .iter()
                    .map(|(n, _)| (n.clone(), n.clone()))
                    .collect(),
                transferred_inputs: Vec::new(),
                transferred_outputs: Vec::new(),
                keep: plan.outputs.iter().map(|(n, _)| n.clone()).collect(),
            };
            let exe = devices[0].compile(plan, weights, config.prefetch).await?;
            stages_out.push(Stage { io, exe });
            let keys = bound
                .outputs
                .iter()
                .map(|o| (o.name.clone(), o.name.clone()))
                .collect();
            (keys, None)
        } else {
            let rates: Vec<Rates> = devices.iter().map(|d| d.rates()).collect();
            let rates = Rates::slowest(&rates);
            let costs = if config.profile {
                progress("profiling");
                profile(&bound, weights, options, devices[0].as_ref()).await?
            } else {
                stages::model_costs(&bound, &rates, &options)
            };
            let part = stages::choose(&bound, config.stages, &costs, &rates, &options)?;
            let specs = stages::split(&bound, &part)?;
            let keys: Vec<(String, String)> = bound
                .outputs
                .iter()
                .map(|o| (o.name.clone(), output_key(&bound, o)))
                .collect();
            for (s, (spec, device)) in specs.iter().zip(&devices).enumerate() {
                progress(&format!("compiling stage {} of {}", s + 1, config.stages));
                let plan = Plan::with_policy(&spec.graph, options, &keep_f32)?;
                plan.check_limits(&graph.limits)?;
                let later: BTreeSet<String> = specs[s + 1..]
                    .iter()
                    .flat_map(|sp| sp.inputs.iter().map(|(_, k)| k.clone()))
                    .chain(keys.iter().map(|(_, k)| k.clone()))
                    .collect();
                let io = StageIo {
                    transferred_inputs: spec
                        .inputs
                        .iter()
                        .filter(|(_, k)| spec.transferred_inputs.contains(k))
                        .map(|(n, _)| n.clone())
                        .collect(),
                    inputs: spec.inputs.clone(),
                    transferred_outputs: spec.transferred_outputs.clone(),
                    keep: later.into_iter().collect(),
                };
                let exe = device.compile(plan, weights, config.prefetch).await?;
                stages_out.push(Stage { io, exe });
            }
            (keys, Some(stages::summary(&bound, &part)))
        };
        Ok(Session {
            config: config.clone(),
            micro,
            semantics,
            stages: stages_out,
            output_keys,
            partition,
            options,
            device_names,
            kept: BTreeSet::new(),
            uncalibrated: (policy.is_some() && !calibrated).then(|| {
                Box::new(Uncalibrated {
                    graph: graph.clone(),
                    weights: weights.clone(),
                    devices,
                    kept: Values::new(),
                })
            }),
            policy: policy.map(Box::new),
        })
    }

    /// The 16-bit storage policy in force (`None` in f32): which values are kept in f32
    /// and why, and whether the ranges were calibrated yet.
    pub fn half_policy(&self) -> Option<&HalfPolicy> {
        self.policy.as_deref()
    }

    /// Calibrates the 16-bit storage policy on the first micro-batch of `data` (an f32
    /// run on the first stage's device) and, where it keeps more values in f32 than the
    /// plans do, recompiles with it. A failed calibration is recorded in the policy and
    /// the session keeps its plans.
    async fn calibrate(&mut self, data: &Values, cutter: &Cutter) -> Result<(), RunError> {
        let Some(u) = self.uncalibrated.take() else {
            return Ok(());
        };
        let mut data_and_kept = u.kept.clone();
        data_and_kept.extend(data.iter().map(|(k, t)| (k.clone(), t.clone())));
        let bound = bind(&u.graph, self.micro)?;
        let inputs = if self.semantics.batched() {
            cutter.cut(&data_and_kept, 0)
        } else {
            Ok(dataset::borrow_whole(&data_and_kept))
        };
        let ranges = match inputs {
            Ok(inputs) => calibrate(&bound, &u.weights, u.devices[0].as_ref(), inputs).await,
            Err(e) => Err(e),
        };
        let policy = match ranges {
            Ok(r) => half_policy(
                &bound,
                &u.weights,
                Some(&r),
                Calibration::Measured {
                    samples: cutter.real(0),
                },
            ),
            Err(e) => {
                tracing::warn!("16-bit storage policy: calibration failed: {e}");
                let mut p =
                    self.policy.as_deref().cloned().unwrap_or_else(|| {
                        half_policy(&bound, &u.weights, None, Calibration::Pending)
                    });
                p.calibration = Calibration::Failed {
                    message: e.to_string(),
                };
                self.policy = Some(Box::new(p));
                return Ok(());
            }
        };
        let planned = self
            .policy
            .as_deref()
            .map(HalfPolicy::names)
            .unwrap_or_default();
        if policy.names().is_subset(&planned) {
            self.policy = Some(Box::new(policy));
            return Ok(());
        }
        let kept = u.kept;
        let mut session = Session::compile_with_policy(
            &u.graph,
            &u.weights,
            &self.config,
            u.devices,
            &|_| {},
            Some(policy),
        )
        .await?;
        if !kept.is_empty() {
            session.keep_inputs(&kept)?;
        }
        *self = session;
        Ok(())
    }

    /// Replaces the weights of every stage (each takes the keys of its plan): later runs
    /// compute with them. A training step's update.
    pub fn write_weights(&mut self, weights: &Weights) -> Result<(), RunError> {
        for stage in &mut self.stages {
            stage.exe.write_weights(weights)?;
        }
        if let Some(u) = &mut self.uncalibrated {
            for (k, t) in weights {
                if let Some(w) = u.weights.get_mut(k) {
                    *w = t.clone();
                }
            }
        }
        Ok(())
    }

    /// Samples per micro-batch.
    pub fn micro_batch_size(&self) -> usize {
        self.micro
    }

    /// The configuration it was compiled for.
    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    /// Names of the devices in use, one per stage.
    pub fn device_names(&self) -> Vec<String> {
        self.device_names.clone()
    }

    /// The plans of the stages (one when S = 1).
    pub fn plans(&self) -> Vec<&Plan> {
        self.stages.iter().map(|s| s.exe.plan()).collect()
    }

    /// Memory of all stages together.
    pub fn memory(&self) -> MemorySummary {
        MemorySummary::total(self.plans())
    }

    /// Bytes of device memory all stages hold.
    pub fn allocated_bytes(&self) -> u64 {
        self.stages.iter().map(|s| s.exe.allocated_bytes()).sum()
    }

    /// The stage split, for pipelines.
    pub fn stage_summary(&self) -> Option<&StagePlanSummary> {
        self.partition.as_ref()
    }

    /// The plan options in force (precision and 16-bit storage chosen for the devices).
    pub fn plan_options(&self) -> PlanOptions {
        self.options
    }

    /// The graph's batch semantics.
    pub fn batch_semantics(&self) -> &BatchSemantics {
        &self.semantics
    }

    /// What compiling cost, summed over the stages.
    pub fn compile_stats(&self) -> CompileStats {
        self.stages
            .iter()
            .map(|s| s.exe.compile_stats())
            .fold(CompileStats::default(), |a, b| CompileStats {
                pipelines_created: a.pipelines_created + b.pipelines_created,
                passes: a.passes + b.passes,
                millis: a.millis + b.millis,
            })
    }

    /// Where compute times come from: the least exact source of its stages.
    pub fn timing(&self) -> TimingSource {
        self.stages
            .iter()
            .map(|s| s.exe.timing())
            .max()
            .unwrap_or(TimingSource::HostCompletion)
    }

    /// Runs a dataset: every batched input holds the same number of samples along its
    /// batch axis (inputs without a batch axis are given whole).
    pub async fn run(
        &mut self,
        data: &Values,
        ctx: &RunContext<'_>,
    ) -> Result<RunReport, RunError> {
        let pass = self.pass(data, ctx, false).await?;
        let outputs = pass.cutter.join(&pass.outputs)?;
        let metrics = metrics::compute(&pass.events, self.stages.len(), pass.count, pass.samples);
        Ok(RunReport {
            outputs,
            events: pass.events,
            metrics,
            timing: self.timing(),
            micro_batches: pass.count,
            first_result_ns: pass.first_result_ns,
            half_policy: self.policy.as_deref().cloned(),
        })
    }

    /// Keeps graph inputs on the devices of the stages that read them, for every later run
    /// (device-resident inputs: nothing is uploaded for them again): a run's data may then
    /// leave them out. Each is one micro-batch's value (the plan's shape at the micro-batch
    /// size), so a run that leaves out a kept input with a batch axis has one micro-batch;
    /// data that carries a kept input replaces the kept value.
    pub fn keep_inputs(&mut self, values: &Values) -> Result<(), RunError> {
        let mut per_stage: Vec<Values> = vec![Values::new(); self.stages.len()];
        for (name, t) in values {
            t.check().map_err(|message| RunError::Input {
                name: name.clone(),
                message,
            })?;
            let mut read = false;
            for (stage, per) in self.stages.iter().zip(&mut per_stage) {
                for (plan_name, key) in &stage.io.inputs {
                    if key == name && !stage.io.transferred_inputs.contains(plan_name) {
                        per.insert(plan_name.clone(), t.clone());
                        read = true;
                    }
                }
            }
            if !read {
                return Err(RunError::Input {
                    name: name.clone(),
                    message: "is not an input of the graph, so it cannot be kept on a device"
                        .into(),
                });
            }
        }
        // Every stage checks its share before any is written.
        for (stage, per) in self.stages.iter().zip(&per_stage) {
            crate::exec::dataset::check_kept_inputs(stage.exe.plan(), per)?;
        }
        for (stage, per) in self.stages.iter_mut().zip(&per_stage) {
            if !per.is_empty() {
                stage.exe.keep_inputs(per)?;
            }
        }
        self.kept.extend(values.keys().cloned());
        if let Some(u) = &mut self.uncalibrated {
            u.kept
                .extend(values.iter().map(|(k, t)| (k.clone(), t.clone())));
        }
        Ok(())
    }

    /// A warm-up pass: the dataset's first micro-batch through every stage, its outputs
    /// thrown away, so that the first dispatches (drivers compiling pipelines, first
    /// allocations) are paid before a measured [`Session::run`]. Its events, timed from
    /// its own start and marked [`Event::warm_up`], reach the observer and are returned.
    /// Inference keeps no state between micro-batches, so the measured run's outputs are
    /// the same with or without it.
    pub async fn warm_up(
        &mut self,
        data: &Values,
        ctx: &RunContext<'_>,
    ) -> Result<Vec<Event>, RunError> {
        Ok(self.pass(data, ctx, true).await?.events)
    }

    /// Refuses data that leaves out a kept input with a batch axis (one micro-batch's
    /// samples) while holding more samples than one micro-batch: they would be paired
    /// with the kept samples of another micro-batch.
    fn check_kept_left_out(&self, data: &Values, samples: Option<usize>) -> Result<(), RunError> {
        let Some(n) = samples.filter(|&n| n > self.micro) else {
            return Ok(());
        };
        let batched_and_left_out = |name: &&String| {
            !data.contains_key(*name)
                && self
                    .semantics
                    .inputs
                    .iter()
                    .any(|(input, axis)| input == *name && axis.is_some())
        };
        match self.kept.iter().find(batched_and_left_out) {
            Some(name) => Err(RunError::Input {
                name: name.clone(),
                message: format!(
                    "is kept on the device as one micro-batch of {} samples, but the data holds {n}: give it with the data, or run one micro-batch at a time",
                    self.micro
                ),
            }),
            None => Ok(()),
        }
    }

    /// Drives a dataset's micro-batches through the stages (only the first, its outputs
    /// dropped, for a warm-up).
    async fn pass(
        &mut self,
        data: &Values,
        ctx: &RunContext<'_>,
        warm_up: bool,
    ) -> Result<Pass, RunError> {
        for (name, t) in data {
            t.check().map_err(|message| RunError::Input {
                name: name.clone(),
                message,
            })?;
        }
        let samples = dataset::samples(&self.semantics, data)?;
        check_batching(&self.semantics, &self.config, samples)?;
        self.check_kept_left_out(data, samples)?;
        if samples == Some(0) {
            return Err(RunError::Input {
                name: "dataset".into(),
                message: "the inputs hold no samples".into(),
            });
        }
        let n = samples.unwrap_or(self.micro);
        let cutter = Cutter::new(&self.semantics, self.micro, n);
        self.calibrate(data, &cutter).await?;
        let count = if self.semantics.batched() && !warm_up {
            cutter.count()
        } else {
            1
        };
        let start = now_ns();
        let run = ctx.run;
        let observer = ctx.observer;
        let runs: Vec<StageRun<'_>> = self
            .stages
            .iter_mut()
            .enumerate()
            .map(|(s, stage)| StageRun {
                exe: stage.exe.as_mut(),
                inputs: &stage.io.inputs,
                keep: &stage.io.keep,
                trace: TraceContext {
                    run,
                    start_ns: start,
                    device: s,
                    stage: s,
                    transferred_inputs: &stage.io.transferred_inputs,
                    transferred_outputs: &stage.io.transferred_outputs,
                    observer,
                    warm_up,
                },
            })
            .collect();
        let semantics_batched = self.semantics.batched();
        let source = |m: usize| -> Result<Inputs<'_>, RunError> {
            if semantics_batched {
                cutter.cut(data, m)
            } else {
                Ok(dataset::borrow_whole(data))
            }
        };
        let mut per_mb: Vec<Values> = Vec::with_capacity(count);
        let mut first_result_ns = 0;
        let output_keys = &self.output_keys;
        let mut sink = |m: usize, mut values: Inputs<'_>| -> Result<(), RunError> {
            if m == 0 {
                first_result_ns = now_ns().saturating_sub(start);
            }
            let mut outs = Values::new();
            for (name, key) in output_keys {
                let t = values.remove(key).ok_or_else(|| {
                    RunError::Internal(format!("output '{name}' missing from micro-batch {m}"))
                })?;
                outs.insert(name.clone(), t.into_tensor());
            }
            if !warm_up {
                per_mb.push(outs);
                if let Some(p) = ctx.progress {
                    p(m + 1, count);
                }
            }
            Ok(())
        };
        let events = drive(
            runs,
            Schedule::GPipe,
            count,
            &source,
            &mut sink,
            ctx.cancel,
            ctx.concurrency,
        )
        .await?;
        Ok(Pass {
            cutter,
            outputs: per_mb,
            events,
            count,
            samples: n,
            first_result_ns,
        })
    }
}

/// What driving a dataset through the stages gave.
struct Pass {
    cutter: Cutter,
    /// Outputs per micro-batch (none for a warm-up).
    outputs: Vec<Values>,
    events: Vec<Event>,
    /// Micro-batches driven.
    count: usize,
    /// Samples in the dataset.
    samples: usize,
    first_result_ns: u64,
}

/// Measured seconds per partitioned node: an unfused plan on `device`, run twice (the
/// first run pays for driver shader compilation), its compute events summed by node.
async fn profile(
    bound: &Graph,
    weights: &Weights,
    options: PlanOptions,
    device: &dyn Device,
) -> Result<Vec<f64>, RunError> {
    let plan = Plan::with_options(
        bound,
        PlanOptions {
            fuse: false,
            ..options
        },
    )?;
    let mut exe = device.compile(plan, weights, 1).await?;
    let inputs = dataset::random_inputs(bound, 0)?;
    let trace = TraceContext::new("profile", now_ns());
    let mut events = Vec::new();
    for _ in 0..2 {
        events.clear();
        exe.submit(0, input::owned(inputs.clone()), &trace, &mut events)?;
        exe.complete(&trace, &mut events).await?;
    }
    let mut per: HashMap<&str, u64> = HashMap::new();
    for e in events.iter().filter(|e| e.kind == EventKind::Compute) {
        *per.entry(e.node.as_str()).or_default() += e.duration_ns();
    }
    Ok(stages::partition_nodes(bound)
        .into_iter()
        .map(|ix| per.get(bound.dag[ix].id.as_str()).copied().unwrap_or(0) as f64 / 1e9)
        .collect())
}

/// The partition a session would use, without compiling: for printing plans and for the
/// editor's auto-partition.
pub fn partition_for(
    bound: &Graph,
    stages: usize,
    rates: &Rates,
    options: &PlanOptions,
) -> Result<Partition, RunError> {
    let costs = stages::model_costs(bound, rates, options);
    stages::choose(bound, stages, &costs, rates, options)
}
