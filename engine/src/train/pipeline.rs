//! Pipeline-parallel training steps: the joint forward + backward graph cut into S stages
//! (a layer's forward and backward pass on the same stage, each stage on its own device)
//! and run with a [`TrainSchedule`] — 1F1B or GPipe — over the M micro-batches of a step.
//!
//! The forward graph is partitioned as for inference ([`stages::choose`]); every backward
//! node goes to the stage of the forward node whose gradient rule emitted it
//! ([`Origin`]), a weight's gradient sums to the stage that holds it, and its reads
//! (constants too) to every piece reading it ([`stages::split`]). So a
//! stage runs two pieces of the joint graph: its forward piece (inputs from the stage
//! before) and its backward piece (gradients from the stage after, and the activations
//! its forward piece stashed). In the order F₀ … F_{S−1}, B_{S−1} … B₀ every value is
//! produced before it is read — checked when the cut is made.
//!
//! Each stage runs on its own thread, following its schedule's tasks: activations flow
//! forward and gradients backward through channels (a stage that fails closes them, so
//! its neighbours stop instead of waiting). Graph inputs (features, labels, the loss
//! scale) are read from the step's micro-batches directly. The stash of stage s holds,
//! from its forward pass of micro-batch m until its backward pass, exactly the values its
//! backward piece reads (graph inputs among them); its measured peak (bytes and micro-batches) is the activation
//! memory the schedule needs. Every micro-batch of a step computes with the same weights
//! and the step returns each micro-batch's outputs (loss, gradients), so its gradients
//! are those of one stage.

use super::error::TrainError;
use crate::autodiff::{Joint, Origin};
use crate::error::RunError;
use crate::exec::device::{Device, Executable, TraceContext, Values};
use crate::exec::schedule::{TrainSchedule, TrainTask};
use crate::graph::{Graph, NodeKind};
use crate::ops::Op;
use crate::plan::partition::Partition;
use crate::plan::stages;
use crate::plan::{Plan, PlanOptions};
use crate::tensor::{Tensor, TensorData};
use crate::weights::Weights;
use petgraph::Direction;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What one pipelined step measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipelineStats {
    /// The schedule followed.
    pub schedule: TrainSchedule,
    /// Stages.
    pub stages: usize,
    /// Micro-batches in the step.
    pub micro_batches: usize,
    /// 1 − (busy time of all stages) / (stages × the step's span): the measured bubble.
    pub bubble: f64,
    /// The schedule's ideal bubble with equal task times, for comparison.
    pub ideal_bubble: f64,
    /// Wall milliseconds from the first task's start to the last one's end.
    pub span_ms: f64,
    /// Milliseconds each stage spent computing (its tasks, not its waits).
    pub busy_ms: Vec<f64>,
    /// Most bytes of stashed activations each stage held at once.
    pub peak_stash_bytes: Vec<u64>,
    /// Most micro-batches each stage had stashed at once.
    pub peak_stashed: Vec<usize>,
}

/// One compiled piece of the joint graph and how its values map to the step's.
struct Piece {
    exe: Box<dyn Executable>,
    /// (input name in the piece, value key in the step).
    inputs: Vec<(String, String)>,
}

/// A stage: its two pieces (absent when it has no node of that direction) and what it
/// keeps and passes on.
struct Stage {
    forward: Option<Piece>,
    backward: Option<Piece>,
    /// Value keys its backward piece reads from forward values: what it stashes.
    stash: HashSet<String>,
    /// Value keys later stages read from forward values: what it sends on.
    send_forward: HashSet<String>,
    /// Value keys earlier stages read from backward values: what it sends back.
    send_backward: HashSet<String>,
}

/// The joint graph compiled as a pipeline on S devices.
pub(crate) struct Pipeline {
    schedule: TrainSchedule,
    stages: Vec<Stage>,
    /// Graph inputs (read from the micro-batches).
    graph_inputs: HashSet<String>,
    /// Keys of the joint graph's outputs (the loss, the gradients, ...).
    results: HashSet<String>,
}

/// Where each operator node of the joint graph goes: piece `s` is the forward piece of
/// stage s, piece `2S−1−s` its backward piece.
fn assign_pieces(
    joint: &Joint,
    forward_stage: &HashMap<String, usize>,
    stages: usize,
) -> Result<Vec<usize>, TrainError> {
    let graph = &joint.graph;
    // Stages of the forward nodes holding each weight.
    let mut holders: HashMap<String, Vec<usize>> = HashMap::new();
    for ix in graph.order.iter().copied() {
        let node = &graph.dag[ix];
        if let Some(&s) = forward_stage.get(&node.id) {
            for spec in &node.params {
                holders.entry(node.param_key(spec)).or_default().push(s);
            }
        }
        // A weight read through a `param` node is held by the forward nodes reading it.
        if let NodeKind::Op(Op::Param(param)) = &node.kind {
            for reader in graph.dag.neighbors_directed(ix, Direction::Outgoing) {
                if let Some(&s) = forward_stage.get(&graph.dag[reader].id) {
                    holders.entry(param.key.clone()).or_default().push(s);
                }
            }
        }
    }
    let backward = |s: usize| 2 * stages - 1 - s;
    stages::partition_nodes(graph)
        .into_iter()
        .map(|ix| {
            let node = &graph.dag[ix];
            if let Some(&s) = forward_stage.get(&node.id) {
                return Ok(s);
            }
            let stage = match joint.origins.get(&node.id) {
                Some(Origin::Node(id)) => forward_stage.get(id).copied(),
                // Summed where its first user runs (its `param` reads are not partitioned:
                // each piece reading the weight has its own).
                Some(Origin::Weight(key)) => holders.get(key).and_then(|s| s.iter().min().copied()),
                Some(Origin::Loss) => Some(stages - 1),
                Some(Origin::Input(_)) => Some(0),
                None => None,
            };
            stage.map(backward).ok_or_else(|| {
                TrainError::Setup(format!(
                    "cannot place backward node '{}' on a pipeline stage",
                    node.id
                ))
            })
        })
        .collect()
}

impl Pipeline {
    /// Cuts `joint` (the joint graph of `forward`, both bound to the micro-batch size)
    /// into `devices.len()` stages and compiles each stage's pieces on its device, within
    /// `forward`'s limits.
    pub(crate) async fn compile(
        forward: &Graph,
        joint: &Joint,
        weights: &Weights,
        options: PlanOptions,
        devices: &[Box<dyn Device>],
        schedule: TrainSchedule,
        progress: &dyn Fn(&str),
    ) -> Result<Pipeline, TrainError> {
        let s_count = devices.len();
        let rates: Vec<_> = devices.iter().map(|d| d.rates()).collect();
        let rates = crate::plan::cost::Rates::slowest(&rates);
        let costs = stages::model_costs(forward, &rates, &options);
        let part = stages::choose(forward, s_count, &costs, &rates, &options)?;
        let forward_stage: HashMap<String, usize> = stages::partition_nodes(forward)
            .into_iter()
            .zip(&part.stage_of)
            .map(|(ix, &s)| (forward.dag[ix].id.clone(), s))
            .collect();
        let piece_of = assign_pieces(joint, &forward_stage, s_count)?;
        // Pieces without nodes are left out of the cut (their stage skips that pass).
        let mut present: Vec<usize> = piece_of.clone();
        present.sort_unstable();
        present.dedup();
        let compact: HashMap<usize, usize> =
            present.iter().enumerate().map(|(i, &p)| (p, i)).collect();
        let cut = Partition {
            stage_of: piece_of.iter().map(|p| compact[p]).collect(),
            stage_costs: vec![0.0; present.len()],
            bottleneck: 0.0,
        };
        let specs = stages::split(&joint.graph, &cut)?;
        let graph_inputs: HashSet<String> =
            joint.graph.inputs.iter().map(|(n, _)| n.clone()).collect();
        // Which piece produces each value, checking that it comes before its readers.
        let mut produced_by: HashMap<String, usize> = HashMap::new();
        for (spec, &piece) in specs.iter().zip(&present) {
            for (_, key) in &spec.inputs {
                if graph_inputs.contains(key) {
                    continue;
                }
                match produced_by.get(key) {
                    Some(&p) if p < piece => {}
                    _ => {
                        return Err(TrainError::Setup(format!(
                            "the joint graph cannot be cut into {s_count} pipeline stages: '{key}' is read before it is produced (a weight or value shared across stages in a way the schedule cannot order)"
                        )))
                    }
                }
            }
            for key in &spec.outputs {
                produced_by.insert(key.clone(), piece);
            }
        }
        let is_forward = |piece: usize| piece < s_count;
        let device_of = |piece: usize| {
            if piece < s_count {
                piece
            } else {
                2 * s_count - 1 - piece
            }
        };
        let mut stages_out: Vec<Stage> = (0..s_count)
            .map(|_| Stage {
                forward: None,
                backward: None,
                stash: HashSet::new(),
                send_forward: HashSet::new(),
                send_backward: HashSet::new(),
            })
            .collect();
        for (spec, &piece) in specs.iter().zip(&present) {
            let reader = device_of(piece);
            for (_, key) in &spec.inputs {
                let Some(&from) = produced_by.get(key) else {
                    // A graph input: every stage reads it from the step's micro-batch,
                    // and a backward pass reading it counts it as stashed.
                    if !is_forward(piece) {
                        stages_out[reader].stash.insert(key.clone());
                    }
                    continue;
                };
                if is_forward(from) {
                    if device_of(from) > reader {
                        return Err(TrainError::Setup(format!(
                            "the joint graph cannot be cut into {s_count} pipeline stages: stage {} reads '{key}', which stage {} produces later",
                            reader + 1,
                            device_of(from) + 1
                        )));
                    }
                    if !is_forward(piece) {
                        stages_out[reader].stash.insert(key.clone());
                    }
                    for stage in &mut stages_out[device_of(from)..reader] {
                        stage.send_forward.insert(key.clone());
                    }
                } else {
                    for stage in &mut stages_out[reader + 1..=device_of(from)] {
                        stage.send_backward.insert(key.clone());
                    }
                }
            }
        }
        for (spec, &piece) in specs.into_iter().zip(&present) {
            let s = device_of(piece);
            progress(&format!(
                "compiling the {} pass of stage {} of {s_count}",
                if is_forward(piece) {
                    "forward"
                } else {
                    "backward"
                },
                s + 1
            ));
            let plan = Plan::with_options(&spec.graph, options)?;
            plan.check_limits(&forward.limits)?;
            let exe = devices[s].compile(plan, weights, 1).await?;
            let compiled = Some(Piece {
                exe,
                inputs: spec.inputs,
            });
            if is_forward(piece) {
                stages_out[s].forward = compiled;
            } else {
                stages_out[s].backward = compiled;
            }
        }
        Ok(Pipeline {
            schedule,
            stages: stages_out,
            graph_inputs,
            results: joint.graph.outputs.iter().map(|o| o.name.clone()).collect(),
        })
    }

    /// Replaces the weights of every piece.
    pub(crate) fn write_weights(&mut self, weights: &Weights) -> Result<(), RunError> {
        for stage in &mut self.stages {
            for piece in [&mut stage.forward, &mut stage.backward]
                .into_iter()
                .flatten()
            {
                piece.exe.write_weights(weights)?;
            }
        }
        Ok(())
    }

    /// Runs one step over `micro` (every micro-batch's graph inputs) and returns each
    /// micro-batch's joint-graph outputs, with what the step measured.
    pub(crate) fn step(
        &mut self,
        micro: &[Values],
    ) -> Result<(Vec<Values>, PipelineStats), TrainError> {
        let s_count = self.stages.len();
        let m_count = micro.len();
        let schedule = self.schedule;
        let mut forward_links: Vec<Option<mpsc::Receiver<Message>>> = Vec::new();
        let mut forward_senders: Vec<Option<mpsc::Sender<Message>>> = Vec::new();
        let mut backward_links: Vec<Option<mpsc::Receiver<Message>>> = Vec::new();
        let mut backward_senders: Vec<Option<mpsc::Sender<Message>>> = Vec::new();
        forward_links.push(None);
        backward_senders.push(None);
        for _ in 1..s_count {
            let (tx, rx) = mpsc::channel();
            forward_senders.push(Some(tx));
            forward_links.push(Some(rx));
            let (tx, rx) = mpsc::channel();
            backward_senders.push(Some(tx));
            backward_links.push(Some(rx));
        }
        forward_senders.push(None);
        backward_links.push(None);
        let start = Instant::now();
        let shared = Shared {
            micro,
            graph_inputs: &self.graph_inputs,
            results: &self.results,
            start,
        };
        let outcomes: Vec<Result<StageOutcome, Failure>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .stages
                .iter_mut()
                .enumerate()
                .zip(forward_links.into_iter().zip(forward_senders))
                .zip(backward_links.into_iter().zip(backward_senders))
                .map(
                    |(((s, stage), (from_prev, to_next)), (from_next, to_prev))| {
                        let links = Links {
                            from_prev,
                            to_next,
                            from_next,
                            to_prev,
                        };
                        let tasks = schedule.tasks(s, s_count, m_count);
                        let shared = &shared;
                        scope.spawn(move || run_stage(s, stage, &tasks, links, shared))
                    },
                )
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Failure::Own(TrainError::Run(RunError::Internal(
                            "a pipeline stage's thread panicked".into(),
                        ))))
                    })
                })
                .collect()
        });
        let mut done = Vec::with_capacity(s_count);
        let mut peer_stopped = None;
        for (s, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Ok(o) => done.push(o),
                Err(Failure::Own(e)) => return Err(e),
                Err(Failure::Peer) => peer_stopped = Some(s),
            }
        }
        if let Some(s) = peer_stopped {
            return Err(TrainError::Run(RunError::Internal(format!(
                "pipeline stage {s} lost its neighbour"
            ))));
        }
        let mut outputs: Vec<Values> = vec![Values::new(); m_count];
        for o in &mut done {
            for (m, values) in o.results.drain(..) {
                if let Some(slot) = outputs.get_mut(m) {
                    slot.extend(values);
                }
            }
        }
        let first = done.iter().filter_map(|o| o.first_start).min();
        let last = done.iter().filter_map(|o| o.last_end).max();
        let span = match (first, last) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => Duration::ZERO,
        };
        let busy: Duration = done.iter().map(|o| o.busy).sum();
        let capacity = span.as_secs_f64() * s_count as f64;
        let stats = PipelineStats {
            schedule,
            stages: s_count,
            micro_batches: m_count,
            bubble: if capacity > 0.0 {
                (1.0 - busy.as_secs_f64() / capacity).max(0.0)
            } else {
                0.0
            },
            ideal_bubble: schedule.ideal_bubble(s_count, m_count),
            span_ms: span.as_secs_f64() * 1e3,
            busy_ms: done.iter().map(|o| o.busy.as_secs_f64() * 1e3).collect(),
            peak_stash_bytes: done.iter().map(|o| o.peak_stash_bytes).collect(),
            peak_stashed: done.iter().map(|o| o.peak_stashed).collect(),
        };
        Ok((outputs, stats))
    }
}

/// A micro-batch's values passed between stages.
type Message = (usize, Values);

/// What every stage thread reads.
struct Shared<'a> {
    micro: &'a [Values],
    graph_inputs: &'a HashSet<String>,
    results: &'a HashSet<String>,
    start: Instant,
}

/// A stage's channels to its neighbours.
struct Links {
    from_prev: Option<mpsc::Receiver<Message>>,
    to_next: Option<mpsc::Sender<Message>>,
    from_next: Option<mpsc::Receiver<Message>>,
    to_prev: Option<mpsc::Sender<Message>>,
}

/// Why a stage stopped.
enum Failure {
    /// Its own error.
    Own(TrainError),
    /// A neighbour closed its channel (it failed; its error is reported).
    Peer,
}

/// What a stage did in a step.
struct StageOutcome {
    results: Vec<(usize, Values)>,
    busy: Duration,
    first_start: Option<Duration>,
    last_end: Option<Duration>,
    peak_stash_bytes: u64,
    peak_stashed: usize,
}

/// Bytes a host tensor holds.
fn tensor_bytes(t: &Tensor) -> u64 {
    let bytes = match &t.data {
        TensorData::F32(v) => v.len() * 4,
        TensorData::I32(v) => v.len() * 4,
        TensorData::Bool(v) => v.len(),
    };
    bytes as u64
}

/// Receives micro-batch `m`'s message, which must be the next one.
fn receive(rx: Option<&mpsc::Receiver<Message>>, m: usize) -> Result<Values, Failure> {
    let Some(rx) = rx else {
        return Ok(Values::new());
    };
    match rx.recv() {
        Ok((got, values)) if got == m => Ok(values),
        Ok((got, _)) => Err(Failure::Own(TrainError::Run(RunError::Internal(format!(
            "pipeline stage expected micro-batch {m}, got {got}"
        ))))),
        Err(_) => Err(Failure::Peer),
    }
}

/// Runs one stage's tasks.
fn run_stage(
    s: usize,
    stage: &mut Stage,
    tasks: &[TrainTask],
    links: Links,
    shared: &Shared<'_>,
) -> Result<StageOutcome, Failure> {
    let mut out = StageOutcome {
        results: Vec::new(),
        busy: Duration::ZERO,
        first_start: None,
        last_end: None,
        peak_stash_bytes: 0,
        peak_stashed: 0,
    };
    let mut stash: HashMap<usize, Values> = HashMap::new();
    let mut stash_bytes = 0u64;
    let own = |e: RunError| Failure::Own(TrainError::Run(e));
    for &task in tasks {
        let (m, backward) = match task {
            TrainTask::Forward(m) => (m, false),
            TrainTask::Backward(m) => (m, true),
        };
        let batch = shared
            .micro
            .get(m)
            .ok_or_else(|| own(RunError::Internal(format!("no micro-batch {m}"))))?;
        let received = if backward {
            receive(links.from_next.as_ref(), m)?
        } else {
            receive(links.from_prev.as_ref(), m)?
        };
        let begun = shared.start.elapsed();
        let piece = if backward {
            stage.backward.as_mut()
        } else {
            stage.forward.as_mut()
        };
        let mut available = received;
        if let Some(piece) = piece {
            let stashed = stash.get(&m);
            let mut inputs = Values::new();
            for (name, key) in &piece.inputs {
                let value = if shared.graph_inputs.contains(key) {
                    batch.get(key)
                } else {
                    available
                        .get(key)
                        .or_else(|| stashed.and_then(|v| v.get(key)))
                };
                let value = value.ok_or_else(|| {
                    own(RunError::Internal(format!(
                        "pipeline stage {s} lacks '{key}' for micro-batch {m}"
                    )))
                })?;
                inputs.insert(name.clone(), value.clone());
            }
            let trace = TraceContext {
                device: s,
                stage: s,
                ..TraceContext::new("train", 0)
            };
            let mut events = Vec::new();
            piece
                .exe
                .submit(m, crate::exec::input::owned(inputs), &trace, &mut events)
                .map_err(own)?;
            let (_, outputs) =
                pollster::block_on(piece.exe.complete(&trace, &mut events)).map_err(own)?;
            available.extend(outputs);
        }
        let ended = shared.start.elapsed();
        out.busy += ended.saturating_sub(begun);
        out.first_start = Some(out.first_start.map_or(begun, |f| f.min(begun)));
        out.last_end = Some(ended);
        let results: Values = available
            .iter()
            .filter(|(k, _)| shared.results.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !results.is_empty() {
            out.results.push((m, results));
        }
        if backward {
            if let Some(freed) = stash.remove(&m) {
                stash_bytes -= freed.values().map(tensor_bytes).sum::<u64>();
            }
            if let Some(tx) = &links.to_prev {
                available.retain(|k, _| stage.send_backward.contains(k));
                tx.send((m, available)).map_err(|_| Failure::Peer)?;
            }
        } else {
            let kept: Values = available
                .iter()
                .chain(batch)
                .filter(|(k, _)| stage.stash.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            stash_bytes += kept.values().map(tensor_bytes).sum::<u64>();
            stash.insert(m, kept);
            out.peak_stash_bytes = out.peak_stash_bytes.max(stash_bytes);
            out.peak_stashed = out.peak_stashed.max(stash.len());
            if let Some(tx) = &links.to_next {
                available.retain(|k, _| stage.send_forward.contains(k));
                tx.send((m, available)).map_err(|_| Failure::Peer)?;
            }
        }
    }
    Ok(out)
}
