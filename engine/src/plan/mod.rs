//! Planning: a bound graph becomes plain data any device can execute — every tensor's
//! storage and buffer (shared by liveness, see [`memory`]), and steps in execution order,
//! each one operator, a fused pointwise unit or an anchor with a fused epilogue, written
//! in the [`expr`] form, never in a device's language. Plans round-trip through serde, so
//! they can be printed, cached and sent to a worker; each backend (the wgpu one in
//! `crate::gpu`, the CPU one in `crate::cpu`) compiles them in its own way.
//!
//! The planner asks operators what they can do ([`crate::ops::Capabilities`]: pointwise,
//! epilogue anchor, view, index inputs); it never names them.

pub mod check;
pub mod cost;
pub mod expr;
pub mod fusion;
pub mod memory;
pub mod partition;
pub mod stages;

use crate::dtype::DType;
use crate::error::RunError;
use crate::graph::{Graph, NodeKind};
use crate::ops::{Cost, CostOperand, Op};
use crate::shape;
use crate::storage::Storage;
use crate::tensor::Tensor;
use expr::{Expr, Operand, Term};
use fusion::{scalar_constant, Unit};
use petgraph::stable_graph::NodeIndex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

/// How to plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PlanOptions {
    /// Fuse pointwise chains and epilogues.
    pub fuse: bool,
    /// Numeric precision.
    pub precision: Precision,
    /// How 16-bit floats are stored (precisions `f16` and `mixed`).
    pub half: HalfStorage,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            fuse: true,
            precision: Precision::F32,
            half: HalfStorage::Packed,
        }
    }
}

/// Numeric precision of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// f32 storage and arithmetic.
    F32,
    /// f16 storage; matmul, conv and reductions accumulate in f16 (needs `shader-f16`).
    F16,
    /// f16 storage of weights and activations; f32 accumulation and f32 math (softmax,
    /// norms, exp/log), results stored as f16.
    Mixed,
}

impl Precision {
    /// Parses `f32`, `f16` or `mixed`.
    pub fn parse(s: &str) -> Option<Precision> {
        match s {
            "f32" => Some(Precision::F32),
            "f16" => Some(Precision::F16),
            "mixed" => Some(Precision::Mixed),
            _ => None,
        }
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Mixed => "mixed",
        }
    }
}

/// How 16-bit floats live in device buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HalfStorage {
    /// WGSL `f16` arrays (`enable f16;`), where the adapter has `shader-f16`.
    Native,
    /// Pairs packed in `u32` with `pack2x16float` / `unpack2x16float`: every adapter.
    Packed,
}

/// What a planned tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueKind {
    /// A graph input, uploaded per run.
    Input,
    /// A weight, uploaded once.
    Param,
    /// A constant, uploaded once.
    Constant,
    /// Produced by a step.
    Intermediate,
}

/// One tensor of the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedValue {
    /// `node`, `node:1`, an input name or a weight key.
    pub name: String,
    /// Concrete shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// How its elements are stored on the device.
    pub layout: Storage,
    /// What it is.
    pub kind: ValueKind,
    /// Its storage: views share their source's storage.
    pub storage: usize,
    /// Index into [`Plan::buffers`].
    pub buffer: usize,
}

impl PlannedValue {
    /// Number of elements (`usize::MAX` when the count overflows, which
    /// [`Plan::validate`] refuses).
    pub fn numel(&self) -> usize {
        shape::numel(&self.shape).unwrap_or(usize::MAX)
    }

    /// Size in bytes (saturating, like [`PlannedValue::numel`]).
    pub fn bytes(&self) -> u64 {
        self.layout.bytes(self.numel())
    }
}

/// The work of one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Work {
    /// One operator: reads the step's inputs and params, writes its outputs.
    Op(Op),
    /// Pointwise operators fused into one pass over the single output's elements; the
    /// expression reads the step's inputs broadcast to the output's shape.
    Fused(Expr),
    /// An epilogue anchor (reading the first `anchor_inputs` inputs and the params) whose
    /// result goes through the expression before it is stored; the other inputs are the
    /// expression's extra operands.
    Epilogue {
        /// The anchor operator.
        anchor: Op,
        /// How many of the step's inputs are the anchor's own.
        anchor_inputs: usize,
        /// The fused chain.
        expr: Expr,
    },
    /// A reduction (an operator declaring `prologue`) whose input is never stored: the
    /// expression computes each element from the same element of every step input (all
    /// of one shape) as the reduction reads it.
    Prologue {
        /// The reduction.
        reducer: Op,
        /// The pointwise work computing the reduction's input.
        expr: Expr,
    },
}

/// One unit of work: an operator or a fused group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The node whose output it produces (the last of a fused group).
    pub node: String,
    /// Every node computed by the step (more than one when fused).
    pub nodes: Vec<String>,
    /// What it computes.
    pub work: Work,
    /// Values it reads.
    pub inputs: Vec<usize>,
    /// Weights it reads.
    pub params: Vec<usize>,
    /// Values it writes.
    pub outputs: Vec<usize>,
    /// Input whose buffer output 0 overwrites (pointwise work over a dying input of the
    /// same shape): the step reads it before writing the same element.
    pub in_place: Option<usize>,
    /// Predicted cost.
    pub cost: Cost,
}

impl Step {
    /// The label of the step in traces: the node, or the fused nodes joined.
    pub fn label(&self) -> String {
        if self.nodes.len() > 1 {
            format!("{} (fused)", self.nodes.join("+"))
        } else {
            self.node.clone()
        }
    }

    /// The operator name, or `fused` for a fused group.
    pub fn op_name(&self) -> String {
        match &self.work {
            Work::Op(op) => op.name().to_string(),
            Work::Fused(_) => "fused".into(),
            Work::Epilogue { anchor, .. } => anchor.name().to_string(),
            Work::Prologue { reducer, .. } => reducer.name().to_string(),
        }
    }
}

/// An index tensor to range-check on the host before upload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexCheck {
    /// The graph input holding indices.
    pub input: String,
    /// The node that uses them.
    pub node: String,
    /// Length of the indexed axis.
    pub axis_len: usize,
    /// Indices must be in [0, axis_len) (class labels); otherwise [-axis_len, axis_len).
    #[serde(default)]
    pub non_negative: bool,
}

/// Planned and naive memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySummary {
    /// Bytes of all buffers after sharing (what is allocated).
    pub planned_bytes: u64,
    /// Bytes with one buffer per tensor (views excluded).
    pub naive_bytes: u64,
    /// Bytes of weights and constants.
    pub weight_bytes: u64,
}

impl MemorySummary {
    /// The sum of several plans' figures (the stages of a pipeline).
    pub fn total<'a>(plans: impl IntoIterator<Item = &'a Plan>) -> MemorySummary {
        let mut m = MemorySummary::default();
        for p in plans {
            m.planned_bytes += p.memory.planned_bytes;
            m.naive_bytes += p.memory.naive_bytes;
            m.weight_bytes += p.memory.weight_bytes;
        }
        m
    }
}

/// A complete plan for one bound graph (or one pipeline stage).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Every tensor.
    pub values: Vec<PlannedValue>,
    /// Size in bytes of each buffer.
    pub buffers: Vec<u64>,
    /// Steps in execution order.
    pub steps: Vec<Step>,
    /// Graph inputs: (name, value).
    pub inputs: Vec<(String, usize)>,
    /// Graph outputs: (name, value).
    pub outputs: Vec<(String, usize)>,
    /// Weights: (key, value).
    pub params: Vec<(String, usize)>,
    /// Constants: (value, tensor).
    pub constants: Vec<(usize, Tensor)>,
    /// Host-side range checks of index inputs.
    pub index_checks: Vec<IndexCheck>,
    /// Memory figures.
    pub memory: MemorySummary,
    /// The options it was planned with.
    pub options: PlanOptions,
    /// Float values stored in f32 although the options store floats in 16 bits: the ones
    /// the 16-bit storage policy keeps ([`Plan::with_policy`]) and views of them.
    #[serde(default)]
    pub kept_f32: Vec<String>,
}

/// The device storage of values of a dtype under some options.
pub fn storage_for(dtype: DType, options: &PlanOptions) -> Storage {
    match (dtype, options.precision, options.half) {
        (DType::F32, Precision::F32, _) => Storage::F32,
        (DType::F32, _, HalfStorage::Native) => Storage::F16,
        (DType::F32, _, HalfStorage::Packed) => Storage::Packed,
        (d, _, _) => Storage::of(d),
    }
}

/// A value as the builder creates it: concrete shape, dtype, storage.
struct Concrete {
    shape: Vec<usize>,
    dtype: DType,
    storage: Storage,
}

fn concrete_outputs(
    graph: &Graph,
    ix: NodeIndex,
    options: &PlanOptions,
) -> Result<Vec<Concrete>, RunError> {
    let node = &graph.dag[ix];
    node.outputs
        .iter()
        .map(|t| {
            Ok(Concrete {
                shape: shape::concrete(&t.shape)
                    .ok_or_else(|| RunError::Unbound(node.id.clone()))?,
                dtype: t.dtype,
                storage: storage_for(t.dtype, options),
            })
        })
        .collect()
}

fn op_of(graph: &Graph, ix: NodeIndex) -> Result<&Op, RunError> {
    match &graph.dag[ix].kind {
        NodeKind::Op(op) => Ok(op),
        NodeKind::Input => Err(RunError::Internal(format!(
            "'{}' is not an operator",
            graph.dag[ix].id
        ))),
    }
}

struct Builder<'g> {
    graph: &'g Graph,
    options: PlanOptions,
    /// Value names to store in f32 under 16-bit storage.
    keep_f32: &'g BTreeSet<String>,
    plan: Plan,
    /// The value of each node output.
    value_of: HashMap<(NodeIndex, usize), usize>,
    /// Values that are (views of) a graph input, with that input's name.
    root_input: HashMap<usize, String>,
    next_storage: usize,
}

impl<'g> Builder<'g> {
    fn add_value(
        &mut self,
        name: String,
        c: &Concrete,
        kind: ValueKind,
        view_of: Option<usize>,
    ) -> usize {
        let storage = match view_of {
            Some(v) => self.plan.values[v].storage,
            None => {
                self.next_storage += 1;
                self.next_storage - 1
            }
        };
        // A view is stored as its source is; other values as the policy keeps them.
        let layout = match view_of {
            Some(v) => self.plan.values[v].layout,
            None if c.storage.is_half() && self.keep_f32.contains(&name) => Storage::of(c.dtype),
            None => c.storage,
        };
        if layout != c.storage {
            self.plan.kept_f32.push(name.clone());
        }
        self.plan.values.push(PlannedValue {
            name,
            shape: c.shape.clone(),
            dtype: c.dtype,
            layout,
            kind,
            storage,
            buffer: 0,
        });
        self.plan.values.len() - 1
    }

    fn source(&self, ix: NodeIndex, k: (NodeIndex, usize)) -> Result<usize, RunError> {
        self.value_of.get(&k).copied().ok_or_else(|| {
            RunError::Internal(format!("input of '{}' unplanned", self.graph.dag[ix].id))
        })
    }

    fn sources(&self, ix: NodeIndex) -> Result<Vec<usize>, RunError> {
        self.graph
            .node_inputs(ix)
            .into_iter()
            .map(|k| self.source(ix, k))
            .collect()
    }

    fn name_of(&self, ix: NodeIndex, port: usize) -> String {
        let id = &self.graph.dag[ix].id;
        if port == 0 {
            id.clone()
        } else {
            format!("{id}:{port}")
        }
    }

    fn params(&mut self, ix: NodeIndex) -> Vec<usize> {
        let node = &self.graph.dag[ix];
        let specs: Vec<(String, Vec<usize>)> = node
            .params
            .iter()
            .map(|p| (node.param_key(p), p.shape.clone()))
            .collect();
        specs
            .into_iter()
            .map(|(key, shape)| {
                // One value per key: a `param` node reads the weight another node declares.
                if let Some(&(_, v)) = self.plan.params.iter().find(|(k, _)| *k == key) {
                    return v;
                }
                let c = Concrete {
                    shape,
                    dtype: DType::F32,
                    storage: storage_for(DType::F32, &self.options),
                };
                let v = self.add_value(key.clone(), &c, ValueKind::Param, None);
                self.plan.params.push((key, v));
                v
            })
            .collect()
    }

    fn operand(&self, v: usize) -> CostOperand<'_> {
        let value = &self.plan.values[v];
        CostOperand {
            shape: &value.shape,
            element_bytes: value.layout.element_bytes(),
        }
    }

    /// The cost of one operator reading `inputs` and writing `outputs` (values).
    fn cost(&self, op: &Op, inputs: &[usize], outputs: &[usize]) -> Cost {
        let ins: Vec<CostOperand> = inputs.iter().map(|&v| self.operand(v)).collect();
        let outs: Vec<CostOperand> = outputs.iter().map(|&v| self.operand(v)).collect();
        op.cost(&ins, &outs)
    }

    /// The FLOPs of one node on its concrete shapes.
    fn node_flops(&self, n: NodeIndex) -> Result<u64, RunError> {
        let op = op_of(self.graph, n)?;
        let ins: Vec<Vec<usize>> = self
            .graph
            .input_types(n)
            .iter()
            .map(|t| shape::concrete(&t.shape).unwrap_or_default())
            .collect();
        let outs: Vec<Vec<usize>> = concrete_outputs(self.graph, n, &self.options)?
            .into_iter()
            .map(|c| c.shape)
            .collect();
        let f32_operands = |shapes: &[Vec<usize>]| -> Vec<(Vec<usize>, u64)> {
            shapes.iter().map(|s| (s.clone(), 4)).collect()
        };
        let (ins, outs) = (f32_operands(&ins), f32_operands(&outs));
        Ok(op
            .cost(&stages::cost_operands(&ins), &stages::cost_operands(&outs))
            .flops)
    }

    fn new_outputs(&mut self, ix: NodeIndex, outputs: &[Concrete]) -> Vec<usize> {
        (0..outputs.len())
            .map(|k| {
                let name = self.name_of(ix, k);
                self.add_value(name, &outputs[k], ValueKind::Intermediate, None)
            })
            .collect()
    }

    fn single(&mut self, ix: NodeIndex) -> Result<(), RunError> {
        let graph = self.graph;
        let node = &graph.dag[ix];
        let op = op_of(graph, ix)?;
        let outputs = concrete_outputs(graph, ix, &self.options)?;
        let sources = self.sources(ix)?;
        if let Some(value) = op.constant_value() {
            let name = self.name_of(ix, 0);
            let v = self.add_value(name, &outputs[0], ValueKind::Constant, None);
            self.plan.constants.push((v, value.clone()));
            self.value_of.insert((ix, 0), v);
            return Ok(());
        }
        if op.param_key().is_some() {
            let v = *self.params(ix).first().ok_or_else(|| {
                RunError::Internal(format!("param '{}' declares no weight", node.id))
            })?;
            self.value_of.insert((ix, 0), v);
            return Ok(());
        }
        if op.capabilities().view {
            let source = *sources
                .first()
                .ok_or_else(|| RunError::Internal(format!("view '{}' has no input", node.id)))?;
            let name = self.name_of(ix, 0);
            let v = self.add_value(name, &outputs[0], ValueKind::Intermediate, Some(source));
            if let Some(root) = self.root_input.get(&source).cloned() {
                self.root_input.insert(v, root);
            }
            self.value_of.insert((ix, 0), v);
            return Ok(());
        }
        if let Some(index) = op.index_input() {
            let data = sources.get(index.data).copied();
            let indices = sources.get(index.indices).copied();
            if let (Some(data), Some(indices)) = (data, indices) {
                if let Some(input) = self.root_input.get(&indices).cloned() {
                    let dims = &self.plan.values[data].shape;
                    let a =
                        shape::existing_axis(index.axis, dims.len()).map_err(|m| RunError::Op {
                            node: node.id.clone(),
                            message: m,
                        })?;
                    self.plan.index_checks.push(IndexCheck {
                        input,
                        node: node.id.clone(),
                        axis_len: dims[a],
                        non_negative: index.non_negative,
                    });
                }
            }
        }
        let params = self.params(ix);
        let outs = self.new_outputs(ix, &outputs);
        for (k, &v) in outs.iter().enumerate() {
            self.value_of.insert((ix, k), v);
        }
        let mut read = sources.clone();
        read.extend(&params);
        let cost = self.cost(op, &read, &outs);
        self.plan.steps.push(Step {
            node: node.id.clone(),
            nodes: vec![node.id.clone()],
            work: Work::Op(op.clone()),
            inputs: sources,
            params,
            outputs: outs,
            in_place: None,
            cost,
        });
        Ok(())
    }

    /// The terms of a fused chain: each member's operands resolved to earlier terms,
    /// inlined scalar constants, `internal` values or step inputs (added to `inputs`).
    fn terms(
        &self,
        members: &[NodeIndex],
        mut internal: HashMap<NodeIndex, Operand>,
        inputs: &mut Vec<usize>,
        first_input: usize,
    ) -> Result<(Expr, u64), RunError> {
        let graph = self.graph;
        let mut terms = Vec::new();
        let mut flops = 0;
        for (j, &n) in members.iter().enumerate() {
            let op = op_of(graph, n)?;
            let mut args = Vec::new();
            for src in graph.node_inputs(n) {
                let arg = if let Some(&o) = internal.get(&src.0) {
                    o
                } else if let Some(c) = scalar_constant(graph, src.0) {
                    Operand::Scalar(c)
                } else {
                    let v = self.source(n, src)?;
                    let k = match inputs[first_input..].iter().position(|&e| e == v) {
                        Some(k) => first_input + k,
                        None => {
                            inputs.push(v);
                            inputs.len() - 1
                        }
                    };
                    Operand::Input(k)
                };
                args.push(arg);
            }
            flops += self.node_flops(n)?;
            terms.push(Term {
                node: graph.dag[n].id.clone(),
                op: op.clone(),
                args,
            });
            internal.insert(n, Operand::Term(j));
        }
        Ok((Expr { terms }, flops))
    }

    fn fused(&mut self, nodes: &[NodeIndex]) -> Result<(), RunError> {
        let graph = self.graph;
        let root = *nodes
            .last()
            .ok_or_else(|| RunError::Internal("empty fused group".into()))?;
        let mut inputs = Vec::new();
        let (expr, flops) = self.terms(nodes, HashMap::new(), &mut inputs, 0)?;
        let out = concrete_outputs(graph, root, &self.options)?;
        let name = self.name_of(root, 0);
        let v = self.add_value(name, &out[0], ValueKind::Intermediate, None);
        self.value_of.insert((root, 0), v);
        let bytes = |vs: &[usize]| -> u64 { vs.iter().map(|&v| self.plan.values[v].bytes()).sum() };
        let cost = Cost {
            flops,
            bytes_read: bytes(&inputs),
            bytes_written: bytes(&[v]),
        };
        self.plan.steps.push(Step {
            node: graph.dag[root].id.clone(),
            nodes: nodes.iter().map(|&n| graph.dag[n].id.clone()).collect(),
            work: Work::Fused(expr),
            inputs,
            params: Vec::new(),
            outputs: vec![v],
            in_place: None,
            cost,
        });
        Ok(())
    }

    fn epilogue(&mut self, anchor: NodeIndex, chain: &[NodeIndex]) -> Result<(), RunError> {
        let graph = self.graph;
        let op = op_of(graph, anchor)?;
        let root = *chain.last().unwrap_or(&anchor);
        let mut inputs = self.sources(anchor)?;
        let anchor_inputs = inputs.len();
        let params = self.params(anchor);
        let internal = HashMap::from([(anchor, Operand::Anchor)]);
        let (expr, chain_flops) = self.terms(chain, internal, &mut inputs, anchor_inputs)?;
        let out = concrete_outputs(graph, root, &self.options)?;
        let name = self.name_of(root, 0);
        let v = self.add_value(name, &out[0], ValueKind::Intermediate, None);
        self.value_of.insert((root, 0), v);
        let mut read = inputs[..anchor_inputs].to_vec();
        read.extend(&params);
        let mut cost = self.cost(op, &read, &[v]);
        cost.flops += chain_flops;
        cost.bytes_read += inputs[anchor_inputs..]
            .iter()
            .map(|&e| self.plan.values[e].bytes())
            .sum::<u64>();
        self.plan.steps.push(Step {
            node: graph.dag[root].id.clone(),
            nodes: std::iter::once(anchor)
                .chain(chain.iter().copied())
                .map(|n| graph.dag[n].id.clone())
                .collect(),
            work: Work::Epilogue {
                anchor: op.clone(),
                anchor_inputs,
                expr,
            },
            inputs,
            params,
            outputs: vec![v],
            in_place: None,
            cost,
        });
        Ok(())
    }

    fn prologue(&mut self, chain: &[NodeIndex], reducer: NodeIndex) -> Result<(), RunError> {
        let graph = self.graph;
        let op = op_of(graph, reducer)?;
        let mut inputs = Vec::new();
        let (expr, chain_flops) = self.terms(chain, HashMap::new(), &mut inputs, 0)?;
        let out = concrete_outputs(graph, reducer, &self.options)?;
        let name = self.name_of(reducer, 0);
        let v = self.add_value(name, &out[0], ValueKind::Intermediate, None);
        self.value_of.insert((reducer, 0), v);
        let bytes = |vs: &[usize]| -> u64 { vs.iter().map(|&v| self.plan.values[v].bytes()).sum() };
        let cost = Cost {
            flops: chain_flops + self.node_flops(reducer)?,
            bytes_read: bytes(&inputs),
            bytes_written: bytes(&[v]),
        };
        self.plan.steps.push(Step {
            node: graph.dag[reducer].id.clone(),
            nodes: chain
                .iter()
                .chain(std::iter::once(&reducer))
                .map(|&n| graph.dag[n].id.clone())
                .collect(),
            work: Work::Prologue {
                reducer: op.clone(),
                expr,
            },
            inputs,
            params: Vec::new(),
            outputs: vec![v],
            in_place: None,
            cost,
        });
        Ok(())
    }

    /// Whether a step's work is pointwise (it may overwrite an input it reads).
    fn pointwise(step: &Step) -> bool {
        match &step.work {
            Work::Op(op) => op.capabilities().pointwise,
            Work::Fused(_) => true,
            Work::Epilogue { .. } | Work::Prologue { .. } => false,
        }
    }

    /// Liveness, in-place rewrites and buffer assignment.
    fn assign_memory(&mut self) -> Result<(), RunError> {
        let plan = &mut self.plan;
        let n_storage = self.next_storage;
        let mut lifetimes = vec![
            memory::Lifetime {
                size: 0,
                def: None,
                last_use: 0,
                dedicated: false,
            };
            n_storage
        ];
        for v in &plan.values {
            let s = &mut lifetimes[v.storage];
            s.size = s.size.max(v.bytes());
            if v.kind != ValueKind::Intermediate {
                s.dedicated = true;
            }
        }
        for (t, step) in plan.steps.iter().enumerate() {
            for &v in step.inputs.iter().chain(&step.params) {
                let s = &mut lifetimes[plan.values[v].storage];
                s.last_use = s.last_use.max(t);
            }
            for &v in &step.outputs {
                let s = &mut lifetimes[plan.values[v].storage];
                if s.def.is_none() {
                    s.def = Some(t);
                }
                s.last_use = s.last_use.max(t);
            }
        }
        for (_, v) in &plan.outputs {
            lifetimes[plan.values[*v].storage].last_use = usize::MAX;
        }
        // In place: pointwise work may overwrite an f32 input of its output's shape whose
        // storage dies at that step.
        let mut in_place = Vec::new();
        for (t, step) in plan.steps.iter().enumerate() {
            if !Builder::pointwise(step) || step.outputs.len() != 1 {
                continue;
            }
            let out = &plan.values[step.outputs[0]];
            let out_storage = out.storage;
            let candidate = step.inputs.iter().position(|&v| {
                let val = &plan.values[v];
                let s = &lifetimes[val.storage];
                val.kind == ValueKind::Intermediate
                    && !s.dedicated
                    && val.shape == out.shape
                    && val.dtype == DType::F32
                    && val.layout == out.layout
                    && s.last_use == t
                    && s.def.is_some_and(|d| d < t)
                    && s.size == lifetimes[out_storage].size
                    && step
                        .inputs
                        .iter()
                        .filter(|&&w| plan.values[w].storage == val.storage)
                        .count()
                        == 1
            });
            if let Some(k) = candidate {
                in_place.push((plan.values[step.inputs[k]].storage, out_storage, t, k));
            }
        }
        let pairs: Vec<(usize, usize)> = in_place.iter().map(|&(i, o, _, _)| (i, o)).collect();
        let mp = memory::plan(&lifetimes, &pairs);
        plan.buffers = mp.buffers.clone();
        for v in plan.values.iter_mut() {
            v.buffer = mp.buffer_of[v.storage];
        }
        for &(input_storage, out_storage, t, k) in &in_place {
            if mp.buffer_of[input_storage] == mp.buffer_of[out_storage] {
                plan.steps[t].in_place = Some(k);
            }
        }
        // A step may read one buffer through several inputs, but a buffer it writes must
        // not be read or written again by it, unless it is the in-place input.
        for step in &plan.steps {
            let written: Vec<usize> = step
                .outputs
                .iter()
                .map(|&v| plan.values[v].buffer)
                .collect();
            let mut sorted = written.clone();
            sorted.sort_unstable();
            sorted.dedup();
            let clash = step
                .inputs
                .iter()
                .enumerate()
                .filter(|(k, _)| step.in_place != Some(*k))
                .map(|(_, v)| v)
                .chain(&step.params)
                .any(|&v| written.contains(&plan.values[v].buffer));
            if sorted.len() != written.len() || clash {
                return Err(RunError::Internal(format!(
                    "step '{}' reads or writes a buffer it writes",
                    step.label()
                )));
            }
        }
        let naive: u64 = {
            let mut per_storage = vec![0u64; n_storage];
            for v in &plan.values {
                per_storage[v.storage] = per_storage[v.storage].max(v.bytes());
            }
            per_storage.iter().sum()
        };
        plan.memory = MemorySummary {
            planned_bytes: mp.planned_bytes,
            naive_bytes: naive,
            weight_bytes: plan
                .values
                .iter()
                .filter(|v| matches!(v.kind, ValueKind::Param | ValueKind::Constant))
                .map(|v| v.bytes())
                .sum(),
        };
        Ok(())
    }
}

impl Plan {
    /// Builds the plan of a bound graph with fusion on and f32 precision.
    pub fn new(graph: &Graph) -> Result<Plan, RunError> {
        Plan::with_options(graph, PlanOptions::default())
    }

    /// Builds the plan of a bound graph, every float value stored as `options` say.
    pub fn with_options(graph: &Graph, options: PlanOptions) -> Result<Plan, RunError> {
        Plan::with_policy(graph, options, &BTreeSet::new())
    }

    /// Builds the plan of a bound graph, storing in f32 the float values named in
    /// `keep_f32` (value names: `node`, `node:port`, an input name or a weight key) where
    /// `options` store floats in 16 bits. The 16-bit storage policy that chooses them is
    /// `crate::exec::config::HalfPolicy`.
    pub fn with_policy(
        graph: &Graph,
        options: PlanOptions,
        keep_f32: &BTreeSet<String>,
    ) -> Result<Plan, RunError> {
        let mut b = Builder {
            graph,
            options,
            keep_f32,
            plan: Plan {
                values: Vec::new(),
                buffers: Vec::new(),
                steps: Vec::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                params: Vec::new(),
                constants: Vec::new(),
                index_checks: Vec::new(),
                memory: MemorySummary::default(),
                options,
                kept_f32: Vec::new(),
            },
            value_of: HashMap::new(),
            root_input: HashMap::new(),
            next_storage: 0,
        };
        for (name, ix) in &graph.inputs {
            let outputs = concrete_outputs(graph, *ix, &b.options)?;
            let v = b.add_value(name.clone(), &outputs[0], ValueKind::Input, None);
            b.plan.inputs.push((name.clone(), v));
            b.root_input.insert(v, name.clone());
            b.value_of.insert((*ix, 0), v);
        }
        for unit in fusion::units(graph, options.fuse) {
            match unit {
                Unit::Single(ix) => b.single(ix)?,
                Unit::Pointwise(nodes) => b.fused(&nodes)?,
                Unit::Epilogue { anchor, chain } => b.epilogue(anchor, &chain)?,
                Unit::Prologue { chain, reducer } => b.prologue(&chain, reducer)?,
            }
        }
        for o in &graph.outputs {
            let v = b
                .value_of
                .get(&(o.node, o.port))
                .copied()
                .ok_or_else(|| RunError::Internal(format!("output '{}' unplanned", o.name)))?;
            b.plan.outputs.push((o.name.clone(), v));
        }
        b.assign_memory()?;
        Ok(b.plan)
    }

    /// Total predicted FLOPs of one run.
    pub fn total_flops(&self) -> u64 {
        self.steps.iter().map(|s| s.cost.flops).sum()
    }

    /// The value of a graph output or input by name.
    pub fn value(&self, name: &str) -> Option<&PlannedValue> {
        self.outputs
            .iter()
            .chain(&self.inputs)
            .find(|(n, _)| n == name)
            .map(|(_, v)| &self.values[*v])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(name: &str) -> Graph {
        let text = match name {
            "mlp" => include_str!("../../../assets/graphs/mlp.json"),
            "cnn" => include_str!("../../../assets/graphs/cnn.json"),
            _ => include_str!("../../../assets/graphs/transformer_block.json"),
        };
        let g = crate::load_graph(text).unwrap();
        crate::exec::dataset::bind(&g, 4).unwrap()
    }

    #[test]
    fn plans_round_trip_through_serde() {
        for name in ["mlp", "cnn", "transformer_block"] {
            let g = example(name);
            for options in [
                PlanOptions::default(),
                PlanOptions {
                    fuse: false,
                    ..PlanOptions::default()
                },
                PlanOptions {
                    fuse: true,
                    precision: Precision::Mixed,
                    half: HalfStorage::Packed,
                },
            ] {
                let plan = Plan::with_options(&g, options).unwrap();
                let text = serde_json::to_string(&plan).unwrap();
                let back: Plan = serde_json::from_str(&text).unwrap();
                assert_eq!(back, plan, "{name} {options:?}");
                assert!(!text.contains("@compute"), "{name}: a plan holds no WGSL");
            }
        }
    }

    #[test]
    fn fused_units_are_expressions_over_the_step_inputs() {
        let plan = Plan::new(&example("transformer_block")).unwrap();
        let mut fused = 0;
        for step in &plan.steps {
            let (expr, first) = match &step.work {
                Work::Fused(e) => (e, 0),
                Work::Epilogue {
                    expr,
                    anchor_inputs,
                    ..
                } => (expr, *anchor_inputs),
                Work::Prologue { expr, .. } => (expr, 0),
                Work::Op(_) => continue,
            };
            fused += 1;
            for (j, term) in expr.terms.iter().enumerate() {
                assert!(term.op.capabilities().pointwise, "{}", term.node);
                for arg in &term.args {
                    match *arg {
                        Operand::Input(k) => assert!(k >= first && k < step.inputs.len()),
                        Operand::Term(i) => assert!(i < j),
                        Operand::Scalar(_) => {}
                        Operand::Anchor => assert!(first > 0 || step.params.is_empty()),
                    }
                }
            }
        }
        assert!(fused > 0, "the transformer block fuses something");
    }

    #[test]
    fn costs_count_the_storage_element_size() {
        let g = example("mlp");
        let f32_plan = Plan::new(&g).unwrap();
        let half = Plan::with_options(
            &g,
            PlanOptions {
                fuse: true,
                precision: Precision::Mixed,
                half: HalfStorage::Packed,
            },
        )
        .unwrap();
        let bytes = |p: &Plan| -> u64 {
            p.steps
                .iter()
                .map(|s| s.cost.bytes_read + s.cost.bytes_written)
                .sum()
        };
        assert_eq!(f32_plan.total_flops(), half.total_flops());
        assert_eq!(bytes(&f32_plan), 2 * bytes(&half));
    }
}
