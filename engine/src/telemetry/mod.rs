//! Telemetry: the event stream of a run, metrics derived from it with the fixed
//! definitions ([`metrics`]), and export to Chrome Trace Event JSON ([`trace`]).

pub mod metrics;
pub mod trace;

/// Nanoseconds since the first call in this process, on a monotonic clock that also works
/// in browsers (`performance.now()`).
pub fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<web_time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(web_time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

use serde::{Deserialize, Serialize};

/// What a span of time was spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Host → device input copy.
    Upload,
    /// A pass running on the device.
    Compute,
    /// Activations moving between stages.
    Transfer,
    /// Device → host output copy.
    Download,
    /// Nothing to do (reported, not measured).
    Idle,
}

/// Where the times of compute events come from (ordered from the most exact).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimingSource {
    /// GPU timestamp queries around each pass, aligned to the host clock.
    TimestampQueries,
    /// GPU timestamp queries on a sample of micro-batches (the first two, then one in n);
    /// the others report the latest measured pass times at the end of their host
    /// completion.
    SampledTimestampQueries,
    /// Host-side submission and completion times (the adapter has no timestamp queries).
    HostCompletion,
}

/// One span of work: {run, device, stage, micro-batch, node, kind, start, end}. Times are
/// nanoseconds since the start of the run, on the host clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Run id.
    pub run: String,
    /// Device index.
    pub device: usize,
    /// Pipeline stage.
    pub stage: usize,
    /// Micro-batch index (global over the run).
    pub micro_batch: usize,
    /// Node id or fused group label (for uploads/downloads: the tensor).
    pub node: String,
    /// Kind of work.
    pub kind: EventKind,
    /// Start, ns since the run started.
    pub start_ns: u64,
    /// End, ns since the run started.
    pub end_ns: u64,
    /// Part of a warm-up pass (first dispatches of a newly compiled run, its outputs
    /// thrown away): shown apart and left out of every measured figure. Absent on the
    /// wire when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm_up: bool,
}

impl Event {
    /// Duration in nanoseconds.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}
