//! The engine's run-time error: everything that can go wrong planning, compiling or
//! running a graph, each naming what and where; and [`LimitError`], a size over one of
//! the configured limits, which graphs, runs and readers all report the same way.

/// A size over one of the configured limits (`crate::limits::Limits`), or too large to
/// be counted at all. It names what is too large, by how much, the limit (its field in
/// `Limits`) and the command-line flag that raises it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{subject} {}, over the limit of {limit} {unit} ({name}; raise it with {flag})", self.amount())]
pub struct LimitError {
    /// What is too large: "input 'x'", "weight 'fc.weight'", "the run's host memory".
    pub subject: String,
    /// What is counted: "elements", "bytes", "nodes", "axes", "characters", ...
    pub unit: &'static str,
    /// The amount asked for; `None` when counting it overflows.
    pub value: Option<u64>,
    /// The limit.
    pub limit: u64,
    /// The limit's field in `Limits` (`max_tensor_elements`).
    pub name: &'static str,
    /// The flag of `sluice` that sets it (`--max-tensor-elements`).
    pub flag: &'static str,
}

impl LimitError {
    fn amount(&self) -> String {
        match self.value {
            Some(v) => format!("needs {v} {}", self.unit),
            None => format!("needs more {} than can be counted", self.unit),
        }
    }
}

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
    /// A run setting is impossible or inconsistent.
    #[error("{setting}: {message}")]
    Config {
        /// The setting (`stages`, `micro-batches`, ...).
        setting: String,
        /// What is wrong.
        message: String,
    },
    /// The configuration would cut the batch where the graph combines samples: every
    /// such run is refused rather than answered differently.
    #[error("node '{node}' couples samples along the batch axis ({reason}), so {refused}")]
    BatchCoupled {
        /// The node that combines samples.
        node: String,
        /// How it combines them.
        reason: String,
        /// What was refused and how to run instead.
        refused: String,
    },
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
    /// A pipeline stage failed (its micro-batch refused or its device failed).
    #[error("stage {stage}: {message}")]
    Stage {
        /// The stage's index.
        stage: usize,
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
    /// A graph, run or tensor over one of the configured limits: refused before anything
    /// was allocated for it.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// A plan from elsewhere (a server, a cache) is inconsistent: refused before a
    /// device sees it.
    #[error("invalid plan: {0}")]
    Plan(String),
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
