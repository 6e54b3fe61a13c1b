//! Planning: turns a bound graph into plain data — every tensor's buffer, every pass with
//! its kernel and bindings, in topological order. Plans are serialisable so they can be
//! printed, cached and sent to a worker.

use super::RunError;
use crate::dtype::DType;
use crate::graph::{Graph, NodeKind};
use crate::ops::{kernel::Concrete, Cost, Kernel, Lowering, Op, Slot};
use crate::shape;
use crate::tensor::Tensor;
use petgraph::stable_graph::NodeIndex;
use serde::Serialize;
use std::collections::HashMap;

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
    /// What it is.
    pub kind: ValueKind,
    /// Index into [`Plan::buffers`] (views share their source's buffer).
    pub buffer: usize,
}

/// One compute pass.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// The node it computes.
    pub node: String,
    /// Its operator.
    pub op: &'static str,
    /// The kernel.
    pub kernel: Kernel,
    /// Value bound at binding i+1 of the kernel.
    pub bindings: Vec<usize>,
    /// Predicted cost (of the whole operator, on its first pass).
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

/// A complete plan for one bound graph.
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
}

impl Plan {
    /// Builds the plan of a bound graph.
    pub fn new(graph: &Graph) -> Result<Plan, RunError> {
        let mut plan = Plan {
            values: Vec::new(),
            buffers: Vec::new(),
            steps: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            params: Vec::new(),
            constants: Vec::new(),
            index_checks: Vec::new(),
        };
        let mut value_of: HashMap<(NodeIndex, usize), usize> = HashMap::new();
        let mut root_input: HashMap<usize, String> = HashMap::new();
        for &ix in &graph.order {
            let node = &graph.dag[ix];
            let concrete: Vec<Concrete> = node
                .outputs
                .iter()
                .map(|t| {
                    Ok(Concrete {
                        shape: shape::concrete(&t.shape)
                            .ok_or_else(|| RunError::Unbound(node.id.clone()))?,
                        dtype: t.dtype,
                    })
                })
                .collect::<Result<_, RunError>>()?;
            let op = match &node.kind {
                NodeKind::Input => {
                    let v = plan.add_value(node.id.clone(), &concrete[0], ValueKind::Input, None);
                    plan.inputs.push((node.id.clone(), v));
                    root_input.insert(v, node.id.clone());
                    value_of.insert((ix, 0), v);
                    continue;
                }
                NodeKind::Op(op) => op,
            };
            let sources: Vec<usize> = graph
                .node_inputs(ix)
                .iter()
                .map(|k| {
                    value_of.get(k).copied().ok_or_else(|| {
                        RunError::Internal(format!("input of '{}' unplanned", node.id))
                    })
                })
                .collect::<Result<_, _>>()?;
            let in_types: Vec<Concrete> = sources
                .iter()
                .map(|&v| Concrete {
                    shape: plan.values[v].shape.clone(),
                    dtype: plan.values[v].dtype,
                })
                .collect();
            let params: Vec<usize> = node
                .params
                .iter()
                .map(|p| {
                    let key = format!("{}.{}", node.id, p.name);
                    let c = Concrete {
                        shape: p.shape.clone(),
                        dtype: DType::F32,
                    };
                    let v = plan.add_value(key.clone(), &c, ValueKind::Param, None);
                    plan.params.push((key, v));
                    v
                })
                .collect();
            let lowering = op
                .lower(&in_types, &concrete)
                .map_err(|message| RunError::Op {
                    node: node.id.clone(),
                    message,
                })?;
            let name_of = |k: usize| {
                if k == 0 {
                    node.id.clone()
                } else {
                    format!("{}:{k}", node.id)
                }
            };
            let outs: Vec<usize> = match &lowering {
                Lowering::Alias => {
                    let src = sources[0];
                    let buffer = plan.values[src].buffer;
                    let v = plan.add_value(
                        name_of(0),
                        &concrete[0],
                        ValueKind::Intermediate,
                        Some(buffer),
                    );
                    if let Some(root) = root_input.get(&src).cloned() {
                        root_input.insert(v, root);
                    }
                    vec![v]
                }
                Lowering::Constant => {
                    let Op::Constant(c) = op else {
                        return Err(RunError::Internal(
                            "constant lowering of a non-constant".into(),
                        ));
                    };
                    let v = plan.add_value(name_of(0), &concrete[0], ValueKind::Constant, None);
                    plan.constants.push((v, c.value.clone()));
                    vec![v]
                }
                Lowering::Kernels(_) => (0..concrete.len())
                    .map(|k| {
                        plan.add_value(name_of(k), &concrete[k], ValueKind::Intermediate, None)
                    })
                    .collect(),
            };
            for (k, &v) in outs.iter().enumerate() {
                value_of.insert((ix, k), v);
            }
            if let Op::Movement(crate::ops::movement::MovementOp::Gather { axis }) = op {
                if let Some(input) = root_input.get(&sources[1]) {
                    let a =
                        shape::axis(*axis, in_types[0].shape.len()).map_err(|m| RunError::Op {
                            node: node.id.clone(),
                            message: m,
                        })?;
                    plan.index_checks.push(IndexCheck {
                        input: input.clone(),
                        node: node.id.clone(),
                        axis_len: in_types[0].shape[a],
                    });
                }
            }
            if let Lowering::Kernels(kernels) = lowering {
                let in_shapes: Vec<Vec<usize>> = in_types.iter().map(|c| c.shape.clone()).collect();
                let out_shapes: Vec<Vec<usize>> =
                    concrete.iter().map(|c| c.shape.clone()).collect();
                let cost = op.cost(&in_shapes, &out_shapes);
                for (i, kernel) in kernels.into_iter().enumerate() {
                    let bindings = kernel
                        .slots
                        .iter()
                        .map(|s| match *s {
                            Slot::Input(k) => sources.get(k).copied(),
                            Slot::Output(k) => outs.get(k).copied(),
                            Slot::Param(k) => params.get(k).copied(),
                        })
                        .collect::<Option<Vec<usize>>>()
                        .ok_or_else(|| {
                            RunError::Internal(format!(
                                "kernel '{}' binds a missing slot",
                                kernel.label
                            ))
                        })?;
                    plan.steps.push(Step {
                        node: node.id.clone(),
                        op: op.name(),
                        kernel,
                        bindings,
                        cost: if i == 0 { cost } else { Cost::default() },
                    });
                }
            }
        }
        for o in &graph.outputs {
            let v = value_of
                .get(&(o.node, o.port))
                .copied()
                .ok_or_else(|| RunError::Internal(format!("output '{}' unplanned", o.name)))?;
            plan.outputs.push((o.name.clone(), v));
        }
        Ok(plan)
    }

    fn add_value(
        &mut self,
        name: String,
        c: &Concrete,
        kind: ValueKind,
        buffer: Option<usize>,
    ) -> usize {
        let buffer = buffer.unwrap_or_else(|| {
            self.buffers.push((c.numel() * c.dtype.size_bytes()) as u64);
            self.buffers.len() - 1
        });
        self.values.push(PlannedValue {
            name,
            shape: c.shape.clone(),
            dtype: c.dtype,
            kind,
            buffer,
        });
        self.values.len() - 1
    }

    /// Total bytes of all buffers.
    pub fn total_bytes(&self) -> u64 {
        self.buffers.iter().sum()
    }

    /// Total predicted FLOPs of one run.
    pub fn total_flops(&self) -> u64 {
        self.steps.iter().map(|s| s.cost.flops).sum()
    }
}
