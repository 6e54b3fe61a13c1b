//! `cargo xtask bench`: the design note's workloads (`docs/design.md`), measured side by side in one run, written
//! as one JSON report with the machine and driver named. Nothing here asserts speed; the
//! report says what was measured.

use crate::run;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// Runs `sluice ARGS --json` and parses what it prints.
pub(crate) fn sluice_json(sluice: &str, args: &[&str]) -> Result<Value> {
    println!("$ sluice {}", args.join(" "));
    let out = Command::new(sluice)
        .args(args)
        .arg("--json")
        .output()
        .context("cannot run sluice")?;
    if !out.status.success() {
        bail!(
            "sluice {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("sluice {} printed no JSON", args.join(" ")))
}

/// The number at `path` in `v` (NaN where there is none).
pub(crate) fn f(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = match p.parse::<usize>() {
            Ok(i) => &cur[i],
            Err(_) => &cur[*p],
        };
    }
    cur.as_f64().unwrap_or(f64::NAN)
}

/// Runs every workload (or only W4 with `only == ["w4"]`) and writes the report into the
/// target folder (`CARGO_TARGET_DIR` where set, as cargo builds there).
pub fn bench(root: &Path, only: &[String]) -> Result<()> {
    let only_w4 = match only {
        [] => false,
        [w] if w == "w4" => true,
        _ => bail!("usage: cargo xtask bench [w4 | --peers [gpu|cpu|all] [--rounds N]]"),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(&cargo, &["build", "--release", "-p", "sluice-server"])?;
    let target = crate::target_dir(root);
    let bin = target.join("release/sluice");
    let s = bin.to_str().context("non-UTF-8 path")?;
    let devices = sluice_json(s, &["devices"])?;
    let machine = json!({ "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), "adapters": devices });
    if only_w4 {
        let w4 = w4(s, &devices)?;
        return write_report(
            &target.join("bench-report-w4.json"),
            &json!({ "machine": machine, "summary": { "w4": w4["summary"] }, "runs": { "w4": w4["runs"] } }),
        );
    }
    let g = |name: &str| format!("assets/bench/{name}.json");

    // W1: matmul 1024³, including upload and readback; kernel GFLOP/s from timestamps.
    let w1 = sluice_json(
        s,
        &["bench", &g("w1_matmul"), "--batch", "1024", "--reps", "5"],
    )?;
    // W2: MLP at batch 256 over 20 batches, prefetch 2 and 1; latency at batch 1 and 64.
    let w2 = sluice_json(
        s,
        &[
            "bench",
            &g("w2_mlp"),
            "--batch",
            "256",
            "--prefetch",
            "2",
            "--reps",
            "20",
        ],
    )?;
    let w2_k1 = sluice_json(
        s,
        &[
            "bench",
            &g("w2_mlp"),
            "--batch",
            "256",
            "--prefetch",
            "1",
            "--reps",
            "20",
        ],
    )?;
    // Latency: one request at a time (see `Workloads::run`).
    let latency = |batch: &str| {
        let w2 = g("w2_mlp");
        let mut args = vec!["bench", &w2, "--batch", batch];
        args.extend(["--reps", "20", "--prefetch", "1"]);
        sluice_json(s, &args)
    };
    let (w2_b1, w2_b64) = (latency("1")?, latency("64")?);
    // W3: 32 elementwise ops and a sum over 2^20 floats, fused and not, and with x kept
    // on the device.
    let w3 = sluice_json(s, &["bench", &g("w3_chain"), "--reps", "20"])?;
    let w3_kept = sluice_json(s, &["bench", &g("w3_chain"), "--reps", "20", "--keep", "x"])?;
    let w3_nf = sluice_json(s, &["bench", &g("w3_chain"), "--reps", "5", "--no-fuse"])?;
    // W5: the deeper MLP on 1 stage and on 2 stages with M = 1, 2, 4, 8.
    let mut w5 = Vec::new();
    let single = sluice_json(
        s,
        &[
            "bench",
            &g("w5_pipeline"),
            "--batch",
            "2048",
            "--microbatches",
            "8",
            "--reps",
            "2",
        ],
    )?;
    for m in ["1", "2", "4", "8"] {
        let r = sluice_json(
            s,
            &[
                "bench",
                &g("w5_pipeline"),
                "--batch",
                "2048",
                "--microbatches",
                m,
                "--stages",
                "2",
                "--reps",
                "2",
            ],
        )?;
        w5.push(r);
    }
    // W5 streaming: a dataset of 8 batches (S = 2, M = 4) in one run. Micro-batches
    // stream across batch boundaries, so the pipeline fills and drains once per dataset:
    // the ideal bubble is (S−1)/(8M+S−1), not GPipe's per-batch (S−1)/(M+S−1).
    let w5_stream = sluice_json(
        s,
        &[
            "bench",
            &g("w5_pipeline"),
            "--batch",
            "2048",
            "--microbatches",
            "4",
            "--stages",
            "2",
            "--reps",
            "8",
        ],
    )?;
    // Memory: the transformer block at batch 64.
    let tb = sluice_json(
        s,
        &[
            "bench",
            "assets/graphs/transformer_block.json",
            "--batch",
            "64",
            "--reps",
            "2",
        ],
    )?;
    let tb_nf = sluice_json(
        s,
        &[
            "bench",
            "assets/graphs/transformer_block.json",
            "--batch",
            "64",
            "--reps",
            "2",
            "--no-fuse",
        ],
    )?;

    // Precision: W1 and W2 in mixed precision on both 16-bit storage paths (each run
    // also measures f32 on the same inputs), and the transformer's memory.
    let mut mixed = Vec::new();
    for storage in ["packed", "native"] {
        let w1m = sluice_json(
            s,
            &[
                "bench",
                &g("w1_matmul"),
                "--batch",
                "1024",
                "--reps",
                "5",
                "--precision",
                "mixed",
                "--f16-storage",
                storage,
            ],
        );
        let w2m = sluice_json(
            s,
            &[
                "bench",
                &g("w2_mlp"),
                "--batch",
                "256",
                "--reps",
                "20",
                "--precision",
                "mixed",
                "--f16-storage",
                storage,
            ],
        );
        match (w1m, w2m) {
            (Ok(a), Ok(b)) => mixed.push((storage, a, b)),
            (Err(e), _) | (_, Err(e)) => println!("mixed precision with {storage} storage: {e:#}"),
        }
    }
    let tb_mixed = sluice_json(
        s,
        &[
            "bench",
            "assets/graphs/transformer_block.json",
            "--batch",
            "64",
            "--reps",
            "2",
            "--precision",
            "mixed",
        ],
    )?;
    let telemetry = telemetry_cost(s, &g)?;
    let cpu = cpu_workloads(s)?;
    let w4 = w4(s, &devices)?;
    let w3_fused = f(&w3, &["metrics", "wall_ns"]) / f(&w3, &["metrics", "samples"]);
    let w3_unfused = f(&w3_nf, &["metrics", "wall_ns"]) / f(&w3_nf, &["metrics", "samples"]);
    let summary = json!({
        "w1_matmul_1024_kernel_gflops": f(&w1, &["compute_gflops"]),
        "w2_samples_per_s_prefetch2": f(&w2, &["metrics", "throughput"]),
        "w2_samples_per_s_prefetch1": f(&w2_k1, &["metrics", "throughput"]),
        "w2_steady_utilisation_prefetch2": f(&w2, &["metrics", "devices", "0", "steady_utilisation"]),
        "w2_steady_utilisation_prefetch1": f(&w2_k1, &["metrics", "devices", "0", "steady_utilisation"]),
        "w2_latency_p50_ms_batch1": f(&w2_b1, &["metrics", "latency_p50_ns"]) / 1e6,
        "w2_latency_p50_ms_batch64": f(&w2_b64, &["metrics", "latency_p50_ns"]) / 1e6,
        "w3_ms_per_chain_fused": w3_fused / 1e6,
        "w3_ms_per_chain_unfused": w3_unfused / 1e6,
        "w3_ms_per_chain_x_kept": f(&w3_kept, &["metrics", "wall_ns"]) / f(&w3_kept, &["metrics", "samples"]) / 1e6,
        "w3_fusion_speedup": w3_unfused / w3_fused,
        "telemetry_cost": telemetry,
        "cpu": cpu["summary"],
        "w4": w4["summary"],
        "w5": w5.iter().map(|r| json!({
            "microbatches": r["config"]["microbatches"],
            "samples_per_s": f(r, &["metrics", "throughput"]),
            "bubble_measured": f(r, &["metrics", "bubble_fraction"]),
            "bubble_ideal": f(r, &["metrics", "ideal_bubble"]),
            "utilisation": r["metrics"]["devices"].as_array().map(|d| d.iter().map(|x| x["utilisation"].clone()).collect::<Vec<_>>()),
            "outputs_equal_single_stage": r["outputs"] == single["outputs"],
        })).collect::<Vec<_>>(),
        "w5_single_stage_samples_per_s": f(&single, &["metrics", "throughput"]),
        "w5_stream_8_batches_s2_m4": {
            "micro_batches": w5_stream["metrics"]["samples"].as_f64().map(|n| n / 512.0),
            "bubble_measured": f(&w5_stream, &["metrics", "bubble_fraction"]),
            "bubble_ideal_streamed": f(&w5_stream, &["metrics", "ideal_bubble"]),
            "bubble_ideal_per_batch": 1.0 / 5.0,
            "samples_per_s": f(&w5_stream, &["metrics", "throughput"]),
        },
        "transformer_b64_planned_over_naive": f(&tb, &["memory", "planned_bytes"]) / f(&tb, &["memory", "naive_bytes"]),
        "transformer_b64_unfused_planned_over_naive": f(&tb_nf, &["memory", "planned_bytes"]) / f(&tb_nf, &["memory", "naive_bytes"]),
        "transformer_b64_mixed_planned_over_f32": f(&tb_mixed, &["memory", "planned_bytes"]) / f(&tb, &["memory", "planned_bytes"]),
        "transformer_b64_mixed_weights_over_f32": f(&tb_mixed, &["memory", "weight_bytes"]) / f(&tb, &["memory", "weight_bytes"]),
        "mixed_vs_f32": mixed.iter().map(|(storage, w1m, w2m)| json!({
            "f16_storage": storage,
            "w1_1024_kernel_gflops_mixed": f(w1m, &["compute_gflops"]),
            "w1_1024_ms_per_batch_mixed": f(w1m, &["metrics", "wall_ns"]) / 5e6,
            "w1_1024_ms_per_batch_f32": f(w1m, &["f32_baseline", "metrics", "wall_ns"]) / 5e6,
            "w1_max_rel_error": f(w1m, &["f32_baseline", "precision_report", "0", "max_rel"]),
            "w2_samples_per_s_mixed": f(w2m, &["metrics", "throughput"]),
            "w2_samples_per_s_f32": f(w2m, &["f32_baseline", "metrics", "throughput"]),
            "w2_planned_bytes_mixed": f(w2m, &["memory", "planned_bytes"]),
            "w2_planned_bytes_f32": f(w2m, &["f32_baseline", "memory", "planned_bytes"]),
            "w2_weight_bytes_mixed": f(w2m, &["memory", "weight_bytes"]),
            "w2_weight_bytes_f32": f(w2m, &["f32_baseline", "memory", "weight_bytes"]),
            "w2_max_rel_error": f(w2m, &["f32_baseline", "precision_report", "0", "max_rel"]),
            "w2_argmax_agreement": f(w2m, &["f32_baseline", "precision_report", "0", "argmax_agreement"]),
        })).collect::<Vec<_>>(),
    });
    let report = json!({
        "machine": machine,
        "summary": summary,
        "runs": { "w1": w1, "w2_prefetch2": w2, "w2_prefetch1": w2_k1, "w2_batch1": w2_b1, "w2_batch64": w2_b64,
                  "w3_fused": w3, "w3_unfused": w3_nf, "w3_x_kept": w3_kept, "cpu": cpu["runs"], "w4": w4["runs"], "w5_single": single, "w5_two_stage": w5, "w5_stream": w5_stream,
                  "transformer_b64": tb, "transformer_b64_unfused": tb_nf, "transformer_b64_mixed": tb_mixed,
                  "mixed": mixed.iter().map(|(st, a, b)| json!({ "f16_storage": st, "w1": a, "w2": b })).collect::<Vec<_>>() },
    });
    println!("{}", serde_json::to_string_pretty(&summary)?);
    write_report(&target.join("bench-report.json"), &report)
}

/// What per-pass timing costs: W3 and W2 (batch 256) with the default sampled timestamp
/// queries, with every micro-batch timed and with none, over [`TELEMETRY_ROUNDS`] rounds.
/// Each round runs the three modes back to back (in alternating order, so that a drift
/// within a round does not always favour one mode) and the cost of a mode is the median
/// over rounds of its difference to untimed in the same round: this machine's speed drifts
/// by ±15% between runs seconds apart, far more than the cost measured, and pairing within
/// a round cancels most of that. Each run measures for about a second (200 chains, 80
/// batches).
fn telemetry_cost(s: &str, g: &dyn Fn(&str) -> String) -> Result<Value> {
    let (w3, w2) = (g("w3_chain"), g("w2_mlp"));
    let mut out = serde_json::Map::new();
    for (name, args, per) in [
        ("w3_ms_per_chain", vec!["bench", &w3, "--reps", "200"], 1.0),
        (
            "w2_ms_per_batch256",
            vec!["bench", &w2, "--batch", "256", "--reps", "80"],
            256.0,
        ),
    ] {
        let modes = ["sampled", "every", "off"];
        let mut times: [Vec<f64>; 3] = Default::default();
        for round in 0..TELEMETRY_ROUNDS {
            let mut order = [0, 1, 2];
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let mut a = args.clone();
                if modes[i] != "sampled" {
                    a.extend(["--pass-timing", modes[i]]);
                }
                let r = sluice_json(s, &a)?;
                let per_sample = f(&r, &["metrics", "wall_ns"]) / f(&r, &["metrics", "samples"]);
                times[i].push(per_sample * per / 1e6);
            }
        }
        // Percent over untimed, round by round.
        let cost = |mode: &[f64]| {
            let mut d: Vec<f64> = mode
                .iter()
                .zip(&times[2])
                .map(|(t, off)| 100.0 * (t - off) / off)
                .collect();
            median(&mut d)
        };
        let (sampled_cost, every_cost) = (cost(&times[0]), cost(&times[1]));
        let [sampled, every, off] = times.map(|mut v| median(&mut v));
        out.insert(
            name.into(),
            json!({
                "sampled": sampled,
                "every": every,
                "untimed": off,
                "cost_percent": sampled_cost,
                "every_cost_percent": every_cost,
                "rounds": TELEMETRY_ROUNDS,
            }),
        );
    }
    Ok(Value::Object(out))
}

/// Rounds of [`telemetry_cost`].
const TELEMETRY_ROUNDS: usize = 7;

/// The median of `v`, which it sorts (NaN when empty).
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Sluice's runs of W1 (1024 rows), W2 (batch 256, and latency at 1 and 64) and W3 on one
/// device: what the fast CPU rows of the report and `bench --peers` read.
pub(crate) struct Workloads {
    pub w1: Value,
    /// W1 with a and b kept on the device, one product at a time (`--prefetch 1`), as the
    /// peer times its resident product: each run's time is its own.
    pub w1_kept: Value,
    pub w2: Value,
    pub w2_b1: Value,
    pub w2_b64: Value,
    pub w3: Value,
    /// W3 with x kept on the device (`--keep x`): nothing uploaded per chain.
    pub w3_kept: Value,
}

impl Workloads {
    /// Runs them on `device` (`gpu`, `cpu` or `reference`).
    pub(crate) fn run(s: &str, device: &str) -> Result<Workloads> {
        let run = |args: &[&str]| {
            let mut a = args.to_vec();
            a.extend(["--device", device]);
            sluice_json(s, &a)
        };
        let (w1, w2, w3) = (
            "assets/bench/w1_matmul.json",
            "assets/bench/w2_mlp.json",
            "assets/bench/w3_chain.json",
        );
        // Latency: one request at a time, as the peer measures it (with more in flight,
        // each would also wait for the one before).
        let latency = |batch: &str| {
            let mut args = vec!["bench", w2, "--batch", batch];
            args.extend(["--reps", "20", "--prefetch", "1"]);
            run(&args)
        };
        Ok(Workloads {
            w1: run(&["bench", w1, "--batch", "1024", "--reps", "5"])?,
            w1_kept: run(&[
                "bench",
                w1,
                "--batch",
                "1024",
                "--reps",
                "10",
                "--prefetch",
                "1",
                "--keep",
                "a",
                "--keep",
                "b",
            ])?,
            w2: run(&["bench", w2, "--batch", "256", "--reps", "20"])?,
            w2_b1: latency("1")?,
            w2_b64: latency("64")?,
            w3: run(&["bench", w3, "--reps", "20"])?,
            w3_kept: run(&["bench", w3, "--reps", "20", "--keep", "x"])?,
        })
    }

    /// W1's GFLOP/s with a and b kept on the device, from the median run's time.
    pub(crate) fn w1_kept_gflops(&self) -> f64 {
        let n = 1024f64;
        2.0 * n * n * n / f(&self.w1_kept, &["metrics", "latency_p50_ns"])
    }

    /// W3's milliseconds per chain, x uploaded for each.
    pub(crate) fn w3_ms(&self) -> f64 {
        f(&self.w3, &["metrics", "wall_ns"]) / f(&self.w3, &["metrics", "samples"]) / 1e6
    }

    /// W3's milliseconds per chain with x kept on the device.
    pub(crate) fn w3_kept_ms(&self) -> f64 {
        let r = &self.w3_kept;
        f(r, &["metrics", "wall_ns"]) / f(r, &["metrics", "samples"]) / 1e6
    }
}

/// W1, W2 and W3 on the fast CPU device (`--device cpu`): matmul GFLOP/s, MLP samples/s
/// and latencies, and the chain's milliseconds, measured as on the GPU.
fn cpu_workloads(s: &str) -> Result<Value> {
    let r = Workloads::run(s, "cpu")?;
    Ok(json!({
        "summary": {
            "w1_matmul_1024_gflops": f(&r.w1, &["compute_gflops"]),
            "w1_matmul_1024_gflops_kept_median": r.w1_kept_gflops(),
            "w2_samples_per_s_batch256": f(&r.w2, &["metrics", "throughput"]),
            "w2_latency_p50_ms_batch1": f(&r.w2_b1, &["metrics", "latency_p50_ns"]) / 1e6,
            "w2_latency_p50_ms_batch64": f(&r.w2_b64, &["metrics", "latency_p50_ns"]) / 1e6,
            "w3_ms_per_chain": r.w3_ms(),
            "w3_ms_per_chain_x_kept": r.w3_kept_ms(),
        },
        "runs": { "w1": r.w1, "w1_kept": r.w1_kept, "w2": r.w2, "w2_batch1": r.w2_b1, "w2_batch64": r.w2_b64, "w3": r.w3, "w3_kept": r.w3_kept },
    }))
}

fn write_report(path: &Path, report: &Value) -> Result<()> {
    std::fs::write(path, serde_json::to_vec_pretty(report)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("report: {}", path.display());
    Ok(())
}

/// W4's batch, and the steps of each run: the first `W4_WARMUP` are excluded, the median
/// of the next `W4_TIMED` is the figure. Few, because the CPU reference device takes
/// seconds per step at batch 256.
const W4_BATCH: usize = 256;
const W4_WARMUP: usize = 2;
const W4_TIMED: usize = 8;

/// The peer's W4 figure: Burn 0.22.1's wgpu backend on lavapipe (Mesa 25.0.7), median of
/// 3 runs, each the median of 15 reps of 20 steps after a warm-up round of 20
/// (5.21 steps/s; where and how it was measured: docs/design.md, "The peer's W4 figure").
const PEER_W4_MS: f64 = 192.0;

/// W4, measured as the peer measures it: one plain SGD step (lr 0.01) of the W2 MLP with
/// softmax cross-entropy on a batch of 256 random samples (features uniform in [0, 1),
/// labels uniform in 0..10), timed from the upload to the updated weights, warm-up steps
/// excluded; in f32 and mixed precision, on the GPU, the fast CPU device and the CPU
/// reference device.
fn w4(sluice: &str, adapters: &Value) -> Result<Value> {
    let dir = std::env::temp_dir().join(format!("sluice-bench-w4-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = w4_in(sluice, adapters, &dir);
    // Best effort: the data is a few megabytes of random numbers in a temp folder.
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// W4's random training and validation data, written into a folder as `.npy` files, and
/// where a run writes its weights.
pub(crate) struct W4Data {
    train: [String; 2],
    val: [String; 2],
    weights: String,
}

impl W4Data {
    /// `W4_WARMUP + timed` batches of training data and one of validation data in `dir`.
    pub(crate) fn write(dir: &Path, timed: usize) -> Result<W4Data> {
        let mut rng = SplitMix64(0x5eed_0004);
        let mut data = |name: &str, samples: usize| -> Result<[String; 2]> {
            let x: Vec<f32> = (0..samples * 784).map(|_| rng.unit()).collect();
            let labels: Vec<i32> = (0..samples).map(|_| (rng.next() % 10) as i32).collect();
            let paths = [
                dir.join(format!("{name}_x.npy")),
                dir.join(format!("{name}_labels.npy")),
            ];
            std::fs::write(&paths[0], npy("<f4", &[samples, 784], &x, f32::to_le_bytes))?;
            std::fs::write(&paths[1], npy("<i4", &[samples], &labels, i32::to_le_bytes))?;
            let [x, labels] = paths.map(|p| p.display().to_string());
            Ok([format!("x={x}"), format!("labels={labels}")])
        };
        Ok(W4Data {
            train: data("train", W4_BATCH * (W4_WARMUP + timed))?,
            // One evaluation pass after the epoch, outside the timed steps.
            val: data("val", W4_BATCH)?,
            weights: dir.join("trained.safetensors").display().to_string(),
        })
    }

    /// One epoch through `sluice train` on `device` at `precision`: the summary of its
    /// steps after the warm-up (`ms_per_step_median` and more) and the run's report.
    pub(crate) fn train(
        &self,
        sluice: &str,
        device: &str,
        precision: &str,
    ) -> Result<(Value, Value)> {
        let batch = W4_BATCH.to_string();
        let mut args = vec!["train", "assets/bench/w4_train.json", "--data"];
        args.extend(self.train.iter().map(String::as_str));
        args.push("--val");
        args.extend(self.val.iter().map(String::as_str));
        args.extend([
            "--epochs",
            "1",
            "--batch",
            &batch,
            "--device",
            device,
            "--precision",
            precision,
            "--output",
            &self.weights,
        ]);
        let r = sluice_json(sluice, &args)?;
        let steps: Vec<f64> = r["step_ms"]
            .as_array()
            .context("sluice train --json gave no step_ms")?
            .iter()
            .filter_map(Value::as_f64)
            .collect();
        let Some(timed) = steps.get(W4_WARMUP..).filter(|t| !t.is_empty()) else {
            bail!("{} steps, none after the warm-up", steps.len());
        };
        let mut sorted = timed.to_vec();
        let median = median(&mut sorted);
        let summary = json!({
            "device": r["device"],
            "ms_per_step_median": median,
            "ms_per_step_mean": timed.iter().sum::<f64>() / timed.len() as f64,
            "ms_per_step_min": sorted[0],
            "ms_per_step_max": sorted[sorted.len() - 1],
            "timed_steps": timed.len(),
            "warmup_steps": W4_WARMUP,
            "warmup_ms": &steps[..W4_WARMUP],
            "loss_scale": r["loss_scale"],
            "skipped_steps": r["skipped_steps"],
        });
        Ok((summary, r))
    }
}

fn w4_in(sluice: &str, adapters: &Value, dir: &Path) -> Result<Value> {
    let data = W4Data::write(dir, W4_TIMED)?;
    let mut summary = serde_json::Map::new();
    let mut runs = serde_json::Map::new();
    for device in ["gpu", "cpu", "reference"] {
        for precision in ["f32", "mixed"] {
            let key = format!("{device}_{precision}");
            match data.train(sluice, device, precision) {
                Ok((s, r)) => {
                    summary.insert(key.clone(), s);
                    runs.insert(key, r);
                }
                Err(e) => {
                    println!("W4 {key}: {e:#}");
                    summary.insert(key, json!({ "error": format!("{e:#}") }));
                }
            }
        }
    }
    let gpu = summary
        .get("gpu_f32")
        .and_then(|r| r["device"].as_str())
        .unwrap_or_default();
    // The adapter the GPU runs used ("llvmpipe (…) (Vulkan)" starts with its name).
    let adapter = adapters["adapters"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|a| a["name"].as_str().is_some_and(|n| gpu.starts_with(n)))
        })
        .cloned()
        .unwrap_or(Value::Null);
    println!(
        "W4 training step: MLP 784-512-512-10, batch {W4_BATCH}, softmax cross-entropy, SGD lr 0.01; \
         ms/step = median of {W4_TIMED} steps after {W4_WARMUP} warm-up steps \
         (each step: upload, forward, backward, readback of loss and gradients, update)"
    );
    println!(
        "  GPU adapter: {} ({}), driver: {}",
        adapter["name"].as_str().unwrap_or(gpu),
        adapter["backend"].as_str().unwrap_or("?"),
        adapter["driver"].as_str().unwrap_or("?")
    );
    for (key, what) in [
        ("gpu_f32", "GPU f32"),
        ("gpu_mixed", "GPU mixed"),
        ("cpu_f32", "fast CPU f32"),
        ("cpu_mixed", "fast CPU mixed"),
        ("reference_f32", "CPU reference f32"),
        ("reference_mixed", "CPU reference mixed"),
    ] {
        let r = &summary[key];
        match r["ms_per_step_median"].as_f64() {
            Some(ms) => println!(
                "  {what:<17} {ms:>8.1} ms/step  (mean {:.1}, min {:.1}, max {:.1})",
                f(r, &["ms_per_step_mean"]),
                f(r, &["ms_per_step_min"]),
                f(r, &["ms_per_step_max"]),
            ),
            None => println!("  {what:<17} failed"),
        }
    }
    println!(
        "  peer's figure: Burn 0.22.1 (wgpu, lavapipe Mesa 25.0.7) {PEER_W4_MS:.0} ms/step, \
         measured on another machine of this kind (median of 3 runs; see docs/design.md, \
         \"The peer's W4 figure\": a reference point, not a side-by-side comparison)"
    );
    summary.insert("adapter".into(), adapter);
    summary.insert(
        "method".into(),
        json!(format!(
            "median of {W4_TIMED} steps after {W4_WARMUP} warm-up steps; batch {W4_BATCH}; random features in [0, 1) and labels in 0..10"
        )),
    );
    summary.insert(
        "peer".into(),
        json!({
            "engine": "Burn 0.22.1, wgpu backend, lavapipe Mesa 25.0.7",
            "ms_per_step": PEER_W4_MS,
            "source": "docs/design.md, \"The peer's W4 figure\"",
        }),
    );
    Ok(json!({ "summary": summary, "runs": runs }))
}

/// `.npy` version 1 bytes of a little-endian array.
fn npy<T: Copy, const N: usize>(
    descr: &str,
    shape: &[usize],
    values: &[T],
    bytes: fn(T) -> [u8; N],
) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = match dims.as_slice() {
        [one] => format!("({one},)"),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6), version (2) and length (2), then the header and a newline: 64-byte aligned.
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for &v in values {
        out.extend_from_slice(&bytes(v));
    }
    out
}

/// SplitMix64, for W4's random data.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 24 bits.
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}
