//! `sluice autotune`: the autotuner's cache — for each adapter and matmul problem class, the
//! variant chosen and every variant tried with its time — or `--clear` to measure afresh.

use crate::tuning::{default_path, read};
use anyhow::{Context, Result};
use sluice_engine::gpu::autotune::off_by_env;
use std::process::ExitCode;

/// Runs the command.
pub fn show(as_json: bool, clear: bool) -> Result<ExitCode> {
    let path = default_path()
        .context("no cache location: set SLUICE_AUTOTUNE_CACHE, XDG_CACHE_HOME or HOME")?;
    if clear {
        match std::fs::remove_file(&path) {
            Ok(()) => println!("deleted {}", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                println!("no cache at {}", path.display())
            }
            Err(e) => return Err(e).with_context(|| format!("cannot delete {}", path.display())),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let cache = read(&path).map_err(anyhow::Error::msg)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&cache)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("autotune cache: {}", path.display());
    if off_by_env() {
        println!("(SLUICE_AUTOTUNE is off: compiles use the default variant)");
    }
    if cache.adapters.is_empty() {
        println!(
            "nothing tuned yet: compiles measure each matmul class the first time they meet it"
        );
    }
    for (adapter, records) in &cache.adapters {
        println!("{adapter}");
        for (class, r) in records {
            let [m, n, k] = r.measured_on;
            println!(
                "  {class}: chose {} (measured on {m}×{k} · {k}×{n})",
                r.chosen
            );
            let best = r.tried.iter().map(|t| t.ms).fold(f64::INFINITY, f64::min);
            for t in &r.tried {
                let mark = if t.variant == r.chosen { "*" } else { " " };
                println!(
                    "   {mark} {:<18} {:>10.3} ms  {:>5.2}×",
                    t.variant,
                    t.ms,
                    t.ms / best
                );
            }
            if !r.skipped.is_empty() {
                println!("     not tried here: {}", r.skipped.join(", "));
            }
            if !r.is_complete() {
                println!(
                    "     (from a build with fewer variants: the next compile measures it again)"
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
