//! The editor's browser tests (`tests/browser/`, Node's test runner driving Debian's
//! Chromium headless through `playwright-core`; `axe-core` for the accessibility check).
//! Set-up installs what is missing: the `chromium` package (never a downloaded browser)
//! and the npm packages the lockfile pins.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// Debian's Chromium, which the tests drive.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Makes sure Chromium, Node.js and the tests' npm packages are installed.
pub fn ensure_tools(root: &Path) -> Result<()> {
    let mut missing = Vec::new();
    if !Path::new(CHROMIUM).exists() {
        missing.push("chromium");
    }
    if Command::new("node").arg("--version").output().is_err() {
        missing.extend(["nodejs", "npm"]);
    }
    if !missing.is_empty() {
        if !crate::setup::is_root() || !Path::new("/etc/debian_version").exists() {
            bail!(
                "the browser tests need {} (Debian/Ubuntu: sudo apt-get install -y {})",
                missing.join(", "),
                missing.join(" ")
            );
        }
        println!("installing {} for the browser tests", missing.join(", "));
        crate::run("apt-get", &["update", "-qq"])?;
        let mut args = vec!["install", "-y", "-qq"];
        args.extend(&missing);
        let status = Command::new("apt-get")
            .args(&args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()?;
        if !status.success() {
            bail!("installing {} failed ({status})", missing.join(", "));
        }
    }
    let dir = root.join("tests/browser");
    if missing_packages(&dir)? {
        std::env::set_current_dir(&dir)?;
        let result = crate::run("npm", &["ci", "--no-audit", "--no-fund"]);
        std::env::set_current_dir(root)?;
        result?;
    }
    Ok(())
}

/// Whether a package `package.json` names (dependencies and devDependencies) is not in
/// `node_modules` yet.
fn missing_packages(dir: &Path) -> Result<bool> {
    let text = std::fs::read_to_string(dir.join("package.json"))
        .context("cannot read tests/browser/package.json")?;
    let manifest: serde_json::Value =
        serde_json::from_str(&text).context("tests/browser/package.json is not JSON")?;
    let names = ["dependencies", "devDependencies"]
        .iter()
        .filter_map(|k| manifest[k].as_object())
        .flat_map(|deps| deps.keys());
    Ok(names
        .into_iter()
        .any(|n| !dir.join("node_modules").join(n).exists()))
}

/// Runs the browser tests against the `sluice` binary and the `kernels` example in
/// `built` (what `cargo test --workspace` built) and the editor bundle, the server's
/// matmul tuning kept in `tuning_cache`; returns (passed, failed).
pub fn run_tests(
    root: &Path,
    built: &Path,
    bundle: &Path,
    tuning_cache: &Path,
) -> Result<(u64, u64)> {
    let dir = root.join("tests/browser");
    let exe = std::env::consts::EXE_SUFFIX;
    let sluice = built.join(format!("sluice{exe}"));
    let lister = built.join(format!("examples/kernels{exe}"));
    for path in [&sluice, &lister] {
        if !path.exists() {
            bail!(
                "{} is missing: `cargo test --workspace` builds it",
                path.display()
            );
        }
    }
    let kernels = crate::target_dir(root).join("browser-kernels.json");
    crate::run(
        lister.to_str().context("non-UTF-8 path")?,
        &[kernels.to_str().context("non-UTF-8 path")?],
    )?;
    let mut tests: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".test.mjs"))
        .collect();
    tests.sort();
    println!("$ node --test (tests/browser)");
    let start = Instant::now();
    let mut child = Command::new("node")
        .args([
            "--test",
            "--test-concurrency=1",
            "--test-reporter=spec",
            "--test-reporter-destination=stdout",
            "--test-reporter=tap",
            "--test-reporter-destination=tap.out",
        ])
        .args(&tests)
        .current_dir(&dir)
        .env("SLUICE_BIN", &sluice)
        .env("SLUICE_AUTOTUNE_CACHE", tuning_cache)
        .env("SLUICE_KERNELS", &kernels)
        .env("SLUICE_EDITOR", bundle)
        .env(
            "SLUICE_SCREENSHOTS",
            crate::target_dir(root).join("screenshots"),
        )
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start node")?;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            println!("{}", line?);
        }
    }
    let status = child.wait()?;
    let tap = std::fs::read_to_string(dir.join("tap.out")).unwrap_or_default();
    let _ = std::fs::remove_file(dir.join("tap.out"));
    let count = |key: &str| -> u64 {
        tap.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    let (passed, failed) = (count("# pass "), count("# fail "));
    println!(
        "  ({:.0} s; browser tests: {passed} passed, {failed} failed)",
        start.elapsed().as_secs_f64()
    );
    if !status.success() && failed == 0 {
        bail!("the browser tests failed ({status})");
    }
    Ok((passed, failed))
}
