//! W1 matmul benchmark: f32 C = A·B at M = N = K = 512 and 1024, inputs resident on the
//! device, GFLOP/s of the GPU kernel next to the CPU reference. Not a test: it reports
//! what it measures and asserts nothing about speed.
//!
//! `cargo bench -p sluice-engine --bench matmul` (add `-- --quick` for one size).

use serde_json::json;
use sluice_engine::exec::dataset::random_inputs;
use sluice_engine::gpu::{GpuContext, GpuExecutable};
use sluice_engine::graph::{doc, Graph};
use sluice_engine::plan::Plan;
use sluice_engine::weights::Weights;
use std::time::Instant;

fn matmul_graph(n: usize) -> Graph {
    let d = doc::decode_value(&json!({
        "format": "sluice/graph@1",
        "name": "w1_matmul",
        "inputs": { "a": { "shape": [n, n] }, "b": { "shape": [n, n] } },
        "nodes": [ { "id": "c", "op": "matmul", "inputs": ["a", "b"] } ],
        "outputs": ["c"]
    }))
    .expect("valid document");
    Graph::build(d).expect("valid graph")
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let sizes: &[usize] = if quick { &[512] } else { &[512, 1024] };
    let ctx = match pollster::block_on(GpuContext::new()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("matmul bench needs a GPU adapter: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "adapter: {} ({}, {})",
        ctx.adapter.name, ctx.adapter.backend, ctx.adapter.driver
    );
    println!(
        "{:>6} {:>14} {:>14} {:>14}",
        "n", "gpu GFLOP/s", "gpu ms/iter", "cpu GFLOP/s"
    );
    for &n in sizes {
        let graph = matmul_graph(n);
        let inputs = random_inputs(&graph, 1).expect("inputs");
        let flops = 2.0 * (n as f64).powi(3);
        let mut exe = pollster::block_on(GpuExecutable::compile(
            &ctx,
            Plan::new(&graph).expect("plan"),
            &Weights::new(),
            1,
        ))
        .expect("compile");
        exe.upload_inputs(&inputs).expect("upload");
        // Warm-up: driver shader compilation and first-touch of memory.
        pollster::block_on(exe.run_resident(2)).expect("warm-up");
        let reps = if n >= 1024 { 5 } else { 20 };
        let t = Instant::now();
        pollster::block_on(exe.run_resident(reps)).expect("run");
        let gpu_s = t.elapsed().as_secs_f64() / reps as f64;
        // The CPU reference, once (it is written for clarity, not speed).
        let t = Instant::now();
        let out = sluice_engine::cpu::run(&graph, &Weights::new(), &inputs).expect("cpu run");
        let cpu_s = t.elapsed().as_secs_f64();
        std::hint::black_box(out);
        println!(
            "{n:>6} {:>14.2} {:>14.2} {:>14.2}",
            flops / gpu_s / 1e9,
            gpu_s * 1e3,
            flops / cpu_s / 1e9
        );
    }
}
