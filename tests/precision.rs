//! Mixed and f16 precision: every operator against its f32 CPU reference on both 16-bit
//! storage paths, the examples on 1,000 seeded inputs against f32, memory halved, and
//! overflow reported.

use serde_json::json;
use sluice_engine::exec::{RunConfig, RunContext};
use sluice_engine::gpu::GpuExecutable;
use sluice_engine::graph::Graph;
use sluice_engine::plan::{HalfStorage, Plan, PlanOptions, Precision};
use sluice_engine::precision::compare as precision_compare;
use sluice_engine::weights::init_weights;
use sluice_tests::op_cases::op_cases;
use sluice_tests::{case_inputs, compare, gpu, graph, random_weights, root, run_cpu};

/// The documented per-operator tolerance (atol, rtol) of 16-bit storage against the f32
/// reference (docs/precision.md): inputs, weights and results are rounded to f16 (relative
/// 2^-11 each); products and sums accumulate that over their reduction length.
fn tolerance(op: &str) -> (f32, f32) {
    match op {
        "matmul" | "linear" | "conv2d" | "conv2d_grad_input" => (2e-2, 1e-2),
        // The weight gradient sums over samples and positions, like a reduction.
        "reduce_sum" | "conv2d_grad_filter" => (5e-2, 1e-2),
        "layer_norm" | "batch_norm" => (1e-2, 1e-2),
        // A sum of ~30 rounded dy along the axis, times exp(y) up to e: like a reduction.
        "softmax_grad" | "log_softmax_grad" => (1e-2, 1e-2),
        "pow" | "exp" | "div" => (5e-3, 5e-3),
        _ => (3e-3, 3e-3),
    }
}

fn half_paths() -> Vec<(Precision, HalfStorage)> {
    let mut v = vec![(Precision::Mixed, HalfStorage::Packed)];
    if gpu().adapter.shader_f16 {
        v.push((Precision::Mixed, HalfStorage::Native));
        v.push((Precision::F16, HalfStorage::Native));
    }
    v
}

#[test]
fn every_operator_matches_its_f32_reference_in_16_bit_storage() {
    let paths = half_paths();
    if !gpu().adapter.shader_f16 {
        println!("the adapter has no shader-f16: testing the packed path only");
    }
    let mut failures = Vec::new();
    let cases = op_cases();
    for (i, case) in cases.iter().enumerate() {
        if !case.half {
            continue;
        }
        let g = graph(&case.doc);
        // The tolerance of the graph's last operator (the reduction of a prologue case).
        let op = case.doc["nodes"]
            .as_array()
            .and_then(|nodes| nodes.last())
            .and_then(|node| node["op"].as_str())
            .unwrap_or_default()
            .to_string();
        let weights = random_weights(&g, 11 + i as u64);
        let inputs = case_inputs(&g, case, 100 + i as u64);
        let want = run_cpu(&g, &weights, &inputs);
        let (atol, rtol) = tolerance(&op);
        for &(precision, half) in &paths {
            let plan = Plan::with_options(
                &g,
                PlanOptions {
                    fuse: true,
                    precision,
                    half,
                },
            )
            .unwrap();
            let got = pollster::block_on(async {
                let mut exe = GpuExecutable::compile(gpu(), plan, &weights, 1).await?;
                exe.run_once(&inputs).await
            });
            let got = match got {
                Ok(g) => g,
                Err(e) => {
                    failures.push(format!("{} ({precision:?}, {half:?}): {e}", case.label));
                    continue;
                }
            };
            for ((name, a), (_, b)) in got.iter().zip(&want) {
                // Inputs are rounded to f16 first: compare against the reference on the
                // rounded inputs' scale by a tolerance that covers that rounding.
                if let Err(e) = compare(
                    &format!("{} ({precision:?}, {half:?}) {name}", case.label),
                    a,
                    b,
                    atol,
                    rtol,
                ) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!(
        "{} cases x {} 16-bit paths within tolerance",
        cases.len(),
        paths.len()
    );
}

use sluice_tests::load_asset as load;

fn run(
    g: &Graph,
    data: &std::collections::HashMap<String, sluice_engine::Tensor>,
    batch: usize,
    precision: Precision,
    half: Option<HalfStorage>,
) -> Vec<(String, sluice_engine::Tensor)> {
    let weights = init_weights(g, g.doc.params.seed.unwrap_or(0));
    let cfg = RunConfig {
        batch,
        precision,
        half,
        ..Default::default()
    };
    let mut s = sluice_engine::gpu::session(g, &weights, &cfg).unwrap();
    s.run_blocking(data, &RunContext::new("precision"))
        .unwrap()
        .outputs
}

#[test]
fn examples_under_mixed_precision_stay_close_to_f32_on_1000_inputs() {
    for (name, n, batch) in [
        ("mlp", 1000, 1000),
        ("cnn", 1000, 500),
        ("transformer_block", 1000, 250),
    ] {
        let g = load(&format!("assets/graphs/{name}.json"));
        let bound = g
            .bind(&g.symbols().into_iter().map(|s| (s, n)).collect())
            .unwrap();
        let data = sluice_engine::exec::dataset::random_inputs(&bound, 2024).unwrap();
        let reference = run(&g, &data, batch, Precision::F32, None);
        for half in [HalfStorage::Packed, HalfStorage::Native] {
            if half == HalfStorage::Native && !gpu().adapter.shader_f16 {
                continue;
            }
            let mixed = run(&g, &data, batch, Precision::Mixed, Some(half));
            let report = precision_compare(&reference, &mixed);
            for e in &report {
                println!(
                    "{name} ({half:?}): {} max abs {:.3e}, max rel {:.3e}, argmax agreement {:?}, non-finite {}",
                    e.name, e.max_abs, e.max_rel, e.argmax_agreement, e.non_finite
                );
                assert!(
                    e.max_rel < 1e-2,
                    "{name}: max rel error {} ≥ 1e-2",
                    e.max_rel
                );
                assert_eq!(e.non_finite, 0);
                assert_eq!(e.flag, None, "{name}: flagged");
                if let Some(agree) = e.argmax_agreement {
                    // Any disagreement must be a genuine near-tie: the f32 top two differ by
                    // less than twice the largest error.
                    let (r, m) = (&reference[0].1, &mixed[0].1);
                    let c = r.shape[1];
                    let (rv, mv) = (r.as_f32().unwrap(), m.as_f32().unwrap());
                    for row in 0..r.shape[0] {
                        let rs = &rv[row * c..(row + 1) * c];
                        let ms = &mv[row * c..(row + 1) * c];
                        let am = |v: &[f32]| (0..c).max_by(|&i, &j| v[i].total_cmp(&v[j])).unwrap();
                        if am(rs) != am(ms) {
                            let mut sorted = rs.to_vec();
                            sorted.sort_by(|a, b| b.total_cmp(a));
                            let gap = f64::from(sorted[0] - sorted[1]);
                            assert!(
                                gap <= 2.0 * e.max_abs,
                                "{name}: row {row} flipped with an f32 margin of {gap:.3e}"
                            );
                        }
                    }
                    assert!(agree >= 0.95, "{name}: argmax agreement {agree}");
                }
            }
        }
    }
}

#[test]
fn mixed_precision_halves_memory_and_weights() {
    let tb = load("assets/graphs/transformer_block.json");
    let bound = tb.bind(&[("N".to_string(), 64)].into()).unwrap();
    let f32_plan = Plan::new(&bound).unwrap();
    for half in [HalfStorage::Packed, HalfStorage::Native] {
        let mixed = Plan::with_options(
            &bound,
            PlanOptions {
                fuse: true,
                precision: Precision::Mixed,
                half,
            },
        )
        .unwrap();
        let peak = mixed.memory.planned_bytes as f64 / f32_plan.memory.planned_bytes as f64;
        let weights = mixed.memory.weight_bytes as f64 / f32_plan.memory.weight_bytes as f64;
        println!(
            "transformer_block b64 {half:?}: planned peak {:.1}% of f32, weights {:.1}%",
            100.0 * peak,
            100.0 * weights
        );
        assert!(
            peak <= 0.55 && weights <= 0.55,
            "peak {peak}, weights {weights}"
        );
    }
}

#[test]
fn f16_overflow_is_reported_not_hidden() {
    let g = graph(&json!({
        "format": "sluice/graph@1",
        "inputs": { "x": { "shape": [4, 8] } },
        "nodes": [
            { "id": "big", "op": "constant", "attrs": { "value": [1.0e6], "shape": [] } },
            { "id": "y", "op": "mul", "inputs": ["x", "big"] },
            { "id": "z", "op": "exp", "inputs": ["y"] }
        ],
        "outputs": ["z"]
    }));
    let inputs = sluice_engine::exec::dataset::random_inputs(&g, 1).unwrap();
    let plan = Plan::with_options(
        &g,
        PlanOptions {
            fuse: false,
            precision: Precision::Mixed,
            half: HalfStorage::Packed,
        },
    )
    .unwrap();
    let out = pollster::block_on(async {
        GpuExecutable::compile(gpu(), plan, &Default::default(), 1)
            .await?
            .run_once(&inputs)
            .await
    })
    .unwrap();
    assert!(
        out[0].1.non_finite() > 0,
        "values beyond the f16 range must show as non-finite"
    );
    let reference = run_cpu(&g, &Default::default(), &inputs);
    let report = precision_compare(&reference, &out);
    assert_eq!(report[0].non_finite, out[0].1.non_finite());
}

#[test]
fn cli_precision_report_f16_npy_in_and_out() {
    let dir = std::env::temp_dir().join(format!("sluice-prec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let x = sluice_engine::Tensor::f32(
        vec![3, 784],
        (0..3 * 784).map(|i| ((i % 7) as f32) / 8.0).collect(),
    );
    std::fs::write(
        dir.join("x.npy"),
        sluice_engine::npy::to_bytes_f16(&x).unwrap(),
    )
    .unwrap();
    let out = sluice_tests::sluice()
        .args([
            "run",
            root().join("assets/graphs/mlp.json").to_str().unwrap(),
            "--precision",
            "mixed",
            "--output-dtype",
            "f16",
            "--json",
            "--input",
        ])
        .arg(format!("x={}", dir.join("x.npy").display()))
        .arg("--output")
        .arg(dir.join("out"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rel = doc["precision_report"][0]["max_rel"].as_f64().unwrap();
    assert!(rel < 1e-2, "max rel {rel}");
    let bytes = std::fs::read(dir.join("out/probs.npy")).unwrap();
    assert!(
        String::from_utf8_lossy(&bytes[..64]).contains("'<f2'"),
        "output is not float16"
    );
    let t = sluice_engine::npy::parse(&bytes).unwrap();
    assert_eq!(t.shape, vec![3, 10]);
    let out = sluice_tests::sluice()
        .args([
            "bench",
            root().join("assets/bench/w2_mlp.json").to_str().unwrap(),
            "--batch",
            "8",
            "--reps",
            "2",
            "--precision",
            "mixed",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("side by side") && text.contains("planned peak MiB"),
        "{text}"
    );
}

/// A melspectrogram-like front end (issue 34): int16-scale samples squared (`pow` 2 or
/// `mul` by themselves; about 1.07e9, far past f16's 65504), summed over 8 triangular
/// frequency bands by a matmul, then 10·log10 floored at −100 dB. `square` picks the op.
fn melspectrogram(square: &str) -> Graph {
    let (bins, bands) = (64usize, 8usize);
    let mut fb = vec![0.0f32; bins * bands];
    for band in 0..bands {
        let centre = 4 + band * 7;
        for k in 0..bins {
            let d = (k as f32 - centre as f32).abs();
            fb[k * bands + band] = (1.0 - d / 4.0).max(0.0);
        }
    }
    let squared = match square {
        "pow" => json!({ "id": "power", "op": "pow", "inputs": ["x", "two"] }),
        _ => json!({ "id": "power", "op": "mul", "inputs": ["x", "x"] }),
    };
    graph(&json!({
        "format": "sluice/graph@1",
        "inputs": { "x": { "shape": ["N", bins] } },
        "nodes": [
            { "id": "two", "op": "constant", "attrs": { "value": [2.0], "shape": [] } },
            squared,
            { "id": "fb", "op": "constant", "attrs": { "value": fb, "shape": [bins, bands] } },
            { "id": "mel", "op": "matmul", "inputs": ["power", "fb"] },
            { "id": "eps", "op": "constant", "attrs": { "value": [1.0e-10], "shape": [] } },
            { "id": "shifted", "op": "add", "inputs": ["mel", "eps"] },
            { "id": "ln", "op": "log", "inputs": ["shifted"] },
            { "id": "ten_over_ln10", "op": "constant", "attrs": { "value": [4.342_944_8], "shape": [] } },
            { "id": "decibels", "op": "mul", "inputs": ["ln", "ten_over_ln10"] },
            { "id": "floor", "op": "constant", "attrs": { "value": [-100.0], "shape": [] } },
            { "id": "db", "op": "max", "inputs": ["decibels", "floor"] }
        ],
        "outputs": ["db"]
    }))
}

/// Int16-scale audio samples: [n, 64] of a few tones, clipped to ±32767.
fn int16_samples(n: usize) -> std::collections::HashMap<String, sluice_engine::Tensor> {
    let v: Vec<f32> = (0..n * 64)
        .map(|i| {
            let t = i as f32;
            (32767.0 * (0.9 * (t * 0.37).sin() + 0.3 * (t * 1.91).cos()))
                .clamp(-32767.0, 32767.0)
                .round()
        })
        .collect();
    [("x".to_string(), sluice_engine::Tensor::f32(vec![n, 64], v))].into()
}

/// The melspectrogram under `precision` on a GPU or CPU session (batch `n`).
fn melspectrogram_run(
    g: &Graph,
    n: usize,
    precision: Precision,
    half: Option<HalfStorage>,
    on_gpu: bool,
) -> sluice_engine::exec::RunReport {
    let cfg = RunConfig {
        batch: n,
        precision,
        half,
        ..Default::default()
    };
    let weights = Default::default();
    let mut s = if on_gpu {
        sluice_engine::gpu::session(g, &weights, &cfg)
    } else {
        sluice_engine::cpu::session(g, &weights, &cfg)
    }
    .unwrap();
    s.run_blocking(&int16_samples(n), &RunContext::new("melspectrogram"))
        .unwrap()
}

#[test]
fn melspectrogram_under_mixed_precision_matches_f32_on_gpu_and_cpu() {
    let n = 16;
    for square in ["pow", "mul"] {
        let g = melspectrogram(square);
        let bound = g.bind(&[("N".to_string(), n)].into()).unwrap();
        let reference = run_cpu(&bound, &Default::default(), &int16_samples(n));
        let mut runs = vec![
            ("cpu", false, None),
            ("gpu packed", true, Some(HalfStorage::Packed)),
        ];
        if gpu().adapter.shader_f16 {
            runs.push(("gpu native", true, Some(HalfStorage::Native)));
        }
        for (label, on_gpu, half) in runs {
            let report = melspectrogram_run(&g, n, Precision::Mixed, half, on_gpu);
            let errors =
                sluice_engine::precision::compare_at(&reference, &report.outputs, Precision::Mixed);
            let e = &errors[0];
            println!(
                "{square} on {label}: max abs {:.3e}, max rel {:.3e}, non-finite {}",
                e.max_abs, e.max_rel, e.non_finite
            );
            let db = report.outputs[0].1.as_f32().unwrap();
            assert!(
                db.iter().all(|&v| v > -100.0),
                "{square} on {label}: floored at -100 dB: {:?}",
                &db[..8]
            );
            assert_eq!(e.non_finite, 0, "{square} on {label}");
            assert!(
                e.flag.is_none()
                    && e.max_rel < sluice_engine::precision::max_rel_tolerance(Precision::Mixed),
                "{square} on {label}: {:?} (max rel {})",
                e.flag,
                e.max_rel
            );
        }
    }
}

#[test]
fn values_kept_in_f32_are_listed_with_their_reason_and_range() {
    use sluice_engine::exec::config::{Calibration, KeepReason};
    // `mul` is not on the operator list: only the calibration can keep its square in f32.
    let g = melspectrogram("mul");
    let report = melspectrogram_run(&g, 8, Precision::Mixed, Some(HalfStorage::Packed), true);
    let policy = report
        .half_policy
        .expect("a mixed run reports its 16-bit policy");
    assert_eq!(policy.calibration, Calibration::Measured { samples: 8 });
    let kept = |v: &str| policy.kept.iter().find(|k| k.value == v);
    let power = kept("power").expect("the squared samples are kept in f32");
    assert_eq!(power.reason, KeepReason::Overflow);
    assert!(power.max_abs.is_some_and(|m| m > 1e8), "{power:?}");
    let mel = kept("mel").expect("the band sums are kept in f32");
    assert_eq!(mel.reason, KeepReason::Overflow);
    assert_eq!(kept("ln").map(|k| k.reason), Some(KeepReason::Operator));
    // The decibels (at most ~100) fit f16 and stay 16-bit.
    assert!(kept("db").is_none() && kept("decibels").is_none());
    let lines = policy.describe().join("\n");
    assert!(
        lines.contains("'power'") && lines.contains("overflow") && lines.contains("calibrated"),
        "{lines}"
    );
    // The f32 run has no 16-bit policy to report.
    let f32_report = melspectrogram_run(&g, 8, Precision::F32, None, true);
    assert!(f32_report.half_policy.is_none());
    // Precision f16 keeps the same values in f32 (its sums still accumulate in f16).
    if gpu().adapter.shader_f16 {
        let f16_report = melspectrogram_run(&g, 8, Precision::F16, Some(HalfStorage::Native), true);
        let f16_policy = f16_report
            .half_policy
            .expect("an f16 run reports its policy");
        assert_eq!(f16_policy.kept, policy.kept);
    }
}

#[test]
fn precision_report_flags_an_output_kept_in_16_bits_that_overflows() {
    let g = melspectrogram("pow");
    let bound = g.bind(&[("N".to_string(), 4)].into()).unwrap();
    let inputs = int16_samples(4);
    let reference = run_cpu(&bound, &Default::default(), &inputs);
    // Every value forced to 16 bits (no policy): the squares overflow.
    let plan = Plan::with_options(
        &bound,
        PlanOptions {
            fuse: true,
            precision: Precision::Mixed,
            half: HalfStorage::Packed,
        },
    )
    .unwrap();
    let got = pollster::block_on(async {
        GpuExecutable::compile(gpu(), plan, &Default::default(), 1)
            .await?
            .run_once(&inputs)
            .await
    })
    .unwrap();
    let e = &sluice_engine::precision::compare_at(&reference, &got, Precision::Mixed)[0];
    println!("forced 16-bit: {e:?}");
    let flag = e.flag.as_deref().expect("an overflowed output is flagged");
    assert!(flag.contains("finite"), "{flag}");
    assert!(e.max_rel > 1.0, "{e:?}");

    // Wrong but finite: the overflowed square's log capped at 30, unfused so the square
    // is stored in 16 bits. No element is non-finite; the error flags it.
    let g = graph(&json!({
        "format": "sluice/graph@1",
        "inputs": { "x": { "shape": [4, 64] } },
        "nodes": [
            { "id": "power", "op": "mul", "inputs": ["x", "x"] },
            { "id": "ln", "op": "log", "inputs": ["power"] },
            { "id": "cap", "op": "constant", "attrs": { "value": [30.0], "shape": [] } },
            { "id": "capped", "op": "min", "inputs": ["ln", "cap"] }
        ],
        "outputs": ["capped"]
    }));
    let reference = run_cpu(&g, &Default::default(), &inputs);
    let plan = Plan::with_options(
        &g,
        PlanOptions {
            fuse: false,
            precision: Precision::Mixed,
            half: HalfStorage::Packed,
        },
    )
    .unwrap();
    let got = pollster::block_on(async {
        GpuExecutable::compile(gpu(), plan, &Default::default(), 1)
            .await?
            .run_once(&inputs)
            .await
    })
    .unwrap();
    let e = &sluice_engine::precision::compare_at(&reference, &got, Precision::Mixed)[0];
    println!("wrong but finite: {e:?}");
    assert_eq!(e.non_finite, 0, "{e:?}");
    let flag = e
        .flag
        .as_deref()
        .expect("a wrong but finite output is flagged");
    assert!(flag.contains("tolerance"), "{flag}");
}
