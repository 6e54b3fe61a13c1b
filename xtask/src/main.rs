//! Developer tasks, run as `cargo xtask <task>`:
//!
//! - `test`: make sure a GPU adapter, the wasm target, the `wasm-bindgen` CLI, Chromium
//!   and the browser tests' npm packages exist, then `cargo fmt --check`,
//!   `cargo clippy -D warnings`, the editor bundle (which builds the engine for wasm32),
//!   `cargo test --workspace` and the editor's browser tests. `.ci/run` calls exactly this.
//! - `editor`: build the editor bundle into `target/editor`.
//! - `demo`: make sure a GPU adapter exists, build `sluice` and the editor bundle and start
//!   `sluice serve` on a workspace holding the example graphs; it prints the URL.
//! - `bench [w4]`: build `sluice` in release mode, run the workloads of docs/design.md
//!   (`assets/bench/`) and write one JSON report (`target/bench-report.json`); with `w4`
//!   only the training step (`target/bench-report-w4.json`); with `--peers [gpu|cpu|all]
//!   [--rounds N]` side by side with the Burn peer (`peers/burn-bench`), interleaved in
//!   rounds (`target/bench-peers.json`).
//! - `fuzz [--seconds N] [TARGET]`: fuzz the parsers with cargo-fuzz on the stable
//!   toolchain (`fuzz.rs`); not part of `test`.
//! - `soak [--minutes N]`: mixed valid and hostile traffic from 20 clients against one
//!   `sluice serve`, its memory and descriptors watched (`soak.rs`); not part of `test`.

mod bench;
mod browser;
mod editor;
mod fuzz;
mod peers;
mod setup;
mod soak;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    let rest: Vec<String> = std::env::args().skip(2).collect();
    let root = workspace_root()?;
    std::env::set_current_dir(&root).with_context(|| format!("cannot enter {}", root.display()))?;
    match task.as_str() {
        "test" => test(&root),
        "demo" => demo(&root),
        "editor" => editor::build(&root).map(|_| ()),
        "bench" => {
            setup::ensure_gpu_adapter()?;
            match rest.split_first() {
                Some((p, args)) if p == "--peers" => peers::main(&root, args),
                _ => bench::bench(&root, &rest),
            }
        }
        "fuzz" => fuzz::fuzz(&root, &rest),
        "soak" => {
            setup::ensure_gpu_adapter()?;
            soak::soak(&rest)
        }
        other => {
            eprintln!("usage: cargo xtask <task>\n\n  test    set up (GPU driver, wasm target and tools, Chromium), then fmt, clippy, the editor bundle, all tests, the browser tests\n  editor  build the editor bundle into target/editor\n  demo    set up, build the editor, then start sluice serve with the example graphs\n  bench [w4]  run the benchmark workloads (or only W4), write target/bench-report.json (-w4)\n  bench --peers [gpu|cpu|all] [--rounds N]  the workloads side by side with Burn 0.22.1 (peers/burn-bench), target/bench-peers.json\n  fuzz [--seconds N] [TARGET]  fuzz the parsers (targets: {}; default {} s each)\n  soak [--minutes N]  20 clients of mixed valid and hostile traffic against sluice serve (default {} min)", fuzz::TARGETS.join(", "), fuzz::DEFAULT_SECONDS, soak::DEFAULT_MINUTES);
            if matches!(other, "help" | "-h" | "--help") {
                return Ok(());
            }
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

/// Cargo's target folder: `CARGO_TARGET_DIR` where set (relative to the workspace root,
/// as cargo reads it), else `target/` in the workspace.
pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |t| root.join(t))
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn test(root: &Path) -> Result<()> {
    let started = Instant::now();
    setup::ensure_gpu_adapter()?;
    setup::ensure_wasm_target()?;
    editor::ensure_wasm_bindgen(root)?;
    browser::ensure_tools(root)?;
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
    // The bundle's wasm build is also the engine's wasm32 check.
    let bundle = editor::build(root)?;
    // The tests' matmul tuning is kept apart from the user's own cache.
    let tuning_cache = target_dir(root).join("autotune-tests.json");
    let (mut passed, mut failed) = run_tests(&cargo, &tuning_cache)?;
    // `cargo test --workspace` built `sluice` and the examples with the workspace's
    // features; building them again by package would recompile the engine.
    let (p, f) = browser::run_tests(
        root,
        &target_dir(root).join("debug"),
        &bundle,
        &tuning_cache,
    )?;
    passed += p;
    failed += f;
    println!(
        "all checks took {:.1} min",
        started.elapsed().as_secs_f64() / 60.0
    );
    println!("tests: {passed} passed, {failed} failed");
    if failed > 0 {
        bail!("{failed} test(s) failed");
    }
    Ok(())
}

/// `cargo test --workspace` with its autotuning cache in `tuning_cache`, echoing its
/// output; returns (passed, failed).
fn run_tests(cargo: &str, tuning_cache: &Path) -> Result<(u64, u64)> {
    use std::io::{BufRead, BufReader};
    println!("$ {cargo} test --workspace");
    let start = Instant::now();
    let mut child = Command::new(cargo)
        .args(["test", "--workspace"])
        .env("SLUICE_AUTOTUNE_CACHE", tuning_cache)
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
    println!(
        "  ({:.0} s; cargo tests: {passed} passed, {failed} failed)",
        start.elapsed().as_secs_f64()
    );
    if !status.success() {
        println!("tests: {passed} passed, {failed} failed");
        bail!("`cargo test --workspace` failed ({status})");
    }
    Ok((passed, failed))
}

fn demo(root: &Path) -> Result<()> {
    setup::ensure_gpu_adapter()?;
    let bundle = editor::build(root)?;
    let cargo = cargo();
    run(&cargo, &["build", "-p", "sluice-server"])?;
    let sluice = target_dir(root).join("debug/sluice");
    let sluice = sluice.to_str().context("non-UTF-8 path")?;
    run(sluice, &["devices"])?;
    // A new workspace gets the example graphs; an existing one (earlier demo) is kept as is.
    let workspace =
        std::env::var("SLUICE_DEMO_WORKSPACE").unwrap_or_else(|_| "sluice-demo-workspace".into());
    println!("starting `sluice serve` on workspace '{workspace}' (Ctrl-C stops it)");
    let bundle = bundle.to_str().context("non-UTF-8 path")?;
    run(
        sluice,
        &["serve", "--workspace", &workspace, "--editor", bundle],
    )
}
