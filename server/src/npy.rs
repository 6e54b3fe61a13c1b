//! Reading and writing `.npy` files (via `npyz`) as engine tensors, with every problem
//! reported against the file's path.

use anyhow::{bail, Context, Result};
use npyz::WriterBuilder;
use sluice_engine::{Tensor, TensorData};
use std::path::Path;

/// Largest .npy file read, in elements.
const MAX_ELEMENTS: u64 = 1 << 31;

/// Reads a .npy file: f32, f64 (narrowed), f16 (widened), i32, i64 (checked), or bool.
pub fn read(path: &Path) -> Result<Tensor> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&bytes).with_context(|| format!("{} is not a usable .npy file", path.display()))
}

/// Parses .npy bytes.
pub fn parse(bytes: &[u8]) -> Result<Tensor> {
    let npy = npyz::NpyFile::new(bytes).context("bad .npy header")?;
    if npy.order() != npyz::Order::C {
        bail!("Fortran-order arrays are not supported; save with order='C'");
    }
    let shape: Vec<u64> = npy.shape().to_vec();
    let n = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .context("shape overflows")?;
    if n > MAX_ELEMENTS {
        bail!("{n} elements exceed the limit of {MAX_ELEMENTS}");
    }
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    let descr = npy.dtype().descr();
    let data = match descr.as_str() {
        "<f4" => TensorData::F32(npy.into_vec::<f32>().context("reading f32 data")?),
        "<f8" => TensorData::F32(
            npy.into_vec::<f64>()
                .context("reading f64 data")?
                .into_iter()
                .map(|x| x as f32)
                .collect(),
        ),
        "<f2" => TensorData::F32(
            npy.into_vec::<u16>()
                .context("reading f16 data")?
                .into_iter()
                .map(|b| half::f16::from_bits(b).to_f32())
                .collect(),
        ),
        "<i4" => TensorData::I32(npy.into_vec::<i32>().context("reading i32 data")?),
        "<i8" => {
            let v = npy.into_vec::<i64>().context("reading i64 data")?;
            let mut out = Vec::with_capacity(v.len());
            for x in v {
                out.push(
                    i32::try_from(x)
                        .map_err(|_| anyhow::anyhow!("int64 value {x} does not fit in i32"))?,
                );
            }
            TensorData::I32(out)
        }
        "|b1" => TensorData::Bool(npy.into_vec::<bool>().context("reading bool data")?),
        other => bail!(
            "dtype {other} is not supported (use float32, float64, float16, int32, int64 or bool)"
        ),
    };
    let t = Tensor { shape: dims, data };
    if t.len() as u64 != n {
        bail!(
            "the file holds {} elements, but its header says {n}",
            t.len()
        );
    }
    Ok(t)
}

/// Writes a tensor as .npy.
pub fn write(path: &Path, t: &Tensor) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut buf = std::io::BufWriter::new(file);
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    match &t.data {
        TensorData::F32(v) => {
            let mut w = npyz::WriteOptions::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut buf)
                .begin_nd()?;
            w.extend(v.iter().copied())?;
            w.finish()?;
        }
        TensorData::I32(v) => {
            let mut w = npyz::WriteOptions::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut buf)
                .begin_nd()?;
            w.extend(v.iter().copied())?;
            w.finish()?;
        }
        TensorData::Bool(v) => {
            let mut w = npyz::WriteOptions::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut buf)
                .begin_nd()?;
            w.extend(v.iter().copied())?;
            w.finish()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let dir = std::env::temp_dir().join(format!("sluice-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.npy");
        let t = Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.5]);
        write(&p, &t).unwrap();
        assert_eq!(read(&p).unwrap(), t);
        assert!(parse(b"not a numpy file").is_err());
        let mut bytes = std::fs::read(&p).unwrap();
        bytes.truncate(bytes.len() - 3);
        assert!(parse(&bytes).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
