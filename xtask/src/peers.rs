//! `cargo xtask bench --peers`: Sluice and the Burn peer (`peers/burn-bench`, Burn 0.22.1)
//! on the same machine in one run, interleaved in rounds (Burn, then Sluice, per round), each
//! figure the median over the rounds, printed side by side as ratios (with each round's
//! ratio, and each round's figures in the report, to show the spread). Never part of the test
//! command: the peer's clean build takes about 40 minutes on 2 cores, and Burn's first run
//! on a GPU autotunes for several more (its cache is kept under the target folder).
//!
//! Pairs: W1 (1024³ matmul, inputs uploaded and the product read back, and inputs resident
//! on both: Burn's median product against Sluice's median run with `--keep a --keep b`), W2 (the MLP at batch 256 over 20 batches,
//! latency at batch 1 and 64), W3 (32 elementwise operations and a sum over 2^20 floats,
//! x uploaded for each chain and x kept on the device), W4 (one SGD step of the MLP at
//! batch 256: Burn's median over rounds of 20 steps against the median of Sluice's 20 steps
//! after two warm-up steps),
//! each on the GPU (Burn's wgpu backend) and on the CPU (Burn's ndarray backend against
//! `--device cpu`).

use crate::bench::{f, median, sluice_json, W4Data, Workloads};
use crate::run;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// Whether a bigger figure is better (throughput) or a smaller one (time).
#[derive(Clone, Copy, PartialEq)]
enum Better {
    Higher,
    Lower,
}

/// One compared figure: what it is, Burn's result key, and how Sluice's run gives it.
struct Pair {
    what: &'static str,
    burn: &'static str,
    unit: &'static str,
    better: Better,
    sluice: fn(&Round) -> f64,
}

/// One round of Sluice's runs.
struct Round {
    workloads: Workloads,
    /// W4's median milliseconds per training step.
    w4_ms: f64,
}

/// Training steps Sluice times for W4 in each round (after two warm-up steps), as many
/// as one of the peer's timed rounds.
const W4_STEPS: usize = 20;

/// Wall-clock GFLOP/s of W1 (every batch uploaded, multiplied and read back).
fn w1_wall_gflops(r: &Round) -> f64 {
    let r = &r.workloads;
    let n = 1024f64;
    let batches = f(&r.w1, &["metrics", "samples"]) / n;
    2.0 * n * n * n * batches / f(&r.w1, &["metrics", "wall_ns"])
}

const PAIRS: &[Pair] = &[
    Pair {
        what: "W1 matmul 1024³, uploaded and read back",
        burn: "matmul.n1024_upload_readback",
        unit: "GFLOP/s",
        better: Better::Higher,
        sluice: w1_wall_gflops,
    },
    Pair {
        what: "W1, a and b resident on both (Sluice --keep a, b)",
        burn: "matmul.n1024_resident_sync",
        unit: "GFLOP/s",
        better: Better::Higher,
        sluice: |r| r.workloads.w1_kept_gflops(),
    },
    Pair {
        what: "W2 MLP batch 256 × 20, upload and readback each",
        burn: "mlp.b256_x20_serial",
        unit: "samples/s",
        better: Better::Higher,
        sluice: |r| f(&r.workloads.w2, &["metrics", "throughput"]),
    },
    Pair {
        what: "W2 batch 1 latency",
        burn: "mlp.b1_latency",
        unit: "ms",
        better: Better::Lower,
        sluice: |r| f(&r.workloads.w2_b1, &["metrics", "latency_p50_ns"]) / 1e6,
    },
    Pair {
        what: "W2 batch 64 latency",
        burn: "mlp.b64_latency",
        unit: "ms",
        better: Better::Lower,
        sluice: |r| f(&r.workloads.w2_b64, &["metrics", "latency_p50_ns"]) / 1e6,
    },
    Pair {
        what: "W3 32 ops + sum on 2^20 f32, Burn x resident / Sluice x uploaded",
        burn: "chain.32ops_sum_1M",
        unit: "ms",
        better: Better::Lower,
        sluice: |r| r.workloads.w3_ms(),
    },
    Pair {
        what: "W3, x resident on both (Sluice --keep x)",
        burn: "chain.32ops_sum_1M",
        unit: "ms",
        better: Better::Lower,
        sluice: |r| r.workloads.w3_kept_ms(),
    },
    Pair {
        what: "W4 training step, MLP batch 256, SGD",
        burn: "train.b256_step_time",
        unit: "ms",
        better: Better::Lower,
        sluice: |r| r.w4_ms,
    },
];

/// `cargo xtask bench --peers [gpu|cpu|all] [--rounds N]`, `args` being what follows
/// `--peers`.
pub fn main(root: &Path, args: &[String]) -> Result<()> {
    const USAGE: &str = "usage: cargo xtask bench --peers [gpu|cpu|all] [--rounds N]";
    let (devices, more): (&[&str], &[String]) = match args {
        [] => (&["gpu", "cpu"], &[]),
        [d, more @ ..] => (
            match d.as_str() {
                "gpu" => &["gpu"],
                "cpu" => &["cpu"],
                "all" => &["gpu", "cpu"],
                _ => bail!(USAGE),
            },
            more,
        ),
    };
    let rounds = match more {
        [] => 3,
        [r, n] if r == "--rounds" => n.parse().ok().filter(|&n| n > 0).context(USAGE)?,
        _ => bail!(USAGE),
    };
    peers(root, devices, rounds)
}

/// Runs the comparison on `devices` ("gpu", "cpu") for `rounds` rounds and writes
/// `bench-peers.json` into the target folder.
fn peers(root: &Path, devices: &[&str], rounds: usize) -> Result<()> {
    let target = crate::target_dir(root);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(&cargo, &["build", "--release", "-p", "sluice-server"])?;
    let peer_target = target.join("peers");
    let manifest = root.join("peers/burn-bench/Cargo.toml");
    let (manifest_s, peer_target_s) = (path_str(&manifest)?, path_str(&peer_target)?);
    run(
        &cargo,
        &[
            "build",
            "--release",
            "--manifest-path",
            manifest_s,
            "--target-dir",
            peer_target_s,
        ],
    )?;
    let burn = peer_target.join("release/burn-bench");
    let sluice = target.join("release/sluice");
    let sluice = path_str(&sluice)?;
    let machine = json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "adapters": sluice_json(sluice, &["devices"])?,
    });
    let dir = std::env::temp_dir().join(format!("sluice-peers-w4-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = W4Data::write(&dir, W4_STEPS)
        .and_then(|w4| compare(&burn, &peer_target, sluice, &w4, devices, rounds));
    // Best effort: the data is a few megabytes of random numbers in a temp folder.
    let _ = std::fs::remove_dir_all(&dir);
    let table = result?;
    println!(
        "\nSluice and Burn 0.22.1 side by side, median of {rounds} interleaved rounds \
         (advantage > 1: Sluice ahead; for times it is Burn's over Sluice's)"
    );
    println!(
        "{:<4} {:<50} {:>12} {:>12} {:>10}  {:<10} each round's advantage",
        "", "workload", "Burn", "Sluice", "advantage", "unit"
    );
    for row in &table {
        let rounds: Vec<String> = row["advantage_rounds"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| v.as_f64().map_or("-".into(), |x| format!("{x:.2}")))
            .collect();
        println!(
            "{:<4} {:<50} {:>12.3} {:>12.3} {:>9.2}×  {:<10} {}",
            row["device"].as_str().unwrap_or_default(),
            row["what"].as_str().unwrap_or_default(),
            f(row, &["burn"]),
            f(row, &["sluice"]),
            f(row, &["sluice_advantage"]),
            row["unit"].as_str().unwrap_or_default(),
            rounds.join(" "),
        );
    }
    let path = target.join("bench-peers.json");
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(
            &json!({ "machine": machine, "rounds": rounds, "table": table }),
        )?,
    )
    .with_context(|| format!("cannot write {}", path.display()))?;
    println!("report: {}", path.display());
    Ok(())
}

/// Burn (`burn`, run in `peer_dir`) and Sluice on each of `devices` for `rounds` rounds,
/// interleaved: a table row per device and pair, medians over the rounds.
fn compare(
    burn: &Path,
    peer_dir: &Path,
    sluice: &str,
    w4: &W4Data,
    devices: &[&str],
    rounds: usize,
) -> Result<Vec<Value>> {
    let mut table = Vec::new();
    for device in devices {
        let mut burn_rounds = Vec::new();
        let mut sluice_rounds = Vec::new();
        for round in 1..=rounds {
            println!("== {device}, round {round} of {rounds}");
            burn_rounds.push(burn_round(burn, peer_dir, device)?);
            let workloads = Workloads::run(sluice, device)?;
            println!("$ sluice train assets/bench/w4_train.json --device {device} (W4)");
            let (w4, _) = w4
                .train(sluice, device, "f32")
                .with_context(|| format!("W4 on {device}"))?;
            sluice_rounds.push(Round {
                workloads,
                w4_ms: f(&w4, &["ms_per_step_median"]),
            });
        }
        for pair in PAIRS {
            let burn: Vec<f64> = burn_rounds
                .iter()
                .map(|r| f(r, &[pair.burn, "value"]))
                .collect();
            let sluice: Vec<f64> = sluice_rounds.iter().map(pair.sluice).collect();
            let advantage = |b: f64, s: f64| match pair.better {
                Better::Higher => s / b,
                Better::Lower => b / s,
            };
            // Each round's pair ran back to back, so its ratio shows how much the
            // machine's speed moved between rounds.
            let per_round: Vec<f64> = burn
                .iter()
                .zip(&sluice)
                .map(|(&b, &s)| advantage(b, s))
                .collect();
            let b = finite_median(burn.iter().copied());
            let s = finite_median(sluice.iter().copied());
            table.push(json!({
                "device": device, "what": pair.what, "unit": pair.unit,
                "burn": b, "sluice": s, "sluice_advantage": advantage(b, s),
                "burn_rounds": burn, "sluice_rounds": sluice,
                "advantage_rounds": per_round,
            }));
        }
    }
    Ok(table)
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str().context("non-UTF-8 path")
}

/// The median of the finite figures (NaN when there are none).
fn finite_median(values: impl Iterator<Item = f64>) -> f64 {
    median(&mut values.filter(|x| x.is_finite()).collect::<Vec<_>>())
}

/// One round of the peer on `device` ("gpu": Burn's wgpu backend; "cpu": ndarray): its
/// results merged from the matmul, mlp, chain and train workloads. It runs in its folder under
/// the target folder, where Burn keeps its autotune cache.
fn burn_round(burn: &Path, dir: &Path, device: &str) -> Result<Value> {
    let backend = if device == "gpu" { "wgpu" } else { "ndarray" };
    let mut results = serde_json::Map::new();
    for workload in ["matmul", "mlp", "chain", "train"] {
        println!("$ burn-bench {workload} --device {backend} --json");
        let out = Command::new(burn)
            .args([workload, "--json", "--device", backend])
            .current_dir(dir)
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .output()
            .context("cannot run burn-bench")?;
        if !out.status.success() {
            bail!(
                "burn-bench {workload} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let v: Value = serde_json::from_slice(&out.stdout).context("burn-bench printed no JSON")?;
        if let Some(r) = v["results"].as_object() {
            results.extend(r.clone());
        }
    }
    Ok(Value::Object(results))
}
