//! `POST /api/runs` bodies: `RunRequest::parse` on arbitrary JSON, its configuration, and,
//! for an inline graph that builds, the run limits at the requested batch and the
//! batching check the server makes before queueing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_api::{GraphRef, RunRequest};

fuzz_target!(|data: &[u8]| {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(req) = RunRequest::parse(&body) else {
        return;
    };
    let config = req.config();
    let _ = serde_json::to_value(&req);
    if let GraphRef::Inline(doc) = &req.graph {
        if let Ok(graph) = sluice_engine::load_graph(&doc.to_string()) {
            if sluice_engine::exec::check_run(&graph, &config, None, &graph.limits).is_ok() {
                let _ = sluice_engine::exec::config::check_batching(
                    &graph.batch_semantics(),
                    &config,
                    None,
                );
            }
        }
    }
});
