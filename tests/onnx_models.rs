//! Real architectures through the ONNX importer: each model of `tests/data/onnx-models`
//! (exported from PyTorch by `scripts/onnx_models.py`) is imported, run on the GPU in f32
//! and in mixed precision (f16 storage, f32 accumulation) and on the CPU reference, and
//! compared with the outputs onnxruntime computed for the same inputs. Prints the table of
//! largest absolute and relative errors; models the importer refuses are listed with its
//! reason, and the test fails if any is.

use prost::Message;
use sluice_engine::exec::{RunConfig, RunContext};
use sluice_engine::graph::Limits;
use sluice_engine::onnx;
use sluice_engine::plan::{HalfStorage, Precision};
use sluice_engine::{Graph, Tensor};
use sluice_tests::{bind_all, root};
use std::collections::HashMap;
use std::path::Path;

/// Largest |a − b|, and that relative to the largest |b| (the output's scale), over two
/// tensors of one shape.
fn errors(got: &Tensor, want: &Tensor) -> (f32, f32) {
    assert_eq!(got.shape, want.shape, "shapes differ");
    let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
    let abs = g
        .iter()
        .zip(&w)
        .fold(0f32, |a, (&x, &y)| a.max((x - y).abs()));
    let scale = w.iter().fold(0f32, |m, y| m.max(y.abs()));
    (abs, abs / scale.max(f32::MIN_POSITIVE))
}

struct Fixture {
    name: String,
    graph: Graph,
    weights: sluice_engine::weights::Weights,
    inputs: HashMap<String, Tensor>,
    outputs: Vec<Tensor>,
}

fn load(dir: &Path) -> Result<Fixture, String> {
    let bytes = std::fs::read(dir.join("model.onnx")).unwrap();
    let model = onnx::proto::ModelProto::decode(bytes.as_slice()).unwrap();
    let graph_proto = model.graph.unwrap();
    let imported = onnx::import(&bytes, &onnx::NoExternalData, &Limits::default())
        .map_err(|e| e.to_string())?;
    let graph = Graph::build(imported.doc).map_err(|p| p.to_string())?;
    let read = |f: String| sluice_engine::npy::parse(&std::fs::read(dir.join(f)).unwrap()).unwrap();
    let initialisers: Vec<&str> = graph_proto
        .initializer
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    let inputs = graph_proto
        .input
        .iter()
        .filter(|i| !initialisers.contains(&i.name.as_str()))
        .enumerate()
        .map(|(k, i)| (i.name.clone(), read(format!("input_{k}.npy"))))
        .collect();
    let outputs = (0..graph_proto.output.len())
        .map(|k| read(format!("output_{k}.npy")))
        .collect();
    Ok(Fixture {
        name: dir.file_name().unwrap().to_string_lossy().into(),
        graph,
        weights: imported.weights,
        inputs,
        outputs,
    })
}

fn run_gpu(f: &Fixture, precision: Precision) -> Vec<Tensor> {
    let batch = f.outputs[0].shape[0];
    let cfg = RunConfig {
        batch,
        precision,
        half: (precision != Precision::F32).then_some(HalfStorage::Packed),
        ..Default::default()
    };
    let mut s = sluice_engine::gpu::session(&f.graph, &f.weights, &cfg)
        .unwrap_or_else(|e| panic!("{}: {e}", f.name));
    s.run_blocking(&f.inputs, &RunContext::new("onnx-models"))
        .unwrap_or_else(|e| panic!("{}: {e}", f.name))
        .outputs
        .into_iter()
        .map(|(_, t)| t)
        .collect()
}

#[test]
fn real_models_match_onnxruntime_on_gpu_cpu_and_mixed_precision() {
    let dir = root().join("tests/data/onnx-models");
    let mut dirs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    dirs.sort();
    println!("| model | ONNX nodes → Sluice nodes | f32 GPU max abs / rel | CPU max abs / rel | mixed GPU max abs / rel |");
    println!("|---|---|---|---|---|");
    let mut refused = Vec::new();
    let mut failures = Vec::new();
    for d in &dirs {
        let f = match load(d) {
            Ok(f) => f,
            Err(e) => {
                refused.push(format!("{}: {e}", d.file_name().unwrap().to_string_lossy()));
                continue;
            }
        };
        let batch = f.outputs[0].shape[0];
        let gpu = run_gpu(&f, Precision::F32);
        let mixed = run_gpu(&f, Precision::Mixed);
        let cpu: Vec<Tensor> =
            sluice_engine::cpu::run(&bind_all(&f.graph, batch), &f.weights, &f.inputs)
                .unwrap_or_else(|e| panic!("{}: {e}", f.name))
                .into_iter()
                .map(|(_, t)| t)
                .collect();
        let mut cells = Vec::new();
        for (label, outs, atol) in [
            ("f32 GPU", &gpu, 1e-4),
            ("CPU", &cpu, 1e-4),
            ("mixed", &mixed, 5e-2),
        ] {
            let (mut a, mut r) = (0f32, 0f32);
            for (got, want) in outs.iter().zip(&f.outputs) {
                let (ea, er) = errors(got, want);
                a = a.max(ea);
                r = r.max(er);
            }
            if a.is_nan() || a > atol {
                failures.push(format!(
                    "{} {label}: max abs error {a:e} over {atol:e}",
                    f.name
                ));
            }
            cells.push(format!("{a:.1e} / {r:.1e}"));
        }
        println!(
            "| {} | {} | {} |",
            f.name,
            f.graph.doc.nodes.len(),
            cells.join(" | ")
        );
    }
    println!("refused ({}):", refused.len());
    for r in &refused {
        println!("  {r}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        refused.is_empty(),
        "models refused:\n{}",
        refused.join("\n")
    );
}
