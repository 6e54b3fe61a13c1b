//! The errors of training, shared by the trainer and the pipeline it may run steps on.

use super::optim::OptimError;
use crate::autodiff::AutodiffError;
use crate::error::RunError;
use crate::graph::Problems;

/// Errors of training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The graph cannot be trained as configured (no loss, a loss that is not a scalar,
    /// a coupling that gradient accumulation would change, ...).
    #[error("cannot train: {0}")]
    Setup(String),
    /// Building the joint graph failed.
    #[error(transparent)]
    Autodiff(#[from] AutodiffError),
    /// The evaluation graph (the forward graph without its loss) did not build.
    #[error("the evaluation graph is invalid: {0}")]
    EvalGraph(Problems),
    /// Running on a device failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// A step's loss or gradients are not finite (and no loss scaler skipped the step):
    /// training stops before the step's update, so the weights stay finite.
    #[error("step {step}: {message}; training stopped before its update (lower the learning rate, clip the gradient norm, or check the data)")]
    NonFinite {
        /// The step (counting from 1) whose update was refused.
        step: u64,
        /// What is not finite.
        message: String,
    },
    /// The optimiser refused its settings or the gradients.
    #[error(transparent)]
    Optim(#[from] OptimError),
}
