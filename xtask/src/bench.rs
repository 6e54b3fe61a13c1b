//! `cargo xtask bench`: the design note's workloads (`docs/design.md`), measured side by side in one run, written
//! as one JSON report with the machine and driver named. Nothing here asserts speed; the
//! report says what was measured.

use crate::run;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn sluice_json(sluice: &str, args: &[&str]) -> Result<Value> {
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

fn f(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = match p.parse::<usize>() {
            Ok(i) => &cur[i],
            Err(_) => &cur[*p],
        };
    }
    cur.as_f64().unwrap_or(f64::NAN)
}

/// Runs every workload and writes the report into the target folder (`CARGO_TARGET_DIR`
/// where set, as cargo builds there).
pub fn bench(root: &Path) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(&cargo, &["build", "--release", "-p", "sluice-server"])?;
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |t| root.join(t));
    let bin = target.join("release/sluice");
    let s = bin.to_str().context("non-UTF-8 path")?;
    let devices = sluice_json(s, &["devices"])?;
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
    let w2_b1 = sluice_json(s, &["bench", &g("w2_mlp"), "--batch", "1", "--reps", "20"])?;
    let w2_b64 = sluice_json(s, &["bench", &g("w2_mlp"), "--batch", "64", "--reps", "20"])?;
    // W3: 32 elementwise ops and a sum over 2^20 floats, fused and not.
    let w3 = sluice_json(s, &["bench", &g("w3_chain"), "--reps", "20"])?;
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
        "w3_fusion_speedup": w3_unfused / w3_fused,
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
        "machine": { "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), "adapters": devices },
        "summary": summary,
        "runs": { "w1": w1, "w2_prefetch2": w2, "w2_prefetch1": w2_k1, "w2_batch1": w2_b1, "w2_batch64": w2_b64,
                  "w3_fused": w3, "w3_unfused": w3_nf, "w5_single": single, "w5_two_stage": w5, "w5_stream": w5_stream,
                  "transformer_b64": tb, "transformer_b64_unfused": tb_nf, "transformer_b64_mixed": tb_mixed,
                  "mixed": mixed.iter().map(|(st, a, b)| json!({ "f16_storage": st, "w1": a, "w2": b })).collect::<Vec<_>>() },
    });
    let path = target.join("bench-report.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&report)?)?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    println!("report: {}", path.display());
    Ok(())
}
