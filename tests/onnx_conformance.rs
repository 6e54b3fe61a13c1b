//! Sluice against the ONNX node conformance cases in `tests/data/onnx-node-cases`: each
//! case's `model.onnx` is imported by Sluice's ONNX importer, runs on the GPU and on the
//! CPU reference, and both must equal ONNX's expected outputs within the case's
//! tolerances. Cases the importer refuses are listed with its reason; the test prints a
//! table per operator.

use prost::Message;
use serde_json::Value;
use sluice_engine::graph::Limits;
use sluice_engine::onnx;
use sluice_engine::weights::Weights;
use sluice_engine::{Graph, Tensor};
use sluice_tests::{compare, root, run_cpu, run_gpu};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// A loaded ONNX case.
struct Case {
    name: String,
    op: String,
    /// Node inputs in order (None for an omitted optional input).
    inputs: Vec<Option<(String, Tensor)>>,
    /// Expected outputs in order.
    outputs: Vec<Tensor>,
    rtol: f32,
    atol: f32,
}

/// A case turned into a Sluice graph.
struct Converted {
    doc: Value,
    inputs: HashMap<String, Tensor>,
    weights: Weights,
    /// Which of the node's outputs are compared.
    compared: usize,
}

fn load(dir: &Path) -> Case {
    let case: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    let node = &case["nodes"][0];
    let set = &case["data_sets"][0];
    let read = |entry: &Value| -> Tensor {
        let file = dir
            .join("test_data_set_0")
            .join(entry["file"].as_str().unwrap());
        sluice_engine::npy::parse(&std::fs::read(&file).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
    };
    let by_name: HashMap<String, Tensor> = set["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), read(e)))
        .collect();
    let inputs = node["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let n = n.as_str().unwrap();
            by_name.get(n).map(|t| (n.to_string(), t.clone()))
        })
        .collect();
    Case {
        name: case["name"].as_str().unwrap().to_string(),
        op: node["op_type"].as_str().unwrap().to_string(),
        inputs,
        outputs: set["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(read)
            .collect(),
        rtol: case["rtol"].as_f64().unwrap_or(1e-3) as f32,
        atol: case["atol"].as_f64().unwrap_or(1e-7) as f32,
    }
}

/// A case imported with Sluice's ONNX importer, or the importer's reason for refusing.
/// ONNX's node cases feed weights and shape-like operands (a Conv's W, a Reshape's shape,
/// a Clip's bounds) as graph inputs, where real models have initialisers: when the
/// importer asks for them to be known, the trailing inputs are turned into initialisers
/// holding the case's data, fewest first, and the first import that succeeds is used.
fn convert(dir: &Path, c: &Case) -> Result<Converted, String> {
    let bytes = std::fs::read(dir.join("model.onnx")).map_err(|e| e.to_string())?;
    let model = onnx::proto::ModelProto::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
    let graph_inputs = model.graph.as_ref().map_or(0, |g| g.input.len());
    let mut last_error = None;
    for frozen in 0..=graph_inputs {
        let mut m = model.clone();
        let g = m.graph.as_mut().unwrap();
        let keep = graph_inputs - frozen;
        for input in g.input.split_off(keep) {
            let Some((_, t)) = c.inputs.iter().flatten().find(|(n, _)| *n == input.name) else {
                continue;
            };
            g.initializer.push(onnx::tensor::encode(&input.name, t));
        }
        match onnx::import::import_model(
            &m,
            &onnx::NoExternalData,
            &Limits::default(),
            &Default::default(),
        ) {
            Ok(imported) => {
                let inputs = c
                    .inputs
                    .iter()
                    .flatten()
                    .filter(|(name, _)| imported.doc.inputs.contains_key(name))
                    .cloned()
                    .collect();
                return Ok(Converted {
                    doc: serde_json::to_value(&imported.doc).unwrap(),
                    inputs,
                    weights: imported.weights,
                    compared: c.outputs.len(),
                });
            }
            Err(e) => {
                let e = e.to_string().replace('\n', " ");
                let retry = e.contains("must be an initialiser") || e.contains("must be known");
                last_error = Some(e);
                if !retry {
                    break;
                }
            }
        }
    }
    Err(last_error.unwrap_or_else(|| "the model has no inputs".into()))
}

#[derive(Default)]
struct Row {
    cases: usize,
    applicable: usize,
    passed: usize,
}

#[test]
fn onnx_node_cases_pass_on_gpu_and_cpu() {
    let dir = root().join("tests/data/onnx-node-cases");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("case.json").exists())
        .map(|e| e.path())
        .collect();
    names.sort();
    assert!(
        names.len() >= 250,
        "expected the ONNX cases in {}",
        dir.display()
    );
    let mut table: BTreeMap<String, Row> = BTreeMap::new();
    let mut skipped = Vec::new();
    let mut failures = Vec::new();
    for path in &names {
        let case = load(path);
        let row = table.entry(case.op.clone()).or_default();
        row.cases += 1;
        let conv = match convert(path, &case) {
            Ok(c) => c,
            Err(reason) => {
                skipped.push(format!("{}: {reason}", case.name));
                continue;
            }
        };
        row.applicable += 1;
        let g = match sluice_engine::graph::doc::decode_value(&conv.doc)
            .map_err(|p| format!("{p:?}"))
            .and_then(|d| Graph::build(d).map_err(|p| p.to_string()))
        {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!(
                    "{}: the imported graph does not build: {e}",
                    case.name
                ));
                continue;
            }
        };
        let runs = std::panic::catch_unwind(|| {
            (
                run_gpu(&g, &conv.weights, &conv.inputs),
                run_cpu(&g, &conv.weights, &conv.inputs),
            )
        });
        let Ok((gpu, cpu)) = runs else {
            failures.push(format!("{}: a run failed (see the panic above)", case.name));
            continue;
        };
        let mut ok = true;
        if gpu.len() < conv.compared || cpu.len() < conv.compared {
            failures.push(format!("{}: fewer outputs than ONNX's", case.name));
            continue;
        }
        for k in 0..conv.compared {
            let want = &case.outputs[k];
            for (backend, got) in [("gpu", &gpu[k].1), ("cpu", &cpu[k].1)] {
                if let Err(e) = compare(
                    &format!("{} ({backend}) output {k}", case.name),
                    got,
                    want,
                    case.atol,
                    case.rtol,
                ) {
                    failures.push(e);
                    ok = false;
                }
            }
        }
        if ok {
            row.passed += 1;
        }
    }
    println!("| ONNX op | cases | applicable | passed (GPU and CPU) |");
    println!("|---|---|---|---|");
    for (op, r) in &table {
        println!("| {op} | {} | {} | {} |", r.cases, r.applicable, r.passed);
    }
    let total: usize = table.values().map(|r| r.cases).sum();
    let applicable: usize = table.values().map(|r| r.applicable).sum();
    let passed: usize = table.values().map(|r| r.passed).sum();
    println!("| total | {total} | {applicable} | {passed} |");
    println!(
        "not applicable ({}):\n  {}",
        skipped.len(),
        skipped.join("\n  ")
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Guard against a converter that quietly skips everything.
    assert!(
        applicable >= 550,
        "only {applicable} of {total} cases were applicable"
    );
}
