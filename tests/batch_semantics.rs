//! Batch semantics end to end: graphs whose operators combine samples along the batch
//! axis (reductions, softmax and norms along it, transposes and reshapes that move or
//! merge it, contractions over it, gathers into it), alone and mixed with independent
//! branches, under every configuration M ∈ {1, 2, 4} × S ∈ {1, 2} on the GPU (a thread
//! per stage), the CPU device and the one-thread session browsers run. Each configuration
//! either equals the CPU reference on the whole batch or is refused, naming the node
//! that couples samples.

use serde_json::{json, Value};
use sluice_engine::exec::device::Device;
use sluice_engine::exec::{dataset, Concurrency, RunConfig, RunContext, Session};
use sluice_engine::gpu::GpuDevice;
use sluice_engine::weights::init_weights;
use sluice_engine::{Graph, RunError};
use sluice_tests::{compare, graph, run_cpu};

/// A test graph: name, document, and the nodes that couple its outputs (none: samples
/// stay independent all the way); a refusal must name one of them.
struct Case {
    name: &'static str,
    doc: Value,
    coupling: &'static [&'static str],
}

fn doc(inputs: Value, nodes: Value, outputs: Value) -> Value {
    json!({ "format": "sluice/graph@1", "inputs": inputs, "nodes": nodes, "outputs": outputs, "params": { "seed": 3 } })
}

fn x4() -> Value {
    json!({ "x": { "shape": ["N", 4] } })
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "reduce_sum over the batch",
            doc: doc(
                x4(),
                json!([
                    { "id": "s", "op": "reduce_sum", "inputs": ["x"], "attrs": { "axes": [0], "keepdims": true } },
                    { "id": "y", "op": "relu", "inputs": ["s"] }
                ]),
                json!(["y"]),
            ),
            coupling: &["s"],
        },
        Case {
            name: "softmax along the batch",
            doc: doc(
                x4(),
                json!([
                    { "id": "p", "op": "softmax", "inputs": ["x"], "attrs": { "axis": 0 } },
                    { "id": "y", "op": "sqrt", "inputs": ["p"] }
                ]),
                json!(["y"]),
            ),
            coupling: &["p"],
        },
        Case {
            name: "the issue's example: sum and softmax over axis 0",
            doc: doc(
                x4(),
                json!([
                    { "id": "sum", "op": "reduce_sum", "inputs": ["x"], "attrs": { "axes": [0], "keepdims": true } },
                    { "id": "soft", "op": "softmax", "inputs": ["x"], "attrs": { "axis": 0 } }
                ]),
                json!(["sum", "soft"]),
            ),
            coupling: &["soft", "sum"],
        },
        Case {
            name: "transpose moving the batch (independent)",
            doc: doc(
                x4(),
                json!([
                    { "id": "t", "op": "transpose", "inputs": ["x"], "attrs": { "perm": [1, 0] } },
                    { "id": "y", "op": "tanh", "inputs": ["t"] }
                ]),
                json!(["y"]),
            ),
            coupling: &[],
        },
        Case {
            name: "transpose then reshape merging the batch",
            doc: doc(
                x4(),
                json!([
                    { "id": "t", "op": "transpose", "inputs": ["x"], "attrs": { "perm": [1, 0] } },
                    { "id": "r", "op": "reshape", "inputs": ["t"], "attrs": { "shape": [-1] } },
                    { "id": "y", "op": "relu", "inputs": ["r"] }
                ]),
                json!(["y"]),
            ),
            coupling: &["r"],
        },
        Case {
            name: "x transposed times x (contracts the batch)",
            doc: doc(
                x4(),
                json!([
                    { "id": "t", "op": "transpose", "inputs": ["x"], "attrs": { "perm": [1, 0] } },
                    { "id": "g", "op": "matmul", "inputs": ["t", "x"] },
                    { "id": "y", "op": "sigmoid", "inputs": ["g"] }
                ]),
                json!(["y"]),
            ),
            coupling: &["g"],
        },
        Case {
            name: "log_softmax along the batch after a transpose",
            doc: doc(
                json!({ "x": { "shape": [4, "N"] } }),
                json!([
                    { "id": "n", "op": "log_softmax", "inputs": ["x"], "attrs": { "axis": 1 } },
                    { "id": "y", "op": "relu", "inputs": ["n"] }
                ]),
                json!(["y"]),
            ),
            coupling: &["n"],
        },
        Case {
            name: "reshape keeping samples contiguous (independent)",
            doc: doc(
                json!({ "x": { "shape": ["N", 2, 4] } }),
                json!([
                    { "id": "r", "op": "reshape", "inputs": ["x"], "attrs": { "shape": [-1, 4] } },
                    { "id": "y", "op": "linear", "inputs": ["r"], "attrs": { "out_features": 3 } }
                ]),
                json!(["y"]),
            ),
            coupling: &[],
        },
        Case {
            name: "independent branch next to a coupled one",
            doc: doc(
                x4(),
                json!([
                    { "id": "h", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 5 } },
                    { "id": "a", "op": "relu", "inputs": ["h"] },
                    { "id": "m", "op": "reduce_mean", "inputs": ["x"], "attrs": { "axes": [0], "keepdims": true } },
                    { "id": "c", "op": "sub", "inputs": ["x", "m"] }
                ]),
                json!(["a", "c"]),
            ),
            coupling: &["m"],
        },
        Case {
            name: "an MLP with row softmax (independent)",
            doc: doc(
                x4(),
                json!([
                    { "id": "h", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 6 } },
                    { "id": "a", "op": "gelu", "inputs": ["h"] },
                    { "id": "o", "op": "linear", "inputs": ["a"], "attrs": { "out_features": 3 } },
                    { "id": "p", "op": "softmax", "inputs": ["o"], "attrs": { "axis": -1 } }
                ]),
                json!(["p"]),
            ),
            coupling: &[],
        },
        Case {
            name: "gather indexing the batch axis",
            doc: doc(
                json!({ "x": { "shape": ["N", 4] }, "i": { "shape": [3], "dtype": "i32" } }),
                json!([
                    { "id": "g", "op": "gather", "inputs": ["x", "i"], "attrs": { "axis": 0 } },
                    { "id": "y", "op": "exp", "inputs": ["g"] }
                ]),
                json!(["y"]),
            ),
            coupling: &["g"],
        },
        Case {
            name: "every sample against every other ([N,1] + [1,N])",
            doc: doc(
                json!({ "x": { "shape": ["N", 1] }, "y": { "shape": [1, "N"] } }),
                json!([
                    { "id": "pairs", "op": "add", "inputs": ["x", "y"] },
                    { "id": "z", "op": "relu", "inputs": ["pairs"] }
                ]),
                json!(["z"]),
            ),
            coupling: &["pairs"],
        },
        Case {
            name: "normalising by the batch mean, then a row softmax",
            doc: doc(
                x4(),
                json!([
                    { "id": "mu", "op": "reduce_mean", "inputs": ["x"], "attrs": { "axes": [0], "keepdims": true } },
                    { "id": "d", "op": "sub", "inputs": ["x", "mu"] },
                    { "id": "p", "op": "softmax", "inputs": ["d"], "attrs": { "axis": 1 } }
                ]),
                json!(["p"]),
            ),
            coupling: &["mu"],
        },
        Case {
            name: "reduction over features only (independent)",
            doc: doc(
                json!({ "x": { "shape": ["N", 3, 4] } }),
                json!([
                    { "id": "s", "op": "reduce_mean", "inputs": ["x"], "attrs": { "axes": [1, 2], "keepdims": false } },
                    { "id": "y", "op": "sqrt", "inputs": ["s"] }
                ]),
                json!(["y"]),
            ),
            coupling: &[],
        },
        Case {
            name: "convolution and batch norm per sample (independent)",
            doc: doc(
                json!({ "x": { "shape": ["N", 2, 5, 5] } }),
                json!([
                    { "id": "c", "op": "conv2d", "inputs": ["x"], "attrs": { "out_channels": 3, "kernel_size": [3, 3] } },
                    { "id": "b", "op": "batch_norm", "inputs": ["c"] },
                    { "id": "y", "op": "relu", "inputs": ["b"] }
                ]),
                json!(["y"]),
            ),
            coupling: &[],
        },
        Case {
            name: "lstm over time, the batch on x's axis 1 (independent)",
            doc: doc(
                json!({ "x": { "shape": [3, "N", 4] } }),
                json!([
                    { "id": "w", "op": "param", "attrs": { "key": "w", "shape": [2, 12, 4] } },
                    { "id": "r", "op": "param", "attrs": { "key": "r", "shape": [2, 12, 3] } },
                    { "id": "l", "op": "lstm", "inputs": ["x", "w", "r"],
                      "attrs": { "hidden_size": 3, "direction": "bidirectional" } }
                ]),
                json!(["l", "l:1", "l:2"]),
            ),
            coupling: &[],
        },
        Case {
            name: "gru batch first, then attention over its steps (independent)",
            doc: doc(
                json!({ "x": { "shape": ["N", 5, 4] } }),
                json!([
                    { "id": "w", "op": "param", "attrs": { "key": "w", "shape": [1, 6, 4] } },
                    { "id": "r", "op": "param", "attrs": { "key": "r", "shape": [1, 6, 2] } },
                    { "id": "g", "op": "gru", "inputs": ["x", "w", "r"],
                      "attrs": { "hidden_size": 2, "layout": 1 } },
                    { "id": "h", "op": "reshape", "inputs": ["g"], "attrs": { "shape": [0, 5, 2] } },
                    { "id": "a", "op": "attention", "inputs": ["h", "h", "h"],
                      "attrs": { "q_num_heads": 1, "kv_num_heads": 1, "is_causal": 1 } }
                ]),
                json!(["a"]),
            ),
            coupling: &[],
        },
        Case {
            name: "lstm recurring along the batch",
            doc: doc(
                json!({ "x": { "shape": ["N", 2, 4] } }),
                json!([
                    { "id": "w", "op": "param", "attrs": { "key": "w", "shape": [1, 8, 4] } },
                    { "id": "r", "op": "param", "attrs": { "key": "r", "shape": [1, 8, 2] } },
                    { "id": "l", "op": "lstm", "inputs": ["x", "w", "r"], "attrs": { "hidden_size": 2 } }
                ]),
                json!(["l:1"]),
            ),
            coupling: &["l"],
        },
        Case {
            name: "einsum summing over the batch",
            doc: doc(
                x4(),
                json!([
                    { "id": "e", "op": "einsum", "inputs": ["x", "x"], "attrs": { "equation": "bi,bj->ij" } },
                    { "id": "y", "op": "tanh", "inputs": ["e"] }
                ]),
                json!(["y"]),
            ),
            coupling: &["e"],
        },
    ]
}

#[derive(Clone, Copy, Debug)]
enum Runner {
    Gpu,
    Cpu,
    OneThread,
}

impl Runner {
    fn name(self) -> &'static str {
        match self {
            Runner::Gpu => "GPU",
            Runner::Cpu => "CPU device",
            Runner::OneThread => "one thread",
        }
    }
}

fn devices(runner: Runner, stages: usize) -> Vec<Box<dyn Device>> {
    match runner {
        Runner::Cpu => (0..stages)
            .map(|_| Box::new(sluice_engine::cpu::CpuDevice::new()) as Box<dyn Device>)
            .collect(),
        Runner::Gpu | Runner::OneThread => pollster::block_on(GpuDevice::open_many(stages))
            .unwrap()
            .into_iter()
            .map(|d| Box::new(d) as Box<dyn Device>)
            .collect(),
    }
}

/// One configuration: the outputs, or the error that refused it.
fn run(
    g: &Graph,
    runner: Runner,
    micro: usize,
    stages: usize,
    data: &sluice_engine::exec::Values,
) -> Result<Vec<(String, sluice_engine::Tensor)>, RunError> {
    let weights = init_weights(g, 3);
    let config = RunConfig {
        batch: 8,
        microbatches: micro,
        stages,
        ..RunConfig::default()
    };
    let concurrency = match runner {
        Runner::OneThread => Concurrency::OneThread,
        Runner::Gpu | Runner::Cpu => Concurrency::ThreadPerStage,
    };
    pollster::block_on(async {
        let mut session =
            Session::compile(g, &weights, &config, devices(runner, stages), &|_| {}).await?;
        let ctx = RunContext {
            concurrency,
            ..RunContext::new("batch")
        };
        Ok(session.run(data, &ctx).await?.outputs)
    })
}

#[test]
fn every_configuration_equals_the_whole_batch_or_is_refused_naming_the_node() {
    let cases = cases();
    assert!(cases.len() >= 12);
    let mut failures = Vec::new();
    let mut table = vec![
        "| graph | coupling node | M=1 S=1 | M=2 S=1 | M=4 S=1 | M=1 S=2 | M=2 S=2 | M=4 S=2 |"
            .to_string(),
        "|---|---|---|---|---|---|---|---|".to_string(),
    ];
    let mut accepted = 0;
    let mut refused = 0;
    for case in &cases {
        let g = graph(&case.doc);
        let semantics = g.batch_semantics();
        let named = semantics.output_coupling().map(|c| c.node);
        let expected = |n: &str| case.coupling.contains(&n);
        if named
            .as_deref()
            .map_or(!case.coupling.is_empty(), |n| !expected(n))
        {
            failures.push(format!(
                "{}: the engine names {named:?} as coupling, expected one of {:?}",
                case.name, case.coupling
            ));
        }
        let mut data = dataset::seeded(&g, 8, 11).unwrap();
        if let Some(i) = data.get_mut("i") {
            i.data = sluice_engine::TensorData::I32(vec![0, 5, 7]);
        }
        let whole = run_cpu(&dataset::bind(&g, 8).unwrap(), &init_weights(&g, 3), &data);
        let nodes = if case.coupling.is_empty() {
            "—".to_string()
        } else {
            case.coupling.join(", ")
        };
        let mut row = format!("| {} | {nodes} |", case.name);
        for stages in [1, 2] {
            // Constants and weight reads go with their readers, so a graph of one operator
            // has one stage to give (more are refused before any work, saying so).
            if sluice_engine::plan::stages::partition_nodes(&g).len() < stages {
                row.push_str(&" n/a (one operator node) |".repeat(3));
                continue;
            }
            for micro in [1, 2, 4] {
                let mut cell = Vec::new();
                for runner in [Runner::Gpu, Runner::Cpu, Runner::OneThread] {
                    let what = format!("{} M={micro} S={stages} on {}", case.name, runner.name());
                    let must_refuse = !case.coupling.is_empty() && micro > 1;
                    match run(&g, runner, micro, stages, &data) {
                        Ok(outputs) => {
                            if must_refuse {
                                failures.push(format!("{what}: accepted, should be refused"));
                            }
                            let mut worst = 0.0f32;
                            for ((name, got), (_, want)) in outputs.iter().zip(&whole) {
                                match compare(&format!("{what} {name}"), got, want, 1e-5, 1e-4) {
                                    Ok(()) => {
                                        let a = got.to_f32_vec();
                                        let b = want.to_f32_vec();
                                        for (x, y) in a.iter().zip(&b) {
                                            worst = worst.max((x - y).abs());
                                        }
                                    }
                                    Err(e) => failures.push(e),
                                }
                            }
                            accepted += 1;
                            cell.push(format!("{:.0e}", worst));
                        }
                        Err(RunError::BatchCoupled { node, .. }) => {
                            if !must_refuse {
                                failures.push(format!("{what}: refused but should run"));
                            } else if !expected(&node) {
                                failures.push(format!("{what}: refused naming '{node}'"));
                            }
                            refused += 1;
                            cell.push(format!("refused ('{node}')"));
                        }
                        Err(e) => failures.push(format!("{what}: {e}")),
                    }
                }
                cell.dedup();
                let text = if cell.is_empty() {
                    "failed".to_string()
                } else if cell.iter().all(|c| c.starts_with("refused")) {
                    cell[0].clone()
                } else {
                    format!("= (max err {})", cell.join(", "))
                };
                row.push_str(&format!(" {text} |"));
            }
        }
        table.push(row);
    }
    println!("{}", table.join("\n"));
    println!(
        "{} graphs x 6 configurations x 3 runners: {accepted} runs equal to the CPU reference on the whole batch, {refused} refused naming the coupling node",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn datasets_larger_than_a_coupled_batch_are_refused_naming_the_node() {
    let g = graph(&cases()[0].doc);
    let data = dataset::seeded(&g, 20, 1).unwrap();
    let err = run(&g, Runner::Gpu, 1, 1, &data).unwrap_err();
    match err {
        RunError::BatchCoupled { node, refused, .. } => {
            assert_eq!(node, "s");
            assert!(refused.contains("20 samples"), "{refused}");
        }
        other => panic!("expected a refusal, got {other}"),
    }
    // The CLI says the same, before any work.
    let out = sluice_tests::sluice()
        .args([
            "run",
            "--seed-inputs",
            "--batch",
            "8",
            "--microbatches",
            "4",
        ])
        .arg(write_graph(&g))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("node 's' couples samples"),
        "{stderr}"
    );
}

fn write_graph(g: &Graph) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("sluice-batch-{}.json", std::process::id()));
    std::fs::write(&p, serde_json::to_vec(&g.doc).unwrap()).unwrap();
    p
}

/// A graph where one constant `c`, one weight `w` (a `param`) and the graph input `x` are
/// read by nodes of different stages, with `stages` pins placing those nodes (none when
/// `pins` is empty).
fn shared_sources(pins: &[(&str, usize)]) -> Graph {
    let mut d = doc(
        x4(),
        json!([
            { "id": "c", "op": "constant", "attrs": { "value": [0.5, -1.0, 2.0, 0.25] } },
            { "id": "w", "op": "param", "attrs": { "key": "w", "shape": [4, 4] } },
            { "id": "a", "op": "add", "inputs": ["x", "c"] },
            { "id": "p1", "op": "matmul", "inputs": ["a", "w"] },
            { "id": "t", "op": "tanh", "inputs": ["p1"] },
            { "id": "m", "op": "mul", "inputs": ["t", "c"] },
            { "id": "p2", "op": "matmul", "inputs": ["m", "w"] },
            { "id": "s", "op": "add", "inputs": ["p2", "x"] },
            { "id": "out", "op": "mul", "inputs": ["s", "c"] }
        ]),
        json!(["out", "t"]),
    );
    if !pins.is_empty() {
        let pins: serde_json::Map<String, Value> = pins
            .iter()
            .map(|(n, s)| (n.to_string(), json!(s)))
            .collect();
        d["stages"] = Value::Object(pins);
    }
    graph(&d)
}

#[test]
fn constants_weights_and_inputs_read_by_several_stages_reach_each_of_them() {
    let two = [
        ("a", 0),
        ("p1", 0),
        ("t", 1),
        ("m", 1),
        ("p2", 1),
        ("s", 1),
        ("out", 1),
    ];
    let three = [
        ("a", 0),
        ("p1", 0),
        ("t", 1),
        ("m", 1),
        ("p2", 2),
        ("s", 2),
        ("out", 2),
    ];
    let configs: [(usize, &[(&str, usize)]); 5] =
        [(1, &[]), (2, &[]), (3, &[]), (2, &two), (3, &three)];
    let mut failures = Vec::new();
    for (stages, pins) in configs {
        let g = shared_sources(pins);
        let data = dataset::seeded(&g, 8, 5).unwrap();
        let whole = run_cpu(&dataset::bind(&g, 8).unwrap(), &init_weights(&g, 3), &data);
        for micro in [1, 2] {
            for runner in [Runner::Gpu, Runner::Cpu, Runner::OneThread] {
                let what = format!(
                    "S={stages} M={micro} pinned={} on {}",
                    !pins.is_empty(),
                    runner.name()
                );
                match run(&g, runner, micro, stages, &data) {
                    Ok(outputs) => {
                        assert_eq!(outputs.len(), whole.len(), "{what}");
                        for ((name, got), (want_name, want)) in outputs.iter().zip(&whole) {
                            assert_eq!(name, want_name, "{what}");
                            if let Err(e) =
                                compare(&format!("{what} {name}"), got, want, 1e-5, 1e-4)
                            {
                                failures.push(e);
                            }
                        }
                    }
                    Err(e) => failures.push(format!("{what}: {e}")),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
