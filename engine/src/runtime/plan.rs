//! Planning: turns a bound graph into plain data — fused units lowered to kernels, every
//! tensor's storage and buffer (shared by liveness, see [`super::memory`]), every pass with
//! its bindings and predicted cost, in execution order. Plans are serialisable so they can
//! be printed, cached and sent to a worker.

use super::fusion::{self, scalar_constant, Unit};
use super::memory;
use super::RunError;
use crate::dtype::DType;
use crate::graph::{Graph, NodeKind};
use crate::ops::elementwise::elementwise_kernel;
use crate::ops::kernel::{f32_literal, Concrete};
use crate::ops::{Cost, Epilogue, Kernel, LowerCtx, Lowering, Op, Slot, Storage};
use crate::shape;
use crate::tensor::Tensor;
use petgraph::stable_graph::NodeIndex;
use serde::Serialize;
use std::collections::HashMap;

/// How to plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    /// Fuse elementwise chains and matmul/conv epilogues.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HalfStorage {
    /// WGSL `f16` arrays (`enable f16;`), where the adapter has `shader-f16`.
    Native,
    /// Pairs packed in `u32` with `pack2x16float` / `unpack2x16float`: every adapter.
    Packed,
}

/// What a planned tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueKind {
    /// A graph input, uploaded per run.
    Input,
    /// A weight, uploaded once.
    Param,
    /// A constant, uploaded once.
    Constant,
    /// Produced by a pass.
    Intermediate,
}

/// One tensor of the plan.
#[derive(Debug, Clone, Serialize)]
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
    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.layout.bytes(self.shape.iter().product::<usize>())
    }
}

/// One compute pass.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// The node whose output it produces (the last of a fused group).
    pub node: String,
    /// Every node computed by the pass (more than one when fused).
    pub nodes: Vec<String>,
    /// Operator name, or `fused` for a fused group.
    pub op: String,
    /// The kernel.
    pub kernel: Kernel,
    /// Value bound at binding i+1 of the kernel.
    pub bindings: Vec<usize>,
    /// Predicted cost (of the whole unit, on its first pass).
    pub cost: Cost,
}

/// An index tensor to range-check on the host before upload (gather indices).
#[derive(Debug, Clone, Serialize)]
pub struct IndexCheck {
    /// The graph input holding indices.
    pub input: String,
    /// The gather node.
    pub node: String,
    /// Length of the indexed axis.
    pub axis_len: usize,
}

/// Planned and naive memory.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct MemorySummary {
    /// Bytes of all buffers after sharing (what is allocated).
    pub planned_bytes: u64,
    /// Bytes with one buffer per tensor (views excluded).
    pub naive_bytes: u64,
    /// Bytes of weights and constants.
    pub weight_bytes: u64,
}

/// A complete plan for one bound graph (or one pipeline stage).
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Every tensor.
    pub values: Vec<PlannedValue>,
    /// Size in bytes of each buffer.
    pub buffers: Vec<u64>,
    /// Passes in execution order.
    pub steps: Vec<Step>,
    /// Graph inputs: (name, value).
    pub inputs: Vec<(String, usize)>,
    /// Graph outputs: (name, value).
    pub outputs: Vec<(String, usize)>,
    /// Weights: (key, value).
    pub params: Vec<(String, usize)>,
    /// Constants: (value, tensor).
    #[serde(skip)]
    pub constants: Vec<(usize, Tensor)>,
    /// Host-side range checks of index inputs.
    pub index_checks: Vec<IndexCheck>,
    /// Memory figures.
    pub memory: MemorySummary,
    /// Whether fusion was on.
    pub fused: bool,
    /// Precision.
    pub precision: Precision,
    /// 16-bit float storage, when the precision uses it.
    pub half: Option<HalfStorage>,
}

/// The inputs of an elementwise step, kept to regenerate it in place.
struct ElementwiseStep {
    step: usize,
    out_storage: Storage,
    label: String,
    stmts: String,
    expr: String,
    inputs: Vec<Concrete>,
    out: Vec<usize>,
}

struct Builder<'g> {
    graph: &'g Graph,
    options: PlanOptions,
    plan: Plan,
    value_of: HashMap<(NodeIndex, usize), usize>,
    root_input: HashMap<usize, String>,
    elementwise_steps: Vec<ElementwiseStep>,
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

impl<'g> Builder<'g> {
    fn add_value(
        &mut self,
        name: String,
        c: &Concrete,
        kind: ValueKind,
        storage_of: Option<usize>,
    ) -> usize {
        let storage = match storage_of {
            Some(v) => self.plan.values[v].storage,
            None => self
                .plan
                .values
                .iter()
                .map(|v| v.storage + 1)
                .max()
                .unwrap_or(0),
        };
        self.plan.values.push(PlannedValue {
            name,
            shape: c.shape.clone(),
            dtype: c.dtype,
            layout: c.storage,
            kind,
            storage,
            buffer: 0,
        });
        self.plan.values.len() - 1
    }

    fn concrete(&self, v: usize) -> Concrete {
        Concrete {
            shape: self.plan.values[v].shape.clone(),
            dtype: self.plan.values[v].dtype,
            storage: self.plan.values[v].layout,
        }
    }

    fn source(&self, ix: NodeIndex, k: (NodeIndex, usize)) -> Result<usize, RunError> {
        self.value_of.get(&k).copied().ok_or_else(|| {
            RunError::Internal(format!("input of '{}' unplanned", self.graph.dag[ix].id))
        })
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
            .map(|p| (format!("{}.{}", node.id, p.name), p.shape.clone()))
            .collect();
        specs
            .into_iter()
            .map(|(key, shape)| {
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

    #[allow(clippy::too_many_arguments)]
    fn push_kernels(
        &mut self,
        root: NodeIndex,
        nodes: Vec<String>,
        op: String,
        kernels: Vec<Kernel>,
        sources: &[usize],
        outs: &[usize],
        params: &[usize],
        scratch: &[usize],
        cost: Cost,
    ) -> Result<(), RunError> {
        for (i, kernel) in kernels.into_iter().enumerate() {
            let bindings = kernel
                .slots
                .iter()
                .map(|s| match *s {
                    Slot::Input(k) => sources.get(k).copied(),
                    Slot::Output(k) => outs.get(k).copied(),
                    Slot::Param(k) => params.get(k).copied(),
                    Slot::Scratch(k) => scratch.get(k).copied(),
                })
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| {
                    RunError::Internal(format!("kernel '{}' binds a missing slot", kernel.label))
                })?;
            self.plan.steps.push(Step {
                node: self.graph.dag[root].id.clone(),
                nodes: nodes.clone(),
                op: op.clone(),
                kernel,
                bindings,
                cost: if i == 0 { cost } else { Cost::default() },
            });
        }
        Ok(())
    }

    /// Lowers an operator with the plan's precision, naming the node in errors.
    fn lower(
        &self,
        op: &Op,
        node: &str,
        inputs: &[Concrete],
        outputs: &[Concrete],
        params: &[usize],
        epilogue: &Epilogue,
    ) -> Result<Lowering, RunError> {
        let param_types: Vec<Concrete> = params.iter().map(|&v| self.concrete(v)).collect();
        let ctx = LowerCtx {
            inputs,
            outputs,
            params: &param_types,
            epilogue,
            f16_compute: self.options.precision == Precision::F16,
        };
        op.lower(&ctx).map_err(|message| RunError::Op {
            node: node.to_string(),
            message,
        })
    }

    fn op_cost(&self, ix: NodeIndex) -> Result<Cost, RunError> {
        let op = op_of(self.graph, ix)?;
        let ins: Vec<Vec<usize>> = self
            .graph
            .input_types(ix)
            .iter()
            .map(|t| shape::concrete(&t.shape).unwrap_or_default())
            .collect();
        let outs: Vec<Vec<usize>> = concrete_outputs(self.graph, ix, &self.options)?
            .into_iter()
            .map(|c| c.shape)
            .collect();
        Ok(op.cost(&ins, &outs))
    }

    fn single(&mut self, ix: NodeIndex) -> Result<(), RunError> {
        let graph = self.graph;
        let node = &graph.dag[ix];
        let op = op_of(graph, ix)?;
        let outputs = concrete_outputs(graph, ix, &self.options)?;
        let sources: Vec<usize> = graph
            .node_inputs(ix)
            .into_iter()
            .map(|k| self.source(ix, k))
            .collect::<Result<_, _>>()?;
        let in_types: Vec<Concrete> = sources.iter().map(|&v| self.concrete(v)).collect();
        let params = self.params(ix);
        let lowering = self.lower(
            op,
            &node.id,
            &in_types,
            &outputs,
            &params,
            &Epilogue::identity(),
        )?;
        let outs: Vec<usize> = match &lowering {
            Lowering::Alias => vec![self.add_value(
                self.name_of(ix, 0),
                &outputs[0],
                ValueKind::Intermediate,
                Some(sources[0]),
            )],
            Lowering::Constant => {
                let Op::Constant(c) = op else {
                    return Err(RunError::Internal(
                        "constant lowering of a non-constant".into(),
                    ));
                };
                let v = self.add_value(self.name_of(ix, 0), &outputs[0], ValueKind::Constant, None);
                self.plan.constants.push((v, c.value.clone()));
                vec![v]
            }
            Lowering::Kernels(_) | Lowering::KernelsWithScratch(..) => (0..outputs.len())
                .map(|k| {
                    self.add_value(
                        self.name_of(ix, k),
                        &outputs[k],
                        ValueKind::Intermediate,
                        None,
                    )
                })
                .collect(),
        };
        if let Lowering::Alias = lowering {
            if let Some(root) = self.root_input.get(&sources[0]).cloned() {
                self.root_input.insert(outs[0], root);
            }
        }
        for (k, &v) in outs.iter().enumerate() {
            self.value_of.insert((ix, k), v);
        }
        if let Op::Movement(crate::ops::movement::MovementOp::Gather { axis }) = op {
            if let Some(input) = self.root_input.get(&sources[1]).cloned() {
                let a = shape::axis(*axis, in_types[0].shape.len()).map_err(|m| RunError::Op {
                    node: node.id.clone(),
                    message: m,
                })?;
                self.plan.index_checks.push(IndexCheck {
                    input,
                    node: node.id.clone(),
                    axis_len: in_types[0].shape[a],
                });
            }
        }
        let (kernels, scratch_sizes) = match lowering {
            Lowering::Kernels(k) => (k, Vec::new()),
            Lowering::KernelsWithScratch(k, s) => (k, s),
            _ => (Vec::new(), Vec::new()),
        };
        if !kernels.is_empty() {
            let scratch: Vec<usize> = scratch_sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| {
                    let c = Concrete {
                        shape: vec![n],
                        dtype: DType::F32,
                        storage: Storage::F32,
                    };
                    self.add_value(
                        format!("{}#scratch{k}", node.id),
                        &c,
                        ValueKind::Intermediate,
                        None,
                    )
                })
                .collect();
            if let Op::Elementwise(e) = op {
                let args: Vec<String> = (0..in_types.len()).map(|i| format!("x{i}")).collect();
                self.elementwise_steps.push(ElementwiseStep {
                    step: self.plan.steps.len(),
                    out_storage: outputs[0].storage,
                    label: e.name().to_string(),
                    stmts: String::new(),
                    expr: e.wgsl(&args),
                    inputs: in_types.clone(),
                    out: outputs[0].shape.clone(),
                });
            }
            let cost = self.op_cost(ix)?;
            self.push_kernels(
                ix,
                vec![node.id.clone()],
                op.name().to_string(),
                kernels,
                &sources,
                &outs,
                &params,
                &scratch,
                cost,
            )?;
        }
        Ok(())
    }

    /// The expression of member `n` of a fused unit, with operands resolved to internal
    /// temporaries, inlined scalar constants or external inputs (added to `externals`).
    fn operand(
        &mut self,
        ix: NodeIndex,
        src: (NodeIndex, usize),
        internal: &HashMap<NodeIndex, String>,
        externals: &mut Vec<usize>,
        external_name: &dyn Fn(usize) -> String,
    ) -> Result<String, RunError> {
        if let Some(t) = internal.get(&src.0) {
            return Ok(t.clone());
        }
        if let Some(c) = scalar_constant(self.graph, src.0) {
            return Ok(f32_literal(c));
        }
        let v = self.source(ix, src)?;
        let k = match externals.iter().position(|&e| e == v) {
            Some(k) => k,
            None => {
                externals.push(v);
                externals.len() - 1
            }
        };
        Ok(external_name(k))
    }

    fn fused_elementwise(&mut self, nodes: &[NodeIndex]) -> Result<(), RunError> {
        let graph = self.graph;
        let root = *nodes
            .last()
            .ok_or_else(|| RunError::Internal("empty group".into()))?;
        let mut internal: HashMap<NodeIndex, String> = HashMap::new();
        let mut externals: Vec<usize> = Vec::new();
        let mut stmts = String::new();
        let mut cost = Cost::default();
        for (j, &n) in nodes.iter().enumerate() {
            let Op::Elementwise(e) = op_of(graph, n)? else {
                return Err(RunError::Internal(
                    "non-elementwise node in an elementwise group".into(),
                ));
            };
            let mut args = Vec::new();
            for src in graph.node_inputs(n) {
                args.push(self.operand(n, src, &internal, &mut externals, &|k| format!("x{k}"))?);
            }
            stmts.push_str(&format!("    let t{j} = {};\n", e.wgsl(&args)));
            internal.insert(n, format!("t{j}"));
            cost.flops += self.op_cost(n)?.flops;
        }
        let out = concrete_outputs(graph, root, &self.options)?;
        let in_types: Vec<Concrete> = externals.iter().map(|&v| self.concrete(v)).collect();
        cost.bytes_read = in_types.iter().map(|c| (c.numel() * 4) as u64).sum();
        cost.bytes_written = (out[0].numel() * 4) as u64;
        let names: Vec<String> = nodes.iter().map(|&n| graph.dag[n].id.clone()).collect();
        let label = format!("fused {}", names.join("+"));
        let expr = format!("t{}", nodes.len() - 1);
        let kernel = elementwise_kernel(
            &label,
            &stmts,
            &expr,
            &in_types,
            &out[0].shape,
            out[0].storage,
            None,
        )
        .map_err(|message| RunError::Op {
            node: graph.dag[root].id.clone(),
            message,
        })?;
        let v = self.add_value(
            self.name_of(root, 0),
            &out[0],
            ValueKind::Intermediate,
            None,
        );
        self.value_of.insert((root, 0), v);
        self.elementwise_steps.push(ElementwiseStep {
            step: self.plan.steps.len(),
            out_storage: out[0].storage,
            label: label.clone(),
            stmts,
            expr,
            inputs: in_types,
            out: out[0].shape.clone(),
        });
        self.push_kernels(
            root,
            names,
            "fused".into(),
            vec![kernel],
            &externals,
            &[v],
            &[],
            &[],
            cost,
        )
    }

    fn epilogue(&mut self, anchor: NodeIndex, chain: &[NodeIndex]) -> Result<(), RunError> {
        let graph = self.graph;
        let op = op_of(graph, anchor)?;
        let root = *chain.last().unwrap_or(&anchor);
        let mut sources: Vec<usize> = graph
            .node_inputs(anchor)
            .into_iter()
            .map(|k| self.source(anchor, k))
            .collect::<Result<_, _>>()?;
        let in_types: Vec<Concrete> = sources.iter().map(|&v| self.concrete(v)).collect();
        let params = self.params(anchor);
        let n_sources = sources.len();
        let mut internal: HashMap<NodeIndex, String> = HashMap::from([(anchor, "x".to_string())]);
        let mut extras: Vec<usize> = Vec::new();
        let mut stmts = String::new();
        let mut cost = self.op_cost(anchor)?;
        for (j, &n) in chain.iter().enumerate() {
            let Op::Elementwise(e) = op_of(graph, n)? else {
                return Err(RunError::Internal(
                    "non-elementwise node in an epilogue".into(),
                ));
            };
            let mut args = Vec::new();
            for src in graph.node_inputs(n) {
                args.push(
                    self.operand(n, src, &internal, &mut extras, &|k| format!("ld_e{k}(col)"))?,
                );
            }
            stmts.push_str(&format!("    let t{j} = {};\n", e.wgsl(&args)));
            internal.insert(n, format!("t{j}"));
            cost.flops += self.op_cost(n)?.flops;
        }
        let epilogue = Epilogue {
            stmts,
            result: if chain.is_empty() {
                "x".into()
            } else {
                format!("t{}", chain.len() - 1)
            },
            extra_slots: (0..extras.len())
                .map(|k| Slot::Input(n_sources + k))
                .collect(),
            extra_storages: extras.iter().map(|&v| self.plan.values[v].layout).collect(),
            fused: chain.iter().map(|&n| graph.dag[n].op_name()).collect(),
        };
        sources.extend(extras);
        let out = concrete_outputs(graph, root, &self.options)?;
        let lowering = self.lower(
            op,
            &graph.dag[anchor].id,
            &in_types,
            &out,
            &params,
            &epilogue,
        )?;
        let Lowering::Kernels(kernels) = lowering else {
            return Err(RunError::Internal(
                "epilogue on an operator without kernels".into(),
            ));
        };
        let v = self.add_value(
            self.name_of(root, 0),
            &out[0],
            ValueKind::Intermediate,
            None,
        );
        self.value_of.insert((root, 0), v);
        let names: Vec<String> = std::iter::once(anchor)
            .chain(chain.iter().copied())
            .map(|n| graph.dag[n].id.clone())
            .collect();
        self.push_kernels(
            root,
            names,
            op.name().to_string(),
            kernels,
            &sources,
            &[v],
            &params,
            &[],
            cost,
        )
    }

    /// Liveness, in-place rewrites and buffer assignment.
    fn assign_memory(&mut self) -> Result<(), RunError> {
        let plan = &mut self.plan;
        let n_storage = plan.values.iter().map(|v| v.storage + 1).max().unwrap_or(0);
        let mut storages: Vec<memory::Storage> = vec![
            memory::Storage {
                size: 0,
                def: None,
                last_use: 0,
                dedicated: false,
            };
            n_storage
        ];
        for v in &plan.values {
            let s = &mut storages[v.storage];
            s.size = s.size.max(v.bytes());
            if v.kind != ValueKind::Intermediate {
                s.dedicated = true;
            }
        }
        for (t, step) in plan.steps.iter().enumerate() {
            for (slot, &v) in step.kernel.slots.iter().zip(&step.bindings) {
                let s = &mut storages[plan.values[v].storage];
                match slot {
                    Slot::Output(_) => {
                        if s.def.is_none() {
                            s.def = Some(t);
                        }
                        s.last_use = s.last_use.max(t);
                    }
                    _ => s.last_use = s.last_use.max(t),
                }
            }
        }
        for (_, v) in &plan.outputs {
            storages[plan.values[*v].storage].last_use = usize::MAX;
        }
        // In place: an elementwise pass may overwrite an input whose storage dies there.
        let mut in_place = Vec::new();
        for e in &self.elementwise_steps {
            let step = &plan.steps[e.step];
            let out_storage = plan.values[step.bindings[0]].storage;
            let inputs: Vec<usize> = step
                .kernel
                .slots
                .iter()
                .zip(&step.bindings)
                .filter(|(s, _)| matches!(s, Slot::Input(_)))
                .map(|(_, &v)| v)
                .collect();
            let candidate = inputs.iter().position(|&v| {
                let val = &plan.values[v];
                let s = &storages[val.storage];
                val.kind == ValueKind::Intermediate
                    && !s.dedicated
                    && val.shape == e.out
                    && val.dtype == DType::F32
                    && s.last_use == e.step
                    && s.def.is_some_and(|d| d < e.step)
                    && s.size == storages[out_storage].size
                    && inputs
                        .iter()
                        .filter(|&&w| plan.values[w].storage == val.storage)
                        .count()
                        == 1
            });
            if let Some(k) = candidate {
                in_place.push((plan.values[inputs[k]].storage, out_storage, e.step, k));
            }
        }
        let pairs: Vec<(usize, usize)> = in_place.iter().map(|&(i, o, _, _)| (i, o)).collect();
        let mp = memory::plan(&storages, &pairs);
        plan.buffers = mp.buffers.clone();
        for v in plan.values.iter_mut() {
            v.buffer = mp.buffer_of[v.storage];
        }
        // Rewrite the steps that really share their input's buffer.
        for &(input_storage, out_storage, step, k) in &in_place {
            if mp.buffer_of[input_storage] != mp.buffer_of[out_storage] {
                continue;
            }
            let e = self
                .elementwise_steps
                .iter()
                .find(|e| e.step == step)
                .ok_or_else(|| RunError::Internal("in-place step lost".into()))?;
            let kernel = elementwise_kernel(
                &e.label,
                &e.stmts,
                &e.expr,
                &e.inputs,
                &e.out,
                e.out_storage,
                Some(k),
            )
            .map_err(RunError::Internal)?;
            let old = &plan.steps[step];
            let bindings: Vec<usize> = kernel
                .slots
                .iter()
                .map(|s| match *s {
                    Slot::Output(_) => old.bindings[0],
                    Slot::Input(i) => {
                        let pos = old
                            .kernel
                            .slots
                            .iter()
                            .position(|x| *x == Slot::Input(i))
                            .unwrap_or(0);
                        old.bindings[pos]
                    }
                    Slot::Param(_) | Slot::Scratch(_) => old.bindings[0],
                })
                .collect();
            plan.steps[step].kernel = kernel;
            plan.steps[step].bindings = bindings;
        }
        // A pass may read one buffer through several bindings, but a buffer it writes must
        // not be bound again (WebGPU forbids aliasing a writable binding).
        for step in &plan.steps {
            let mut written: Vec<usize> = Vec::new();
            let mut read: Vec<usize> = Vec::new();
            for (slot, &v) in step.kernel.slots.iter().zip(&step.bindings) {
                let b = plan.values[v].buffer;
                if matches!(slot, Slot::Output(_)) {
                    written.push(b);
                } else {
                    read.push(b);
                }
            }
            let mut sorted = written.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != written.len() || written.iter().any(|b| read.contains(b)) {
                return Err(RunError::Internal(format!(
                    "pass '{}' binds a buffer it writes twice",
                    step.kernel.label
                )));
            }
        }
        let views_excluded: u64 = {
            let mut per_storage = vec![0u64; n_storage];
            for v in &plan.values {
                per_storage[v.storage] = per_storage[v.storage].max(v.bytes());
            }
            per_storage.iter().sum()
        };
        plan.memory = MemorySummary {
            planned_bytes: mp.planned_bytes,
            naive_bytes: views_excluded,
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
    /// Builds the plan of a bound graph with fusion on.
    pub fn new(graph: &Graph) -> Result<Plan, RunError> {
        Plan::with_options(graph, PlanOptions::default())
    }

    /// Builds the plan of a bound graph.
    pub fn with_options(graph: &Graph, options: PlanOptions) -> Result<Plan, RunError> {
        let mut b = Builder {
            graph,
            options,
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
                fused: options.fuse,
                precision: options.precision,
                half: (options.precision != Precision::F32).then_some(options.half),
            },
            value_of: HashMap::new(),
            root_input: HashMap::new(),
            elementwise_steps: Vec::new(),
        };
        for (name, ix) in &graph.inputs {
            let c = &concrete_outputs(graph, *ix, &b.options)?[0];
            let v = b.add_value(name.clone(), c, ValueKind::Input, None);
            b.plan.inputs.push((name.clone(), v));
            b.root_input.insert(v, name.clone());
            b.value_of.insert((*ix, 0), v);
        }
        for unit in fusion::units(graph, options.fuse) {
            match unit {
                Unit::Single(ix) => b.single(ix)?,
                Unit::Elementwise(nodes) => b.fused_elementwise(&nodes)?,
                Unit::Epilogue { anchor, chain } => b.epilogue(anchor, &chain)?,
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
}
