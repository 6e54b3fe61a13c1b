//! Training: the optimisers and their schedules ([`optim`]), the loop's engine side
//! ([`trainer`]: the joint graph compiled for steps, the forward graph for evaluation,
//! gradient accumulation) checkpoints ([`checkpoint`]) and dynamic loss scaling ([`scaler`]).

pub mod checkpoint;
pub mod optim;
pub mod scaler;
// pub mod trainer;
