//! The worker protocol, version [`PROTOCOL`]: JSON control messages over a WebSocket, each
//! tensor that follows a message as one binary frame (its raw little-endian elements, in
//! the order the message lists them).
//!
//! A worker opens `WS /api/workers` (with `Authorization: Bearer <token>`), sends `hello`;
//! the server answers `welcome` or `refused`. Then the server sends `load` (a stage's
//! plan, its weights following as binary frames), `compute` (a micro-batch's inputs) and
//! `unload`; the worker answers `loaded`, `result` (outputs and its events) or `error`.

use serde::{Deserialize, Serialize};
use sluice_engine::gpu::AdapterSummary;
use sluice_engine::plan::cost::Rates;
use sluice_engine::telemetry::Event;
use sluice_engine::{DType, Tensor};

/// The protocol version this build speaks.
pub const PROTOCOL: u32 = 2;

/// Describes a tensor sent in the next binary frame.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TensorHeader {
    /// Value name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
}

/// Messages from a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToServer {
    /// First message: who the worker is.
    Hello {
        /// Protocol version.
        protocol: u32,
        /// A display name (host name).
        name: String,
        /// Its adapters.
        adapters: Vec<AdapterSummary>,
        /// The measured rates of the adapter it computes on, for the partitioner.
        rates: Option<Rates>,
    },
    /// A stage is compiled and ready.
    Loaded {
        /// Job id.
        job: String,
    },
    /// A micro-batch's outputs (binary frames follow) and the events of computing it.
    Result {
        /// Job id.
        job: String,
        /// Micro-batch index.
        micro_batch: usize,
        /// The tensors that follow.
        outputs: Vec<TensorHeader>,
        /// Events, times relative to the request's arrival at the worker.
        events: Vec<Event>,
    },
    /// A request failed.
    Error {
        /// Job id, when the failure belongs to one.
        job: Option<String>,
        /// What went wrong.
        error: String,
    },
}

/// Messages to a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToWorker {
    /// The worker is accepted.
    Welcome {
        /// Its id on this server.
        worker: String,
    },
    /// The worker is refused (and the connection closes).
    Refused {
        /// Why.
        error: String,
    },
    /// Compile a stage's plan (its weights follow as binary frames).
    Load {
        /// Job id (`run/stage`).
        job: String,
        /// The stage's plan (`sluice_engine::plan::Plan` as JSON).
        plan: serde_json::Value,
        /// The weights that follow, in order.
        weights: Vec<TensorHeader>,
        /// Stage index (reported in events).
        stage: usize,
    },
    /// Run a micro-batch (binary frames with the inputs follow).
    Compute {
        /// Job id.
        job: String,
        /// Micro-batch index.
        micro_batch: usize,
        /// The tensors that follow.
        inputs: Vec<TensorHeader>,
    },
    /// Forget a stage.
    Unload {
        /// Job id.
        job: String,
    },
}

/// Headers and frames for a list of tensors.
pub fn encode(tensors: &[(String, Tensor)]) -> (Vec<TensorHeader>, Vec<Vec<u8>>) {
    tensors
        .iter()
        .map(|(name, t)| {
            (
                TensorHeader {
                    name: name.clone(),
                    shape: t.shape.clone(),
                    dtype: t.dtype(),
                },
                t.to_device_bytes(),
            )
        })
        .unzip()
}

/// Rebuilds a tensor from its header and frame, checking the frame's length.
pub fn decode(h: &TensorHeader, bytes: &[u8]) -> Result<Tensor, String> {
    let n = h
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("shape overflows")?;
    if n.checked_mul(4) != Some(bytes.len()) {
        return Err(format!(
            "tensor '{}' of shape {:?} needs {} bytes, the frame has {}",
            h.name,
            h.shape,
            n * 4,
            bytes.len()
        ));
    }
    Ok(Tensor::from_device_bytes(h.shape.clone(), h.dtype, bytes))
}
