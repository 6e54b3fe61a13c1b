//! The bounds on documents, graphs, runs and datasets, as data: every limit with its default and
//! the flag that sets it ([`Limits`]), and the check of a tensor type against them. The
//! CLI, the server, workers and the editor all take their limits from here (re-exported
//! by `crate::limits`); `super::check` checks raw documents against them.

use crate::error::LimitError;
use crate::ops::TensorType;
use crate::shape::{Dim, Product};
use serde::{Deserialize, Serialize};

/// Widening to `u64` for the limits' values (sizes and counts).
pub(crate) trait Widen {
    /// The value as a `u64`.
    fn widen(self) -> u64;
}

impl Widen for usize {
    fn widen(self) -> u64 {
        // usize is at most 64 bits wide on every target the engine builds for.
        u64::try_from(self).unwrap_or(u64::MAX)
    }
}

impl Widen for u64 {
    fn widen(self) -> u64 {
        self
    }
}

macro_rules! limits {
    ($( $(#[doc = $doc:literal])* $field:ident: $ty:ty = $default:expr, $variant:ident, $flag:literal; )*) => {
        /// Every bound a document, a graph, a run or a dataset must stay within, each with
        /// its default. Serialised with every field optional (missing fields take their
        /// defaults), so configuration can name only what it changes.
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct Limits {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for Limits {
            fn default() -> Self {
                Limits { $( $field: $default, )* }
            }
        }

        /// One of the limits, naming its field of [`Limits`] and its flag.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Limit {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl Limit {
            /// Every limit, in the order of the fields of [`Limits`].
            pub const ALL: &'static [Limit] = &[$(Limit::$variant),*];

            /// Its field of [`Limits`] (`max_nodes`).
            pub fn name(self) -> &'static str {
                match self { $( Limit::$variant => stringify!($field), )* }
            }

            /// The flag of `sluice` that sets it (`--max-nodes`).
            pub fn flag(self) -> &'static str {
                match self { $( Limit::$variant => $flag, )* }
            }
            /// What it bounds, with its default (the field's documentation).
            pub fn help(self) -> &'static str {
                match self { $( Limit::$variant => concat!($($doc),*), )* }
            }
        }

        impl Limits {
            /// The value of one limit.
            pub fn get(&self, limit: Limit) -> u64 {
                match limit { $( Limit::$variant => self.$field.widen(), )* }
            }
            /// Sets one limit; an error when `value` does not fit its field on this
            /// target.
            pub fn set(&mut self, limit: Limit, value: u64) -> Result<(), String> {
                match limit {
                    $( Limit::$variant => {
                        self.$field = <$ty>::try_from(value).map_err(|_| {
                            format!("{} {value} does not fit this machine's sizes", $flag)
                        })?;
                    } )*
                }
                Ok(())
            }
        }
    };
}

limits! {
    /// Largest graph document, in bytes of JSON text (16 MiB: a 10,000-node graph with
    /// a constant of 2^20 elements fits).
    max_document_bytes: usize = 16 << 20, MaxDocumentBytes, "--max-document-bytes";
    /// Most JSON values (numbers, strings, lists, objects, ...) in one document (2^21).
    max_json_values: usize = 1 << 21, MaxJsonValues, "--max-json-values";
    /// Most nodes in a graph (10,000).
    max_nodes: usize = 10_000, MaxNodes, "--max-nodes";
    /// Most graph inputs (256).
    max_inputs: usize = 256, MaxInputs, "--max-inputs";
    /// Most graph outputs (256).
    max_outputs: usize = 256, MaxOutputs, "--max-outputs";
    /// Most axes of any tensor (8).
    max_rank: usize = 8, MaxRank, "--max-rank";
    /// Longest name, in bytes: node ids, input names, symbols and symbolic dimensions,
    /// operator and attribute names, the graph's name (128).
    max_name_len: usize = 128, MaxNameLen, "--max-name-len";
    /// Longest list: list attributes (except a constant's values) and a node's inputs
    /// (1,024).
    max_list_len: usize = 1024, MaxListLen, "--max-list-len";
    /// Most elements of any one tensor: inputs, weights, constants, every value a node
    /// computes, with the batch bound (2^28, 1 GiB of f32).
    max_tensor_elements: u64 = 1 << 28, MaxTensorElements, "--max-tensor-elements";
    /// Most elements of a constant: one written in a graph file, an ONNX model's
    /// `Constant` node, or any value the ONNX importer computes at import
    /// (`ConstantOfShape`, `Range`, `Concat` and the rest of the folded arithmetic)
    /// (2^27: the largest `ConstantOfShape` weight fill of the `onnx` package's VGG-19 is
    /// 102,760,448 elements).
    max_constant_elements: u64 = 1 << 27, MaxConstantElements, "--max-constant-elements";
    /// Most bytes the ONNX importer makes for a model beyond its initialisers, at their
    /// size in memory (int64 at 8 bytes): the `Constant`s it decodes, every value it
    /// folds, and the weights and constants it writes from them (768 MiB: VGG-19's weight
    /// fills are 548 MiB). The
    /// initialisers, and the weights written from them, count against
    /// `max_host_bytes`.
    max_import_bytes: u64 = 768 << 20, MaxImportBytes, "--max-import-bytes";
    /// Most bytes a run may allocate on one device: its weights, inputs and activations
    /// (2 GiB).
    max_device_bytes: u64 = 2 << 30, MaxDeviceBytes, "--max-device-bytes";
    /// Most bytes a run may allocate on the host: weights, the dataset's inputs and
    /// outputs, and the values of the micro-batches in flight; also what the ONNX
    /// importer holds of a model's initialisers and the weights written from them
    /// (2 GiB).
    max_host_bytes: u64 = 2 << 30, MaxHostBytes, "--max-host-bytes";
    /// Largest batch a run may ask for (65,536).
    max_batch: usize = MAX_BATCH, MaxBatch, "--max-batch";
    /// Most micro-batches per batch (1,024).
    max_microbatches: usize = MAX_MICROBATCHES, MaxMicrobatches, "--max-microbatches";
    /// Most pipeline stages (16).
    max_stages: usize = MAX_STAGES, MaxStages, "--max-stages";
    /// Most prefetch slots (16).
    max_prefetch: usize = MAX_PREFETCH, MaxPrefetch, "--max-prefetch";
    /// Most problems listed for one document; the rest are counted (1,000).
    max_problems: usize = 1000, MaxProblems, "--max-problems";
    /// Largest dataset file (a CSV table or one `.npy` array), in bytes (256 MiB).
    max_dataset_bytes: usize = 256 << 20, MaxDatasetBytes, "--max-dataset-bytes";
    /// Most samples (rows) in a dataset (2^24).
    max_dataset_rows: usize = 1 << 24, MaxDatasetRows, "--max-dataset-rows";
    /// Most columns of a CSV dataset, its label column included (65,536).
    max_dataset_columns: usize = 1 << 16, MaxDatasetColumns, "--max-dataset-columns";
}

/// Default largest batch a run may ask for.
pub const MAX_BATCH: usize = 65_536;
/// Default most micro-batches per batch.
pub const MAX_MICROBATCHES: usize = 1024;
/// Default most pipeline stages.
pub const MAX_STAGES: usize = 16;
/// Default most prefetch slots.
pub const MAX_PREFETCH: usize = 16;

/// At most this many characters of an over-long string are echoed in a problem.
const ECHO: usize = 40;

/// A string for a message, cut to its first [`ECHO`] characters.
pub(crate) fn echo(s: &str) -> String {
    match s.char_indices().nth(ECHO) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

impl Limits {
    /// The error for `value` (`None`: uncountable) of `unit` against one limit.
    pub fn error(
        &self,
        limit: Limit,
        subject: impl Into<String>,
        unit: &'static str,
        value: Option<u64>,
    ) -> LimitError {
        LimitError {
            subject: subject.into(),
            unit,
            value,
            limit: self.get(limit),
            name: limit.name(),
            flag: limit.flag(),
        }
    }

    /// Checks `value` (`None`: counting it overflowed) against one limit.
    pub fn check(
        &self,
        limit: Limit,
        subject: impl Into<String>,
        unit: &'static str,
        value: Option<u64>,
    ) -> Result<(), LimitError> {
        match value {
            Some(v) if v <= self.get(limit) => Ok(()),
            _ => Err(self.error(limit, subject, unit, value)),
        }
    }

    /// Checks a (possibly symbolic) tensor type: its rank, each dimension, the length of
    /// each symbolic dimension's text, and its elements with every symbol counted as 1
    /// (the fixed part; bound graphs are checked with their real sizes).
    pub fn check_type(&self, subject: &str, t: &TensorType) -> Result<(), LimitError> {
        self.check(Limit::MaxRank, subject, "axes", Some(t.shape.len().widen()))?;
        for d in &t.shape {
            match d {
                Dim::Known(n) => self.check(
                    Limit::MaxTensorElements,
                    format!("{subject}'s dimension {n}"),
                    "elements",
                    Some(n.widen()),
                )?,
                Dim::Sym(s) => self.check(
                    Limit::MaxNameLen,
                    format!("{subject}'s symbolic dimension '{}'", echo(s)),
                    "bytes",
                    Some(s.len().widen()),
                )?,
            }
        }
        let elements = Product::of(&t.shape).map(|p| p.coeff.widen());
        self.check(Limit::MaxTensorElements, subject, "elements", elements)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_limit_has_its_own_field_and_flag() {
        let limits = Limits::default();
        let mut flags = std::collections::BTreeSet::new();
        for &l in Limit::ALL {
            assert_eq!(l.flag(), format!("--{}", l.name().replace('_', "-")));
            assert!(flags.insert(l.flag()));
            assert!(limits.get(l) > 0, "{}", l.name());
            assert!(!l.help().trim().is_empty(), "{}", l.name());
            let mut set = Limits::default();
            set.set(l, 7).unwrap();
            assert_eq!(set.get(l), 7, "{}", l.name());
        }
        let partial: Limits = serde_json::from_value(json!({ "max_nodes": 5 })).unwrap();
        assert_eq!(partial.max_nodes, 5);
        assert_eq!(partial.max_rank, Limits::default().max_rank);
        assert!(serde_json::from_value::<Limits>(json!({ "max_nodez": 5 })).is_err());
    }
}
