//! Developer tasks, run as `cargo xtask <task>`:
//!
//! - `test`: make sure a GPU adapter and the wasm target exist, then `cargo fmt --check`,
//!   `cargo clippy -D warnings`, the engine's wasm32 check and `cargo test --workspace`.
//!   `.ci/run` calls exactly this.
//! - `demo`: make sure a GPU adapter exists, build `sluice` and run the example graphs.

mod setup;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    let root = workspace_root()?;
    std::env::set_current_dir(&root).with_context(|| format!("cannot enter {}", root.display()))?;
    match task.as_str() {
        "test" => test(),
        "demo" => demo(&root),
        _ => {
            eprintln!("usage: cargo xtask <task>\n\n  test   set up (GPU driver, wasm target), then fmt, clippy, wasm check, all tests\n  demo   set up, then run the example graphs headless");
            bail!("unknown task '{task}'")
        }
    }
}

fn workspace_root() -> Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .context("xtask lives inside the workspace")
}

/// Runs a command, echoing it, failing with its name when it fails.
pub fn run(program: &str, args: &[&str]) -> Result<()> {
    println!("$ {program} {}", args.join(" "));
    let start = Instant::now();
    let status = Command::new(program)
        .args(args)
        .status()
        .with_context(|| format!("cannot start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    println!("  ({:.0} s)", start.elapsed().as_secs_f64());
    Ok(())
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn test() -> Result<()> {
    setup::ensure_gpu_adapter()?;
    setup::ensure_wasm_target()?;
    let cargo = cargo();
    run(&cargo, &["fmt", "--all", "--check"])?;
    run(
        &cargo,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    run(
        &cargo,
        &[
            "check",
            "-p",
            "sluice-engine",
            "--target",
            "wasm32-unknown-unknown",
        ],
    )?;
    run(&cargo, &["test", "--workspace"])?;
    Ok(())
}

fn demo(root: &Path) -> Result<()> {
    setup::ensure_gpu_adapter()?;
    let cargo = cargo();
    run(&cargo, &["build", "-p", "sluice-server"])?;
    let sluice = root.join("target/debug/sluice");
    let sluice = sluice.to_str().context("non-UTF-8 path")?;
    run(sluice, &["devices"])?;
    for name in ["mlp", "cnn", "transformer_block"] {
        let graph = format!("assets/graphs/{name}.json");
        run(sluice, &["validate", &graph])?;
        run(sluice, &["run", &graph, "--batch", "8", "--seed", "1"])?;
    }
    Ok(())
}
