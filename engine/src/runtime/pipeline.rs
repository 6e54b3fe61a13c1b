//! Pipelines across devices (native only: one thread per stage). Each stage owns a device
//! (a distinct adapter when there are several GPUs, otherwise another logical device on
//! the same adapter) and runs the GPipe schedule: stage s works on micro-batch m while
//! stage s+1 works on m-1. Activations cross stages through mapped readback buffers and
//! the host.

use super::exec::{ExecOptions, GpuExecutable, Next, TraceContext};
use super::gpu::GpuContext;
use super::partition::Partition;
use super::plan::{Plan, PlanOptions};
use super::stages::{split, StageSpec};
use super::RunError;
use crate::graph::Graph;
use crate::telemetry::Event;
use crate::tensor::Tensor;
use crate::weights::Weights;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::mpsc;

type Values = HashMap<String, Tensor>;

/// A graph split into stages, each compiled on its own device.
pub struct Pipeline {
    stages: Vec<(StageSpec, GpuExecutable)>,
}

/// What a pipeline run returns.
pub struct PipelineRun {
    /// Every value of each micro-batch by key (graph outputs by their reference).
    pub values: Vec<Values>,
    /// Events of all stages.
    pub events: Vec<Event>,
}

impl Pipeline {
    /// Splits a bound graph by `part` and compiles stage s on `contexts[s]`.
    pub fn new(
        graph: &Graph,
        part: &Partition,
        contexts: &[GpuContext],
        weights: &Weights,
        options: PlanOptions,
        prefetch: usize,
    ) -> Result<Pipeline, RunError> {
        let specs = split(graph, part)?;
        if contexts.len() < specs.len() {
            return Err(RunError::Internal(format!(
                "{} stages but {} devices",
                specs.len(),
                contexts.len()
            )));
        }
        let mut stages = Vec::new();
        for (spec, ctx) in specs.into_iter().zip(contexts) {
            let plan = Plan::with_options(&spec.graph, options)?;
            let opts = ExecOptions {
                prefetch,
                device: spec.index,
                stage: spec.index,
            };
            let exe = pollster::block_on(GpuExecutable::with_options(ctx, plan, weights, opts))?;
            stages.push((spec, exe));
        }
        Ok(Pipeline { stages })
    }

    /// Bytes of device buffers allocated by all stages.
    pub fn allocated_bytes(&self) -> u64 {
        self.stages.iter().map(|(_, e)| e.allocated_bytes()).sum()
    }

    /// The stages' plans.
    pub fn plans(&self) -> Vec<&Plan> {
        self.stages.iter().map(|(_, e)| e.plan()).collect()
    }

    /// Runs one batch of micro-batches through the stages (GPipe: the pipeline fills and
    /// drains once per call). `trace` names the run, its start, the global index of the
    /// first micro-batch, the event observer and the cancel flag; `progress` gets each
    /// finished micro-batch's global index.
    pub fn run(
        &self,
        micro_batches: &[Values],
        trace: &TraceContext<'_>,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<PipelineRun, RunError> {
        let first = trace.first_micro_batch;
        let n = micro_batches.len();
        let s_count = self.stages.len();
        std::thread::scope(|scope| {
            let mut senders = Vec::new();
            let mut receivers = Vec::new();
            for _ in 0..=s_count {
                let (tx, rx) = mpsc::channel::<Message>();
                senders.push(tx);
                receivers.push(Some(rx));
            }
            let mut handles = Vec::new();
            for (s, (spec, exe)) in self.stages.iter().enumerate() {
                let rx = receivers[s].take().expect("one receiver per stage");
                let tx = senders[s + 1].clone();
                handles.push(scope.spawn(move || run_stage(s, spec, exe, n, rx, tx, trace)));
            }
            for (m, mb) in micro_batches.iter().enumerate() {
                if senders[0].send(Ok((m, mb.clone()))).is_err() {
                    break;
                }
            }
            drop(senders);
            let out_rx = receivers[s_count].take().expect("collector");
            let mut values: Vec<Values> = Vec::new();
            let mut failure = None;
            for _ in 0..n {
                match out_rx.recv() {
                    Ok(Ok((m, v))) => {
                        progress(first + m);
                        values.push(v);
                    }
                    Ok(Err(e)) => {
                        failure = Some(e);
                        break;
                    }
                    Err(_) => {
                        failure = Some(RunError::Internal("a pipeline stage stopped".into()));
                        break;
                    }
                }
            }
            drop(out_rx);
            let mut events = Vec::new();
            for h in handles {
                match h.join() {
                    Ok(mut e) => events.append(&mut e),
                    Err(_) => {
                        failure =
                            failure.or(Some(RunError::Internal("a pipeline stage panicked".into())))
                    }
                }
            }
            match failure {
                Some(e) => Err(e),
                None => Ok(PipelineRun { values, events }),
            }
        })
    }
}

type Message = Result<(usize, Values), RunError>;

/// One stage's thread: streams the micro-batches it receives through its device (with its
/// prefetch ring) and forwards every value to the next stage.
fn run_stage(
    s: usize,
    spec: &StageSpec,
    exe: &GpuExecutable,
    n: usize,
    rx: mpsc::Receiver<Message>,
    tx: mpsc::Sender<Message>,
    base: &TraceContext<'_>,
) -> Vec<Event> {
    let transferred_inputs: Vec<String> = spec
        .transferred_inputs
        .iter()
        .map(|k| k.replace(':', "#"))
        .collect();
    let stash: RefCell<HashMap<usize, Values>> = RefCell::new(HashMap::new());
    let mut received = 0;
    let mut upstream_error: Option<RunError> = None;
    let mut source = |block: bool| -> Next {
        if received == n || upstream_error.is_some() {
            return Next::Done;
        }
        let msg = if block {
            rx.recv().ok()
        } else {
            match rx.try_recv() {
                Ok(m) => Some(m),
                Err(mpsc::TryRecvError::Empty) => return Next::NotReady,
                Err(mpsc::TryRecvError::Disconnected) => None,
            }
        };
        match msg {
            Some(Ok((m, values))) => {
                received += 1;
                let inputs: Values = spec
                    .inputs
                    .iter()
                    .filter_map(|(name, key)| values.get(key).map(|t| (name.clone(), t.clone())))
                    .collect();
                stash.borrow_mut().insert(m, values);
                Next::Ready(m, inputs)
            }
            Some(Err(e)) => {
                upstream_error = Some(e);
                Next::Done
            }
            None => Next::Done,
        }
    };
    let mut sink = |m: usize, outs: Vec<(String, Tensor)>| -> Result<(), RunError> {
        let mut values = stash.borrow_mut().remove(&m).unwrap_or_default();
        values.extend(outs);
        tx.send(Ok((m, values)))
            .map_err(|_| RunError::Internal("the next stage stopped".into()))
    };
    let trace = TraceContext {
        transferred_inputs: &transferred_inputs,
        transferred_outputs: &spec.transferred_outputs,
        ..*base
    };
    let mut events = Vec::new();
    let result = pollster::block_on(exe.run_source(&mut source, &mut sink, &trace, &mut events));
    if let Some(e) = upstream_error {
        let _ = tx.send(Err(e));
    } else if let Err(e) = result {
        let _ = tx.send(Err(RunError::Op {
            node: format!("stage {s}"),
            message: e.to_string(),
        }));
    }
    events
}
