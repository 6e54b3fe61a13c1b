//! Efficient execution: fusion, memory planning, batching, prefetch and pipelines give the
//! same numbers as the plain single-device run and the CPU reference; plans never let two
//! live tensors share a buffer; traces are well formed.

use serde_json::{json, Value};
use sluice_engine::exec::dataset::random_inputs;
use sluice_engine::exec::{Concurrency, RunConfig, RunContext, Session};
use sluice_engine::gpu::GpuExecutable;
use sluice_engine::graph::Graph;
use sluice_engine::plan::{Plan, PlanOptions, ValueKind};
use sluice_engine::telemetry::trace::chrome_trace;
use sluice_engine::weights::init_weights;
use sluice_engine::{Tensor, TensorData};
use sluice_tests::{compare, gpu, graph, root, run_cpu};
use std::collections::{BTreeMap, HashMap};

use sluice_tests::{bind_all as bind, load_asset as load};

/// Walks a plan's steps and checks that every buffer a step reads still holds the value
/// it expects (no other value was written there since), and that outputs survive until
/// readback. An in-place step reads its input from the buffer it overwrites.
fn check_buffers(plan: &Plan) -> Result<(), String> {
    let mut owner: HashMap<usize, usize> = HashMap::new();
    for v in &plan.values {
        if v.kind != ValueKind::Intermediate {
            owner.insert(v.buffer, v.storage);
        }
    }
    for (t, step) in plan.steps.iter().enumerate() {
        for &v in step.inputs.iter().chain(&step.params) {
            let val = &plan.values[v];
            if owner.get(&val.buffer) != Some(&val.storage) {
                return Err(format!(
                    "step {t} ({}) reads '{}' from buffer {} which holds another tensor",
                    step.label(),
                    val.name,
                    val.buffer
                ));
            }
        }
        for &v in &step.outputs {
            owner.insert(plan.values[v].buffer, plan.values[v].storage);
        }
    }
    for (name, v) in &plan.outputs {
        let val = &plan.values[*v];
        if owner.get(&val.buffer) != Some(&val.storage) {
            return Err(format!("output '{name}' was overwritten before readback"));
        }
    }
    Ok(())
}

/// A random graph of elementwise chains, matmuls, linears, reshapes and reductions.
fn random_graph(seed: u64) -> Value {
    let mut rng = sluice_engine::rng::Rng::new(seed);
    let mut nodes = Vec::new();
    let mut avail: Vec<String> = vec!["x".into(), "y".into()];
    let n = 4 + rng.below(14) as usize;
    for i in 0..n {
        let id = format!("n{i}");
        let pick = |rng: &mut sluice_engine::rng::Rng, avail: &Vec<String>| {
            avail[rng.below(avail.len() as u64) as usize].clone()
        };
        let a = pick(&mut rng, &avail);
        let node = match rng.below(9) {
            0 => json!({ "id": id, "op": "relu", "inputs": [a] }),
            1 => json!({ "id": id, "op": "add", "inputs": [a, pick(&mut rng, &avail)] }),
            2 => json!({ "id": id, "op": "mul", "inputs": [a, "k"] }),
            3 => json!({ "id": id, "op": "linear", "inputs": [a], "attrs": { "out_features": 8 } }),
            4 => json!({ "id": id, "op": "sigmoid", "inputs": [a] }),
            5 => json!({ "id": id, "op": "matmul", "inputs": [a, "w"] }),
            6 => json!({ "id": id, "op": "sub", "inputs": [a, "row"] }),
            7 => json!({ "id": id, "op": "tanh", "inputs": [a] }),
            _ => json!({ "id": id, "op": "softmax", "inputs": [a] }),
        };
        nodes.push(node);
        avail.push(id);
    }
    nodes.push(json!({ "id": "k", "op": "constant", "attrs": { "value": [0.5], "shape": [] } }));
    let outs: Vec<String> = avail
        .iter()
        .rev()
        .take(1 + rng.below(3) as usize)
        .cloned()
        .collect();
    json!({
        "format": "sluice/graph@1",
        "inputs": { "x": { "shape": [5, 8] }, "y": { "shape": [5, 8] }, "w": { "shape": [8, 8] }, "row": { "shape": [8] } },
        "nodes": nodes,
        "outputs": outs,
    })
}

#[test]
fn random_graphs_plan_safely_and_fusion_keeps_results() {
    for seed in 0..40 {
        let g = graph(&random_graph(seed));
        let weights = init_weights(&g, seed);
        let inputs = random_inputs(&g, seed).unwrap();
        let cpu = run_cpu(&g, &weights, &inputs);
        for fuse in [true, false] {
            let plan = Plan::with_options(
                &g,
                PlanOptions {
                    fuse,
                    ..Default::default()
                },
            )
            .unwrap();
            check_buffers(&plan).unwrap_or_else(|e| panic!("seed {seed} fuse {fuse}: {e}"));
            let mut exe =
                pollster::block_on(GpuExecutable::compile(gpu(), plan, &weights, 1)).unwrap();
            let got = pollster::block_on(exe.run_once(&inputs)).unwrap();
            for ((name, a), (_, b)) in got.iter().zip(&cpu) {
                compare(&format!("seed {seed} fuse {fuse} {name}"), a, b, 1e-4, 1e-4).unwrap();
            }
        }
    }
}

#[test]
fn fusion_and_memory_planning_shrink_the_examples() {
    let tb = bind(&load("assets/graphs/transformer_block.json"), 64);
    let fused = Plan::new(&tb).unwrap();
    let unfused = Plan::with_options(
        &tb,
        PlanOptions {
            fuse: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        fused.steps.len() < unfused.steps.len(),
        "fusion removed no pass"
    );
    check_buffers(&fused).unwrap();
    check_buffers(&unfused).unwrap();
    let ratio = fused.memory.planned_bytes as f64 / fused.memory.naive_bytes as f64;
    assert!(
        ratio <= 0.6,
        "transformer_block at batch 64: planned peak is {:.0}% of the naive sum",
        100.0 * ratio
    );
    let w3 = bind(&load("assets/bench/w3_chain.json"), 1);
    let p = Plan::new(&w3).unwrap();
    assert_eq!(
        p.steps.len(),
        1,
        "W3 should be one sum computing its fused chain as it reads: {:?}",
        p.steps.iter().map(|s| s.label()).collect::<Vec<_>>()
    );
}

fn dataset(g: &Graph, n: usize, seed: u64) -> HashMap<String, Tensor> {
    random_inputs(&bind(g, n), seed).unwrap()
}

#[test]
fn batches_microbatches_and_prefetch_keep_outputs_in_order() {
    let g = load("assets/graphs/mlp.json");
    let weights = init_weights(&g, 42);
    let data = dataset(&g, 23, 4);
    let want = run_cpu(&bind(&g, 23), &weights, &data);
    // Both ways inputs reach a GPU: in place (lavapipe's default) and through upload
    // buffers, several micro-batches in flight.
    for device in ["gpu", "gpu-staged"] {
        for (batch, micro, prefetch) in [(8, 1, 1), (8, 4, 2), (6, 3, 3), (23, 1, 2)] {
            let cfg = RunConfig {
                batch,
                microbatches: micro,
                stages: 1,
                prefetch,
                fuse: true,
                profile: false,
                ..Default::default()
            };
            let mut s = session_on(device, &g, &weights, &cfg);
            // Twice: the second run writes the mapped buffers the first one left.
            for run in 0..2 {
                let r = s.run_blocking(&data, &RunContext::new("t")).unwrap();
                compare(
                    &format!("{device} batch {batch} micro {micro} prefetch {prefetch} run {run}"),
                    &r.outputs[0].1,
                    &want[0].1,
                    1e-6,
                    1e-4,
                )
                .unwrap();
            }
        }
    }
}

#[test]
fn a_cpu_adapter_writes_inputs_in_place() {
    // lavapipe (a Vulkan CPU adapter) offers mappable device buffers; elsewhere, and on
    // real GPUs, inputs go through upload buffers.
    let ctx = gpu();
    if ctx.adapter.device_type == "Cpu" && ctx.adapter.backend == "Vulkan" {
        assert!(ctx.inputs_in_place(), "{:?}", ctx.adapter);
    }
    assert!(!ctx.clone().with_staged_inputs().inputs_in_place());
}

fn w5_outputs(
    stages: usize,
    micro: usize,
    data: &HashMap<String, Tensor>,
) -> (Vec<(String, Tensor)>, Value) {
    let g = load("assets/bench/w5_pipeline.json");
    let weights = init_weights(&g, 1);
    let cfg = RunConfig {
        batch: 16,
        microbatches: micro,
        stages,
        prefetch: 2,
        fuse: true,
        profile: false,
        ..Default::default()
    };
    let mut s = sluice_engine::gpu::session(&g, &weights, &cfg).unwrap();
    let r = s.run_blocking(data, &RunContext::new("w5")).unwrap();
    let trace = chrome_trace(&r.events, &s.device_names());
    (r.outputs, trace)
}

#[test]
fn two_stage_pipelines_equal_the_single_device_run() {
    let g = load("assets/bench/w5_pipeline.json");
    let data = dataset(&g, 32, 7);
    let (single, _) = w5_outputs(1, 1, &data);
    for micro in [1, 2, 4, 8] {
        let (two, _) = w5_outputs(2, micro, &data);
        assert_eq!(two[0].1.shape, single[0].1.shape);
        assert_eq!(two[0].1, single[0].1, "S=2, M={micro} differs from S=1");
    }
}

/// A session on the GPU run on one thread, every wait awaited (what browsers run).
fn one_thread(
    g: &Graph,
    weights: &sluice_engine::weights::Weights,
    cfg: &RunConfig,
    data: &HashMap<String, Tensor>,
) -> sluice_engine::exec::RunReport {
    pollster::block_on(async {
        let devices = sluice_engine::gpu::GpuDevice::open_many(cfg.stages)
            .await
            .unwrap()
            .into_iter()
            .map(|d| Box::new(d) as Box<dyn sluice_engine::exec::Device>)
            .collect();
        let mut session = Session::compile(g, weights, cfg, devices, &|_| {})
            .await
            .unwrap();
        let ctx = RunContext {
            concurrency: Concurrency::OneThread,
            ..RunContext::new("async")
        };
        session.run(data, &ctx).await.unwrap()
    })
}

#[test]
fn the_one_thread_async_session_equals_the_threaded_one() {
    // What browsers run (every loop on one thread, each GPU wait awaited) gives the
    // threaded session's outputs and one compute block per stage and micro-batch.
    let g = load("assets/bench/w5_pipeline.json");
    let data = dataset(&g, 32, 9);
    let weights = init_weights(&g, 1);
    for (stages, micro) in [(1, 1), (1, 4), (2, 4)] {
        let cfg = RunConfig {
            batch: 16,
            microbatches: micro,
            stages,
            ..Default::default()
        };
        let mut native = sluice_engine::gpu::session(&g, &weights, &cfg).unwrap();
        let want = native
            .run_blocking(&data, &RunContext::new("native"))
            .unwrap();
        let got = one_thread(&g, &weights, &cfg, &data);
        assert_eq!(got.outputs, want.outputs, "S={stages}, M={micro}");
        assert_eq!(got.micro_batches, 2 * micro);
        let blocks: std::collections::BTreeSet<(usize, usize)> = got
            .events
            .iter()
            .filter(|e| e.kind == sluice_engine::telemetry::EventKind::Compute)
            .map(|e| (e.stage, e.micro_batch))
            .collect();
        assert_eq!(blocks.len(), stages * 2 * micro, "S={stages}, M={micro}");
    }
}

#[test]
fn a_leftover_partial_micro_batch_runs_the_same_everywhere() {
    // 30 samples in micro-batches of 4: seven whole ones and a last one of 2 samples,
    // padded to 4 and trimmed again. The threaded GPU session, the one-thread session and
    // the CPU device through the same driver all give the CPU reference's answer.
    let g = load("assets/bench/w5_pipeline.json");
    let weights = init_weights(&g, 1);
    let data = dataset(&g, 30, 3);
    let want = run_cpu(&bind(&g, 30), &weights, &data);
    for stages in [1, 2] {
        let cfg = RunConfig {
            batch: 16,
            microbatches: 4,
            stages,
            ..Default::default()
        };
        let threaded = sluice_engine::gpu::session(&g, &weights, &cfg)
            .unwrap()
            .run_blocking(&data, &RunContext::new("threaded"))
            .unwrap();
        let single = one_thread(&g, &weights, &cfg, &data);
        let cpu = sluice_engine::cpu::session(&g, &weights, &cfg)
            .unwrap()
            .run_blocking(&data, &RunContext::new("cpu"))
            .unwrap();
        for (what, r) in [
            ("threaded", &threaded),
            ("one thread", &single),
            ("cpu device", &cpu),
        ] {
            assert_eq!(r.micro_batches, 8, "{what}, S={stages}");
            assert_eq!(r.outputs[0].1.shape, want[0].1.shape, "{what}, S={stages}");
            compare(
                &format!("{what}, S={stages}"),
                &r.outputs[0].1,
                &want[0].1,
                1e-5,
                1e-4,
            )
            .unwrap();
        }
        assert_eq!(threaded.outputs, single.outputs, "S={stages}");
    }
}

#[test]
fn pipeline_trace_is_well_formed() {
    let g = load("assets/bench/w5_pipeline.json");
    let data = dataset(&g, 32, 8);
    let (_, trace) = w5_outputs(2, 4, &data);
    check_trace(&trace, 2, 8);
}

/// A trace slice: start, end, name.
type Slice = (f64, f64, String);

/// One compute track per (device, stage); slices on a track nest properly; timestamps
/// never go backwards; every micro-batch appears on every stage.
fn check_trace(trace: &Value, stages: usize, micro_batches: usize) {
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let mut tracks: BTreeMap<(u64, u64), Vec<Slice>> = BTreeMap::new();
    let mut names: BTreeMap<(u64, u64), String> = BTreeMap::new();
    let mut last_ts = f64::MIN;
    for e in events {
        let (pid, tid) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap_or(0));
        match e["ph"].as_str().unwrap() {
            "M" => {
                if e["name"] == "thread_name" {
                    names.insert((pid, tid), e["args"]["name"].as_str().unwrap().to_string());
                }
            }
            "X" => {
                let ts = e["ts"].as_f64().unwrap();
                assert!(ts >= last_ts, "timestamps go backwards at {e}");
                last_ts = ts;
                let dur = e["dur"].as_f64().unwrap();
                assert!(dur >= 0.0);
                tracks.entry((pid, tid)).or_default().push((
                    ts,
                    ts + dur,
                    e["name"].as_str().unwrap().to_string(),
                ));
            }
            other => panic!("unexpected phase {other}"),
        }
    }
    let compute_tracks: Vec<&(u64, u64)> = names
        .iter()
        .filter(|(_, n)| n.contains("compute"))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        compute_tracks.len(),
        stages,
        "one compute track per device and stage: {names:?}"
    );
    let devices: std::collections::BTreeSet<u64> = compute_tracks.iter().map(|k| k.0).collect();
    assert_eq!(devices.len(), stages, "each stage on its own device");
    for (key, slices) in &tracks {
        // Proper nesting: a slice starting inside another ends inside it.
        let mut stack: Vec<(f64, f64)> = Vec::new();
        let eps = 1e-3;
        for &(s, e, ref name) in slices {
            while stack.last().is_some_and(|&(_, pe)| s >= pe - eps) {
                stack.pop();
            }
            if let Some(&(_, pe)) = stack.last() {
                assert!(
                    e <= pe + eps,
                    "slice {name} [{s}, {e}] on track {key:?} overlaps its parent ending at {pe}"
                );
            }
            stack.push((s, e));
        }
    }
    for k in compute_tracks {
        let present: std::collections::BTreeSet<String> = tracks[k]
            .iter()
            .filter(|(_, _, n)| n.starts_with("micro-batch "))
            .map(|(_, _, n)| n.clone())
            .collect();
        for m in 0..micro_batches {
            assert!(
                present.contains(&format!("micro-batch {m}")),
                "micro-batch {m} missing on track {k:?}"
            );
        }
    }
}

#[test]
fn cli_plan_bench_and_trace() {
    let dir = std::env::temp_dir().join(format!("sluice-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.json");
    let graph = root().join("assets/bench/w5_pipeline.json");
    let out = sluice_tests::sluice()
        .args([
            "bench",
            graph.to_str().unwrap(),
            "--batch",
            "16",
            "--microbatches",
            "4",
            "--stages",
            "2",
            "--reps",
            "2",
            "--json",
            "--trace",
        ])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let b = doc["metrics"]["bubble_fraction"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&b));
    // Two batches of four micro-batches stream as eight: the ideal bubble is (S−1)/(M+S−1)
    // over all eight.
    assert!((doc["metrics"]["ideal_bubble"].as_f64().unwrap() - 1.0 / 9.0).abs() < 1e-9);
    assert_eq!(doc["metrics"]["devices"].as_array().unwrap().len(), 2);
    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    check_trace(&t, 2, 8);
    let out = sluice_tests::sluice()
        .args([
            "plan",
            root()
                .join("assets/graphs/transformer_block.json")
                .to_str()
                .unwrap(),
            "--batch",
            "64",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("planned peak") && text.contains("buffers:"),
        "{text}"
    );
    let data = dir.join("data.npy");
    let x: Vec<f32> = (0..10 * 784).map(|i| (i % 13) as f32 / 13.0).collect();
    std::fs::write(
        &data,
        sluice_engine::npy::to_bytes(&Tensor {
            shape: vec![10, 784],
            data: TensorData::F32(x),
        })
        .unwrap(),
    )
    .unwrap();
    let out = sluice_tests::sluice()
        .args([
            "run",
            root().join("assets/graphs/mlp.json").to_str().unwrap(),
            "--batch",
            "4",
            "--microbatches",
            "2",
            "--json",
            "--input",
        ])
        .arg(format!("x={}", data.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        doc["outputs"][0]["shape"],
        json!([10, 10]),
        "a 10-sample dataset gives 10 rows"
    );
}

#[test]
fn events_are_observed_live_as_the_run_goes() {
    let g = load("assets/bench/w5_pipeline.json");
    let weights = init_weights(&g, 1);
    let data = dataset(&g, 16, 3);
    for stages in [1, 2] {
        let cfg = RunConfig {
            batch: 16,
            microbatches: 4,
            stages,
            ..Default::default()
        };
        let mut s = sluice_engine::gpu::session(&g, &weights, &cfg).unwrap();
        let seen = std::sync::Mutex::new(Vec::new());
        let observe = |e: &sluice_engine::telemetry::Event| seen.lock().unwrap().push(e.clone());
        let ctx = RunContext {
            observer: Some(&observe),
            ..RunContext::new("live")
        };
        let r = s.run_blocking(&data, &ctx).unwrap();
        let seen = seen.into_inner().unwrap();
        assert_eq!(
            seen.len(),
            r.events.len(),
            "S={stages}: every event is observed"
        );
        let stages_seen: std::collections::BTreeSet<usize> = seen.iter().map(|e| e.stage).collect();
        assert_eq!(stages_seen.len(), stages);
        assert!(seen
            .iter()
            .all(|e| e.run == "live" && e.end_ns >= e.start_ns));
    }
}

#[test]
fn a_warm_up_pass_is_marked_and_leaves_the_run_unchanged() {
    // A newly compiled session's warm-up sends micro-batch 0 through every stage once:
    // every event marked and observed. The measured run after it has no warm-up event
    // and the outputs of a session that never warmed up.
    let g = load("assets/bench/w5_pipeline.json");
    let weights = init_weights(&g, 1);
    let data = dataset(&g, 16, 3);
    let cfg = RunConfig {
        batch: 16,
        microbatches: 4,
        stages: 2,
        ..Default::default()
    };
    let want = sluice_engine::gpu::session(&g, &weights, &cfg)
        .unwrap()
        .run_blocking(&data, &RunContext::new("cold"))
        .unwrap();
    let mut s = sluice_engine::gpu::session(&g, &weights, &cfg).unwrap();
    let seen = std::sync::Mutex::new(Vec::new());
    let observe = |e: &sluice_engine::telemetry::Event| seen.lock().unwrap().push(e.clone());
    let ctx = RunContext {
        observer: Some(&observe),
        ..RunContext::new("warm")
    };
    let warm = s.warm_up_blocking(&data, &ctx).unwrap();
    assert!(warm.iter().all(|e| e.warm_up && e.micro_batch == 0));
    let warm_stages: std::collections::BTreeSet<usize> = warm
        .iter()
        .filter(|e| e.kind == sluice_engine::telemetry::EventKind::Compute)
        .map(|e| e.stage)
        .collect();
    assert_eq!(warm_stages.len(), 2, "the warm-up reaches every stage");
    let got = s.run_blocking(&data, &ctx).unwrap();
    assert_eq!(got.outputs, want.outputs);
    assert_eq!(got.micro_batches, 4);
    assert!(got.events.iter().all(|e| !e.warm_up));
    assert_eq!(
        seen.into_inner().unwrap().len(),
        warm.len() + got.events.len()
    );
    // On the wire a measured event says nothing of warm-ups (older readers read it).
    assert!(serde_json::to_value(&got.events[0])
        .unwrap()
        .get("warm_up")
        .is_none());
    assert_eq!(serde_json::to_value(&warm[0]).unwrap()["warm_up"], true);
}

/// Runs `g` at `batch` on one fast CPU device, fused or not, through a session.
fn run_fast_cpu(
    g: &Graph,
    weights: &sluice_engine::weights::Weights,
    data: &HashMap<String, Tensor>,
    batch: usize,
    fuse: bool,
) -> Vec<(String, Tensor)> {
    let cfg = RunConfig {
        batch,
        fuse,
        ..Default::default()
    };
    let device = Box::new(sluice_engine::cpu::CpuDevice::fast());
    let mut s = Session::compile_blocking(g, weights, &cfg, vec![device]).unwrap();
    s.run_blocking(data, &RunContext::new("fast cpu"))
        .unwrap()
        .outputs
}

#[test]
fn the_fast_cpu_device_gives_the_references_answers() {
    // Random graphs of matmuls, linears, elementwise chains (scalar and row broadcasts),
    // sums and softmax, fused and not: the GEMM and the fused loops against the reference.
    for seed in 0..40 {
        let g = graph(&random_graph(seed));
        let weights = init_weights(&g, seed);
        let inputs = random_inputs(&g, seed).unwrap();
        let want = run_cpu(&g, &weights, &inputs);
        for fuse in [true, false] {
            let got = run_fast_cpu(&g, &weights, &inputs, 1, fuse);
            for ((name, a), (_, b)) in got.iter().zip(&want) {
                compare(&format!("seed {seed} fuse {fuse} {name}"), a, b, 1e-4, 1e-4).unwrap();
            }
        }
    }
    // The benchmark workloads and the examples, on batches of several micro-batches.
    for (path, batch) in [
        ("assets/bench/w1_matmul.json", 64),
        ("assets/bench/w2_mlp.json", 32),
        ("assets/bench/w3_chain.json", 2),
        ("assets/graphs/mlp.json", 8),
        ("assets/graphs/cnn.json", 4),
        ("assets/graphs/transformer_block.json", 4),
    ] {
        let g = load(path);
        let weights = init_weights(&g, 7);
        let data = dataset(&g, batch, 8);
        let want = run_cpu(&bind(&g, batch), &weights, &data);
        let got = run_fast_cpu(&g, &weights, &data, batch, true);
        for ((name, a), (_, b)) in got.iter().zip(&want) {
            compare(&format!("{path} {name}"), a, b, 1e-3, 1e-4).unwrap();
        }
    }
}

/// A one-stage GPU session whose device times passes as `timing` says.
fn timed_session(
    g: &Graph,
    weights: &sluice_engine::weights::Weights,
    cfg: &RunConfig,
    timing: sluice_engine::gpu::PassTiming,
) -> Session {
    let mut device = pollster::block_on(sluice_engine::gpu::GpuDevice::open()).unwrap();
    device.pass_timing = timing;
    let devices = vec![Box::new(device) as Box<dyn sluice_engine::exec::Device>];
    Session::compile_blocking(g, weights, cfg, devices).unwrap()
}

#[test]
fn sampled_pass_timing_reports_every_pass_of_every_micro_batch_and_changes_no_output() {
    // Timestamps on the first two micro-batches and one in four after: the outputs are
    // those of timing every pass and of timing none, and every micro-batch still reports
    // each of its passes, in order and not overlapping.
    use sluice_engine::gpu::PassTiming;
    use sluice_engine::telemetry::{EventKind, TimingSource};
    let g = load("assets/graphs/mlp.json");
    let weights = init_weights(&g, 3);
    let data = dataset(&g, 40, 5);
    let cfg = RunConfig {
        batch: 2,
        microbatches: 1,
        stages: 1,
        ..Default::default()
    };
    let run = |timing| {
        let mut s = timed_session(&g, &weights, &cfg, timing);
        let r = s.run_blocking(&data, &RunContext::new("t")).unwrap();
        (s.timing(), r)
    };
    let (every_source, every) = run(PassTiming::Every);
    let (sampled_source, sampled) = run(PassTiming::Sampled(4));
    let (off_source, off) = run(PassTiming::Off);
    assert_eq!(sampled.outputs, every.outputs);
    assert_eq!(off.outputs, every.outputs);
    assert_eq!(off_source, TimingSource::HostCompletion);
    assert_eq!(every.micro_batches, 20);
    if every_source != TimingSource::TimestampQueries {
        println!("the adapter has no timestamp queries: only the outputs were compared");
        assert_eq!(sampled_source, TimingSource::HostCompletion);
        return;
    }
    assert_eq!(sampled_source, TimingSource::SampledTimestampQueries);
    let passes = |r: &sluice_engine::exec::RunReport, m: usize| -> Vec<(String, u64, u64)> {
        let mut v: Vec<_> = r
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Compute && e.micro_batch == m)
            .map(|e| (e.node.clone(), e.start_ns, e.end_ns))
            .collect();
        v.sort_by_key(|p| (p.1, p.2));
        v
    };
    let labels = |v: &[(String, u64, u64)]| v.iter().map(|p| p.0.clone()).collect::<Vec<_>>();
    let want = labels(&passes(&every, 0));
    assert!(!want.is_empty());
    for m in 0..20 {
        let got = passes(&sampled, m);
        let mut sorted_got = labels(&got);
        let mut sorted_want = want.clone();
        sorted_got.sort();
        sorted_want.sort();
        assert_eq!(
            sorted_got, sorted_want,
            "micro-batch {m} reports each pass once"
        );
        for w in got.windows(2) {
            assert!(
                w[0].1 <= w[0].2 && w[0].2 <= w[1].1,
                "micro-batch {m}: {w:?}"
            );
        }
    }
    println!(
        "{} passes reported for each of 20 micro-batches, {} of them measured",
        want.len(),
        (0..20).filter(|&m| PassTiming::Sampled(4).times(m)).count()
    );
}

/// A session for `cfg` on `device` (`gpu`, `gpu-staged`: a GPU that sends inputs through
/// upload buffers even where it could write them in place, `cpu` or `reference`), one
/// device per stage.
fn session_on(
    device: &str,
    g: &Graph,
    weights: &sluice_engine::weights::Weights,
    cfg: &RunConfig,
) -> Session {
    if device == "gpu" {
        return sluice_engine::gpu::session(g, weights, cfg).unwrap();
    }
    let devices = (0..cfg.stages)
        .map(|_| match device {
            "gpu-staged" => Box::new(sluice_engine::gpu::GpuDevice::new(
                gpu().clone().with_staged_inputs(),
            )) as Box<dyn sluice_engine::exec::Device>,
            "cpu" => Box::new(sluice_engine::cpu::CpuDevice::fast()),
            _ => Box::new(sluice_engine::cpu::CpuDevice::new()),
        })
        .collect();
    Session::compile_blocking(g, weights, cfg, devices).unwrap()
}

#[test]
fn kept_inputs_give_the_answers_of_inputs_sent_with_every_run() {
    // W1's b (1024 × 1024, no batch axis) kept on the device while 16 rows of a stream
    // through in micro-batches of 4; then W5's x kept whole on a two-stage pipeline. On
    // every device the outputs are the bits of sending everything with every run, and
    // data that carries a kept input replaces it.
    let w1 = load("assets/bench/w1_matmul.json");
    let w1_weights = init_weights(&w1, 2);
    let data = dataset(&w1, 16, 3);
    let other_b = dataset(&w1, 16, 4).remove("b").unwrap();
    let w1_cfg = RunConfig {
        batch: 16,
        microbatches: 4,
        ..Default::default()
    };
    let w5 = load("assets/bench/w5_pipeline.json");
    let w5_weights = init_weights(&w5, 1);
    let w5_data = dataset(&w5, 4, 6);
    let w5_cfg = RunConfig {
        batch: 4,
        stages: 2,
        ..Default::default()
    };
    for device in ["gpu", "gpu-staged", "cpu", "reference"] {
        let mut s = session_on(device, &w1, &w1_weights, &w1_cfg);
        let want = s.run_blocking(&data, &RunContext::new("sent")).unwrap();
        let b: HashMap<String, Tensor> = [("b".to_string(), data["b"].clone())].into();
        let mut only_a = data.clone();
        only_a.remove("b");
        s.keep_inputs(&b).unwrap();
        let got = s.run_blocking(&only_a, &RunContext::new("kept")).unwrap();
        assert_eq!(got.outputs, want.outputs, "{device}: kept b");
        assert_eq!(got.micro_batches, 4);
        // Sending b again replaces the kept value for the runs after.
        let mut with_other_b = only_a.clone();
        with_other_b.insert("b".into(), other_b.clone());
        let replaced = s.run_blocking(&with_other_b, &RunContext::new("new b"));
        let after = s.run_blocking(&only_a, &RunContext::new("kept again"));
        assert_ne!(replaced.unwrap().outputs, want.outputs, "{device}");
        let fresh = session_on(device, &w1, &w1_weights, &w1_cfg)
            .run_blocking(&with_other_b, &RunContext::new("fresh"))
            .unwrap();
        assert_eq!(
            after.unwrap().outputs,
            fresh.outputs,
            "{device}: b replaced"
        );

        let mut s = session_on(device, &w5, &w5_weights, &w5_cfg);
        let want = s.run_blocking(&w5_data, &RunContext::new("sent")).unwrap();
        s.keep_inputs(&w5_data).unwrap();
        let got = s
            .run_blocking(&HashMap::new(), &RunContext::new("kept"))
            .unwrap();
        assert_eq!(got.outputs, want.outputs, "{device}: W5 with x kept");
    }
}

#[test]
fn inputs_that_cannot_be_kept_are_refused_naming_them() {
    let w1 = load("assets/bench/w1_matmul.json");
    let weights = init_weights(&w1, 2);
    let cfg = RunConfig {
        batch: 8,
        microbatches: 2,
        ..Default::default()
    };
    let data = dataset(&w1, 8, 3);
    for device in ["gpu", "cpu"] {
        let mut s = session_on(device, &w1, &weights, &cfg);
        let err = |r: Result<(), sluice_engine::RunError>| r.unwrap_err().to_string();
        let one = |name: &str, t: Tensor| HashMap::from([(name.to_string(), t)]);
        let e = err(s.keep_inputs(&one("nope", Tensor::f32(vec![1], vec![0.0]))));
        assert!(e.contains("nope") && e.contains("not an input"), "{e}");
        let e = err(s.keep_inputs(&one("b", Tensor::f32(vec![2, 2], vec![0.0; 4]))));
        assert!(
            e.contains("'b'") || e.contains("b:") || e.contains("b "),
            "{e}"
        );
        assert!(e.contains("1024"), "the expected shape is named: {e}");
        // Nothing was kept: a run without b is refused, naming it.
        let mut only_a = data.clone();
        only_a.remove("b");
        let e = s
            .run_blocking(&only_a, &RunContext::new("no b"))
            .unwrap_err()
            .to_string();
        assert!(e.contains('b') && e.contains("missing"), "{device}: {e}");
        // A kept input with a batch axis is one micro-batch's samples: data with more
        // samples than that, leaving it out, would pair it with other samples.
        let four_rows = dataset(&w1, 4, 5).remove("a").unwrap();
        s.keep_inputs(&one("a", four_rows.clone())).unwrap();
        let mut only_b = data.clone();
        only_b.remove("a");
        let one_mb = s.run_blocking(&only_b, &RunContext::new("a kept"));
        assert_eq!(one_mb.unwrap().micro_batches, 1, "{device}");
        let sum = graph(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 3] }, "y": { "shape": ["N", 3] } },
            "nodes": [{ "id": "s", "op": "add", "inputs": ["x", "y"] }],
            "outputs": ["s"],
        }));
        let mut wide = dataset(&sum, 8, 1);
        wide.remove("y");
        let four_y = dataset(&sum, 4, 2).remove("y").unwrap();
        let mut s2 = session_on(device, &sum, &init_weights(&sum, 1), &cfg);
        s2.keep_inputs(&one("y", four_y)).unwrap();
        let e = s2
            .run_blocking(&wide, &RunContext::new("wide"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'y'") || e.contains("y:") || e.contains("y "),
            "{e}"
        );
        assert!(e.contains("one micro-batch"), "{device}: {e}");
    }
}

#[test]
fn outputs_that_share_a_buffer_each_come_back_whole() {
    // A view and its source are both outputs: the CPU devices hand the last reader the
    // buffer itself and copy it for the others, in either order.
    for outputs in [["r", "v"], ["v", "r"]] {
        let g = graph(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 6] } },
            "nodes": [
                { "id": "r", "op": "relu", "inputs": ["x"] },
                { "id": "v", "op": "reshape", "inputs": ["r"], "attrs": { "shape": [-1, 2, 3] } },
            ],
            "outputs": outputs,
        }));
        let data = dataset(&g, 4, 8);
        let relu: Vec<f32> = data["x"].to_f32_vec().iter().map(|&x| x.max(0.0)).collect();
        let cfg = RunConfig {
            batch: 4,
            ..Default::default()
        };
        for device in ["gpu", "cpu", "reference"] {
            let r = session_on(device, &g, &init_weights(&g, 1), &cfg)
                .run_blocking(&data, &RunContext::new("views"))
                .unwrap();
            for (name, t) in &r.outputs {
                let shape = if name == "r" {
                    vec![4, 6]
                } else {
                    vec![4, 2, 3]
                };
                assert_eq!(t.shape, shape, "{device} {outputs:?}: {name}");
                assert_eq!(t.to_f32_vec(), relu, "{device} {outputs:?}: {name}");
            }
        }
    }
}

#[test]
fn per_node_times_sum_to_each_stages_busy_time_and_stay_on_their_stage() {
    // The threaded GPU pipeline and the one-thread session browsers run, in 2 and 3
    // stages: every node time names a graph node of the stage it is charged to, and the
    // nodes of each stage sum to exactly that stage's busy time.
    let g = load("assets/graphs/mlp.json");
    let weights = init_weights(&g, 1);
    let data = dataset(&g, 16, 4);
    for stages in [2, 3] {
        let cfg = RunConfig {
            batch: 8,
            microbatches: 4,
            stages,
            ..Default::default()
        };
        let mut native = sluice_engine::gpu::session(&g, &weights, &cfg).unwrap();
        let threaded = native.run_blocking(&data, &RunContext::new("t")).unwrap();
        let split = native.stage_summary().unwrap().nodes.clone();
        let browser = one_thread(&g, &weights, &cfg, &data);
        for (what, r) in [("threaded", &threaded), ("one thread", &browser)] {
            let m = &r.metrics;
            assert_eq!(m.devices.len(), stages, "{what} S={stages}");
            let times = sluice_engine::telemetry::metrics::node_times(&r.events);
            assert!(times.len() <= sluice_engine::telemetry::metrics::TOP_NODES);
            assert_eq!(m.top_nodes, times, "{what} S={stages}");
            for t in &times {
                assert!(
                    split[t.stage].contains(&t.node),
                    "{what} S={stages}: '{}' is charged to stage {}, which runs {:?}",
                    t.node,
                    t.stage,
                    split[t.stage]
                );
            }
            for d in &m.devices {
                let sum: u64 = times
                    .iter()
                    .filter(|t| t.stage == d.stage)
                    .map(|t| t.total_ns)
                    .sum();
                assert_eq!(sum, d.busy_ns, "{what} S={stages} stage {}", d.stage);
            }
        }
    }
}
