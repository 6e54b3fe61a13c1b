//! Host tensors: a concrete shape and its elements, as the CPU reference and the runtime's
//! inputs and outputs see them.

use crate::dtype::DType;
use crate::shape::numel;
use crate::storage::Storage;

/// The elements of a tensor, in row-major order.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum TensorData {
    /// Floats.
    F32(Vec<f32>),
    /// 32-bit integers.
    I32(Vec<i32>),
    /// Booleans.
    Bool(Vec<bool>),
}

/// A host tensor.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Tensor {
    /// The concrete shape.
    pub shape: Vec<usize>,
    /// The elements (`numel(shape)` of them).
    pub data: TensorData,
}

/// Checks that a tensor of `shape` holding `len` elements holds exactly its shape's.
fn check_len(shape: &[usize], len: usize) -> Result<(), String> {
    let n = numel(shape)?;
    if n != len {
        return Err(format!(
            "shape {shape:?} needs {n} elements but the tensor holds {len}"
        ));
    }
    Ok(())
}

impl Tensor {
    /// A float tensor; `data.len()` should be `numel(shape)` ([`Tensor::check`] says
    /// whether it is, where tensors come from outside).
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        Tensor {
            shape,
            data: TensorData::F32(data),
        }
    }

    /// A float tensor filled with one value (no elements when the shape's count
    /// overflows, which [`Tensor::check`] refuses).
    pub fn full(shape: Vec<usize>, value: f32) -> Tensor {
        let n = numel(&shape).unwrap_or(0);
        Tensor::f32(shape, vec![value; n])
    }

    /// Checks that the tensor holds exactly the elements its shape says: what every
    /// tensor from outside (an upload, a file, a worker, a server) must pass before it
    /// is indexed.
    pub fn check(&self) -> Result<(), String> {
        check_len(&self.shape, self.len())
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData::F32(_) => DType::F32,
            TensorData::I32(_) => DType::I32,
            TensorData::Bool(_) => DType::Bool,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            TensorData::F32(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::Bool(v) => v.len(),
        }
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The float elements, if this is a float tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Every element as a float (integers and booleans converted).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            TensorData::F32(v) => v.clone(),
            TensorData::I32(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| f32::from(u8::from(x))).collect(),
        }
    }

    /// The device representation: 4 little-endian bytes per element.
    pub fn to_device_bytes(&self) -> Vec<u8> {
        match &self.data {
            TensorData::F32(v) => bytemuck::cast_slice(v).to_vec(),
            TensorData::I32(v) => bytemuck::cast_slice(v).to_vec(),
            TensorData::Bool(v) => v.iter().flat_map(|&b| u32::from(b).to_le_bytes()).collect(),
        }
    }

    /// The bytes of this tensor in a device storage, borrowed where they are the tensor's
    /// own (f32 in f32, i32); f32 values stored as 16-bit floats round to nearest with ties
    /// to even, and beyond the f16 range to ±∞ (as a kernel's 16-bit store, `cast` to f16
    /// and PyTorch's `.half()` do; NaN stays NaN).
    pub fn to_storage_bytes(&self, storage: Storage) -> std::borrow::Cow<'_, [u8]> {
        match (storage, &self.data) {
            (Storage::F16 | Storage::Packed, TensorData::F32(v)) => {
                let mut out: Vec<u8> = v
                    .iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                    .collect();
                out.resize(storage.bytes(v.len()) as usize, 0);
                out.into()
            }
            (_, TensorData::F32(v)) => bytemuck::cast_slice(v).into(),
            (_, TensorData::I32(v)) => bytemuck::cast_slice(v).into(),
            (_, TensorData::Bool(_)) => self.to_device_bytes().into(),
        }
    }

    /// Rebuilds a tensor from the bytes of a device storage (16-bit floats widen to f32).
    pub fn from_storage_bytes(
        shape: Vec<usize>,
        dtype: DType,
        storage: Storage,
        bytes: &[u8],
    ) -> Tensor {
        match storage {
            Storage::F16 | Storage::Packed => {
                let n = numel(&shape).unwrap_or(usize::MAX);
                let data = bytes
                    .chunks_exact(2)
                    .take(n)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect();
                Tensor::f32(shape, data)
            }
            _ => Tensor::from_device_bytes(shape, dtype, bytes),
        }
    }

    /// Number of NaN or infinite elements.
    pub fn non_finite(&self) -> usize {
        self.as_f32()
            .map_or(0, |v| v.iter().filter(|x| !x.is_finite()).count())
    }

    /// Rebuilds a tensor from its device representation.
    pub fn from_device_bytes(shape: Vec<usize>, dtype: DType, bytes: &[u8]) -> Tensor {
        let words = bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
        let data = match dtype {
            DType::F32 => TensorData::F32(words.map(f32::from_le_bytes).collect()),
            DType::I32 => TensorData::I32(words.map(i32::from_le_bytes).collect()),
            DType::Bool => TensorData::Bool(words.map(|w| u32::from_le_bytes(w) != 0).collect()),
        };
        Tensor { shape, data }
    }

    /// A checksum for summaries: the sum of all elements as f64.
    pub fn checksum(&self) -> f64 {
        self.to_f32_vec().iter().map(|&x| f64::from(x)).sum()
    }
}

/// The elements of a [`Tensor64`], in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData64 {
    /// Floats, in f64.
    F64(Vec<f64>),
    /// 32-bit integers.
    I32(Vec<i32>),
    /// Booleans.
    Bool(Vec<bool>),
}

/// A host tensor whose floats are f64: what `cpu::run_f64` evaluates a graph on. Its f64
/// elements stand for an f32 tensor's (the graph's dtype is still `f32`); integers and
/// booleans are as in [`Tensor`].
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor64 {
    /// The concrete shape.
    pub shape: Vec<usize>,
    /// The elements (`numel(shape)` of them).
    pub data: TensorData64,
}

impl Tensor64 {
    /// A float tensor; `data.len()` should be `numel(shape)`.
    pub fn f64(shape: Vec<usize>, data: Vec<f64>) -> Tensor64 {
        Tensor64 {
            shape,
            data: TensorData64::F64(data),
        }
    }

    /// Checks that the tensor holds exactly the elements its shape says (as
    /// [`Tensor::check`]).
    pub fn check(&self) -> Result<(), String> {
        check_len(&self.shape, self.len())
    }

    /// The element type it stands for (f64 floats stand for `f32`).
    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData64::F64(_) => DType::F32,
            TensorData64::I32(_) => DType::I32,
            TensorData64::Bool(_) => DType::Bool,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            TensorData64::F64(v) => v.len(),
            TensorData64::I32(v) => v.len(),
            TensorData64::Bool(v) => v.len(),
        }
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The float elements, if this is a float tensor.
    pub fn as_f64(&self) -> Option<&[f64]> {
        match &self.data {
            TensorData64::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The same tensor with its floats rounded to f32.
    pub fn to_f32(&self) -> Tensor {
        let data = match &self.data {
            TensorData64::F64(v) => TensorData::F32(v.iter().map(|&x| x as f32).collect()),
            TensorData64::I32(v) => TensorData::I32(v.clone()),
            TensorData64::Bool(v) => TensorData::Bool(v.clone()),
        };
        Tensor {
            shape: self.shape.clone(),
            data,
        }
    }
}

impl From<&Tensor> for Tensor64 {
    /// Widens the floats to f64 (exactly).
    fn from(t: &Tensor) -> Tensor64 {
        let data = match &t.data {
            TensorData::F32(v) => TensorData64::F64(v.iter().map(|&x| f64::from(x)).collect()),
            TensorData::I32(v) => TensorData64::I32(v.clone()),
            TensorData::Bool(v) => TensorData64::Bool(v.clone()),
        };
        Tensor64 {
            shape: t.shape.clone(),
            data,
        }
    }
}
