//! Writes the shipped spirals dataset (`Spirals::SHIPPED`) as `features.npy` and
//! `labels.npy` into `assets/datasets/spirals/`, or the directory given:
//!
//!     cargo run -p sluice-engine --example spirals [DIR]
//!
//! The engine's test `train::spirals::tests::the_shipped_files_are_regenerated_byte_for_byte`
//! checks that the files match what the engine generates.

use sluice_engine::graph::Limits;
use sluice_engine::npy;
use sluice_engine::train::{Spirals, FEATURES, LABELS};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args_os().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets/datasets/spirals"),
        PathBuf::from,
    );
    let data = Spirals::SHIPPED.generate(&Limits::default())?;
    for name in [FEATURES, LABELS] {
        let tensor = data.get(name).ok_or(format!("no array '{name}'"))?;
        let path = dir.join(format!("{name}.npy"));
        std::fs::write(&path, npy::to_bytes(tensor)?)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("wrote {} ({:?})", path.display(), tensor.shape);
    }
    Ok(())
}
