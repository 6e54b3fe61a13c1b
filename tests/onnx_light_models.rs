//! The `onnx` package's light model zoo (AlexNet, DenseNet-121, Inception v1 and v2,
//! ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512; opset 9, from Caffe2) through
//! the importer. `scripts/onnx_light_models.py` copies them out of the pinned oracle venv
//! (they are not committed) with a seeded 224×224 input and onnxruntime's output; the
//! smaller ones also with seeded random weights (`_rw`), since the shipped models' weights
//! are all 0.02 and their softmax output is uniform whatever happens before it. Each model
//! is imported (or refused, with the importer's reason in the printed table), and every
//! imported one runs at 224×224 on the GPU (on the CPU reference when a weight is over
//! the adapter's binding limit) and must give onnxruntime's output.

use sluice_engine::exec::{RunConfig, RunContext};
use sluice_engine::graph::Limits;
use sluice_engine::{onnx, Graph};
use sluice_tests::{bind_all, compare, oracle_python, root};
use std::process::Command;

/// Models also generated with random weights (the larger ones are hundreds of MB).
const RANDOM_WEIGHTS: &str = "squeezenet,shufflenet,resnet50,densenet121,inception_v2";

/// Models over the GPU's limits run on the CPU reference only up to this many weights
/// (AlexNet and ZFNet do; VGG-19's 20 GFLOPs would take minutes there).
const CPU_FALLBACK_WEIGHTS: usize = 100_000_000;

fn weights_elements(w: &sluice_engine::weights::Weights) -> usize {
    w.values().map(|t| t.len()).sum()
}

#[test]
fn light_model_zoo_imports_or_says_why_and_runs_like_onnxruntime() {
    let py = oracle_python();
    let tmp = tempfile::tempdir().unwrap();
    for extra in [vec![], vec!["--random-weights", "--only", RANDOM_WEIGHTS]] {
        let status = Command::new(py)
            .arg(root().join("scripts/onnx_light_models.py"))
            .arg(tmp.path())
            .args(&extra)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "scripts/onnx_light_models.py failed");
    }
    let mut dirs: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 9,
        "expected the nine light models, found {}",
        dirs.len()
    );
    println!("| model | ONNX nodes | imported as | 224×224 vs onnxruntime (max abs) |");
    println!("|---|---|---|---|");
    let (mut imported, mut failures) = (0, Vec::new());
    for d in &dirs {
        let name = d.file_name().unwrap().to_string_lossy().to_string();
        let bytes = std::fs::read(d.join("model.onnx")).unwrap();
        let result = onnx::import(&bytes, &onnx::NoExternalData, &Limits::default());
        let model = match result {
            Ok(m) => m,
            Err(e) => {
                let reason = e.to_string().replace('\n', " ");
                println!("| {name} | — | refused | {reason} |");
                continue;
            }
        };
        let nodes = model.onnx_nodes;
        let graph = Graph::build(model.doc).unwrap_or_else(|p| panic!("{name}: {p}"));
        let input =
            sluice_engine::npy::parse(&std::fs::read(d.join("input_0.npy")).unwrap()).unwrap();
        let want =
            sluice_engine::npy::parse(&std::fs::read(d.join("output_0.npy")).unwrap()).unwrap();
        let (input_name, _) = &graph.inputs[0];
        let data = [(input_name.clone(), input)].into_iter().collect();
        let cfg = RunConfig {
            batch: want.shape[0],
            ..Default::default()
        };
        // A model over the adapter's limits (lavapipe binds at most 128 MiB) is refused
        // before anything is allocated; it then runs on the CPU reference instead.
        let (device, got) = match sluice_engine::gpu::session(&graph, &model.weights, &cfg) {
            Ok(mut session) => (
                "GPU".to_string(),
                session
                    .run_blocking(&data, &RunContext::new("light"))
                    .unwrap_or_else(|e| panic!("{name}: {e}"))
                    .outputs
                    .remove(0)
                    .1,
            ),
            Err(refusal) if weights_elements(&model.weights) > CPU_FALLBACK_WEIGHTS => {
                println!(
                    "| {name} | {nodes} | {} Sluice nodes | not run: the GPU refused ({refusal}), and the CPU reference is too slow for the test suite |",
                    graph.doc.nodes.len()
                );
                imported += 1;
                continue;
            }
            Err(refusal) => (
                format!("CPU (the GPU refused: {refusal})"),
                sluice_engine::cpu::run(&bind_all(&graph, want.shape[0]), &model.weights, &data)
                    .unwrap_or_else(|e| panic!("{name}: {e}"))
                    .remove(0)
                    .1,
            ),
        };
        let err = got
            .to_f32_vec()
            .iter()
            .zip(want.to_f32_vec())
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        if let Err(e) = compare(&name, &got, &want, 1e-5, 1e-3) {
            failures.push(e);
        }
        imported += 1;
        println!(
            "| {name} | {nodes} | {} Sluice nodes | {err:.1e} on {device} |",
            graph.doc.nodes.len()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(imported > 0, "no light model imported");
}
