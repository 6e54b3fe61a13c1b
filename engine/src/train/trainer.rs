//! The training loop's engine side: a graph with a training section compiled twice — the
//! joint forward+backward graph (from [`crate::autodiff`]) for steps, the forward graph
//! without its loss for evaluation — on devices behind the execution seam, the master
//! weights on the host in f32, and an [`Optimizer`] updating them.
//!
//! A step takes one batch of exactly `batch` samples (sample axis 0), runs the joint
//! graph on each of its M micro-batches, averages their gradients (gradient
//! accumulation: exact because the loss is a mean over the batch and nothing else in the
//! graph combines samples — anything else is refused naming the node), updates the
//! weights and hands them to the devices. With S > 1 stages the joint graph is cut into
//! a pipeline on S devices ([`super::pipeline`]) that runs the M micro-batches of a step
//! with 1F1B or GPipe; the gradients are summed the same way. Evaluation runs the forward graph over any
//! number of samples and computes the loss and the metrics on the host from its outputs
//! with the CPU reference of the loss operator, so its answer does not depend on how the
//! samples were batched. A step's batch norms normalise with the batch's statistics and
//! update their running ones afterwards (`train/batch_norm.rs`); evaluation uses the
//! running ones.

use super::batch_norm::{training_batch_norm, BatchStats};
pub use super::error::TrainError;
use super::optim::{Optimizer, StepReport};
use super::scaler::LossScaler;
use crate::autodiff;
use crate::cpu;
use crate::error::RunError;
use crate::exec::dataset::{bind, slice_axis};
use crate::exec::device::{Device, Values};
use crate::exec::schedule::TrainSchedule;
use crate::exec::session::{RunContext, Session};
use crate::exec::RunConfig;
use crate::graph::training::{MetricKind, TrainingDoc};
use crate::graph::{Graph, GraphDoc, NodeKind};
use crate::ops::Op;
use crate::plan::{HalfStorage, Precision};
use crate::tensor::{Tensor, TensorData};
use crate::weights::Weights;

/// How to train, besides the graph's own training section.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSettings {
    /// Samples per step.
    pub batch: usize,
    /// Micro-batches per step (gradients accumulated over them).
    pub microbatches: usize,
    /// Pipeline stages of a step, each on its own device.
    pub stages: usize,
    /// How the stages order the micro-batches' passes (with more than one stage).
    pub schedule: TrainSchedule,
    /// Samples per evaluation pass.
    pub eval_batch: usize,
    /// Numeric precision of the devices' storage (weights stay f32 on the host).
    pub precision: Precision,
    /// 16-bit storage (None: the engine's policy).
    pub half: Option<HalfStorage>,
    /// Fuse pointwise chains and epilogues.
    pub fuse: bool,
    /// Dynamic loss scaling (None: gradients computed from the loss itself). For 16-bit
    /// storage, where small gradients underflow: the backward pass starts from the scale.
    pub loss_scaling: Option<LossScaler>,
    /// Seed of the dropout masks.
    pub seed: u64,
}

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings {
            batch: 32,
            microbatches: 1,
            stages: 1,
            schedule: TrainSchedule::OneFOneB,
            eval_batch: 256,
            precision: Precision::F32,
            half: None,
            fuse: true,
            loss_scaling: None,
            seed: 0,
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOutcome {
    /// The batch's mean loss.
    pub loss: f64,
    /// The optimiser's report (learning rate, gradient norm, clipping); None when the
    /// step was skipped because a scaled gradient overflowed.
    pub update: Option<StepReport>,
}

/// Loss and metrics over a dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// Samples evaluated.
    pub samples: usize,
    /// The loss over all of them.
    pub loss: f64,
    /// (metric name, value) in the training section's order.
    pub metrics: Vec<(String, f64)>,
}

/// Where an operand of the loss comes from in evaluation.
#[derive(Debug, Clone)]
enum Source {
    /// A graph input, taken from the data.
    Input(String),
    /// An output of the evaluation graph.
    Output(String),
}

/// What runs the joint graph.
enum Stepper {
    /// One device.
    Session(Session),
    /// Stages on several devices.
    #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
    Pipeline(super::pipeline::Pipeline),
}

#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
pub use super::pipeline::PipelineStats;

/// A graph being trained.
pub struct Trainer {
    training: TrainingDoc,
    settings: TrainSettings,
    micro: usize,
    /// Whether the joint graph draws dropout masks (it reads [`DROPOUT_STREAM`]).
    dropout: bool,
    stepper: Stepper,
    /// What the last pipelined step measured.
    #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
    last_pipeline: Option<PipelineStats>,
    eval_session: Session,
    /// (weight key, joint-graph output holding its gradient).
    grads: Vec<(String, String)>,
    /// The batch norms normalising with their batch's statistics in steps, whose running
    /// statistics each step updates.
    batch_norms: Vec<BatchStats>,
    /// The loss node's operator and operands, evaluated on the host.
    loss_op: Op,
    loss_sources: Vec<Source>,
    params: Weights,
    optimizer: Optimizer,
}

impl Trainer {
    /// Checks the graph for training, builds the joint graph and the evaluation graph and
    /// compiles them on `step_device` and `eval_device` with `weights` (every weight of
    /// the graph; those the loss depends on are trained, and batch norms' running
    /// statistics are updated from each step's batch).
    pub async fn new(
        graph: &Graph,
        weights: Weights,
        settings: TrainSettings,
        step_device: Box<dyn Device>,
        eval_device: Box<dyn Device>,
        progress: &dyn Fn(&str),
    ) -> Result<Trainer, TrainError> {
        Trainer::on_devices(
            graph,
            weights,
            settings,
            vec![step_device],
            eval_device,
            progress,
        )
        .await
    }

    /// [`Trainer::new`] with the steps on `step_devices`: one per pipeline stage
    /// (`settings.stages` of them).
    pub async fn on_devices(
        graph: &Graph,
        weights: Weights,
        settings: TrainSettings,
        step_devices: Vec<Box<dyn Device>>,
        eval_device: Box<dyn Device>,
        progress: &dyn Fn(&str),
    ) -> Result<Trainer, TrainError> {
        let stages = settings.stages.max(1);
        if step_devices.len() != stages {
            return Err(TrainError::Setup(format!(
                "{stages} pipeline stages need {stages} devices, {} given",
                step_devices.len()
            )));
        }

        let training = graph.doc.training.clone().ok_or_else(|| {
            TrainError::Setup(
                "the graph has no training section naming its loss (see docs/graph-format.md)"
                    .into(),
            )
        })?;
        let micro = RunConfig {
            batch: settings.batch,
            microbatches: settings.microbatches,
            ..RunConfig::default()
        }
        .micro_batch_size()?;
        let (loss_op, loss_sources) = loss_node(graph, &training)?;
        check_accumulation(graph, &training, settings.microbatches)?;
        progress("building the backward graph");
        let (scaled, differentiated) = match settings.loss_scaling {
            Some(_) => (scaled_loss(graph, &training.loss)?, SCALED_LOSS),
            None => (graph.clone(), training.loss.as_str()),
        };
        let (scaled, dropout) = training_dropout(&scaled, settings.seed)?;
        let bound = bind(&scaled, micro)?;
        let (bound, batch_norms) = training_batch_norm(&bound).map_err(TrainError::Setup)?;
        let joint = autodiff::backward(&bound, differentiated)?;
        let eval_graph =
            Graph::build_with(eval_doc(graph, &training, &loss_sources), &graph.limits)
                .map_err(TrainError::EvalGraph)?;
        let config = |batch: usize| RunConfig {
            batch,
            microbatches: 1,
            stages: 1,
            prefetch: 1,
            fuse: settings.fuse,
            profile: false,
            precision: settings.precision,
            half: settings.half,
        };
        progress("compiling the training step");
        let stepper = match stages {
            1 => Stepper::Session(
                Session::compile(
                    &joint.graph,
                    &weights,
                    &config(micro),
                    step_devices,
                    progress,
                )
                .await?,
            ),
            #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
            _ => {
                crate::exec::check_run(&joint.graph, &config(micro), None, &graph.limits)?;
                let options =
                    crate::exec::config::plan_options(&config(micro), &step_devices).await?;
                Stepper::Pipeline(
                    super::pipeline::Pipeline::compile(
                        &bound,
                        &joint,
                        &weights,
                        options,
                        &step_devices,
                        settings.schedule,
                        progress,
                    )
                    .await?,
                )
            }
            #[cfg(not(all(feature = "native", not(target_arch = "wasm32"))))]
            _ => {
                return Err(TrainError::Setup(
                    "pipeline-parallel training needs threads (a native build)".into(),
                ))
            }
        };
        progress("compiling the evaluation pass");
        let eval_session = Session::compile(
            &eval_graph,
            &weights,
            &config(settings.eval_batch.max(1)),
            vec![eval_device],
            progress,
        )
        .await?;
        let optimizer = Optimizer::new(training.optimizer)?;
        let mut settings = settings;
        if let Some(scaler) = &mut settings.loss_scaling {
            if settings.precision != Precision::F32 {
                // Values beyond f16's range saturate on upload, the scale included.
                scaler.storage_max = Some(half::f16::MAX.to_f32());
                scaler.max_scale = scaler.max_scale.min(32768.0);
                scaler.scale = scaler.scale.min(scaler.max_scale);
            }
        }
        Ok(Trainer {
            training,
            settings,
            micro,
            dropout,
            stepper,
            #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
            last_pipeline: None,
            eval_session,
            grads: joint.params.into_iter().map(|g| (g.of, g.output)).collect(),
            batch_norms,
            loss_op,
            loss_sources,
            params: weights,
            optimizer,
        })
    }

    /// The current weights (f32 masters).
    pub fn params(&self) -> &Weights {
        &self.params
    }

    /// The loss scaler and its counts, when loss scaling is on.
    pub fn loss_scaler(&self) -> Option<&LossScaler> {
        self.settings.loss_scaling.as_ref()
    }

    /// The optimiser (its configuration and state).
    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    /// Replaces the weights and the optimiser's state (resuming from a checkpoint).
    pub fn restore(
        &mut self,
        params: Weights,
        state: super::optim::OptimizerState,
    ) -> Result<(), TrainError> {
        self.write_step_weights(&params)?;
        self.eval_session.write_weights(&params)?;
        self.optimizer.restore(state, &params)?;
        self.params = params;
        Ok(())
    }

    /// What the last step measured of its pipeline (None with one stage).
    #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
    pub fn pipeline_stats(&self) -> Option<&PipelineStats> {
        self.last_pipeline.as_ref()
    }

    fn write_step_weights(&mut self, weights: &Weights) -> Result<(), RunError> {
        match &mut self.stepper {
            Stepper::Session(s) => s.write_weights(weights),
            #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
            Stepper::Pipeline(p) => p.write_weights(weights),
        }
    }

    /// The joint graph's outputs for each micro-batch of `batch`.
    async fn run_micro_batches(&mut self, batch: &Values) -> Result<Vec<Values>, TrainError> {
        let m = self.settings.microbatches;
        let mut parts = Vec::with_capacity(m);
        for k in 0..m {
            let mut part = if m == 1 {
                batch.clone()
            } else {
                slice_samples(batch, k * self.micro, (k + 1) * self.micro)?
            };
            if let Some(scaler) = &self.settings.loss_scaling {
                part.insert(
                    LOSS_SCALE.to_string(),
                    Tensor::f32(Vec::new(), vec![scaler.scale as f32]),
                );
            }
            if self.dropout {
                // A fresh mask for every micro-batch of every step (wrapping after 2^32).
                let step = self.optimizer.state().step;
                let stream = step.wrapping_mul(m as u64).wrapping_add(k as u64) as u32;
                part.insert(
                    DROPOUT_STREAM.to_string(),
                    Tensor {
                        shape: Vec::new(),
                        data: TensorData::I32(vec![stream as i32]),
                    },
                );
            }
            parts.push(part);
        }
        match &mut self.stepper {
            Stepper::Session(session) => {
                let mut outputs = Vec::with_capacity(m);
                for part in &parts {
                    let report = session.run(part, &RunContext::new("train")).await?;
                    outputs.push(report.outputs.into_iter().collect());
                }
                Ok(outputs)
            }
            #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
            Stepper::Pipeline(pipeline) => {
                let (outputs, stats) = pipeline.step(&parts)?;
                self.last_pipeline = Some(stats);
                Ok(outputs)
            }
        }
    }

    /// One optimiser step on a batch of exactly `batch` samples along axis 0 of every
    /// batched input.
    pub async fn step(&mut self, batch: &Values) -> Result<StepOutcome, TrainError> {
        let m = self.settings.microbatches;
        let mut sum: Option<Weights> = None;
        let mut loss = 0.0f64;
        let mut last = Values::new();
        for mut outputs in self.run_micro_batches(batch).await? {
            loss += scalar(&outputs, &self.training.loss)?;
            let acc = sum.get_or_insert_with(Weights::new);
            for (key, out) in &self.grads {
                let g = outputs.remove(out).ok_or_else(|| {
                    RunError::Internal(format!("the joint graph lost gradient output '{out}'"))
                })?;
                match acc.get_mut(key) {
                    Some(total) => add_into(total, &g)?,
                    None => {
                        acc.insert(key.clone(), g);
                    }
                }
            }
            last = outputs;
        }
        let mut grads = sum.unwrap_or_default();
        if m > 1 {
            for g in grads.values_mut() {
                scale(g, 1.0 / m as f32);
            }
        }
        if let Some(scaler) = &mut self.settings.loss_scaling {
            if !scaler.unscale(&mut grads) {
                return Ok(StepOutcome {
                    loss: loss / m as f64,
                    update: None,
                });
            }
        }
        self.check_finite(loss / m as f64, &grads)?;
        let update = self.optimizer.step(&mut self.params, &grads)?;
        // Batch norms allow one micro-batch (`check_accumulation`): `last` is the batch.
        for bn in &self.batch_norms {
            bn.update(&mut self.params, &last)
                .map_err(|message| RunError::Op {
                    node: bn.node.clone(),
                    message,
                })?;
        }
        let params = std::mem::take(&mut self.params);
        let written = self.write_step_weights(&params);
        self.params = params;
        written?;
        Ok(StepOutcome {
            loss: loss / m as f64,
            update: Some(update),
        })
    }

    /// Refuses a step whose loss or (unscaled) gradients hold a NaN or an infinity,
    /// naming the step and the first such value: an update would spread it to the weights.
    fn check_finite(&self, loss: f64, grads: &Weights) -> Result<(), TrainError> {
        let step = self.optimizer.state().step.saturating_add(1);
        if !loss.is_finite() {
            return Err(TrainError::NonFinite {
                step,
                message: format!("the loss is {loss}"),
            });
        }
        let mut keys: Vec<&String> = grads.keys().collect();
        keys.sort();
        for key in keys {
            if let Some(TensorData::F32(v)) = grads.get(key).map(|g| &g.data) {
                if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                    return Err(TrainError::NonFinite {
                        step,
                        message: format!("element {i} of the gradient of '{key}' is {x}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// The loss and metrics over `data` (any number of samples).
    pub async fn evaluate(&mut self, data: &Values) -> Result<Evaluation, TrainError> {
        self.eval_session.write_weights(&self.params)?;
        let report = self
            .eval_session
            .run(data, &RunContext::new("eval"))
            .await?;
        let outputs: Values = report.outputs.into_iter().collect();
        let operand = |s: &Source| -> Result<&Tensor, TrainError> {
            let (map, name) = match s {
                Source::Input(n) => (data, n),
                Source::Output(n) => (&outputs, n),
            };
            map.get(name)
                .ok_or_else(|| TrainError::Setup(format!("evaluation lacks '{name}'")))
        };
        let operands = self
            .loss_sources
            .iter()
            .map(operand)
            .collect::<Result<Vec<_>, _>>()?;
        let loss = cpu::eval(&self.loss_op, &operands, &[], &[Vec::new()]).map_err(|message| {
            RunError::Op {
                node: self.training.loss.clone(),
                message,
            }
        })?;
        let loss = loss
            .first()
            .and_then(|t| t.as_f32())
            .and_then(|v| v.first())
            .copied()
            .ok_or_else(|| TrainError::Setup("the loss gave no value".into()))?;
        let mut metrics = Vec::new();
        let mut samples = 0;
        for metric in &self.training.metrics {
            match metric.kind {
                MetricKind::Accuracy => {
                    let scores = operand(&Source::Output(metric.output.clone()))?;
                    let labels = operand(&Source::Input(metric.labels.clone()))?;
                    let (hits, n) = accuracy(scores, labels).map_err(TrainError::Setup)?;
                    samples = n;
                    metrics.push(("accuracy".to_string(), hits as f64 / n.max(1) as f64));
                }
            }
        }
        if samples == 0 {
            samples = data
                .values()
                .map(|t| t.shape.first().copied().unwrap_or(1))
                .max()
                .unwrap_or(0);
        }
        Ok(Evaluation {
            samples,
            loss: f64::from(loss),
            metrics,
        })
    }
}

/// The graph input carrying the loss scale, when loss scaling is on.
const LOSS_SCALE: &str = "sluice_loss_scale";
/// The node multiplying the loss by it: what the backward pass differentiates.
const SCALED_LOSS: &str = "sluice_scaled_loss";

/// The graph input carrying the dropout masks' stream, when the graph has dropout.
const DROPOUT_STREAM: &str = "sluice_dropout_stream";

/// The graph with every `dropout` of a positive ratio made `dropout_train` (masks drawn
/// from `seed`, the node's position and the [`DROPOUT_STREAM`] input), and whether there
/// was one. Evaluation keeps the graph's `dropout`, the identity.
fn training_dropout(graph: &Graph, seed: u64) -> Result<(Graph, bool), TrainError> {
    use crate::ops::convert::pcg_hash;
    use crate::ops::movement::MovementOp;
    let ratios: std::collections::HashMap<&str, f32> = graph
        .op_nodes()
        .filter_map(|(_, node, op)| match op {
            Op::Movement(MovementOp::Identity { dropout: Some(r) }) if *r > 0.0 => {
                Some((node.id.as_str(), *r))
            }
            _ => None,
        })
        .collect();
    let mut doc = graph.doc.clone();
    let mut any = false;
    for (position, node) in doc.nodes.iter_mut().enumerate() {
        let Some(&ratio) = ratios.get(node.id.as_str()) else {
            continue;
        };
        let node_seed =
            pcg_hash((seed as u32) ^ pcg_hash((seed >> 32) as u32 ^ pcg_hash(position as u32)));
        node.op = "dropout_train".into();
        node.inputs.push(DROPOUT_STREAM.into());
        node.attrs = serde_json::json!({ "ratio": ratio, "seed": node_seed })
            .as_object()
            .cloned()
            .unwrap_or_default();
        any = true;
    }
    if !any {
        return Ok((graph.clone(), false));
    }
    if doc.inputs.contains_key(DROPOUT_STREAM) {
        return Err(TrainError::Setup(format!(
            "the graph already has an input '{DROPOUT_STREAM}', the name dropout adds"
        )));
    }
    doc.inputs.insert(
        DROPOUT_STREAM.into(),
        crate::graph::doc::InputDecl {
            shape: Vec::new(),
            dtype: crate::dtype::DType::I32,
        },
    );
    let g = Graph::build_with(doc, &graph.limits).map_err(TrainError::EvalGraph)?;
    Ok((g, true))
}

/// The graph with its loss multiplied by a scalar input, [`LOSS_SCALE`], as the output
/// [`SCALED_LOSS`]: its gradients are the scale times the loss's.
fn scaled_loss(graph: &Graph, loss: &str) -> Result<Graph, TrainError> {
    let mut doc = graph.doc.clone();
    if doc.inputs.contains_key(LOSS_SCALE) || doc.nodes.iter().any(|n| n.id == SCALED_LOSS) {
        return Err(TrainError::Setup(format!(
            "the graph already has '{LOSS_SCALE}' or '{SCALED_LOSS}', the names loss scaling adds"
        )));
    }
    doc.inputs.insert(
        LOSS_SCALE.into(),
        crate::graph::doc::InputDecl {
            shape: Vec::new(),
            dtype: crate::dtype::DType::F32,
        },
    );
    doc.nodes.push(crate::graph::doc::NodeDoc {
        id: SCALED_LOSS.into(),
        op: "mul".into(),
        inputs: vec![loss.into(), LOSS_SCALE.into()],
        attrs: Default::default(),
    });
    doc.outputs.push(SCALED_LOSS.into());
    Graph::build_with(doc, &graph.limits).map_err(TrainError::EvalGraph)
}

/// The loss node: an operator without weights whose output is an f32 scalar graph output,
/// and where each of its operands comes from.
fn loss_node(graph: &Graph, training: &TrainingDoc) -> Result<(Op, Vec<Source>), TrainError> {
    let out = graph
        .outputs
        .iter()
        .find(|o| o.name == training.loss)
        .ok_or_else(|| {
            TrainError::Setup(format!(
                "the loss '{}' is not a graph output (outputs: {})",
                training.loss,
                graph
                    .outputs
                    .iter()
                    .map(|o| o.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    let node = &graph.dag[out.node];
    let t = &node.outputs[out.port];
    if t.dtype != crate::dtype::DType::F32 || !t.shape.is_empty() {
        return Err(TrainError::Setup(format!(
            "the loss '{}' is {t}; it must be an f32 scalar (a loss operator with reduction \"mean\")",
            training.loss
        )));
    }
    let NodeKind::Op(op) = &node.kind else {
        return Err(TrainError::Setup(format!(
            "the loss '{}' is a graph input, not computed by the graph",
            training.loss
        )));
    };
    if !node.params.is_empty() {
        return Err(TrainError::Setup(format!(
            "the loss node '{}' has weights; a loss must be computed from other values",
            node.id
        )));
    }
    let sources = graph
        .node_inputs(out.node)
        .into_iter()
        .map(|(ix, port)| {
            let n = &graph.dag[ix];
            match n.kind {
                NodeKind::Input => Source::Input(n.id.clone()),
                NodeKind::Op(_) if port == 0 => Source::Output(n.id.clone()),
                NodeKind::Op(_) => Source::Output(format!("{}:{port}", n.id)),
            }
        })
        .collect();
    Ok((op.clone(), sources))
}

/// Gradient accumulation over micro-batches gives the full batch's gradient only when the
/// loss is the one node that combines samples (and averages them).
fn check_accumulation(
    graph: &Graph,
    training: &TrainingDoc,
    microbatches: usize,
) -> Result<(), TrainError> {
    if microbatches <= 1 {
        return Ok(());
    }
    let mean = graph
        .outputs
        .iter()
        .find(|o| o.name == training.loss)
        .is_some_and(|o| {
            matches!(&graph.dag[o.node].kind,
            NodeKind::Op(Op::Loss(l)) if l.reduction == crate::ops::loss::Reduction::Mean)
        });
    if !mean {
        return Err(TrainError::Setup(format!(
            "accumulating gradients over {microbatches} micro-batches averages them, which gives the batch's gradient only for a loss operator with reduction \"mean\"; '{}' is not one (train with --microbatches 1)",
            training.loss
        )));
    }
    if let Some((_, node, _)) = graph
        .op_nodes()
        .find(|(_, _, op)| matches!(op, Op::Norm(crate::ops::norm::NormOp::BatchNorm { .. })))
    {
        return Err(TrainError::Setup(format!(
            "batch norm '{}' normalises with its batch's statistics in training, which combine the samples, so accumulating gradients over {microbatches} micro-batches would change them; train with --microbatches 1",
            node.id
        )));
    }
    let semantics = graph.batch_semantics();
    let loss_node = graph
        .outputs
        .iter()
        .find(|o| o.name == training.loss)
        .map(|o| graph.dag[o.node].id.clone());
    for c in &semantics.couplings {
        if Some(&c.node) != loss_node.as_ref() {
            return Err(TrainError::Setup(format!(
                "node '{}' couples samples ({}), so accumulating gradients over {microbatches} micro-batches would change them; train with --microbatches 1",
                c.node, c.reason
            )));
        }
    }
    Ok(())
}

/// The forward graph without its loss, whose outputs are the loss's operands and the
/// metrics' outputs: it keeps samples independent, so any batching gives one answer.
fn eval_doc(graph: &Graph, training: &TrainingDoc, loss_sources: &[Source]) -> GraphDoc {
    let mut doc = graph.doc.clone();
    doc.training = None;
    let loss_id = graph
        .outputs
        .iter()
        .find(|o| o.name == training.loss)
        .map(|o| graph.dag[o.node].id.clone());
    if let Some(id) = &loss_id {
        doc.nodes.retain(|n| &n.id != id);
        doc.layout.remove(id);
        doc.stages.remove(id);
    }
    let mut outputs: Vec<String> = loss_sources
        .iter()
        .filter_map(|s| match s {
            Source::Output(n) => Some(n.clone()),
            Source::Input(_) => None,
        })
        .collect();
    for m in &training.metrics {
        if !outputs.contains(&m.output) {
            outputs.push(m.output.clone());
        }
    }
    doc.outputs = outputs;
    doc
}

/// Samples `from..to` along axis 0 of every input that has samples.
fn slice_samples(batch: &Values, from: usize, to: usize) -> Result<Values, RunError> {
    batch
        .iter()
        .map(|(name, t)| Ok((name.clone(), slice_axis(t, 0, from, to)?)))
        .collect()
}

/// The single f32 value of output `name`.
fn scalar(outputs: &Values, name: &str) -> Result<f64, RunError> {
    outputs
        .get(name)
        .and_then(|t| t.as_f32())
        .and_then(|v| v.first())
        .map(|&v| f64::from(v))
        .ok_or_else(|| RunError::Internal(format!("the step gave no value for '{name}'")))
}

/// `total += g`, elementwise (same shape).
fn add_into(total: &mut Tensor, g: &Tensor) -> Result<(), RunError> {
    match (&mut total.data, &g.data) {
        (TensorData::F32(a), TensorData::F32(b)) if a.len() == b.len() => {
            a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
            Ok(())
        }
        _ => Err(RunError::Internal(
            "gradients of one weight differ in shape between micro-batches".into(),
        )),
    }
}

fn scale(t: &mut Tensor, k: f32) {
    if let TensorData::F32(v) = &mut t.data {
        v.iter_mut().for_each(|x| *x *= k);
    }
}

/// (correct, samples): scores `[n, C]` (or `[n, ..., C]`) against i32 labels of the
/// scores' shape without the last axis; the first highest score wins ties.
fn accuracy(scores: &Tensor, labels: &Tensor) -> Result<(usize, usize), String> {
    let (Some(s), TensorData::I32(l)) = (scores.as_f32(), &labels.data) else {
        return Err("accuracy needs f32 scores and i32 labels".into());
    };
    let classes = scores.shape.last().copied().unwrap_or(0);
    if classes == 0 || s.len() != l.len().saturating_mul(classes) {
        return Err(format!(
            "accuracy: scores {:?} do not match labels {:?}",
            scores.shape, labels.shape
        ));
    }
    let hits = s
        .chunks_exact(classes)
        .zip(l)
        .filter(|(row, &label)| {
            let best = row
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                );
            usize::try_from(label).is_ok_and(|y| y == best.0)
        })
        .count();
    Ok((hits, l.len()))
}
