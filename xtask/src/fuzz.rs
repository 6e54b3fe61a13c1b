//! `cargo xtask fuzz [--seconds N] [TARGET]`: fuzzes the parsers with cargo-fuzz
//! (libFuzzer) — the graph decoder, builder and analysis (`graph`), planning of what
//! builds (`plan`), the `.npy` reader (`npy`), the safetensors reader (`safetensors`), the
//! worker protocol (`protocol`) and run requests (`run_request`); the targets live in
//! `fuzz/`, a workspace of its own that `cargo test --workspace` never builds.
//!
//! It installs cargo-fuzz from crates.io when missing and builds with the stable
//! toolchain: `RUSTC_BOOTSTRAP=1` lets stable rustc take the `-Z` flags cargo-fuzz
//! passes, and `-s none` turns off the sanitizer (AddressSanitizer needs a nightly
//! standard library; Rust code is memory-safe, and what is hunted here is panics,
//! overflows, hangs and allocations sized by the input: the targets are built with debug
//! assertions and overflow checks, and libFuzzer stops a unit over 20 s or 2 GiB).
//!
//! Each target first replays the crashes kept in `fuzz/regressions/TARGET/` (each one
//! found earlier; they must not crash any more), then seeds its corpus
//! `fuzz/corpus/TARGET/` from the repository's examples and test data (the committed
//! `seed-*` files are small hand-made ones; everything else there is the fuzzer's and
//! ignored by git), and fuzzes for the set time. A crash, timeout or out-of-memory input
//! is copied to `fuzz/regressions/TARGET/`, printed, and fuzzing resumes, up to three per
//! target. At the end a table gives every target's executions and findings.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The fuzz targets, in the order they run.
pub const TARGETS: &[&str] = &[
    "graph",
    "plan",
    "npy",
    "safetensors",
    "protocol",
    "run_request",
];

/// Seconds per target by default: enough for well over 1,000,000 executions of each
/// parser on two shared cores (the slowest target, `plan`, runs about 9,000 a second).
pub const DEFAULT_SECONDS: u64 = 180;

/// Findings kept per target before it stops early.
const MAX_FINDINGS: usize = 3;

/// What fuzzing one target did.
struct Outcome {
    target: &'static str,
    seconds: f64,
    executions: u64,
    corpus: usize,
    findings: Vec<Finding>,
    regressions: Result<usize, String>,
}

/// A crash, timeout or out-of-memory input.
struct Finding {
    kind: String,
    kept: PathBuf,
    message: String,
}

/// Parses `[--seconds N] [TARGET]`.
fn parse(args: &[String]) -> Result<(u64, Vec<&'static str>)> {
    let mut seconds = DEFAULT_SECONDS;
    let mut targets = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|&s| s > 0)
                    .context("--seconds takes a positive number of seconds")?;
            }
            t => match TARGETS.iter().find(|&&k| k == t) {
                Some(k) => targets.push(*k),
                None => bail!(
                    "unknown fuzz target '{t}' (targets: {})",
                    TARGETS.join(", ")
                ),
            },
        }
    }
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    Ok((seconds, targets))
}

/// `cargo fuzz` with the environment that makes it work on a stable toolchain.
fn cargo_fuzz(root: &Path) -> Command {
    let mut cmd = Command::new(crate::cargo());
    cmd.current_dir(root)
        .arg("fuzz")
        .env("RUSTC_BOOTSTRAP", "1");
    cmd
}

/// Installs cargo-fuzz from crates.io when `cargo fuzz` is missing.
fn ensure_cargo_fuzz() -> Result<()> {
    let present = Command::new(crate::cargo())
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return Ok(());
    }
    crate::run(&crate::cargo(), &["install", "cargo-fuzz", "--locked"])
}

/// Copies the repository's examples and test data into a target's corpus as `repo-*`
/// files; returns how many.
fn seed(root: &Path, target: &str, corpus: &Path) -> Result<usize> {
    std::fs::create_dir_all(corpus)?;
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();
    let graphs = || -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        for dir in ["assets/graphs", "assets/bench"] {
            for e in std::fs::read_dir(root.join(dir))? {
                let p = e?.path();
                if p.extension().is_some_and(|x| x == "json") {
                    let name = p
                        .file_stem()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned();
                    out.push((name, std::fs::read(&p)?));
                }
            }
        }
        Ok(out)
    };
    match target {
        "graph" | "plan" => seeds = graphs()?,
        "run_request" => {
            for (name, bytes) in graphs()? {
                let doc: serde_json::Value = serde_json::from_slice(&bytes)
                    .with_context(|| format!("{name} is not JSON"))?;
                let body = serde_json::json!({ "seed_inputs": true, "graph": doc, "batch": 2, "microbatches": 2 });
                seeds.push((name, body.to_string().into_bytes()));
            }
        }
        "npy" => {
            let cases = root.join("tests/data/onnx-node-cases");
            let mut dirs: Vec<PathBuf> = std::fs::read_dir(&cases)?
                .filter_map(|e| e.ok().map(|e| e.path().join("test_data_set_0")))
                .filter(|p| p.is_dir())
                .collect();
            dirs.sort();
            for d in dirs {
                for e in std::fs::read_dir(&d)? {
                    let p = e?.path();
                    let small = std::fs::metadata(&p).is_ok_and(|m| m.len() <= 16 << 10);
                    if small && p.extension().is_some_and(|x| x == "npy") {
                        let case = d
                            .parent()
                            .and_then(Path::file_name)
                            .unwrap_or_default()
                            .to_string_lossy()
                            .into_owned();
                        let file = p.file_stem().unwrap_or_default().to_string_lossy();
                        seeds.push((format!("{case}-{file}"), std::fs::read(&p)?));
                    }
                }
            }
            seeds.truncate(300);
        }
        _ => {}
    }
    for (name, bytes) in &seeds {
        std::fs::write(corpus.join(format!("repo-{name}")), bytes)?;
    }
    Ok(seeds.len())
}

/// The files of a folder (none when it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Runs the kept crashes of a target once each: Ok(count) when none crashes.
fn replay(root: &Path, target: &str) -> Result<usize, String> {
    let dir = root.join("fuzz/regressions").join(target);
    let kept = files(&dir);
    if kept.is_empty() {
        return Ok(0);
    }
    let out = cargo_fuzz(root)
        .args(["run", "-s", "none", target])
        .args(&kept)
        .args(["--", "-runs=1", "-timeout=20"])
        .output()
        .map_err(|e| format!("cannot run cargo fuzz: {e}"))?;
    if out.status.success() {
        Ok(kept.len())
    } else {
        let text = String::from_utf8_lossy(&out.stderr);
        Err(text
            .lines()
            .find(|l| l.contains("panicked") || l.contains("ERROR"))
            .unwrap_or("a kept crash crashes again")
            .to_string())
    }
}

/// Fuzzes one target for `seconds`, resuming after each finding.
fn fuzz_target(root: &Path, target: &'static str, seconds: u64) -> Result<Outcome> {
    let corpus = root.join("fuzz/corpus").join(target);
    let seeded = seed(root, target, &corpus)?;
    let regressions = replay(root, target);
    println!(
        "== fuzz target {target}: corpus of {} ({seeded} from the repository), {} kept crashes replayed ({}), {seconds} s",
        files(&corpus).len(),
        files(&root.join("fuzz/regressions").join(target)).len(),
        match &regressions {
            Ok(_) => "none crashes".to_string(),
            Err(e) => format!("STILL CRASHING: {e}"),
        }
    );
    let artifacts = root.join("fuzz/artifacts").join(target);
    std::fs::create_dir_all(&artifacts)?;
    let started = Instant::now();
    let (mut executions, mut findings) = (0u64, Vec::new());
    while findings.len() < MAX_FINDINGS {
        let left = seconds.saturating_sub(started.elapsed().as_secs());
        if left == 0 {
            break;
        }
        let out = cargo_fuzz(root)
            .args(["run", "-s", "none", target])
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={left}"))
            .args(["-print_final_stats=1", "-timeout=20", "-rss_limit_mb=2048"])
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("cannot run cargo fuzz for {target}"))?;
        let log = String::from_utf8_lossy(&out.stderr);
        executions += log
            .lines()
            .filter_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
            .filter_map(|n| n.trim().parse::<u64>().ok())
            .sum::<u64>();
        if out.status.success() {
            break;
        }
        let Some(unit) = log
            .lines()
            .find_map(|l| l.split("Test unit written to ").nth(1))
            .map(|p| PathBuf::from(p.trim()))
        else {
            // Not a finding: the build or libFuzzer itself failed.
            eprintln!("{log}");
            bail!("fuzzing {target} failed ({})", out.status);
        };
        let name = unit.file_name().context("an artifact name")?.to_owned();
        let kept_dir = root.join("fuzz/regressions").join(target);
        std::fs::create_dir_all(&kept_dir)?;
        let kept = kept_dir.join(&name);
        std::fs::copy(&unit, &kept).with_context(|| format!("cannot keep {}", unit.display()))?;
        let message = log
            .lines()
            .find(|l| l.contains("panicked at") || l.contains("==ERROR") || l.contains("ALARM"))
            .unwrap_or("")
            .trim()
            .to_string();
        let detail = log
            .lines()
            .skip_while(|l| !l.contains("panicked at"))
            .nth(1)
            .unwrap_or("")
            .trim()
            .to_string();
        let kind = name
            .to_string_lossy()
            .split('-')
            .next()
            .unwrap_or("crash")
            .to_string();
        let bytes = std::fs::read(&kept).unwrap_or_default();
        println!(
            "!! {target}: {kind} kept as {}\n   {message} {detail}\n   input ({} bytes): {}",
            kept.display(),
            bytes.len(),
            escape(&bytes, 600)
        );
        findings.push(Finding {
            kind,
            kept,
            message: format!("{message} {detail}").trim().to_string(),
        });
    }
    Ok(Outcome {
        target,
        seconds: started.elapsed().as_secs_f64(),
        executions,
        corpus: files(&corpus).len(),
        findings,
        regressions,
    })
}

/// Bytes as printable text, escaping the rest, cut at `max` bytes.
fn escape(bytes: &[u8], max: usize) -> String {
    let mut s: String = bytes
        .iter()
        .take(max)
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    if bytes.len() > max {
        s.push('…');
    }
    s
}

/// `cargo xtask fuzz [--seconds N] [TARGET]`.
pub fn fuzz(root: &Path, args: &[String]) -> Result<()> {
    let (seconds, targets) = parse(args)?;
    ensure_cargo_fuzz()?;
    println!(
        "building the fuzz targets (stable toolchain with RUSTC_BOOTSTRAP=1, no sanitizer, debug assertions on)"
    );
    let status = cargo_fuzz(root)
        .args(["build", "-s", "none"])
        .status()
        .context("cannot run cargo fuzz build")?;
    if !status.success() {
        bail!("building the fuzz targets failed ({status})");
    }
    let mut outcomes = Vec::new();
    for t in targets {
        outcomes.push(fuzz_target(root, t, seconds)?);
    }
    println!(
        "\n{:<12} {:>8} {:>13} {:>9} {:>7} {:>9}  corpus",
        "target", "seconds", "executions", "exec/s", "corpus", "findings"
    );
    let mut failed = Vec::new();
    for o in &outcomes {
        println!(
            "{:<12} {:>8.0} {:>13} {:>9.0} {:>7} {:>9}  fuzz/corpus/{}",
            o.target,
            o.seconds,
            o.executions,
            o.executions as f64 / o.seconds.max(1.0),
            o.corpus,
            o.findings.len(),
            o.target
        );
        for f in &o.findings {
            println!("    {} → {}: {}", f.kind, f.kept.display(), f.message);
            failed.push(format!("{}: {} ({})", o.target, f.kind, f.kept.display()));
        }
        if let Err(e) = &o.regressions {
            failed.push(format!("{}: a kept crash crashes again: {e}", o.target));
        }
    }
    println!("crashes are kept in fuzz/regressions/TARGET/ (replayed first on every run)");
    if !failed.is_empty() {
        bail!(
            "fuzzing found {} problem(s):\n{}",
            failed.len(),
            failed.join("\n")
        );
    }
    Ok(())
}
