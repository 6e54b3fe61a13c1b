//! Training: the data a graph is trained on ([`data`]: datasets of named host tensors
//! from `.npy` or CSV bytes, seeded splits and per-epoch shuffled batches; [`csv`]: the
//! CSV reader; [`spirals`]: the generated spirals dataset), the optimisers ([`optim`]),
//! dynamic loss scaling ([`scaler`]), checkpoints ([`checkpoint`]) and the loop's engine
//! side ([`trainer`]: the joint graph compiled for steps, the forward graph for
//! evaluation, gradient accumulation; `batch_norm`: batch norm with the batch's
//! statistics in steps; [`pipeline`]: steps cut into stages on several
//! devices, 1F1B or GPipe; [`error`]: what they refuse).

mod batch_norm;
pub mod checkpoint;
pub mod csv;
pub mod data;
pub mod error;
pub mod optim;
#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
pub mod pipeline;
pub mod scaler;
pub mod spirals;
pub mod trainer;

pub use csv::{CsvError, CsvOptions, LabelColumn};
pub use data::{Batching, DataError, Dataset, Epoch, Feed, FEATURES, LABELS};
pub use spirals::Spirals;
