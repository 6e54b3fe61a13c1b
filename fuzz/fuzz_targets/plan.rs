//! Planning what builds: a graph document from arbitrary bytes that passes the run limits
//! at a small batch is bound, planned with and without fusion in f32 and mixed precision,
//! lowered to WGSL passes (pure, no device), partitioned into two stages at assumed rates,
//! and its plan sent through serde the way a worker receives it. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_engine::exec::dataset;
use sluice_engine::plan::cost::Rates;
use sluice_engine::plan::{stages, HalfStorage, Plan, PlanOptions, Precision};

const BATCH: usize = 2;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(graph) = sluice_engine::load_graph(text) else {
        return;
    };
    let config = sluice_engine::exec::RunConfig {
        batch: BATCH,
        ..sluice_engine::exec::RunConfig::default()
    };
    if sluice_engine::exec::check_run(&graph, &config, None, &graph.limits).is_err() {
        return;
    }
    let Ok(bound) = dataset::bind(&graph, BATCH) else {
        return;
    };
    for (fuse, precision) in [(true, Precision::F32), (false, Precision::Mixed)] {
        let options = PlanOptions {
            fuse,
            precision,
            half: HalfStorage::Packed,
        };
        let Ok(plan) = Plan::with_options(&bound, options) else {
            continue;
        };
        let _ = sluice_engine::gpu::program::lower_plan(&plan);
        // What the planner makes, every device's plan check takes.
        assert!(plan.check_limits(&graph.limits).is_ok(), "the planner's plan is refused");
        if let Ok(wire) = serde_json::to_value(&plan) {
            let _ = serde_json::from_value::<Plan>(wire);
        }
        let costs = stages::model_costs(&bound, &Rates::ASSUMED, &options);
        if let Ok(part) = stages::choose(&bound, 2, &costs, &Rates::ASSUMED, &options) {
            let _ = stages::split(&bound, &part);
        }
    }
});
