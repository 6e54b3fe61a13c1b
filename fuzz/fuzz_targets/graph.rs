//! A graph document from arbitrary bytes: decoded, built and typed (`load_graph`, what the
//! CLI and the server run), and analysed as a possibly unfinished document
//! (`graph::analyse`, what the editor runs on every edit). Neither may panic, whatever the
//! bytes; a graph that builds must also answer its batch semantics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(graph) = sluice_engine::load_graph(text) {
        let _ = graph.batch_semantics();
        let _ = graph.symbols();
    }
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
        let _ = sluice_engine::graph::analyse(&value);
    }
});
