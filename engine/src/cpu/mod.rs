//! The CPU reference: one plain implementation per operator family, mirroring `ops/`.
//! Written for clarity, not speed. It is the oracle the GPU kernels are tested against
//! ([`run`] interprets a bound graph directly) and, behind the execution seam
//! ([`CpuDevice`]), the device where no adapter exists (`--device cpu`).

mod conv;
mod device;
mod elementwise;
mod matmul;
mod movement;
mod norm;
mod reduce;

use crate::error::RunError;
use crate::graph::{Graph, NodeKind};
use crate::ops::Op;
use crate::shape;
use crate::tensor::Tensor;
use crate::weights::Weights;
use std::collections::HashMap;

#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
pub use device::session;
pub use device::{CpuDevice, CpuExecutable};

/// Applies one operator to host tensors; `out_shapes` are the inferred output shapes.
pub fn eval(
    op: &Op,
    inputs: &[&Tensor],
    params: &[&Tensor],
    out_shapes: &[Vec<usize>],
) -> Result<Vec<Tensor>, String> {
    match op {
        Op::MatMul(o) => matmul::eval(o, inputs, params, out_shapes),
        Op::Elementwise(o) => Ok(vec![elementwise::eval(o, inputs, &out_shapes[0])]),
        Op::Reduce(o) => reduce::eval(o, inputs[0]).map(|t| vec![t]),
        Op::Norm(o) => norm::eval(o, inputs[0], params).map(|t| vec![t]),
        Op::Movement(o) => movement::eval(o, inputs, out_shapes),
        Op::Conv(o) => conv::eval(o, inputs[0], params, &out_shapes[0]).map(|t| vec![t]),
        Op::Constant(c) => Ok(vec![c.value.clone()]),
    }
}

/// Runs a bound graph (all shapes concrete) on the CPU. Returns the outputs in order.
pub fn run(
    graph: &Graph,
    weights: &Weights,
    inputs: &HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>, RunError> {
    crate::exec::dataset::check_inputs(graph, inputs)?;
    let mut values: HashMap<(petgraph::stable_graph::NodeIndex, usize), Tensor> = HashMap::new();
    for (name, ix) in &graph.inputs {
        if let Some(t) = inputs.get(name) {
            values.insert((*ix, 0), t.clone());
        }
    }
    for &ix in &graph.order {
        let node = &graph.dag[ix];
        let NodeKind::Op(op) = &node.kind else {
            continue;
        };
        let args: Vec<&Tensor> = graph
            .node_inputs(ix)
            .into_iter()
            .map(|k| {
                values.get(&k).ok_or_else(|| {
                    RunError::Internal(format!("value for node '{}' missing", node.id))
                })
            })
            .collect::<Result<_, _>>()?;
        let params: Vec<&Tensor> = node
            .params
            .iter()
            .map(|p| {
                let key = format!("{}.{}", node.id, p.name);
                weights.get(&key).ok_or(RunError::MissingWeight(key))
            })
            .collect::<Result<_, _>>()?;
        let out_shapes: Vec<Vec<usize>> = node
            .outputs
            .iter()
            .map(|t| shape::concrete(&t.shape).ok_or_else(|| RunError::Unbound(node.id.clone())))
            .collect::<Result<_, _>>()?;
        let outs = eval(op, &args, &params, &out_shapes).map_err(|e| RunError::Op {
            node: node.id.clone(),
            message: e,
        })?;
        for (k, t) in outs.into_iter().enumerate() {
            values.insert((ix, k), t);
        }
    }
    graph
        .outputs
        .iter()
        .map(|o| {
            values
                .get(&(o.node, o.port))
                .cloned()
                .map(|t| (o.name.clone(), t))
                .ok_or_else(|| RunError::Internal(format!("output '{}' was not computed", o.name)))
        })
        .collect()
}

/// The float elements of a tensor (the validator guarantees f32 where operators need it).
pub(crate) fn floats(t: &Tensor) -> Result<&[f32], String> {
    t.as_f32()
        .ok_or_else(|| format!("expected an f32 tensor, got {}", t.dtype()))
}

/// Row-major multi-index of a linear index.
pub(crate) fn unravel(mut i: usize, dims: &[usize], out: &mut [usize]) {
    for d in (0..dims.len()).rev() {
        out[d] = i % dims[d].max(1);
        i /= dims[d].max(1);
    }
}
