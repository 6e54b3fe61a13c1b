//! The editor bundle (`cargo xtask editor`): the `sluice-editor` crate built for
//! `wasm32-unknown-unknown` with the `wasm-release` profile, its JS glue written by the
//! `wasm-bindgen` CLI at exactly the version in `Cargo.lock` (installed when missing or
//! different), and `assets/editor/` (HTML, CSS) copied beside them into `target/editor`,
//! the folder `sluice serve` finds by default.

use crate::run;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the bundle is written, relative to the workspace root.
pub const BUNDLE_DIR: &str = "target/editor";

/// The `wasm-bindgen` version `Cargo.lock` pins.
fn locked_wasm_bindgen(root: &Path) -> Result<String> {
    let lock =
        std::fs::read_to_string(root.join("Cargo.lock")).context("cannot read Cargo.lock")?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "name = \"wasm-bindgen\"" {
            if let Some(v) = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("version = \""))
                .and_then(|v| v.strip_suffix('"'))
            {
                return Ok(v.to_string());
            }
        }
    }
    bail!("Cargo.lock has no wasm-bindgen entry")
}

/// The version of the `wasm-bindgen` CLI on the PATH, if any.
fn installed_wasm_bindgen() -> Option<String> {
    let out = Command::new("wasm-bindgen")
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().nth(1).map(str::to_string)
}

/// Installs the `wasm-bindgen` CLI at the locked version unless it is already there
/// (a few minutes, once). Without `--locked`: its lockfile names a crate the registry lacks.
pub fn ensure_wasm_bindgen(root: &Path) -> Result<()> {
    let want = locked_wasm_bindgen(root)?;
    match installed_wasm_bindgen() {
        Some(have) if have == want => Ok(()),
        have => {
            println!(
                "wasm-bindgen CLI {} found, {want} needed (Cargo.lock): installing it (a few minutes, once)",
                have.as_deref().unwrap_or("not")
            );
            run(
                &crate::cargo(),
                &["install", "wasm-bindgen-cli", "--version", &want],
            )
        }
    }
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))
}

/// Builds the bundle into `target/editor` and returns its folder.
pub fn build(root: &Path) -> Result<PathBuf> {
    crate::setup::ensure_wasm_target()?;
    ensure_wasm_bindgen(root)?;
    run(
        &crate::cargo(),
        &[
            "build",
            "-p",
            "sluice-editor",
            "--lib",
            "--target",
            "wasm32-unknown-unknown",
            "--profile",
            "wasm-release",
        ],
    )?;
    let wasm =
        crate::target_dir(root).join("wasm32-unknown-unknown/wasm-release/sluice_editor.wasm");
    let out = root.join(BUNDLE_DIR);
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("cannot clear {}", out.display()))?;
    }
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    run(
        "wasm-bindgen",
        &[
            "--target",
            "web",
            "--no-typescript",
            "--out-dir",
            path_str(&out)?,
            path_str(&wasm)?,
        ],
    )?;
    let assets = root.join("assets/editor");
    for entry in
        std::fs::read_dir(&assets).with_context(|| format!("cannot read {}", assets.display()))?
    {
        let path = entry?.path();
        if path.is_file() {
            let name = path.file_name().context("file name")?;
            std::fs::copy(&path, out.join(name))
                .with_context(|| format!("cannot copy {}", path.display()))?;
        }
    }
    let size = std::fs::metadata(out.join("sluice_editor_bg.wasm"))
        .map(|m| m.len())
        .unwrap_or(0);
    println!(
        "editor bundle in {} ({:.1} MB of wasm)",
        out.display(),
        size as f64 / 1e6
    );
    Ok(out)
}
