//! Developer tasks, run as `cargo xtask <task>`:
//!
//! - `test`: make sure a GPU adapter and the wasm target exist, then `cargo fmt --check`,
//!   `cargo clippy -D warnings`, the engine's wasm32 check and `cargo test --workspace`.
//!   `.ci/run` calls exactly this.
//! - `demo`: make sure a GPU adapter exists, build `sluice` and start `sluice serve` on a
//!   workspace holding the example graphs; it prints the URL.
//! - `bench`: build `sluice` in release mode, run the DESIGN.md workloads
//!   (`assets/bench/`) and write one JSON report (`target/bench-report.json`).

mod bench;
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
        "bench" => {
            setup::ensure_gpu_adapter()?;
            bench::bench(&root)
        }
        _ => {
            eprintln!("usage: cargo xtask <task>\n\n  test   set up (GPU driver, wasm target), then fmt, clippy, wasm check, all tests\n  demo   set up, then start sluice serve with the example graphs\n  bench  run the benchmark workloads, write target/bench-report.json");
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
    run_tests(&cargo)
}

/// `cargo test --workspace`, echoing its output, then one closing line with the totals.
fn run_tests(cargo: &str) -> Result<()> {
    use std::io::{BufRead, BufReader};
    println!("$ {cargo} test --workspace");
    let start = Instant::now();
    let mut child = Command::new(cargo)
        .args(["test", "--workspace"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot start cargo test")?;
    let (mut passed, mut failed) = (0u64, 0u64);
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line?;
            println!("{line}");
            if let Some(rest) = line.strip_prefix("test result: ") {
                let count = |word: &str| -> u64 {
                    rest.split(';')
                        .find_map(|part| {
                            part.trim().strip_suffix(word).map(|n| {
                                n.trim()
                                    .trim_start_matches("ok. ")
                                    .trim_start_matches("FAILED. ")
                            })
                        })
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0)
                };
                passed += count("passed");
                failed += count("failed");
            }
        }
    }
    let status = child.wait()?;
    println!("  ({:.0} s)", start.elapsed().as_secs_f64());
    println!("tests: {passed} passed, {failed} failed");
    if !status.success() {
        bail!("`cargo test --workspace` failed ({status})");
    }
    Ok(())
}

fn demo(root: &Path) -> Result<()> {
    setup::ensure_gpu_adapter()?;
    let cargo = cargo();
    run(&cargo, &["build", "-p", "sluice-server"])?;
    let sluice = root.join("target/debug/sluice");
    let sluice = sluice.to_str().context("non-UTF-8 path")?;
    run(sluice, &["devices"])?;
    // A new workspace gets the example graphs; an existing one (earlier demo) is kept as is.
    let workspace =
        std::env::var("SLUICE_DEMO_WORKSPACE").unwrap_or_else(|_| "sluice-demo-workspace".into());
    println!("starting `sluice serve` on workspace '{workspace}' (Ctrl-C stops it)");
    run(sluice, &["serve", "--workspace", &workspace])
}
