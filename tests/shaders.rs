//! Every WGSL kernel the engine generates, for every case of the operator catalogue and the
//! example graphs, parses and validates with naga; and every variant of every shader file
//! is among them.

use sluice_engine::runtime::plan::{HalfStorage, Plan, PlanOptions, Precision};
use sluice_tests::op_cases::op_cases;
use sluice_tests::{graph, root};
use std::collections::BTreeMap;

fn validate(label: &str, source: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| format!("{label}: parse error: {}", e.emit_to_string(source)))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{label}: invalid: {}", e.emit_to_string(source)))?;
    Ok(())
}

#[test]
fn every_generated_kernel_validates_with_naga() {
    let mut sources: BTreeMap<String, String> = BTreeMap::new();
    let mut graphs: Vec<sluice_engine::Graph> = op_cases().iter().map(|c| graph(&c.doc)).collect();
    for name in [
        "graphs/mlp",
        "graphs/cnn",
        "graphs/transformer_block",
        "bench/w3_chain",
        "bench/w5_pipeline",
    ] {
        let text = std::fs::read_to_string(root().join(format!("assets/{name}.json"))).unwrap();
        let g = sluice_engine::load_graph(&text).unwrap();
        graphs.push(g.bind(&[("N".to_string(), 2)].into()).unwrap());
    }
    let options = [
        PlanOptions::default(),
        PlanOptions {
            fuse: false,
            ..Default::default()
        },
        PlanOptions {
            fuse: true,
            precision: Precision::Mixed,
            half: HalfStorage::Packed,
        },
        PlanOptions {
            fuse: true,
            precision: Precision::Mixed,
            half: HalfStorage::Native,
        },
        PlanOptions {
            fuse: true,
            precision: Precision::F16,
            half: HalfStorage::Native,
        },
    ];
    for g in &graphs {
        for o in options {
            let plan = Plan::with_options(g, o).unwrap_or_else(|e| panic!("plan failed: {e}"));
            for step in plan.steps {
                sources.entry(step.kernel.source.clone()).or_insert(format!(
                    "{} ({}, {:?} {:?})",
                    step.node, step.kernel.label, o.precision, o.half
                ));
            }
        }
    }
    let failures: Vec<String> = sources
        .iter()
        .filter_map(|(src, label)| validate(label, src).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} kernels failed naga validation:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Every variant of every shader file was generated at least once.
    let labels: Vec<&String> = sources.values().collect();
    for (file, variants) in [
        ("matmul", &["matmul vec4", "matmul scalar"][..]),
        ("reduce", &["thread", "group"][..]),
        ("movement", &["transpose", "gather"][..]),
        ("conv", &["conv2d", "max_pool2d", "avg_pool2d"][..]),
        ("norm", &["softmax", "layer_norm", "batch_norm"][..]),
        ("elementwise", &["relu", "where", "fused"][..]),
        (
            "16-bit paths",
            &[
                "Mixed Packed",
                "Mixed Native",
                "F16 Native",
                "stats",
                "concat pack",
            ][..],
        ),
    ] {
        for v in variants {
            assert!(
                labels.iter().any(|l| l.contains(v)),
                "{file}.wgsl variant '{v}' was never generated"
            );
        }
    }
    println!("{} distinct kernels validated", sources.len());
}
