//! Running graphs: planning ([`plan`]), the wgpu device ([`gpu`]), compiled executables
//! ([`exec`]), datasets and their configuration ([`dataset`]), sessions that run them
//! (native [`session`] with a thread per stage, [`async_session`] on one thread for
//! browsers), plus input checking and seeded random inputs shared with the CPU backend.

pub mod async_session;
pub mod dataset;
pub mod exec;
pub mod fusion;
pub mod gpu;
pub mod memory;
pub mod partition;
#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
pub mod pipeline;
pub mod plan;
mod readback;
pub mod schedule;
#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
pub mod session;
pub mod stages;

use crate::dtype::DType;
use crate::graph::Graph;
use crate::rng::Rng;
use crate::shape;
use crate::tensor::{Tensor, TensorData};
use std::collections::HashMap;

pub use async_session::AsyncSession;
pub use dataset::{RunConfig, RunReport};
pub use exec::GpuExecutable;
pub use gpu::{AdapterSummary, GpuContext};
pub use plan::Plan;

/// Errors from planning or running a graph.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No GPU adapter was found.
    #[error("no GPU adapter found: {0}")]
    NoAdapter(String),
    /// The adapter refused to create a device.
    #[error("could not open the GPU device: {0}")]
    RequestDevice(String),
    /// A graph input is missing or does not match its declaration.
    #[error("input '{name}': {message}")]
    Input {
        /// Input name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A weight is missing.
    #[error("weight '{0}' is missing")]
    MissingWeight(String),
    /// A shape is still symbolic at run time.
    #[error("node '{0}' has symbolic shapes: bind the batch size first")]
    Unbound(String),
    /// A tensor exceeds a device limit.
    #[error("tensor '{value}' needs {bytes} bytes, over the adapter's {what} of {limit} bytes")]
    TooLarge {
        /// The value.
        value: String,
        /// Its size.
        bytes: u64,
        /// The limit.
        limit: u64,
        /// Which limit.
        what: &'static str,
    },
    /// A dispatch exceeds a device limit.
    #[error("node '{node}': {message}")]
    Op {
        /// The node.
        node: String,
        /// What failed.
        message: String,
    },
    /// A shader failed to compile or a pipeline to build.
    #[error("kernel '{label}' failed to build: {message}")]
    Shader {
        /// Kernel label.
        label: String,
        /// The driver's or validator's message.
        message: String,
    },
    /// The run was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// The adapter cannot do what was asked (a missing feature).
    #[error("not supported: {0}")]
    Unsupported(String),
    /// The device failed (out of memory, lost, mapping failed).
    #[error("GPU device error: {0}")]
    Device(String),
    /// A bug: an internal invariant failed.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Checks that `inputs` provides every graph input with its declared dtype and (bound) shape.
pub fn check_inputs(graph: &Graph, inputs: &HashMap<String, Tensor>) -> Result<(), RunError> {
    for name in inputs.keys() {
        if graph.input_type(name).is_none() {
            let known: Vec<&str> = graph.inputs.iter().map(|(n, _)| n.as_str()).collect();
            return Err(RunError::Input {
                name: name.clone(),
                message: format!("the graph has no such input (inputs: {})", known.join(", ")),
            });
        }
    }
    for (name, ix) in &graph.inputs {
        let ty = &graph.dag[*ix].outputs[0];
        let t = inputs.get(name).ok_or_else(|| RunError::Input {
            name: name.clone(),
            message: format!("missing (expected {ty})"),
        })?;
        if t.dtype() != ty.dtype {
            return Err(RunError::Input {
                name: name.clone(),
                message: format!("has dtype {} but the graph declares {ty}", t.dtype()),
            });
        }
        if shape::known(&t.shape) != ty.shape {
            return Err(RunError::Input {
                name: name.clone(),
                message: format!("has shape {:?} but the graph declares {ty}", t.shape),
            });
        }
    }
    Ok(())
}

/// Seeded random inputs for a bound graph: floats uniform in [-1, 1), integers in [0, 4),
/// booleans fair.
pub fn random_inputs(graph: &Graph, seed: u64) -> Result<HashMap<String, Tensor>, RunError> {
    let mut out = HashMap::new();
    for (name, ix) in &graph.inputs {
        let ty = &graph.dag[*ix].outputs[0];
        let dims = shape::concrete(&ty.shape).ok_or_else(|| RunError::Unbound(name.clone()))?;
        let n = shape::numel(&dims);
        let mut rng = Rng::for_name(seed, name);
        let data = match ty.dtype {
            DType::F32 => TensorData::F32((0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()),
            DType::I32 => TensorData::I32((0..n).map(|_| rng.below(4) as i32).collect()),
            DType::Bool => TensorData::Bool((0..n).map(|_| rng.below(2) == 1).collect()),
        };
        out.insert(name.clone(), Tensor { shape: dims, data });
    }
    Ok(out)
}
