//! Bad graph files: each fault gives the right message, a non-zero exit from both
//! `sluice validate` and `sluice run`, and no panic.

use serde_json::{json, Value};
use sluice_tests::sluice;

fn base() -> Value {
    json!({
        "format": "sluice/graph@1",
        "name": "small",
        "inputs": { "x": { "shape": ["N", 6], "dtype": "f32" } },
        "nodes": [
            { "id": "fc1", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 4 } },
            { "id": "act", "op": "relu", "inputs": ["fc1"] },
            { "id": "probs", "op": "softmax", "inputs": ["act"], "attrs": { "axis": -1 } }
        ],
        "outputs": ["probs"]
    })
}

/// The base graph with `f` applied.
fn with(f: impl FnOnce(&mut Value)) -> String {
    let mut v = base();
    f(&mut v);
    v.to_string()
}

fn node(v: &mut Value, i: usize) -> &mut Value {
    &mut v["nodes"][i]
}

/// (fault, graph text, expected message fragments).
fn faults() -> Vec<(&'static str, String, Vec<&'static str>)> {
    vec![
        (
            "malformed JSON",
            "{\"format\": \"sluice/graph@1\",\n \"nodes\": [,]}".into(),
            vec!["malformed JSON", "line 2"],
        ),
        (
            "not an object",
            "[1, 2, 3]".into(),
            vec!["must be a JSON object"],
        ),
        (
            "empty file",
            String::new(),
            vec!["malformed JSON", "line 1"],
        ),
        (
            "missing format",
            with(|v| {
                v.as_object_mut().unwrap().remove("format");
            }),
            vec!["format: missing"],
        ),
        (
            "unknown format version",
            with(|v| v["format"] = json!("sluice/graph@2")),
            vec!["unknown format version 'sluice/graph@2'"],
        ),
        (
            "unknown top-level field",
            with(|v| v["nodez"] = json!([])),
            vec!["unknown field 'nodez'"],
        ),
        (
            "unknown node field",
            with(|v| node(v, 1)["atrs"] = json!({})),
            vec!["node 'act'", "unknown field 'atrs'"],
        ),
        (
            "unknown operator",
            with(|v| node(v, 1)["op"] = json!("rleu")),
            vec!["unknown operator 'rleu'", "known:", "relu"],
        ),
        (
            "missing input reference",
            with(|v| node(v, 1)["inputs"] = json!(["fc9"])),
            vec!["node 'act'", "'fc9' is neither a graph input nor a node"],
        ),
        (
            "dangling output port",
            with(|v| node(v, 1)["inputs"] = json!(["fc1:3"])),
            vec!["port 3 does not exist"],
        ),
        (
            "cycle",
            with(|v| node(v, 0)["inputs"] = json!(["probs"])),
            vec!["part of a cycle", "fc1"],
        ),
        (
            "wrong arity",
            with(|v| {
                node(v, 1)["op"] = json!("add");
            }),
            vec!["'add' takes 2 inputs", "got 1"],
        ),
        (
            "missing required attribute",
            with(|v| node(v, 0)["attrs"] = json!({})),
            vec!["node 'fc1'", "required attribute 'out_features' is missing"],
        ),
        (
            "wrong attribute type",
            with(|v| node(v, 0)["attrs"]["out_features"] = json!("ten")),
            vec!["attribute 'out_features' must be an integer"],
        ),
        (
            "unknown attribute",
            with(|v| node(v, 1)["attrs"] = json!({ "axis": 1 })),
            vec!["unknown attribute 'axis'", "takes none"],
        ),
        (
            "axis out of range",
            with(|v| node(v, 2)["attrs"]["axis"] = json!(5)),
            vec!["node 'probs'", "axis 5 is out of range for rank 2"],
        ),
        (
            "matmul shape mismatch",
            with(|v| {
                v["inputs"]["w"] = json!({ "shape": [5, 3] });
                node(v, 1)["op"] = json!("matmul");
                node(v, 1)["inputs"] = json!(["fc1", "w"]);
            }),
            vec!["inner dimensions differ", "[N, 4]", "[5, 3]"],
        ),
        (
            "broadcast mismatch",
            with(|v| {
                v["inputs"]["b"] = json!({ "shape": [3] });
                node(v, 1)["op"] = json!("add");
                node(v, 1)["inputs"] = json!(["fc1", "b"]);
            }),
            vec!["do not broadcast", "[N, 4]", "[3]"],
        ),
        (
            "dtype mismatch",
            with(|v| v["inputs"]["x"]["dtype"] = json!("i32")),
            vec!["'linear' needs an f32", "i32 [N, 6]"],
        ),
        (
            "output names nothing",
            with(|v| v["outputs"] = json!(["prob"])),
            vec!["output 'prob' names nothing", "did you mean 'probs'"],
        ),
        (
            "no outputs",
            with(|v| v["outputs"] = json!([])),
            vec!["at least one output"],
        ),
        (
            "duplicate id",
            with(|v| node(v, 1)["id"] = json!("fc1")),
            vec!["duplicate id 'fc1'"],
        ),
        (
            "negative dimension",
            with(|v| v["inputs"]["x"]["shape"] = json!(["N", -6])),
            vec!["inputs.x.shape[1]", "non-negative integer or a symbol"],
        ),
        (
            "unknown dtype",
            with(|v| v["inputs"]["x"]["dtype"] = json!("f64")),
            vec!["unknown dtype 'f64'"],
        ),
        (
            "impossible reshape",
            with(|v| {
                node(v, 1)["op"] = json!("reshape");
                node(v, 1)["attrs"] = json!({ "shape": [3, 5] });
            }),
            vec!["cannot reshape [N, 4]"],
        ),
        (
            "conv on 2-D input",
            with(|v| {
                node(v, 1)["op"] = json!("conv2d");
                node(v, 1)["attrs"] = json!({ "out_channels": 2, "kernel_size": [3, 3] });
            }),
            vec!["needs a 4-D input [N, C, H, W]", "[N, 4]"],
        ),
        (
            "nodes not an array",
            with(|v| v["nodes"] = json!({ "fc1": {} })),
            vec!["nodes: must be an array"],
        ),
        (
            "bad choice",
            with(|v| {
                node(v, 1)["op"] = json!("gelu");
                node(v, 1)["attrs"] = json!({ "approximate": "fast" });
            }),
            vec!["must be one of none, tanh"],
        ),
        (
            "layout names unknown node",
            with(|v| v["layout"] = json!({ "fc7": [1, 2] })),
            vec!["layout names 'fc7'"],
        ),
        (
            "stage pin of unknown node",
            with(|v| v["stages"] = json!({ "fc7": 1 })),
            vec!["stages pins 'fc7'"],
        ),
        (
            "split sizes do not add up",
            with(|v| {
                node(v, 1)["op"] = json!("split");
                node(v, 1)["attrs"] = json!({ "axis": 1, "sizes": [1, 2] });
            }),
            vec!["do not add up to the axis length 4"],
        ),
        (
            "not a permutation",
            with(|v| {
                node(v, 1)["op"] = json!("transpose");
                node(v, 1)["attrs"] = json!({ "perm": [0, 0] });
            }),
            vec!["is not a permutation"],
        ),
        (
            "float gather indices",
            with(|v| {
                v["inputs"]["i"] = json!({ "shape": [2] });
                node(v, 1)["op"] = json!("gather");
                node(v, 1)["inputs"] = json!(["fc1", "i"]);
            }),
            vec!["gather indices must be i32"],
        ),
        (
            "id with a colon",
            with(|v| node(v, 2)["id"] = json!("probs:0")),
            vec!["is not a valid id"],
        ),
        (
            "non-string reference",
            with(|v| node(v, 1)["inputs"] = json!([7])),
            vec!["inputs[0]: must be a string reference"],
        ),
        (
            "concat mismatch",
            with(|v| {
                v["inputs"]["z"] = json!({ "shape": ["N", 3, 2] });
                node(v, 1)["op"] = json!("concat");
                node(v, 1)["inputs"] = json!(["fc1", "z"]);
                node(v, 1)["attrs"] = json!({ "axis": 1 });
            }),
            vec!["all dimensions except axis 1 must match"],
        ),
        (
            "linear of 2^33 features",
            with(|v| node(v, 0)["attrs"]["out_features"] = json!(1u64 << 33)),
            vec!["node 'fc1'", "out_features must be at most 2147483647"],
        ),
        (
            "weight over the tensor limit",
            with(|v| {
                v["inputs"]["x"]["shape"] = json!(["N", 65536]);
                node(v, 0)["attrs"]["out_features"] = json!(8192);
            }),
            vec![
                "weight 'fc1.weight'",
                "max_tensor_elements",
                "--max-tensor-elements",
            ],
        ),
        (
            "weights together over the host memory limit",
            with(|v| {
                v["inputs"]["x"]["shape"] = json!(["N", 4096]);
                let nodes = v["nodes"].as_array_mut().unwrap();
                for i in 0..40 {
                    nodes.push(
                        json!({ "id": format!("big{i}"), "op": "linear", "inputs": ["x"],
                                       "attrs": { "out_features": 4096 } }),
                    );
                }
            }),
            vec![
                "weights and constants",
                "max_host_bytes",
                "--max-host-bytes",
            ],
        ),
        (
            "rank over the limit",
            with(|v| v["inputs"]["x"]["shape"] = json!(["N", 1, 1, 1, 1, 1, 1, 1, 6])),
            vec!["9 axes", "max_rank", "--max-rank"],
        ),
        (
            "inferred rank over the limit",
            with(|v| {
                node(v, 1)["op"] = json!("unsqueeze");
                node(v, 1)["attrs"] = json!({ "axes": [0, 1, 2, 3, 4, 5, 6] });
            }),
            vec!["node 'act'", "9 axes", "max_rank"],
        ),
        (
            "list attribute over the limit",
            with(|v| {
                node(v, 1)["op"] = json!("unsqueeze");
                node(v, 1)["attrs"] = json!({ "axes": (0..2000).collect::<Vec<i64>>() });
            }),
            vec!["node 'act'", "max_list_len", "--max-list-len"],
        ),
        (
            "too many nodes",
            with(|v| {
                let nodes = v["nodes"].as_array_mut().unwrap();
                for i in 0..10_000 {
                    nodes.push(json!({ "id": format!("r{i}"), "op": "relu", "inputs": ["x"] }));
                }
            }),
            vec!["10003 nodes", "max_nodes", "--max-nodes"],
        ),
        (
            "too many outputs",
            with(|v| v["outputs"] = json!(vec!["probs"; 300])),
            vec!["300 outputs", "max_outputs", "--max-outputs"],
        ),
        (
            "name too long",
            with(|v| node(v, 2)["id"] = json!("p".repeat(200))),
            vec!["node id", "max_name_len"],
        ),
        (
            "dimension over the tensor limit",
            with(|v| v["inputs"]["x"]["shape"] = json!(["N", u64::MAX])),
            vec!["input 'x'", "max_tensor_elements"],
        ),
        (
            "padding beyond the window limit",
            with(|v| {
                v["inputs"]["x"]["shape"] = json!(["N", 1, 8, 8]);
                node(v, 0)["op"] = json!("conv2d");
                node(v, 0)["attrs"] =
                    json!({ "out_channels": 2, "kernel_size": [3, 3], "pads": [1u64 << 40, 0] });
            }),
            vec!["node 'fc1'", "pads must be"],
        ),
        (
            "a zero single-integer kernel",
            with(|v| {
                v["inputs"]["x"]["shape"] = json!(["N", 1, 8, 8]);
                node(v, 0)["op"] = json!("conv2d");
                node(v, 0)["attrs"] = json!({ "out_channels": 2, "kernel_size": 0 });
            }),
            vec!["node 'fc1'", "kernel_size must be 2 integers in 1..="],
        ),
        (
            "a window list of the wrong length",
            with(|v| {
                v["inputs"]["x"]["shape"] = json!(["N", 1, 8, 8]);
                node(v, 0)["op"] = json!("max_pool2d");
                node(v, 0)["attrs"] = json!({ "kernel_size": 2, "strides": [1, 2, 2] });
            }),
            vec!["node 'fc1'", "strides must be 2 integers"],
        ),
        (
            "float attribute beyond f32",
            with(|v| {
                node(v, 1)["op"] = json!("clip");
                node(v, 1)["attrs"] = json!({ "min": 1e300 });
            }),
            vec!["node 'act'", "within f32's range"],
        ),
        (
            "axis of a scalar",
            with(|v| {
                v["inputs"]["s"] = json!({ "shape": [] });
                node(v, 1)["op"] = json!("concat");
                node(v, 1)["inputs"] = json!(["s", "s"]);
                node(v, 1)["attrs"] = json!({ "axis": 0 });
            }),
            vec!["node 'act'", "does not exist in a tensor of rank 0"],
        ),
        (
            "slice step of zero",
            with(|v| {
                node(v, 1)["op"] = json!("slice");
                node(v, 1)["attrs"] =
                    json!({ "starts": [0], "ends": [2], "axes": [1], "steps": [0] });
            }),
            vec!["node 'act'", "slice step must not be 0"],
        ),
        (
            "constant values do not fill shape",
            with(|v| {
                node(v, 1)["op"] = json!("constant");
                node(v, 1)["inputs"] = json!([]);
                node(v, 1)["attrs"] = json!({ "value": [1, 2, 3], "shape": [2, 2] });
            }),
            vec!["3 values do not fill shape [2, 2]"],
        ),
    ]
}

fn check(text: &str, expected: &[&str]) -> Result<(), String> {
    let dir =
        std::env::temp_dir().join(format!("sluice-bad-{}-{}", std::process::id(), text.len()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let file = dir.join(format!(
        "g{:x}.json",
        text.bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
    ));
    std::fs::write(&file, text).map_err(|e| e.to_string())?;
    for args in [
        vec!["validate"],
        vec!["run", "--device", "cpu", "--seed-inputs"],
    ] {
        let out = sluice()
            .args(&args)
            .arg(&file)
            .output()
            .map_err(|e| e.to_string())?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return Err(format!("`sluice {}` exited 0", args[0]));
        }
        if out.status.code() != Some(1) || stderr.contains("panicked") {
            return Err(format!(
                "`sluice {}` crashed ({:?}): {stderr}",
                args[0], out.status
            ));
        }
        for e in expected {
            if !stderr.contains(e) {
                return Err(format!(
                    "`sluice {}` did not say \"{e}\"; it said:\n{stderr}",
                    args[0]
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn every_fault_is_reported_with_a_clear_message_and_exit_1() {
    let faults = faults();
    assert!(faults.len() >= 40);
    let failures: Vec<String> = faults
        .iter()
        .filter_map(|(name, text, expected)| {
            check(text, expected).err().map(|e| format!("{name}: {e}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} faults misreported:\n{}",
        failures.len(),
        faults.len(),
        failures.join("\n\n")
    );
}

/// Graphs at the extremes of what is valid run to the end, from the file to the outputs.
#[test]
fn slices_at_the_i64_extremes_run() {
    let dir = std::env::temp_dir().join(format!("sluice-extreme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("slices.json");
    let graph = json!({
        "format": "sluice/graph@1",
        "inputs": { "x": { "shape": ["N", 5] } },
        "nodes": [
            { "id": "head", "op": "slice", "inputs": ["x"], "attrs": {
                "starts": [i64::MIN], "ends": [i64::MAX], "axes": [1], "steps": [i64::MAX] } },
            { "id": "tail", "op": "slice", "inputs": ["x"], "attrs": {
                "starts": [i64::MAX], "ends": [i64::MIN], "axes": [1], "steps": [i64::MIN] } },
            { "id": "flip", "op": "slice", "inputs": ["x"], "attrs": {
                "starts": [-1], "ends": [i64::MIN], "axes": [-1], "steps": [-1] } }
        ],
        "outputs": ["head", "tail", "flip"]
    });
    std::fs::write(&file, graph.to_string()).unwrap();
    let out = sluice()
        .args(["run", "--device", "cpu", "--batch", "3", "--seed-inputs"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
}

#[test]
fn all_problems_are_reported_in_one_pass() {
    let text = with(|v| {
        v["extra"] = json!(1);
        node(v, 0)["attrs"]["out_features"] = json!(-2);
        node(v, 1)["op"] = json!("rleu");
        v["outputs"] = json!(["probs", "nothing"]);
    });
    check(
        &text,
        &[
            "4 problems",
            "unknown field 'extra'",
            "out_features must be at least 1",
            "unknown operator 'rleu'",
            "output 'nothing' names nothing",
        ],
    )
    .unwrap();
}

#[test]
fn validate_prints_every_edge_type_of_a_valid_graph() {
    let dir = std::env::temp_dir().join(format!("sluice-good-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("small.json");
    std::fs::write(&file, base().to_string()).unwrap();
    let out = sluice().arg("validate").arg(&file).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "fc1",
        "f32 [N, 4]",
        "probs",
        "softmax",
        "batch: samples stay independent",
    ] {
        assert!(text.contains(line), "missing {line} in:\n{text}");
    }
}

/// PyTorch's `kernel_size=3`: a single integer is the same window on every axis, for
/// `validate` and `run` alike.
#[test]
fn a_single_integer_window_validates_and_runs() {
    let dir = std::env::temp_dir().join(format!("sluice-scalar-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("scalar.json");
    let graph = json!({
        "format": "sluice/graph@1",
        "inputs": { "x": { "shape": ["N", 1, 8, 8] } },
        "nodes": [
            { "id": "conv", "op": "conv2d", "inputs": ["x"],
              "attrs": { "out_channels": 2, "kernel_size": 3, "pads": 1 } },
            { "id": "pool", "op": "max_pool2d", "inputs": ["conv"],
              "attrs": { "kernel_size": 2, "strides": 2 } }
        ],
        "outputs": ["pool"]
    });
    std::fs::write(&file, graph.to_string()).unwrap();
    let out = sluice().arg("validate").arg(&file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("f32 [N, 2, 4, 4]"), "{text}");
    let out = sluice()
        .args(["run", "--device", "cpu", "--batch", "2", "--seed-inputs"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn validate_names_the_node_that_couples_samples() {
    let dir = std::env::temp_dir().join(format!("sluice-coupled-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("coupled.json");
    std::fs::write(&file, with(|v| node(v, 2)["attrs"]["axis"] = json!(0))).unwrap();
    let out = sluice().arg("validate").arg(&file).output().unwrap();
    assert!(out.status.success(), "a coupled graph is still valid");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("batch: 'probs' couples samples (softmax along axis 0, the batch axis)"),
        "{text}"
    );
    let out = sluice()
        .args(["validate", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["couplings"],
        json!([{ "node": "probs", "reason": "softmax along axis 0, the batch axis" }])
    );
    assert_eq!(
        v["nodes"][0]["batch"],
        json!([{ "kind": "axis", "axis": 0 }])
    );
    assert_eq!(v["nodes"][3]["batch"][0]["node"], json!("probs"));
}

#[test]
fn the_format_documentation_covers_every_operator_and_its_example_is_valid() {
    let text = std::fs::read_to_string(sluice_tests::root().join("docs/graph-format.md")).unwrap();
    for s in sluice_engine::ops::schemas() {
        assert!(
            text.contains(&format!("| `{}` |", s.name)),
            "docs/graph-format.md does not document '{}'",
            s.name
        );
        for a in s.attrs {
            assert!(
                text.contains(&format!("`{}`", a.name)),
                "docs/graph-format.md does not document {}.{}",
                s.name,
                a.name
            );
        }
    }
    let start = text.find("```json\n").unwrap() + 8;
    let end = start + text[start..].find("```").unwrap();
    sluice_engine::load_graph(&text[start..end])
        .unwrap_or_else(|p| panic!("the documented example is invalid: {p}"));
}
