//! The CPU reference: one plain implementation per operator family, mirroring `ops/`.
//! Written for clarity, not speed. It is the oracle the GPU kernels are tested against
//! ([`run`] interprets a bound graph directly) and, behind the execution seam
//! ([`CpuDevice`]), the device where no adapter exists (`--device cpu`).
//!
//! [`eval`] checks its operands before a family sees them: every tensor holds the
//! elements its shape says, and the shapes are what inference gives for them (the output
//! shapes, the weights'). So inside the families, sizes and indices derived from the
//! shapes fit the tensors they index.

mod conv;
mod device;
mod elementwise;
mod matmul;
mod movement;
mod norm;
mod reduce;

use crate::error::RunError;
use crate::graph::{Graph, NodeKind};
use crate::ops::{Op, TensorType};
use crate::shape;
use crate::tensor::Tensor;
use crate::weights::Weights;
use std::collections::HashMap;

#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
pub use device::session;
pub use device::{CpuDevice, CpuExecutable};

/// Applies one operator to host tensors; `out_shapes` are the inferred output shapes.
/// The operands must be what inference typed (a checked graph or plan); every tensor is
/// checked to hold its shape's elements, and a wrong number of operands is an error.
pub fn eval(
    op: &Op,
    inputs: &[&Tensor],
    params: &[&Tensor],
    out_shapes: &[Vec<usize>],
) -> Result<Vec<Tensor>, String> {
    check_operands(op, inputs, params, out_shapes)?;
    let x = inputs.first().copied();
    let (first, out) = match (x, out_shapes.first()) {
        (Some(x), Some(out)) => (x, out),
        _ if matches!(op, Op::Constant(_)) => return Ok(vec![op_constant(op)]),
        _ => return Err("an operator needs an input and an output shape".into()),
    };
    match op {
        Op::MatMul(o) => matmul::eval(o, inputs, params, out_shapes),
        Op::Elementwise(o) => Ok(vec![elementwise::eval(o, inputs, out)?]),
        Op::Reduce(o) => reduce::eval(o, first).map(|t| vec![t]),
        Op::Norm(o) => norm::eval(o, first, params).map(|t| vec![t]),
        Op::Movement(o) => movement::eval(o, inputs, out_shapes),
        Op::Conv(o) => conv::eval(o, first, params, out).map(|t| vec![t]),
        Op::Constant(_) => Ok(vec![op_constant(op)]),
    }
}

/// Checks operands against inference: the tensors hold their shapes' elements, the
/// output shapes are the inferred ones (for pointwise operators, ones the inferred shape
/// broadcasts to: fused units evaluate every term at the unit's output shape), and the
/// weights have the declared shapes.
fn check_operands(
    op: &Op,
    inputs: &[&Tensor],
    params: &[&Tensor],
    out_shapes: &[Vec<usize>],
) -> Result<(), String> {
    for t in inputs.iter().chain(params) {
        t.check()?;
    }
    let types: Vec<TensorType> = inputs
        .iter()
        .map(|t| TensorType {
            shape: shape::known(&t.shape),
            dtype: t.dtype(),
        })
        .collect();
    let inferred = op.infer(&types)?;
    let pointwise = op.capabilities().pointwise;
    let fits = inferred.len() == out_shapes.len()
        && inferred.iter().zip(out_shapes).all(|(t, s)| {
            let s = shape::known(s);
            t.shape == s || pointwise && shape::broadcast(&t.shape, &s).is_ok_and(|b| b == s)
        });
    if !fits {
        return Err(format!(
            "'{}' cannot produce {out_shapes:?} from {:?}",
            op.name(),
            types.iter().map(|t| t.to_string()).collect::<Vec<_>>()
        ));
    }
    let specs = op.params(&types)?;
    if specs.len() != params.len() || specs.iter().zip(params).any(|(p, t)| p.shape != t.shape) {
        return Err(format!("'{}' got weights of the wrong shapes", op.name()));
    }
    Ok(())
}

/// A constant operator's value.
fn op_constant(op: &Op) -> Tensor {
    op.constant_value()
        .cloned()
        .unwrap_or_else(|| Tensor::f32(vec![0], Vec::new()))
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

/// Row-major multi-index of a linear index (`out` has one entry per dimension).
pub(crate) fn unravel(mut i: usize, dims: &[usize], out: &mut [usize]) {
    for d in (0..dims.len()).rev() {
        out[d] = i % dims[d].max(1);
        i /= dims[d].max(1);
    }
}
