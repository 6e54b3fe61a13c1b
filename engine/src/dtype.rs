//! Element types of tensors.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of a tensor. Every dtype is 4 bytes wide on the GPU (`bool` is a `u32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit IEEE float: the type of every activation and weight.
    F32,
    /// 32-bit signed integer: indices (for `gather`).
    I32,
    /// Boolean: conditions (for `where`), stored as `u32` 0/1 on the GPU.
    Bool,
}

impl DType {
    /// All dtypes, in the order the format documents them.
    pub const ALL: [DType; 3] = [DType::F32, DType::I32, DType::Bool];

    /// The name used in graph files.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }

    /// Parses a graph-file dtype name.
    pub fn parse(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element on the device.
    pub fn size_bytes(self) -> usize {
        4
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
