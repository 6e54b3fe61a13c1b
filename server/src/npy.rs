//! `.npy` files for the CLI: the engine's parser and writer, with errors naming the path.

use anyhow::{Context, Result};
use sluice_engine::{npy, Tensor};
use std::path::Path;

/// Largest .npy file read, in bytes.
const MAX_NPY_BYTES: u64 = 4 << 30;

/// Reads a .npy file (a regular file of at most 4 GiB, checked before reading).
pub fn read(path: &Path) -> Result<Tensor> {
    let bytes = crate::files::read_bounded(path, MAX_NPY_BYTES)
        .with_context(|| format!("cannot read {}", path.display()))?;
    npy::parse(&bytes).with_context(|| format!("in {}", path.display()))
}

/// Writes a tensor as a .npy file.
pub fn write(path: &Path, t: &Tensor) -> Result<()> {
    let bytes = npy::to_bytes(t)?;
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes a float tensor as a float16 .npy file.
pub fn write_f16(path: &Path, t: &Tensor) -> Result<()> {
    let bytes = npy::to_bytes_f16(t)?;
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}
