//! Shared helpers of the workspace integration tests: graph building, running on the GPU
//! and the CPU reference, comparison with tolerances, and the `sluice` binary.

use serde_json::{json, Value};
use sluice_engine::gpu::context::INSTALL_HINT;
use sluice_engine::gpu::{GpuContext, GpuExecutable};
use sluice_engine::graph::{doc, Graph};
use sluice_engine::plan::Plan;
use sluice_engine::rng::Rng;
use sluice_engine::weights::{param_specs, Weights};
use sluice_engine::{cpu, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A graph file of the repository (`assets/...`), loaded and checked.
pub fn load_asset(path: &str) -> Graph {
    let text = std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    sluice_engine::load_graph(&text).unwrap_or_else(|p| panic!("{path}: {p}"))
}

/// A graph with every symbolic dimension bound to `n`.
pub fn bind_all(g: &Graph, n: usize) -> Graph {
    g.bind(&g.symbols().into_iter().map(|s| (s, n)).collect())
        .unwrap_or_else(|p| panic!("binding to {n}: {p}"))
}

/// The shared GPU context. A missing adapter fails the test with how to install one.
pub fn gpu() -> &'static GpuContext {
    static CTX: OnceLock<GpuContext> = OnceLock::new();
    CTX.get_or_init(|| {
        pollster::block_on(GpuContext::new()).unwrap_or_else(|e| {
            panic!("this test needs a GPU adapter and found none ({e}).\n{INSTALL_HINT}.\n`cargo xtask test` installs lavapipe on Debian/Ubuntu when run as root.")
        })
    })
}

/// Builds a typed graph from a JSON document, panicking with every problem.
pub fn graph(document: &Value) -> Graph {
    let d = doc::decode_value(document).unwrap_or_else(|p| panic!("bad test graph: {p:?}"));
    Graph::build(d).unwrap_or_else(|p| panic!("bad test graph: {p}"))
}

/// A graph input declaration for [`single_op`].
pub struct In<'a> {
    /// Name.
    pub name: &'a str,
    /// Shape.
    pub shape: Vec<usize>,
    /// dtype name.
    pub dtype: &'a str,
}

/// A float input.
pub fn f32_in<'a>(name: &'a str, shape: &[usize]) -> In<'a> {
    In {
        name,
        shape: shape.to_vec(),
        dtype: "f32",
    }
}

/// A graph of one operator node `n` over the given inputs, exposing `outputs` outputs.
pub fn single_op(op: &str, attrs: Value, inputs: &[In], outputs: usize) -> Value {
    let decls: serde_json::Map<String, Value> = inputs
        .iter()
        .map(|i| {
            (
                i.name.to_string(),
                json!({ "shape": i.shape, "dtype": i.dtype }),
            )
        })
        .collect();
    let names: Vec<&str> = inputs.iter().map(|i| i.name).collect();
    let outs: Vec<String> = (0..outputs)
        .map(|k| {
            if k == 0 {
                "n".to_string()
            } else {
                format!("n:{k}")
            }
        })
        .collect();
    json!({
        "format": "sluice/graph@1",
        "inputs": decls,
        "nodes": [ { "id": "n", "op": op, "inputs": names, "attrs": attrs } ],
        "outputs": outs,
    })
}

/// Random weights in [-1, 1); variances (`.var`) in [0.5, 1.5).
pub fn random_weights(graph: &Graph, seed: u64) -> Weights {
    param_specs(graph)
        .into_iter()
        .map(|(key, spec)| {
            let mut rng = Rng::for_name(seed, &key);
            let n: usize = spec.shape.iter().product();
            let (lo, hi) = if key.ends_with(".var") {
                (0.5, 1.5)
            } else {
                (-1.0, 1.0)
            };
            let t = Tensor::f32(
                spec.shape.clone(),
                (0..n).map(|_| rng.uniform(lo, hi)).collect(),
            );
            (key, t)
        })
        .collect()
}

/// Runs a bound graph on the shared GPU.
pub fn run_gpu(
    graph: &Graph,
    weights: &Weights,
    inputs: &HashMap<String, Tensor>,
) -> Vec<(String, Tensor)> {
    pollster::block_on(async {
        let plan = Plan::new(graph).unwrap_or_else(|e| panic!("plan failed: {e}"));
        let mut exe = GpuExecutable::compile(gpu(), plan, weights, 1)
            .await
            .unwrap_or_else(|e| panic!("compile failed: {e}"));
        exe.run_once(inputs)
            .await
            .unwrap_or_else(|e| panic!("GPU run failed: {e}"))
    })
}

/// Runs a bound graph on the CPU reference.
pub fn run_cpu(
    graph: &Graph,
    weights: &Weights,
    inputs: &HashMap<String, Tensor>,
) -> Vec<(String, Tensor)> {
    cpu::run(graph, weights, inputs).unwrap_or_else(|e| panic!("CPU run failed: {e}"))
}

/// Checks `|got - want| <= atol + rtol·|want|` elementwise (NaN must match NaN), and shapes.
pub fn compare(
    label: &str,
    got: &Tensor,
    want: &Tensor,
    atol: f32,
    rtol: f32,
) -> Result<(), String> {
    if got.shape != want.shape {
        return Err(format!(
            "{label}: shape {:?}, expected {:?}",
            got.shape, want.shape
        ));
    }
    let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= atol + rtol * b.abs()
        };
        if !ok {
            return Err(format!(
                "{label}: element {i} is {a}, expected {b} (atol {atol}, rtol {rtol})"
            ));
        }
    }
    Ok(())
}

/// The `sluice` binary built alongside the tests. Device calibrations are kept in the
/// target folder (`sluice-test-cache`), not the user's cache, and shared by the tests.
pub fn sluice() -> std::process::Command {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join(format!("sluice{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p sluice-server` (cargo test --workspace does)",
        bin.display()
    );
    let mut cmd = std::process::Command::new(bin);
    cmd.env("SLUICE_CACHE_DIR", dir.join("sluice-test-cache"));
    cmd
}

pub mod kernels;
pub mod op_cases;

/// Seeded inputs for an operator case.
pub fn case_inputs(graph: &Graph, case: &op_cases::OpCase, seed: u64) -> HashMap<String, Tensor> {
    let mut inputs = sluice_engine::exec::dataset::random_inputs(graph, seed).expect("bound graph");
    if case.positive {
        for t in inputs.values_mut() {
            if let sluice_engine::TensorData::F32(v) = &mut t.data {
                v.iter_mut().for_each(|x| *x = x.abs() + 0.05);
            }
        }
    }
    for (name, values) in &case.floats {
        let shape = inputs[*name].shape.clone();
        inputs.insert(name.to_string(), Tensor::f32(shape, values.clone()));
    }
    for (name, values) in &case.ints {
        let shape = inputs[*name].shape.clone();
        inputs.insert(
            name.to_string(),
            Tensor {
                shape,
                data: sluice_engine::TensorData::I32(values.clone()),
            },
        );
    }
    inputs
}

/// The shipped digits dataset (`assets/datasets/digits`) as graph inputs `x` and `labels`.
pub fn digits(limits: &sluice_engine::limits::Limits) -> sluice_engine::train::Dataset {
    let d = root().join("assets/datasets/digits");
    let read = |f: &str| {
        std::fs::read(d.join(f)).unwrap_or_else(|e| panic!("{}: {e}", d.join(f).display()))
    };
    let (features, labels) = (read("features.npy"), read("labels.npy"));
    sluice_engine::train::Dataset::from_npy(
        &[("x", features.as_slice()), ("labels", labels.as_slice())],
        limits,
    )
    .unwrap_or_else(|e| panic!("the digits dataset: {e}"))
}

/// The pinned onnxruntime venv's interpreter (`scripts/python-oracle.sh` makes it once).
pub fn oracle_python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = std::process::Command::new("bash")
            .arg(root().join("scripts/python-oracle.sh"))
            .arg("--python")
            .output()
            .expect("cannot run scripts/python-oracle.sh");
        assert!(
            out.status.success(),
            "scripts/python-oracle.sh failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// onnxruntime's outputs, in order, for the model at `model` on named inputs (through
/// `scripts/onnx_run.py`).
pub fn onnxruntime(model: &Path, inputs: &[(String, Tensor)]) -> Vec<Tensor> {
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(oracle_python());
    cmd.arg(root().join("scripts/onnx_run.py"))
        .arg(model)
        .arg(tmp.path());
    for (k, (name, t)) in inputs.iter().enumerate() {
        let p = tmp.path().join(format!("input_{k}.npy"));
        std::fs::write(&p, sluice_engine::npy::to_bytes(t).unwrap()).unwrap();
        cmd.arg(format!("{name}={}", p.display()));
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "onnxruntime failed on {}:\n{}",
        model.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    (0..)
        .map(|k| tmp.path().join(format!("output_{k}.npy")))
        .take_while(|p| p.exists())
        .map(|p| sluice_engine::npy::parse(&std::fs::read(p).unwrap()).unwrap())
        .collect()
}
