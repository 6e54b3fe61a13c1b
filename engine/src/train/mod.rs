//! Training: the data a graph is trained on ([`data`]: datasets of named host tensors
//! from `.npy` or CSV bytes, seeded splits and per-epoch shuffled batches; [`csv`]: the
//! CSV reader), and the generated spirals dataset ([`spirals`]).

pub mod csv;
pub mod data;
pub mod spirals;

pub use csv::{CsvError, CsvOptions, LabelColumn};
pub use data::{Batching, DataError, Dataset, Epoch, Feed, FEATURES, LABELS};
pub use spirals::Spirals;
