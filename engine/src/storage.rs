//! How the elements of a tensor are stored on a device: the one definition every part
//! (plans, tensors, the GPU and CPU backends) uses for element sizes and 16-bit layouts.

use crate::dtype::DType;

/// How the elements of a device buffer are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// 32-bit floats.
    F32,
    /// 16-bit floats as WGSL `f16` (needs `shader-f16`).
    F16,
    /// 16-bit floats packed in pairs into `u32` (`pack2x16float`; works everywhere).
    Packed,
    /// 32-bit integers.
    I32,
    /// Booleans as `u32` 0/1.
    Bool,
}

impl Storage {
    /// The 32-bit storage of a dtype.
    pub fn of(dtype: DType) -> Storage {
        match dtype {
            DType::F32 => Storage::F32,
            DType::I32 => Storage::I32,
            DType::Bool => Storage::Bool,
        }
    }

    /// Whether this is a 16-bit float storage.
    pub fn is_half(self) -> bool {
        matches!(self, Storage::F16 | Storage::Packed)
    }

    /// Bytes one element takes (2 for the 16-bit storages).
    pub fn element_bytes(self) -> u64 {
        if self.is_half() {
            2
        } else {
            4
        }
    }

    /// Bytes for `n` elements, a multiple of 4 (16-bit storages round up to whole words);
    /// saturating at `u64::MAX`, which no device can allocate.
    pub fn bytes(self, n: usize) -> u64 {
        let words = match self {
            Storage::F16 | Storage::Packed => n.div_ceil(2),
            _ => n,
        };
        u64::try_from(words)
            .ok()
            .and_then(|w| w.checked_mul(4))
            .unwrap_or(u64::MAX)
    }
}
