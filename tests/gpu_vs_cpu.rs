//! Every operator's GPU kernel against its CPU reference on seeded random inputs, over the
//! catalogue in `support/op_cases.rs` (odd sizes, broadcasting, every attribute).

use sluice_engine::ops;
use sluice_tests::op_cases::op_cases;
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
