//! Every operator's GPU kernel against its CPU reference on seeded random inputs, over the
//! catalogue in `support/op_cases.rs` (odd sizes, broadcasting, every attribute).

mod autotune;

use sluice_engine::ops;
use sluice_tests::op_cases::{self, op_cases};
use sluice_tests::{case_inputs, compare, graph, random_weights, run_cpu, run_gpu};
use std::collections::BTreeSet;

#[test]
fn every_operator_matches_its_cpu_reference() {
    let mut failures = Vec::new();
    let mut covered = BTreeSet::new();
    let cases = op_cases();
    for (i, case) in cases.iter().enumerate() {
        eprintln!("case: {}", case.label);
        let g = graph(&case.doc);
        let weights = random_weights(&g, 11 + i as u64);
        let inputs = case_inputs(&g, case, 100 + i as u64);
        let gpu = run_gpu(&g, &weights, &inputs);
        let cpu = run_cpu(&g, &weights, &inputs);
        assert_eq!(gpu.len(), cpu.len());
        for ((name, a), (_, b)) in gpu.iter().zip(&cpu) {
            if let Err(e) = compare(&format!("{} output {name}", case.label), a, b, 1e-4, 1e-4) {
                failures.push(e);
            }
        }
        covered.insert(
            case.doc["nodes"][0]["op"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    let missing: Vec<&str> = ops::schemas()
        .iter()
        .map(|s| s.name)
        .filter(|n| !covered.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "operators without a GPU-vs-CPU case: {missing:?}"
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    println!(
        "{} cases over {} operators: GPU equals CPU reference",
        cases.len(),
        covered.len()
    );
}

#[test]
fn reductions_take_the_pointwise_work_they_read_where_that_keeps_the_answer() {
    // The catalogue's prologue cases (run against the CPU reference above): the planner
    // fuses exactly those it should, and the GPU lowers each fused one without reading a
    // stored input.
    use sluice_engine::gpu::program::lower_plan;
    use sluice_engine::plan::{Plan, Work};
    let cases = op_cases::prologue_cases();
    for (case, fused) in &cases {
        let plan = Plan::new(&graph(&case.doc)).unwrap();
        let prologues: Vec<_> = plan
            .steps
            .iter()
            .filter(|s| matches!(s.work, Work::Prologue { .. }))
            .collect();
        assert_eq!(prologues.len(), usize::from(*fused), "{}", case.label);
        if let Some(step) = prologues.first() {
            assert_eq!(step.nodes, ["m", "a", "s", "d", "r"], "{}", case.label);
            assert_eq!(plan.steps.len(), 1, "{}: one step in all", case.label);
            let program = lower_plan(&plan).unwrap();
            let first = &program.passes[0].kernel;
            assert!(
                first.source.contains("sl_prologue"),
                "{}: {} computes no prologue",
                case.label,
                first.label
            );
        }
    }
    println!("{} prologue cases planned as expected", cases.len());
}

#[test]
fn example_graphs_match_the_cpu_reference() {
    for name in ["mlp", "cnn", "transformer_block"] {
        let path = sluice_tests::root().join(format!("assets/graphs/{name}.json"));
        let text = std::fs::read_to_string(&path).unwrap();
        let g = sluice_engine::load_graph(&text).unwrap_or_else(|p| panic!("{name}: {p}"));
        let bound = g.bind(&[("N".to_string(), 3)].into()).unwrap();
        let weights = sluice_engine::weights::init_weights(&bound, 5);
        let inputs = sluice_engine::exec::dataset::random_inputs(&bound, 9).unwrap();
        let gpu = run_gpu(&bound, &weights, &inputs);
        let cpu = run_cpu(&bound, &weights, &inputs);
        for ((n, a), (_, b)) in gpu.iter().zip(&cpu) {
            compare(&format!("{name}:{n}"), a, b, 1e-4, 1e-3).unwrap();
        }
    }
}

#[test]
fn a_mean_loss_runs_end_to_end_and_labels_out_of_range_never_read_past_a_row() {
    use sluice_engine::exec::{RunConfig, RunContext};
    use sluice_engine::{Tensor, TensorData};
    use std::collections::HashMap;
    let labels = |v: Vec<i32>| Tensor {
        shape: vec![v.len()],
        data: TensorData::I32(v),
    };
    let x = Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 0.0, 0.0, 0.0]);
    // Labels as a graph input: a rank-0 mean through a GPU session (upload, the
    // driver, readback), and out-of-range labels refused before upload.
    let g = sluice_engine::load_graph(
        r#"{ "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 3] }, "y": { "shape": ["N"], "dtype": "i32" } },
            "nodes": [ { "id": "ce", "op": "softmax_cross_entropy", "inputs": ["x", "y"],
                         "attrs": { "label_smoothing": 0.1 } } ],
            "outputs": ["ce"] }"#,
    )
    .unwrap();
    let config = RunConfig {
        batch: 2,
        ..RunConfig::default()
    };
    let mut session = sluice_engine::gpu::session(&g, &Default::default(), &config).unwrap();
    let run = |session: &mut sluice_engine::exec::Session, y: Vec<i32>| {
        let data = HashMap::from([("x".to_string(), x.clone()), ("y".to_string(), labels(y))]);
        session.run_blocking(&data, &RunContext::new("ce"))
    };
    let report = run(&mut session, vec![2, 0]).unwrap();
    let loss = &report.outputs[0].1;
    assert_eq!(loss.shape, Vec::<usize>::new());
    // Row 0: lse 3.407606, nll 0.407606, smoothing term lse − 2; row 1: ln 3 both.
    let want = (0.9 * 0.407_606 + 0.1 * 1.407_606 + 1.098_612) / 2.0;
    let got = loss.as_f32().unwrap()[0];
    assert!((got - want).abs() < 1e-5, "{got} != {want}");
    let e = run(&mut session, vec![0, 3]).unwrap_err().to_string();
    assert!(e.contains("label 3 is outside [0, 3)"), "{e}");
    // Labels computed in the graph cannot be checked before the run: the CPU reference
    // refuses them, the GPU gives NaN for that element and the right loss for the others.
    let doc = serde_json::json!({
        "format": "sluice/graph@1",
        "inputs": { "x": { "shape": [2, 3] }, "f": { "shape": [2] } },
        "nodes": [
            { "id": "y", "op": "cast", "inputs": ["f"], "attrs": { "to": "i32" } },
            { "id": "l", "op": "nll_loss", "inputs": ["x", "y"], "attrs": { "reduction": "none" } }
        ],
        "outputs": ["l"]
    });
    let g = graph(&doc);
    let inputs = HashMap::from([
        ("x".to_string(), x.clone()),
        ("f".to_string(), Tensor::f32(vec![2], vec![1.5, -1.0])),
    ]);
    let gpu = run_gpu(&g, &Default::default(), &inputs);
    let v = gpu[0].1.as_f32().unwrap();
    assert_eq!(v[0], -2.0);
    assert!(v[1].is_nan(), "{v:?}");
    let cpu = sluice_engine::cpu::run(&g, &Default::default(), &inputs);
    assert!(cpu
        .unwrap_err()
        .to_string()
        .contains("label -1 is outside [0, 3)"));
}

#[test]
fn recurrent_inputs_left_out_before_given_ones_are_zero_element_tensors() {
    use sluice_engine::Tensor;
    use std::collections::HashMap;
    // lstm x, w, r, (no b), (no sequence_lens), initial_h: the absent inputs are
    // zero-element constants, and the answer is the one with b = 0 and full lengths.
    let doc = |absent: bool| {
        let mut nodes = vec![];
        let mut inputs = vec!["x", "w", "r"];
        if absent {
            nodes.push(serde_json::json!({ "id": "none", "op": "constant",
                "attrs": { "value": [], "shape": [0] } }));
            inputs.extend(["none", "none", "h0"]);
        } else {
            inputs.extend(["b", "lens", "h0"]);
        }
        nodes.push(
            serde_json::json!({ "id": "n", "op": "lstm", "inputs": inputs,
            "attrs": { "hidden_size": 3 } }),
        );
        let mut decls = serde_json::json!({
            "x": { "shape": [4, 2, 5] }, "w": { "shape": [1, 12, 5] },
            "r": { "shape": [1, 12, 3] }, "h0": { "shape": [1, 2, 3] } });
        if !absent {
            decls["b"] = serde_json::json!({ "shape": [1, 24] });
            decls["lens"] = serde_json::json!({ "shape": [2], "dtype": "i32" });
        }
        serde_json::json!({
            "format": "sluice/graph@1",
            "inputs": decls,
            "nodes": nodes,
            "outputs": ["n", "n:1", "n:2"],
        })
    };
    let values =
        |n: usize, k: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32) * k).sin()).collect() };
    let inputs = HashMap::from([
        ("x".to_string(), Tensor::f32(vec![4, 2, 5], values(40, 0.7))),
        (
            "w".to_string(),
            Tensor::f32(vec![1, 12, 5], values(60, 1.3)),
        ),
        (
            "r".to_string(),
            Tensor::f32(vec![1, 12, 3], values(36, 0.9)),
        ),
        ("h0".to_string(), Tensor::f32(vec![1, 2, 3], values(6, 2.1))),
    ]);
    let g = graph(&doc(true));
    let gpu = run_gpu(&g, &Default::default(), &inputs);
    let cpu = run_cpu(&g, &Default::default(), &inputs);
    let mut with_b = inputs.clone();
    with_b.insert("b".to_string(), Tensor::f32(vec![1, 24], vec![0.0; 24]));
    let lens = sluice_engine::TensorData::I32(vec![4, 4]);
    with_b.insert(
        "lens".to_string(),
        Tensor {
            shape: vec![2],
            data: lens,
        },
    );
    let want = run_cpu(&graph(&doc(false)), &Default::default(), &with_b);
    for ((a, b), (n, c)) in gpu.iter().zip(&cpu).zip(&want) {
        compare(&format!("gpu {n}"), &a.1, c, 1e-5, 1e-4).unwrap();
        compare(&format!("cpu {n}"), &b.1, c, 0.0, 0.0).unwrap();
    }
}

#[test]
fn attention_takes_nonpad_kv_seqlen_after_left_out_past_inputs() {
    use sluice_engine::{Tensor, TensorData};
    use std::collections::HashMap;
    // q, k, v, attn_mask, (no past_key), (no past_value), nonpad_kv_seqlen: the KV-cache
    // inputs are zero-element constants.
    let doc = serde_json::json!({
        "format": "sluice/graph@1",
        "inputs": { "q": { "shape": [3, 4, 5, 6] }, "k": { "shape": [3, 2, 7, 6] },
                    "v": { "shape": [3, 2, 7, 3] }, "m": { "shape": [3, 1, 5, 7] },
                    "lens": { "shape": [3], "dtype": "i32" } },
        "nodes": [
            { "id": "none", "op": "constant", "attrs": { "value": [], "shape": [0] } },
            { "id": "n", "op": "attention", "inputs": ["q", "k", "v", "m", "none", "none", "lens"],
              "attrs": { "is_causal": 1 } }
        ],
        "outputs": ["n"],
    });
    let values =
        |n: usize, k: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32) * k).sin()).collect() };
    let inputs = HashMap::from([
        (
            "q".to_string(),
            Tensor::f32(vec![3, 4, 5, 6], values(360, 0.7)),
        ),
        (
            "k".to_string(),
            Tensor::f32(vec![3, 2, 7, 6], values(252, 1.3)),
        ),
        (
            "v".to_string(),
            Tensor::f32(vec![3, 2, 7, 3], values(126, 0.9)),
        ),
        (
            "m".to_string(),
            Tensor::f32(vec![3, 1, 5, 7], values(105, 2.1)),
        ),
        (
            "lens".to_string(),
            Tensor {
                shape: vec![3],
                data: TensorData::I32(vec![7, 5, 2]),
            },
        ),
    ]);
    let g = graph(&doc);
    let gpu = run_gpu(&g, &Default::default(), &inputs);
    let cpu = run_cpu(&g, &Default::default(), &inputs);
    compare("attention nonpad", &gpu[0].1, &cpu[0].1, 1e-4, 1e-4).unwrap();
    // Sample 2 (length 2, five queries ending there): queries 0..2 see no key at all.
    let y = cpu[0].1.as_f32().unwrap();
    let sample2 = &y[2 * 4 * 5 * 3..];
    assert!(
        sample2[..9].iter().all(|&x| x == 0.0),
        "{:?}",
        &sample2[..9]
    );
    assert!(sample2[9..12].iter().any(|&x| x != 0.0));
}
