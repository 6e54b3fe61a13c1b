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

/// Writes a tensor as a .npy file (durably; never over what is not a regular file).
pub fn write(path: &Path, t: &Tensor) -> Result<()> {
    crate::files::write_path_durably(path, &npy::to_bytes(t)?)
}

/// Writes a float tensor as a float16 .npy file (durably; never over what is not a
/// regular file).
pub fn write_f16(path: &Path, t: &Tensor) -> Result<()> {
    crate::files::write_path_durably(path, &npy::to_bytes_f16(t)?)
}
