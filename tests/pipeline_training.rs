//! Pipeline-parallel training: K steps of the digits MLP cut into 2 and 3 stages, with the
//! 1F1B and GPipe schedules and M = 4 and 8 micro-batches (and of the digits CNN in 2
//! stages at M = 4), end with the weights of the
//! same K steps on one stage (same micro-batches, gradients accumulated), on the CPU
//! device and on the GPU; each schedule stashes exactly the micro-batches its bound says.
//! `-- --nocapture` prints the measured bubble and peak activation memory per stage.

use sluice_engine::cpu::CpuDevice;
use sluice_engine::exec::device::{Device, Values};
use sluice_engine::exec::schedule::TrainSchedule;
use sluice_engine::gpu::GpuDevice;
use sluice_engine::graph::Graph;
use sluice_engine::train::trainer::{TrainSettings, Trainer};
use sluice_engine::train::{Batching, Feed};
use sluice_engine::weights::{self, Weights};
use sluice_tests::{load_asset, root};

/// Steps compared.
const STEPS: usize = 3;
/// Largest |difference| / max(1, |one-stage weight|) accepted.
const TOLERANCE: f32 = 1e-5;

fn digits_batches(graph: &Graph, batch: usize) -> Vec<Values> {
    let data = sluice_tests::digits(&graph.limits);
    let feed = Feed::new([("x", "x"), ("labels", "labels")]);
    let ep = data.epoch(0, &Batching::new(batch, 7), &feed).unwrap();
    (0..STEPS).map(|k| ep.batch(k).unwrap()).collect()
}

fn devices(gpu: bool, n: usize) -> Vec<Box<dyn Device>> {
    if gpu {
        pollster::block_on(GpuDevice::open_many(n))
            .expect("a GPU adapter")
            .into_iter()
            .map(|d| Box::new(d) as Box<dyn Device>)
            .collect()
    } else {
        (0..n)
            .map(|_| Box::new(CpuDevice::new()) as Box<dyn Device>)
            .collect()
    }
}

/// The weights after [`STEPS`] steps, and each step's pipeline figures.
fn train(
    graph: &Graph,
    batches: &[Values],
    stages: usize,
    microbatches: usize,
    schedule: TrainSchedule,
    gpu: bool,
) -> (Weights, Vec<sluice_engine::train::trainer::PipelineStats>) {
    let settings = TrainSettings {
        batch: 32,
        microbatches,
        stages,
        schedule,
        ..TrainSettings::default()
    };
    let mut step_devices = devices(gpu, stages + 1);
    let eval = step_devices.pop().unwrap();
    let init = weights::init_weights(graph, 3);
    let mut trainer = pollster::block_on(Trainer::on_devices(
        graph,
        init,
        settings,
        step_devices,
        eval,
        &|_| {},
    ))
    .unwrap_or_else(|e| panic!("S={stages} M={microbatches} {schedule:?}: {e}"));
    let mut stats = Vec::new();
    for b in batches {
        let out = pollster::block_on(trainer.step(b)).unwrap();
        assert!(out.loss.is_finite() && out.update.is_some());
        stats.extend(trainer.pipeline_stats().cloned());
    }
    (trainer.params().clone(), stats)
}

fn worst_difference(a: &Weights, b: &Weights) -> f32 {
    let keys = |w: &Weights| {
        let mut k: Vec<String> = w.keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(a), keys(b), "the same weights are trained");
    a.iter()
        .map(|(k, t)| {
            let (x, y) = (t.to_f32_vec(), b[k].to_f32_vec());
            assert_eq!(x.len(), y.len(), "{k}");
            x.iter()
                .zip(&y)
                .map(|(p, q)| (p - q).abs() / q.abs().max(1.0))
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
}

fn pipelines_match_one_stage(model: &str, gpu: bool, configs: &[(usize, usize)]) {
    let graph = load_asset(&format!("assets/graphs/{model}.json"));
    let batches = digits_batches(&graph, 32);
    let device = if gpu { "GPU" } else { "CPU device" };
    let mut micro_batches: Vec<usize> = configs.iter().map(|c| c.1).collect();
    micro_batches.dedup();
    for m in micro_batches {
        let (reference, none) = train(&graph, &batches, 1, m, TrainSchedule::OneFOneB, gpu);
        assert!(none.is_empty(), "one stage is not a pipeline");
        let initial = weights::init_weights(&graph, 3);
        assert!(
            worst_difference(&reference, &initial) > 1e-3,
            "the steps change the weights"
        );
        for stages in configs.iter().filter(|c| c.1 == m).map(|c| c.0) {
            for schedule in [TrainSchedule::OneFOneB, TrainSchedule::GPipe] {
                let (w, stats) = train(&graph, &batches, stages, m, schedule, gpu);
                let diff = worst_difference(&w, &reference);
                let last = stats.last().expect("a pipelined step reports");
                println!(
                    "{model} {device} S={stages} M={m} {:<5}: weights after {STEPS} steps within {diff:.1e} of one stage; bubble {:.3} (ideal {:.3}); peak stash per stage {:?} bytes, {:?} micro-batches",
                    schedule.name(),
                    last.bubble,
                    last.ideal_bubble,
                    last.peak_stash_bytes,
                    last.peak_stashed
                );
                assert!(
                    diff <= TOLERANCE,
                    "S={stages} M={m} {schedule:?}: weights differ by {diff}"
                );
                for st in &stats {
                    assert_eq!(st.stages, stages);
                    for (s, &peak) in st.peak_stashed.iter().enumerate() {
                        assert_eq!(peak, schedule.stash_bound(s, stages, m), "stage {s}");
                    }
                    assert!((0.0..1.0).contains(&st.bubble));
                }
            }
        }
    }
}

/// (stages, micro-batches) for the MLP.
const MLP: &[(usize, usize)] = &[(2, 4), (3, 4), (2, 8), (3, 8)];
/// ... and for the CNN, whose steps take longer.
const CNN: &[(usize, usize)] = &[(2, 4)];

#[test]
fn pipelined_steps_give_the_one_stage_weights_on_the_cpu_device() {
    pipelines_match_one_stage("digits_mlp", false, MLP);
    pipelines_match_one_stage("digits_cnn", false, CNN);
}

#[test]
fn pipelined_steps_give_the_one_stage_weights_on_the_gpu() {
    pipelines_match_one_stage("digits_mlp", true, MLP);
    pipelines_match_one_stage("digits_cnn", true, CNN);
}

#[test]
fn a_pipeline_needs_a_device_per_stage() {
    let graph = load_asset("assets/graphs/digits_mlp.json");
    let settings = TrainSettings {
        stages: 2,
        ..TrainSettings::default()
    };
    let init = weights::init_weights(&graph, 3);
    let err = pollster::block_on(Trainer::on_devices(
        &graph,
        init,
        settings,
        devices(false, 1),
        Box::new(CpuDevice::new()),
        &|_| {},
    ))
    .err()
    .expect("refused");
    assert!(
        err.to_string().contains("2 pipeline stages need 2 devices"),
        "{err}"
    );
}

#[test]
fn bad_pipeline_settings_are_refused_before_any_work() {
    let d = root().join("assets/datasets/digits");
    let x = format!("x={}", d.join("features.npy").display());
    let labels = format!("labels={}", d.join("labels.npy").display());
    let graph = root().join("assets/graphs/digits_mlp.json");
    for (extra, expected) in [
        (&["--stages", "100000"][..], "over the limit of 16 stages"),
        (&["--stages", "0"][..], "--stages must be at least 1"),
        (
            &["--stages", "9", "--device", "cpu"][..],
            "9 stages for 5 operator nodes",
        ),
        (
            &["--schedule", "pipedream"][..],
            "unknown training schedule",
        ),
        (
            &["--stages", "2", "--microbatches", "3", "--device", "cpu"][..],
            "does not split into 3 equal micro-batches",
        ),
    ] {
        let out = sluice_tests::sluice()
            .args(["train", &graph.display().to_string(), "--data", &x, &labels])
            .args(["--epochs", "1"])
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{extra:?}: {stderr}");
    }
}

#[test]
fn a_constant_read_by_two_stages_trains_as_on_one_stage() {
    // The digits MLP with one constant scaling a layer of each stage (pinned apart):
    // each stage has its own copy, and the steps give the one-stage weights.
    let mut doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("assets/graphs/digits_mlp.json")).unwrap(),
    )
    .unwrap();
    doc["nodes"] = serde_json::json!([
        { "id": "c", "op": "constant", "attrs": { "value": [0.5], "shape": [] } },
        { "id": "fc1", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 32 } },
        { "id": "s1", "op": "mul", "inputs": ["fc1", "c"] },
        { "id": "act1", "op": "relu", "inputs": ["s1"] },
        { "id": "fc2", "op": "linear", "inputs": ["act1"], "attrs": { "out_features": 10 } },
        { "id": "logits", "op": "mul", "inputs": ["fc2", "c"] },
        { "id": "loss", "op": "softmax_cross_entropy", "inputs": ["logits", "labels"], "attrs": { "reduction": "mean" } }
    ]);
    doc["stages"] =
        serde_json::json!({ "fc1": 0, "s1": 0, "act1": 0, "fc2": 1, "logits": 1, "loss": 1 });
    let graph = sluice_tests::graph(&doc);
    let batches = digits_batches(&graph, 32);
    let (reference, _) = train(&graph, &batches, 1, 4, TrainSchedule::OneFOneB, false);
    let (two, stats) = train(&graph, &batches, 2, 4, TrainSchedule::OneFOneB, false);
    assert_eq!(stats.last().map(|s| s.stages), Some(2));
    let diff = worst_difference(&two, &reference);
    assert!(diff <= TOLERANCE, "weights differ by {diff}");
}
