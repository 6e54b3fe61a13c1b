//! `sluice serve` end to end: a real server on an ephemeral port, real HTTP and WebSocket
//! clients. Every endpoint, restart persistence, a table of bad requests, and a bounded
//! load test.

use serde_json::{json, Value};
use sluice_tests::sluice;
use std::io::{BufRead, BufReader};
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
        .find(|w| w.starts_with("http://"))
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
    fn req(&self, method: &str, path: &str, body: Option<&[u8]>) -> (u16, Vec<u8>) {
        let url = format!("{}{path}", self.url);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let resp = match (method, body) {
            ("GET", _) => {
                let mut r = self.agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            ("DELETE", _) => {
                let mut r = self.agent.delete(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            (m, b) => {
                let mut r = if m == "PUT" {
                    self.agent.put(&url)
                } else {
                    self.agent.post(&url)
                };
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send(b.unwrap_or(b"").to_vec())
            }
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
        Some(json!({ "graph": "my_mlp", "batch": 8, "seed": 5, "microbatches": 4, "stages": 2, "prefetch": 2, "precision": "mixed" })),
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
        Some(json!({ "graph": got, "batch": 2 })),
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
                Some(json!({ "graph": "transformer_block", "batch": 16 })),
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
        Some(json!({ "graph": "mlp", "batch": 4, "microbatches": 2, "stages": 2 })),
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
                    Some(json!({ "graph": "kept", "batch": 4, "seed": seed })),
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
            Some(json!({ "graph": "cnn", "batch": 2, "stages": 99 })),
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
        ("POST", "/api/runs", Some(br#"{"graph": "nope"}"#.to_vec()), 404, "no graph named 'nope'"),
        ("POST", "/api/runs", Some(br#"{"graph": "mlp", "batch": 6, "microbatches": 4}"#.to_vec()), 422, "does not split into 4"),
        ("POST", "/api/runs", Some(br#"{"graph": {"format": "sluice/graph@1", "inputs": {"x": {"shape": ["N", 100000]}}, "nodes": [{"id": "y", "op": "relu", "inputs": ["x"]}], "outputs": ["y"]}, "batch": 65536}"#.to_vec()), 422, "over the limit"),
        ("POST", "/api/runs", Some(br#"{"graph": {"format": "sluice/graph@1", "inputs": {}, "nodes": [], "outputs": ["z"]}}"#.to_vec()), 422, "problem"),
        ("POST", "/api/runs", Some(big.clone()), 413, "larger than the limit"),
        ("PUT", "/api/graphs/big", Some(big), 413, "larger than the limit"),
        ("POST", "/api/runs", Some(br#"{"graph": {"format": "sluice/graph@1", "inputs": {"x": {"shape": [2]}}, "nodes": [{"id": "y", "op": "relu", "inputs": ["x"]}], "outputs": ["y"], "params": {"file": "w.safetensors"}}}"#.to_vec()), 422, "which the server cannot read yet"),
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
            Some(json!({ "graph": "mlp", "batch": 2 })),
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
                            let body = json!({ "graph": "mlp", "batch": 1, "seed": c * 10 + i })
                                .to_string();
                            let resp = agent
                                .post(format!("{url}/api/runs"))
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
            Some(json!({ "graph": "mlp", "batch": 8, "seed": 5, "microbatches": 4, "stages": 2 })),
        )
        .1;
    let one = s
        .json(
            "POST",
            "/api/runs",
            Some(json!({ "graph": "mlp", "batch": 8, "seed": 5, "microbatches": 4, "stages": 1 })),
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
    let pinned = s.json("POST", "/api/runs", Some(json!({ "graph": "mlp", "batch": 8, "seed": 5, "microbatches": 4, "stages": 2, "workers": ["w2", "w1"] }))).1;
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
            Some(json!({ "graph": "mlp", "stages": 2, "workers": ["w1", "w9"] })),
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
    let body = json!({ "graph": "transformer_block", "batch": 8, "microbatches": 2, "stages": 2, "precision": "mixed" });
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
            Some(json!({ "graph": "transformer_block", "batch": 8 })),
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
        .json("POST", "/api/runs", Some(json!({ "graph": "transformer_block", "batch": 2048, "microbatches": 32, "stages": 2 })))
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
                Some(json!({ "graph": "mlp", "batch": 4, "microbatches": 2, "stages": stages })),
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
