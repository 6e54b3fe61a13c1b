//! A safetensors file (`params.file`) from arbitrary bytes, read against a small graph
//! with a `linear` and a `layer_norm`: every declared weight checked, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const GRAPH: &str = r#"{
  "format": "sluice/graph@1",
  "inputs": { "x": { "shape": ["N", 4], "dtype": "f32" } },
  "nodes": [
    { "id": "fc", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 3 } },
    { "id": "ln", "op": "layer_norm", "inputs": ["fc"] }
  ],
  "outputs": ["ln"]
}"#;

fn graph() -> &'static sluice_engine::Graph {
    static G: OnceLock<sluice_engine::Graph> = OnceLock::new();
    G.get_or_init(|| sluice_engine::load_graph(GRAPH).expect("the target's graph is valid"))
}

fuzz_target!(|data: &[u8]| {
    if let Ok(weights) = sluice_engine::weights::load_safetensors(graph(), data) {
        for (key, spec) in sluice_engine::weights::param_specs(graph()) {
            assert_eq!(weights[&key].shape, spec.shape, "{key}");
        }
    }
});
