//! The `sluice` CLI end to end: examples on the GPU and the CPU, .npy inputs and outputs,
//! safetensors weights, devices and the operator listing, and bad arguments.

use serde_json::{json, Value};
use sluice_engine::{npy, Tensor};
use sluice_tests::{compare, root, sluice};
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run_json(args: &[&str]) -> Value {
    let out = sluice().args(args).arg("--json").output().unwrap();
    assert!(
        out.status.success(),
        "sluice {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn examples_run_on_gpu_and_cpu_with_the_same_result() {
    for name in ["mlp", "cnn", "transformer_block"] {
        let graph = root().join(format!("assets/graphs/{name}.json"));
        let g = graph.to_str().unwrap();
        let gpu = run_json(&["run", g, "--batch", "4", "--seed-inputs", "--seed", "3"]);
        let cpu = run_json(&[
            "run",
            g,
            "--batch",
            "4",
            "--seed-inputs",
            "--seed",
            "3",
            "--device",
            "cpu",
        ]);
        let (a, b) = (&gpu["outputs"][0], &cpu["outputs"][0]);
        assert_eq!(a["shape"], b["shape"], "{name}");
        assert_eq!(a["shape"][0], 4, "{name}: batch not bound");
        let (ca, cb) = (
            a["checksum"].as_f64().unwrap(),
            b["checksum"].as_f64().unwrap(),
        );
        assert!(
            (ca - cb).abs() <= 1e-3 * (1.0 + cb.abs()),
            "{name}: checksums {ca} vs {cb}"
        );
        assert!(
            !gpu["device"].as_str().unwrap().starts_with("cpu"),
            "{name} did not run on a GPU adapter: {}",
            gpu["device"]
        );
    }
}

#[test]
fn the_cpu_devices_micro_batch_and_pipeline_like_the_gpu() {
    // `--device cpu` (fast) and `--device reference` go through the same planning,
    // micro-batching and stage pipelines: every output equals the GPU's within float
    // tolerance.
    for name in ["mlp", "cnn", "transformer_block"] {
        let graph = root().join(format!("assets/graphs/{name}.json"));
        let g = graph.to_str().unwrap();
        for (batch, micro, stages) in [("8", "4", "2"), ("6", "3", "1"), ("4", "1", "2")] {
            let mut outputs = Vec::new();
            for device in ["gpu", "cpu", "reference"] {
                let dir = tmp(&format!("{name}-{batch}-{micro}-{stages}-{device}"));
                let doc = run_json(&[
                    "run",
                    g,
                    "--batch",
                    batch,
                    "--microbatches",
                    micro,
                    "--stages",
                    stages,
                    "--seed-inputs",
                    "--seed",
                    "5",
                    "--device",
                    device,
                    "--output",
                    dir.to_str().unwrap(),
                ]);
                let want_mbs: usize = micro.parse().unwrap();
                assert_eq!(doc["micro_batches"], want_mbs, "{name} {device}: {doc}");
                let devices = doc["device"].as_str().unwrap().to_string();
                assert_eq!(
                    doc["metrics"]["devices"].as_array().map(Vec::len),
                    Some(stages.parse::<usize>().unwrap()),
                    "{name} {device}: one device per stage"
                );
                match device {
                    "cpu" => assert!(devices.starts_with("cpu,") || devices == "cpu", "{devices}"),
                    "reference" => assert!(devices.starts_with("cpu (reference)"), "{devices}"),
                    _ => {}
                }
                let out_name = doc["outputs"][0]["name"]
                    .as_str()
                    .unwrap()
                    .replace(':', "_");
                let bytes = std::fs::read(dir.join(format!("{out_name}.npy"))).unwrap();
                outputs.push(npy::parse(&bytes).unwrap());
            }
            for (device, out) in ["cpu", "reference"].iter().zip(&outputs[1..]) {
                compare(
                    &format!("{name} batch {batch} M={micro} S={stages}: {device} vs gpu"),
                    out,
                    &outputs[0],
                    1e-5,
                    1e-4,
                )
                .unwrap();
            }
        }
    }
}

#[test]
fn npy_inputs_and_outputs_round_trip() {
    let dir = tmp("npy");
    let x: Vec<f32> = (0..2 * 784)
        .map(|i| ((i % 97) as f32 - 48.0) / 50.0)
        .collect();
    let input = dir.join("x.npy");
    std::fs::write(
        &input,
        npy::to_bytes(&Tensor::f32(vec![2, 784], x)).unwrap(),
    )
    .unwrap();
    let graph = root().join("assets/graphs/mlp.json");
    let mut outs = Vec::new();
    for device in ["gpu", "cpu"] {
        let out_dir = dir.join(device);
        let status = sluice()
            .args([
                "run",
                graph.to_str().unwrap(),
                "--batch",
                "2",
                "--device",
                device,
            ])
            .arg("--input")
            .arg(format!("x={}", input.display()))
            .arg("--output")
            .arg(&out_dir)
            .status()
            .unwrap();
        assert!(status.success());
        let t = npy::parse(&std::fs::read(out_dir.join("probs.npy")).unwrap()).unwrap();
        assert_eq!(t.shape, vec![2, 10]);
        let sums: Vec<f32> = t
            .as_f32()
            .unwrap()
            .chunks(10)
            .map(|r| r.iter().sum())
            .collect();
        assert!(
            sums.iter().all(|s| (s - 1.0).abs() < 1e-5),
            "softmax rows sum to {sums:?}"
        );
        outs.push(t);
    }
    compare("mlp gpu vs cpu", &outs[0], &outs[1], 1e-6, 1e-4).unwrap();
}

#[test]
fn bad_inputs_are_clear_errors() {
    let dir = tmp("badin");
    let graph = root().join("assets/graphs/mlp.json");
    let g = graph.to_str().unwrap();
    let wrong = dir.join("wrong.npy");
    std::fs::write(
        &wrong,
        npy::to_bytes(&Tensor::f32(vec![3, 5], vec![0.0; 15])).unwrap(),
    )
    .unwrap();
    let garbage = dir.join("garbage.npy");
    std::fs::write(&garbage, b"\x93NUMPY garbage").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--input".into(), format!("x={}", wrong.display())],
            "has shape [3, 5] but the graph declares f32 [3, 784]",
        ),
        (
            vec!["--input".into(), format!("x={}", garbage.display())],
            "garbage.npy",
        ),
        (
            vec!["--input".into(), "x=/nonexistent/x.npy".into()],
            "cannot read /nonexistent/x.npy",
        ),
        (
            vec!["--input".into(), "y=whatever.npy".into()],
            "the graph has no input 'y' (inputs: x)",
        ),
        (
            vec!["--input".into(), "x".into()],
            "--input takes NAME=FILE.npy",
        ),
        (
            vec!["--batch".into(), "0".into()],
            "--batch must be at least 1",
        ),
    ];
    for (args, expected) in cases {
        let out = sluice()
            .args(["run", g, "--device", "cpu"])
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected \"{expected}\" in:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"));
    }
    let out = sluice()
        .args(["run", "/nonexistent/graph.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/graph.json"));
}

#[test]
fn weights_come_from_a_safetensors_file() {
    let dir = tmp("st");
    let mut doc: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("assets/graphs/mlp.json")).unwrap(),
    )
    .unwrap();
    let g = sluice_engine::load_graph(&doc.to_string()).unwrap();
    let weights = sluice_engine::weights::init_weights(&g, 42);
    let views: Vec<(String, safetensors::tensor::TensorView)> = weights
        .iter()
        .map(|(k, t)| {
            let bytes: &[u8] = bytemuck_cast(t.as_f32().unwrap());
            (
                k.clone(),
                safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    t.shape.clone(),
                    bytes,
                )
                .unwrap(),
            )
        })
        .collect();
    std::fs::write(
        dir.join("mlp.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    doc["params"] = serde_json::json!({ "file": "mlp.safetensors" });
    std::fs::write(dir.join("mlp.json"), doc.to_string()).unwrap();
    let from_file = run_json(&[
        "run",
        dir.join("mlp.json").to_str().unwrap(),
        "--device",
        "cpu",
        "--seed-inputs",
    ]);
    let seeded = run_json(&[
        "run",
        root().join("assets/graphs/mlp.json").to_str().unwrap(),
        "--device",
        "cpu",
        "--seed-inputs",
    ]);
    assert_eq!(
        from_file["outputs"][0]["checksum"],
        seeded["outputs"][0]["checksum"]
    );
    assert_eq!(
        from_file["outputs"][0]["first"],
        seeded["outputs"][0]["first"]
    );
    // A file without one of the weights names it.
    let partial: Vec<_> = weights
        .iter()
        .filter(|(k, _)| k.as_str() != "fc2.bias")
        .map(|(k, t)| {
            (
                k.clone(),
                safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    t.shape.clone(),
                    bytemuck_cast(t.as_f32().unwrap()),
                )
                .unwrap(),
            )
        })
        .collect();
    std::fs::write(
        dir.join("mlp.safetensors"),
        safetensors::serialize(partial, None).unwrap(),
    )
    .unwrap();
    let out = sluice()
        .args([
            "run",
            dir.join("mlp.json").to_str().unwrap(),
            "--device",
            "cpu",
            "--seed-inputs",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tensor 'fc2.bias'"));
}

fn bytemuck_cast(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

#[test]
fn devices_and_ops_list_what_exists() {
    // A fresh cache: `sluice devices` calibrates the adapter, prints the rates and keeps
    // them; a second call reads the kept ones.
    let cache = tmp("rates");
    let devices_json = || {
        let out = sluice()
            .env("SLUICE_CACHE_DIR", &cache)
            .args(["devices", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let devices = devices_json();
    let list = devices["adapters"].as_array().unwrap();
    assert!(!list.is_empty(), "no adapters listed");
    assert!(list[0]["max_storage_binding"].as_u64().unwrap() > 0);
    let rates = &devices["rates"]["rates"];
    for key in [
        "flops_per_s",
        "bytes_per_s",
        "transfer_bytes_per_s",
        "pass_overhead_s",
    ] {
        let v = rates[key].as_f64().unwrap_or(-1.0);
        assert!(v > 0.0 && v.is_finite(), "rate {key} = {v}: {devices}");
    }
    assert!(
        cache.join("rates.json").is_file(),
        "the calibration was not kept"
    );
    assert_eq!(
        devices_json()["rates"],
        devices["rates"],
        "kept rates are reused"
    );
    let text = sluice()
        .env("SLUICE_CACHE_DIR", &cache)
        .arg("devices")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("GFLOP/s") && text.contains("stage transfer"),
        "{text}"
    );
    let ops = run_json(&["ops"]);
    let names: Vec<&str> = ops
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    for op in [
        "matmul",
        "linear",
        "conv2d",
        "layer_norm",
        "gather",
        "where",
        "constant",
    ] {
        assert!(names.contains(&op), "{op} missing from sluice ops");
    }
}

#[test]
fn plan_train_prints_the_joint_graph_and_its_gradients() {
    let dir = tmp("train");
    let path = dir.join("train.json");
    let doc = serde_json::json!({
        "format": "sluice/graph@1", "name": "train",
        "inputs": { "x": { "shape": ["N", 8] } },
        "nodes": [
            { "id": "fc1", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 16 } },
            { "id": "act", "op": "relu", "inputs": ["fc1"] },
            { "id": "fc2", "op": "linear", "inputs": ["act"], "attrs": { "out_features": 4 } },
            { "id": "p", "op": "log_softmax", "inputs": ["fc2"] },
            { "id": "loss", "op": "reduce_mean", "inputs": ["p"], "attrs": { "keepdims": false } }
        ],
        "outputs": ["loss"] });
    std::fs::write(&path, doc.to_string()).unwrap();
    let path = path.to_str().unwrap();
    let v = run_json(&["plan", path, "--batch", "4", "--train", "loss"]);
    let grads = v["gradients"].as_array().unwrap();
    assert_eq!(grads.len(), 4);
    assert_eq!(
        grads[0],
        serde_json::json!(["fc1.weight", "fc1.weight.grad"])
    );
    // relu's backward is a unary_grad step, log_softmax's a log_softmax_grad one.
    let steps = v["stages"][0]["steps"].to_string();
    assert!(
        steps.contains("UnaryGrad") && steps.contains("SoftmaxGrad"),
        "{steps}"
    );
    for (args, says) in [
        (
            vec!["--microbatches", "2", "--train", "loss"],
            "micro-batches",
        ),
        (vec!["--train", "p"], "not an output"),
    ] {
        let out = sluice()
            .args(["plan", path, "--batch", "4"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn onnx_models_import_export_and_run_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let model = root().join("tests/data/onnx-models/resnet18_style/model.onnx");
    let out = dir.path().join("imported");
    let ok = sluice()
        .args([
            "import",
            model.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let said = String::from_utf8_lossy(&ok.stdout);
    assert!(
        said.contains("opset 17") && said.contains("69 ONNX nodes"),
        "{said}"
    );
    let graph = out.join("model.json");
    assert!(graph.exists() && out.join("model.safetensors").exists());
    // Importing again does not replace what is there, unless asked to.
    let again = sluice()
        .args([
            "import",
            model.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    // The written graph and the model itself run, with the same outputs.
    let input = root().join("tests/data/onnx-models/resnet18_style/input_0.npy");
    let mut outputs = Vec::new();
    for (k, source) in [graph.clone(), model.clone()].iter().enumerate() {
        let o = dir.path().join(format!("out{k}"));
        let run = sluice()
            .args([
                "run",
                source.to_str().unwrap(),
                "--device",
                "cpu",
                "--input",
            ])
            .arg(format!("image={}", input.display()))
            .args(["--output", o.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let file = std::fs::read_dir(&o)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        outputs.push(sluice_engine::npy::parse(&std::fs::read(file).unwrap()).unwrap());
    }
    assert_eq!(outputs[0], outputs[1]);
    let want = sluice_engine::npy::parse(
        &std::fs::read(root().join("tests/data/onnx-models/resnet18_style/output_0.npy")).unwrap(),
    )
    .unwrap();
    compare("resnet18_style via the CLI", &outputs[0], &want, 1e-4, 1e-4).unwrap();
    // Export writes a model; validate reads .onnx directly.
    let exported = dir.path().join("re.onnx");
    let ex = sluice()
        .args([
            "export",
            graph.to_str().unwrap(),
            "-o",
            exported.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        ex.status.success(),
        "{}",
        String::from_utf8_lossy(&ex.stderr)
    );
    let v = run_json(&["validate", exported.to_str().unwrap()]);
    assert_eq!(v["valid"], json!(true), "{v}");
}

#[test]
fn hostile_onnx_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(root().join("tests/data/onnx-models/mlp_tiny/model.onnx")).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage.onnx", b"\xff\xff\xff\xff not a model".to_vec()),
        ("truncated.onnx", bytes[..bytes.len() / 2].to_vec()),
        ("empty.onnx", Vec::new()),
    ];
    for (name, content) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        let out = sluice()
            .args(["validate", path.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} was accepted");
        assert!(
            err.contains(name),
            "{name}: the error does not name the file: {err}"
        );
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
}

#[test]
fn per_pass_timing_can_be_sampled_or_left_out_without_changing_the_outputs() {
    // `--pass-timing` picks which micro-batches write timestamp queries (what per-pass
    // telemetry costs is the difference `cargo xtask bench` reports); the outputs are the
    // same whichever it is, and a setting that means nothing is refused.
    let graph = root().join("assets/bench/w2_mlp.json");
    let g = graph.to_str().unwrap();
    let args = ["bench", g, "--batch", "8", "--reps", "4", "--seed", "4"];
    let sampled = run_json(&args);
    let every = run_json(&[&args[..], &["--pass-timing", "every"]].concat());
    let one_in_3 = run_json(&[&args[..], &["--pass-timing", "3"]].concat());
    let untimed = run_json(&[&args[..], &["--no-pass-timing"]].concat());
    let off = run_json(&[&args[..], &["--pass-timing", "off"]].concat());
    assert_eq!(untimed["timing"], "host_completion", "{untimed}");
    assert_eq!(off["timing"], "host_completion", "{off}");
    if every["timing"] == "timestamp_queries" {
        assert_eq!(sampled["timing"], "sampled_timestamp_queries", "{sampled}");
        assert_eq!(one_in_3["timing"], "sampled_timestamp_queries");
    }
    println!(
        "default {}, every {}, off {}",
        sampled["timing"], every["timing"], untimed["timing"]
    );
    for r in [&every, &one_in_3, &untimed, &off] {
        assert_eq!(sampled["outputs"], r["outputs"]);
    }
    for bad in ["0", "1.5", "sometimes", "99999999999"] {
        let out = sluice()
            .args([&args[..], &["--pass-timing", bad]].concat())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--pass-timing {bad} was accepted");
        assert!(err.contains("--pass-timing") && err.contains(bad), "{err}");
    }
}

#[test]
fn bench_keeps_an_input_on_the_device_and_computes_what_run_does() {
    // `--keep x` uploads W3's x once (the warm-up's seeded value); every measured batch
    // is then a run reading it, so each gives what `sluice run` gives on that x.
    let graph = root().join("assets/bench/w3_chain.json");
    let g = graph.to_str().unwrap();
    for device in ["gpu", "cpu"] {
        let kept = run_json(&[
            "bench", g, "--reps", "3", "--seed", "7", "--keep", "x", "--device", device,
        ]);
        let once = run_json(&["run", g, "--seed-inputs", "--seed", "7", "--device", device]);
        assert_eq!(kept["metrics"]["samples"], 3, "{kept}");
        assert_eq!(
            kept["outputs"][0]["checksum"], once["outputs"][0]["checksum"],
            "{device}: {kept} vs {once}"
        );
    }
    let out = sluice()
        .args(["bench", g, "--reps", "2", "--keep", "y"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--keep y"), "{err}");
    let out = sluice()
        .args([
            "bench",
            g,
            "--reps",
            "2",
            "--keep",
            "x",
            "--precision",
            "mixed",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--keep"), "{err}");
}

#[test]
fn a_large_matmul_is_tuned_once_per_adapter_and_sluice_autotune_lists_the_choice() {
    let dir = tmp("autotune");
    let file = dir.join("autotune.json");
    let _ = std::fs::remove_file(&file);
    let w1 = root().join("assets/bench/w1_matmul.json");
    let bench = || {
        let out = sluice()
            .env("SLUICE_AUTOTUNE_CACHE", &file)
            .args([
                "run",
                w1.to_str().unwrap(),
                "--batch",
                "128",
                "--seed-inputs",
            ])
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["outputs"][0]["checksum"].clone()
    };
    let tuned = bench();
    let kept = std::fs::read_to_string(&file).expect("the run kept its tuning");
    // The second run reads the choice back: the file is not rewritten.
    assert_eq!(bench(), tuned, "the same answer with the kept choice");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), kept);
    let untuned = sluice()
        .env("SLUICE_AUTOTUNE", "off")
        .args([
            "run",
            w1.to_str().unwrap(),
            "--batch",
            "128",
            "--seed-inputs",
        ])
        .arg("--json")
        .output()
        .unwrap();
    assert!(untuned.status.success());
    let untuned: Value = serde_json::from_slice(&untuned.stdout).unwrap();
    assert_eq!(
        untuned["outputs"][0]["checksum"], tuned,
        "every variant gives the same bits"
    );

    let list = sluice()
        .env("SLUICE_AUTOTUNE_CACHE", &file)
        .arg("autotune")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    println!("{text}");
    assert!(list.status.success());
    assert!(
        text.contains("m128 n1024 k1024 f32·f32→f32 f32: chose "),
        "{text}"
    );
    let chosen = text
        .lines()
        .filter(|l| l.trim_start().starts_with('*'))
        .count();
    assert_eq!(chosen, 1, "one variant marked as chosen: {text}");
    let doc: Value = serde_json::from_slice(
        &sluice()
            .env("SLUICE_AUTOTUNE_CACHE", &file)
            .args(["autotune", "--json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(doc["format"], "sluice/autotune@1");
    let cleared = sluice()
        .env("SLUICE_AUTOTUNE_CACHE", &file)
        .args(["autotune", "--clear"])
        .output()
        .unwrap();
    assert!(cleared.status.success());
    assert!(!file.exists());
}

#[test]
fn a_missing_input_is_an_error_unless_seeded_inputs_are_asked_for_and_then_said() {
    // No input is invented unasked: spirals_mlp's `labels` (and `x`) not given is an
    // error naming the input and both ways to give it.
    let graph = root().join("assets/graphs/spirals_mlp.json");
    let g = graph.to_str().unwrap();
    let dir = tmp("missing");
    let x = dir.join("x.npy");
    std::fs::write(
        &x,
        npy::to_bytes(&Tensor::f32(vec![2, 2], vec![0.5, -0.5, 0.25, 1.0])).unwrap(),
    )
    .unwrap();
    let out = sluice()
        .args(["run", g, "--device", "cpu", "--batch", "2", "--input"])
        .arg(format!("x={}", x.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for want in ["input 'labels'", "--input labels=FILE.npy", "--seed-inputs"] {
        assert!(stderr.contains(want), "expected \"{want}\" in:\n{stderr}");
    }
    assert!(out.stdout.is_empty(), "no loss is printed");
    // Asked for, the seeded inputs are named: in the JSON and on stderr ...
    let out = sluice()
        .args(["run", g, "--device", "cpu", "--batch", "2", "--seed-inputs"])
        .args(["--json", "--input"])
        .arg(format!("x={}", x.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["seeded_inputs"], json!(["labels"]), "{doc}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("labels"));
    // ... and in the printed report.
    let out = sluice()
        .args(["run", g, "--device", "cpu", "--seed-inputs", "--seed", "9"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("seeded with random values (seed 9)") && stdout.contains("labels"),
        "{stdout}"
    );
    // A benchmark runs on seeded inputs by default, and says which.
    let bench = run_json(&["bench", g, "--device", "cpu", "--reps", "1", "--batch", "8"]);
    let mut seeded: Vec<String> = serde_json::from_value(bench["seeded_inputs"].clone()).unwrap();
    seeded.sort();
    assert_eq!(seeded, ["labels", "x"], "{bench}");
}

#[test]
fn every_shipped_example_runs_with_seeded_inputs_at_batch_1_8_and_32() {
    // Seeded class labels and indices stay inside their range: spirals_mlp has 3 classes
    // (its labels were seeded in [0, 4)).
    let mut graphs: Vec<PathBuf> = ["assets/graphs", "assets/bench"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root().join(d)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    graphs.sort();
    assert!(graphs.len() >= 10, "{graphs:?}");
    for graph in &graphs {
        let g = graph.to_str().unwrap();
        for batch in ["1", "8", "32"] {
            let doc = run_json(&[
                "run",
                g,
                "--device",
                "cpu",
                "--batch",
                batch,
                "--seed-inputs",
            ]);
            let graph_doc: Value =
                serde_json::from_str(&std::fs::read_to_string(graph).unwrap()).unwrap();
            let inputs = graph_doc["inputs"].as_object().map_or(0, |o| o.len());
            assert_eq!(
                doc["seeded_inputs"].as_array().unwrap().len(),
                inputs,
                "{g} at batch {batch}: {doc}"
            );
        }
    }
}

#[test]
fn a_failing_stage_is_named_a_stage() {
    // An out-of-range label read by the loss on stage 1: the error names the stage as a
    // stage, not as a node.
    let graph = root().join("assets/graphs/spirals_mlp.json");
    let dir = tmp("stage-name");
    let labels = dir.join("labels.npy");
    std::fs::write(
        &labels,
        npy::to_bytes(&Tensor {
            shape: vec![2],
            data: sluice_engine::TensorData::I32(vec![0, 7]),
        })
        .unwrap(),
    )
    .unwrap();
    let out = sluice()
        .args([
            "run",
            graph.to_str().unwrap(),
            "--device",
            "cpu",
            "--batch",
            "2",
        ])
        .args(["--stages", "2", "--seed-inputs", "--input"])
        .arg(format!("labels={}", labels.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("label 7 is outside [0, 3)"), "{stderr}");
    assert!(!stderr.contains("node 'stage"), "{stderr}");
}
