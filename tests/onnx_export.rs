//! ONNX export checked by onnxruntime: the example graphs (`assets/graphs`) and every
//! imported real model (`tests/data/onnx-models`, imported then exported again) are
//! written as ONNX, run by onnxruntime (the pinned venv `scripts/python-oracle.sh` makes,
//! running `scripts/onnx_run.py`), and must give Sluice's outputs (the examples) or the
//! outputs onnxruntime gave for the original model (the round trips).

use prost::Message;
use sluice_engine::graph::Limits;
use sluice_engine::weights::init_weights;
use sluice_engine::{onnx, Graph, Tensor};
use sluice_tests::{bind_all, compare, load_asset, onnxruntime, root};

#[test]
fn exported_examples_run_in_onnxruntime_with_sluices_outputs() {
    let mut names: Vec<String> = std::fs::read_dir(root().join("assets/graphs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    println!("| example | outputs | max abs error vs Sluice's CPU reference |");
    println!("|---|---|---|");
    for name in &names {
        let full = load_asset(&format!("assets/graphs/{name}"));
        let weights = init_weights(&full, full.doc.params.seed.unwrap_or(0));
        let graph = onnx::export::inference_graph(&full)
            .unwrap()
            .unwrap_or(full.clone());
        let bound = bind_all(&graph, 2);
        let inputs = sluice_engine::exec::dataset::seeded(&bound, 2, 7).unwrap();
        let ours = sluice_engine::cpu::run(&bound, &weights, &inputs).unwrap();
        let model = onnx::export(&full, &weights).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let model_path = tmp.path().join("model.onnx");
        std::fs::write(&model_path, &model).unwrap();
        let named: Vec<(String, Tensor)> = graph
            .inputs
            .iter()
            .map(|(n, _)| (n.clone(), inputs[n].clone()))
            .collect();
        let theirs = onnxruntime(&model_path, &named);
        assert_eq!(theirs.len(), ours.len(), "{name}: output count");
        let mut worst = 0f32;
        for ((label, a), b) in ours.iter().zip(&theirs) {
            compare(&format!("{name} {label}"), b, a, 1e-4, 1e-4).unwrap();
            let d = a
                .to_f32_vec()
                .iter()
                .zip(b.to_f32_vec())
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            worst = worst.max(d);
        }
        println!("| {name} | {} | {worst:.1e} |", ours.len());
    }
}

#[test]
fn imported_models_exported_again_run_the_same_in_onnxruntime() {
    let dir = root().join("tests/data/onnx-models");
    let mut dirs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    dirs.sort();
    println!("| model | round trip: max abs error vs onnxruntime on the original |");
    println!("|---|---|");
    let mut exported = 0;
    for d in &dirs {
        let name = d.file_name().unwrap().to_string_lossy().to_string();
        let bytes = std::fs::read(d.join("model.onnx")).unwrap();
        let Ok(imported) = onnx::import(&bytes, &onnx::NoExternalData, &Limits::default()) else {
            println!("| {name} | not imported (see the onnx_models test) |");
            continue;
        };
        let graph = Graph::build(imported.doc).unwrap();
        let model =
            onnx::export(&graph, &imported.weights).unwrap_or_else(|e| panic!("{name}: {e}"));
        let original = onnx::proto::ModelProto::decode(bytes.as_slice()).unwrap();
        let g = original.graph.unwrap();
        let inits: Vec<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
        let read =
            |f: String| sluice_engine::npy::parse(&std::fs::read(d.join(f)).unwrap()).unwrap();
        let inputs: Vec<(String, Tensor)> = g
            .input
            .iter()
            .filter(|i| !inits.contains(&i.name.as_str()))
            .enumerate()
            .map(|(k, i)| (i.name.clone(), read(format!("input_{k}.npy"))))
            .collect();
        let tmp = tempfile::tempdir().unwrap();
        let model_path = tmp.path().join("model.onnx");
        std::fs::write(&model_path, &model).unwrap();
        let theirs = onnxruntime(&model_path, &inputs);
        let mut worst = 0f32;
        for (k, got) in theirs.iter().enumerate() {
            let want = read(format!("output_{k}.npy"));
            compare(&format!("{name} output {k}"), got, &want, 1e-4, 1e-4).unwrap();
            let d = got
                .to_f32_vec()
                .iter()
                .zip(want.to_f32_vec())
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            worst = worst.max(d);
        }
        exported += 1;
        println!("| {name} | {worst:.1e} |");
    }
    assert!(exported >= 4, "only {exported} models were exported");
}
