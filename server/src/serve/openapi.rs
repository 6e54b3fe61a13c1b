//! The OpenAPI 3.1 description of the API, served at `/api/openapi.json`. Written out here
//! (one entry per route); `tests/server.rs` checks it lists every route the router has.

use serde_json::{json, Value};

fn op(summary: &str, responses: &[(&str, &str)]) -> Value {
    let mut r = serde_json::Map::new();
    for (code, desc) in responses {
        r.insert((*code).to_string(), json!({ "description": desc }));
    }
    json!({ "summary": summary, "responses": r })
}

fn with_body(mut v: Value, desc: &str) -> Value {
    v["requestBody"] =
        json!({ "description": desc, "required": true, "content": { "application/json": {} } });
    v
}

fn path_param(mut v: Value, names: &[&str]) -> Value {
    v["parameters"] = Value::Array(
        names
            .iter()
            .map(|n| json!({ "name": n, "in": "path", "required": true, "schema": { "type": "string" } }))
            .collect(),
    );
    v
}

fn query_params(mut v: Value, names: &[(&str, &str)]) -> Value {
    v["parameters"] = Value::Array(
        names
            .iter()
            .map(|(n, d)| json!({ "name": n, "in": "query", "required": false, "description": d, "schema": { "type": "string" } }))
            .collect(),
    );
    v
}

/// The document.
pub fn spec() -> Value {
    let err = "JSON {\"error\": sentence}";
    json!({
        "openapi": "3.1.0",
        "info": { "title": "Sluice API", "version": env!("CARGO_PKG_VERSION"),
                  "description": "Graphs, runs, devices and live run events of a Sluice server. With --token, every request but the editor's files needs 'Authorization: Bearer <token>' (or '?token=<token>', for WebSockets and download links): 401 otherwise. Every request: 400 without a Host header, 403 when its Host is not one of the server's names or its Origin not the server's own. POST and PUT bodies must be 'Content-Type: application/json' (415; PUT /api/graphs/{name} also takes an ONNX model as 'application/onnx' or 'application/octet-stream', and PUT /api/weights/{file} a safetensors file as 'application/octet-stream'), at most --body-limit bytes (413), sent within --body-timeout (408). 503: the server is busy (bodies in flight, graph checks, worker places); try again." },
        "paths": {
            "/api/ops": { "get": op("Operator schemas (the editor's palette)", &[("200", "schemas")]) },
            "/api/graphs": { "get": op("Names of the stored graphs", &[("200", "names")]) },
            "/api/graphs/{name}": {
                "get": path_param(op("A stored graph file", &[("200", "the graph JSON"), ("400", err), ("404", err)]), &["name"]),
                "put": path_param(with_body(op("Store a graph file (durably, only after it checks as `sluice validate` checks it; what it replaces is kept as a version). An ONNX model body (Content-Type application/onnx or application/octet-stream, self-contained) is imported and stored with its weights as one commit: the weights in NAME.HASH.safetensors (HASH naming the bytes; never changed), which the graph's params.file names and runs by name read", &[("200", "replaced"), ("201", "created"), ("400", err), ("413", err), ("415", err), ("422", "the graph's problems (those `sluice validate` lists), over a limit, or a model that cannot be imported (every unsupported node named)")]), "the graph file, or an ONNX model"), &["name"]),
                "delete": path_param(op("Delete a stored graph (kept as a version with its weights) and its weights: the file its params.file names when committed with it, and NAME.safetensors (each kept while another graph names it)", &[("204", "deleted"), ("400", err), ("404", err)]), &["name"]),
            },
            "/api/graphs/{name}/versions": {
                "get": path_param(op("The kept versions of a graph, newest first: each save or delete that replaced it kept what it replaced (the last 10)", &[("200", "{versions: [{version, bytes}]}"), ("400", err)]), &["name"]),
            },
            "/api/graphs/{name}/versions/{version}": {
                "get": path_param(op("One kept version of a graph, as stored", &[("200", "the graph JSON"), ("400", err), ("404", err)]), &["name", "version"]),
            },
            "/api/graphs/{name}/versions/{version}/restore": {
                "post": path_param(op("Make a kept version the stored graph again with the weights kept with it, as one commit (what it replaces is kept in turn)", &[("200", "{restored, version}"), ("400", err), ("404", err)]), &["name", "version"]),
            },
            "/api/weights/{file}": {
                "get": path_param(op("A weights file of the workspace (NAME.safetensors or NAME.HASH.safetensors), as stored", &[("200", "the safetensors bytes"), ("400", err), ("404", err)]), &["file"]),
                "put": path_param(with_body(op("Store a weights file NAME.safetensors (Content-Type application/octet-stream, safetensors) durably, after checking that it parses; a graph whose params.file names it runs with it, and every graph naming the weights it replaces keeps a version with them. A model's committed weights (NAME.HASH.safetensors) cannot be put: 400", &[("200", "stored"), ("400", err), ("413", err), ("415", err)]), "the safetensors file"), &["file"]),
            },
            "/api/validate": { "post": with_body(op("Shapes and batch per node and the nodes that couple samples, or every problem", &[("200", "valid: nodes with output types and batch, and the nodes that couple samples"), ("400", err), ("422", "problems")]), "a graph document") },
            "/api/runs": {
                "get": query_params(op("A page of runs, newest first, and the cursor of the next page", &[("200", "{runs, next}"), ("400", err)]), &[("limit", "runs per page, 1 to 1000 (default 100)"), ("before", "a page's 'next': runs older than this one")]),
                "post": with_body(op("Queue a run (checked first: graph, limits, batch semantics, uploads)", &[("202", "{\"id\": ...}"), ("400", err), ("404", err), ("413", err), ("415", err), ("422", err), ("429", "queue full"), ("503", err)]),
                    "{graph: name or document, batch, seed, microbatches, stages, prefetch, precision, inputs: {name: base64 .npy}, seed_inputs: fill the inputs not sent from seed (else refused), workers: [ids pinned to stages]}"),
            },
            "/api/runs/{id}": { "get": path_param(op("A run: status, parameters, metrics, output summaries, error", &[("200", "the run"), ("404", err)]), &["id"]) },
            "/api/runs/{id}/outputs/{name}": { "get": path_param(op("An output as .npy", &[("200", "npy bytes"), ("404", err), ("409", err)]), &["id", "name"]) },
            "/api/runs/{id}/trace": { "get": path_param(op("A finished run's Chrome trace (opens in Perfetto)", &[("200", "trace JSON"), ("404", err), ("409", err)]), &["id"]) },
            "/api/runs/{id}/cancel": { "post": path_param(op("Cancel a queued or running run", &[("200", "cancelled"), ("202", "cancelling"), ("404", err), ("409", err)]), &["id"]) },
            "/api/runs/{id}/events": { "get": path_param(op("WebSocket: the run's events and metrics live (a finished run's kept events replayed), then its summary", &[("101", "switching protocols"), ("404", err)]), &["id"]) },
            "/api/devices": { "get": op("Workers, adapters, utilisation", &[("200", "workers")]) },
            "/api/workers": { "get": op("WebSocket where `sluice worker` processes join (protocol in server/api/src/protocol.rs)", &[("101", "switching protocols"), ("400", err), ("401", err), ("503", "--max-workers reached")]) },
            "/api/openapi.json": { "get": op("This document", &[("200", "OpenAPI 3.1")]) },
            "/metrics": { "get": op("Prometheus metrics", &[("200", "text exposition format")]) },
            "/": { "get": op("The editor (or, without its bundle, a page listing graphs and runs, behind the token); paths outside /api serve the editor's files", &[("200", "HTML"), ("401", err)]) },
        }
    })
}
