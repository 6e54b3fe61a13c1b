//! Sluice against the ONNX node conformance cases in `tests/data/onnx-node-cases`: each
//! case becomes a Sluice graph (integer shape/axes inputs become attributes, weights-like
//! inputs become weights), runs on the GPU and on the CPU reference, and both must equal
//! ONNX's expected outputs within the case's tolerances. Cases Sluice cannot express are
//! listed with the reason; the test prints a table per operator.

use serde_json::{json, Map, Value};
use sluice_engine::weights::Weights;
use sluice_engine::{Tensor, TensorData};
use sluice_tests::{compare, graph, root, run_cpu, run_gpu};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// A loaded ONNX case.
struct Case {
    name: String,
    op: String,
    opset: i64,
    attrs: Map<String, Value>,
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
        opset: case["opset_import"]["ai.onnx"].as_i64().unwrap_or(1),
        attrs: node["attributes"].as_object().cloned().unwrap_or_default(),
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

fn ints(t: &Tensor) -> Vec<i64> {
    t.to_f32_vec().iter().map(|&x| x as i64).collect()
}

impl Case {
    fn input(&self, i: usize) -> Option<&(String, Tensor)> {
        self.inputs.get(i).and_then(Option::as_ref)
    }
    fn attr_i(&self, name: &str, default: i64) -> i64 {
        self.attrs
            .get(name)
            .and_then(Value::as_i64)
            .unwrap_or(default)
    }
    fn attr_ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attrs
            .get(name)
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
    }
}

/// A graph of one node `n` over `data` inputs.
fn one_node(
    op: &str,
    attrs: Value,
    data: &[&(String, Tensor)],
) -> (Value, HashMap<String, Tensor>) {
    let mut decls = Map::new();
    let mut inputs = HashMap::new();
    for (name, t) in data {
        decls.insert(
            name.clone(),
            json!({ "shape": t.shape, "dtype": t.dtype() }),
        );
        inputs.insert(name.clone(), t.clone());
    }
    let names: Vec<&str> = data.iter().map(|(n, _)| n.as_str()).collect();
    let doc = json!({
        "format": "sluice/graph@1",
        "inputs": decls,
        "nodes": [ { "id": "n", "op": op, "inputs": names, "attrs": attrs } ],
        "outputs": ["n"],
    });
    (doc, inputs)
}

/// Explicit [top, left, bottom, right] pads for ONNX auto_pad and pads.
fn pads_2d(c: &Case, x: &[usize], kernel: &[i64], strides: &[i64], dilations: &[i64]) -> Vec<i64> {
    let auto = c
        .attrs
        .get("auto_pad")
        .and_then(Value::as_str)
        .unwrap_or("NOTSET");
    match auto {
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut begin = Vec::new();
            let mut end = Vec::new();
            for a in 0..2 {
                let input = x[2 + a] as i64;
                let out = (input + strides[a] - 1) / strides[a];
                let span = (kernel[a] - 1) * dilations[a] + 1;
                let total = ((out - 1) * strides[a] + span - input).max(0);
                let (b, e) = if auto == "SAME_UPPER" {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                };
                begin.push(b);
                end.push(e);
            }
            vec![begin[0], begin[1], end[0], end[1]]
        }
        "VALID" => vec![0; 4],
        _ => c.attr_ints("pads").unwrap_or(vec![0; 4]),
    }
}

fn convert(c: &Case) -> Result<Converted, String> {
    for (i, inp) in c.inputs.iter().enumerate() {
        if let Some((_, t)) = inp {
            if matches!(t.data, TensorData::I32(_)) && i == 0 && c.op != "Gather" {
                return Err("integer arithmetic: Sluice computes in f32".into());
            }
        }
    }
    if c.outputs
        .iter()
        .any(|t| !matches!(t.data, TensorData::F32(_)))
        && !matches!(c.op.as_str(), "Dropout")
    {
        return Err("integer output: Sluice computes in f32".into());
    }
    let x = c.input(0).ok_or("no data input")?;
    let mut weights = Weights::new();
    let mut compared = 1;
    let (doc, inputs) = match c.op.as_str() {
        "Add" | "Sub" | "Mul" | "Div" | "Pow" => {
            let y = c.input(1).ok_or("missing input")?;
            if !matches!(y.1.data, TensorData::F32(_)) {
                return Err("integer exponent: Sluice computes in f32".into());
            }
            one_node(&c.op.to_lowercase(), json!({}), &[x, y])
        }
        "Relu" | "Sigmoid" | "Tanh" | "Exp" | "Log" | "Sqrt" | "Erf" | "Identity" => {
            one_node(&c.op.to_lowercase(), json!({}), &[x])
        }
        "Gelu" => one_node(
            "gelu",
            json!({ "approximate": c.attrs.get("approximate").cloned().unwrap_or(json!("none")) }),
            &[x],
        ),
        "Clip" => {
            let mut attrs = Map::new();
            if let Some((_, t)) = c.input(1) {
                attrs.insert("min".into(), json!(t.to_f32_vec()[0]));
            }
            if let Some((_, t)) = c.input(2) {
                attrs.insert("max".into(), json!(t.to_f32_vec()[0]));
            }
            one_node("clip", Value::Object(attrs), &[x])
        }
        "Softmax" | "LogSoftmax" => {
            if c.opset < 13 {
                return Err("opset < 13 softmax coerces to 2-D; Sluice follows opset 13".into());
            }
            let op = if c.op == "Softmax" {
                "softmax"
            } else {
                "log_softmax"
            };
            one_node(op, json!({ "axis": c.attr_i("axis", -1) }), &[x])
        }
        "LayerNormalization" => {
            let axis = c.attr_i("axis", -1);
            let eps = c
                .attrs
                .get("epsilon")
                .and_then(Value::as_f64)
                .unwrap_or(1e-5);
            let scale = c.input(1).ok_or("no scale")?.1.clone();
            let bias = c
                .input(2)
                .map(|b| b.1.clone())
                .unwrap_or_else(|| Tensor::full(scale.shape.clone(), 0.0));
            weights.insert("n.scale".into(), scale);
            weights.insert("n.bias".into(), bias);
            one_node("layer_norm", json!({ "axis": axis, "epsilon": eps }), &[x])
        }
        "BatchNormalization" => {
            if c.outputs.len() > 1 {
                return Err("training-mode batch norm (running statistics outputs)".into());
            }
            for (k, name) in ["scale", "bias", "mean", "var"].iter().enumerate() {
                weights.insert(
                    format!("n.{name}"),
                    c.input(k + 1).ok_or("missing statistics")?.1.clone(),
                );
            }
            let eps = c
                .attrs
                .get("epsilon")
                .and_then(Value::as_f64)
                .unwrap_or(1e-5);
            one_node("batch_norm", json!({ "epsilon": eps }), &[x])
        }
        "ReduceSum" | "ReduceMean" => {
            let axes = c
                .input(1)
                .map(|a| ints(&a.1))
                .or_else(|| c.attr_ints("axes"));
            let noop = c.attr_i("noop_with_empty_axes", 0) == 1;
            let axes = match axes {
                Some(a) if !a.is_empty() => json!(a),
                _ if noop => json!([]),
                _ => Value::Null,
            };
            let op = if c.op == "ReduceSum" {
                "reduce_sum"
            } else {
                "reduce_mean"
            };
            one_node(
                op,
                json!({ "axes": axes, "keepdims": c.attr_i("keepdims", 1) == 1 }),
                &[x],
            )
        }
        "Reshape" => {
            let shape = ints(&c.input(1).ok_or("no shape")?.1);
            one_node(
                "reshape",
                json!({ "shape": shape, "allowzero": c.attr_i("allowzero", 0) == 1 }),
                &[x],
            )
        }
        "Transpose" => one_node("transpose", json!({ "perm": c.attr_ints("perm") }), &[x]),
        "Concat" => {
            let all: Vec<&(String, Tensor)> = c.inputs.iter().flatten().collect();
            one_node("concat", json!({ "axis": c.attr_i("axis", 0) }), &all)
        }
        "Split" => {
            compared = c.outputs.len();
            let sizes = c
                .input(1)
                .map(|s| ints(&s.1))
                .or_else(|| c.attr_ints("split"));
            let attrs = match sizes {
                Some(s) => json!({ "axis": c.attr_i("axis", 0), "sizes": s }),
                None => {
                    json!({ "axis": c.attr_i("axis", 0), "num_outputs": c.attr_i("num_outputs", c.outputs.len() as i64) })
                }
            };
            let (mut doc, inputs) = one_node("split", attrs, &[x]);
            doc["outputs"] = json!((0..compared).map(|k| format!("n:{k}")).collect::<Vec<_>>());
            (doc, inputs)
        }
        "Slice" => {
            let get = |i: usize| c.input(i).map(|t| ints(&t.1));
            let attrs =
                json!({ "starts": get(1), "ends": get(2), "axes": get(3), "steps": get(4) });
            one_node("slice", attrs, &[x])
        }
        "Flatten" => one_node("flatten", json!({ "axis": c.attr_i("axis", 1) }), &[x]),
        "Squeeze" => one_node(
            "squeeze",
            json!({ "axes": c.input(1).map(|t| ints(&t.1)).or_else(|| c.attr_ints("axes")) }),
            &[x],
        ),
        "Unsqueeze" => {
            let axes = c
                .input(1)
                .map(|t| ints(&t.1))
                .or_else(|| c.attr_ints("axes"))
                .ok_or("no axes")?;
            one_node("unsqueeze", json!({ "axes": axes }), &[x])
        }
        "Expand" => one_node(
            "expand",
            json!({ "shape": ints(&c.input(1).ok_or("no shape")?.1) }),
            &[x],
        ),
        "Gather" => one_node(
            "gather",
            json!({ "axis": c.attr_i("axis", 0) }),
            &[x, c.input(1).ok_or("no indices")?],
        ),
        "Where" => one_node(
            "where",
            json!({}),
            &[x, c.input(1).ok_or("no x")?, c.input(2).ok_or("no y")?],
        ),
        "MatMul" => one_node("matmul", json!({}), &[x, c.input(1).ok_or("no b")?]),
        "Gemm" => return gemm(c),
        "Dropout" => {
            if c.outputs.len() > 1 {
                return Err("the mask output (training only) is not produced".into());
            }
            if c.input(2)
                .is_some_and(|t| t.1.to_f32_vec().first() == Some(&1.0))
            {
                return Err("training mode (random dropping)".into());
            }
            one_node("dropout", json!({}), &[x])
        }
        "GlobalAveragePool" => {
            if x.1.shape.len() != 4 {
                return Err(format!(
                    "{}-D input: Sluice pools are 2-D",
                    x.1.shape.len() - 2
                ));
            }
            one_node("global_avg_pool", json!({}), &[x])
        }
        "Conv" | "MaxPool" | "AveragePool" => {
            if x.1.shape.len() != 4 {
                return Err(format!(
                    "{}-D input: Sluice convolution and pooling are 2-D",
                    x.1.shape.len() as i64 - 2
                ));
            }
            if c.outputs.len() > 1 {
                return Err("argmax indices output".into());
            }
            let kernel = match c.op.as_str() {
                "Conv" => c.input(1).ok_or("no W")?.1.shape[2..]
                    .iter()
                    .map(|&d| d as i64)
                    .collect(),
                _ => c.attr_ints("kernel_shape").ok_or("no kernel_shape")?,
            };
            let strides = c.attr_ints("strides").unwrap_or(vec![1, 1]);
            let dilations = c.attr_ints("dilations").unwrap_or(vec![1, 1]);
            let pads = pads_2d(c, &x.1.shape, &kernel, &strides, &dilations);
            let mut attrs = json!({ "kernel_size": kernel, "strides": strides, "pads": pads, "dilations": dilations });
            let op = match c.op.as_str() {
                "Conv" => {
                    let w = c.input(1).ok_or("no W")?.1.clone();
                    attrs["out_channels"] = json!(w.shape[0]);
                    attrs["groups"] = json!(c.attr_i("group", 1));
                    attrs["bias"] = json!(c.input(2).is_some());
                    weights.insert("n.weight".into(), w);
                    if let Some(b) = c.input(2) {
                        weights.insert("n.bias".into(), b.1.clone());
                    }
                    "conv2d"
                }
                "MaxPool" => {
                    attrs["ceil_mode"] = json!(c.attr_i("ceil_mode", 0) == 1);
                    "max_pool2d"
                }
                _ => {
                    attrs["ceil_mode"] = json!(c.attr_i("ceil_mode", 0) == 1);
                    attrs["count_include_pad"] = json!(c.attr_i("count_include_pad", 0) == 1);
                    "avg_pool2d"
                }
            };
            one_node(op, attrs, &[x])
        }
        other => return Err(format!("{other} is not a Sluice operator")),
    };
    Ok(Converted {
        doc,
        inputs,
        weights,
        compared,
    })
}

/// Gemm as Sluice operators: transpose?, matmul, mul by alpha, add beta·C.
fn gemm(c: &Case) -> Result<Converted, String> {
    let (a, b) = (c.input(0).ok_or("no A")?, c.input(1).ok_or("no B")?);
    let alpha = c.attrs.get("alpha").and_then(Value::as_f64).unwrap_or(1.0);
    let beta = c.attrs.get("beta").and_then(Value::as_f64).unwrap_or(1.0);
    let mut decls = Map::new();
    let mut inputs = HashMap::new();
    for (name, t) in c.inputs.iter().flatten() {
        decls.insert(name.clone(), json!({ "shape": t.shape }));
        inputs.insert(name.clone(), t.clone());
    }
    let mut nodes = Vec::new();
    let mut lhs = a.0.clone();
    let mut rhs = b.0.clone();
    if c.attr_i("transA", 0) == 1 {
        nodes.push(json!({ "id": "at", "op": "transpose", "inputs": [lhs] }));
        lhs = "at".into();
    }
    if c.attr_i("transB", 0) == 1 {
        nodes.push(json!({ "id": "bt", "op": "transpose", "inputs": [rhs] }));
        rhs = "bt".into();
    }
    nodes.push(json!({ "id": "mm", "op": "matmul", "inputs": [lhs, rhs] }));
    nodes.push(
        json!({ "id": "alpha", "op": "constant", "attrs": { "value": [alpha], "shape": [] } }),
    );
    nodes.push(json!({ "id": "scaled", "op": "mul", "inputs": ["mm", "alpha"] }));
    match c.input(2) {
        Some((cname, _)) => {
            nodes.push(json!({ "id": "beta", "op": "constant", "attrs": { "value": [beta], "shape": [] } }));
            nodes.push(json!({ "id": "bc", "op": "mul", "inputs": [cname, "beta"] }));
            nodes.push(json!({ "id": "n", "op": "add", "inputs": ["scaled", "bc"] }));
        }
        None => nodes.push(json!({ "id": "n", "op": "identity", "inputs": ["scaled"] })),
    }
    Ok(Converted {
        doc: json!({ "format": "sluice/graph@1", "inputs": decls, "nodes": nodes, "outputs": ["n"] }),
        inputs,
        weights: Weights::new(),
        compared: 1,
    })
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
        let conv = match convert(&case) {
            Ok(c) => c,
            Err(reason) => {
                skipped.push(format!("{}: {reason}", case.name));
                continue;
            }
        };
        row.applicable += 1;
        let g = graph(&conv.doc);
        let gpu = run_gpu(&g, &conv.weights, &conv.inputs);
        let cpu = run_cpu(&g, &conv.weights, &conv.inputs);
        let mut ok = true;
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
        applicable >= 200,
        "only {applicable} of {total} cases were applicable"
    );
}
