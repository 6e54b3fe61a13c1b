//! `sluice serve` end to end: a real server on an ephemeral port, real HTTP and WebSocket
//! clients. Every endpoint, restart persistence, a table of bad requests, and a bounded
//! load test.

use serde_json::{json, Value};
use sluice_tests::sluice;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tungstenite::client::IntoClientRequest;

/// A running server, killed on drop.
struct Server {
    child: Child,
    url: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn workspace(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-serve-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn start(ws: &Path, token: Option<&str>, extra: &[&str]) -> Server {
    let mut cmd = sluice();
    cmd.arg("serve");
    if !extra.contains(&"--addr") {
        cmd.args(["--addr", "127.0.0.1:0"]);
    }
    cmd.arg("--workspace").arg(ws).args(extra);
    if let Some(t) = token {
        cmd.args(["--token", t]);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("sluice serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("first line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://") || w.starts_with("https://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_string();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    Server {
        child,
        url,
        token: token.map(str::to_string),
        agent,
    }
}

impl Server {
    /// A request with the token (if any); a body is sent as JSON.
    fn req(&self, method: &str, path: &str, body: Option<&[u8]>) -> (u16, Vec<u8>) {
        let json = [("Content-Type", "application/json")];
        let headers: &[(&str, &str)] = if body.is_some() { &json } else { &[] };
        self.req_with(method, path, body, headers)
    }

    /// A request with the token (if any) and these headers.
    fn req_with(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        headers: &[(&str, &str)],
    ) -> (u16, Vec<u8>) {
        let url = format!("{}{path}", self.url);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        macro_rules! with_headers {
            ($r:expr) => {{
                let mut r = $r;
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                for (k, v) in headers {
                    r = r.header(*k, *v);
                }
                r
            }};
        }
        let resp = match (method, body) {
            ("GET", _) => with_headers!(self.agent.get(&url)).call(),
            ("DELETE", _) => with_headers!(self.agent.delete(&url)).call(),
            ("PUT", b) => with_headers!(self.agent.put(&url)).send(b.unwrap_or(b"").to_vec()),
            (_, b) => with_headers!(self.agent.post(&url)).send(b.unwrap_or(b"").to_vec()),
        }
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .with_config()
            .limit(64 << 20)
            .read_to_vec()
            .unwrap_or_default();
        (status, bytes)
    }

    fn json(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let b = body.map(|v| v.to_string().into_bytes());
        let (s, bytes) = self.req(method, path, b.as_deref());
        (s, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    fn wait_run(&self, id: &str) -> Value {
        let t = Instant::now();
        loop {
            let (_, r) = self.json("GET", &format!("/api/runs/{id}"), None);
            if !matches!(r["status"].as_str(), Some("queued") | Some("running")) {
                return r;
            }
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "run {id} did not finish"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn ws(
        &self,
        path: &str,
    ) -> tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>> {
        let mut req = format!("{}{path}", self.url.replace("http://", "ws://"))
            .into_client_request()
            .unwrap();
        if let Some(t) = &self.token {
            req.headers_mut()
                .insert("Authorization", format!("Bearer {t}").parse().unwrap());
        }
        tungstenite::connect(req).expect("websocket connects").0
    }
}

#[test]
fn every_endpoint_works() {
    let ws = workspace("endpoints");
    let s = start(&ws, None, &["--no-editor"]);
    let (code, page) = s.req("GET", "/", None);
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&page).contains("mlp"));
    let (code, ops) = s.json("GET", "/api/ops", None);
    assert_eq!(code, 200);
    assert!(ops["ops"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o["name"] == "linear"));
    let (_, graphs) = s.json("GET", "/api/graphs", None);
    assert_eq!(
        graphs["graphs"],
        json!(["cnn", "mlp", "transformer_block"]),
        "examples copied into a new workspace"
    );
    let mlp = std::fs::read_to_string(sluice_tests::root().join("assets/graphs/mlp.json")).unwrap();
    let (code, saved) = s.json(
        "PUT",
        "/api/graphs/my_mlp",
        Some(serde_json::from_str(&mlp).unwrap()),
    );
    assert_eq!((code, saved["valid"].clone()), (201, json!(true)));
    let (code, got) = s.json("GET", "/api/graphs/my_mlp", None);
    assert_eq!(code, 200);
    assert_eq!(got["name"], "mlp");
    let (code, v) = s.json("POST", "/api/validate", Some(got.clone()));
    assert_eq!(code, 200);
    assert!(v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["id"] == "probs"));
    assert_eq!(v["couplings"], json!([]));
    assert_eq!(
        v["nodes"][0]["batch"],
        json!([{ "kind": "axis", "axis": 0 }])
    );
    let mut broken = got.clone();
    broken["nodes"][1]["op"] = json!("rleu");
    let (code, v) = s.json("POST", "/api/validate", Some(broken));
    assert_eq!(code, 422);
    assert!(v["problems"][0]["message"]
        .as_str()
        .unwrap()
        .contains("unknown operator 'rleu'"));
    // A run, watched live over the WebSocket.
    let (code, created) = s.json(
        "POST",
        "/api/runs",
        Some(json!({ "seed_inputs": true, "graph": "my_mlp", "batch": 8, "seed": 5, "microbatches": 4, "stages": 2, "prefetch": 2, "precision": "mixed" })),
    );
    assert_eq!(code, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let mut sock = s.ws(&format!("/api/runs/{id}/events"));
    let (mut events, mut summary) = (0, Value::Null);
    while let Ok(msg) = sock.read() {
        if let tungstenite::Message::Text(t) = msg {
            let v: Value = serde_json::from_str(&t).unwrap();
            match v["type"].as_str() {
                Some("event") => events += 1,
                Some("summary") => {
                    summary = v["run"].clone();
                    break;
                }
                _ => {}
            }
        }
    }
    assert_eq!(summary["status"], "succeeded", "{summary}");
    let run = s.wait_run(&id);
    assert_eq!(run["status"], "succeeded");
    // The record says which inputs were invented (the request asked for that).
    assert_eq!(run["seeded_inputs"], json!(["x"]), "{run}");
    assert!(
        events > 0 || run["started_ms"].is_number(),
        "no events streamed"
    );
    let out = &run["outputs"][0];
    assert_eq!(out["shape"], json!([8, 10]));
    let (code, npy) = s.req("GET", &format!("/api/runs/{id}/outputs/probs"), None);
    assert_eq!(code, 200);
    let t = sluice_engine::npy::parse(&npy).unwrap();
    assert_eq!(t.shape, vec![8, 10]);
    assert!((t.checksum() - out["checksum"].as_f64().unwrap()).abs() < 1e-6);
    // An inline graph, and the list.
    let (code, inline) = s.json(
        "POST",
        "/api/runs",
        Some(json!({ "seed_inputs": true, "graph": got, "batch": 2 })),
    );
    assert_eq!(code, 202);
    assert_eq!(
        s.wait_run(inline["id"].as_str().unwrap())["status"],
        "succeeded"
    );
    let (_, list) = s.json("GET", "/api/runs", None);
    assert_eq!(list["runs"].as_array().unwrap().len(), 2);
    // Cancelling: a finished run cannot be; a queued one can.
    let (code, _) = s.json("POST", &format!("/api/runs/{id}/cancel"), None);
    assert_eq!(code, 409);
    let ids: Vec<String> = (0..4)
        .map(|_| {
            s.json(
                "POST",
                "/api/runs",
                Some(json!({ "seed_inputs": true, "graph": "transformer_block", "batch": 16 })),
            )
            .1["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let (code, c) = s.json("POST", &format!("/api/runs/{}/cancel", ids[3]), None);
    assert!(code == 200 || code == 202, "{c}");
    for i in &ids {
        s.wait_run(i);
    }
    assert_eq!(
        s.json("GET", &format!("/api/runs/{}", ids[3]), None).1["status"],
        "cancelled"
    );
    // A finished run's event stream replays its kept events, then gives its summary.
    let mut sock = s.ws(&format!("/api/runs/{id}/events"));
    let mut replayed = 0;
    let summary = loop {
        let msg = sock.read().unwrap();
        let v: Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
        if v["type"] == "summary" {
            break v;
        }
        assert_eq!(v["type"], "event", "{v}");
        replayed += 1;
    };
    assert_eq!(summary["run"]["status"], "succeeded");
    assert!(replayed > 0, "no events replayed");
    let (code, dev) = s.json("GET", "/api/devices", None);
    assert_eq!(code, 200);
    assert!(!dev["workers"][0]["adapters"].as_array().unwrap().is_empty());
    let (code, spec) = s.json("GET", "/api/openapi.json", None);
    assert_eq!(code, 200);
    for route in [
        "/api/ops",
        "/api/graphs/{name}",
        "/api/weights/{file}",
        "/api/graphs/{name}/versions",
        "/api/graphs/{name}/versions/{version}/restore",
        "/api/validate",
        "/api/runs",
        "/api/runs/{id}",
        "/api/runs/{id}/outputs/{name}",
        "/api/runs/{id}/cancel",
        "/api/runs/{id}/events",
        "/api/devices",
        "/metrics",
    ] {
        assert!(
            spec["paths"].get(route).is_some(),
            "{route} missing from the OpenAPI document"
        );
    }
    let (code, metrics) = s.req("GET", "/metrics", None);
    let text = String::from_utf8_lossy(&metrics);
    assert_eq!(code, 200);
    assert!(
        text.contains("sluice_runs{status=\"succeeded\"} 5"),
        "{text}"
    );
    assert!(
        text.contains("sluice_run_duration_seconds_count")
            && text.contains("sluice_device_utilisation")
    );
    let (code, _) = s.req("DELETE", "/api/graphs/my_mlp", None);
    assert_eq!(code, 204);
    assert_eq!(s.req("GET", "/api/graphs/my_mlp", None).0, 404);
}

#[test]
fn serves_the_editor_bundle_and_keeps_finished_runs_watchable() {
    let ws = workspace("editor-bundle");
    let bundle = ws.with_file_name("editor-bundle-files");
    let _ = std::fs::remove_dir_all(&bundle);
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("index.html"),
        "<!doctype html><title>editor page</title>",
    )
    .unwrap();
    std::fs::write(bundle.join("app.wasm"), b"\0asm\x01\0\0\0").unwrap();
    let editor = bundle.to_str().unwrap();
    let mut s = start(&ws, Some("secret"), &["--editor", editor]);
    // The bundle is open to all (it holds no data); the API still wants the token.
    let token = s.token.take();
    let (code, page) = s.req("GET", "/", None);
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&page).contains("editor page"));
    let (code, _) = s.req("GET", "/app.wasm", None);
    assert_eq!(code, 200);
    let (code, page) = s.req("GET", "/some/app/route", None);
    assert_eq!(
        (code, String::from_utf8_lossy(&page).contains("editor page")),
        (200, true)
    );
    let (code, body) = s.json("GET", "/api/graphs", None);
    assert_eq!(code, 401, "{body}");
    let (code, body) = s.json("GET", "/api/graphs?token=secret", None);
    assert_eq!(code, 200, "{body}");
    let (code, body) = s.json("GET", "/api/graphs?token=wrong", None);
    assert_eq!(code, 401, "{body}");
    s.token = token;
    let (code, body) = s.json("GET", "/api/nothing", None);
    assert_eq!((code, body["error"].as_str()), (404, Some("no such route")));

    // A finished run keeps its events: a late watcher gets them before the summary, and
    // its trace downloads.
    let (code, r) = s.json(
        "POST",
        "/api/runs",
        Some(json!({ "seed_inputs": true, "graph": "mlp", "batch": 4, "microbatches": 2, "stages": 2 })),
    );
    assert_eq!(code, 202, "{r}");
    let id = r["id"].as_str().unwrap().to_string();
    assert_eq!(s.wait_run(&id)["status"], "succeeded");
    let mut socket = s.ws(&format!("/api/runs/{id}/events"));
    let mut stages = std::collections::BTreeSet::new();
    loop {
        let msg = socket.read().expect("a message before the summary");
        let Ok(text) = msg.into_text() else { continue };
        let v: Value = serde_json::from_str(&text).unwrap();
        match v["type"].as_str() {
            Some("event") => {
                stages.insert(v["event"]["stage"].as_u64().unwrap());
            }
            Some("summary") => break,
            other => panic!("unexpected message {other:?}"),
        }
    }
    assert_eq!(stages.into_iter().collect::<Vec<_>>(), vec![0, 1]);
    let (code, trace) = s.json("GET", &format!("/api/runs/{id}/trace"), None);
    assert_eq!(code, 200);
    assert!(
        trace["traceEvents"]
            .as_array()
            .is_some_and(|e| !e.is_empty()),
        "{trace}"
    );
    let (code, _) = s.json("GET", "/api/runs/0123456789abcdef/trace", None);
    assert_eq!(code, 404);
    let _ = std::fs::remove_dir_all(&bundle);
}

#[test]
fn a_restarted_server_has_every_graph_and_run() {
    let ws = workspace("restart");
    let (graphs, runs) = {
        let s = start(&ws, None, &[]);
        let mlp: Value = serde_json::from_str(
            &std::fs::read_to_string(sluice_tests::root().join("assets/graphs/mlp.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(s.json("PUT", "/api/graphs/kept", Some(mlp)).0, 201);
        for seed in 0..3 {
            let id = s
                .json(
                    "POST",
                    "/api/runs",
                    Some(json!({ "seed_inputs": true, "graph": "kept", "batch": 4, "seed": seed })),
                )
                .1["id"]
                .as_str()
                .unwrap()
                .to_string();
            s.wait_run(&id);
        }
        let bad = s.json(
            "POST",
            "/api/runs",
            Some(json!({ "seed_inputs": true, "graph": "cnn", "batch": 2, "stages": 99 })),
        );
        assert_eq!(bad.0, 422);
        (
            s.json("GET", "/api/graphs", None).1,
            s.json("GET", "/api/runs", None).1,
        )
    };
    let s = start(&ws, None, &[]);
    assert_eq!(s.json("GET", "/api/graphs", None).1, graphs);
    assert_eq!(s.json("GET", "/api/runs", None).1, runs);
    let id = runs["runs"][0]["id"].as_str().unwrap();
    assert_eq!(
        s.req("GET", &format!("/api/runs/{id}/outputs/probs"), None)
            .0,
        200
    );
}

/// (method, path, body, expected status, expected fragment of the error).
type BadRequest = (
    &'static str,
    &'static str,
    Option<Vec<u8>>,
    u16,
    &'static str,
);

#[test]
fn bad_requests_get_clear_json_errors_and_the_server_stays_up() {
    let ws = workspace("bad");
    let s = start(&ws, Some("s3cret"), &["--body-limit", "65536"]);
    let big = vec![b' '; 100_000];
    let cases: Vec<BadRequest> = vec![
        ("POST", "/api/validate", Some(b"{not json".to_vec()), 400, "malformed JSON at line 1"),
        ("POST", "/api/runs", Some(b"[1,2".to_vec()), 400, "malformed JSON"),
        ("POST", "/api/runs", Some(br#"{"graph": 5}"#.to_vec()), 422, "'graph' must be a graph name or a graph document"),
        ("POST", "/api/runs", Some(br#"{"graph": "mlp", "batch": "eight"}"#.to_vec()), 422, "'batch' must be an integer"),
        ("POST", "/api/runs", Some(br#"{"graph": "mlp", "batch": 0}"#.to_vec()), 422, "'batch' must be an integer from 1"),
        ("POST", "/api/runs", Some(br#"{"graph": "mlp", "precision": "f8"}"#.to_vec()), 422, "'precision' must be f32, f16 or mixed"),
        ("POST", "/api/runs", Some(br#"{"graph": "mlp", "bacth": 3}"#.to_vec()), 422, "unknown field 'bacth'"),
        ("POST", "/api/runs", Some(br#"{"batch": 3}"#.to_vec()), 422, "'graph' is missing"),
        ("POST", "/api/runs", Some(br#"{"graph": "mlp", "batch": 2}"#.to_vec()), 422, "input 'x' was not sent (inputs not sent: x)"),
        ("POST", "/api/runs", Some(br#"{"graph": "mlp", "seed_inputs": 1}"#.to_vec()), 422, "'seed_inputs' must be true or false"),
        ("POST", "/api/runs", Some(br#"{"graph": "nope"}"#.to_vec()), 404, "no graph named 'nope'"),
        ("POST", "/api/runs", Some(br#"{"graph": "mlp", "batch": 6, "microbatches": 4}"#.to_vec()), 422, "does not split into 4"),
        ("POST", "/api/runs", Some(br#"{"graph": {"format": "sluice/graph@1", "inputs": {"x": {"shape": ["N", 100000]}}, "nodes": [{"id": "y", "op": "relu", "inputs": ["x"]}], "outputs": ["y"]}, "batch": 65536}"#.to_vec()), 422, "over the limit"),
        ("POST", "/api/runs", Some(br#"{"graph": {"format": "sluice/graph@1", "inputs": {}, "nodes": [], "outputs": ["z"]}}"#.to_vec()), 422, "problem"),
        ("POST", "/api/runs", Some(big.clone()), 413, "larger than the limit"),
        ("PUT", "/api/graphs/big", Some(big), 413, "larger than the limit"),
        ("POST", "/api/runs", Some(br#"{"graph": {"format": "sluice/graph@1", "inputs": {"x": {"shape": [2]}}, "nodes": [{"id": "y", "op": "relu", "inputs": ["x"]}], "outputs": ["y"], "params": {"file": "w.safetensors"}}}"#.to_vec()), 422, "an inline graph cannot take its weights"),
        ("PUT", "/api/graphs/..%2Fx", Some(b"{}".to_vec()), 400, "not a valid name"),
        ("GET", "/api/graphs/..%2F..%2Fetc%2Fpasswd", None, 400, "not a valid name"),
        ("GET", "/api/graphs/a%20b", None, 400, "not a valid name"),
        ("PUT", "/api/graphs/ok", Some(b"[1, 2]".to_vec()), 400, "must be a JSON object"),
        ("GET", "/api/graphs/missing", None, 404, "no graph named 'missing'"),
        ("DELETE", "/api/graphs/missing", None, 404, "no graph named 'missing'"),
        ("GET", "/api/runs/0123456789abcdef", None, 404, "no run with id"),
        ("GET", "/api/runs/..%2Fsluice.db", None, 404, "no run with id"),
        ("POST", "/api/runs/0123456789abcdef/cancel", None, 404, "no run with id"),
        ("GET", "/api/runs/0123456789abcdef/outputs/probs", None, 404, "no run with id"),
        ("GET", "/api/runs/0123456789abcdef/events", None, 404, "no run with id"),
        ("GET", "/api/nothing", None, 404, "no such route"),
    ];
    assert!(cases.len() >= 20);
    let mut failures = Vec::new();
    for (method, path, body, want, fragment) in &cases {
        let (code, bytes) = s.req(method, path, body.as_deref());
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let msg = v["error"].as_str().unwrap_or("");
        if code != *want || !msg.contains(fragment) {
            failures.push(format!(
                "{method} {path}: {code} {msg:?}, expected {want} containing {fragment:?}"
            ));
        }
    }
    // Missing and wrong tokens.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    for auth in [None, Some("Bearer wrong"), Some("s3cret")] {
        let mut r = agent.get(format!("{}/api/graphs", s.url));
        if let Some(a) = auth {
            r = r.header("Authorization", a);
        }
        let resp = r.call().unwrap();
        let code = resp.status().as_u16();
        let body: Value =
            serde_json::from_slice(&resp.into_body().read_to_vec().unwrap()).unwrap_or(Value::Null);
        if code != 401 || !body["error"].is_string() {
            failures.push(format!("auth {auth:?}: {code} {body}"));
        }
    }
    // Garbage WebSocket frames on a run's event stream do not hurt the server.
    let id = s
        .json(
            "POST",
            "/api/runs",
            Some(json!({ "seed_inputs": true, "graph": "mlp", "batch": 2 })),
        )
        .1["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut sock = s.ws(&format!("/api/runs/{id}/events"));
    let _ = sock.send(tungstenite::Message::Binary(vec![0xff, 0x00, 0x13].into()));
    let _ = sock.send(tungstenite::Message::Text("{\"garbage\":".into()));
    drop(sock);
    assert_eq!(s.wait_run(&id)["status"], "succeeded");
    // Binding a public address without a token is refused.
    let out = sluice()
        .args(["serve", "--addr", "0.0.0.0:0", "--workspace"])
        .arg(workspace("public"))
        .output()
        .unwrap();
    if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("requires --token") {
        failures.push(format!(
            "public bind without token: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    assert_eq!(
        s.json("GET", "/api/graphs", None).0,
        200,
        "the server stayed up"
    );
    assert!(
        failures.is_empty(),
        "{} of {} bad requests misreported:\n{}",
        failures.len(),
        cases.len() + 4,
        failures.join("\n")
    );
}

#[test]
fn load_test_accepts_or_rejects_every_request_and_loses_no_run() {
    let ws = workspace("load");
    let s = start(&ws, None, &["--max-queued", "8"]);
    let url = s.url.clone();
    let started = Instant::now();
    let results: Vec<(u16, Option<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..20)
            .map(|c| {
                let url = url.clone();
                scope.spawn(move || {
                    let agent: ureq::Agent = ureq::Agent::config_builder()
                        .http_status_as_error(false)
                        .build()
                        .into();
                    (0..10)
                        .map(|i| {
                            let body = json!({ "seed_inputs": true, "graph": "mlp", "batch": 1, "seed": c * 10 + i })
                                .to_string();
                            let resp = agent
                                .post(format!("{url}/api/runs"))
                                .header("Content-Type", "application/json")
                                .send(body.into_bytes())
                                .unwrap();
                            let code = resp.status().as_u16();
                            let v: Value =
                                serde_json::from_slice(&resp.into_body().read_to_vec().unwrap())
                                    .unwrap_or(Value::Null);
                            (code, v["id"].as_str().map(str::to_string))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let submit_s = started.elapsed().as_secs_f64();
    assert_eq!(results.len(), 200);
    let accepted: Vec<String> = results
        .iter()
        .filter(|(c, _)| *c == 202)
        .filter_map(|(_, id)| id.clone())
        .collect();
    let rejected = results
        .iter()
        .filter(|(c, _)| *c == 429 || *c == 503)
        .count();
    assert_eq!(
        accepted.len() + rejected,
        200,
        "every request is accepted or rejected with 429/503: {results:?}"
    );
    for id in &accepted {
        assert_eq!(s.wait_run(id)["status"], "succeeded", "run {id}");
    }
    let (_, list) = s.json("GET", "/api/runs", None);
    assert_eq!(
        list["runs"].as_array().unwrap().len(),
        accepted.len(),
        "no run lost, none invented"
    );
    println!(
        "load test: 200 requests from 20 clients in {submit_s:.2} s: {} accepted, {rejected} rejected (429); all accepted runs succeeded after {:.2} s",
        accepted.len(),
        started.elapsed().as_secs_f64()
    );
}

/// A `sluice worker` process, killed on drop.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn worker(s: &Server) -> Worker {
    let mut cmd = sluice();
    cmd.args(["worker", "--connect", &s.url.replace("http://", "ws://")]);
    if let Some(t) = &s.token {
        cmd.args(["--token", t]);
    }
    Worker(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sluice worker starts"),
    )
}

fn wait_workers(s: &Server, n: usize) {
    let t = Instant::now();
    loop {
        let (_, d) = s.json("GET", "/api/devices", None);
        let remote = d["workers"]
            .as_array()
            .map_or(0, |w| w.iter().filter(|w| w["kind"] == "remote").count());
        if remote == n {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "expected {n} remote workers, have {remote}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_workers_run_a_two_stage_pipeline_with_the_single_device_outputs() {
    let ws = workspace("workers");
    let s = start(&ws, Some("tok"), &[]);
    let _w1 = worker(&s);
    let _w2 = worker(&s);
    wait_workers(&s, 2);
    let two = s
        .json(
            "POST",
            "/api/runs",
            Some(json!({ "seed_inputs": true, "graph": "mlp", "batch": 8, "seed": 5, "microbatches": 4, "stages": 2 })),
        )
        .1;
    let one = s
        .json(
            "POST",
            "/api/runs",
            Some(json!({ "seed_inputs": true, "graph": "mlp", "batch": 8, "seed": 5, "microbatches": 4, "stages": 1 })),
        )
        .1;
    let (two, one) = (
        s.wait_run(two["id"].as_str().unwrap()),
        s.wait_run(one["id"].as_str().unwrap()),
    );
    assert_eq!(two["status"], "succeeded", "{two}");
    let devices = two["metrics"]["devices"].to_string();
    assert!(
        devices.contains("worker w1") && devices.contains("worker w2"),
        "stages were not placed on the workers: {devices}"
    );
    // Pinned placement: stage 0 on w2, stage 1 on w1.
    let pinned = s.json("POST", "/api/runs", Some(json!({ "seed_inputs": true, "graph": "mlp", "batch": 8, "seed": 5, "microbatches": 4, "stages": 2, "workers": ["w2", "w1"] }))).1;
    let pinned = s.wait_run(pinned["id"].as_str().unwrap());
    assert_eq!(
        pinned["metrics"]["devices"][0]
            .as_str()
            .map(|d| d.starts_with("worker w2")),
        Some(true),
        "{pinned}"
    );
    let missing = s
        .json(
            "POST",
            "/api/runs",
            Some(json!({ "seed_inputs": true, "graph": "mlp", "stages": 2, "workers": ["w1", "w9"] })),
        )
        .1;
    let missing = s.wait_run(missing["id"].as_str().unwrap());
    assert!(
        missing["error"].as_str().unwrap().contains("worker 'w9'"),
        "{missing}"
    );
    let a = s
        .req(
            "GET",
            &format!("/api/runs/{}/outputs/probs", two["id"].as_str().unwrap()),
            None,
        )
        .1;
    let b = s
        .req(
            "GET",
            &format!("/api/runs/{}/outputs/probs", one["id"].as_str().unwrap()),
            None,
        )
        .1;
    let (a, b) = (
        sluice_engine::npy::parse(&a).unwrap(),
        sluice_engine::npy::parse(&b).unwrap(),
    );
    assert_eq!(
        a, b,
        "the 2-stage run on two workers differs from the single-device run"
    );
    // A dataset with a leftover partial micro-batch (30 samples in micro-batches of 4)
    // runs on the workers as it does on one device and on the CPU: the last micro-batch is
    // padded and trimmed, through the same driver.
    use base64::Engine;
    let g = sluice_engine::load_graph(
        &std::fs::read_to_string(sluice_tests::root().join("assets/graphs/mlp.json")).unwrap(),
    )
    .unwrap();
    let data = sluice_engine::exec::dataset::seeded(&g, 30, 4).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD
        .encode(sluice_engine::npy::to_bytes(&data["x"]).unwrap());
    let remote = s
        .json(
            "POST",
            "/api/runs",
            Some(json!({ "graph": "mlp", "batch": 16, "microbatches": 4, "stages": 2, "inputs": { "x": b64 } })),
        )
        .1;
    let remote = s.wait_run(remote["id"].as_str().unwrap());
    assert_eq!(remote["status"], "succeeded", "{remote}");
    assert!(
        remote["metrics"]["devices"]
            .to_string()
            .contains("worker w"),
        "{remote}"
    );
    let got = sluice_engine::npy::parse(
        &s.req(
            "GET",
            &format!("/api/runs/{}/outputs/probs", remote["id"].as_str().unwrap()),
            None,
        )
        .1,
    )
    .unwrap();
    let bound = sluice_engine::exec::dataset::bind(&g, 30).unwrap();
    let want = sluice_tests::run_cpu(&bound, &sluice_engine::weights::init_weights(&g, 42), &data);
    assert_eq!(got.shape, vec![30, 10]);
    sluice_tests::compare("30 samples on two workers", &got, &want[0].1, 1e-5, 1e-4).unwrap();
}

#[test]
fn a_repeated_run_reuses_its_compiled_plans() {
    let ws = workspace("cache");
    let s = start(&ws, None, &[]);
    let body = json!({ "seed_inputs": true, "graph": "transformer_block", "batch": 8, "microbatches": 2, "stages": 2, "precision": "mixed" });
    let mut runs = Vec::new();
    for _ in 0..2 {
        let id = s.json("POST", "/api/runs", Some(body.clone())).1["id"]
            .as_str()
            .unwrap()
            .to_string();
        let r = s.wait_run(&id);
        assert_eq!(r["status"], "succeeded", "{r}");
        runs.push(r);
    }
    let compile = |r: &Value| r["metrics"]["compile"].clone();
    let (first, second) = (compile(&runs[0]), compile(&runs[1]));
    println!(
        "first run: {} pipelines created, first result after {:.1} ms; repeated run: {} pipelines created (cached {}), first result after {:.1} ms",
        first["stats"]["pipelines_created"],
        first["first_result_ms"].as_f64().unwrap_or(0.0),
        second["stats"]["pipelines_created"],
        second["cached"],
        second["first_result_ms"].as_f64().unwrap_or(0.0),
    );
    assert_eq!(first["cached"], false, "{first}");
    assert!(
        first["stats"]["pipelines_created"].as_u64().unwrap() > 0,
        "{first}"
    );
    assert_eq!(second["cached"], true, "{second}");
    assert_eq!(second["stats"]["pipelines_created"], 0, "{second}");
    assert!(
        second["first_result_ms"].as_f64().unwrap() > 0.0,
        "{second}"
    );
    // Same request, same answer.
    let output = |r: &Value| {
        s.req(
            "GET",
            &format!("/api/runs/{}/outputs/ln2", r["id"].as_str().unwrap()),
            None,
        )
        .1
    };
    assert_eq!(output(&runs[0]), output(&runs[1]));
    // Another configuration compiles anew.
    let other = s
        .json(
            "POST",
            "/api/runs",
            Some(json!({ "seed_inputs": true, "graph": "transformer_block", "batch": 8 })),
        )
        .1;
    let other = s.wait_run(other["id"].as_str().unwrap());
    assert_eq!(compile(&other)["cached"], false, "{other}");
}

#[test]
fn a_worker_killed_mid_run_fails_the_run_and_the_server_goes_on() {
    let ws = workspace("kill");
    let s = start(&ws, None, &[]);
    let mut w1 = worker(&s);
    let _w2 = worker(&s);
    wait_workers(&s, 2);
    let id = s
        .json("POST", "/api/runs", Some(json!({ "seed_inputs": true, "graph": "transformer_block", "batch": 2048, "microbatches": 32, "stages": 2 })))
        .1["id"]
        .as_str()
        .unwrap()
        .to_string();
    let t = Instant::now();
    while s.json("GET", &format!("/api/runs/{id}"), None).1["status"] == "queued" {
        assert!(t.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let _ = w1.0.kill();
    let _ = w1.0.wait();
    let run = s.wait_run(&id);
    assert_eq!(run["status"], "failed", "{run}");
    let reason = run["error"].as_str().unwrap_or("");
    assert!(
        reason.contains("disconnected"),
        "the reason is stored: {reason}"
    );
    // The server goes on serving, and later runs succeed.
    assert_eq!(s.json("GET", "/api/graphs", None).0, 200);
    for stages in [1, 2] {
        let id = s
            .json(
                "POST",
                "/api/runs",
                Some(json!({ "seed_inputs": true, "graph": "mlp", "batch": 4, "microbatches": 2, "stages": stages })),
            )
            .1["id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(s.wait_run(&id)["status"], "succeeded");
    }
}

#[test]
fn a_worker_speaking_another_protocol_version_is_refused() {
    let ws = workspace("protocol");
    let s = start(&ws, None, &[]);
    let mut sock = s.ws("/api/workers");
    sock.send(tungstenite::Message::Text(
        json!({ "type": "hello", "protocol": 99, "name": "old", "adapters": [] })
            .to_string()
            .into(),
    ))
    .unwrap();
    let reply: Value = serde_json::from_str(sock.read().unwrap().to_text().unwrap()).unwrap();
    assert_eq!(reply["type"], "refused");
    assert!(reply["error"]
        .as_str()
        .unwrap()
        .contains("protocol version 99 is not supported"));
    let mut sock = s.ws("/api/workers");
    sock.send(tungstenite::Message::Binary(vec![1, 2, 3].into()))
        .unwrap();
    let reply: Value = serde_json::from_str(sock.read().unwrap().to_text().unwrap()).unwrap();
    assert_eq!(reply["type"], "refused");
    let (_, d) = s.json("GET", "/api/devices", None);
    assert_eq!(
        d["workers"].as_array().unwrap().len(),
        1,
        "no refused worker was registered"
    );
}

#[test]
fn uploaded_npy_inputs_are_used() {
    use base64::Engine;
    let ws = workspace("upload");
    let s = start(&ws, None, &[]);
    let x = sluice_engine::Tensor::f32(
        vec![2, 784],
        (0..2 * 784)
            .map(|i| ((i % 11) as f32 - 5.0) / 7.0)
            .collect(),
    );
    let b64 =
        base64::engine::general_purpose::STANDARD.encode(sluice_engine::npy::to_bytes(&x).unwrap());
    let id = s
        .json(
            "POST",
            "/api/runs",
            Some(json!({ "graph": "mlp", "batch": 2, "inputs": { "x": b64 } })),
        )
        .1["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(s.wait_run(&id)["status"], "succeeded");
    let got = sluice_engine::npy::parse(
        &s.req("GET", &format!("/api/runs/{id}/outputs/probs"), None)
            .1,
    )
    .unwrap();
    let g = sluice_engine::load_graph(
        &std::fs::read_to_string(sluice_tests::root().join("assets/graphs/mlp.json")).unwrap(),
    )
    .unwrap();
    let bound = g.bind(&[("N".to_string(), 2)].into()).unwrap();
    let weights = sluice_engine::weights::init_weights(&bound, 42);
    let want = sluice_tests::run_cpu(&bound, &weights, &[("x".to_string(), x)].into());
    sluice_tests::compare("uploaded input", &got, &want[0].1, 1e-6, 1e-4).unwrap();
    // The upload is the dataset: two samples in batches of three run as one padded
    // micro-batch and give the same two rows.
    let id = s
        .json(
            "POST",
            "/api/runs",
            Some(json!({ "graph": "mlp", "batch": 3, "inputs": { "x": b64 } })),
        )
        .1["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(s.wait_run(&id)["status"], "succeeded");
    let padded = sluice_engine::npy::parse(
        &s.req("GET", &format!("/api/runs/{id}/outputs/probs"), None)
            .1,
    )
    .unwrap();
    sluice_tests::compare(
        "two samples in a batch of three",
        &padded,
        &want[0].1,
        1e-6,
        1e-4,
    )
    .unwrap();
    // An upload that does not fit the graph fails with the reason.
    let narrow = sluice_engine::Tensor::f32(vec![2, 783], vec![0.5; 2 * 783]);
    let b64_narrow = base64::engine::general_purpose::STANDARD
        .encode(sluice_engine::npy::to_bytes(&narrow).unwrap());
    let bad = s.json(
        "POST",
        "/api/runs",
        Some(json!({ "graph": "mlp", "batch": 2, "inputs": { "x": b64_narrow } })),
    );
    let id = bad.1["id"].as_str().unwrap().to_string();
    let run = s.wait_run(&id);
    assert_eq!(run["status"], "failed");
    assert!(
        run["error"]
            .as_str()
            .unwrap()
            .contains("has shape [2, 783]"),
        "{run}"
    );
    let (code, v) = s.json(
        "POST",
        "/api/runs",
        Some(json!({ "graph": "mlp", "inputs": { "x": "%%%" } })),
    );
    assert_eq!(code, 422);
    assert!(v["error"].as_str().unwrap().contains("not valid base64"));
}

#[test]
fn a_worker_started_first_joins_when_the_server_comes_up() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = sluice();
    cmd.args(["worker", "--connect", &format!("ws://127.0.0.1:{port}")]);
    let _w = Worker(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(1200));
    let ws = workspace("reconnect");
    let s = start(&ws, None, &["--addr", &format!("127.0.0.1:{port}")]);
    wait_workers(&s, 1);
}

impl Server {
    /// `127.0.0.1:PORT`.
    fn addr(&self) -> String {
        self.url
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .to_string()
    }

    /// Sends raw bytes on a new connection and returns everything the server answers
    /// until it closes the connection (at most 10 s).
    fn raw(&self, request: &str) -> String {
        let mut c = TcpStream::connect(self.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(request.as_bytes()).unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// A WebSocket handshake with extra headers: Ok, or the refusal's status.
    fn ws_with(&self, path: &str, headers: &[(&'static str, &str)]) -> Result<(), u16> {
        let mut req = format!("{}{path}", self.url.replace("http://", "ws://"))
            .into_client_request()
            .unwrap();
        if let Some(t) = &self.token {
            req.headers_mut()
                .insert("Authorization", format!("Bearer {t}").parse().unwrap());
        }
        for (k, v) in headers {
            req.headers_mut().insert(*k, v.parse().unwrap());
        }
        match tungstenite::connect(req) {
            Ok(_) => Ok(()),
            Err(tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
            Err(e) => panic!("{path}: {e}"),
        }
    }

    fn run(&self, body: Value) -> String {
        let (code, r) = self.json("POST", "/api/runs", Some(body));
        assert_eq!(code, 202, "{r}");
        r["id"].as_str().unwrap().to_string()
    }
}

fn status_of(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_token_guards_every_route_but_the_editors_files() {
    let ws = workspace("token-everywhere");
    let mut s = start(&ws, Some("t0ken"), &["--no-editor"]);
    let token = s.token.take();
    for path in [
        "/",
        "/metrics",
        "/api/graphs",
        "/api/runs",
        "/api/openapi.json",
        "/elsewhere",
    ] {
        let (code, body) = s.req("GET", path, None);
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert_eq!(code, 401, "{path}: {v}");
        assert!(v["error"].is_string(), "{path}: {v}");
    }
    assert_eq!(s.ws_with("/api/workers", &[]), Err(401));
    assert_eq!(
        s.req_with("GET", "/", None, &[("Authorization", "Bearer t0ken!")])
            .0,
        401,
        "a longer token is wrong too"
    );
    s.token = token;
    let (code, page) = s.req("GET", "/", None);
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&page).contains("transformer_block"));
    assert_eq!(s.req("GET", "/metrics", None).0, 200);
    assert_eq!(s.req("GET", "/?token=t0ken", None).0, 200);
}

#[test]
fn foreign_origins_and_hosts_are_refused() {
    let ws = workspace("origin");
    let s = start(&ws, None, &[]);
    let port = s.addr().rsplit_once(':').unwrap().1.to_string();
    let body = json!({ "seed_inputs": true, "graph": "mlp" }).to_string();
    let json_type = ("Content-Type", "application/json");
    // A page elsewhere cannot create runs (CSRF)...
    for origin in [
        "http://evil.example",
        "null",
        &format!("http://localhost:{port}.evil.example"),
    ] {
        let (code, b) = s.req_with(
            "POST",
            "/api/runs",
            Some(body.as_bytes()),
            &[json_type, ("Origin", origin)],
        );
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(code, 403, "{origin}: {v}");
        assert!(v["error"]
            .as_str()
            .unwrap()
            .contains("cross-origin request refused"));
    }
    // ... but the server's own pages can.
    let own = format!("http://{}", s.addr());
    let (code, _) = s.req_with(
        "POST",
        "/api/runs",
        Some(body.as_bytes()),
        &[json_type, ("Origin", &own)],
    );
    assert_eq!(code, 202);
    // Nor join as a worker or watch runs (cross-site WebSocket hijacking).
    assert_eq!(
        s.ws_with("/api/workers", &[("Origin", "http://evil.example")]),
        Err(403)
    );
    assert_eq!(s.ws_with("/api/workers", &[("Origin", &own)]), Ok(()));
    // A name that is not the server's (DNS rebinding) is refused on every route.
    for host in [
        format!("evil.example:{port}"),
        format!("127.0.0.1:{}", port.parse::<u32>().unwrap() + 1),
    ] {
        let r = s.raw(&format!(
            "GET /api/graphs HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        ));
        assert_eq!(status_of(&r), 403, "{r}");
        assert!(
            r.contains(&format!("host '{host}' is not this server's")),
            "{r}"
        );
    }
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let r = s.raw(&format!(
            "GET /api/graphs HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        ));
        assert_eq!(status_of(&r), 200, "{host}: {r}");
    }
    let r = s.raw("GET /api/graphs HTTP/1.0\r\n\r\n");
    assert_eq!(status_of(&r), 400, "no Host: {r}");
    // With --allowed-host, a proxy's name is the server's too.
    let s2 = start(
        &workspace("origin-proxy"),
        None,
        &["--allowed-host", "sluice.example.org"],
    );
    let r =
        s2.raw("GET /api/graphs HTTP/1.1\r\nHost: sluice.example.org\r\nConnection: close\r\n\r\n");
    assert_eq!(status_of(&r), 200, "{r}");
}

#[test]
fn bodies_must_be_json() {
    let ws = workspace("json-only");
    let s = start(&ws, None, &[]);
    let mlp = std::fs::read(sluice_tests::root().join("assets/graphs/mlp.json")).unwrap();
    for headers in [
        &[("Content-Type", "text/plain")][..],
        &[("Content-Type", "application/x-www-form-urlencoded")],
        &[],
    ] {
        let (code, b) = s.req_with("POST", "/api/validate", Some(&mlp), headers);
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(code, 415, "{headers:?}: {v}");
        let (code, _) = s.req_with("PUT", "/api/graphs/plain", Some(&mlp), headers);
        assert_eq!(code, 415);
    }
    let (code, _) = s.req_with(
        "POST",
        "/api/validate",
        Some(&mlp),
        &[("Content-Type", "application/json; charset=utf-8")],
    );
    assert_eq!(code, 200);
    assert_eq!(
        s.req("GET", "/api/graphs/plain", None).0,
        404,
        "nothing was stored"
    );
}

#[test]
fn slow_clients_and_extra_connections_are_closed() {
    let ws = workspace("slow");
    let s = start(
        &ws,
        None,
        &[
            "--header-timeout",
            "1",
            "--body-timeout",
            "2",
            "--max-connections",
            "4",
        ],
    );
    let host = s.addr();
    // Headers that never end: closed after --header-timeout.
    let t = Instant::now();
    let r = s.raw(&format!("GET /api/graphs HTTP/1.1\r\nHost: {host}\r\n"));
    assert!(r.is_empty() || status_of(&r) == 408, "{r}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // A body that never ends: 408 after --body-timeout, and the connection closed.
    let t = Instant::now();
    let r = s.raw(&format!(
        "POST /api/validate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"nodes\":"
    ));
    assert_eq!(status_of(&r), 408, "{r}");
    assert!(r.contains("--body-timeout"), "{r}");
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    // Four idle connections hold every place; a fifth is closed at once.
    let s = start(
        &workspace("capped"),
        None,
        &["--header-timeout", "4", "--max-connections", "4"],
    );
    let host = s.addr();
    let mut idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&host).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = TcpStream::connect(&host).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t = Instant::now();
    let _ = extra.write_all(format!("GET /api/graphs HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
    let mut buf = [0u8; 64];
    let n = extra.read(&mut buf).unwrap_or(0);
    assert_eq!(
        n,
        0,
        "the extra connection was served: {}",
        String::from_utf8_lossy(&buf[..n])
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // Idle connections end after --header-timeout, and their places come back.
    idle[0]
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(idle[0].read(&mut buf).unwrap_or(0), 0);
    drop(idle);
    assert_eq!(s.json("GET", "/api/graphs", None).0, 200);
}

#[test]
fn worker_sockets_are_capped() {
    let ws = workspace("max-workers");
    let s = start(&ws, None, &["--max-workers", "1"]);
    let mut req = format!("{}/api/workers", s.url.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    req.headers_mut().insert("X-Test", "first".parse().unwrap());
    let (_first, _) = tungstenite::connect(req).expect("the first worker socket");
    assert_eq!(s.ws_with("/api/workers", &[]), Err(503));
    assert_eq!(s.json("GET", "/api/graphs", None).0, 200);
}

#[test]
fn concurrent_puts_of_one_graph_leave_one_writers_bytes() {
    let ws = workspace("concurrent-put");
    let s = start(&ws, None, &[]);
    let mlp: Value = serde_json::from_str(
        &std::fs::read_to_string(sluice_tests::root().join("assets/graphs/mlp.json")).unwrap(),
    )
    .unwrap();
    let bodies: Vec<Vec<u8>> = (0..16)
        .map(|i| {
            // Each writer's own name, padded to its own size (a graph is stored only
            // when it checks, so the padding is whitespace, not the name).
            let mut g = mlp.clone();
            g["name"] = json!(format!("writer {i}"));
            let text = serde_json::to_string_pretty(&g).unwrap();
            format!("{{{}{}", " ".repeat(i * 1000), &text[1..]).into_bytes()
        })
        .collect();
    std::thread::scope(|scope| {
        for b in &bodies {
            let s = &s;
            scope.spawn(move || {
                for _ in 0..3 {
                    let (code, v) = s.req("PUT", "/api/graphs/shared", Some(b));
                    assert!(
                        code == 200 || code == 201,
                        "{code} {}",
                        String::from_utf8_lossy(&v)
                    );
                }
            });
        }
    });
    let (code, got) = s.req("GET", "/api/graphs/shared", None);
    assert_eq!(code, 200);
    assert!(
        bodies.contains(&got),
        "the stored graph is not one writer's bytes"
    );
    let temps: Vec<_> = std::fs::read_dir(ws.join("graphs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(temps.is_empty(), "temp files left: {temps:?}");
}

#[test]
fn a_second_server_on_a_workspace_is_refused() {
    let ws = workspace("lock");
    let s = start(&ws, None, &[]);
    let out = sluice()
        .args(["serve", "--addr", "127.0.0.1:0", "--workspace"])
        .arg(&ws)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let pid = s.child.id();
    assert!(
        stderr.contains(&format!(
            "is in use by another sluice serve (process {pid})"
        )),
        "{stderr}"
    );
    assert_eq!(
        s.json("GET", "/api/graphs", None).0,
        200,
        "the first goes on"
    );
}

#[test]
fn queued_runs_survive_a_kill_and_run_after_restart() {
    let ws = workspace("requeue");
    let (long, queued) = {
        let mut s = start(&ws, None, &[]);
        let long =
            s.run(json!({ "seed_inputs": true, "graph": "transformer_block", "batch": 2048, "microbatches": 32 }));
        let queued: Vec<String> = (0..5)
            .map(|seed| {
                s.run(json!({ "seed_inputs": true, "graph": "mlp", "batch": 2, "seed": seed }))
            })
            .collect();
        let t = Instant::now();
        while s.json("GET", &format!("/api/runs/{long}"), None).1["status"] == "queued" {
            assert!(t.elapsed() < Duration::from_secs(60));
            std::thread::sleep(Duration::from_millis(20));
        }
        for id in &queued {
            assert_eq!(
                s.json("GET", &format!("/api/runs/{id}"), None).1["status"],
                "queued"
            );
        }
        // SIGKILL: no chance to tidy up.
        s.child.kill().unwrap();
        s.child.wait().unwrap();
        (long, queued)
    };
    let s = start(&ws, None, &[]);
    let r = s.wait_run(&long);
    assert_eq!(r["status"], "failed");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("stopped before the run finished"),
        "{r}"
    );
    let mut finished = Vec::new();
    for id in &queued {
        let r = s.wait_run(id);
        assert_eq!(r["status"], "succeeded", "{r}");
        finished.push(r["started_ms"].as_i64().unwrap());
    }
    assert!(
        finished.windows(2).all(|w| w[0] <= w[1]),
        "run in their order: {finished:?}"
    );
}

#[test]
fn the_history_is_paginated_and_pruned_and_keeps_uploads_as_files() {
    use base64::Engine;
    let ws = workspace("pages");
    let s = start(&ws, None, &["--keep-runs", "4"]);
    let x = sluice_engine::Tensor::f32(vec![1, 784], vec![0.25; 784]);
    let npy = sluice_engine::npy::to_bytes(&x).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&npy);
    let inline: Value = serde_json::from_str(
        &std::fs::read_to_string(sluice_tests::root().join("assets/graphs/mlp.json")).unwrap(),
    )
    .unwrap();
    let mut ids = Vec::new();
    for seed in 0..6 {
        let id = s.run(json!({ "graph": inline, "seed": seed, "inputs": { "x": b64 } }));
        assert_eq!(s.wait_run(&id)["status"], "succeeded");
        ids.push(id);
    }
    // The newest four are kept, with their files; the older ones are gone.
    for id in &ids[..2] {
        // Pruning follows the end of the run that made them the oldest.
        let t = Instant::now();
        while s.json("GET", &format!("/api/runs/{id}"), None).0 != 404
            || ws.join("runs").join(id).exists()
        {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{id} and its files remain"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (_, all) = s.json("GET", "/api/runs", None);
    let listed: Vec<&str> = all["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    let newest: Vec<&str> = ids.iter().rev().take(4).map(String::as_str).collect();
    assert_eq!(listed, newest);
    assert!(all.get("next").is_none(), "{all}");
    // Uploads and inline graphs are files of the run, referenced from its record.
    let run = s.json("GET", &format!("/api/runs/{}", ids[5]), None).1;
    assert_eq!(
        run["params"]["inputs"]["x"],
        json!({ "kept_bytes": npy.len() }),
        "{run}"
    );
    assert!(
        run["params"]["graph"]["kept_bytes"].as_u64().unwrap() > 0,
        "{run}"
    );
    assert_eq!(
        std::fs::read(ws.join("runs").join(&ids[5]).join("inputs/0.npy")).unwrap(),
        npy
    );
    assert!(ws.join("runs").join(&ids[5]).join("graph.json").is_file());
    // Pages of two follow the cursor.
    let mut seen = Vec::new();
    let mut path = "/api/runs?limit=2".to_string();
    loop {
        let (code, page) = s.json("GET", &path, None);
        assert_eq!(code, 200, "{page}");
        assert!(page["runs"].as_array().unwrap().len() <= 2);
        seen.extend(
            page["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_str().unwrap().to_string()),
        );
        match page["next"].as_str() {
            Some(next) => path = format!("/api/runs?limit=2&before={next}"),
            None => break,
        }
    }
    assert_eq!(seen, newest);
    for bad in [
        "limit=0",
        "limit=1001",
        "limit=two",
        "before=zzz",
        "before=0123456789abcdef",
        "page=2",
    ] {
        let (code, v) = s.json("GET", &format!("/api/runs?{bad}"), None);
        assert_eq!(code, 400, "{bad}: {v}");
    }
}

#[test]
fn error_bodies_name_no_server_path() {
    let ws = workspace("no-paths");
    let s = start(&ws, None, &[]);
    // A graph the server cannot read (a folder where its file should be).
    std::fs::create_dir_all(ws.join("graphs").join("broken.json")).unwrap();
    let root = std::fs::canonicalize(&ws).unwrap();
    for (method, path, body) in [
        ("GET", "/api/graphs/broken", None),
        (
            "POST",
            "/api/runs",
            Some(json!({ "seed_inputs": true, "graph": "broken" })),
        ),
    ] {
        let (code, v) = s.json(method, path, body);
        assert_eq!(code, 500, "{path}: {v}");
        let text = v.to_string();
        assert!(
            !text.contains(ws.to_str().unwrap()) && !text.contains(root.to_str().unwrap()),
            "{text}"
        );
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("the detail is in its log"),
            "{v}"
        );
    }
    assert_eq!(s.json("GET", "/api/graphs", None).0, 200);
}

/// A TLS client stream trusting one certificate.
fn tls_stream(
    addr: &str,
    cert: &rustls::pki_types::CertificateDer<'static>,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

#[test]
fn tls_serves_https_and_wss_with_a_self_signed_certificate() {
    let ws = workspace("tls");
    let dir = ws.with_file_name(format!("sluice-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(dir.join("cert.pem"), key.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.signing_key.serialize_pem()).unwrap();
    let der = key.cert.der().clone();
    let s = start(
        &ws,
        Some("tls-token"),
        &[
            "--tls-cert",
            dir.join("cert.pem").to_str().unwrap(),
            "--tls-key",
            dir.join("key.pem").to_str().unwrap(),
            "--allowed-host",
            "localhost",
        ],
    );
    assert!(s.url.starts_with("https://"), "{}", s.url);
    let port = s.addr().rsplit_once(':').unwrap().1.to_string();
    // HTTPS with the token.
    let mut tls = tls_stream(&s.addr(), &der);
    tls.write_all(
        format!("GET /api/graphs HTTP/1.1\r\nHost: localhost:{port}\r\nAuthorization: Bearer tls-token\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(answer.contains("transformer_block"));
    // A worker's handshake over wss://.
    let req = format!("wss://localhost:{port}/api/workers")
        .into_client_request()
        .map(|mut r| {
            r.headers_mut()
                .insert("Authorization", "Bearer tls-token".parse().unwrap());
            r
        })
        .unwrap();
    let (mut sock, _) = tungstenite::client::client(req, tls_stream(&s.addr(), &der)).unwrap();
    sock.send(tungstenite::Message::Text(
        json!({ "type": "hello", "protocol": 0, "name": "tls", "adapters": [] })
            .to_string()
            .into(),
    ))
    .unwrap();
    let reply: Value = serde_json::from_str(sock.read().unwrap().to_text().unwrap()).unwrap();
    assert_eq!(
        reply["type"], "refused",
        "the server answered over wss: {reply}"
    );
    // Plain HTTP on the TLS port gets no answer.
    let r = s.raw(&format!(
        "GET /api/graphs HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n"
    ));
    assert_eq!(status_of(&r), 0, "{r}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_refusal_is_a_json_error() {
    let ws = workspace("json-errors");
    let s = start(&ws, None, &[]);
    for (method, path, want) in [
        ("GET", "/api/graphs/%FF", 400),
        ("DELETE", "/api/runs", 405),
        ("GET", "/api/runs?limit=%FF%FE", 400),
        ("GET", "/api/workers", 400),
    ] {
        let (code, body) = s.req(method, path, None);
        let v: Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {body:?}"));
        assert_eq!(
            (code, v["status"].as_u64()),
            (want, Some(u64::from(want))),
            "{method} {path}: {v}"
        );
        assert!(
            !v["error"].as_str().unwrap_or("").is_empty(),
            "{method} {path}: {v}"
        );
    }
}

#[test]
fn the_workspace_holds_at_most_max_graphs() {
    let ws = workspace("max-graphs");
    let s = start(&ws, None, &["--max-graphs", "4"]);
    let mlp: Value = serde_json::from_str(
        &std::fs::read_to_string(sluice_tests::root().join("assets/graphs/mlp.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        s.json("PUT", "/api/graphs/fourth", Some(mlp.clone())).0,
        201
    );
    let (code, v) = s.json("PUT", "/api/graphs/fifth", Some(mlp.clone()));
    assert_eq!(code, 422, "{v}");
    assert!(v["error"].as_str().unwrap().contains("--max-graphs"), "{v}");
    assert_eq!(
        s.json("PUT", "/api/graphs/fourth", Some(mlp)).0,
        200,
        "replacing is fine"
    );
    assert_eq!(s.req("GET", "/api/graphs/fifth", None).0, 404);
}

/// The fixture models of `tests/onnx_models.rs`: a model file, or one of its `.npy` files.
fn onnx_fixture(model: &str, file: &str) -> Vec<u8> {
    std::fs::read(
        sluice_tests::root()
            .join("tests/data/onnx-models")
            .join(model)
            .join(file),
    )
    .unwrap()
}

impl Server {
    /// Runs a stored graph with one uploaded input and returns its output `name`.
    fn run_output(
        &self,
        body: Value,
        input: &str,
        npy: &[u8],
        output: &str,
    ) -> sluice_engine::Tensor {
        use base64::Engine;
        let mut body = body;
        body["inputs"] = json!({ input: base64::engine::general_purpose::STANDARD.encode(npy) });
        let (code, accepted) = self.json("POST", "/api/runs", Some(body.clone()));
        assert_eq!(code, 202, "{body}: {accepted}");
        let run = self.wait_run(accepted["id"].as_str().unwrap());
        assert_eq!(run["status"], "succeeded", "{run}");
        let id = run["id"].as_str().unwrap();
        let (code, bytes) = self.req("GET", &format!("/api/runs/{id}/outputs/{output}"), None);
        assert_eq!(code, 200);
        sluice_engine::npy::parse(&bytes).unwrap()
    }
}

#[test]
fn an_onnx_model_put_as_a_graph_runs_with_its_weights_on_the_server_and_on_workers() {
    let ws = workspace("onnx");
    let s = start(&ws, None, &[]);
    let onnx = [("Content-Type", "application/onnx")];
    let tiny = onnx_fixture("mlp_tiny", "model.onnx");
    let (code, b) = s.req_with("PUT", "/api/graphs/tiny", Some(&tiny), &onnx);
    let saved: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(code, 201, "{saved}");
    assert_eq!(saved["valid"], true, "{saved}");
    // Stored as a graph document naming its weights file, which lies next to it: the
    // weights committed with it, named by their content (`tiny.HASH.safetensors`).
    let (code, g) = s.json("GET", "/api/graphs/tiny", None);
    assert_eq!(code, 200);
    let file = g["params"]["file"].as_str().unwrap().to_string();
    let hash = file
        .strip_prefix("tiny.")
        .and_then(|f| f.strip_suffix(".safetensors"))
        .unwrap_or_else(|| panic!("{g}"));
    assert!(
        hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{g}"
    );
    assert!(ws.join("graphs").join(&file).is_file());
    assert!(s.json("GET", "/api/graphs", None).1["graphs"]
        .as_array()
        .unwrap()
        .contains(&json!("tiny")));
    // Run by name on the server: onnxruntime's outputs for the fixture's input.
    let input = onnx_fixture("mlp_tiny", "input_0.npy");
    let want = sluice_engine::npy::parse(&onnx_fixture("mlp_tiny", "output_0.npy")).unwrap();
    let got = s.run_output(
        json!({ "seed_inputs": true, "graph": "tiny", "batch": 2 }),
        "x",
        &input,
        "logits",
    );
    sluice_tests::compare("mlp_tiny on the server", &got, &want, 1e-4, 1e-4).unwrap();
    // The graph saved back as JSON (as the editor does) keeps its weights.
    let (code, _) = s.req("PUT", "/api/graphs/tiny", Some(g.to_string().as_bytes()));
    assert_eq!(code, 200);
    let again = s.run_output(
        json!({ "seed_inputs": true, "graph": "tiny", "batch": 2 }),
        "x",
        &input,
        "logits",
    );
    assert_eq!(
        again, got,
        "the graph saved again runs with the same weights"
    );
    // Its weights file read back and stored under another name (as the editor saves an
    // imported model), with a graph naming it: the same outputs.
    let (code, bytes) = s.req("GET", &format!("/api/weights/{file}"), None);
    assert_eq!(code, 200);
    assert_eq!(bytes, std::fs::read(ws.join("graphs").join(&file)).unwrap());
    let octets = [("Content-Type", "application/octet-stream")];
    let (code, b) = s.req_with(
        "PUT",
        "/api/weights/copy.safetensors",
        Some(&bytes),
        &octets,
    );
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&b));
    let mut copy = g.clone();
    copy["params"]["file"] = json!("copy.safetensors");
    let (code, _) = s.req("PUT", "/api/graphs/copy", Some(copy.to_string().as_bytes()));
    assert_eq!(code, 201);
    let copied = s.run_output(
        json!({ "seed_inputs": true, "graph": "copy", "batch": 2 }),
        "x",
        &input,
        "logits",
    );
    assert_eq!(copied, got, "the copy runs with the stored weights");
    // Hostile weights: not safetensors, a header longer than the file, the wrong media
    // type, a name that is no weights file: refused, nothing stored.
    let mut lying = 1u64.to_le_bytes().to_vec();
    lying[0] = 0xff;
    for (body, media, file, want) in [
        (
            b"not safetensors".to_vec(),
            "application/octet-stream",
            "bad.safetensors",
            400,
        ),
        (lying, "application/octet-stream", "bad.safetensors", 400),
        (bytes.clone(), "application/json", "bad.safetensors", 415),
        (bytes.clone(), "application/octet-stream", "bad.json", 400),
        (
            bytes.clone(),
            "application/octet-stream",
            "a.b.safetensors",
            400,
        ),
    ] {
        let (code, b) = s.req_with(
            "PUT",
            &format!("/api/weights/{file}"),
            Some(&body),
            &[("Content-Type", media)],
        );
        assert_eq!(
            code,
            want,
            "{file} as {media}: {}",
            String::from_utf8_lossy(&b)
        );
    }
    assert!(!ws.join("graphs/bad.safetensors").exists());
    assert_eq!(s.req("GET", "/api/weights/none.safetensors", None).0, 404);
    // On two workers, a stage each: the same outputs.
    let _w1 = worker(&s);
    let _w2 = worker(&s);
    wait_workers(&s, 2);
    let body =
        json!({ "seed_inputs": true, "graph": "tiny", "batch": 2, "stages": 2, "microbatches": 1 });
    let remote = s.run_output(body, "x", &input, "logits");
    sluice_tests::compare("mlp_tiny on two workers", &remote, &want, 1e-4, 1e-4).unwrap();
    // An inline graph cannot bring a weights file; a stored one naming another path is refused.
    let (code, v) = s.json(
        "POST",
        "/api/runs",
        Some(json!({ "seed_inputs": true, "graph": g.clone() })),
    );
    assert_eq!(code, 422, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("inline graph cannot take its weights"),
        "{v}"
    );
    let mut outside = g.clone();
    outside["params"]["file"] = json!(format!("../{file}"));
    assert_eq!(
        s.req(
            "PUT",
            "/api/graphs/outside",
            Some(outside.to_string().as_bytes())
        )
        .0,
        201
    );
    let (code, v) = s.json(
        "POST",
        "/api/runs",
        Some(json!({ "seed_inputs": true, "graph": "outside" })),
    );
    assert_eq!(code, 422, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("not a weights file of the workspace"),
        "{v}"
    );
    // A larger model, as application/octet-stream.
    let resnet = onnx_fixture("resnet18_style", "model.onnx");
    let octet = [("Content-Type", "application/octet-stream")];
    let (code, b) = s.req_with("PUT", "/api/graphs/resnet", Some(&resnet), &octet);
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&b));
    let input = onnx_fixture("resnet18_style", "input_0.npy");
    let want = sluice_engine::npy::parse(&onnx_fixture("resnet18_style", "output_0.npy")).unwrap();
    let got = s.run_output(
        json!({ "seed_inputs": true, "graph": "resnet", "batch": 2 }),
        "image",
        &input,
        "logits",
    );
    sluice_tests::compare("resnet18_style on the server", &got, &want, 1e-3, 1e-3).unwrap();
    // Deleting a graph deletes its weights (its version keeps them).
    assert_eq!(s.req("DELETE", "/api/graphs/tiny", None).0, 204);
    assert!(!ws.join("graphs").join(&file).exists());
    assert_eq!(s.req("GET", "/api/graphs/tiny", None).0, 404);
}

#[test]
fn hostile_onnx_bodies_get_clear_errors_and_store_nothing() {
    let ws = workspace("onnx-hostile");
    let s = start(&ws, None, &[]);
    let onnx = [("Content-Type", "application/onnx")];
    let tiny = onnx_fixture("mlp_tiny", "model.onnx");
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    // Every `Relu` renamed `Relz` (same length, so the protobuf stays well formed).
    let mut unsupported = tiny.clone();
    for i in 0..unsupported.len().saturating_sub(3) {
        if &unsupported[i..i + 4] == b"Relu" {
            unsupported[i + 3] = b'z';
        }
    }
    let mlp = std::fs::read(sluice_tests::root().join("assets/graphs/mlp.json")).unwrap();
    for (label, body, says) in [
        ("random bytes", random.clone(), "cannot import the model"),
        (
            "a truncated model",
            tiny[..tiny.len() / 2].to_vec(),
            "cannot import the model",
        ),
        (
            "a JSON graph sent as a model",
            mlp,
            "cannot import the model",
        ),
        ("an unsupported operator", unsupported, "Relz"),
    ] {
        let (code, b) = s.req_with("PUT", "/api/graphs/hostile", Some(&body), &onnx);
        let v: Value = serde_json::from_slice(&b)
            .unwrap_or_else(|_| panic!("{label}: not JSON: {}", String::from_utf8_lossy(&b)));
        assert_eq!(code, 422, "{label}: {v}");
        let e = v["error"].as_str().unwrap();
        assert!(e.contains(says), "{label}: {e}");
    }
    // A model under another content type is not read as one.
    let (code, _) = s.req_with(
        "PUT",
        "/api/graphs/hostile",
        Some(&tiny),
        &[("Content-Type", "text/plain")],
    );
    assert_eq!(code, 415);
    // Models are taken by PUT /api/graphs only.
    let (code, _) = s.req_with("POST", "/api/validate", Some(&tiny), &onnx);
    assert_eq!(code, 415);
    assert_eq!(s.req("GET", "/api/graphs/hostile", None).0, 404);
    let stored: Vec<String> = std::fs::read_dir(ws.join("graphs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("hostile"))
        .collect();
    assert!(stored.is_empty(), "{stored:?}");
    assert_eq!(s.req("GET", "/api/graphs", None).0, 200, "the server is up");
}

/// Saving over a graph or deleting it keeps what it replaced: the versions are listed
/// newest first, readable, and restorable (the restore keeping what it replaces in turn).
#[test]
fn replaced_and_deleted_graphs_can_be_restored_from_their_versions() {
    let ws = workspace("versions");
    let s = start(&ws, None, &[]);
    let (code, original) = s.json("GET", "/api/graphs/mlp", None);
    assert_eq!(code, 200);
    let (code, _) = s.json("GET", "/api/graphs/mlp/versions", None);
    assert_eq!(code, 200);
    let mut changed = original.clone();
    changed["name"] = json!("changed");
    let (code, _) = s.json("PUT", "/api/graphs/mlp", Some(changed.clone()));
    assert_eq!(code, 200);
    let (code, list) = s.json("GET", "/api/graphs/mlp/versions", None);
    assert_eq!(code, 200);
    let versions = list["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 1, "{list}");
    let v = versions[0]["version"].as_str().unwrap().to_string();
    let (code, kept) = s.json("GET", &format!("/api/graphs/mlp/versions/{v}"), None);
    assert_eq!((code, &kept), (200, &original));
    // Restore: the original is back, and the changed graph is kept in turn.
    let (code, r) = s.json(
        "POST",
        &format!("/api/graphs/mlp/versions/{v}/restore"),
        None,
    );
    assert_eq!(code, 200, "{r}");
    assert_eq!(s.json("GET", "/api/graphs/mlp", None).1, original);
    let (_, list) = s.json("GET", "/api/graphs/mlp/versions", None);
    let newest = list["versions"][0]["version"].as_str().unwrap().to_string();
    assert_eq!(
        s.json("GET", &format!("/api/graphs/mlp/versions/{newest}"), None)
            .1,
        changed
    );
    // Deleted, then restored from the version the delete kept.
    assert_eq!(s.req("DELETE", "/api/graphs/mlp", None).0, 204);
    assert_eq!(s.req("GET", "/api/graphs/mlp", None).0, 404);
    let (_, list) = s.json("GET", "/api/graphs/mlp/versions", None);
    let last = list["versions"][0]["version"].as_str().unwrap().to_string();
    let (code, _) = s.json(
        "POST",
        &format!("/api/graphs/mlp/versions/{last}/restore"),
        None,
    );
    assert_eq!(code, 200);
    assert_eq!(s.json("GET", "/api/graphs/mlp", None).1, original);
    // Hostile versions and names.
    for bad in ["abc", "1.json", "99999999999999999999999"] {
        let (code, _) = s.req("GET", &format!("/api/graphs/mlp/versions/{bad}"), None);
        assert_eq!(code, 400, "{bad}");
        let (code, _) = s.req(
            "POST",
            &format!("/api/graphs/mlp/versions/{bad}/restore"),
            None,
        );
        assert_eq!(code, 400, "{bad}");
    }
    assert_eq!(s.req("GET", "/api/graphs/mlp/versions/1", None).0, 404);
    assert_eq!(
        s.req("POST", "/api/graphs/mlp/versions/1/restore", None).0,
        404
    );
    assert_eq!(s.req("GET", "/api/graphs/bad.name/versions", None).0, 400);
}

/// The `mlp_tiny` fixture as ONNX bytes, its graph named `name` and every weight
/// multiplied by `scale` (its weights import as a weights file).
fn tiny_onnx(name: &str, scale: f32) -> Vec<u8> {
    use prost::Message;
    use sluice_engine::onnx::proto::ModelProto;
    let mut model = ModelProto::decode(onnx_fixture("mlp_tiny", "model.onnx").as_slice()).unwrap();
    let graph = model.graph.as_mut().unwrap();
    graph.name = name.to_string();
    for t in &mut graph.initializer {
        let values: Vec<f32> = if t.raw_data.is_empty() {
            t.float_data.clone()
        } else {
            t.raw_data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        t.raw_data = values
            .iter()
            .flat_map(|v| (v * scale).to_le_bytes())
            .collect();
        t.float_data.clear();
    }
    model.encode_to_vec()
}

impl Server {
    /// Runs the stored graph `name` (a [`tiny_onnx`] model) on a fixed input: its output.
    fn run_tiny(&self, name: &str) -> sluice_engine::Tensor {
        let x = sluice_engine::Tensor::f32(vec![2, 4], (0..8).map(|i| i as f32 - 3.5).collect());
        let npy = sluice_engine::npy::to_bytes(&x).unwrap();
        self.run_output(
            json!({ "seed_inputs": true, "graph": name, "batch": 2 }),
            "x",
            &npy,
            "logits",
        )
    }

    /// The newest kept version of graph `name`.
    fn newest_version(&self, name: &str) -> String {
        let (code, list) = self.json("GET", &format!("/api/graphs/{name}/versions"), None);
        assert_eq!(code, 200, "{list}");
        list["versions"][0]["version"].as_str().unwrap().to_string()
    }

    fn restore(&self, name: &str, version: &str) {
        let (code, r) = self.json(
            "POST",
            &format!("/api/graphs/{name}/versions/{version}/restore"),
            None,
        );
        assert_eq!(code, 200, "{r}");
    }
}

/// A model's versions keep its weights with its graph: a model restored after a newer
/// upload, or after its delete, runs with its own weights; weights put over a model's are
/// kept with a version too.
#[test]
fn restored_models_run_with_their_own_weights() {
    let ws = workspace("model-versions");
    let s = start(&ws, None, &[]);
    let onnx = [("Content-Type", "application/onnx")];
    let (first, second) = (tiny_onnx("first", 1.0), tiny_onnx("second", -0.5));
    assert_eq!(
        s.req_with("PUT", "/api/graphs/m", Some(&first), &onnx).0,
        201
    );
    let out_first = s.run_tiny("m");
    assert_eq!(
        s.req_with("PUT", "/api/graphs/m", Some(&second), &onnx).0,
        200
    );
    let out_second = s.run_tiny("m");
    assert_ne!(out_first, out_second, "the two models differ");
    // The older version, restored: the older weights.
    s.restore("m", &s.newest_version("m"));
    assert_eq!(s.json("GET", "/api/graphs/m", None).1["name"], "first");
    assert_eq!(
        s.run_tiny("m"),
        out_first,
        "restored with the weights it was saved with"
    );
    // Deleted, then restored: it runs with its own weights.
    assert_eq!(s.req("DELETE", "/api/graphs/m", None).0, 204);
    s.restore("m", &s.newest_version("m"));
    assert_eq!(
        s.run_tiny("m"),
        out_first,
        "a restored deleted model has its weights"
    );
    // And the newer upload is still a version of its own.
    let (_, list) = s.json("GET", "/api/graphs/m/versions", None);
    let second_version = list["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_str().unwrap().to_string())
        .find(|v| {
            s.json("GET", &format!("/api/graphs/m/versions/{v}"), None)
                .1["name"]
                == "second"
        })
        .expect("the second model is kept");
    s.restore("m", &second_version);
    assert_eq!(s.run_tiny("m"), out_second);
    // Weights put by name over a graph's weights keep the replaced ones as a version.
    let (_, g) = s.json("GET", "/api/graphs/m", None);
    let committed = g["params"]["file"].as_str().unwrap().to_string();
    let (code, second_weights) = s.req("GET", &format!("/api/weights/{committed}"), None);
    assert_eq!(code, 200);
    s.restore("m", &s.newest_version("m")); // back to the first model
    let (_, g) = s.json("GET", "/api/graphs/m", None);
    let (_, first_weights) = s.req(
        "GET",
        &format!("/api/weights/{}", g["params"]["file"].as_str().unwrap()),
        None,
    );
    let octets = [("Content-Type", "application/octet-stream")];
    let put_weights = |bytes: &[u8]| {
        let (code, b) = s.req_with("PUT", "/api/weights/e.safetensors", Some(bytes), &octets);
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&b));
    };
    put_weights(&first_weights);
    let mut e = g.clone();
    e["params"]["file"] = json!("e.safetensors");
    assert_eq!(
        s.req("PUT", "/api/graphs/e", Some(e.to_string().as_bytes()))
            .0,
        201
    );
    assert_eq!(s.run_tiny("e"), out_first);
    put_weights(&second_weights);
    assert_eq!(s.run_tiny("e"), out_second, "the new weights are used");
    s.restore("e", &s.newest_version("e"));
    assert_eq!(s.run_tiny("e"), out_first, "the replaced weights were kept");
    // A model's committed weights never change.
    let (_, g) = s.json("GET", "/api/graphs/m", None);
    let committed = g["params"]["file"].as_str().unwrap().to_string();
    let (code, b) = s.req_with(
        "PUT",
        &format!("/api/weights/{committed}"),
        Some(&second_weights),
        &octets,
    );
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&b));
    assert!(String::from_utf8_lossy(&b).contains("never change"));
    assert_eq!(
        s.req("GET", &format!("/api/weights/{committed}"), None).1,
        first_weights
    );
}

/// `(node, stage)` of each entry of a run's `top_nodes`, and the entries whose stage sums
/// differ from that stage's busy time (the check every per-node time must pass).
fn node_stages_and_misfits(metrics: &Value) -> (Vec<(String, u64)>, Vec<String>) {
    let top = metrics["top_nodes"].as_array().expect("top_nodes");
    let mut keys: Vec<(String, u64)> = top
        .iter()
        .map(|t| {
            (
                t["node"].as_str().unwrap().to_string(),
                t["stage"].as_u64().unwrap(),
            )
        })
        .collect();
    keys.sort();
    let mut misfits = Vec::new();
    for d in metrics["devices"].as_array().expect("devices") {
        let stage = d["stage"].as_u64().unwrap();
        let sum: u64 = top
            .iter()
            .filter(|t| t["stage"].as_u64() == Some(stage))
            .map(|t| t["total_ns"].as_u64().unwrap())
            .sum();
        if sum != d["busy_ns"].as_u64().unwrap() {
            misfits.push(format!(
                "stage {stage}: nodes sum to {sum}, busy {}",
                d["busy_ns"]
            ));
        }
    }
    (keys, misfits)
}

/// Runs the 2-stage MLP on the server (on its workers when `workers`) and checks that the
/// per-node times of its record are those of the events it relays (what the editor's heat
/// map reads) and sum to each stage's busy time; returns the record's metrics.
fn node_times_of_a_server_run(s: &Server, workers: bool) -> Value {
    use sluice_engine::telemetry::{metrics::node_times, Event};
    let mut request = json!({ "seed_inputs": true, "graph": "mlp", "batch": 8, "seed": 5, "microbatches": 4, "stages": 2 });
    if workers {
        request["workers"] = json!(["w1", "w2"]);
    }
    let (code, r) = s.json("POST", "/api/runs", Some(request));
    assert_eq!(code, 202, "{r}");
    let id = r["id"].as_str().unwrap().to_string();
    let record = s.wait_run(&id);
    assert_eq!(record["status"], "succeeded", "{record}");
    let server = record["metrics"]["metrics"].clone();
    let mut socket = s.ws(&format!("/api/runs/{id}/events"));
    let mut events: Vec<Event> = Vec::new();
    loop {
        let text = socket.read().expect("a message before the summary");
        let Ok(text) = text.into_text() else { continue };
        let v: Value = serde_json::from_str(&text).unwrap();
        match v["type"].as_str() {
            Some("event") => events.push(serde_json::from_value(v["event"].clone()).unwrap()),
            Some("summary") => break,
            _ => {}
        }
    }
    // Node, stage and nanoseconds exactly; shares to the precision JSON keeps.
    let relayed = node_times(&events);
    let recorded = server["top_nodes"].as_array().expect("top_nodes");
    assert_eq!(
        relayed.len(),
        recorded.len(),
        "workers={workers}: {relayed:?} vs {server}"
    );
    for (got, want) in relayed.iter().zip(recorded) {
        let same = want["node"] == got.node.as_str()
            && want["stage"] == got.stage
            && want["total_ns"] == got.total_ns
            && (want["share"].as_f64().unwrap() - got.share).abs() < 1e-12;
        assert!(same, "workers={workers}: relayed {got:?}, recorded {want}");
    }
    let (_, misfits) = node_stages_and_misfits(&server);
    assert!(
        misfits.is_empty(),
        "workers={workers}: {misfits:?} in {server}"
    );
    server
}

#[test]
fn per_node_times_are_the_same_on_the_cli_the_server_and_its_relayed_events() {
    let ws = workspace("node-times");
    let s = start(&ws, None, &[]);
    let server = node_times_of_a_server_run(&s, false);
    // The CLI on the same graph and settings names the same nodes on the same stages.
    let x =
        sluice_engine::Tensor::f32(vec![8, 784], (0..8 * 784).map(|i| (i % 7) as f32).collect());
    let x_file = ws.join("x.npy");
    std::fs::write(&x_file, sluice_engine::npy::to_bytes(&x).unwrap()).unwrap();
    let out = sluice()
        .args([
            "run",
            "--batch",
            "8",
            "--microbatches",
            "4",
            "--stages",
            "2",
            "--json",
        ])
        .arg("--input")
        .arg(format!("x={}", x_file.display()))
        .arg(sluice_tests::root().join("assets/graphs/mlp.json"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: Value = serde_json::from_slice(&out.stdout).expect("JSON from run --json");
    let (cli_keys, cli_misfits) = node_stages_and_misfits(&cli["metrics"]);
    let (server_keys, _) = node_stages_and_misfits(&server);
    assert!(
        cli_misfits.is_empty(),
        "CLI: {cli_misfits:?} in {}",
        cli["metrics"]
    );
    assert_eq!(
        cli_keys, server_keys,
        "CLI and server charge different nodes"
    );
    assert!(cli_keys.iter().any(|(n, _)| n == "act1"), "{cli_keys:?}");
    // Stages on workers: the workers' own passes, as relayed, are the record's nodes.
    let _w1 = worker(&s);
    let _w2 = worker(&s);
    wait_workers(&s, 2);
    let remote = node_times_of_a_server_run(&s, true);
    let (remote_keys, _) = node_stages_and_misfits(&remote);
    assert!(
        remote_keys.iter().any(|(n, _)| n == "probs"),
        "the workers' passes are charged to their nodes: {remote_keys:?}"
    );
    let _ = std::fs::remove_dir_all(&ws);
}
