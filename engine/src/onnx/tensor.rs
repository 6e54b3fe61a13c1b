//! ONNX tensors (initialisers, `Constant` values, attribute tensors) decoded into host
//! values: floating types become f32, integer types i64 (narrowed to i32 only where a
//! value reaches the graph, with a range check), bool stays bool. Sizes are checked
//! against the limits before anything is allocated; external data is read through the
//! caller's [`ExternalData`] after its location is checked to stay inside the model's
//! folder.

use super::proto::{data_type, TensorProto};
use super::ImportError;
use crate::limits::Limits;
use crate::tensor::{Tensor, TensorData};

/// Reads the bytes of an external-data file named by a model (a path relative to the
/// model's folder, already checked to stay inside it).
pub trait ExternalData {
    /// `length` bytes (all the rest when `None`) of `location`, from `offset`.
    fn read(&self, location: &str, offset: u64, length: Option<u64>) -> Result<Vec<u8>, String>;
}

/// No external data: a model given as bytes alone (the browser, an HTTP body).
pub struct NoExternalData;

impl ExternalData for NoExternalData {
    fn read(&self, location: &str, _: u64, _: Option<u64>) -> Result<Vec<u8>, String> {
        Err(format!(
            "the model keeps tensor data in an external file '{location}'; give the model as a file next to its data"
        ))
    }
}

/// Bytes of an f32 element in memory.
pub const F32_BYTES: u64 = 4;
/// Bytes of an i64 element in memory (every ONNX integer type is held as i64).
pub const I64_BYTES: u64 = 8;

/// Elements of a decoded tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum Elements {
    /// Every floating type, as f32.
    F32(Vec<f32>),
    /// Every integer type, as i64.
    I64(Vec<i64>),
    /// Booleans.
    Bool(Vec<bool>),
}

/// A decoded ONNX tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Its shape.
    pub dims: Vec<usize>,
    /// Its elements, row-major.
    pub elements: Elements,
}

impl HostTensor {
    /// An i64 tensor.
    pub fn ints(dims: Vec<usize>, values: Vec<i64>) -> HostTensor {
        HostTensor {
            dims,
            elements: Elements::I64(values),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.elements {
            Elements::F32(v) => v.len(),
            Elements::I64(v) => v.len(),
            Elements::Bool(v) => v.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes its elements take in memory.
    pub fn bytes(&self) -> u64 {
        let width = match &self.elements {
            Elements::F32(_) => F32_BYTES,
            Elements::I64(_) => I64_BYTES,
            Elements::Bool(_) => 1,
        };
        (self.len() as u64).saturating_mul(width)
    }

    /// The elements as i64 (floats truncated, bools 0/1).
    pub fn as_i64(&self) -> Vec<i64> {
        match &self.elements {
            Elements::F32(v) => v.iter().map(|&x| x as i64).collect(),
            Elements::I64(v) => v.clone(),
            Elements::Bool(v) => v.iter().map(|&b| i64::from(b)).collect(),
        }
    }

    /// The elements as f32.
    pub fn as_f32(&self) -> Vec<f32> {
        match &self.elements {
            Elements::F32(v) => v.clone(),
            Elements::I64(v) => v.iter().map(|&x| x as f32).collect(),
            Elements::Bool(v) => v.iter().map(|&b| f32::from(u8::from(b))).collect(),
        }
    }

    /// The Sluice dtype name its values take in a graph.
    pub fn sluice_dtype(&self) -> &'static str {
        match self.elements {
            Elements::F32(_) => "f32",
            Elements::I64(_) => "i32",
            Elements::Bool(_) => "bool",
        }
    }

    /// The host tensor Sluice runs with: f32 as is, integers narrowed to i32 (an error
    /// naming the first value outside i32's range), bool as bool.
    pub fn to_tensor(&self) -> Result<Tensor, String> {
        let data = match &self.elements {
            Elements::F32(v) => TensorData::F32(v.clone()),
            Elements::I64(v) => TensorData::I32(narrow(v)?),
            Elements::Bool(v) => TensorData::Bool(v.clone()),
        };
        Ok(Tensor {
            shape: self.dims.clone(),
            data,
        })
    }
}

/// i64 values narrowed to i32, or an error naming the first that does not fit.
pub fn narrow(values: &[i64]) -> Result<Vec<i32>, String> {
    values
        .iter()
        .map(|&x| {
            i32::try_from(x).map_err(|_| {
                format!("the int64 value {x} is outside the 32-bit range Sluice computes in")
            })
        })
        .collect()
}

/// Checks an external-data location: relative, inside the model's folder.
fn check_location(location: &str) -> Result<(), String> {
    let bad = location.is_empty()
        || location.starts_with('/')
        || location.starts_with('\\')
        || location.contains(':')
        || location
            .split(['/', '\\'])
            .any(|part| part == ".." || part.is_empty() && location.contains("//"));
    if bad {
        return Err(format!(
            "external data location '{location}' must be a relative path inside the model's folder"
        ));
    }
    Ok(())
}

/// Elements of a tensor by its dimensions (`None`: a negative dimension, or too many to
/// count), before anything is decoded.
pub fn elements(t: &TensorProto) -> Option<u64> {
    t.dims.iter().try_fold(1u64, |n, &d| {
        u64::try_from(d).ok().and_then(|d| n.checked_mul(d))
    })
}

/// What a tensor's shape and element type say, checked against the limits before
/// anything is decoded.
struct Layout {
    dims: Vec<usize>,
    count: u64,
    /// Bytes of an element as stored in the model.
    width: usize,
    /// Bytes of an element as decoded.
    host_width: u64,
}

/// A tensor's elements and the bytes they take once decoded (int64 at 8 bytes an
/// element), checked against the limits as [`decode`] checks them: what an importer
/// charges before decoding.
pub fn decoded_size(
    t: &TensorProto,
    what: &str,
    limits: &Limits,
) -> Result<(u64, u64), ImportError> {
    let l = layout(t, what, limits)?;
    Ok((l.count, l.count.saturating_mul(l.host_width)))
}

fn layout(t: &TensorProto, what: &str, limits: &Limits) -> Result<Layout, ImportError> {
    let bad = |message: String| ImportError::Tensor {
        tensor: what.to_string(),
        message,
    };
    let mut dims = Vec::with_capacity(t.dims.len().min(limits.max_rank));
    if t.dims.len() > limits.max_rank {
        return Err(bad(format!(
            "rank {} is over the limit of {} axes (--max-rank)",
            t.dims.len(),
            limits.max_rank
        )));
    }
    let mut count: u64 = 1;
    for &d in &t.dims {
        let d = u64::try_from(d).map_err(|_| bad(format!("negative dimension {d}")))?;
        count = count
            .checked_mul(d)
            .filter(|&c| c <= limits.max_tensor_elements)
            .ok_or_else(|| {
                bad(format!(
                    "shape {:?} has more than {} elements (--max-tensor-elements)",
                    t.dims, limits.max_tensor_elements
                ))
            })?;
        dims.push(d as usize);
    }
    let width = match t.data_type {
        data_type::FLOAT | data_type::INT32 | data_type::UINT32 => 4,
        data_type::INT64 | data_type::DOUBLE | data_type::UINT64 => 8,
        data_type::FLOAT16 | data_type::BFLOAT16 | data_type::INT16 | data_type::UINT16 => 2,
        data_type::INT8 | data_type::UINT8 | data_type::BOOL => 1,
        other => {
            return Err(bad(format!(
                "element type {} is not supported (float, double, float16, bfloat16, integers and bool are)",
                data_type::name(other)
            )))
        }
    };
    let host_width = match t.data_type {
        data_type::FLOAT | data_type::DOUBLE | data_type::FLOAT16 | data_type::BFLOAT16 => {
            F32_BYTES
        }
        data_type::BOOL => 1,
        _ => I64_BYTES,
    };
    Ok(Layout {
        dims,
        count,
        width,
        host_width,
    })
}

/// Decodes a tensor, naming it as `what` in errors.
pub fn decode(
    t: &TensorProto,
    what: &str,
    external: &dyn ExternalData,
    limits: &Limits,
) -> Result<HostTensor, ImportError> {
    let bad = |message: String| ImportError::Tensor {
        tensor: what.to_string(),
        message,
    };
    let Layout {
        dims, count, width, ..
    } = layout(t, what, limits)?;
    let n = count as usize;
    let external_bytes;
    let raw: Option<&[u8]> = if t.data_location == 1 {
        external_bytes = read_external(t, n, width, external).map_err(bad)?;
        Some(&external_bytes)
    } else if !t.raw_data.is_empty() || n == 0 {
        Some(&t.raw_data)
    } else {
        None
    };
    let elements = match raw {
        Some(bytes) => {
            if bytes.len() as u64 != count * width as u64 {
                return Err(bad(format!(
                    "holds {} bytes of data, but {n} elements of {} need {}",
                    bytes.len(),
                    data_type::name(t.data_type),
                    count * width as u64
                )));
            }
            from_raw(t.data_type, bytes)
        }
        None => from_fields(t, n).map_err(bad)?,
    };
    Ok(HostTensor { dims, elements })
}

/// Reads a tensor's external data through `external`, its length checked first.
fn read_external(
    t: &TensorProto,
    n: usize,
    width: usize,
    external: &dyn ExternalData,
) -> Result<Vec<u8>, String> {
    let entry = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.as_str())
    };
    let location = entry("location").ok_or("external data without a location")?;
    check_location(location)?;
    let number = |key: &str| -> Result<Option<u64>, String> {
        entry(key)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| format!("external data {key} '{v}' is not a byte count"))
            })
            .transpose()
    };
    let offset = number("offset")?.unwrap_or(0);
    let need = (n as u64)
        .checked_mul(width as u64)
        .ok_or("external data size overflows")?;
    if let Some(length) = number("length")? {
        if length != need {
            return Err(format!(
                "external data length {length} does not match the {need} bytes its shape needs"
            ));
        }
    }
    external.read(location, offset, Some(need))
}

fn from_raw(data_type: i32, bytes: &[u8]) -> Elements {
    fn words<const W: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; W]> + '_ {
        bytes.chunks_exact(W).map(|c| {
            let mut w = [0u8; W];
            w.copy_from_slice(c);
            w
        })
    }
    match data_type {
        data_type::FLOAT => Elements::F32(words::<4>(bytes).map(f32::from_le_bytes).collect()),
        data_type::DOUBLE => Elements::F32(
            words::<8>(bytes)
                .map(|w| f64::from_le_bytes(w) as f32)
                .collect(),
        ),
        data_type::FLOAT16 => Elements::F32(
            words::<2>(bytes)
                .map(|w| half::f16::from_le_bytes(w).to_f32())
                .collect(),
        ),
        data_type::BFLOAT16 => Elements::F32(
            words::<2>(bytes)
                .map(|w| half::bf16::from_le_bytes(w).to_f32())
                .collect(),
        ),
        data_type::INT64 => Elements::I64(words::<8>(bytes).map(i64::from_le_bytes).collect()),
        data_type::UINT64 => Elements::I64(
            words::<8>(bytes)
                .map(|w| i64::try_from(u64::from_le_bytes(w)).unwrap_or(i64::MAX))
                .collect(),
        ),
        data_type::INT32 => Elements::I64(
            words::<4>(bytes)
                .map(|w| i64::from(i32::from_le_bytes(w)))
                .collect(),
        ),
        data_type::UINT32 => Elements::I64(
            words::<4>(bytes)
                .map(|w| i64::from(u32::from_le_bytes(w)))
                .collect(),
        ),
        data_type::INT16 => Elements::I64(
            words::<2>(bytes)
                .map(|w| i64::from(i16::from_le_bytes(w)))
                .collect(),
        ),
        data_type::UINT16 => Elements::I64(
            words::<2>(bytes)
                .map(|w| i64::from(u16::from_le_bytes(w)))
                .collect(),
        ),
        data_type::INT8 => Elements::I64(bytes.iter().map(|&b| i64::from(b as i8)).collect()),
        data_type::UINT8 => Elements::I64(bytes.iter().map(|&b| i64::from(b)).collect()),
        _ => Elements::Bool(bytes.iter().map(|&b| b != 0).collect()),
    }
}

fn from_fields(t: &TensorProto, n: usize) -> Result<Elements, String> {
    let found = |len: usize| -> Result<(), String> {
        if len == n {
            Ok(())
        } else {
            Err(format!("holds {len} elements, but its shape needs {n}"))
        }
    };
    Ok(match t.data_type {
        data_type::FLOAT => {
            found(t.float_data.len())?;
            Elements::F32(t.float_data.clone())
        }
        data_type::DOUBLE => {
            found(t.double_data.len())?;
            Elements::F32(t.double_data.iter().map(|&x| x as f32).collect())
        }
        data_type::INT64 => {
            found(t.int64_data.len())?;
            Elements::I64(t.int64_data.clone())
        }
        data_type::UINT32 | data_type::UINT64 => {
            found(t.uint64_data.len())?;
            Elements::I64(
                t.uint64_data
                    .iter()
                    .map(|&x| i64::try_from(x).unwrap_or(i64::MAX))
                    .collect(),
            )
        }
        data_type::FLOAT16 | data_type::BFLOAT16 => {
            found(t.int32_data.len())?;
            let bf = t.data_type == data_type::BFLOAT16;
            Elements::F32(
                t.int32_data
                    .iter()
                    .map(|&b| {
                        let bits = b as u16;
                        if bf {
                            half::bf16::from_bits(bits).to_f32()
                        } else {
                            half::f16::from_bits(bits).to_f32()
                        }
                    })
                    .collect(),
            )
        }
        data_type::BOOL => {
            found(t.int32_data.len())?;
            Elements::Bool(t.int32_data.iter().map(|&b| b != 0).collect())
        }
        _ => {
            found(t.int32_data.len())?;
            Elements::I64(t.int32_data.iter().map(|&x| i64::from(x)).collect())
        }
    })
}

/// An ONNX tensor of `tensor`'s values (for the exporter): f32 as FLOAT, i32 as INT32,
/// bool as BOOL.
pub fn encode(name: &str, tensor: &Tensor) -> TensorProto {
    let dims = tensor.shape.iter().map(|&d| d as i64).collect();
    let mut t = TensorProto {
        dims,
        name: name.to_string(),
        ..Default::default()
    };
    match &tensor.data {
        TensorData::F32(v) => {
            t.data_type = data_type::FLOAT;
            t.raw_data = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        }
        TensorData::I32(v) => {
            t.data_type = data_type::INT32;
            t.raw_data = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        }
        TensorData::Bool(v) => {
            t.data_type = data_type::BOOL;
            t.raw_data = v.iter().map(|&b| u8::from(b)).collect();
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto(data_type: i32, dims: Vec<i64>, raw: Vec<u8>) -> TensorProto {
        TensorProto {
            dims,
            data_type,
            raw_data: raw,
            ..Default::default()
        }
    }

    #[test]
    fn raw_data_of_each_width_decodes() {
        let l = Limits::default();
        let f = proto(
            data_type::FLOAT,
            vec![2],
            [1.5f32, -2.0]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        );
        assert_eq!(
            decode(&f, "f", &NoExternalData, &l).unwrap().elements,
            Elements::F32(vec![1.5, -2.0])
        );
        let i = proto(data_type::INT64, vec![1], (-7i64).to_le_bytes().to_vec());
        assert_eq!(
            decode(&i, "i", &NoExternalData, &l).unwrap().elements,
            Elements::I64(vec![-7])
        );
        let h = proto(
            data_type::FLOAT16,
            vec![1],
            half::f16::from_f32(0.5).to_le_bytes().to_vec(),
        );
        assert_eq!(
            decode(&h, "h", &NoExternalData, &l).unwrap().elements,
            Elements::F32(vec![0.5])
        );
    }

    #[test]
    fn wrong_sizes_and_hostile_shapes_are_errors() {
        let l = Limits::default();
        let short = proto(data_type::FLOAT, vec![3], vec![0; 8]);
        assert!(decode(&short, "w", &NoExternalData, &l)
            .unwrap_err()
            .to_string()
            .contains("12"));
        let huge = proto(data_type::FLOAT, vec![1 << 40, 1 << 40], vec![]);
        assert!(decode(&huge, "w", &NoExternalData, &l).is_err());
        let negative = proto(data_type::FLOAT, vec![-1], vec![]);
        assert!(decode(&negative, "w", &NoExternalData, &l).is_err());
        let strings = proto(8, vec![1], vec![]);
        assert!(decode(&strings, "w", &NoExternalData, &l)
            .unwrap_err()
            .to_string()
            .contains("string"));
    }

    #[test]
    fn external_locations_stay_inside_the_folder() {
        for bad in ["/etc/passwd", "../x", "a/../../b", "C:\\x", ""] {
            assert!(check_location(bad).is_err(), "{bad}");
        }
        assert!(check_location("weights/model.bin").is_ok());
    }

    #[test]
    fn narrowing_names_the_value_out_of_range() {
        assert_eq!(narrow(&[1, -2]).unwrap(), vec![1, -2]);
        assert!(narrow(&[1 << 40]).unwrap_err().contains("1099511627776"));
    }
}
