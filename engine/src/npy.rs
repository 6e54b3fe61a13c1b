//! `.npy` bytes as engine tensors (via `npyz`): f32, f64 (narrowed), f16 (widened), i32,
//! i64 (range-checked to i32) and bool. Works on bytes, so the CLI, the server and the
//! editor share it. The header's length is read and checked against the bytes and
//! [`MAX_HEADER_BYTES`] before `npyz` sees it, and the shape's size against the bytes
//! before any element is allocated: a file can make the reader allocate at most about
//! its own size.

use crate::tensor::{Tensor, TensorData};

/// Largest .npy array accepted, in elements.
pub const MAX_ELEMENTS: u64 = 1 << 31;

/// Largest .npy header accepted, in bytes (numpy writes a few hundred; it reads at most
/// 10,000 by default).
pub const MAX_HEADER_BYTES: usize = 1 << 16;

/// Most axes of a .npy array (numpy's own maximum).
pub const MAX_RANK: usize = 64;

/// Where the data of .npy bytes starts: after the magic, the version, the header length
/// and the header, all checked to be present and the header within
/// [`MAX_HEADER_BYTES`].
fn data_start(bytes: &[u8]) -> Result<usize, NpyError> {
    if bytes.get(..6) != Some(b"\x93NUMPY".as_slice()) {
        return Err(NpyError::Format(
            "the magic string \\x93NUMPY is missing".into(),
        ));
    }
    let (len_at, len_size) = match bytes.get(6) {
        Some(1) => (8, 2),
        Some(2 | 3) => (8, 4),
        Some(v) => {
            return Err(NpyError::Unsupported(format!(
                "format version {v} is not supported (1, 2 and 3 are)"
            )))
        }
        None => return Err(NpyError::Format("truncated header".into())),
    };
    let header = bytes
        .get(len_at..len_at + len_size)
        .ok_or_else(|| NpyError::Format("truncated header".into()))?
        .iter()
        .rev()
        .fold(0u64, |a, &x| (a << 8) | u64::from(x));
    let header = usize::try_from(header)
        .ok()
        .filter(|&h| h <= MAX_HEADER_BYTES)
        .ok_or_else(|| {
            NpyError::Unsupported(format!(
                "the header claims {header} bytes, over the limit of {MAX_HEADER_BYTES}"
            ))
        })?;
    let start = len_at + len_size + header;
    if start > bytes.len() {
        return Err(NpyError::Format(format!(
            "the header claims {header} bytes but the file has {}",
            bytes.len()
        )));
    }
    Ok(start)
}

/// Checks the header before `npyz` reads it. Its structure: one flat dict, at most one
/// tuple, no lists — every array Sluice reads has such a header, and `npyz`'s parser
/// takes exponential time on nested brackets (a 185-byte file held it for minutes).
/// Its `shape` tuple (`npyz` multiplies the dimensions unchecked): every dimension a
/// number, at most [`MAX_RANK`] of them, their product within [`MAX_ELEMENTS`]. A header
/// without a readable shape is left to `npyz` to refuse.
fn check_header(header: &[u8]) -> Result<(), NpyError> {
    let count = |c: u8| header.iter().filter(|&&b| b == c).count();
    if count(b'{') > 1 || count(b'(') > 1 || count(b'[') > 0 {
        return Err(NpyError::Unsupported(
            "the header is not a plain .npy header (one dict of descr, fortran_order and shape; \
             structured dtypes are not supported)"
                .into(),
        ));
    }
    let Ok(text) = std::str::from_utf8(header) else {
        return Ok(());
    };
    let Some(key) = text.find("'shape'") else {
        return Ok(());
    };
    let rest = &text[key..];
    let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else {
        return Ok(());
    };
    if close < open {
        return Ok(());
    }
    let dims: Vec<&str> = rest[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if dims.len() > MAX_RANK {
        return Err(NpyError::Unsupported(format!(
            "{} axes, over the limit of {MAX_RANK}",
            dims.len()
        )));
    }
    let mut n: u64 = 1;
    for d in &dims {
        let d: u64 = d.trim_end_matches('L').parse().map_err(|_| {
            NpyError::Format(format!(
                "the header's shape has a dimension '{d}' that is not a count"
            ))
        })?;
        n = n
            .checked_mul(d)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| {
                NpyError::Unsupported(format!(
                    "the header's shape ({}) exceeds {MAX_ELEMENTS} elements",
                    dims.join(", ")
                ))
            })?;
    }
    Ok(())
}

/// Why .npy bytes could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    /// Header or data unreadable.
    #[error("not a valid .npy file: {0}")]
    Format(String),
    /// Valid, but not something Sluice takes.
    #[error("{0}")]
    Unsupported(String),
}

fn format_err(e: impl std::fmt::Display) -> NpyError {
    NpyError::Format(e.to_string())
}

/// Parses .npy bytes.
pub fn parse(bytes: &[u8]) -> Result<Tensor, NpyError> {
    let start = data_start(bytes)?;
    // The header is bytes[..start] past the magic, version and length (at most 12 bytes).
    check_header(bytes.get(8..start).unwrap_or_default())?;
    let npy = npyz::NpyFile::new(bytes).map_err(format_err)?;
    if npy.order() != npyz::Order::C {
        return Err(NpyError::Unsupported(
            "Fortran-order arrays are not supported; save with order='C'".into(),
        ));
    }
    let shape: Vec<u64> = npy.shape().to_vec();
    if shape.len() > MAX_RANK {
        return Err(NpyError::Unsupported(format!(
            "{} axes, over the limit of {MAX_RANK}",
            shape.len()
        )));
    }
    let n = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| {
            NpyError::Unsupported(format!("shape {shape:?} exceeds {MAX_ELEMENTS} elements"))
        })?;
    // The data must be present before anything is allocated for it.
    let descr = npy.dtype().descr().trim_matches('\'').to_string();
    let width: u64 = match descr.as_str() {
        "<f4" | "<i4" => 4,
        "<f8" | "<i8" => 8,
        "<f2" => 2,
        "|b1" => 1,
        other => {
            return Err(NpyError::Unsupported(format!(
            "dtype {other} is not supported (use float32, float64, float16, int32, int64 or bool)"
        )))
        }
    };
    let data_bytes = bytes.len() - start;
    let needed = n.checked_mul(width).and_then(|b| usize::try_from(b).ok());
    if needed.is_none_or(|b| b > data_bytes) {
        return Err(NpyError::Format(format!(
            "the header promises {n} elements but the file has {data_bytes} bytes of data"
        )));
    }
    let dims: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| NpyError::Unsupported(format!("shape {shape:?} is too large")))?;
    let data = match descr.as_str() {
        "<f4" => TensorData::F32(npy.into_vec::<f32>().map_err(format_err)?),
        "<f8" => TensorData::F32(
            npy.into_vec::<f64>()
                .map_err(format_err)?
                .into_iter()
                .map(|x| x as f32)
                .collect(),
        ),
        "<f2" => {
            // npyz has no f16 element type: read the raw data after the header.
            let data = needed
                .and_then(|b| bytes.get(start..start.checked_add(b)?))
                .ok_or_else(|| {
                    NpyError::Format("the data is shorter than the shape says".into())
                })?;
            TensorData::F32(
                data.chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            )
        }
        "<i4" => TensorData::I32(npy.into_vec::<i32>().map_err(format_err)?),
        "<i8" => {
            let v = npy.into_vec::<i64>().map_err(format_err)?;
            let mut out = Vec::with_capacity(v.len());
            for x in v {
                out.push(i32::try_from(x).map_err(|_| {
                    NpyError::Unsupported(format!("int64 value {x} does not fit in i32"))
                })?);
            }
            TensorData::I32(out)
        }
        _ => TensorData::Bool(npy.into_vec::<bool>().map_err(format_err)?),
    };
    let t = Tensor { shape: dims, data };
    if t.len() as u64 != n {
        return Err(NpyError::Format(format!(
            "the file holds {} elements, but its header says {n}",
            t.len()
        )));
    }
    Ok(t)
}

/// Serialises a tensor as .npy bytes.
pub fn to_bytes(t: &Tensor) -> Result<Vec<u8>, NpyError> {
    use npyz::WriterBuilder;
    let mut buf = Vec::new();
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    macro_rules! write_items {
        ($ty:ty, $items:expr) => {{
            let mut w = npyz::WriteOptions::<$ty>::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut buf)
                .begin_nd()
                .map_err(format_err)?;
            w.extend($items).map_err(format_err)?;
            w.finish().map_err(format_err)?;
        }};
    }
    match &t.data {
        TensorData::F32(v) => write_items!(f32, v.iter().copied()),
        TensorData::I32(v) => write_items!(i32, v.iter().copied()),
        TensorData::Bool(v) => write_items!(bool, v.iter().copied()),
    }
    Ok(buf)
}

/// Serialises a float tensor as a float16 .npy file (values beyond ±65504 become ±inf,
/// as numpy would).
pub fn to_bytes_f16(t: &Tensor) -> Result<Vec<u8>, NpyError> {
    let TensorData::F32(v) = &t.data else {
        return Err(NpyError::Unsupported(
            "only float tensors can be written as float16".into(),
        ));
    };
    let dims: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '<f2', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + length (2) + header + newline, padded to 64 bytes.
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for &x in v {
        out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `.npy` bytes with a version 1 header holding `dict`.
    fn with_header(dict: &str) -> Vec<u8> {
        let mut h = dict.to_string();
        let total = (10 + h.len() + 1).div_ceil(64) * 64;
        h.push_str(&" ".repeat(total - 10 - h.len() - 1));
        h.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&u16::try_from(h.len()).unwrap().to_le_bytes());
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(&[0; 16]);
        out
    }

    #[test]
    fn a_shape_whose_product_overflows_is_refused_before_npyz_multiplies_it() {
        // Found by the adversarial suite: npyz's own product overflowed (a panic in
        // debug builds, a wrapped count in release builds).
        for shape in [
            "(4294967296, 4294967296, 4294967296)",
            "(18446744073709551615, 2)",
            "(4294967296, 4294967296)",
        ] {
            let bytes = with_header(&format!(
                "{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
            ));
            let e = parse(&bytes).unwrap_err().to_string();
            assert!(e.contains("exceeds"), "{shape}: {e}");
        }
        let bytes = with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }");
        assert!(parse(&bytes).is_err());
        let ok = with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }");
        assert_eq!(parse(&ok).unwrap().shape, vec![2, 2]);
    }

    #[test]
    fn nested_brackets_are_refused_before_npyz_parses_them() {
        // Found by the npy fuzzer: npyz took minutes on 60 nested braces.
        let nested = format!(
            "{{'descr': '<f4', 'x': {}{}, 'shape': (2,), }}",
            "{".repeat(60),
            "}".repeat(60)
        );
        let e = parse(&with_header(&nested)).unwrap_err().to_string();
        assert!(e.contains("not a plain .npy header"), "{e}");
        let listed = "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }";
        assert!(parse(&with_header(listed)).is_err());
    }

    /// .npy bytes of format version `version` with `header` (its length field as given,
    /// or the header's real length) and `data`.
    fn npy(version: u8, header: &str, claimed: Option<u32>, data: &[u8]) -> Vec<u8> {
        let mut out = b"\x93NUMPY".to_vec();
        out.extend([version, 0]);
        let len = claimed.unwrap_or(header.len() as u32);
        if version == 1 {
            out.extend((len as u16).to_le_bytes());
        } else {
            out.extend(len.to_le_bytes());
        }
        out.extend(header.as_bytes());
        out.extend(data);
        out
    }

    #[test]
    fn headers_and_shapes_are_checked_against_the_bytes_before_allocating() {
        let header = |shape: &str| {
            format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}\n")
        };
        // A valid tiny file for reference.
        let ok = npy(1, &header("(2,)"), None, &[0; 8]);
        assert_eq!(parse(&ok).unwrap().shape, vec![2]);
        // 2^60 elements promised by a 100-byte file.
        let e = parse(&npy(1, &header("(1152921504606846976,)"), None, &[0; 8])).unwrap_err();
        assert!(
            e.to_string().contains("exceeds") || e.to_string().contains("promises"),
            "{e}"
        );
        // Elements within the cap but not in the file.
        let e = parse(&npy(1, &header("(1000, 1000)"), None, &[0; 8])).unwrap_err();
        assert!(e.to_string().contains("promises"), "{e}");
        // A header length of 4 GiB, and one longer than the file.
        let e = parse(&npy(2, &header("(2,)"), Some(u32::MAX), &[0; 8])).unwrap_err();
        assert!(e.to_string().contains("over the limit"), "{e}");
        let e = parse(&npy(1, &header("(2,)"), Some(60_000), &[0; 8])).unwrap_err();
        assert!(e.to_string().contains("but the file has"), "{e}");
        // Too many axes; float16 data cut short; an unknown version.
        let many = format!("({})", vec!["1"; 100].join(", "));
        assert!(parse(&npy(1, &header(&many), None, &[0; 4])).is_err());
        let half = "{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }\n";
        assert!(parse(&npy(1, half, None, &[0; 6])).is_err());
        assert!(parse(&npy(9, &header("(2,)"), None, &[0; 8])).is_err());
        for cut in 0..ok.len() {
            assert!(parse(&ok[..cut]).is_err(), "{cut} bytes");
        }
    }

    #[test]
    fn round_trip_and_garbage() {
        let t = Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.5]);
        let bytes = to_bytes(&t).unwrap();
        assert_eq!(parse(&bytes).unwrap(), t);
        let i = Tensor {
            shape: vec![3],
            data: TensorData::I32(vec![-1, 0, 7]),
        };
        assert_eq!(parse(&to_bytes(&i).unwrap()).unwrap(), i);
        assert!(parse(b"not a numpy file").is_err());
        let mut cut = bytes.clone();
        cut.truncate(bytes.len() - 3);
        assert!(parse(&cut).is_err());
        let h = to_bytes_f16(&t).unwrap();
        assert_eq!(parse(&h).unwrap(), t, "f16 round trip of f16-exact values");
        // A header promising a huge array must not allocate it.
        let huge = String::from_utf8_lossy(&bytes).replace("(2, 3)", "(99999999999,)");
        assert!(parse(huge.as_bytes()).is_err());
    }
}
