//! The execution seam: a [`Device`] compiles a plan into an [`Executable`]; an executable
//! runs micro-batches of it, reads values back and reports events. The wgpu backend
//! (native and browser), the CPU reference and a remote worker's stage implement it, and
//! one stage-pipeline driver (`super::driver`) runs them all.

use super::input::Inputs;
use crate::error::RunError;
use crate::graph::Graph;
use crate::limits::BufferLimit;
use crate::plan::cost::Rates;
use crate::plan::{HalfStorage, Plan, Precision};
use crate::telemetry::{Event, EventKind, TimingSource};
use crate::tensor::Tensor;
use crate::weights::Weights;
use futures_util::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Named tensors: a micro-batch's inputs or outputs.
pub type Values = HashMap<String, Tensor>;

/// `Send` where threads exist (native), nothing in browsers (wasm), where GPU objects may
/// not cross threads and every stage runs on the page's one thread.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSend: Send {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + ?Sized> MaybeSend for T {}
/// `Send` where threads exist (native), nothing in browsers (wasm).
#[cfg(target_arch = "wasm32")]
pub trait MaybeSend {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSend for T {}

/// How a stage labels the events of a run.
#[derive(Clone, Copy)]
pub struct TraceContext<'a> {
    /// Run id.
    pub run: &'a str,
    /// [`crate::telemetry::now_ns`] at the start of the run; event times are relative to it.
    pub start_ns: u64,
    /// Device index reported in events.
    pub device: usize,
    /// Pipeline stage reported in events.
    pub stage: usize,
    /// Inputs that come from another stage (their uploads are transfers).
    pub transferred_inputs: &'a [String],
    /// Outputs that only go to another stage (their downloads are transfers).
    pub transferred_outputs: &'a [String],
    /// Called with every event as soon as it is known (the live event stream).
    pub observer: Option<&'a (dyn Fn(&Event) + Sync)>,
    /// Whether the events belong to a warm-up pass ([`Event::warm_up`]).
    pub warm_up: bool,
}

impl<'a> TraceContext<'a> {
    /// A run starting at `start_ns` on device 0, stage 0, with no observer.
    pub fn new(run: &'a str, start_ns: u64) -> TraceContext<'a> {
        TraceContext {
            run,
            start_ns,
            device: 0,
            stage: 0,
            transferred_inputs: &[],
            transferred_outputs: &[],
            observer: None,
            warm_up: false,
        }
    }

    /// An event of micro-batch `m` between two host times ([`crate::telemetry::now_ns`]).
    pub fn event(&self, m: usize, node: String, kind: EventKind, start: u64, end: u64) -> Event {
        Event {
            run: self.run.to_string(),
            device: self.device,
            stage: self.stage,
            micro_batch: m,
            node,
            kind,
            start_ns: start.saturating_sub(self.start_ns),
            end_ns: end.saturating_sub(self.start_ns),
            warm_up: self.warm_up,
        }
    }

    /// Hands an event to the observer (live) and keeps it.
    pub fn record(&self, events: &mut Vec<Event>, e: Event) {
        if let Some(observe) = self.observer {
            observe(&e);
        }
        events.push(e);
    }

    /// Whether an input's upload is a transfer from another stage.
    pub fn input_kind(&self, name: &str) -> EventKind {
        if self.transferred_inputs.iter().any(|n| n == name) {
            EventKind::Transfer
        } else {
            EventKind::Upload
        }
    }

    /// Whether reading `outputs` back is a download (some are final) or a transfer.
    pub fn output_kind<'n>(&self, mut outputs: impl Iterator<Item = &'n str>) -> EventKind {
        if outputs.any(|n| !self.transferred_outputs.iter().any(|t| t == n)) {
            EventKind::Download
        } else {
            EventKind::Transfer
        }
    }
}

/// What compiling a plan on a device cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CompileStats {
    /// Compute pipelines (shader modules) created; reused ones are not counted.
    pub pipelines_created: usize,
    /// Passes the plan lowered to.
    pub passes: usize,
    /// Wall milliseconds compiling took.
    pub millis: f64,
}

/// A plan compiled on a device, ready to run micro-batches.
pub trait Executable: MaybeSend {
    /// The plan it runs.
    fn plan(&self) -> &Plan;

    /// Micro-batches it can hold in flight (its prefetch slots); at least 1.
    fn capacity(&self) -> usize;

    /// Checks micro-batch `m`'s inputs and starts it. Returns as soon as the work is
    /// queued (a GPU), or once it is computed (the CPU). At most [`Self::capacity`]
    /// micro-batches are started and not yet completed. The inputs are handed over, so a
    /// device that computes on the host reads them without a copy, and samples borrowed
    /// from the dataset are copied once, by the device, to where it needs them.
    fn submit(
        &mut self,
        m: usize,
        inputs: Inputs<'_>,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<(), RunError>;

    /// Waits for the oldest started micro-batch and returns its index and outputs.
    fn complete<'a>(
        &'a mut self,
        trace: &'a TraceContext<'a>,
        events: &'a mut Vec<Event>,
    ) -> LocalBoxFuture<'a, Result<(usize, Values), RunError>>;

    /// Keeps `inputs` on the device for the micro-batches started afterwards: those may
    /// leave them out and read the kept values; one that carries such an input replaces
    /// the kept value with its own. Each must be an input of its plan with the plan's
    /// dtype and shape (checked before anything is written).
    fn keep_inputs(&mut self, inputs: &Values) -> Result<(), RunError>;

    /// Replaces the weights it was compiled with (a training step's update): every weight
    /// of its plan must be in `weights`, checked as at compile time; others are ignored.
    /// Micro-batches started afterwards see the new values, ones already started the old.
    fn write_weights(&mut self, weights: &Weights) -> Result<(), RunError>;

    /// Bytes of device memory it holds.
    fn allocated_bytes(&self) -> u64;

    /// Where its compute times come from.
    fn timing(&self) -> TimingSource;

    /// The device it runs on, for people.
    fn device_name(&self) -> String;

    /// What compiling it cost.
    fn compile_stats(&self) -> CompileStats;
}

/// Where plans run: compiles them into executables.
pub trait Device: MaybeSend {
    /// The device, for people (`llvmpipe (Vulkan)`, `cpu (reference)`, `worker w1`).
    fn name(&self) -> String;

    /// Compiles a plan with its weights; `prefetch` micro-batches may be in flight.
    fn compile<'a>(
        &'a self,
        plan: Plan,
        weights: &'a Weights,
        prefetch: usize,
    ) -> LocalBoxFuture<'a, Result<Box<dyn Executable>, RunError>>;

    /// Whether the device stores 16-bit floats natively (WGSL `f16`).
    fn native_f16(&self) -> bool;

    /// The faster 16-bit storage on this device, measured where the device can afford a
    /// probe and the answer matters.
    fn faster_half(&self) -> LocalBoxFuture<'_, Result<HalfStorage, RunError>>;

    /// The device's rates for the partitioner: measured where calibrated, else assumed.
    fn rates(&self) -> Rates;

    /// The largest buffer the device binds (`None`: no bound of its own, as on the CPU),
    /// which a run's weights are checked against before they are made
    /// ([`check_weights_fit`]).
    fn buffer_limit(&self) -> Option<BufferLimit> {
        None
    }
}

/// Checks a run's weights against its devices before any is generated or read: each
/// weight against the largest buffer the devices bind, in the storage `precision` gives
/// weights (32 bits, or 16 under f16 and mixed precision). The CLI, the server and the
/// editor call it between opening the devices and making the weights.
pub fn check_weights_fit(
    graph: &Graph,
    precision: Precision,
    devices: &[Box<dyn Device>],
) -> Result<(), RunError> {
    let element_bytes = match precision {
        Precision::F32 => 4,
        Precision::F16 | Precision::Mixed => 2,
    };
    let limits: Vec<Option<BufferLimit>> = devices.iter().map(|d| d.buffer_limit()).collect();
    crate::limits::check_weights_fit(graph, element_bytes, &limits)
}
